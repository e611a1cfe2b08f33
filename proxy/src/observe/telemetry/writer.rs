//! The log writer: lines go into a shared buffer that a background thread writes out
//! every [`FLUSH_EVERY`]; a request never makes a system call or wakes a thread to
//! log, and a stalled stdout can neither grow memory nor block requests.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Log lines go into a shared buffer that a background thread writes out every
/// `FLUSH_EVERY`: a request never makes a system call or wakes a thread to log.
/// (A channel-per-line writer costs a wake-up and a `write` per request.) Lines beyond
/// `MAX_PENDING` bytes are dropped and counted, so a stalled stdout cannot grow
/// memory or block requests.
#[derive(Clone)]
pub struct BatchedWriter {
    shared: Arc<Batch>,
}

struct Batch {
    pending: Mutex<Vec<u8>>,
    dropped: AtomicU64,
    stop: AtomicBool,
    flusher: Mutex<Option<std::thread::JoinHandle<()>>>,
}

const FLUSH_EVERY: Duration = Duration::from_millis(50);
const MAX_PENDING: usize = 8 << 20;

impl BatchedWriter {
    /// Start the background thread writing to `sink` (stdout in the binary).
    pub fn start(sink: impl std::io::Write + Send + 'static) -> Self {
        Self::flushing_every(sink, FLUSH_EVERY)
    }

    pub(super) fn flushing_every(
        sink: impl std::io::Write + Send + 'static,
        every: Duration,
    ) -> Self {
        let mut sink = sink;
        let shared = Arc::new(Batch {
            pending: Mutex::new(Vec::with_capacity(64 << 10)),
            dropped: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            flusher: Mutex::new(None),
        });
        let s = shared.clone();
        let handle = std::thread::Builder::new()
            .name("switchback-log".into())
            .spawn(move || {
                let mut spare = Vec::with_capacity(64 << 10);
                loop {
                    let stopping = s.stop.load(Ordering::Acquire);
                    if !stopping {
                        std::thread::park_timeout(every);
                    }
                    s.flush_into(&mut spare, &mut sink);
                    if stopping {
                        return;
                    }
                }
            })
            .ok();
        *shared.flusher.lock().unwrap_or_else(|p| p.into_inner()) = handle;
        Self { shared }
    }

    /// Write out what is pending and stop the background thread.
    pub fn stop(&self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(h) = self
            .shared
            .flusher
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            h.thread().unpark();
            let _ = h.join();
        }
    }
}

impl Batch {
    fn flush_into(&self, spare: &mut Vec<u8>, out: &mut impl std::io::Write) {
        {
            let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
            std::mem::swap(&mut *pending, spare);
        }
        let dropped = self.dropped.swap(0, Ordering::Relaxed);
        let _ = out.write_all(spare);
        if dropped > 0 {
            let _ = writeln!(
                out,
                "switchback: {dropped} log lines dropped: stdout was not keeping up"
            );
        }
        let _ = out.flush();
        spare.clear();
    }
}

impl BatchedWriter {
    /// Queue `line` (whole) for the next flush, or count it dropped when too much is
    /// already pending.
    pub(crate) fn append(&self, line: &[u8]) {
        let mut pending = self
            .shared
            .pending
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if pending.len() + line.len() > MAX_PENDING {
            self.shared.dropped.fetch_add(1, Ordering::Relaxed);
        } else {
            pending.extend_from_slice(line);
        }
    }
}

impl std::io::Write for BatchedWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.append(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for BatchedWriter {
    type Writer = BatchedWriter;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;

    use super::super::tests::Sink;
    use super::*;

    #[test]
    fn lines_are_written_in_batches_and_all_flushed_on_stop() {
        let sink = Sink::default();
        let mut w = BatchedWriter::start(sink.clone());
        for n in 0..1000 {
            writeln!(w, "line {n}").unwrap();
        }
        w.stop();
        let text = sink.text();
        assert_eq!(text.lines().count(), 1000);
        assert!(text.starts_with("line 0\n") && text.ends_with("line 999\n"));
    }

    #[test]
    fn a_full_buffer_drops_lines_and_says_how_many() {
        // No flush before stop: everything past the cap is dropped, and counted.
        let sink = Sink::default();
        let mut w = BatchedWriter::flushing_every(sink.clone(), Duration::from_secs(3600));
        let line = vec![b'x'; 1 << 20];
        for _ in 0..12 {
            w.write_all(&line).unwrap();
        }
        w.stop();
        let text = String::from_utf8(sink.0.lock().unwrap().clone()).unwrap();
        assert_eq!(text.bytes().filter(|b| *b == b'x').count(), MAX_PENDING);
        assert!(
            text.ends_with("switchback: 4 log lines dropped: stdout was not keeping up\n"),
            "{}",
            &text[text.len() - 80..]
        );
    }
}
