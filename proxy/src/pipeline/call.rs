//! What the pipeline is given and gives back: one client request as it needs it
//! ([`Call`]), and its [`Outcome`] with the facts the answer's headers and the
//! request log report ([`AttemptLog`]).

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, Response};
use bytes::Bytes;

use switchback_crds::config::ResponseModel;

use super::log::AttemptLog;
use super::stream::LineSlot;
use crate::config::snapshot::{RouteRt, TargetRt};
use crate::limits::clients::{ClientUsage, HeldReservation};
use crate::wire::rewrite::JsonStr;
use crate::wire::surface::Surface;

/// One client request, as the pipeline needs it.
pub struct Call<'a> {
    pub surface: Surface,
    /// The model name the client sent, as a JSON string literal (responses get it back).
    pub client_model: &'a str,
    pub client_model_json: JsonStr,
    pub body: Bytes,
    pub stream: bool,
    pub client_headers: &'a HeaderMap,
    /// The client's `x-request-id`, or the one the gateway made up; forwarded too.
    pub request_id: &'a HeaderValue,
    /// Gateways the request has passed through (`x-switchback-hops`, below
    /// `--max-hops`); every upstream request says one more.
    pub hops: u8,
    /// The LLMClient the request comes from: where its usage is counted.
    pub client: Option<&'a ClientUsage>,
    /// An OpenAI stream: the client's own `stream_options.include_usage` when
    /// already read (the body may then ask the provider for usage on the client's
    /// behalf, see `http`); `None`: read from `body` when needed.
    pub include_usage: Option<bool>,
    /// The body asks for the usage chunk the client did not: strip it (relayed
    /// streams; a translated stream answers as `include_usage` says anyway).
    pub strip_usage: bool,
    /// The request's budget reservation (docs/tenancy.md#reserve-before-sending), for
    /// whoever settles it: a committed stream takes it, so does a continuation that counts
    /// an answer the client walked away from; otherwise it settles with the request. `None`
    /// without a budget.
    pub reservation: Option<&'a HeldReservation>,
    /// Set when the client went away while the call was running (`http` sets it
    /// before the call's future is dropped): a unary answer in flight for a billed
    /// client is then read to its end and counted (`answer::Unanswered`).
    pub abandoned: &'a AtomicBool,
}

impl Call<'_> {
    /// The `model` answers from target `t` of `route` carry, as a JSON literal and as
    /// text (docs/request-lifecycle.md#headers `responseModel`): the name the client sent,
    /// or with `served` the upstream model that answered.
    pub fn answer_model<'x>(&'x self, route: &RouteRt, t: &'x TargetRt) -> (&'x JsonStr, &'x str) {
        match route.spec.response_model {
            ResponseModel::Requested => (&self.client_model_json, self.client_model),
            ResponseModel::Served => (
                t.upstream_model_json(self.client_model)
                    .unwrap_or(&self.client_model_json),
                t.model(self.client_model),
            ),
        }
    }
}

/// A call nobody abandons (continuations and tests).
pub static STAYS: AtomicBool = AtomicBool::new(false);

/// What the pipeline answers, with the facts the response headers report.
pub struct Outcome {
    pub response: Response<Body>,
    /// Upstream requests sent.
    pub attempts: u32,
    /// Targets moved past before the one that answered (or the last one considered).
    pub fallbacks: u32,
    /// The credential that answered, if one did.
    pub target: Option<HeaderValue>,
    /// The upstream model that answered (`x-switchback-model`,
    /// docs/request-lifecycle.md#headers), with `target`.
    pub model: Option<HeaderValue>,
    /// Index of the target that answered (in the route's declared order), if one did.
    pub answered_by: Option<u8>,
    pub log: Vec<AttemptLog>,
    /// For a committed stream: where to leave the request's log line, which the
    /// stream writes when it ends (with its real duration and how it ended).
    pub stream_line: Option<Arc<LineSlot>>,
}
