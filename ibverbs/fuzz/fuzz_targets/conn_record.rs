//! A peer's connection record, as the bootstrap delivers it: arbitrary bytes.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ibverbs::conn::fuzz_conn_record(data));
