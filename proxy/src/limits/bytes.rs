//! A byte budget shared by every request of a replica (docs/limits.md#the-limits): what may
//! be held in memory at once, all requests together. Two use it: request bodies being read
//! (`--max-inflight-body-bytes`) and unary provider answers being collected or on their way
//! to the client (`--max-inflight-response-bytes`).
//!
//! A reservation ([`Held`]) is one atomic add, given back when it is dropped; one
//! that does not fit is undone at once and refused, so the total never stays over
//! the cap. Nothing waits: past the cap the caller sheds the request.

use std::ops::Deref;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Bytes held now against a cap.
#[derive(Debug)]
pub struct Budget {
    held: AtomicUsize,
    cap: usize,
}

impl Budget {
    pub const fn new(cap: usize) -> Self {
        Self {
            held: AtomicUsize::new(0),
            cap,
        }
    }

    /// Bytes reserved now.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }

    pub fn cap(&self) -> usize {
        self.cap
    }
}

/// Bytes one request reserved in a [`Budget`], given back when dropped. `B` is how
/// the budget is reached: `&Budget` for a reservation that ends with the handler,
/// `Arc<Budget>` for one that travels with an answer's body.
#[derive(Debug)]
pub struct Held<B: Deref<Target = Budget>> {
    budget: B,
    bytes: usize,
}

impl<B: Deref<Target = Budget>> Held<B> {
    /// Nothing reserved yet.
    pub fn new(budget: B) -> Self {
        Self { budget, bytes: 0 }
    }

    /// Bytes reserved by this holder.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Reserve `more`; false (nothing reserved) when it does not fit.
    #[inline]
    pub fn grow(&mut self, more: usize) -> bool {
        if more == 0 {
            return true;
        }
        let b = &*self.budget;
        let before = b.held.fetch_add(more, Ordering::Relaxed);
        if before.saturating_add(more) > b.cap {
            b.held.fetch_sub(more, Ordering::Relaxed);
            return false;
        }
        self.bytes += more;
        true
    }

    /// Reserve up to `total` in all (nothing when already that much).
    #[inline]
    pub fn grow_to(&mut self, total: usize) -> bool {
        total <= self.bytes || self.grow(total - self.bytes)
    }
}

impl<B: Deref<Target = Budget>> Drop for Held<B> {
    fn drop(&mut self) {
        if self.bytes > 0 {
            self.budget.held.fetch_sub(self.bytes, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn reservations_add_up_refuse_past_the_cap_and_give_back_on_drop() {
        let b = Arc::new(Budget::new(100));
        let mut a = Held::new(b.clone());
        assert!(a.grow(60));
        let mut c = Held::new(&*b);
        assert!(!c.grow(41), "over the cap");
        assert_eq!(b.held(), 60, "a refusal reserves nothing");
        assert!(c.grow_to(40));
        assert!(c.grow_to(10), "already held");
        assert_eq!((c.bytes(), b.held()), (40, 100));
        assert!(!a.grow(1));
        drop(c);
        assert_eq!(b.held(), 60);
        drop(a);
        assert_eq!(b.held(), 0);
        assert!(Held::new(&*b).grow(0));
    }
}
