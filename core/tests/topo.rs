//! Topology: the sysfs fixtures of `fixtures/topo/` (made by `make.sh`) read into the expected
//! devices, distances and NIC fusions, the dump formats, and the dump at communicator init.

use occl::topo::dump;
use occl::topo::path::{nic_distance, pci_distance};
use occl::topo::{ForceMerge, Host, NicKind, PathType, Topology};
use occl::{Comm, Config, ErrorKind, UniqueId};
use std::path::{Path, PathBuf};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/topo").join(name)
}

fn read(name: &str) -> Topology {
    Topology::read(&fixture(name))
}

fn labels(t: &Topology, kind: NicKind) -> Vec<String> {
    t.nics.iter().filter(|n| n.kind == kind).map(|n| n.label()).collect()
}

fn fused(t: &Topology, level: PathType, force: Option<&str>) -> occl::Result<Vec<String>> {
    let force = force.map(|f| ForceMerge::parse("OCCL_NET_FORCE_MERGE", f)).transpose()?;
    Ok(t.fuse(level, force.as_ref())?.names().into_iter().map(String::from).collect())
}

fn dist(t: &Topology, a: &str, b: &str) -> PathType {
    nic_distance(t.nic(a).expect(a), t.nic(b).expect(b))
}

#[test]
fn dgx8_devices_and_numa() {
    let t = read("dgx8");
    assert_eq!(t.numa.len(), 2);
    assert_eq!((t.numa[0].id, t.numa[0].cpus.to_string()), (0, "0-15,32-47".to_string()));
    assert_eq!((t.numa[1].id, t.numa[1].cpus.to_string()), (1, "16-31,48-63".to_string()));
    assert_eq!(t.affinity, None, "a fixture read has no process affinity");
    // The ASPEED VGA (not NVIDIA) and the NVSwitch-like bridge (not a display class) are no GPUs.
    let bdfs: Vec<&str> = t.gpus.iter().map(|g| g.pci.bdf.as_str()).collect();
    assert_eq!(
        bdfs,
        [
            "0000:05:00.0",
            "0000:06:00.0",
            "0000:0b:00.0",
            "0000:0c:00.0",
            "0000:83:00.0",
            "0000:84:00.0",
            "0000:a3:00.0",
            "0000:a4:00.0"
        ]
    );
    for g in &t.gpus {
        let node = if g.index < 4 { 0 } else { 1 };
        assert_eq!(g.pci.numa_node, Some(node), "gpu {}", g.index);
        assert_eq!(g.pci.local_cpus.as_ref(), Some(&t.numa[node as usize].cpus));
        assert_eq!((g.pci.class, g.pci.vendor, g.pci.device), (Some(0x030200), Some(0x10de), Some(0x2330)));
    }
    assert_eq!(labels(&t, NicKind::Ib), (0..8).map(|i| format!("mlx5_{i}:1")).collect::<Vec<_>>());
    // lo and docker0 have no PCI device.
    let mut ifs = vec!["eno1".to_string()];
    ifs.extend((0..8).map(|i| format!("ib{i}")));
    assert_eq!(labels(&t, NicKind::Socket), ifs);
    let m0 = t.nic("mlx5_0:1").unwrap();
    assert_eq!(
        m0.pci.path_string(),
        "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0/0000:03:00.0/0000:04:02.0/0000:07:00.0"
    );
    assert_eq!(
        (m0.state.as_deref(), m0.rate_gbps, m0.link_layer.as_deref()),
        (Some("ACTIVE"), Some(400.0), Some("InfiniBand"))
    );
    assert_eq!(t.nic("mlx5_6:1").unwrap().pci.numa_node, Some(1));
    let m7 = t.nic("mlx5_7:1").unwrap();
    assert_eq!(m7.state.as_deref(), Some("DOWN"));
    assert!(!m7.usable(), "a DOWN port is not fused");
    assert_eq!(t.nic("ib3").unwrap().pci, t.nic("mlx5_3:1").unwrap().pci, "IPoIB interface on the HCA's function");
}

#[test]
fn dgx8_distances() {
    let t = read("dgx8");
    assert_eq!(dist(&t, "mlx5_0:1", "mlx5_0:1"), PathType::Loc);
    assert_eq!(dist(&t, "mlx5_0:1", "ib0"), PathType::Port);
    assert_eq!(dist(&t, "mlx5_0:1", "mlx5_1:1"), PathType::Pix);
    assert_eq!(dist(&t, "mlx5_0:1", "mlx5_2:1"), PathType::Pxb);
    assert_eq!(dist(&t, "mlx5_1:1", "mlx5_3:1"), PathType::Pxb);
    assert_eq!(dist(&t, "mlx5_0:1", "eno1"), PathType::Phb, "same root complex, other root port");
    assert_eq!(dist(&t, "mlx5_4:1", "mlx5_5:1"), PathType::Pix);
    assert_eq!(dist(&t, "mlx5_4:1", "mlx5_6:1"), PathType::Phb, "two root complexes of one NUMA node");
    assert_eq!(dist(&t, "mlx5_3:1", "mlx5_4:1"), PathType::Sys);
    assert_eq!(dist(&t, "mlx5_0:1", "mlx5_7:1"), PathType::Sys);
    let gpu = |i: usize| &t.gpus[i].pci;
    let nic = |l: &str| &t.nic(l).unwrap().pci;
    assert_eq!(pci_distance(gpu(0), nic("mlx5_0:1")), PathType::Pix);
    assert_eq!(pci_distance(gpu(0), gpu(1)), PathType::Pix);
    assert_eq!(pci_distance(gpu(0), gpu(2)), PathType::Pxb);
    assert_eq!(pci_distance(gpu(4), gpu(6)), PathType::Phb);
    assert_eq!(pci_distance(gpu(3), gpu(4)), PathType::Sys);
    assert_eq!(pci_distance(gpu(7), nic("mlx5_7:1")), PathType::Pix);
}

#[test]
fn dgx8_fusion_at_every_level() {
    let t = read("dgx8");
    let singles: Vec<String> = (0..7).map(|i| format!("mlx5_{i}:1")).collect();
    // mlx5_7 is DOWN, so 7 NICs take part; at most 4 fuse into one.
    let want: [(PathType, Vec<&str>); 6] = [
        (PathType::Loc, singles.iter().map(String::as_str).collect()),
        (PathType::Port, singles.iter().map(String::as_str).collect()),
        (PathType::Pix, vec!["mlx5_0:1+mlx5_1:1", "mlx5_2:1+mlx5_3:1", "mlx5_4:1+mlx5_5:1", "mlx5_6:1"]),
        (PathType::Pxb, vec!["mlx5_0:1+mlx5_1:1+mlx5_2:1+mlx5_3:1", "mlx5_4:1+mlx5_5:1", "mlx5_6:1"]),
        (PathType::Phb, vec!["mlx5_0:1+mlx5_1:1+mlx5_2:1+mlx5_3:1", "mlx5_4:1+mlx5_5:1+mlx5_6:1"]),
        // Socket 0's four NICs fill the first virtual NIC before socket 1 is reached.
        (PathType::Sys, vec!["mlx5_0:1+mlx5_1:1+mlx5_2:1+mlx5_3:1", "mlx5_4:1+mlx5_5:1+mlx5_6:1"]),
    ];
    for (level, names) in want {
        assert_eq!(fused(&t, level, None).unwrap(), names, "level {level}");
    }
    assert_eq!(PathType::ALL.len(), 6, "every level is in the table above");
}

#[test]
fn sys_fuses_across_sockets_and_phb_does_not() {
    let t = read("dgx8");
    let some: Vec<_> = ["mlx5_2:1", "mlx5_3:1", "mlx5_4:1", "mlx5_5:1"].iter().map(|l| t.nic(l).unwrap()).collect();
    let names = |level| occl::topo::fuse(&some, level, None).unwrap().names().join(" ");
    assert_eq!(names(PathType::Sys), "mlx5_2:1+mlx5_3:1+mlx5_4:1+mlx5_5:1");
    assert_eq!(names(PathType::Phb), "mlx5_2:1+mlx5_3:1 mlx5_4:1+mlx5_5:1");
}

#[test]
fn dualport_devices_distances_and_fusion() {
    let t = read("dualport");
    assert_eq!(t.numa.len(), 1);
    assert_eq!(labels(&t, NicKind::Ib), ["mlx4_0:1", "mlx4_0:2"]);
    assert_eq!(labels(&t, NicKind::Socket), ["ib0", "ib1"]);
    assert_eq!(t.nic("mlx4_0:1").unwrap().pci, t.nic("mlx4_0:2").unwrap().pci);
    assert_eq!(t.nic("mlx4_0:2").unwrap().rate_gbps, Some(56.0));
    assert_eq!(dist(&t, "mlx4_0:1", "mlx4_0:2"), PathType::Port);
    assert_eq!(dist(&t, "ib0", "ib1"), PathType::Port);
    // The GPU's numa_node and local_cpulist are malformed: the list is dropped; the node, unknown,
    // can only be the host's single node.
    assert_eq!(t.gpus.len(), 1);
    assert_eq!(t.gpus[0].pci.local_cpus, None);
    assert_eq!(t.gpus[0].pci.numa_node, Some(0));
    assert_eq!(pci_distance(&t.gpus[0].pci, &t.nic("mlx4_0:1").unwrap().pci), PathType::Phb);
    for level in PathType::ALL {
        let want: Vec<&str> =
            if level == PathType::Loc { vec!["mlx4_0:1", "mlx4_0:2"] } else { vec!["mlx4_0:1+mlx4_0:2"] };
        assert_eq!(fused(&t, level, None).unwrap(), want, "level {level}");
    }
    let ifs: Vec<_> = t.fusion_candidates(NicKind::Socket);
    assert_eq!(occl::topo::fuse(&ifs, PathType::Port, None).unwrap().names(), ["ib0+ib1"]);
    assert_eq!(occl::topo::fuse(&ifs, PathType::Loc, None).unwrap().names(), ["ib0", "ib1"]);
}

#[test]
fn force_merge_groups_come_first() {
    let t = read("dgx8");
    // Forced groups (even of one NIC, which then stays alone), then distance for the rest.
    let got = fused(&t, PathType::Pix, Some("mlx5_0,mlx5_4; =mlx5_6:1;")).unwrap();
    assert_eq!(got, ["mlx5_0:1+mlx5_4:1", "mlx5_6:1", "mlx5_1:1", "mlx5_2:1+mlx5_3:1", "mlx5_5:1"]);
    let f = t.fuse(PathType::Loc, Some(&ForceMerge::parse("NCCL_NET_FORCE_MERGE", "mlx5_1,mlx5_2").unwrap())).unwrap();
    assert!(f.vnics[0].forced && !f.vnics[1].forced);
    assert_eq!(fused(&read("dualport"), PathType::Loc, Some("mlx4_0:1,mlx4_0:2")).unwrap(), ["mlx4_0:1+mlx4_0:2"]);
}

#[test]
fn force_merge_errors_name_the_variable() {
    let dgx = read("dgx8");
    let dual = read("dualport");
    for (t, text, why) in [
        (&dgx, "mlx5_0,mlx5_9", "matches 1"),
        (&dgx, "mlx5_0,mlx5_7", "matches 1"), // mlx5_7 is DOWN
        (&dgx, "mlx5_0,mlx5_1;mlx5_1,mlx5_2", "more than one group"),
        (&dual, "mlx4_0", "matches 2"),
        (&dual, "mlx4_0:3", "matches 0"),
    ] {
        let e = fused(t, PathType::Port, Some(text)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidUsage, "{text}");
        let msg = e.to_string();
        assert!(msg.contains("OCCL_NET_FORCE_MERGE") && msg.contains(why), "{text}: {msg}");
    }
    for text in ["mlx5_0,,mlx5_1", "mlx5_0:one", ";", "a,b,c,d,e"] {
        let e = ForceMerge::parse("NCCL_NET_FORCE_MERGE", text).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        assert!(e.to_string().contains("NCCL_NET_FORCE_MERGE"), "{text}: {e}");
    }
}

fn with_host(mut t: Topology) -> Topology {
    t.host = Some(Host { name: "node-a<1>".into(), hash: 0x0123_4567_89ab_cdef });
    t
}

#[test]
fn json_dump_round_trips() {
    let t = with_host(read("dgx8"));
    let f = t.fuse(PathType::Pix, None).unwrap();
    let v: serde_json::Value = serde_json::from_str(&dump::to_json(&t, Some(&f))).expect("valid JSON");
    assert_eq!(v["version"], 1);
    assert_eq!(v["host"]["name"], "node-a<1>");
    assert_eq!(v["host"]["hash"], "0x0123456789abcdef");
    assert_eq!(v["numa"][1]["cpus"], "16-31,48-63");
    assert_eq!(v["affinity"], serde_json::Value::Null);
    assert_eq!(v["gpus"].as_array().unwrap().len(), 8);
    assert_eq!(v["gpus"][4]["busid"], "0000:83:00.0");
    assert_eq!(v["gpus"][4]["numa_node"], 1);
    assert_eq!(v["gpus"][4]["class"], "0x030200");
    let nics = v["nics"].as_array().unwrap();
    assert_eq!(nics.len(), t.nics.len());
    assert_eq!(nics[0]["name"], "mlx5_0");
    assert_eq!(nics[0]["port"], 1);
    assert_eq!(nics[0]["rate_gbps"], 400);
    assert_eq!(nics[7]["state"], "DOWN");
    assert_eq!(nics[8]["kind"], "socket");
    assert_eq!(nics[8]["port"], serde_json::Value::Null);
    assert_eq!(v["fusion"]["level"], "PIX");
    assert_eq!(v["fusion"]["vnics"][0]["members"], serde_json::json!(["mlx5_0:1", "mlx5_1:1"]));
    // Absent fields are null, not missing.
    let d = with_host(read("dualport"));
    let v: serde_json::Value = serde_json::from_str(&dump::to_json(&d, None)).unwrap();
    assert_eq!(v["gpus"][0]["local_cpus"], serde_json::Value::Null);
    assert_eq!(v["fusion"], serde_json::Value::Null);
}

/// Checks that `text` is well-formed XML of the subset the dump writes: a declaration, nested
/// and empty elements, quoted attributes, the five entities. Returns the element names seen.
fn check_xml(text: &str) -> Vec<String> {
    let mut stack: Vec<String> = Vec::new();
    let mut seen = Vec::new();
    let mut rest = text.strip_prefix("<?xml version=\"1.0\"?>").expect("declaration");
    while let Some(open) = rest.find('<') {
        assert!(rest[..open].trim().is_empty(), "text outside elements: {:?}", &rest[..open]);
        let close = rest[open..].find('>').expect("unclosed tag") + open;
        let tag = &rest[open + 1..close];
        rest = &rest[close + 1..];
        if let Some(name) = tag.strip_prefix('/') {
            assert_eq!(stack.pop().as_deref(), Some(name), "mismatched </{name}>");
            continue;
        }
        let empty = tag.ends_with('/');
        let body = tag.trim_end_matches('/');
        let name_end = body.find(' ').unwrap_or(body.len());
        let name = &body[..name_end];
        assert!(!name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'), "name {name:?}");
        let mut attrs = &body[name_end..];
        while !attrs.trim().is_empty() {
            attrs = attrs.trim_start();
            let eq = attrs.find("=\"").expect("attribute without =\"");
            assert!(attrs[..eq].chars().all(|c| c.is_ascii_alphanumeric() || c == '_'), "attr {:?}", &attrs[..eq]);
            let vend = attrs[eq + 2..].find('"').expect("unterminated value") + eq + 2;
            let value = &attrs[eq + 2..vend];
            assert!(!value.contains('<'), "raw < in {value:?}");
            for (i, _) in value.match_indices('&') {
                let ent = &value[i..];
                assert!(
                    ["&amp;", "&lt;", "&gt;", "&quot;", "&apos;"].iter().any(|e| ent.starts_with(e)),
                    "entity in {value:?}"
                );
            }
            attrs = &attrs[vend + 1..];
        }
        seen.push(name.to_string());
        if !empty {
            stack.push(name.to_string());
        }
    }
    assert!(rest.trim().is_empty() && stack.is_empty(), "unclosed {stack:?}");
    assert_eq!(seen.first().map(String::as_str), Some("system"));
    seen
}

#[test]
fn xml_dump_is_well_formed_and_matches_the_committed_file() {
    let t = with_host(read("dgx8"));
    let f = t.fuse(PathType::Pxb, None).unwrap();
    let xml = dump::to_xml(&t, Some(&f));
    let names = check_xml(&xml);
    assert_eq!(names.iter().filter(|n| *n == "gpu").count(), 8);
    assert_eq!(names.iter().filter(|n| *n == "net").count(), t.nics.len());
    assert_eq!(names.iter().filter(|n| *n == "vnic").count(), 3);
    assert!(xml.contains("host=\"node-a&lt;1&gt;\""));
    let expected = fixture("dgx8.expected.xml");
    if std::env::var_os("OCCL_TOPO_BLESS").is_some() {
        std::fs::write(&expected, &xml).unwrap();
    }
    assert_eq!(
        xml,
        std::fs::read_to_string(&expected).unwrap(),
        "rerun with OCCL_TOPO_BLESS=1 after an intended change"
    );
    check_xml(&dump::to_xml(&with_host(read("dualport")), None));
}

#[test]
fn dump_file_format_follows_the_extension() {
    let dir = std::env::temp_dir().join(format!("occl-topo-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let t = read("dualport");
    for (name, first) in [("t.xml", '<'), ("t.XML", '<'), ("t.json", '{'), ("t", '{')] {
        dump::write(&dir.join(name), &t, None).unwrap();
        let text = std::fs::read_to_string(dir.join(name)).unwrap();
        assert_eq!(text.chars().next(), Some(first), "{name}");
    }
    let e = dump::write(&dir.join("missing/t.json"), &t, None).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::SystemError);
    assert!(e.to_string().contains("OCCL_TOPO_DUMP_FILE"));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// OCCL_TOPO_DUMP_FILE often names a file in a shared directory (/tmp/topo.xml): another user
/// who plants a symlink there must not get the dump written through it (the first rank of a
/// host may run as root). The dump replaces the link and is readable by its owner only.
#[test]
fn the_topology_dump_follows_no_planted_symlink() {
    use std::os::unix::fs::{symlink, PermissionsExt};
    let dir = std::env::temp_dir().join(format!("occl-topo-link-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let victim = dir.join("victim");
    std::fs::write(&victim, "root-owned").unwrap();
    let path = dir.join("topo.xml");
    symlink(&victim, &path).unwrap();
    dump::write(&path, &read("dualport"), None).unwrap();
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "root-owned", "the dump went through the symlink");
    let meta = std::fs::symlink_metadata(&path).unwrap();
    assert!(meta.file_type().is_file(), "the dump is a file of its own");
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    check_xml(&std::fs::read_to_string(&path).unwrap());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The dump at init: ranks 0 and 2 claim host "a", 1 and 3 host "b"; each rank is given its own
/// file name, so the files that exist show who wrote: only the first rank of each host.
#[test]
fn init_dumps_once_per_host() {
    let dir = std::env::temp_dir().join(format!("occl-topo-init-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let id = UniqueId::new().unwrap();
    let handles: Vec<_> = (0..4)
        .map(|r| {
            let id = id.clone();
            let config = Config {
                host_id: Some(if r % 2 == 0 { "a" } else { "b" }.into()),
                topo_dump_file: Some(dir.join(if r == 0 { "r0.xml".to_string() } else { format!("r{r}.json") })),
                ..Config::default()
            };
            std::thread::spawn(move || Comm::init_rank(4, &id, r, config))
        })
        .collect();
    let comms: Vec<Comm> = handles.into_iter().map(|h| h.join().unwrap().unwrap()).collect();
    let exists = |n: &str| dir.join(n).exists();
    assert!(exists("r0.xml") && exists("r1.json"), "the first rank of each host writes");
    assert!(!exists("r2.json") && !exists("r3.json"), "later ranks of a host do not");
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("r1.json")).unwrap()).unwrap();
    assert!(v["host"]["hash"].as_str().unwrap().starts_with("0x"));
    assert!(!v["affinity"].as_str().unwrap().is_empty(), "this process's affinity is in the dump");
    check_xml(&std::fs::read_to_string(dir.join("r0.xml")).unwrap());
    for c in comms {
        c.destroy().unwrap();
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn config_reads_the_topology_variables() {
    // The only test here that touches the environment.
    let vars = [
        "OCCL_NET_MERGE_LEVEL",
        "NCCL_NET_MERGE_LEVEL",
        "OCCL_NET_FORCE_MERGE",
        "NCCL_NET_FORCE_MERGE",
        "NCCL_TOPO_DUMP_FILE",
    ];
    let set = |k: &str, v: &str| std::env::set_var(k, v);
    let clear = || vars.iter().for_each(|k| std::env::remove_var(k));
    clear();
    let c = Config::from_env().unwrap();
    assert_eq!(
        (c.net_merge_level, c.net_force_merge.is_none(), c.topo_dump_file.is_none()),
        (PathType::Port, true, true)
    );
    set("NCCL_NET_MERGE_LEVEL", "pxb");
    set("NCCL_NET_FORCE_MERGE", "mlx5_0,mlx5_1;mlx5_2,mlx5_3");
    set("NCCL_TOPO_DUMP_FILE", "/tmp/t.xml");
    let c = Config::from_env().unwrap();
    assert_eq!(c.net_merge_level, PathType::Pxb);
    assert_eq!(c.net_force_merge.as_ref().map(|f| f.groups().len()), Some(2));
    assert_eq!(c.topo_dump_file.as_deref(), Some(Path::new("/tmp/t.xml")));
    set("OCCL_NET_MERGE_LEVEL", "LOC");
    assert_eq!(Config::from_env().unwrap().net_merge_level, PathType::Loc, "OCCL_ wins over NCCL_");
    set("OCCL_NET_MERGE_LEVEL", "PATH_PORT");
    let e = Config::from_env().unwrap_err();
    assert!(e.to_string().contains("OCCL_NET_MERGE_LEVEL"), "{e}");
    set("OCCL_NET_MERGE_LEVEL", "SYS");
    set("OCCL_NET_FORCE_MERGE", "mlx5_0,,mlx5_1");
    let e = Config::from_env().unwrap_err();
    assert!(e.to_string().contains("OCCL_NET_FORCE_MERGE"), "{e}");
    clear();
}
