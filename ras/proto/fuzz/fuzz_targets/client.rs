//! The `ncclras` client-port session: arbitrary command bytes in arbitrary splits.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| occl_ras_proto::fuzz_client_bytes(data));
