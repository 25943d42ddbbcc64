//! The layer tables of `docs/ARCHITECTURE.md` hold: every `crate::…` path in a crate's sources
//! names a module on a lower floor of that crate (so no import runs up, sideways or in a loop),
//! every module is in its crate's table, and every workspace crate a crate depends on sits on a
//! lower crate floor. Inside each module's folder, sibling modules import each other in no loop. Test code (`#[cfg(test)] mod … { }`, `tests.rs`, `*_tests.rs`, `tests/`
//! folders) and comments are not read; binaries (`main.rs`, `bin/`) sit above every module.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace root").to_path_buf()
}

/// `<!-- layers: NAME -->` followed by `| floor | a, b |` rows: NAME → (entry → floor).
fn tables(doc: &str) -> BTreeMap<String, BTreeMap<String, u32>> {
    let mut out: BTreeMap<String, BTreeMap<String, u32>> = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in doc.lines() {
        let t = line.trim();
        if let Some(name) = t.strip_prefix("<!-- layers:").and_then(|r| r.strip_suffix("-->")) {
            current = Some(name.trim().to_string());
            out.entry(name.trim().to_string()).or_default();
            continue;
        }
        let Some(name) = &current else { continue };
        if !t.starts_with('|') {
            if !t.is_empty() {
                current = None;
            }
            continue;
        }
        let cells: Vec<&str> = t.trim_matches('|').split('|').map(str::trim).collect();
        let Ok(floor) = cells[0].parse::<u32>() else { continue };
        let table = out.get_mut(name).expect("the table was started");
        for m in cells.get(1).copied().unwrap_or("").split(',').map(str::trim).filter(|m| !m.is_empty()) {
            assert!(table.insert(m.to_string(), floor).is_none(), "{m} is listed twice in the {name} table");
        }
    }
    out
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = fs::read_dir(dir).expect("a source folder").flatten().map(|e| e.path()).collect();
    entries.sort();
    for p in entries {
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if p.is_dir() {
            if name != "tests" && name != "bin" {
                rust_files(&p, out);
            }
        } else if name.ends_with(".rs") && name != "tests.rs" && !name.ends_with("_tests.rs") {
            out.push(p);
        }
    }
}

/// The module a file belongs to: its first path component under `src`.
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).ok()?;
    let first = rel.components().next()?.as_os_str().to_str()?;
    let m = first.strip_suffix(".rs").unwrap_or(first);
    (m != "lib" && m != "main").then(|| m.to_string())
}

/// What `pub use m::{A, B as C};` and `pub use m::A;` in the crate root make `crate::A` name.
fn root_reexports(src: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let lib = fs::read_to_string(src.join("lib.rs")).unwrap_or_default();
    for line in lib.lines() {
        let Some(path) = line.trim().strip_prefix("pub use ").and_then(|r| r.strip_suffix(';')) else { continue };
        let Some((module, rest)) = path.split_once("::") else { continue };
        let names = rest.trim_start_matches('{').trim_end_matches('}');
        for n in names.split(',') {
            let last = n.rsplit(" as ").next().unwrap_or(n).rsplit("::").next().unwrap_or(n).trim();
            if !last.is_empty() {
                out.insert(last.to_string(), module.to_string());
            }
        }
    }
    out
}

/// Source without its inline test modules (`#[cfg(test)]` + `mod name {` to the matching brace;
/// braces inside the module's strings are balanced in practice).
fn without_tests(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("#[cfg(test)]") {
        let after = &rest[i + "#[cfg(test)]".len()..];
        let head = after.trim_start();
        let opens = head.starts_with("mod ") && head.split('\n').next().is_some_and(|l| l.trim_end().ends_with('{'));
        if !opens {
            out.push_str(&rest[..i + 1]);
            rest = &rest[i + 1..];
            continue;
        }
        out.push_str(&rest[..i]);
        let body = &after[after.len() - head.len()..];
        let open = body.find('{').expect("the module's brace");
        let mut depth = 0usize;
        let mut end = body.len();
        for (k, ch) in body[open..].char_indices() {
            match ch {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = open + k + 1;
                        break;
                    }
                }
                _ => {}
            }
        }
        rest = &body[end..];
    }
    out.push_str(rest);
    out
}

/// Every `crate::ident` (or `$crate::ident`) outside comments, with its line number; a group
/// (`crate::{a::X, b}`, over several lines too) gives each of its paths' first names.
fn crate_paths(text: &str) -> Vec<(usize, String)> {
    paths_after(text, "crate::", false)
}

/// The first name of every path that `pat` (a prefix ending in `::`) starts, outside comments,
/// with its line number: `pat` must not follow an identifier's character (nor a `:`, with
/// `no_colon`, so that `super::super::x` is not a `super::` path), and a `{…}` group after it
/// gives one name per item.
fn paths_after(text: &str, pat: &str, no_colon: bool) -> Vec<(usize, String)> {
    let code: String = text.lines().map(|l| l.split("//").next().unwrap_or("")).collect::<Vec<_>>().join("\n");
    let b = code.as_bytes();
    let ident =
        |at: usize| -> String { code[at..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect() };
    let line = |at: usize| code[..at].matches('\n').count() + 1;
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(i) = code[from..].find(pat) {
        let at = from + i;
        from = at + pat.len();
        if at > 0 && (b[at - 1].is_ascii_alphanumeric() || b[at - 1] == b'_' || (no_colon && b[at - 1] == b':')) {
            continue;
        }
        if b.get(from) != Some(&b'{') {
            out.push((line(from), ident(from)));
            continue;
        }
        // One name per item of the group: each item starts after the `{` or a `,` at depth 1.
        let mut depth = 0usize;
        for (k, ch) in code[from..].char_indices() {
            match ch {
                '{' => depth += 1,
                '}' => depth -= 1,
                _ => {}
            }
            if depth == 0 {
                break;
            }
            if depth == 1 && (ch == '{' || ch == ',') {
                let start = from + k + 1;
                let skip = code[start..].len() - code[start..].trim_start().len();
                out.push((line(start + skip), ident(start + skip)));
            }
        }
    }
    out.retain(|(_, n)| !n.is_empty() && n != "self" && n != "super");
    out
}

#[test]
fn imports_follow_the_layer_tables() {
    let root = root();
    let doc = fs::read_to_string(root.join("docs/ARCHITECTURE.md")).expect("docs/ARCHITECTURE.md");
    let tables = tables(&doc);
    let mut problems = Vec::new();
    let mut checked = 0;
    for (dir, table) in tables.iter().filter(|(name, _)| name.as_str() != "crates") {
        let src = root.join(dir);
        assert!(src.is_dir(), "docs/ARCHITECTURE.md has a table for {dir}, which does not exist");
        let reexports = root_reexports(&src);
        let mut files = Vec::new();
        rust_files(&src, &mut files);
        let mut seen = BTreeSet::new();
        for f in &files {
            let Some(m) = module_of(&src, f) else { continue };
            seen.insert(m.clone());
            let Some(&floor) = table.get(&m) else {
                problems.push(format!("{dir}: module {m} ({}) is not in its layer table", f.display()));
                continue;
            };
            let text = fs::read_to_string(f).expect("a source file");
            for (line, ident) in crate_paths(&without_tests(&text)) {
                let target = reexports.get(&ident).cloned().unwrap_or(ident);
                if target == m {
                    continue;
                }
                // A name no table lists and no file defines is an item of the crate root.
                let Some(&to) = table.get(&target) else { continue };
                checked += 1;
                if to >= floor {
                    problems.push(format!(
                        "{}:{line}: {m} (floor {floor}) uses {target} (floor {to}); a module may use only lower floors",
                        f.strip_prefix(&root).unwrap_or(f).display()
                    ));
                }
            }
        }
        for m in table.keys().filter(|m| !seen.contains(*m)) {
            problems.push(format!("{dir}: the layer table lists {m}, which has no source file"));
        }
    }
    assert!(checked > 500, "only {checked} imports were checked: is the parsing right?");
    assert!(problems.is_empty(), "{} layering problem(s):\n{}", problems.len(), problems.join("\n"));
}

/// Folders whose sibling modules may still import each other in a loop, and why: none left. An
/// entry whose folder no longer has a loop fails the test, so the list only shrinks.
const LOOPS_LEFT: &[(&str, &str)] = &[];

/// Every `super::…::ident` with exactly `supers` leading `super::` outside comments.
fn super_paths(text: &str, supers: usize) -> Vec<String> {
    paths_after(text, &"super::".repeat(supers), true).into_iter().map(|(_, n)| n).collect()
}

/// The sibling modules of folder `dir` (a module's own folder) and the siblings each uses, by
/// `super::` or by its `crate::` path (`prefix`: the folder's path from the crate root).
fn sibling_uses(dir: &Path, prefix: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut mods: BTreeMap<String, Vec<(PathBuf, usize)>> = BTreeMap::new();
    let mut entries: Vec<_> = fs::read_dir(dir).expect("a source folder").flatten().map(|e| e.path()).collect();
    entries.sort();
    for p in entries {
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("").to_string();
        if p.is_dir() && name != "tests" && name != "bin" {
            let mut files = Vec::new();
            rust_files(&p, &mut files);
            let depth = |f: &PathBuf| {
                let parts = f.strip_prefix(dir).map_or(0, |r| r.components().count());
                parts - usize::from(f.file_name().is_some_and(|n| n == "mod.rs"))
            };
            mods.insert(name, files.iter().map(|f| (f.clone(), depth(f))).collect());
        } else if let Some(m) = name.strip_suffix(".rs") {
            if !["mod", "lib", "main", "tests"].contains(&m) && !m.ends_with("_tests") {
                mods.insert(m.to_string(), vec![(p.clone(), 1)]);
            }
        }
    }
    let names: BTreeSet<String> = mods.keys().cloned().collect();
    let mut uses = BTreeMap::new();
    for (m, files) in &mods {
        let mut to = BTreeSet::new();
        for (f, supers) in files {
            let text = without_tests(&fs::read_to_string(f).expect("a source file"));
            let by_crate = paths_after(&text, &format!("crate::{prefix}"), false).into_iter().map(|(_, n)| n);
            to.extend(super_paths(&text, *supers).into_iter().chain(by_crate).filter(|t| t != m && names.contains(t)));
        }
        uses.insert(m.clone(), to);
    }
    uses
}

/// A loop in `uses`, as the modules along it, if there is one.
fn a_loop(uses: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        m: &str,
        uses: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == m) {
            let mut l = path[i..].to_vec();
            l.push(m.to_string());
            return Some(l);
        }
        if done.contains(m) {
            return None;
        }
        path.push(m.to_string());
        for t in uses.get(m).into_iter().flatten() {
            if let Some(l) = visit(t, uses, path, done) {
                return Some(l);
            }
        }
        path.pop();
        done.insert(m.to_string());
        None
    }
    let mut done = BTreeSet::new();
    uses.keys().find_map(|m| visit(m, uses, &mut Vec::new(), &mut done))
}

/// Inside a module's folder too, sibling modules import only downwards: no loop through
/// `super::` or `crate::` paths (the layer tables order each crate's top-level modules).
#[test]
fn sibling_modules_import_in_no_loop() {
    let root = root();
    let doc = fs::read_to_string(root.join("docs/ARCHITECTURE.md")).expect("docs/ARCHITECTURE.md");
    let mut problems = Vec::new();
    let mut folders = 0;
    for dir in tables(&doc).keys().filter(|name| name.as_str() != "crates") {
        let mut stack: Vec<(PathBuf, String)> = Vec::new();
        let src = root.join(dir);
        for e in fs::read_dir(&src).expect("a source folder").flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if e.path().is_dir() && name != "tests" && name != "bin" {
                stack.push((e.path(), format!("{name}::")));
            }
        }
        while let Some((folder, prefix)) = stack.pop() {
            folders += 1;
            for e in fs::read_dir(&folder).expect("a source folder").flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if e.path().is_dir() && name != "tests" && name != "bin" {
                    stack.push((e.path(), format!("{prefix}{name}::")));
                }
            }
            let rel = folder.strip_prefix(&root).unwrap_or(&folder).display().to_string();
            let left = LOOPS_LEFT.iter().any(|(d, _)| *d == rel);
            match a_loop(&sibling_uses(&folder, &prefix)) {
                Some(l) if !left => problems.push(format!("{rel}: {}", l.join(" -> "))),
                None if left => problems.push(format!("{rel} has no loop left: take it out of LOOPS_LEFT")),
                _ => {}
            }
        }
    }
    assert!(folders > 20, "only {folders} module folders were read: is the walk right?");
    assert!(problems.is_empty(), "sibling modules import each other in a loop:\n{}", problems.join("\n"));
}

#[test]
fn a_sibling_loop_is_caught() {
    let dir = std::env::temp_dir().join(format!("occl-layering-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(dir.join("c")).expect("scratch folder");
    fs::write(dir.join("a.rs"), "use super::{b::B, self}; // super::c in a comment\n").expect("write");
    fs::write(dir.join("b.rs"), "fn f() { super::c::g(); }\n").expect("write");
    fs::write(dir.join("c/mod.rs"), "mod d;\n").expect("write");
    fs::write(dir.join("c/d.rs"), "use crate::x::a::A;\nuse super::super::b;\n").expect("write");
    let uses = sibling_uses(&dir, "x::");
    assert_eq!(uses["a"], BTreeSet::from(["b".to_string()]));
    assert_eq!(uses["c"], BTreeSet::from(["a".to_string(), "b".to_string()]));
    assert_eq!(a_loop(&uses), Some(["a", "b", "c", "a"].map(String::from).to_vec()));
    fs::write(dir.join("b.rs"), "use crate::c::Top; // the crate's own c, not this folder's\n").expect("write");
    fs::write(dir.join("c/d.rs"), "use super::super::b;\n").expect("write");
    let uses = sibling_uses(&dir, "x::");
    assert!(uses["b"].is_empty(), "{uses:?}");
    assert_eq!(a_loop(&uses), None);
    let _ = fs::remove_dir_all(&dir);
}

/// Workspace member folders from the root manifest.
fn members(root: &Path) -> Vec<String> {
    let toml = fs::read_to_string(root.join("Cargo.toml")).expect("the workspace manifest");
    let line = toml.lines().find(|l| l.trim_start().starts_with("members")).expect("a members list");
    line.split('"').skip(1).step_by(2).map(String::from).collect()
}

fn section<'a>(toml: &'a str, name: &str) -> impl Iterator<Item = &'a str> {
    let header = format!("[{name}]");
    toml.lines().skip_while(move |l| l.trim() != header).skip(1).take_while(|l| !l.trim_start().starts_with('['))
}

#[test]
fn crates_depend_only_on_lower_floors() {
    let root = root();
    let doc = fs::read_to_string(root.join("docs/ARCHITECTURE.md")).expect("docs/ARCHITECTURE.md");
    let tables = tables(&doc);
    let floors = tables.get("crates").expect("a crates table");
    let mut names = BTreeMap::new();
    for dir in members(&root) {
        let toml = fs::read_to_string(root.join(&dir).join("Cargo.toml")).expect("a member manifest");
        let name = section(&toml, "package")
            .find_map(|l| l.trim().strip_prefix("name").map(|r| r.trim_start_matches([' ', '=']).trim_matches('"')))
            .expect("a package name")
            .to_string();
        names.insert(name, toml);
    }
    let mut problems = Vec::new();
    for (name, toml) in &names {
        let Some(&floor) = floors.get(name) else {
            problems.push(format!("crate {name} is not in the crates table"));
            continue;
        };
        for line in section(toml, "dependencies") {
            let dep = line.split(['.', ' ', '=']).next().unwrap_or("").trim();
            if let (true, Some(&to)) = (names.contains_key(dep), floors.get(dep)) {
                if to >= floor {
                    problems.push(format!("{name} (floor {floor}) depends on {dep} (floor {to})"));
                }
            }
        }
    }
    assert!(names.len() >= 9, "found only {} workspace crates", names.len());
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn an_upward_import_is_caught() {
    // The checker itself: a module using one on its own floor or above is a problem.
    let t = tables("<!-- layers: x -->\n| floor | modules |\n|---|---|\n| 0 | a |\n| 1 | b, c |\n");
    let x = &t["x"];
    assert_eq!((x["a"], x["b"], x["c"]), (0, 1, 1));
    let paths = crate_paths("use crate::b::Thing; // crate::a in a comment\nlet y = $crate::c::f();\nmy_crate::d");
    assert_eq!(paths, vec![(1, "b".to_string()), (2, "c".to_string())]);
    let grouped = crate_paths("use crate::{\n    e::E,\n    f::{F, G}, self,\n};");
    assert_eq!(grouped, vec![(2, "e".to_string()), (3, "f".to_string())]);
    let src =
        "fn f() {}\n#[cfg(test)]\nmod tests {\n use crate::z;\n fn g() { let _ = 1; }\n}\nfn h() { crate::y(); }\n";
    assert_eq!(without_tests(src), "fn f() {}\n\nfn h() { crate::y(); }\n");
}
