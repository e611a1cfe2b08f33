//! One request on one route.

pub mod attempt;
pub mod order;
pub mod outcome;
pub mod relay;
