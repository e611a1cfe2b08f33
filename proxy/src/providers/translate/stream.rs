//! Streams: one upstream SSE event in, zero or more complete client SSE events out,
//! at once. The upstream's adapter decodes the event into form events, which the
//! client's adapter encodes as they come: nothing is collected in between.

use bytes::{BufMut, BytesMut};

use super::super::dialect::{StreamDecoder, StreamEncoder};
use super::super::form;
use super::super::vocab::now;
use super::translation::Translation;
use crate::wire::sse;

/// Translates one upstream stream for one client. Feed it every upstream event in
/// order with [`event`](Self::event) (the unterminated tail `Framer::take_rest`
/// returns counts as an event), then call [`finish`](Self::finish) once when the
/// upstream ends cleanly. If the upstream connection fails instead, the caller
/// writes its own failure event (`sse::failure_event`) as it does untranslated.
pub struct StreamTranslator {
    translation: Translation,
    /// The upstream's side.
    decoder: Box<dyn StreamDecoder>,
    /// The client's side.
    encoder: Box<dyn StreamEncoder>,
    done: bool,
}

impl StreamTranslator {
    /// `include_usage`: the OpenAI client's `stream_options.include_usage` (see
    /// [`super::include_usage`]); ignored for Anthropic clients, which always get usage.
    pub fn new(
        translation: impl Into<Translation>,
        client_model: &str,
        include_usage: bool,
    ) -> Self {
        let translation = translation.into();
        Self {
            decoder: translation.upstream.stream_decoder(),
            encoder: translation
                .client
                .stream_encoder(client_model, now(), include_usage),
            translation,
            done: false,
        }
    }

    /// Fix the `created` stamp of OpenAI chunks (reproducible output in tests).
    pub fn with_created(mut self, created: u64) -> Self {
        self.encoder.set_created(created);
        self
    }

    /// The dialect the upstream answers in (where its events report usage).
    pub fn upstream(&self) -> &'static dyn super::super::dialect::Dialect {
        self.translation.upstream()
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
        // The decoder hands each form event straight to the encoder, which writes
        // it into `out`: nothing is collected in between.
        let Self {
            decoder,
            encoder,
            done,
            ..
        } = self;
        let mut emit = |ev: form::Event<'_>| {
            if !*done {
                *done = encoder.encode(ev, out);
            }
        };
        decoder.decode(data, &mut emit);
    }

    /// The upstream ended. Completes a stream whose last terminal events were
    /// missing but whose stop reason is known; otherwise (the upstream stopped
    /// mid-answer) ends the client stream with an error event.
    pub fn finish(&mut self, out: &mut BytesMut) {
        if self.done {
            return;
        }
        self.done = true;
        if self.encoder.stopped() {
            self.encoder.end(out);
        } else {
            out.put_slice(&sse::failure_event(
                self.translation.client_wire(),
                "the upstream stream ended before the answer was complete",
            ));
        }
    }

    /// An in-band upstream error, in the client's shape; the stream ends with it.
    fn error(&mut self, status: u16, body: &[u8], out: &mut BytesMut) {
        self.done = true;
        let e = self.translation.upstream.decode_error(status, body);
        self.encoder.encode(form::Event::Error(e), out);
    }
}
