//! Which crates the repository has and where each compiled crate starts: the members of the
//! root `Cargo.toml`'s workspace, and the crates it excludes (`services/job-guard` is its own
//! workspace, but its files are this repository's all the same). Each crate's roots are its
//! library, binaries, benchmarks, examples and build script, as Cargo finds them (declared
//! `path`s, or the conventional places); integration tests (`tests/`) are left out on purpose.
//!
//! Only the few manifest keys this needs are read, line by line: no TOML library, so the
//! checker builds with the standard library alone.

use std::fs;
use std::path::{Path, PathBuf};

/// A crate of the repository (a Cargo package): its compiled crates' root files, relative
/// to the repository root.
#[derive(Debug)]
pub struct Package {
    pub roots: Vec<PathBuf>,
}

/// Every package of the workspace at `root`, in the manifest's order.
pub fn packages(root: &Path) -> Result<Vec<Package>, String> {
    let manifest = root.join("Cargo.toml");
    let text = fs::read_to_string(&manifest)
        .map_err(|err| format!("cannot read {}: {err}", manifest.display()))?;
    let mut dirs = Vec::new();
    for pattern in string_array(&text, "members")
        .into_iter()
        .chain(string_array(&text, "exclude"))
    {
        dirs.extend(expand(root, &pattern));
    }
    // A lone package is its own workspace.
    if dirs.is_empty() && section_keys(&text, "package").is_some() {
        dirs.push(PathBuf::new());
    }
    let mut packages = Vec::new();
    for dir in dirs {
        let text = fs::read_to_string(root.join(&dir).join("Cargo.toml"))
            .map_err(|err| format!("cannot read {}/Cargo.toml: {err}", dir.display()))?;
        let roots = roots(root, &dir, &text);
        packages.push(Package { roots });
    }
    Ok(packages)
}

/// `members = ["a", "b/*"]` entries that are packages (a folder with a `Cargo.toml`); a
/// trailing `*` stands for every such folder under it.
fn expand(root: &Path, pattern: &str) -> Vec<PathBuf> {
    let is_package = |dir: &Path| root.join(dir).join("Cargo.toml").is_file();
    let Some(parent) = pattern.strip_suffix("/*") else {
        let dir = PathBuf::from(pattern);
        return if is_package(&dir) {
            vec![dir]
        } else {
            Vec::new()
        };
    };
    let Ok(entries) = fs::read_dir(root.join(parent)) else {
        return Vec::new();
    };
    let mut dirs: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|entry| Path::new(parent).join(entry.file_name()))
        .filter(|dir| is_package(dir))
        .collect();
    dirs.sort();
    dirs
}

/// The root files of the package in `dir`, whose manifest is `text`.
fn roots(root: &Path, dir: &Path, text: &str) -> Vec<PathBuf> {
    let exists = |rel: &Path| root.join(dir).join(rel).is_file();
    let mut found: Vec<PathBuf> = Vec::new();
    let mut add = |rel: PathBuf| {
        let path = dir.join(&rel);
        if exists(&rel) && !found.contains(&path) {
            found.push(path);
        }
    };
    // Declared targets first, then the places Cargo looks by convention.
    for section in ["lib", "bin", "bench", "example"] {
        for path in declared_paths(text, section) {
            add(PathBuf::from(path));
        }
    }
    let build = section_keys(text, "package")
        .and_then(|keys| value(&keys, "build"))
        .unwrap_or_else(|| "build.rs".to_owned());
    add(PathBuf::from(build));
    add(PathBuf::from("src/lib.rs"));
    add(PathBuf::from("src/main.rs"));
    for folder in ["src/bin", "benches", "examples"] {
        for file in conventional_targets(&root.join(dir).join(folder)) {
            add(Path::new(folder).join(file));
        }
    }
    found
}

/// In a target folder: each `x.rs`, and each `x/main.rs`.
fn conventional_targets(folder: &Path) -> Vec<PathBuf> {
    let Ok(entries) = fs::read_dir(folder) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let name = PathBuf::from(entry.file_name());
            let path = entry.path();
            if path.is_dir() && path.join("main.rs").is_file() {
                Some(name.join("main.rs"))
            } else if path.extension().is_some_and(|e| e == "rs") {
                Some(name)
            } else {
                None
            }
        })
        .collect();
    files.sort();
    files
}

/// The `path` of every `[section]` or `[[section]]` table.
fn declared_paths(text: &str, section: &str) -> Vec<String> {
    tables(text)
        .into_iter()
        .filter(|(name, _)| name == section)
        .filter_map(|(_, keys)| value(&keys, "path"))
        .collect()
}

/// The lines of the first `[section]` table.
fn section_keys(text: &str, section: &str) -> Option<Vec<String>> {
    tables(text)
        .into_iter()
        .find(|(name, _)| name == section)
        .map(|(_, keys)| keys)
}

/// Each table's name (`lib` for `[lib]`, `bin` for `[[bin]]`) and its lines.
fn tables(text: &str) -> Vec<(String, Vec<String>)> {
    let mut tables: Vec<(String, Vec<String>)> = vec![(String::new(), Vec::new())];
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            let name = line.trim_matches(|c| c == '[' || c == ']').trim();
            tables.push((name.to_owned(), Vec::new()));
        } else if let Some((_, lines)) = tables.last_mut() {
            lines.push(line.to_owned());
        }
    }
    tables
}

/// The string value of `key = "value"` among a table's lines.
fn value(lines: &[String], key: &str) -> Option<String> {
    lines.iter().find_map(|line| {
        let (name, rest) = line.split_once('=')?;
        if name.trim() != key {
            return None;
        }
        let rest = rest.trim().strip_prefix('"')?;
        rest.split_once('"').map(|(value, _)| value.to_owned())
    })
}

/// The strings of `key = [ ... ]` (which may span lines), in whichever table it stands.
fn string_array(text: &str, key: &str) -> Vec<String> {
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        let Some(rest) = line.trim_start().strip_prefix(key) else {
            continue;
        };
        let Some(rest) = rest.trim_start().strip_prefix('=') else {
            continue;
        };
        let Some(first) = rest.trim_start().strip_prefix('[') else {
            continue;
        };
        let mut body = first.to_owned();
        while !body.contains(']') {
            let Some(more) = lines.next() else { break };
            body.push('\n');
            body.push_str(more);
        }
        let body = body.split(']').next().unwrap_or_default();
        return quoted_strings(body);
    }
    Vec::new()
}

/// The `"..."` strings of `text`, comments (`# ...`) left out.
fn quoted_strings(text: &str) -> Vec<String> {
    text.lines()
        .map(|line| line.split('#').next().unwrap_or_default())
        .flat_map(|line| line.split('"').skip(1).step_by(2))
        .map(str::to_owned)
        .collect()
}
