//! Bedrock's ConverseStream framing (AWS event stream,
//! `application/vnd.amazon.eventstream`) on the stream path: binary frames cut and
//! checked (prelude, header and message CRCs) by `aws-smithy-eventstream`'s decoder,
//! each turned into one SSE event so the rest of the stream path (opening, commit,
//! translation, the size limit) reads Bedrock like any other upstream.
//!
//! * An event frame (`:message-type` `event`, `:event-type` NAME, a JSON payload)
//!   becomes `event: NAME` / `data: {"NAME": payload}` (the union shape AWS's JSON
//!   uses for ConverseStream output).
//! * An exception frame (`:message-type` `exception`, `:exception-type` such as
//!   `throttlingException`, payload `{"message"}`) or an error frame
//!   (`:message-type` `error`, `:error-code`, `:error-message`) becomes `event:
//!   error` / `data: {"error": {"type", "code", "message"}}`, `code` the HTTP status
//!   its type classes as (see [`super::class_status`]), which `sse::error_in`
//!   reads like any in-band error.
//! * A frame that fails its checksums or cannot be read ends the stream with such an
//!   error event (type `invalidEventStream`, 502): the framing cannot be
//!   resynchronised.
//!
//! Bounded: a frame whose declared length is over the event size limit is refused
//! from its prelude, before its bytes are waited for, so the buffer never holds more
//! than one frame under the limit plus the last chunk pushed.

use aws_smithy_eventstream::frame::{DecodedFrame, MessageFrameDecoder};
use aws_smithy_types::event_stream::{HeaderValue, Message};
use bytes::{Buf, BytesMut};

use crate::wire::sse::{EventTooLarge, Reframe};

/// A frame's fixed parts: the prelude (12 bytes) and the message CRC (4).
const FRAME_OVERHEAD: usize = 16;
/// Room for a frame's headers beyond its payload when checking the size limit.
const HEADER_ROOM: usize = 1024;

/// Turns event-stream bytes into SSE events (appended to the caller's buffer).
#[derive(Debug, Default)]
pub struct Reframer {
    pending: BytesMut,
    decoder: MessageFrameDecoder,
    /// The length the current frame's prelude declared, once its first bytes came.
    frame_len: Option<usize>,
    /// The stream can no longer be read (a bad frame was reported).
    broken: bool,
}

/// A frame over the size limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameTooLarge;

impl Reframer {
    /// Feeds `chunk`, appending one SSE event per complete frame to `out`.
    pub fn push(
        &mut self,
        chunk: &[u8],
        max_event: usize,
        out: &mut Vec<u8>,
    ) -> Result<(), FrameTooLarge> {
        if self.broken {
            return Ok(());
        }
        self.pending.extend_from_slice(chunk);
        loop {
            if self.frame_len.is_none() {
                if self.pending.len() < 4 {
                    return Ok(());
                }
                let declared = u32::from_be_bytes([
                    self.pending[0],
                    self.pending[1],
                    self.pending[2],
                    self.pending[3],
                ]) as usize;
                if declared > max_event.saturating_add(FRAME_OVERHEAD + HEADER_ROOM) {
                    self.pending = BytesMut::new();
                    self.broken = true;
                    return Err(FrameTooLarge);
                }
                self.frame_len = Some(declared);
            }
            match self.decoder.decode_frame(&mut self.pending) {
                Ok(DecodedFrame::Incomplete) => return Ok(()),
                Ok(DecodedFrame::Complete(message)) => {
                    self.frame_len = None;
                    write_event(&message, out);
                }
                Err(e) => {
                    self.broken = true;
                    self.pending = BytesMut::new();
                    write_error(
                        out,
                        "invalidEventStream",
                        502,
                        &format!("the upstream's event stream cannot be read: {e}"),
                    );
                    return Ok(());
                }
            }
            if !self.pending.has_remaining() {
                return Ok(());
            }
        }
    }

    /// Bytes held of a frame not yet complete.
    pub fn buffered(&self) -> usize {
        self.pending.len()
    }
}

impl Reframe for Reframer {
    fn push(
        &mut self,
        chunk: &[u8],
        max_event: usize,
        out: &mut Vec<u8>,
    ) -> Result<(), EventTooLarge> {
        Reframer::push(self, chunk, max_event, out).map_err(|FrameTooLarge| EventTooLarge)
    }

    fn buffered(&self) -> usize {
        Reframer::buffered(self)
    }
}

/// The status an exception of type `kind` classes as: an in-band error has no HTTP
/// status of its own.
fn exception_status(kind: &str) -> u16 {
    super::shapes::class_status(500, kind)
}

fn header<'a>(m: &'a Message, name: &str) -> Option<&'a str> {
    m.headers()
        .iter()
        .find(|h| h.name().as_str() == name)
        .and_then(|h| match h.value() {
            HeaderValue::String(s) => Some(s.as_str()),
            _ => None,
        })
}

/// One frame as one SSE event.
fn write_event(m: &Message, out: &mut Vec<u8>) {
    match header(m, ":message-type") {
        Some("exception") => {
            let kind = header(m, ":exception-type").unwrap_or("unknownException");
            let message = serde_json::from_slice::<serde_json::Value>(m.payload())
                .ok()
                .and_then(|v| {
                    v.get("message")
                        .or_else(|| v.get("Message"))
                        .and_then(|m| m.as_str())
                        .map(str::to_owned)
                })
                .unwrap_or_else(|| String::from_utf8_lossy(m.payload()).into_owned());
            let status = exception_status(kind);
            write_error(out, kind, status, &message);
        }
        Some("error") => {
            let kind = header(m, ":error-code").unwrap_or("unknownError");
            let message = header(m, ":error-message").unwrap_or("");
            let status = exception_status(kind);
            write_error(out, kind, status, message);
        }
        _ => {
            let name: String = header(m, ":event-type")
                .unwrap_or("unknown")
                .chars()
                .filter(char::is_ascii_alphanumeric)
                .collect();
            out.extend_from_slice(b"event: ");
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(b"\ndata: {\"");
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(b"\":");
            let payload = m.payload();
            if payload.iter().all(|b| b.is_ascii_whitespace()) {
                out.extend_from_slice(b"{}");
            } else {
                // JSON whitespace may be a line break, which no SSE data line holds
                // (inside strings JSON has none raw).
                out.extend(payload.iter().map(|&b| match b {
                    b'\n' | b'\r' => b' ',
                    b => b,
                }));
            }
            out.extend_from_slice(b"}\n\n");
        }
    }
}

fn write_error(out: &mut Vec<u8>, kind: &str, status: u16, message: &str) {
    let data = serde_json::json!({"error": {"type": kind, "code": status, "message": message}});
    out.extend_from_slice(b"event: error\ndata: ");
    out.extend_from_slice(data.to_string().as_bytes());
    out.extend_from_slice(b"\n\n");
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_smithy_eventstream::frame::write_message_to;
    use aws_smithy_types::event_stream::Header;

    fn frame(headers: &[(&str, &str)], payload: &str) -> Vec<u8> {
        let mut m = Message::new(payload.as_bytes().to_vec());
        for (k, v) in headers {
            m = m.add_header(Header::new(
                k.to_string(),
                HeaderValue::String(v.to_string().into()),
            ));
        }
        let mut out = Vec::new();
        write_message_to(&m, &mut out).unwrap();
        out
    }

    fn event(name: &str, payload: &str) -> Vec<u8> {
        frame(
            &[
                (":message-type", "event"),
                (":event-type", name),
                (":content-type", "application/json"),
            ],
            payload,
        )
    }

    #[test]
    fn frames_split_anywhere_become_one_event_each() {
        let mut bytes = event("messageStart", r#"{"role":"assistant"}"#);
        bytes.extend(event(
            "contentBlockDelta",
            "{\"contentBlockIndex\":0,\n\"delta\":{\"text\":\"Hi\"}}",
        ));
        let mut r = Reframer::default();
        let mut out = Vec::new();
        for b in &bytes {
            r.push(std::slice::from_ref(b), 1 << 20, &mut out).unwrap();
        }
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "event: messageStart\ndata: {\"messageStart\":{\"role\":\"assistant\"}}\n\n\
             event: contentBlockDelta\ndata: {\"contentBlockDelta\":{\"contentBlockIndex\":0, \"delta\":{\"text\":\"Hi\"}}}\n\n"
        );
        assert_eq!(r.buffered(), 0);
    }

    #[test]
    fn exceptions_become_error_events_with_their_class_status() {
        let bytes = frame(
            &[
                (":message-type", "exception"),
                (":exception-type", "throttlingException"),
                (":content-type", "application/json"),
            ],
            r#"{"message":"Too many requests, please wait before trying again."}"#,
        );
        let mut out = Vec::new();
        Reframer::default().push(&bytes, 1 << 20, &mut out).unwrap();
        let e = crate::wire::sse::error_event(&out).expect("an error event");
        assert_eq!(e.status, 429);
    }

    #[test]
    fn a_frame_over_the_limit_is_refused_from_its_prelude() {
        let big = event(
            "contentBlockDelta",
            &format!("{{\"x\":\"{}\"}}", "y".repeat(5000)),
        );
        let mut r = Reframer::default();
        let mut out = Vec::new();
        // Only the prelude has come: refused before the rest is waited for.
        assert_eq!(r.push(&big[..12], 1000, &mut out), Err(FrameTooLarge));
        assert_eq!(r.buffered(), 0);
    }

    #[test]
    fn a_corrupt_frame_ends_the_stream_with_an_error() {
        let mut bytes = event("messageStart", r#"{"role":"assistant"}"#);
        let last = bytes.len() - 1;
        bytes[last] ^= 0xff; // the message CRC
        let mut out = Vec::new();
        Reframer::default().push(&bytes, 1 << 20, &mut out).unwrap();
        let e = crate::wire::sse::error_event(&out).expect("an error event");
        assert_eq!(e.status, 502);
    }
}
