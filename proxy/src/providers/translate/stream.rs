//! Streams: one upstream SSE event in, zero or more complete client SSE events out,
//! at once. The upstream's adapter decodes the event into form events, which the
//! client's adapter encodes as they come: nothing is collected in between.

use bytes::{BufMut, BytesMut};
use serde::Serialize;

use super::vocab::now;
use super::{Client, Dialect, Direction, anthropic, bedrock, form, gemini, openai};
use crate::wire::sse;

/// Translates one upstream stream for one client. Feed it every upstream event in
/// order with [`event`](Self::event) (the unterminated tail `Framer::take_rest`
/// returns counts as an event), then call [`finish`](Self::finish) once when the
/// upstream ends cleanly. If the upstream connection fails instead, the caller
/// writes its own failure event (`sse::failure_event`) as it does untranslated.
pub struct StreamTranslator {
    direction: Direction,
    decoder: Decoder,
    encoder: Encoder,
    done: bool,
}

/// The upstream's side.
enum Decoder {
    OpenAi(openai::StreamDecoder),
    Anthropic(anthropic::StreamDecoder),
    Gemini(gemini::StreamDecoder),
    Bedrock(bedrock::StreamDecoder),
}

/// The client's side.
enum Encoder {
    OpenAi(openai::StreamEncoder),
    Anthropic(anthropic::StreamEncoder),
}

impl StreamTranslator {
    /// `include_usage`: the OpenAI client's `stream_options.include_usage` (see
    /// [`super::include_usage`]); ignored for Anthropic clients, which always get usage.
    pub fn new(direction: Direction, client_model: &str, include_usage: bool) -> Self {
        let (client, upstream) = direction.dialects();
        let decoder = match upstream {
            Dialect::OpenAiChat => Decoder::OpenAi(openai::StreamDecoder::default()),
            Dialect::AnthropicMessages => Decoder::Anthropic(anthropic::StreamDecoder::default()),
            Dialect::Gemini => Decoder::Gemini(gemini::StreamDecoder::default()),
            Dialect::Bedrock => Decoder::Bedrock(bedrock::StreamDecoder::default()),
        };
        let encoder = match client {
            Client::OpenAiChat => Encoder::OpenAi(openai::StreamEncoder::new(
                client_model,
                now(),
                include_usage,
            )),
            Client::AnthropicMessages => {
                Encoder::Anthropic(anthropic::StreamEncoder::new(client_model))
            }
        };
        Self {
            direction,
            decoder,
            encoder,
            done: false,
        }
    }

    /// Fix the `created` stamp of OpenAI chunks (reproducible output in tests).
    pub fn with_created(mut self, created: u64) -> Self {
        if let Encoder::OpenAi(e) = &mut self.encoder {
            e.set_created(created);
        }
        self
    }

    /// Whether the upstream is Gemini (its usage is `usageMetadata`).
    pub fn from_gemini(&self) -> bool {
        self.direction.to_gemini()
    }

    /// Whether the upstream is Bedrock (its usage is the `metadata` event's).
    pub fn from_bedrock(&self) -> bool {
        self.direction.to_bedrock()
    }

    /// Whether the client stream is complete (terminated normally or by an error
    /// event): later events are ignored.
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// Translate ONE complete upstream event, appending the client events to `out`.
    pub fn event(&mut self, upstream_event: &[u8], out: &mut BytesMut) {
        if self.done {
            return;
        }
        let fields = sse::fields(upstream_event);
        let Some(data) = fields.data else {
            return; // a comment or keep-alive
        };
        if let Some(e) = sse::error_in(&fields) {
            self.error(e.status, &e.body, out);
            return;
        }
        // Static dispatch on both sides: the decoder hands each form event straight
        // to the encoder, which writes it into `out`.
        let Self {
            decoder,
            encoder,
            done,
            ..
        } = self;
        let mut emit = |ev: form::Event<'_>| {
            if !*done {
                *done = match encoder {
                    Encoder::OpenAi(e) => e.encode(ev, out),
                    Encoder::Anthropic(e) => e.encode(ev, out),
                };
            }
        };
        match decoder {
            Decoder::OpenAi(d) => d.decode(data, &mut emit),
            Decoder::Anthropic(d) => d.decode(data, &mut emit),
            Decoder::Gemini(d) => d.decode(data, &mut emit),
            Decoder::Bedrock(d) => d.decode(data, &mut emit),
        }
    }

    /// The upstream ended. Completes a stream whose last terminal events were
    /// missing but whose stop reason is known; otherwise (the upstream stopped
    /// mid-answer) ends the client stream with an error event.
    pub fn finish(&mut self, out: &mut BytesMut) {
        if self.done {
            return;
        }
        self.done = true;
        let completed = match &mut self.encoder {
            Encoder::OpenAi(e) => {
                e.stopped() && {
                    e.end(out);
                    true
                }
            }
            Encoder::Anthropic(e) => {
                e.stopped() && {
                    e.end(out);
                    true
                }
            }
        };
        if !completed {
            out.put_slice(&sse::failure_event(
                self.direction.client_wire(),
                "the upstream stream ended before the answer was complete",
            ));
        }
    }

    /// An in-band upstream error, in the client's shape; the stream ends with it.
    fn error(&mut self, status: u16, body: &[u8], out: &mut BytesMut) {
        self.done = true;
        let e = match self.decoder {
            Decoder::OpenAi(_) => openai::decode_error(status, body),
            Decoder::Anthropic(_) => anthropic::decode_error(status, body),
            Decoder::Gemini(_) => gemini::decode_error(status, body),
            Decoder::Bedrock(_) => bedrock::decode_error(status, body),
        };
        let ev = form::Event::Error(e);
        match &mut self.encoder {
            Encoder::OpenAi(enc) => enc.encode(ev, out),
            Encoder::Anthropic(enc) => enc.encode(ev, out),
        };
    }
}

pub(super) fn write_json<T: Serialize + ?Sized>(out: &mut BytesMut, v: &T) {
    // Serialising plain structs and `Value`s into memory cannot fail.
    let _ = serde_json::to_writer(out.writer(), v);
}
