//! Shared helpers for occl's integration tests and benchmark.
