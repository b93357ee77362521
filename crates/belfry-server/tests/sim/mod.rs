//! The deterministic simulation's parts (see `tests/simulation.rs`).

pub mod clock;
pub mod driver;
pub mod model;
pub mod outcomes;
pub mod rng;
pub mod sink;
pub mod store;
pub mod world;
