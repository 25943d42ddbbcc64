//! `OCCL_TOPO_DUMP_FILE`: the topology (and the NIC fusion) as XML when the file name ends in
//! `.xml`, as JSON otherwise. Absent fields are left out of the XML and `null` in the JSON.
//! Written by hand: the core crate keeps its dependencies small.

use super::{Fusion, PciDev, Topology};
use crate::error::{Error, Result};
use std::fmt::Write as _;
use std::path::Path;

fn json_str(s: &str) -> String {
    let mut o = String::with_capacity(s.len() + 2);
    o.push('"');
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            '\n' => o.push_str("\\n"),
            '\r' => o.push_str("\\r"),
            '\t' => o.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(o, "\\u{:04x}", c as u32);
            }
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

/// A JSON array of pre-rendered items, one per line.
fn json_lines(items: &[String]) -> String {
    if items.is_empty() {
        "[]".to_string()
    } else {
        format!("[\n{}\n  ]", items.join(",\n"))
    }
}

fn json_opt<T>(v: Option<T>, f: impl FnOnce(T) -> String) -> String {
    v.map_or_else(|| "null".to_string(), f)
}

fn xml_escape(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&apos;"),
            c if (c as u32) < 0x20 => {
                let _ = write!(o, "&#{};", c as u32);
            }
            c => o.push(c),
        }
    }
    o
}

/// ` key="value"` for each present attribute.
fn attrs(list: &[(&str, Option<String>)]) -> String {
    let mut o = String::new();
    for (k, v) in list {
        if let Some(v) = v {
            let _ = write!(o, " {k}=\"{}\"", xml_escape(v));
        }
    }
    o
}

fn pci_json(p: &PciDev) -> String {
    format!(
        "\"busid\": {}, \"pci_path\": {}, \"class\": {}, \"vendor\": {}, \"device\": {}, \"numa_node\": {}, \"local_cpus\": {}",
        json_str(&p.bdf),
        json_str(&p.path_string()),
        json_opt(p.class, |c| json_str(&format!("0x{c:06x}"))),
        json_opt(p.vendor, |v| json_str(&format!("0x{v:04x}"))),
        json_opt(p.device, |v| json_str(&format!("0x{v:04x}"))),
        json_opt(p.numa_node, |n| n.to_string()),
        json_opt(p.local_cpus.as_ref(), |c| json_str(&c.to_string())),
    )
}

fn pci_attrs(p: &PciDev) -> Vec<(&'static str, Option<String>)> {
    vec![
        ("busid", Some(p.bdf.clone())),
        ("path", Some(p.path_string())),
        ("class", p.class.map(|c| format!("0x{c:06x}"))),
        ("vendor", p.vendor.map(|v| format!("0x{v:04x}"))),
        ("device", p.device.map(|v| format!("0x{v:04x}"))),
        ("numaid", p.numa_node.map(|n| n.to_string())),
        ("local_cpulist", p.local_cpus.as_ref().map(|c| c.to_string())),
    ]
}

pub fn to_json(t: &Topology, fusion: Option<&Fusion>) -> String {
    let mut o = String::from("{\n  \"version\": 1,\n");
    let host = json_opt(t.host.as_ref(), |h| {
        format!("{{\"name\": {}, \"hash\": {}}}", json_str(&h.name), json_str(&format!("0x{:016x}", h.hash)))
    });
    let _ = writeln!(o, "  \"host\": {host},");
    let numa: Vec<String> = t
        .numa
        .iter()
        .map(|n| format!("    {{\"id\": {}, \"cpus\": {}}}", n.id, json_str(&n.cpus.to_string())))
        .collect();
    let _ = writeln!(o, "  \"numa\": {},", json_lines(&numa));
    let _ = writeln!(o, "  \"affinity\": {},", json_opt(t.affinity.as_ref(), |a| json_str(&a.to_string())));
    let gpus: Vec<String> =
        t.gpus.iter().map(|g| format!("    {{\"index\": {}, {}}}", g.index, pci_json(&g.pci))).collect();
    let _ = writeln!(o, "  \"gpus\": {},", json_lines(&gpus));
    let nics: Vec<String> = t
        .nics
        .iter()
        .map(|n| {
            format!(
                "    {{\"kind\": {}, \"name\": {}, \"port\": {}, {}, \"state\": {}, \"rate_gbps\": {}, \"link_layer\": {}}}",
                json_str(n.kind.name()),
                json_str(&n.name),
                json_opt(n.port, |p| p.to_string()),
                pci_json(&n.pci),
                json_opt(n.state.as_deref(), json_str),
                json_opt(n.rate_gbps, |r| r.to_string()),
                json_opt(n.link_layer.as_deref(), json_str),
            )
        })
        .collect();
    let _ = writeln!(o, "  \"nics\": {},", json_lines(&nics));
    let fusion = json_opt(fusion, |f| {
        let v: Vec<String> = f
            .vnics
            .iter()
            .map(|v| {
                let m: Vec<String> = v.members.iter().map(|m| json_str(m)).collect();
                format!(
                    "{{\"name\": {}, \"members\": [{}], \"forced\": {}}}",
                    json_str(&v.name),
                    m.join(", "),
                    v.forced
                )
            })
            .collect();
        format!("{{\"level\": {}, \"vnics\": [{}]}}", json_str(f.level.name()), v.join(", "))
    });
    let _ = writeln!(o, "  \"fusion\": {fusion}\n}}");
    o
}

pub fn to_xml(t: &Topology, fusion: Option<&Fusion>) -> String {
    let mut o = String::from("<?xml version=\"1.0\"?>\n");
    let host = t.host.as_ref();
    let _ = writeln!(
        o,
        "<system{}>",
        attrs(&[
            ("version", Some("1".into())),
            ("host", host.map(|h| h.name.clone())),
            ("hosthash", host.map(|h| format!("0x{:016x}", h.hash))),
        ])
    );
    for n in &t.numa {
        let _ =
            writeln!(o, "  <numa{}/>", attrs(&[("id", Some(n.id.to_string())), ("cpulist", Some(n.cpus.to_string()))]));
    }
    if let Some(a) = &t.affinity {
        let _ = writeln!(o, "  <affinity{}/>", attrs(&[("cpulist", Some(a.to_string()))]));
    }
    for g in &t.gpus {
        let mut a = vec![("dev", Some(g.index.to_string()))];
        a.extend(pci_attrs(&g.pci));
        let _ = writeln!(o, "  <gpu{}/>", attrs(&a));
    }
    for n in &t.nics {
        let mut a = vec![
            ("kind", Some(n.kind.name().to_string())),
            ("name", Some(n.name.clone())),
            ("port", n.port.map(|p| p.to_string())),
        ];
        a.extend(pci_attrs(&n.pci));
        a.extend([
            ("state", n.state.clone()),
            ("rate_gbps", n.rate_gbps.map(|r| r.to_string())),
            ("link_layer", n.link_layer.clone()),
        ]);
        let _ = writeln!(o, "  <net{}/>", attrs(&a));
    }
    if let Some(f) = fusion {
        let _ = writeln!(o, "  <fusion{}>", attrs(&[("level", Some(f.level.name().into()))]));
        for v in &f.vnics {
            let _ = writeln!(
                o,
                "    <vnic{}/>",
                attrs(&[
                    ("name", Some(v.name.clone())),
                    ("members", Some(v.members.join(","))),
                    ("forced", Some(u8::from(v.forced).to_string())),
                ])
            );
        }
        let _ = writeln!(o, "  </fusion>");
    }
    o.push_str("</system>\n");
    o
}

/// Writes the dump to `path`: XML for a `.xml` name, JSON otherwise. The path is often in a
/// shared directory, so the file is created new and owner-only and renamed into place
/// (`occl_events::files`): a symlink planted at the name is replaced, never followed.
pub fn write(path: &Path, t: &Topology, fusion: Option<&Fusion>) -> Result<()> {
    let xml = path.extension().is_some_and(|e| e.eq_ignore_ascii_case("xml"));
    let text = if xml { to_xml(t, fusion) } else { to_json(t, fusion) };
    occl_events::files::write_atomic(path, |f| std::io::Write::write_all(f, text.as_bytes()))
        .map_err(|e| Error::sys("write OCCL_TOPO_DUMP_FILE", e))?;
    tracing::info!("occl: topo: wrote the topology to {}", path.display());
    Ok(())
}
