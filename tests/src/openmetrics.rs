//! An OpenMetrics 1.0 text checker, independent of the writers it checks (occl's snapshot writer,
//! RAS's conversion of a node's scrape): the ABNF's line shapes and the specification's MUSTs a
//! scraper relies on. Every line is metadata (`# TYPE`, `# UNIT`, `# HELP`) or a sample; the text
//! ends with `# EOF` and nothing after it; a family's metadata comes once each, before its samples,
//! and its samples are together; a sample's name is its family's name plus a suffix its type
//! allows (`_total` for a counter, `_bucket`/`_sum`/`_count` for a histogram); a unit is the family
//! name's suffix; label values and help text use only the three escapes; histogram buckets are
//! cumulative over increasing `le` and end with `+Inf`, equal to `_count`.

use std::collections::{BTreeMap, BTreeSet};

const TYPES: [&str; 8] = ["counter", "gauge", "histogram", "gaugehistogram", "stateset", "info", "summary", "unknown"];

fn is_name(s: &str) -> bool {
    let mut c = s.chars();
    c.next().is_some_and(|f| f.is_ascii_alphabetic() || f == '_' || f == ':')
        && c.all(|x| x.is_ascii_alphanumeric() || x == '_' || x == ':')
}

/// An escaped string (label value or help): no raw `"` or newline, `\` only before `\`, `"`, `n`.
fn escaped_ok(s: &str) -> bool {
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'\\' if matches!(b.get(i + 1), Some(b'\\' | b'"' | b'n')) => i += 2,
            b'\\' | b'"' | b'\n' => return false,
            _ => i += 1,
        }
    }
    true
}

fn number(s: &str) -> Option<f64> {
    match s {
        "+Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        "NaN" => Some(f64::NAN),
        _ if s.contains(['i', 'I', 'n', 'N']) => None,
        _ => s.parse().ok(),
    }
}

/// A sample line read: its name, label pairs (values as written) and value.
type Parsed<'a> = (&'a str, Vec<(&'a str, &'a str)>, f64);

/// `name{labels} value [timestamp]`.
fn sample(line: &str) -> Result<Parsed<'_>, String> {
    let end = line.find(['{', ' ']).ok_or("no value")?;
    let name = &line[..end];
    if !is_name(name) {
        return Err(format!("bad metric name {name:?}"));
    }
    let mut rest = &line[end..];
    let mut labels = Vec::new();
    if let Some(r) = rest.strip_prefix('{') {
        rest = r;
        while !rest.starts_with('}') {
            let eq = rest.find('=').ok_or("label without =")?;
            let key = &rest[..eq];
            let r = rest[eq + 1..].strip_prefix('"').ok_or("label value not quoted")?;
            let b = r.as_bytes();
            let mut i = 0;
            while i < b.len() && b[i] != b'"' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            let v = r.get(..i).ok_or("unterminated label value")?;
            if !is_name(key) || key.contains(':') || !escaped_ok(v) || labels.iter().any(|(k, _)| *k == key) {
                return Err(format!("bad label {key}={v:?}"));
            }
            labels.push((key, v));
            rest = r.get(i + 1..).ok_or("unterminated label value")?;
            rest = rest.strip_prefix(',').unwrap_or(rest);
        }
        rest = &rest[1..];
    }
    let mut f = rest.strip_prefix(' ').ok_or("no space before the value")?.split(' ');
    let v = f.next().and_then(number).ok_or("bad value")?;
    if let Some(ts) = f.next() {
        number(ts).filter(|t| t.is_finite()).ok_or("bad timestamp")?;
    }
    if f.next().is_some() {
        return Err("more than a value and a timestamp".into());
    }
    Ok((name, labels, v))
}

fn suffixes(ty: &str) -> &'static [&'static str] {
    match ty {
        "counter" => &["_total", "_created"],
        "histogram" => &["_bucket", "_sum", "_count", "_created"],
        "gaugehistogram" => &["_bucket", "_gsum", "_gcount"],
        "summary" => &["", "_sum", "_count", "_created"],
        "info" => &["_info"],
        _ => &[""],
    }
}

/// Checks `text`; the first rule it breaks, with the line.
pub fn check(text: &str) -> Result<(), String> {
    let body = text.strip_suffix("# EOF\n").or_else(|| text.strip_suffix("# EOF")).ok_or("no # EOF at the end")?;
    let mut types: BTreeMap<String, String> = BTreeMap::new();
    let mut meta: BTreeSet<(String, &str)> = BTreeSet::new();
    let mut done: BTreeSet<String> = BTreeSet::new();
    let mut current = String::new();
    let mut sampled = false;
    // Per histogram series (labels without le): the buckets' (le, count), and the _count.
    let mut buckets: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    let mut counts: BTreeMap<String, f64> = BTreeMap::new();
    let lines = match body.strip_suffix('\n') {
        Some(b) => b.split('\n').collect(),
        None if body.is_empty() => Vec::new(),
        None => return Err("# EOF not on a line of its own".into()),
    };
    for line in lines {
        let err = |m: &str| format!("{m}: {line:?}");
        if line.is_empty() {
            return Err(err("empty line"));
        }
        if let Some(m) = line.strip_prefix("# ") {
            let mut p = m.splitn(3, ' ');
            let (kind, name, arg) = (p.next().unwrap_or(""), p.next().unwrap_or(""), p.next());
            if !is_name(name) || !matches!(kind, "TYPE" | "UNIT" | "HELP") {
                return Err(err("not metadata"));
            }
            if name != current {
                if !current.is_empty() {
                    done.insert(std::mem::take(&mut current));
                }
                if done.contains(name) {
                    return Err(err("family appears twice"));
                }
                current = name.to_string();
                sampled = false;
            }
            if sampled {
                return Err(err("metadata after the family's samples"));
            }
            if !meta.insert((name.to_string(), kind)) {
                return Err(err("metadata given twice"));
            }
            let arg = arg.unwrap_or("");
            match kind {
                "TYPE" if !TYPES.contains(&arg) => return Err(err("unknown type")),
                "TYPE" => {
                    types.insert(name.to_string(), arg.to_string());
                }
                "UNIT" if !arg.is_empty() && !name.ends_with(&format!("_{arg}")) => {
                    return Err(err("the family name does not end with its unit"))
                }
                "HELP" if !escaped_ok(arg) => return Err(err("bad escape in help")),
                _ => {}
            }
            continue;
        }
        let (name, labels, v) = sample(line).map_err(|m| err(&m))?;
        let ty = types.get(&current).map_or("unknown", String::as_str);
        let suffix = name.strip_prefix(current.as_str()).filter(|s| suffixes(ty).contains(s));
        let Some(suffix) = suffix else { return Err(err(&format!("not a sample of {current} ({ty})"))) };
        sampled = true;
        if ty == "counter" && (v < 0.0 || v.is_nan()) {
            return Err(err("a counter below 0"));
        }
        if ty == "histogram" {
            let key: Vec<String> = labels.iter().filter(|(k, _)| *k != "le").map(|(k, v)| format!("{k}={v}")).collect();
            let key = format!("{name}|{}", key.join(","));
            let key = key.replacen("_bucket|", "|", 1).replacen("_count|", "|", 1);
            match suffix {
                "_bucket" => {
                    let le = labels.iter().find(|(k, _)| *k == "le").and_then(|(_, v)| number(v));
                    let le = le.ok_or_else(|| err("a bucket without le"))?;
                    buckets.entry(key).or_default().push((le, v));
                }
                "_count" => {
                    counts.insert(key, v);
                }
                _ => {}
            }
        }
    }
    for (k, b) in &buckets {
        if b.windows(2).any(|w| w[0].0 >= w[1].0 || w[0].1 > w[1].1) {
            return Err(format!("{k}: buckets not increasing and cumulative: {b:?}"));
        }
        match b.last() {
            Some((le, n)) if le.is_infinite() && counts.get(k).is_none_or(|c| c == n) => {}
            _ => return Err(format!("{k}: no +Inf bucket, or not the _count")),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::check;

    #[test]
    fn the_rules_hold_and_breaking_each_is_found() {
        let good = "# TYPE a counter\n# UNIT a_bytes bytes\n# TYPE a_bytes counter\n# HELP a_bytes x \\\"y\\\"\n\
                    a_bytes_total{l=\"v\"} 1\n# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_bucket{le=\"+Inf\"} 2\n\
                    h_count 2\nh_sum 3\n# EOF\n";
        // `a` declared and left without samples, then `a_bytes`: fine.
        assert_eq!(check(good), Ok(()));
        let bad = [
            ("no eof", good.replace("# EOF\n", "")),
            ("_total", good.replace("a_bytes_total", "a_bytes")),
            ("unit", good.replace("# UNIT a_bytes bytes", "# UNIT a_bytes seconds")),
            ("help", good.replace("\\\"y\\\"", "\"y\"")),
            ("empty line", good.replace("h_count", "\nh_count")),
            ("+Inf", good.replace("h_bucket{le=\"+Inf\"} 2\n", "")),
            ("count", good.replace("h_count 2", "h_count 3")),
            ("cumulative", good.replace("h_bucket{le=\"1\"} 1", "h_bucket{le=\"1\"} 5")),
            ("twice", format!("{}# TYPE a counter\n# EOF\n", good.trim_end_matches("# EOF\n"))),
            ("label", good.replace("l=\"v\"", "l=\"v\\q\"")),
        ];
        for (what, t) in bad {
            assert!(check(&t).is_err(), "{what}: {t}");
        }
    }
}
