//! `import-cycles`: checks that no file of a crate imports one that imports it back, directly
//! or through others (docs/architecture.md says so; `scripts/test.sh` runs this to keep it
//! so). Run from the repository root: `cargo run -q -p mgpu-tests --bin import-cycles`.
//!
//! # What counts as an import
//! File A imports file B when A's non-test code names, by a path, a module that lives in B or
//! an item of one: `use crate::a::b`, `crate::a::b::f()` in code, `super::x`, `self::x`, a
//! child module's name (`child::f()`, `pub use child::X`), each part of a grouped
//! `use crate::{a, b::c}`, and a name a `use` brought in (`use crate::a; a::b::f()`). The path
//! names the file of the deepest module on it that exists: `crate::a::b::Thing` is `a/b.rs`
//! when there is such a module, else `a.rs`.
//!
//! Not imports:
//! - a parent's `mod child;`: declaring a module is owning it, not using it;
//! - a reference from a file to a module that encloses it (`super::X` in a child, or
//!   `crate::X` naming the crate root): a child sees its parent's names by construction, and
//!   a parent that re-exports or uses its child (`pub use child::X`) would otherwise make
//!   every such pair a cycle. So parent → child counts, child → parent does not; a child
//!   reaching a *sibling* (`super::sibling::X`) or anything else counts, even a sibling
//!   written inline in the parent's file (`crate::signal::K` with `pub mod signal { .. }` in
//!   `lib.rs`): the exception is for the enclosing modules, not for whatever shares their
//!   file, which is the stricter of the two readings;
//! - test code: `#[cfg(test)]` items and the files of `#[cfg(test)] mod tests;`, `#[test]`
//!   functions, and the integration tests under `tests/` (test code may reach anywhere);
//! - paths in comments, doc links and strings.
//!
//! The crates are the root manifest's workspace members and the crates it excludes (each its
//! own workspace, such as `services/job-guard`). Cycles are the strongly connected components
//! of the file graph; each is printed with the references that tie it, and the exit status is
//! 1. With none it prints one line and exits 0; 2 is a repository it could not read.

mod crates;
mod graph;
mod lexer;
mod modules;
mod scan;
#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

const HELP: &str = "\
import-cycles: finds files of a crate that import each other, directly or through others.

USAGE: import-cycles [--edges] [DIR]

--edges prints every import first, one a line (FILE:LINE -> FILE  (PATH)).

DIR is the repository root (the folder of the workspace's Cargo.toml); the current folder if
left out. Every workspace member, and every crate the workspace excludes, is read from its
library, binary, benchmark and example roots; integration tests and #[cfg(test)] code are not.

An import is a path to a module of the same crate: use crate::a::b, crate::a::b::f() in code,
super::x, self::x, a child module's name, grouped uses; it names the file of the deepest
module on it. A `mod child;` declaration is not an import, nor is a reference to a module that
encloses the file (a child's super::X, crate::X to the root); a reference to a sibling module
is, even one written inline in the parent's file.

Exit status: 0 no cycle, 1 cycles (each printed with the references that tie it), 2 the
repository could not be read.";

fn main() -> ExitCode {
    let mut root = PathBuf::from(".");
    let mut list_edges = false;
    for arg in std::env::args().skip(1) {
        match arg.as_str() {
            "-h" | "--help" => {
                println!("{HELP}");
                return ExitCode::SUCCESS;
            }
            "--edges" => list_edges = true,
            flag if flag.starts_with('-') => {
                eprintln!("import-cycles: unknown option {flag} (see --help)");
                return ExitCode::from(2);
            }
            dir => root = PathBuf::from(dir),
        }
    }
    match check(&root, list_edges) {
        Ok(report) => {
            print!("{}", report.text);
            if report.cycles == 0 {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(err) => {
            eprintln!("import-cycles: {err}");
            ExitCode::from(2)
        }
    }
}

/// What a check found, as printed.
struct Report {
    cycles: usize,
    text: String,
}

/// Checks the repository at `root`; `list_edges`: the report starts with every edge.
fn check(root: &Path, list_edges: bool) -> Result<Report, String> {
    let packages = crates::packages(root)?;
    let tree = modules::read(root, &packages);
    let edges = graph::edges(&tree);
    let cycles = graph::cycles(tree.files.len(), &edges);
    let mut text = String::new();
    for note in &tree.notes {
        text.push_str(&format!("note: {note}\n"));
    }
    let name = |file: usize| tree.files[file].path.display().to_string();
    let line = |edge: &graph::Edge| {
        format!(
            "{}:{} -> {}  ({})\n",
            name(edge.from),
            edge.line,
            name(edge.to),
            edge.path
        )
    };
    if list_edges {
        for edge in &edges {
            text.push_str(&line(edge));
        }
    }
    for (number, cycle) in cycles.iter().enumerate() {
        text.push_str(&format!(
            "import cycle {} of {}: {} files\n",
            number + 1,
            cycles.len(),
            cycle.len()
        ));
        for &file in cycle {
            text.push_str(&format!("  {}\n", name(file)));
        }
        text.push_str("  tied by:\n");
        for edge in edges
            .iter()
            .filter(|e| cycle.contains(&e.from) && cycle.contains(&e.to))
        {
            text.push_str(&format!("    {}", line(edge)));
        }
    }
    let counts = format!(
        "in {} of {}",
        plural(tree.files.len(), "file"),
        plural(packages.len(), "crate")
    );
    if cycles.is_empty() {
        text.push_str(&format!("no import cycles {counts}\n"));
    } else {
        let found = plural(cycles.len(), "import cycle");
        text.push_str(&format!("{found} {counts}\n"));
    }
    Ok(Report {
        cycles: cycles.len(),
        text,
    })
}

/// `1 file`, `2 files`.
fn plural(count: usize, noun: &str) -> String {
    if count == 1 {
        format!("{count} {noun}")
    } else {
        format!("{count} {noun}s")
    }
}
