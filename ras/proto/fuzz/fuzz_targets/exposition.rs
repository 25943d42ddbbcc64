//! Merging the node's processes' Prometheus texts: arbitrary bytes as up to 8 processes' texts (split at 0xFF).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| occl_ras_proto::fuzz_exposition_bytes(data));
