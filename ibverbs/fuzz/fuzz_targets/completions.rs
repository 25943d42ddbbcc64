//! Work completions with arbitrary statuses, immediates and lengths, fed to flow control.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ibverbs::completion::fuzz_completions(data));
