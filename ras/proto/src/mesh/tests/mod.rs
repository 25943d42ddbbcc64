//! Mesh tests: unit tests of the pieces, and whole-job scenarios on the simulated network in `sim`.

mod auth;
mod metrics;
mod scenarios;
mod sim;
mod unit;
