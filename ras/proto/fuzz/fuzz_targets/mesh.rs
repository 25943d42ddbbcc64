//! One connection into a RAS mesh: a stranger (first byte even) or an authenticated peer (odd) sending arbitrary
//! frames.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| occl_ras_proto::mesh::fuzz_mesh_bytes(data));
