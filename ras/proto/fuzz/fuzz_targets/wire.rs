//! The RAS peer wire decoder: arbitrary bytes in arbitrary splits.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| occl_ras_proto::fuzz_wire_bytes(data));
