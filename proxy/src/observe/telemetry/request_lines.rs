//! The per-request log line (target `switchback::request`), written by a layer of
//! its own instead of tracing-subscriber's formatter: the same text and JSON shapes,
//! at a fraction of the cost (callgrind: ~16k instructions per line through the
//! generic formatter, most of it `fmt` machinery and timestamp formatting). One
//! reusable buffer per thread; the finished line goes to the batched writer whole.

use std::cell::RefCell;
use std::fmt::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::Context;

use super::writer::BatchedWriter;

/// The event target this layer writes.
pub const TARGET: &str = "switchback::request";

/// The field whose `%`-recorded value is JSON already, written into JSON lines as
/// it is (the attempt log: an array).
pub const RAW_JSON_FIELD: &str = "attempt_log";

/// Writes `switchback::request` events as text or JSON lines.
pub struct RequestLines {
    writer: BatchedWriter,
    json: bool,
    clock: fn(&mut Vec<u8>),
}

impl RequestLines {
    pub fn new(writer: BatchedWriter, json: bool) -> Self {
        Self {
            writer,
            json,
            clock: now_rfc3339,
        }
    }

    fn line(&self, event: &Event<'_>, out: &mut Vec<u8>) {
        let level = event.metadata().level();
        if self.json {
            out.extend_from_slice(b"{\"timestamp\":\"");
            (self.clock)(out);
            out.extend_from_slice(b"\",\"level\":\"");
            out.extend_from_slice(level.as_str().as_bytes());
            out.push(b'"');
            event.record(&mut Json { out });
            out.extend_from_slice(b",\"target\":\"");
            out.extend_from_slice(event.metadata().target().as_bytes());
            out.extend_from_slice(b"\"}\n");
        } else {
            (self.clock)(out);
            // ` {level:>5} {target}: ` without the formatter.
            let level = level.as_str();
            out.resize(out.len() + 6 - level.len(), b' ');
            out.extend_from_slice(level.as_bytes());
            out.push(b' ');
            out.extend_from_slice(event.metadata().target().as_bytes());
            out.extend_from_slice(b": ");
            event.record(&mut Text { out, first: true });
            out.push(b'\n');
        }
    }
}

impl<S: Subscriber> tracing_subscriber::Layer<S> for RequestLines {
    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        thread_local! {
            static LINE: RefCell<Vec<u8>> = RefCell::new(Vec::with_capacity(512));
        }
        LINE.with(|line| {
            // Only re-entered if writing a line logged something itself; skip that.
            let Ok(mut line) = line.try_borrow_mut() else {
                return;
            };
            line.clear();
            self.line(event, &mut line);
            self.writer.append(&line);
        });
    }
}

/// `message` first and bare, then `name=value`; strings quoted as `Debug` quotes
/// them, `%`-recorded values bare: tracing-subscriber's text shape.
struct Text<'a> {
    out: &'a mut Vec<u8>,
    first: bool,
}

impl Text<'_> {
    fn sep(&mut self) {
        if !self.first {
            self.out.push(b' ');
        }
        self.first = false;
    }

    fn name(&mut self, field: &Field) {
        self.sep();
        self.out.extend_from_slice(field.name().as_bytes());
        self.out.push(b'=');
    }
}

impl Visit for Text<'_> {
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.name(field);
        self.out
            .extend_from_slice(itoa::Buffer::new().format(value).as_bytes());
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.name(field);
        self.out
            .extend_from_slice(itoa::Buffer::new().format(value).as_bytes());
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.sep();
            self.out.extend_from_slice(value.as_bytes());
        } else {
            self.name(field);
            quoted(self.out, value);
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.sep();
        } else {
            self.name(field);
        }
        let _ = write!(Utf8Out(self.out), "{value:?}");
    }
}

/// `fmt::Write` straight into the line: `write!` on the `Vec` itself goes through
/// `io::Write`'s adapter, which costs more for every piece written.
struct Utf8Out<'a>(&'a mut Vec<u8>);

impl std::fmt::Write for Utf8Out<'_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.0.extend_from_slice(s.as_bytes());
        Ok(())
    }
}

/// `value` as `{:?}` prints it; without the formatter when nothing needs escaping
/// (route, model and target names, in practice).
fn quoted(out: &mut Vec<u8>, value: &str) {
    if value
        .bytes()
        .all(|b| (b' '..=b'~').contains(&b) && b != b'"' && b != b'\\')
    {
        out.push(b'"');
        out.extend_from_slice(value.as_bytes());
        out.push(b'"');
    } else {
        let _ = write!(Utf8Out(out), "{value:?}");
    }
}

/// Flattened fields after `timestamp` and `level`: tracing-subscriber's JSON shape
/// with `flatten_event(true)`; `%`-recorded values become JSON strings.
struct Json<'a> {
    out: &'a mut Vec<u8>,
}

impl Json<'_> {
    fn name(&mut self, field: &Field) {
        self.out.extend_from_slice(b",\"");
        self.out.extend_from_slice(field.name().as_bytes());
        self.out.extend_from_slice(b"\":");
    }
}

impl Visit for Json<'_> {
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.name(field);
        self.out
            .extend_from_slice(itoa::Buffer::new().format(value).as_bytes());
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.name(field);
        self.out
            .extend_from_slice(itoa::Buffer::new().format(value).as_bytes());
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.name(field);
        let _ = serde_json::to_writer(&mut *self.out, value);
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.name(field);
        // Already JSON (the data port's attempt log): an array, not a string holding one.
        if field.name() == RAW_JSON_FIELD {
            let _ = write!(Utf8Out(self.out), "{value:?}");
            return;
        }
        let mut s = String::with_capacity(128);
        let _ = write!(s, "{value:?}");
        let _ = serde_json::to_writer(&mut *self.out, &s);
    }
}

/// `2026-11-30T15:04:05.123456Z`, as tracing-subscriber's default timer prints it.
/// The date part is formatted once per second per thread.
fn now_rfc3339(out: &mut Vec<u8>) {
    thread_local! {
        static SECOND: RefCell<(u64, [u8; 19])> = const { RefCell::new((u64::MAX, [0; 19])) };
    }
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let secs = since.as_secs();
    SECOND.with(|cached| {
        let mut cached = cached.borrow_mut();
        if cached.0 != secs {
            *cached = (secs, date_time(secs));
        }
        out.extend_from_slice(&cached.1);
    });
    let mut frac = *b".000000Z";
    let mut micros = since.subsec_micros();
    for digit in frac[1..7].iter_mut().rev() {
        *digit = b'0' + (micros % 10) as u8;
        micros /= 10;
    }
    out.extend_from_slice(&frac);
}

/// `YYYY-MM-DDTHH:MM:SS` of a Unix time (UTC), by the days-to-civil algorithm.
fn date_time(secs: u64) -> [u8; 19] {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let mut s = String::with_capacity(19);
    let _ = write!(
        s,
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    );
    let mut b = [b'0'; 19];
    b.copy_from_slice(&s.as_bytes()[..19]);
    b
}

#[cfg(test)]
mod tests {
    use tracing_subscriber::fmt::format::Writer;
    use tracing_subscriber::fmt::time::FormatTime;
    use tracing_subscriber::layer::SubscriberExt;

    use super::*;
    use crate::observe::telemetry::tests::Sink;

    const AT: &str = "2026-11-30T15:04:05.000042Z";

    struct FixedTime;
    impl FormatTime for FixedTime {
        fn format_time(&self, w: &mut Writer<'_>) -> std::fmt::Result {
            w.write_str(AT)
        }
    }

    fn fixed(out: &mut Vec<u8>) {
        out.extend_from_slice(AT.as_bytes());
    }

    struct Route;
    impl std::fmt::Display for Route {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("team-a/smart")
        }
    }

    /// One request line shaped as the data port emits it.
    fn emit() {
        let served_by: Option<&str> = Some("team-a/backup");
        let none: Option<&str> = None;
        tracing::info!(
            target: TARGET,
            route = %Route,
            generation = 3i64,
            request_id = "req-1",
            model = "sm\"art",
            status = 200u16,
            served_by,
            fallback_provider = served_by,
            fallback_model = none,
            attempts = 2u32,
            fallbacks = 1u32,
            duration_ms = 12u64,
            attempt_log = %r#"[{"target":"team-a/primary","status":503}]"#,
            "request"
        );
    }

    /// The same event written both ways: by tracing-subscriber's formatter (which
    /// wrote these lines before) and by this layer.
    fn both(json: bool) -> (String, String) {
        let theirs = Sink::default();
        let fmt = tracing_subscriber::fmt::layer()
            .with_ansi(false)
            .with_timer(FixedTime)
            .with_writer(theirs.clone());
        let ours = Sink::default();
        let writer =
            BatchedWriter::flushing_every(ours.clone(), std::time::Duration::from_secs(3600));
        let layer = RequestLines {
            writer: writer.clone(),
            json,
            clock: fixed,
        };
        if json {
            let sub = tracing_subscriber::registry()
                .with(fmt.json().flatten_event(true))
                .with(layer);
            tracing::subscriber::with_default(sub, emit);
        } else {
            let sub = tracing_subscriber::registry().with(fmt).with(layer);
            tracing::subscriber::with_default(sub, emit);
        }
        writer.stop();
        (theirs.text(), ours.text())
    }

    #[test]
    fn text_lines_match_tracing_subscribers_format() {
        let (theirs, ours) = both(false);
        assert_eq!(ours, theirs);
        assert!(ours.contains("model=\"sm\\\"art\" status=200"), "{ours}");
        assert!(ours.contains("served_by=\"team-a/backup\""), "{ours}");
    }

    #[test]
    fn json_lines_match_tracing_subscribers_format_with_the_attempt_log_an_array() {
        let (theirs, ours) = both(true);
        let v: serde_json::Value = serde_json::from_str(ours.trim_end()).unwrap();
        assert_eq!(v["served_by"], "team-a/backup");
        assert_eq!(v["attempts"], 2);
        assert_eq!(v["generation"], 3);
        assert_eq!(v["request_id"], "req-1");
        assert_eq!(
            v["attempt_log"],
            serde_json::json!([{"target": "team-a/primary", "status": 503}])
        );
        // Field for field what tracing-subscriber writes, but for that one.
        let mut t: serde_json::Value = serde_json::from_str(theirs.trim_end()).unwrap();
        assert!(t["attempt_log"].is_string());
        t["attempt_log"] = v["attempt_log"].clone();
        assert_eq!(v, t);
    }

    #[test]
    fn timestamps_are_rfc3339_utc_with_microseconds() {
        assert_eq!(&date_time(0), b"1970-01-01T00:00:00");
        assert_eq!(&date_time(1_796_051_045), b"2026-11-30T15:04:05");
        assert_eq!(&date_time(951_782_400), b"2000-02-29T00:00:00");
        let mut out = Vec::new();
        now_rfc3339(&mut out);
        let s = String::from_utf8(out).unwrap();
        assert_eq!(s.len(), AT.len(), "{s}");
        assert!(s.ends_with('Z') && s.as_bytes()[19] == b'.', "{s}");
    }
}
