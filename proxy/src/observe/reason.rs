//! Why an attempt failed, or why a target was passed over: the one vocabulary every
//! count, log line, metric label, circuit decision and error body's `attempts` list
//! uses. What a reason implies for the walk (may the chain advance, may the target be
//! retried) is the pipeline's policy; which reason an answer is, the providers' words
//! for it (`providers::classify`).

use switchback_crds::config::FailureClass;

/// Why an attempt failed (or why a target was passed over). The names are the ones
/// in `attempts` lists, logs and stats.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reason {
    /// 5xx, or an in-band stream error that maps to one.
    Status5xx,
    RateLimited,
    /// The attempt's own timeout, or an upstream 408.
    Timeout,
    /// The whole call's budget ran out.
    Budget,
    ConnectionError,
    ContextLength,
    AuthError,
    /// Any other 4xx: the caller's mistake, returned unchanged.
    ClientError,
    /// A provider's content filter refused the request (Azure OpenAI's 400
    /// `content_filter`): the request's fault, returned unchanged unless the route
    /// lists `contentFilter` in `fallback.onFailures`.
    ContentFilter,
    /// A 2xx that cannot be used: not the surface's JSON, a stream without content.
    InvalidResponse,
    /// A unary 2xx over `--max-response-bytes` (class `invalidResponse`).
    ResponseTooLarge,
    /// An SSE event over `--max-event-bytes` (class `invalidResponse`).
    EventTooLarge,
    /// A unary 2xx that did not fit in `--max-inflight-response-bytes`: the replica
    /// holds as many answers as it may. Not the provider's failure (no class, no
    /// circuit); the chain stops and the client gets 503 `overloaded`.
    Overloaded,
    /// The attempt was cancelled because the other attempt of a hedged request
    /// (`spec.hedge`, docs/streaming.md#first-token-hedging) committed first. Not the
    /// provider's failure (no class, no circuit); only ever in the attempt log and the
    /// counts.
    HedgeLost,
    /// The target answered 508: the request came back to a Switchback gateway it had
    /// passed through (`x-switchback-hops` reached that gateway's `--max-hops`), so the
    /// credential's base URL leads back to a gateway. Never retried (the same request
    /// loops the same way); the chain moves on to the next target; no circuit. A chain
    /// that ends on it answers 508 `loop_detected` itself, so the hop before does not
    /// retry either (docs/limits.md#no-loops).
    LoopDetected,
    // Skipped before commitment:
    MissingKey,
    UnsupportedSurface,
    Parked,
    CircuitOpen,
    /// The target's circuit closed moments ago and the failback ramp
    /// (`circuitBreaker.rampUp`, docs/streaming.md#failback-ramp) gave this request to the
    /// next target.
    RampingUp,
    QueueFull,
    /// The request uses a parameter the target's API cannot honour (translation).
    UnsupportedParameter,
    /// Passed over for resuming a broken stream: the target cannot continue a
    /// prefilled answer (docs/streaming.md#resume-after-commit).
    CannotResume,
    /// The request needs something the target's API has no equivalent for (a JSON
    /// schema it cannot express, reasoning settings of a model family it cannot
    /// carry, ...: docs/translation.md#a-target-that-cannot-serve-a-feature); the walk goes
    /// on to a target that can.
    UnsupportedFeature,
}

impl Reason {
    pub const COUNT: usize = 24;
    pub const ALL: [Reason; Self::COUNT] = [
        Self::Status5xx,
        Self::RateLimited,
        Self::Timeout,
        Self::Budget,
        Self::ConnectionError,
        Self::ContextLength,
        Self::AuthError,
        Self::ClientError,
        Self::ContentFilter,
        Self::InvalidResponse,
        Self::ResponseTooLarge,
        Self::EventTooLarge,
        Self::Overloaded,
        Self::HedgeLost,
        Self::LoopDetected,
        Self::MissingKey,
        Self::UnsupportedSurface,
        Self::Parked,
        Self::CircuitOpen,
        Self::RampingUp,
        Self::QueueFull,
        Self::UnsupportedParameter,
        Self::CannotResume,
        Self::UnsupportedFeature,
    ];

    pub fn index(self) -> usize {
        self as usize
    }

    /// Failures that count towards opening the circuit: the provider looks unhealthy.
    /// Not 4xx (the request's fault), not context length, not 429 (parking handles
    /// it), not the call's own budget running out. A useless 2xx does.
    pub(crate) fn trips_breaker(self, status: Option<u16>) -> bool {
        match self {
            Self::Status5xx
            | Self::ConnectionError
            | Self::InvalidResponse
            | Self::ResponseTooLarge
            | Self::EventTooLarge => true,
            Self::Timeout => status.is_none(), // the attempt timed out; 408 is an answer
            _ => false,
        }
    }

    /// Whether the target was passed over without a request being sent.
    pub(crate) fn is_skip(self) -> bool {
        matches!(
            self,
            Self::MissingKey
                | Self::UnsupportedSurface
                | Self::Parked
                | Self::CircuitOpen
                | Self::RampingUp
                | Self::QueueFull
                | Self::UnsupportedParameter
                | Self::CannotResume
                | Self::UnsupportedFeature
        )
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Status5xx => "status5xx",
            Self::RateLimited => "rateLimited",
            Self::Timeout => "timeout",
            Self::Budget => "budgetExhausted",
            Self::ConnectionError => "connectionError",
            Self::ContextLength => "contextLength",
            Self::AuthError => "authError",
            Self::ClientError => "clientError",
            Self::ContentFilter => "contentFilter",
            Self::InvalidResponse => "invalidResponse",
            Self::ResponseTooLarge => "responseTooLarge",
            Self::EventTooLarge => "eventTooLarge",
            Self::Overloaded => "overloaded",
            Self::HedgeLost => "hedgeLost",
            Self::LoopDetected => "loopDetected",
            Self::MissingKey => "missingKey",
            Self::UnsupportedSurface => "unsupportedSurface",
            Self::Parked => "parked",
            Self::CircuitOpen => "circuitOpen",
            Self::RampingUp => "rampingUp",
            Self::QueueFull => "queueFull",
            Self::UnsupportedParameter => "unsupportedParameter",
            Self::CannotResume => "cannotResume",
            Self::UnsupportedFeature => "unsupportedFeature",
        }
    }

    /// The `fallback.onFailures` class this failure belongs to, if any.
    pub fn class(self) -> Option<FailureClass> {
        Some(match self {
            Self::Status5xx => FailureClass::Status5xx,
            Self::RateLimited => FailureClass::RateLimited,
            Self::Timeout | Self::Budget => FailureClass::Timeout,
            Self::ConnectionError => FailureClass::ConnectionError,
            Self::ContextLength => FailureClass::ContextLength,
            Self::AuthError => FailureClass::AuthError,
            Self::ContentFilter => FailureClass::ContentFilter,
            Self::InvalidResponse | Self::ResponseTooLarge | Self::EventTooLarge => {
                FailureClass::InvalidResponse
            }
            _ => return None,
        })
    }

    /// Failures whose upstream answer is handed to the client as it was when the chain
    /// stops on them: they say something about the request, not the provider.
    pub(crate) fn returns_upstream_answer(self) -> bool {
        matches!(
            self,
            Self::ContextLength | Self::AuthError | Self::ClientError | Self::ContentFilter
        )
    }
}

/// What became of a committed stream that failed in a way its route resumes
/// (docs/streaming.md#resume-after-commit): `resumed` on another target, or why it was not.
/// The `outcome` label of `switchback_stream_resumes_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ResumeOutcome {
    Resumed,
    /// A tool call was streaming when it broke: its arguments cannot be continued.
    ToolCallInProgress,
    /// The client had been sent more text than `maxHeldBytes`.
    HeldBytesExceeded,
    /// `maxResumes` were used already.
    MaxResumesUsed,
    /// Every target left was skipped or failed before its continuation committed.
    NoEligibleTarget,
    /// The route's `timeout` (the whole call's budget) was spent.
    BudgetExhausted,
}

impl ResumeOutcome {
    pub const COUNT: usize = 6;
    pub const ALL: [ResumeOutcome; Self::COUNT] = [
        Self::Resumed,
        Self::ToolCallInProgress,
        Self::HeldBytesExceeded,
        Self::MaxResumesUsed,
        Self::NoEligibleTarget,
        Self::BudgetExhausted,
    ];

    pub fn index(self) -> usize {
        self as usize
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Resumed => "resumed",
            Self::ToolCallInProgress => "toolCallInProgress",
            Self::HeldBytesExceeded => "heldBytesExceeded",
            Self::MaxResumesUsed => "maxResumesUsed",
            Self::NoEligibleTarget => "noEligibleTarget",
            Self::BudgetExhausted => "budgetExhausted",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reason_indexes_are_dense_and_ordered() {
        for (i, r) in Reason::ALL.iter().enumerate() {
            assert_eq!(r.index(), i, "{r:?}");
        }
        for (i, r) in ResumeOutcome::ALL.iter().enumerate() {
            assert_eq!(r.index(), i, "{r:?}");
        }
    }

    #[test]
    fn only_provider_health_failures_trip_the_breaker() {
        assert!(Reason::Status5xx.trips_breaker(Some(503)));
        assert!(Reason::ConnectionError.trips_breaker(None));
        assert!(Reason::Timeout.trips_breaker(None));
        assert!(Reason::InvalidResponse.trips_breaker(None));
        assert!(Reason::ResponseTooLarge.trips_breaker(None));
        assert!(!Reason::Timeout.trips_breaker(Some(408)));
        for r in [
            Reason::RateLimited,
            Reason::ContextLength,
            Reason::AuthError,
            Reason::ClientError,
            Reason::Budget,
        ] {
            assert!(!r.trips_breaker(Some(400)), "{r:?}");
        }
        // The replica's own memory budget says nothing about the provider.
        assert!(!Reason::Overloaded.trips_breaker(None));
    }

    #[test]
    fn a_ramp_skip_is_a_skip_and_a_lost_hedge_says_nothing_of_the_provider() {
        assert!(Reason::RampingUp.is_skip());
        assert!(!Reason::RampingUp.trips_breaker(None));
        assert!(!Reason::HedgeLost.is_skip(), "it was sent");
        assert!(!Reason::HedgeLost.trips_breaker(None));
        assert_eq!(Reason::HedgeLost.class(), None);
        assert!(!Reason::HedgeLost.returns_upstream_answer());
        assert_eq!(
            (Reason::RampingUp.as_str(), Reason::HedgeLost.as_str()),
            ("rampingUp", "hedgeLost")
        );
    }
}
