//! The cargo-fuzz crate's seed corpus (`ras/proto/fuzz/corpus/<target>/seed-*`): every seed still reaches the parser path
//! it was made for, and every fuzz body holds on every file of its corpus (the seeds, and whatever a local fuzz run
//! added beside them).

use crate::wire::{Decoder, Msg};
use std::path::PathBuf;

fn files(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus").join(target);
    let mut out: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| {
            let p = e.expect("entry").path();
            let name = p.file_name().expect("name").to_string_lossy().into_owned();
            (name, std::fs::read(&p).expect("read"))
        })
        .collect();
    out.sort();
    assert!(out.iter().any(|(n, _)| n.starts_with("seed-")), "no seeds in {}", dir.display());
    out
}

fn decode_all(mut dec: Decoder, bytes: &[u8]) -> Vec<Msg> {
    dec.push(bytes).expect("a seed fits the decoder");
    std::iter::from_fn(|| dec.next().expect("a seed decodes")).collect()
}

#[test]
fn the_wire_seeds_are_current_frames_of_every_message_kind() {
    let mut kinds = std::collections::HashSet::new();
    for (name, bytes) in files("wire") {
        if name.starts_with("seed-") {
            let msgs = decode_all(Decoder::new(), &bytes);
            assert!(!msgs.is_empty(), "{name}");
            kinds.extend(msgs.iter().map(std::mem::discriminant));
        }
        crate::fuzz_wire_bytes(&bytes);
    }
    assert_eq!(kinds.len(), 10, "one seed per message kind");
}

#[test]
fn the_mesh_seeds_reach_a_stranger_and_a_peer() {
    let (mut stranger, mut peer) = (0, 0);
    for (name, bytes) in files("mesh") {
        if let (true, Some((&mode, rest))) = (name.starts_with("seed-"), bytes.split_first()) {
            let authed = mode & 1 == 1;
            let dec = if authed { Decoder::new() } else { Decoder::handshake() };
            assert!(!decode_all(dec, rest).is_empty(), "{name}");
            *(if authed { &mut peer } else { &mut stranger }) += 1;
        }
        crate::mesh::fuzz_mesh_bytes(&bytes);
    }
    assert!(stranger > 0 && peer > 0, "{stranger} stranger seeds, {peer} peer seeds");
}

#[test]
fn the_client_and_exposition_bodies_hold_on_their_corpora() {
    for (_, bytes) in files("client") {
        crate::fuzz_client_bytes(&bytes);
    }
    for (_, bytes) in files("exposition") {
        crate::fuzz_exposition_bytes(&bytes);
    }
}
