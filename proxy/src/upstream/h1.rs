//! One HTTP/1.1 exchange over a plain connection, written and read by the proxy
//! itself: the request written in one vectored write, the answer's head parsed with
//! `httparse`, its body framed by `content-length`, chunked transfer coding, or the
//! connection's end.
//!
//! Why not hyper's client connection: it moves every chunk of an answer through a
//! channel to the body, one chunk per poll of its connection state machine, and that
//! was the biggest single cost of a relayed stream (a provider's stream is one HTTP
//! chunk per event: docs/benchmark.md#where-a-requests-cpu-goes). Here a chunk
//! already read is cut out of the read buffer where it lies.
//!
//! What comes from the upstream is bounded (docs/limits.md#upstream-answers): the
//! head at [`MAX_HEAD`] bytes and [`MAX_HEADERS`] fields, a chunk-size line at
//! [`MAX_CHUNK_LINE`], trailers at [`MAX_HEAD`]; sizes that overflow are refused.

use std::io::IoSlice;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode, Version};
use tokio::io::AsyncWrite;
use tokio::net::TcpStream;

use super::Error;

/// An answer's head larger than this is refused (hyper's client allowed about as
/// much before its buffer limit).
pub(super) const MAX_HEAD: usize = 64 * 1024;
/// Header fields in an answer's head (hyper's default too).
pub(super) const MAX_HEADERS: usize = 100;
/// A chunk-size line, extensions included.
pub(super) const MAX_CHUNK_LINE: usize = 4 * 1024;
/// Read from the socket at a time.
const READ_SIZE: usize = 16 * 1024;

/// A connection and what has been read from it but not used yet.
pub(super) struct Conn {
    pub io: TcpStream,
    pub buf: BytesMut,
}

impl Conn {
    pub fn new(io: TcpStream) -> Self {
        Conn {
            io,
            buf: BytesMut::new(),
        }
    }

    /// Can this idle connection take a request? Not when the server closed it or
    /// sent something unasked (read without waiting: nothing is pending on it).
    pub fn is_open(&self) -> bool {
        if !self.buf.is_empty() {
            return false;
        }
        let mut probe = [0u8; 1];
        matches!(self.io.try_read(&mut probe), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
    }

    /// Reads more into the buffer; `Ok(0)` at the connection's end. Through
    /// `AsyncRead`, not `try_read_buf`: a read shorter than the room given tells tokio
    /// the socket is drained, so the next read (or [`Self::is_open`]'s) waits for the
    /// event loop instead of a `recvfrom` that fails with `EAGAIN`, one per request.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<usize>> {
        if self.buf.capacity() - self.buf.len() < READ_SIZE / 4 {
            self.buf.reserve(READ_SIZE);
        }
        tokio_util::io::poll_read_buf(Pin::new(&mut self.io), cx, &mut self.buf)
    }
}

/// The request's head: request line in origin form, the headers given (less any
/// framing of their own), and the body's `content-length`.
pub(super) fn head(
    method: &http::Method,
    path: &str,
    headers: &HeaderMap,
    body_len: usize,
) -> BytesMut {
    let mut out = BytesMut::with_capacity(256 + headers.len() * 48);
    out.extend_from_slice(method.as_str().as_bytes());
    out.extend_from_slice(b" ");
    out.extend_from_slice(path.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    for (name, value) in headers {
        if name == http::header::CONTENT_LENGTH
            || name == http::header::TRANSFER_ENCODING
            || name == http::header::CONNECTION
        {
            continue;
        }
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if body_len > 0 || *method == http::Method::POST || *method == http::Method::PUT {
        out.extend_from_slice(b"content-length: ");
        out.extend_from_slice(itoa::Buffer::new().format(body_len).as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out
}

/// Writes `head` then `body`, whole.
pub(super) async fn write(io: &mut TcpStream, head: &[u8], body: &[u8]) -> std::io::Result<()> {
    let mut bufs = [IoSlice::new(head), IoSlice::new(body)];
    let mut bufs = &mut bufs[..];
    // `advance_slices` drops the slices written whole, an empty body's too.
    while !bufs.is_empty() {
        let n = std::future::poll_fn(|cx| Pin::new(&mut *io).poll_write_vectored(cx, bufs)).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        IoSlice::advance_slices(&mut bufs, n);
    }
    Ok(())
}

/// An answer's head, read.
pub(super) struct Head {
    pub status: StatusCode,
    pub version: Version,
    pub headers: HeaderMap,
    pub framing: Framing,
    /// The connection may carry another exchange once this body has ended.
    pub keep_alive: bool,
}

/// How the answer's body ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Framing {
    Length(u64),
    Chunked,
    /// At the connection's end.
    Close,
}

/// Reads the answer's head (skipping `1xx` interim answers).
pub(super) async fn read_head(conn: &mut Conn, method: &http::Method) -> Result<Head, Error> {
    loop {
        let (len, mut head) = loop {
            if !conn.buf.is_empty()
                && let Some(found) = parse(&conn.buf[..])?
            {
                break found;
            }
            if conn.buf.len() > MAX_HEAD {
                return Err(Error::msg("the upstream's answer head is too large"));
            }
            let n = std::future::poll_fn(|cx| conn.poll_fill(cx))
                .await
                .map_err(Error::io)?;
            if n == 0 {
                return Err(Error::msg(
                    "the upstream closed the connection before answering",
                ));
            }
        };
        conn.buf.advance(len);
        if head.status.is_informational() {
            // `100 Continue` and the like: the answer follows.
            continue;
        }
        let no_body = head.status == StatusCode::NO_CONTENT
            || head.status == StatusCode::NOT_MODIFIED
            || *method == http::Method::HEAD;
        if no_body {
            head.framing = Framing::Length(0);
        }
        if head.framing == Framing::Close {
            head.keep_alive = false;
        }
        return Ok(head);
    }
}

/// The head at the start of `buf`, and its length; `None` when incomplete.
fn parse(buf: &[u8]) -> Result<Option<(usize, Head)>, Error> {
    // Left uninitialised: zeroing a hundred fields took more than parsing the head.
    let mut fields =
        [const { std::mem::MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
    let mut answer = httparse::Response::new(&mut []);
    let parsed = httparse::ParserConfig::default().parse_response_with_uninit_headers(
        &mut answer,
        buf,
        &mut fields,
    );
    let len = match parsed {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => {
            return Err(Error::msg(
                "the upstream's answer has too many header fields",
            ));
        }
        Err(_) => return Err(Error::msg("the upstream's answer is not HTTP/1")),
    };
    let status = answer
        .code
        .and_then(|c| StatusCode::from_u16(c).ok())
        .ok_or_else(|| Error::msg("the upstream's answer has no valid status"))?;
    let version = if answer.version == Some(0) {
        Version::HTTP_10
    } else {
        Version::HTTP_11
    };
    let mut headers = HeaderMap::with_capacity(answer.headers.len());
    let mut keep_alive = version == Version::HTTP_11;
    let mut length: Option<u64> = None;
    // `transfer-encoding`: absent, or whether its last coding is chunked.
    let mut chunked: Option<bool> = None;
    for field in answer.headers.iter() {
        let name = HeaderName::from_bytes(field.name.as_bytes())
            .map_err(|_| Error::msg("the upstream's answer has an invalid header name"))?;
        let value = HeaderValue::from_bytes(field.value)
            .map_err(|_| Error::msg("the upstream's answer has an invalid header value"))?;
        if name == http::header::CONTENT_LENGTH {
            let n = std::str::from_utf8(field.value)
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
                .ok_or_else(|| Error::msg("the upstream's content-length is not a number"))?;
            if length.is_some_and(|l| l != n) {
                return Err(Error::msg(
                    "the upstream sent two different content-lengths",
                ));
            }
            length = Some(n);
        } else if name == http::header::TRANSFER_ENCODING {
            // The last coding decides: chunked, or the body runs to the close.
            let last_chunked = field
                .value
                .rsplit(|b| *b == b',')
                .next()
                .is_some_and(|c| c.trim_ascii().eq_ignore_ascii_case(b"chunked"));
            chunked = Some(last_chunked);
            if !last_chunked {
                keep_alive = false;
            }
        } else if name == http::header::CONNECTION {
            for token in field.value.split(|b| *b == b',') {
                let token = token.trim_ascii();
                if token.eq_ignore_ascii_case(b"close") {
                    keep_alive = false;
                } else if token.eq_ignore_ascii_case(b"keep-alive") && version == Version::HTTP_10 {
                    keep_alive = true;
                }
            }
        }
        headers.append(name, value);
    }
    let framing = match (chunked, length) {
        (Some(true), length) => {
            // Both framings given (RFC 9112 §6.3): chunked decides, and the connection
            // is not trusted with another exchange, since a server that sent both may
            // mean the other one.
            if length.is_some() {
                keep_alive = false;
            }
            Framing::Chunked
        }
        (None, Some(n)) => Framing::Length(n),
        (Some(false), _) | (None, None) => Framing::Close,
    };
    Ok(Some((
        len,
        Head {
            status,
            version,
            headers,
            framing,
            keep_alive,
        },
    )))
}

/// Where a body's reading is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Reading {
    /// Bytes of the body left (content-length).
    Length(u64),
    /// Before a chunk-size line.
    ChunkSize,
    /// Bytes of the current chunk left, then its CRLF.
    ChunkData(u64),
    /// The CRLF after a chunk's data.
    ChunkEnd,
    /// After the last chunk: trailer lines up to an empty one.
    Trailers(usize),
    /// To the connection's end.
    Close,
    Done,
}

impl Reading {
    pub fn start(framing: Framing) -> Self {
        match framing {
            Framing::Length(0) => Reading::Done,
            Framing::Length(n) => Reading::Length(n),
            Framing::Chunked => Reading::ChunkSize,
            Framing::Close => Reading::Close,
        }
    }
}

/// The next piece of the body: data as it lies in the buffer (as much as has been
/// read, never waiting for a whole chunk), or `None` at the body's end.
pub(super) fn poll_data(
    conn: &mut Conn,
    state: &mut Reading,
    cx: &mut Context<'_>,
) -> Poll<Option<Result<Bytes, Error>>> {
    loop {
        match *state {
            Reading::Done => return Poll::Ready(None),
            Reading::Length(left) | Reading::ChunkData(left) if !conn.buf.is_empty() => {
                let n = conn
                    .buf
                    .len()
                    .min(usize::try_from(left).unwrap_or(usize::MAX));
                let data = conn.buf.split_to(n).freeze();
                let left = left - n as u64;
                *state = match *state {
                    Reading::Length(_) if left == 0 => Reading::Done,
                    Reading::Length(_) => Reading::Length(left),
                    _ if left == 0 => Reading::ChunkEnd,
                    _ => Reading::ChunkData(left),
                };
                return Poll::Ready(Some(Ok(data)));
            }
            Reading::Close if !conn.buf.is_empty() => {
                return Poll::Ready(Some(Ok(conn.buf.split().freeze())));
            }
            Reading::ChunkSize => {
                if let Some(end) = memchr::memchr(b'\n', &conn.buf) {
                    let size = chunk_size(&conn.buf[..end])?;
                    conn.buf.advance(end + 1);
                    *state = if size == 0 {
                        Reading::Trailers(0)
                    } else {
                        Reading::ChunkData(size)
                    };
                    continue;
                }
                if conn.buf.len() > MAX_CHUNK_LINE {
                    return Poll::Ready(Some(Err(Error::msg(
                        "the upstream's chunk-size line is too long",
                    ))));
                }
            }
            Reading::ChunkEnd => {
                if conn.buf.len() >= 2 {
                    if &conn.buf[..2] != b"\r\n" {
                        return Poll::Ready(Some(Err(Error::msg(
                            "the upstream's chunk does not end where its size says",
                        ))));
                    }
                    conn.buf.advance(2);
                    *state = Reading::ChunkSize;
                    continue;
                }
            }
            Reading::Trailers(seen) => {
                if let Some(end) = memchr::memchr(b'\n', &conn.buf) {
                    let empty = conn.buf[..end].trim_ascii().is_empty();
                    conn.buf.advance(end + 1);
                    if empty {
                        *state = Reading::Done;
                        return Poll::Ready(None);
                    }
                    *state = Reading::Trailers(seen + end + 1);
                    continue;
                }
                if seen + conn.buf.len() > MAX_HEAD {
                    return Poll::Ready(Some(Err(Error::msg(
                        "the upstream's trailers are too large",
                    ))));
                }
            }
            Reading::Length(_) | Reading::ChunkData(_) | Reading::Close => {}
        }
        // Nothing usable in the buffer: read more.
        match ready!(conn.poll_fill(cx)) {
            Ok(0) if *state == Reading::Close => {
                *state = Reading::Done;
                return Poll::Ready(None);
            }
            Ok(0) => {
                return Poll::Ready(Some(Err(Error::msg(
                    "the upstream closed the connection before the answer's end",
                ))));
            }
            Ok(_) => {}
            Err(e) => return Poll::Ready(Some(Err(Error::io(e)))),
        }
    }
}

/// A chunk-size line's size (hex, extensions after `;` ignored); refused when it is
/// not hex or does not fit in 64 bits.
fn chunk_size(line: &[u8]) -> Result<u64, Error> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let hex = line
        .split(|b| *b == b';')
        .next()
        .unwrap_or(line)
        .trim_ascii();
    if hex.is_empty() || hex.len() > 16 {
        return Err(Error::msg("the upstream's chunk size is not a size"));
    }
    let mut n: u64 = 0;
    for b in hex {
        let d = match b {
            b'0'..=b'9' => b - b'0',
            b'a'..=b'f' => b - b'a' + 10,
            b'A'..=b'F' => b - b'A' + 10,
            _ => return Err(Error::msg("the upstream's chunk size is not a size")),
        };
        n = (n << 4) | u64::from(d);
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_sizes_are_hex_with_extensions_ignored_and_bounded() {
        assert_eq!(chunk_size(b"1a\r").unwrap(), 26);
        assert_eq!(chunk_size(b"0").unwrap(), 0);
        assert_eq!(chunk_size(b"FF;name=value\r").unwrap(), 255);
        assert_eq!(chunk_size(b"ffffffffffffffff\r").unwrap(), u64::MAX);
        for bad in [&b"\r"[..], b"xyz\r", b"11111111111111111\r", b"-1\r"] {
            assert!(chunk_size(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_head_says_how_its_body_ends_and_whether_the_connection_stays() {
        let cases: [(&[u8], Framing, bool); 8] = [
            (
                b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n",
                Framing::Length(5),
                true,
            ),
            (
                b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n",
                Framing::Chunked,
                true,
            ),
            (
                b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n",
                Framing::Chunked,
                true,
            ),
            (
                b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\n",
                Framing::Close,
                false,
            ),
            (
                b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 1\r\n\r\n",
                Framing::Length(1),
                false,
            ),
            (
                b"HTTP/1.0 200 OK\r\ncontent-length: 1\r\n\r\n",
                Framing::Length(1),
                false,
            ),
            (
                b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\ntransfer-encoding: chunked\r\n\r\n",
                Framing::Chunked,
                false,
            ),
            (b"HTTP/1.1 200 OK\r\n\r\n", Framing::Close, true),
        ];
        for (raw, framing, keep) in cases {
            let (len, head) = parse(raw).unwrap().unwrap();
            assert_eq!(len, raw.len());
            assert_eq!(head.framing, framing, "{}", String::from_utf8_lossy(raw));
            assert_eq!(head.keep_alive, keep, "{}", String::from_utf8_lossy(raw));
        }
        assert!(parse(b"HTTP/1.1 200 OK\r\ncontent-len").unwrap().is_none());
        let two = b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\n";
        assert!(parse(two).is_err());
        let mut many = b"HTTP/1.1 200 OK\r\n".to_vec();
        for i in 0..=MAX_HEADERS {
            many.extend_from_slice(format!("x-{i}: y\r\n").as_bytes());
        }
        many.extend_from_slice(b"\r\n");
        assert!(parse(&many).is_err());
    }

    #[test]
    fn the_request_head_carries_the_bodys_length_and_no_framing_of_its_own() {
        let mut headers = HeaderMap::new();
        headers.insert("host", HeaderValue::from_static("sim:80"));
        headers.insert("content-length", HeaderValue::from_static("999"));
        headers.insert("x-request-id", HeaderValue::from_static("r1"));
        let h = head(&http::Method::POST, "/v1/chat?x=1", &headers, 12);
        assert_eq!(
            &h[..],
            b"POST /v1/chat?x=1 HTTP/1.1\r\nhost: sim:80\r\nx-request-id: r1\r\ncontent-length: 12\r\n\r\n"
        );
        let g = head(&http::Method::GET, "/m", &HeaderMap::new(), 0);
        assert_eq!(&g[..], b"GET /m HTTP/1.1\r\n\r\n");
    }
}
