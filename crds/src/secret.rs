//! [`Secret`]: a value that must never be printed. Debug, Display and Serialize all
//! write `*****`; the only way to the value is [`Secret::expose`], so every place that
//! reads key material is greppable.

use std::fmt;

use serde::{Serialize, Serializer};

#[derive(Clone, PartialEq, Eq, Default)]
pub struct Secret<T>(T);

const REDACTED: &str = "*****";

impl<T> Secret<T> {
    pub fn new(value: T) -> Self {
        Self(value)
    }

    /// The secret value. Call only where it leaves for its one legitimate use
    /// (an upstream request header, a rendered Kubernetes Secret).
    pub fn expose(&self) -> &T {
        &self.0
    }
}

impl<T> From<T> for Secret<T> {
    fn from(value: T) -> Self {
        Self(value)
    }
}

impl<T> fmt::Debug for Secret<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

impl<T> fmt::Display for Secret<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

impl<T> Serialize for Secret<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(REDACTED)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_prints_the_value() {
        let s = Secret::new("sk-live-123".to_string());
        assert_eq!(format!("{s:?}"), "*****");
        assert_eq!(format!("{s}"), "*****");
        assert_eq!(serde_json::to_string(&s).unwrap(), "\"*****\"");
        assert_eq!(s.expose(), "sk-live-123");
    }
}
