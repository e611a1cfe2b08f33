//! Every limit a replica enforces on what it does for others, named after what it
//! limits, and where it is enforced:
//!
//! | limit | what it bounds | module | enforced by |
//! |---|---|---|---|
//! | circuit breaker | a target that keeps failing is skipped for `openFor`; one whose circuit just closed takes a share growing over `rampUp` | `circuit` | the pipeline, per try and at a stream's end |
//! | `spec.hedge.maxPercent` | the share of a route's requests hedged in the last 60 s | `hedge` | the pipeline, as it starts a hedge |
//! | `maxConcurrency`, `maxQueue` | requests in flight to one credential, and those waiting | `concurrency` | the pipeline, before each try |
//! | `--max-inflight-body-bytes`, `--max-inflight-response-bytes` | bytes held at once, all requests together | `bytes` | `front::intake`, the pipeline's unary answers |
//! | `--max-event-bytes`, `--max-response-bytes` | one provider answer | `answers` | the pipeline's streams and unary answers |
//! | an LLMClient's `limits` and `budget` | its requests, tokens, concurrency and spend | `clients` | the data port, before routing to the pipeline |
//! | a 429's park (`maxRetryAfter`) | a rate-limited target is skipped until it ends | `config::target` | the pipeline |
//! | a key's park and rejection (`keyRejectedFor`) | a key answered 429, 401 or 403 is not used until they end | `keys` | the pipeline, per try |
//! | connections, header/body/idle timeouts, body size | what clients may hold | `front` | the accept loop and intake |
//!
//! Each is a small, lock-light state machine or counter that knows nothing of
//! routes, providers or HTTP.

pub mod answers;
pub(crate) mod bytes;
pub(crate) mod circuit;
pub mod clients;
pub(crate) mod concurrency;
pub(crate) mod hedge;
pub mod keys;
