//! occl-ras: rank records, the keep-alive mesh, status gathering and the port-28028 client
//! protocol (NCCL's `ncclras` text protocol and HTTP).
//!
//! This crate is a leaf: it never depends on `occl`. It is filled in by the RAS issue; until then
//! the crate only builds.
#![forbid(unsafe_code)]
