//! One pairing of a client's API with the API an upstream answers in, as the
//! translation's functions and the stream translator take it.

use super::super::dialect::{ClientDialect, Dialect};
use super::super::{anthropic, openai};
use crate::wire::surface::Wire;

/// A client's API paired with the API an upstream answers in: requests go one way,
/// answers, errors and streams of the same exchange come back the other.
#[derive(Clone, Copy)]
pub struct Translation {
    pub(super) client: &'static dyn ClientDialect,
    pub(super) upstream: &'static dyn Dialect,
}

impl Translation {
    /// A client of `wire` answered by an upstream speaking `upstream`.
    pub fn to(wire: Wire, upstream: &'static dyn Dialect) -> Self {
        Self {
            client: client(wire),
            upstream,
        }
    }

    /// The dialect the upstream answers in.
    pub fn upstream(self) -> &'static dyn Dialect {
        self.upstream
    }

    /// The client's wire.
    pub fn client_wire(self) -> Wire {
        self.client.wire()
    }
}

impl std::fmt::Debug for Translation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:?} client → {}",
            self.client.wire(),
            self.upstream.target().name
        )
    }
}

/// The client APIs' dialects, by wire.
fn client(wire: Wire) -> &'static dyn ClientDialect {
    match wire {
        Wire::OpenAi => &openai::CHAT,
        Wire::Anthropic => &anthropic::MESSAGES,
    }
}
