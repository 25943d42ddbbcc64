//! The documents a clone starts from (`README.md`, `SECURITY.md`, `LICENSE`, everything under
//! `docs/`) stand on the clone alone: every Markdown link and every backticked path that names a
//! file of the repository resolves to one that exists, and none leaves the repository.
//!
//! A backticked word counts as a path when it contains `/` and starts with `../`, `./` or a
//! top-level entry of the repository (`core/…`, `scripts/…`); `*` and `<name>` in a path stand
//! for any name, so the folder before them must exist.

use std::fs;
use std::path::{Component, Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace root").to_path_buf()
}

/// The entry documents and every Markdown file under `docs/`.
fn documents(root: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = ["README.md", "SECURITY.md"].iter().map(|f| root.join(f)).collect();
    let mut dirs = vec![root.join("docs")];
    while let Some(d) = dirs.pop() {
        for e in fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())).flatten() {
            let p = e.path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "md") {
                out.push(p);
            }
        }
    }
    out
}

/// `](target)` of Markdown links and images, without `#fragment`; web and mail links left out.
fn link_targets(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("](") {
        rest = &rest[i + 2..];
        let end = rest.find([')', ' ', '\n']).unwrap_or(rest.len());
        let target = rest[..end].split('#').next().unwrap_or_default();
        let scheme = target.split_once(':').is_some_and(|(s, _)| s.chars().all(|c| c.is_ascii_alphabetic()));
        if !target.is_empty() && !scheme {
            out.push(target.to_string());
        }
    }
    out
}

/// Backticked words that name a path of the repository (see the module's comment).
fn code_paths(text: &str, tops: &[String]) -> Vec<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .filter(|w| !w.contains(char::is_whitespace) && w.contains('/'))
        .filter(|w| {
            w.starts_with("../") || w.starts_with("./") || tops.iter().any(|t| w.split('/').next() == Some(t.as_str()))
        })
        .map(|w| w.trim_end_matches([':', ',', '.']).to_string())
        .collect()
}

/// Where `target`, written in a file of `dir`, points: `None` if it climbs out of `root`.
fn resolve(root: &Path, dir: &Path, target: &str) -> Option<PathBuf> {
    let mut p = dir.strip_prefix(root).ok()?.to_path_buf();
    for c in Path::new(target).components() {
        match c {
            Component::ParentDir => {
                if !p.pop() {
                    return None;
                }
            }
            Component::Normal(n) => p.push(n),
            Component::CurDir => {}
            Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    Some(root.join(p))
}

/// The part of `path` before its first `*` or `<…>` component (the whole path if it has none).
fn fixed_prefix(path: &Path) -> PathBuf {
    path.components().take_while(|c| !c.as_os_str().to_string_lossy().contains(['*', '<'])).collect()
}

#[test]
fn the_entry_documents_link_only_into_the_repository_and_nothing_dangles() {
    let root = root();
    assert!(root.join("LICENSE").is_file(), "LICENSE is missing");
    let tops: Vec<String> = fs::read_dir(&root)
        .expect("the workspace root")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n != "target" && !n.starts_with('.'))
        .collect();
    let mut bad = Vec::new();
    let mut checked = 0;
    for doc in documents(&root) {
        let text = fs::read_to_string(&doc).unwrap_or_else(|e| panic!("{}: {e}", doc.display()));
        let name = doc.strip_prefix(&root).unwrap_or(&doc).display().to_string();
        let dir = doc.parent().expect("a file's folder");
        // Links are relative to the document; backticked paths to the repository's root.
        let links = link_targets(&text).into_iter().map(|t| (dir, t));
        let paths = code_paths(&text, &tops).into_iter().map(|t| (root.as_path(), t));
        for (base, target) in links.chain(paths) {
            checked += 1;
            match resolve(&root, base, &target) {
                None => bad.push(format!("{name}: `{target}` leaves the repository")),
                Some(p) if !fixed_prefix(&p).exists() => bad.push(format!("{name}: `{target}` does not exist")),
                Some(_) => {}
            }
        }
    }
    assert!(checked > 20, "only {checked} links and paths found: the scan is broken");
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

#[test]
fn the_scan_sees_what_it_must() {
    assert_eq!(link_targets("a [x](docs/a.md#s) ![i](p.png) [w](https://e.org) [h](#top)"), ["docs/a.md", "p.png"]);
    let tops = ["core".to_string(), "docs".to_string()];
    assert_eq!(
        code_paths("`../shared/DESIGN.md` `core/src/lib.rs:` `a/b` `docs/x <y>` `./scripts/t.sh`", &tops),
        ["../shared/DESIGN.md", "core/src/lib.rs", "./scripts/t.sh"]
    );
    let root = Path::new("/r");
    assert_eq!(resolve(root, Path::new("/r/docs"), "../README.md"), Some(PathBuf::from("/r/README.md")));
    assert_eq!(resolve(root, root, "../shared/DESIGN.md"), None);
    assert_eq!(fixed_prefix(Path::new("/r/dashboards/grafana/*.json")), PathBuf::from("/r/dashboards/grafana"));
    assert_eq!(fixed_prefix(Path::new("/r/t/<job>.yml")), PathBuf::from("/r/t"));
}
