//! The built library exports every function of NCCL 2.28's API and its `pnccl` alias, and
//! carries the soname `libnccl.so.2`. Read from the ELF file itself (no binutils needed).

mod common;

use std::collections::BTreeSet;

/// Little-endian reads at an offset.
fn u16_at(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes(b[o..o + 2].try_into().expect("in bounds"))
}
fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().expect("in bounds"))
}
fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().expect("in bounds"))
}

fn cstr(b: &[u8], o: usize) -> String {
    let end = b[o..].iter().position(|&c| c == 0).expect("a NUL-terminated name") + o;
    String::from_utf8_lossy(&b[o..end]).into_owned()
}

struct Section {
    kind: u32,
    offset: usize,
    size: usize,
    link: usize,
    entsize: usize,
}

/// The defined global functions of `.dynsym` and the `DT_SONAME` of an ELF64 little-endian file.
fn dynamic_exports(b: &[u8]) -> (BTreeSet<String>, Option<String>) {
    assert_eq!(&b[..4], b"\x7fELF", "not an ELF file");
    assert_eq!(b[4], 2, "not ELF64");
    assert_eq!(b[5], 1, "not little-endian");
    let shoff = u64_at(b, 0x28) as usize;
    let shentsize = u16_at(b, 0x3a) as usize;
    let shnum = u16_at(b, 0x3c) as usize;
    let sections: Vec<Section> = (0..shnum)
        .map(|i| {
            let h = shoff + i * shentsize;
            Section {
                kind: u32_at(b, h + 4),
                offset: u64_at(b, h + 0x18) as usize,
                size: u64_at(b, h + 0x20) as usize,
                link: u32_at(b, h + 0x28) as usize,
                entsize: u64_at(b, h + 0x38) as usize,
            }
        })
        .collect();
    const SHT_DYNSYM: u32 = 11;
    const SHT_DYNAMIC: u32 = 6;
    let dynsym = sections.iter().find(|s| s.kind == SHT_DYNSYM).expect("a .dynsym section");
    let strtab = &sections[dynsym.link];
    let mut names = BTreeSet::new();
    for i in 0..dynsym.size / dynsym.entsize {
        let e = dynsym.offset + i * dynsym.entsize;
        let (name, info, shndx) = (u32_at(b, e) as usize, b[e + 4], u16_at(b, e + 6));
        let (bind, kind) = (info >> 4, info & 0xf);
        // Defined (section index not UNDEF), GLOBAL or WEAK, FUNC.
        if shndx != 0 && (bind == 1 || bind == 2) && kind == 2 {
            names.insert(cstr(b, strtab.offset + name));
        }
    }
    let soname = sections.iter().find(|s| s.kind == SHT_DYNAMIC).and_then(|d| {
        let strtab = &sections[d.link];
        (0..d.size / 16).find_map(|i| {
            let e = d.offset + i * 16;
            (u64_at(b, e) == 14).then(|| cstr(b, strtab.offset + u64_at(b, e + 8) as usize))
        })
    });
    (names, soname)
}

#[test]
fn every_nccl_2_28_function_and_its_alias_is_exported_with_soname_libnccl_so_2() {
    let lib = common::library();
    let bytes = std::fs::read(&lib).unwrap();
    let (exported, soname) = dynamic_exports(&bytes);
    assert_eq!(soname.as_deref(), Some("libnccl.so.2"), "{}", lib.display());
    let api = common::api_names();
    assert_eq!(api.len(), 52, "NCCL 2.28.9 has 52 public functions");
    let missing: Vec<String> =
        api.iter().flat_map(|n| [n.clone(), format!("p{n}")]).filter(|n| !exported.contains(n)).collect();
    assert!(missing.is_empty(), "{} does not export: {missing:?}", lib.display());
    // The 38 that PyTorch 2.11's libtorch_cuda.so imports are among them.
    for n in [
        "ncclCommInitRankScalable",
        "ncclCommShrink",
        "ncclCommWindowRegister",
        "ncclDevCommCreate",
        "ncclGroupSimulateEnd",
        "ncclMemAlloc",
        "ncclRedOpCreatePreMulSum",
    ] {
        assert!(api.iter().any(|a| a == n), "{n} is not in api-2.28.txt");
    }
    // Nothing else called nccl* leaks out (a name the list lacks would be a typo or an extra).
    let extra: Vec<&String> = exported
        .iter()
        .filter(|n| n.starts_with("nccl") || n.starts_with("pnccl"))
        .filter(|n| !api.iter().any(|a| *n == a || **n == format!("p{a}")))
        .collect();
    assert!(extra.is_empty(), "exported but not in NCCL 2.28's API: {extra:?}");
}
