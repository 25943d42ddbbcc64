//! occl-kernels: CUDA C kernels compiled with NVRTC, their on-disk cache and launch wrappers.
//!
//! This crate is a leaf: it never depends on `occl`. It is filled in by the GPU issue; until then
//! the crate only builds.
#![forbid(unsafe_code)]
