//! Each compiled crate's module tree, followed from its root file the way the compiler does:
//! `mod x;` in a `lib.rs`, `main.rs` or `mod.rs` (or a file a `#[path]` named) is `x.rs` or
//! `x/mod.rs` beside it, in any other `foo.rs` it is under `foo/`; inline modules add their
//! names to the folder; `#[path = "..."]` names the file itself. Test-only modules never enter
//! (the scan drops them), so neither do the files they would bring in.

use std::collections::HashMap;
use std::fs;
use std::path::{Component, Path, PathBuf};

use crate::crates::Package;
use crate::scan::{FileScan, ModDecl, scan};

/// A file of the repository, read once however many crates include it.
#[derive(Debug)]
pub struct SourceFile {
    /// Relative to the repository root.
    pub path: PathBuf,
    pub scan: FileScan,
}

/// One compiled crate (a library, a binary...): its modules and the files they are in.
#[derive(Debug, Default)]
pub struct Unit {
    /// Every module path (`[]` is the root; inline modules too) and the file it is in.
    pub modules: HashMap<Vec<String>, usize>,
    /// Each file of the crate and its module path.
    pub files: Vec<(usize, Vec<String>)>,
}

#[derive(Debug, Default)]
pub struct Tree {
    pub files: Vec<SourceFile>,
    pub units: Vec<Unit>,
    /// Declared modules whose file was not found or could not be read.
    pub notes: Vec<String>,
    by_path: HashMap<PathBuf, usize>,
}

/// Reads every crate of `packages` under `root`.
pub fn read(root: &Path, packages: &[Package]) -> Tree {
    let mut tree = Tree::default();
    for package in packages {
        for file in &package.roots {
            let mut unit = Unit::default();
            tree.walk(root, &mut unit, file, Vec::new(), true);
            tree.units.push(unit);
        }
    }
    tree
}

impl Tree {
    /// The file at `path` (relative), scanned on first use.
    fn load(&mut self, root: &Path, path: &Path) -> Option<usize> {
        if let Some(&id) = self.by_path.get(path) {
            return Some(id);
        }
        let source = match fs::read_to_string(root.join(path)) {
            Ok(source) => source,
            Err(err) => {
                self.notes
                    .push(format!("cannot read {}: {err}", path.display()));
                return None;
            }
        };
        let id = self.files.len();
        self.files.push(SourceFile {
            path: path.to_owned(),
            scan: scan(&source),
        });
        self.by_path.insert(path.to_owned(), id);
        Some(id)
    }

    /// Adds `file`, the module `module`, and every module it declares to `unit`. `mod_rs`:
    /// its children are found beside it rather than in a folder of its name.
    fn walk(
        &mut self,
        root: &Path,
        unit: &mut Unit,
        file: &Path,
        module: Vec<String>,
        mod_rs: bool,
    ) {
        let Some(id) = self.load(root, file) else {
            return;
        };
        if unit.files.iter().any(|(seen, _)| *seen == id) {
            return;
        }
        unit.modules.insert(module.clone(), id);
        unit.files.push((id, module.clone()));
        let decls = self.files[id].scan.mods.clone();
        for decl in decls {
            let mut child = module.clone();
            child.extend(decl.scope.iter().cloned());
            child.push(decl.name.clone());
            if decl.inline {
                unit.modules.insert(child, id);
                continue;
            }
            match child_file(root, file, mod_rs, &decl) {
                Some((path, child_mod_rs)) => self.walk(root, unit, &path, child, child_mod_rs),
                None => self.notes.push(format!(
                    "{}: no file for `mod {}`",
                    file.display(),
                    decl.name
                )),
            }
        }
    }
}

/// The file a `mod x;` of `file` names, and whether its own children are found beside it.
fn child_file(root: &Path, file: &Path, mod_rs: bool, decl: &ModDecl) -> Option<(PathBuf, bool)> {
    let parent = file.parent().unwrap_or(Path::new(""));
    // Where children of `file` live, then of the inline modules the declaration is in.
    let mut folder = parent.to_owned();
    if !mod_rs && let Some(stem) = file.file_stem() {
        folder.push(stem);
    }
    folder.extend(&decl.scope);
    if let Some(path) = &decl.path_attr {
        // Outside inline modules a `#[path]` is relative to the file's own folder.
        let base = if decl.scope.is_empty() {
            parent
        } else {
            &folder
        };
        let path = normalize(&base.join(path));
        return root.join(&path).is_file().then_some((path, true));
    }
    let flat = folder.join(format!("{}.rs", decl.name));
    if root.join(&flat).is_file() {
        return Some((flat, false));
    }
    let nested = folder.join(&decl.name).join("mod.rs");
    root.join(&nested).is_file().then_some((nested, true))
}

/// `a/b/../c.rs` as `a/c.rs`, so that one file has one name.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    out.push("..");
                }
            }
            other => out.push(other),
        }
    }
    out
}
