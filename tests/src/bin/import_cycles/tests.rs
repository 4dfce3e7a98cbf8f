//! The checker on small fixture trees, written to a fresh folder under the system's temporary
//! folder for each test: cycles found, and what is and is not an import.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::{check, crates, graph, modules};

const PACKAGE: &str = "[package]\nname = \"fixture\"\nversion = \"0.1.0\"\nedition = \"2024\"\n";

/// A fixture tree, removed when dropped.
struct Fixture {
    root: PathBuf,
}

impl Fixture {
    /// A tree of `files` (path, contents); a lone package unless a `Cargo.toml` is given.
    fn new(files: &[(&str, &str)]) -> Fixture {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let root = std::env::temp_dir().join(format!(
            "import-cycles-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&root);
        let fixture = Fixture { root };
        if !files.iter().any(|(path, _)| *path == "Cargo.toml") {
            fixture.write("Cargo.toml", PACKAGE);
        }
        for (path, text) in files {
            fixture.write(path, text);
        }
        fixture
    }

    fn write(&self, path: &str, text: &str) {
        let path = self.root.join(path);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).unwrap();
        }
        fs::write(path, text).unwrap();
    }

    /// Every edge, as (from, to) paths.
    fn edges(&self) -> Vec<(String, String)> {
        let packages = crates::packages(&self.root).unwrap();
        let tree = modules::read(&self.root, &packages);
        let name = |file: usize| tree.files[file].path.display().to_string();
        graph::edges(&tree)
            .iter()
            .map(|edge| (name(edge.from), name(edge.to)))
            .collect()
    }

    fn report(&self) -> crate::Report {
        check(&self.root, false).unwrap()
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.root);
    }
}

fn edge(from: &str, to: &str) -> (String, String) {
    (from.to_owned(), to.to_owned())
}

#[test]
fn a_cycle_through_three_files_is_found_and_fails_the_check() {
    let fixture = Fixture::new(&[
        ("src/lib.rs", "mod a;\nmod b;\nmod c;\n"),
        ("src/a.rs", "use crate::b::B;\npub struct A(B);\n"),
        ("src/b.rs", "pub struct B;\npub fn g() { crate::c::h() }\n"),
        ("src/c.rs", "pub fn h() { let _ = crate::a::A; }\n"),
        ("src/d.rs", "// not a module of the crate: crate::a::A\n"),
    ]);
    let report = fixture.report();
    assert_eq!(report.cycles, 1, "{}", report.text);
    assert!(
        report
            .text
            .contains("import cycle 1 of 1: 3 files\n  src/a.rs\n  src/b.rs\n  src/c.rs\n")
    );
    assert!(
        report
            .text
            .contains("src/b.rs:2 -> src/c.rs  (crate::c::h)")
    );
    assert!(
        report
            .text
            .ends_with("1 import cycle in 4 files of 1 crate\n")
    );
}

#[test]
fn a_mod_declaration_or_a_look_up_to_an_enclosing_module_is_no_import() {
    let fixture = Fixture::new(&[
        (
            "src/lib.rs",
            "mod parent;\npub use parent::Kid;\npub const ROOT: u8 = 1;\n",
        ),
        (
            "src/parent/mod.rs",
            "mod kid;\npub use kid::Kid;\nconst MAX: u8 = 2;\n",
        ),
        (
            "src/parent/kid.rs",
            "use super::*;\npub struct Kid(u8);\nfn f() -> u8 { super::MAX + crate::ROOT }\n",
        ),
    ]);
    assert_eq!(
        fixture.edges(),
        vec![
            edge("src/lib.rs", "src/parent/mod.rs"),
            edge("src/parent/mod.rs", "src/parent/kid.rs"),
        ]
    );
    let report = fixture.report();
    assert_eq!(report.cycles, 0, "{}", report.text);
    assert_eq!(report.text, "no import cycles in 3 files of 1 crate\n");
}

#[test]
fn super_paths_and_grouped_uses_name_the_files_they_reach() {
    let fixture = Fixture::new(&[
        ("src/lib.rs", "mod a;\nmod b;\n"),
        ("src/a/mod.rs", "mod x;\nmod y;\n"),
        ("src/a/x.rs", "use super::y::Y;\npub fn f() {}\n"),
        (
            "src/a/y.rs",
            "use crate::{b::{self}, a::x};\npub struct Y;\nfn g() { x::f() }\n",
        ),
        ("src/b.rs", "pub fn b() { super::a::x::f(); self::b(); }\n"),
    ]);
    assert_eq!(
        fixture.edges(),
        vec![
            edge("src/a/x.rs", "src/a/y.rs"),
            edge("src/a/y.rs", "src/a/x.rs"),
            edge("src/a/y.rs", "src/b.rs"),
            edge("src/b.rs", "src/a/x.rs"),
        ]
    );
    assert_eq!(fixture.report().cycles, 1);
}

#[test]
fn a_path_names_the_deepest_file_on_it_and_use_names_carry_on() {
    let fixture = Fixture::new(&[
        ("src/lib.rs", "mod a;\nmod c;\nmod d;\n"),
        ("src/a.rs", "pub mod b;\npub struct Item;\n"),
        ("src/a/b.rs", "pub fn f() {}\n"),
        ("src/c.rs", "fn g() { crate::a::b::f(); }\n"),
        ("src/d.rs", "use crate::a;\nfn h() { a::b::f(); }\n"),
    ]);
    assert_eq!(
        fixture.edges(),
        vec![
            edge("src/c.rs", "src/a/b.rs"),
            edge("src/d.rs", "src/a.rs"),
            edge("src/d.rs", "src/a/b.rs"),
        ]
    );
}

#[test]
fn a_path_attribute_is_the_file_the_module_is_in() {
    let fixture = Fixture::new(&[
        (
            "src/lib.rs",
            "#[path = \"elsewhere/thing_impl.rs\"]\nmod thing;\nmod other;\n",
        ),
        ("src/thing.rs", "pub struct T;\n"),
        (
            "src/elsewhere/thing_impl.rs",
            "mod near;\npub struct T(crate::other::O);\n",
        ),
        ("src/elsewhere/near.rs", "pub struct N;\n"),
        (
            "src/other.rs",
            "pub struct O;\nfn f() { let _ = crate::thing::T; }\n",
        ),
    ]);
    let report = fixture.report();
    assert_eq!(report.cycles, 1, "{}", report.text);
    assert!(
        report
            .text
            .contains("  src/elsewhere/thing_impl.rs\n  src/other.rs\n")
    );
    // A `#[path]` file finds its own modules beside it; `src/thing.rs` is no module.
    assert!(report.text.ends_with("in 4 files of 1 crate\n"));
}

#[test]
fn test_code_comments_and_strings_are_no_imports() {
    let fixture = Fixture::new(&[
        ("src/lib.rs", "mod a;\nmod b;\n"),
        (
            "src/a.rs",
            "pub struct A;\n#[cfg(test)]\nmod tests;\n#[cfg(test)]\nmod inline { use crate::b::B; }\n\
             #[cfg(all(test, unix))]\nfn helper() { crate::b::f() }\n#[test]\nfn t() { crate::b::f() }\n\
             /// [`crate::b::B`]\nconst S: &str = \"crate::b::B\";\nconst R: &str = r#\"crate::b\"#;\n",
        ),
        ("src/a/tests.rs", "use crate::b::B;\n"),
        ("src/b.rs", "pub struct B(crate::a::A);\npub fn f() {}\n"),
        ("tests/story.rs", "use fixture::a;\n"),
    ]);
    assert_eq!(fixture.edges(), vec![edge("src/b.rs", "src/a.rs")]);
    assert!(fixture.report().text.ends_with("in 3 files of 1 crate\n"));
}

#[test]
fn a_child_reaching_a_sibling_inline_in_its_parents_file_is_an_import() {
    let fixture = Fixture::new(&[
        (
            "src/lib.rs",
            "mod m;\npub use m::Thing;\npub mod signal { pub const K: i32 = 9; }\n",
        ),
        (
            "src/m.rs",
            "use crate::signal::K;\npub struct Thing(i32);\n",
        ),
    ]);
    assert_eq!(fixture.report().cycles, 1);
}

#[test]
fn every_member_and_excluded_crate_is_read_from_each_of_its_roots() {
    let workspace =
        "[workspace]\nmembers = [\n  \"crates/*\", # all of them\n]\nexclude = [\"alone\"]\n";
    let fixture = Fixture::new(&[
        ("Cargo.toml", workspace),
        ("crates/one/Cargo.toml", PACKAGE),
        ("crates/one/src/main.rs", "mod cli;\n"),
        ("crates/one/src/cli.rs", ""),
        ("crates/one/src/bin/tool.rs", ""),
        ("crates/one/benches/bench/main.rs", ""),
        ("crates/one/tests/story.rs", ""),
        ("crates/notes/README.md", ""),
        (
            "alone/Cargo.toml",
            &format!("{PACKAGE}\n[lib]\npath = \"lib/root.rs\"\n"),
        ),
        ("alone/lib/root.rs", "mod x;\n"),
        ("alone/lib/x.rs", ""),
        ("alone/build.rs", ""),
    ]);
    let packages = crates::packages(&fixture.root).unwrap();
    let roots: Vec<&Path> = packages
        .iter()
        .flat_map(|p| p.roots.iter().map(PathBuf::as_path))
        .collect();
    assert_eq!(
        roots,
        [
            "crates/one/src/main.rs",
            "crates/one/src/bin/tool.rs",
            "crates/one/benches/bench/main.rs",
            "alone/lib/root.rs",
            "alone/build.rs",
        ]
        .map(Path::new)
    );
    assert_eq!(
        fixture.report().text,
        "no import cycles in 7 files of 2 crates\n"
    );
}

#[test]
fn literals_and_lifetimes_do_not_upset_the_reading() {
    let source = "fn f<'a>(x: &'a str) -> char { let _ = ('\\'', '\\\\', b'{', '\\u{7b}', br##\"}\"#\"##); '{' }\n\
                  mod after { use crate::z; }\n";
    let scanned = crate::scan::scan(source);
    assert_eq!(scanned.mods.len(), 1);
    assert_eq!(scanned.mods[0].scope, Vec::<String>::new());
    assert_eq!(scanned.refs.len(), 1);
    assert_eq!(scanned.refs[0].scope, vec!["after".to_owned()]);
    assert_eq!(scanned.refs[0].line, 2);
}
