//! Merging Prometheus text expositions (format 0.0.4) from several processes into one scrape: one `# HELP` and one
//! `# TYPE` per family, every sample of a family together, and each process's samples labelled with its `pid` so
//! that series of different processes never collide, with the node's `host` name, and with the `job` (several jobs'
//! processes may share a node and its port). The texts come from other processes over the mesh, so every line is
//! checked: a sample line that does not parse, belongs to no declared family, contradicts a family's type
//! or repeats a series is dropped and counted, never passed on to break the scrape.

use std::collections::{HashMap, HashSet};

/// One process's text, and the job, pid and host to label its samples with (`None`: leave them as they are; a
/// sample that already has the label keeps its own).
#[derive(Clone, Copy, Debug, Default)]
pub struct Part<'a> {
    pub text: &'a str,
    pub job: Option<&'a str>,
    pub pid: Option<u32>,
    pub host: Option<&'a str>,
}

/// A label value as the text format writes it: `\\`, `\"` and `\n` escaped.
pub fn escape_label(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// The merged exposition, and how many sample lines were dropped.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Merged {
    pub text: String,
    pub dropped: usize,
}

const TYPES: [&str; 5] = ["counter", "gauge", "histogram", "summary", "untyped"];

fn is_name(s: &str) -> bool {
    let mut c = s.chars();
    c.next().is_some_and(|f| f.is_ascii_alphabetic() || f == '_' || f == ':')
        && c.all(|x| x.is_ascii_alphanumeric() || x == '_' || x == ':')
}

fn is_label_name(s: &str) -> bool {
    let mut c = s.chars();
    c.next().is_some_and(|f| f.is_ascii_alphabetic() || f == '_') && c.all(|x| x.is_ascii_alphanumeric() || x == '_')
}

/// A HELP text whose only escapes are `\\` and `\n`.
fn is_help(s: &str) -> bool {
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' {
            if !matches!(b.get(i + 1), Some(b'\\' | b'n')) {
                return false;
            }
            i += 1;
        }
        i += 1;
    }
    true
}

fn is_value(s: &str) -> bool {
    matches!(s, "NaN" | "+Inf" | "-Inf") || (s.parse::<f64>().is_ok() && !s.contains(['i', 'I', 'n', 'N']))
}

/// A parsed sample line: its metric name, label pairs (value as written, escapes kept) and the rest (value and
/// optional timestamp).
pub(crate) struct Sample<'a> {
    pub name: &'a str,
    pub labels: Vec<(&'a str, &'a str)>,
    pub rest: &'a str,
}

/// Parses `name{l="v",...} value [timestamp]`, or `None`.
pub(crate) fn sample(line: &str) -> Option<Sample<'_>> {
    let end = line.find(['{', ' ']).unwrap_or(line.len());
    let name = &line[..end];
    if !is_name(name) {
        return None;
    }
    let mut rest = &line[end..];
    let mut labels = Vec::new();
    if let Some(r) = rest.strip_prefix('{') {
        rest = r;
        loop {
            if let Some(r) = rest.strip_prefix('}') {
                rest = r;
                break;
            }
            let eq = rest.find('=')?;
            let key = &rest[..eq];
            if !is_label_name(key) || key.starts_with("__") || labels.iter().any(|(k, _)| *k == key) {
                return None;
            }
            let r = rest[eq + 1..].strip_prefix('"')?;
            // The value runs to the first quote that is not escaped; only \\, \" and \n are escapes.
            let b = r.as_bytes();
            let mut i = 0;
            while i < b.len() && b[i] != b'"' {
                if b[i] == b'\\' {
                    if !matches!(b.get(i + 1), Some(b'\\' | b'"' | b'n')) {
                        return None;
                    }
                    i += 1;
                }
                if b[i] == b'\n' {
                    return None;
                }
                i += 1;
            }
            if i >= b.len() {
                return None;
            }
            labels.push((key, &r[..i]));
            rest = &r[i + 1..];
            if let Some(r) = rest.strip_prefix(',') {
                rest = r;
            } else if !rest.starts_with('}') {
                return None;
            }
        }
    }
    let rest = rest.strip_prefix(' ')?.trim_start_matches(' ');
    let mut fields = rest.split(' ');
    let value = fields.next()?;
    let ts = fields.next();
    if !is_value(value) || fields.next().is_some() || ts.is_some_and(|t| t.parse::<i64>().is_err()) {
        return None;
    }
    Some(Sample { name, labels, rest })
}

/// Whether a sample named `name` belongs to family `fam` of type `ty`.
fn belongs(name: &str, fam: &str, ty: &str) -> bool {
    if name == fam {
        return ty != "histogram";
    }
    let Some(suffix) = name.strip_prefix(fam) else { return false };
    match ty {
        "histogram" => matches!(suffix, "_bucket" | "_sum" | "_count"),
        "summary" => matches!(suffix, "_sum" | "_count"),
        _ => false,
    }
}

#[derive(Default)]
struct Family {
    help: Option<String>,
    ty: Option<String>,
    samples: String,
}

/// Merges `parts` in order: families in order of first appearance, the first HELP and TYPE given for each.
pub fn merge(parts: &[Part<'_>]) -> Merged {
    let mut order: Vec<String> = Vec::new();
    let mut fams: HashMap<String, Family> = HashMap::new();
    let mut series: HashSet<String> = HashSet::new();
    let mut dropped = 0usize;
    for part in parts {
        // The family the part's samples go to: the one its last HELP or TYPE named.
        let mut current: Option<String> = None;
        // Families whose TYPE in this part disagrees with the merged one: their samples are dropped.
        let mut conflicting: HashSet<String> = HashSet::new();
        for line in part.text.lines() {
            let line = line.trim_end_matches('\r');
            if line.trim().is_empty() {
                continue;
            }
            if let Some(c) = line.strip_prefix('#') {
                let c = c.trim_start();
                let (kind, rest) = c.split_once(' ').unwrap_or((c, ""));
                if kind != "HELP" && kind != "TYPE" {
                    continue; // a plain comment
                }
                let (name, text) = rest.split_once(' ').unwrap_or((rest, ""));
                if !is_name(name) || kind == "TYPE" && !TYPES.contains(&text) {
                    current = None;
                    continue;
                }
                let f = fams.entry(name.to_string()).or_insert_with(|| {
                    order.push(name.to_string());
                    Family::default()
                });
                if kind == "HELP" {
                    if f.help.is_none() && is_help(text) {
                        f.help = Some(text.to_string());
                    }
                } else {
                    match &f.ty {
                        Some(t) if t != text => {
                            conflicting.insert(name.to_string());
                        }
                        Some(_) => {}
                        None => {
                            // Samples merged before this TYPE must still fit it.
                            if f.samples.is_empty() || text == "untyped" || text == "counter" || text == "gauge" {
                                f.ty = Some(text.to_string());
                            } else {
                                conflicting.insert(name.to_string());
                            }
                        }
                    }
                }
                current = Some(name.to_string());
                continue;
            }
            let ok = current.as_ref().and_then(|fam| {
                let s = sample(line)?;
                let f = fams.get_mut(fam)?;
                let ty = f.ty.as_deref().unwrap_or("untyped");
                if conflicting.contains(fam) || !belongs(s.name, fam, ty) {
                    return None;
                }
                let mut out = String::with_capacity(line.len() + 16);
                out.push_str(s.name);
                let has = |name: &str| s.labels.iter().any(|(k, _)| *k == name);
                let mut added: Vec<(&str, String)> = Vec::with_capacity(3);
                if let Some(j) = part.job.filter(|_| !has("job")) {
                    added.push(("job", escape_label(j)));
                }
                if let Some(p) = part.pid.filter(|_| !has("pid")) {
                    added.push(("pid", p.to_string()));
                }
                if let Some(h) = part.host.filter(|_| !has("host")) {
                    added.push(("host", escape_label(h)));
                }
                let all: Vec<(&str, &str)> =
                    added.iter().map(|(k, v)| (*k, v.as_str())).chain(s.labels.iter().copied()).collect();
                if !all.is_empty() {
                    out.push('{');
                    for (i, (k, v)) in all.iter().enumerate() {
                        if i > 0 {
                            out.push(',');
                        }
                        out.push_str(&format!("{k}=\"{v}\""));
                    }
                    out.push('}');
                }
                if !series.insert(out.clone()) {
                    return None;
                }
                out.push(' ');
                out.push_str(s.rest);
                out.push('\n');
                f.samples.push_str(&out);
                Some(())
            });
            if ok.is_none() {
                dropped += 1;
            }
        }
    }
    let mut text = String::new();
    for name in &order {
        let Some(f) = fams.get(name) else { continue };
        if f.samples.is_empty() {
            continue;
        }
        if let Some(h) = &f.help {
            text.push_str(&format!("# HELP {name} {h}\n"));
        }
        // Always a TYPE: a family only a HELP declared (or whose HELP was dropped) stays a family when read again.
        text.push_str(&format!("# TYPE {name} {}\n", f.ty.as_deref().unwrap_or("untyped")));
        text.push_str(&f.samples);
    }
    Merged { text, dropped }
}

/// The body of a cargo-fuzz target: `data` split at 0xFF bytes into up to 8 processes' texts (odd ones labelled with
/// a pid and a host). Checks that the merge drops nothing of its own output when merged again and changes nothing (so
/// what it produces is always well-formed by its own strict reading), and that it never grows beyond a pid and a host
/// label per line.
#[cfg(any(test, feature = "test-support"))]
pub fn fuzz_exposition_bytes(data: &[u8]) {
    let texts: Vec<String> = data.split(|&b| b == 0xff).take(8).map(|c| String::from_utf8_lossy(c).into()).collect();
    let parts: Vec<Part<'_>> = texts
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let odd = i % 2 == 1;
            Part {
                text: t,
                pid: odd.then_some(4_000_000_000 + i as u32),
                host: odd.then_some("10.0.0.1\"\\"),
                job: None,
            }
        })
        .collect();
    let m = merge(&parts);
    let again = merge(&[Part { text: &m.text, pid: None, host: None, job: None }]);
    assert_eq!(again.dropped, 0, "the merge's own output re-reads without loss:\n{}", m.text);
    assert_eq!(again.text, m.text, "merging is idempotent");
    let lines: usize = texts.iter().map(|t| t.lines().count()).sum();
    let input: usize = texts.iter().map(String::len).sum();
    assert!(m.text.len() <= input + lines * 48, "output bounded by input plus labels");
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "\
# HELP occl_x_total Things.
# TYPE occl_x_total counter
occl_x_total{comm=\"ab\",rank=\"0\"} 3
# HELP occl_d_seconds Durations.
# TYPE occl_d_seconds histogram
occl_d_seconds_bucket{rank=\"0\",le=\"1\"} 1
occl_d_seconds_bucket{rank=\"0\",le=\"+Inf\"} 2
occl_d_seconds_sum{rank=\"0\"} 1.5
occl_d_seconds_count{rank=\"0\"} 2
";

    #[test]
    fn families_merge_with_one_header_and_pid_labels() {
        let b = A.replace("rank=\\\"0\\\"", "rank=\\\"1\\\"").replace("rank=\"0\"", "rank=\"1\"");
        let ras = "# HELP occl_ras_peers Peers.\n# TYPE occl_ras_peers gauge\noccl_ras_peers{state=\"alive\"} 2\n";
        let m = merge(&[
            Part { text: ras, pid: None, host: None, job: None },
            Part { text: A, pid: Some(10), host: None, job: None },
            Part { text: &b, pid: Some(11), host: None, job: None },
        ]);
        assert_eq!(m.dropped, 0, "{}", m.text);
        assert_eq!(m.text.matches("# TYPE occl_x_total counter").count(), 1);
        assert_eq!(m.text.matches("# HELP occl_d_seconds").count(), 1);
        assert!(m.text.contains("occl_ras_peers{state=\"alive\"} 2\n"), "no pid where none was asked");
        assert!(m.text.contains("occl_x_total{pid=\"10\",comm=\"ab\",rank=\"0\"} 3\n"));
        assert!(m.text.contains("occl_x_total{pid=\"11\",comm=\"ab\",rank=\"1\"} 3\n"));
        assert!(m.text.contains("occl_d_seconds_bucket{pid=\"11\",rank=\"1\",le=\"+Inf\"} 2\n"));
        // Both processes' counters sit together under their family.
        let x = m.text.find("# TYPE occl_x_total").expect("x");
        let d = m.text.find("# HELP occl_d_seconds").expect("d");
        assert!(m.text[x..d].matches("occl_x_total{").count() == 2, "{}", m.text);
    }

    #[test]
    fn every_series_gets_the_job_first_unless_it_has_one() {
        let own = "# TYPE occl_y gauge\noccl_y{job=\"theirs\",rank=\"2\"} 1\n";
        let m = merge(&[
            Part { text: A, pid: Some(10), host: Some("node7"), job: Some("j1") },
            Part { text: own, pid: None, host: None, job: Some("j\"1") },
        ]);
        assert!(
            m.text.contains("occl_x_total{job=\"j1\",pid=\"10\",host=\"node7\",comm=\"ab\",rank=\"0\"} 3\n"),
            "{}",
            m.text
        );
        assert!(m.text.contains("occl_y{job=\"theirs\",rank=\"2\"} 1\n"), "{}", m.text);
        assert_eq!(m.dropped, 0);
    }

    #[test]
    fn processes_series_get_the_host_after_the_pid_unless_they_have_one() {
        let own = "# TYPE occl_y gauge\noccl_y{host=\"mine\",rank=\"2\"} 1\n";
        let m = merge(&[
            Part { text: A, pid: Some(10), host: Some("10.1.2.3"), job: None },
            Part { text: own, pid: Some(11), host: Some("a\"b\\c"), job: None },
        ]);
        assert_eq!(m.dropped, 0, "{}", m.text);
        assert!(m.text.contains("occl_x_total{pid=\"10\",host=\"10.1.2.3\",comm=\"ab\",rank=\"0\"} 3\n"), "{}", m.text);
        assert!(m.text.contains("occl_d_seconds_sum{pid=\"10\",host=\"10.1.2.3\",rank=\"0\"} 1.5\n"), "{}", m.text);
        assert!(m.text.contains("occl_y{pid=\"11\",host=\"mine\",rank=\"2\"} 1\n"), "{}", m.text);
        // An odd host is escaped, and the result reads back unchanged.
        let m = merge(&[Part { text: A, pid: None, host: Some("a\"b\\c"), job: None }]);
        assert!(m.text.contains("occl_x_total{host=\"a\\\"b\\\\c\",comm=\"ab\",rank=\"0\"} 3\n"), "{}", m.text);
        assert_eq!(merge(&[Part { text: &m.text, pid: None, host: None, job: None }]).text, m.text);
    }

    #[test]
    fn bad_lines_are_dropped_and_counted_never_passed_on() {
        let bad = "\
# TYPE occl_x_total counter
occl_x_total{a=\"1\"} 1
occl_x_total{a=\"1\"} 2
occl_y_total 5
occl_x_total{a=\"unterminated} 1
occl_x_total{a=\"\\q\"} 1
occl_x_total{a=\"2\"} one
occl_x_total{a=\"3\",a=\"4\"} 1
occl_x_total{a=\"5\"} 1 notatime
occl_x_total{a=\"6\"} 7 1700000000000
9bad 1
# TYPE occl_x_total gauge
occl_x_total{a=\"7\"} 1
# TYPE occl_h histogram
occl_h 1
occl_h_count 1
";
        let m = merge(&[Part { text: bad, pid: None, host: None, job: None }]);
        assert_eq!(
            m.text,
            "# TYPE occl_x_total counter\noccl_x_total{a=\"1\"} 1\noccl_x_total{a=\"6\"} 7 1700000000000\n\
             # TYPE occl_h histogram\noccl_h_count 1\n"
        );
        assert_eq!(m.dropped, 10);
        // A family declared with another type by a later process keeps the first type; the later samples go.
        let g = "# TYPE occl_x_total gauge\noccl_x_total{a=\"9\"} 1\n";
        let m = merge(&[
            Part { text: A, pid: Some(1), host: None, job: None },
            Part { text: g, pid: Some(2), host: None, job: None },
        ]);
        assert_eq!(m.dropped, 1);
        assert!(!m.text.contains("a=\"9\""));
    }

    #[test]
    fn the_fuzz_body_holds_on_samples_and_noise() {
        let mut rng = crate::test_rng::TestRng::new(7);
        fuzz_exposition_bytes(A.as_bytes());
        fuzz_exposition_bytes(&[A.as_bytes(), &[0xff], A.as_bytes()].concat());
        // Found by cargo-fuzz: a family declared only by a HELP that is then dropped (bad escape).
        fuzz_exposition_bytes(b"# HELP x_total a \\b\nx_total 2\n");
        let alphabet = b"#{}=\",\\ \n_ab0.eE+-InfNaHELPTYPEcountergaugehistogram\xff";
        for _ in 0..2000 {
            let mut bytes = A.as_bytes().to_vec();
            for _ in 0..rng.usize(40) {
                let i = rng.usize(bytes.len());
                bytes[i] = alphabet[rng.usize(alphabet.len())];
            }
            fuzz_exposition_bytes(&bytes);
        }
    }
}
