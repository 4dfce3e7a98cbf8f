//! From paths to file edges, and from edges to cycles.
//!
//! A path is made absolute in its crate (`crate::`, `self::`, `super::`, a child module's
//! name, or a name a `use` brought in, followed to what it stands for), then names the file
//! of the deepest module on it that exists: `crate::a::b::Thing` is `a/b.rs` when there is
//! one, else `a.rs` (where `b` is an item). A reference from a file to a module that encloses
//! it (its parent, its parent's parent, the crate root) is no edge: see the crate's doc for
//! why. Cycles are the strongly connected components of more than one file (Tarjan).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::modules::{Tree, Unit};

/// One file importing another, with the first reference that says so.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Edge {
    pub from: usize,
    pub to: usize,
    pub line: usize,
    /// The path as written.
    pub path: String,
}

/// A name a `use` brought into a scope: the scope, and the path as written there.
type Alias = (Vec<String>, Vec<String>);

/// How deep an alias may lead to another before the path is given up on (no real crate
/// chains `use`s this far; a `use` cycle would otherwise not end).
const MAX_ALIAS_HOPS: usize = 16;

/// Every file edge of `tree`, one per pair of files, ordered.
pub fn edges(tree: &Tree) -> Vec<Edge> {
    let mut found: BTreeMap<(usize, usize), Edge> = BTreeMap::new();
    for unit in &tree.units {
        let aliases = aliases(tree, unit);
        for (file, module) in &unit.files {
            for reference in &tree.files[*file].scan.refs {
                let mut scope = module.clone();
                scope.extend(reference.scope.iter().cloned());
                let Some(path) = absolute(unit, &aliases, &scope, &reference.segments, 0) else {
                    continue;
                };
                let Some((target_module, target)) = deepest(unit, &path) else {
                    continue;
                };
                // The file itself, or a module it is inside of.
                if target == *file || module.starts_with(target_module) {
                    continue;
                }
                found.entry((*file, target)).or_insert_with(|| Edge {
                    from: *file,
                    to: target,
                    line: reference.line,
                    path: reference.segments.join("::"),
                });
            }
        }
    }
    found.into_values().collect()
}

/// The names each scope of `unit` brought in with `use`, by scope.
fn aliases(tree: &Tree, unit: &Unit) -> HashMap<Vec<String>, HashMap<String, Alias>> {
    let mut by_scope: HashMap<Vec<String>, HashMap<String, Alias>> = HashMap::new();
    for (file, module) in &unit.files {
        for reference in &tree.files[*file].scan.refs {
            let Some(alias) = &reference.alias else {
                continue;
            };
            let mut scope = module.clone();
            scope.extend(reference.scope.iter().cloned());
            by_scope
                .entry(scope.clone())
                .or_default()
                .insert(alias.clone(), (scope, reference.segments.clone()));
        }
    }
    by_scope
}

/// `segments`, written in `scope`, as a path from the crate root; None where it leaves the
/// crate (another crate, `std`, a local item, `Self`).
fn absolute(
    unit: &Unit,
    aliases: &HashMap<Vec<String>, HashMap<String, Alias>>,
    scope: &[String],
    segments: &[String],
    hops: usize,
) -> Option<Vec<String>> {
    let (first, rest) = segments.split_first()?;
    match first.as_str() {
        "crate" => Some(rest.to_vec()),
        "self" => Some([scope, rest].concat()),
        "super" => {
            let ups = segments.iter().take_while(|s| *s == "super").count();
            let base = scope.get(..scope.len().checked_sub(ups)?)?;
            Some([base, &segments[ups..]].concat())
        }
        _ => {
            let mut child = scope.to_vec();
            child.push(first.clone());
            if unit.modules.contains_key(&child) {
                return Some([scope, segments].concat());
            }
            if hops >= MAX_ALIAS_HOPS {
                return None;
            }
            let (alias_scope, alias_path) = aliases.get(scope)?.get(first)?;
            let target = absolute(unit, aliases, alias_scope, alias_path, hops + 1)?;
            Some([&target[..], rest].concat())
        }
    }
}

/// The deepest module of `unit` on `path`, and its file (the root, `[]`, is always there).
fn deepest<'p>(unit: &Unit, path: &'p [String]) -> Option<(&'p [String], usize)> {
    (0..=path.len()).rev().find_map(|len| {
        unit.modules
            .get(&path[..len])
            .map(|&file| (&path[..len], file))
    })
}

/// The strongly connected components of more than one file, each sorted, in order of their
/// first file.
pub fn cycles(files: usize, edges: &[Edge]) -> Vec<Vec<usize>> {
    let mut next: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); files];
    for edge in edges {
        next[edge.from].insert(edge.to);
    }
    let mut tarjan = Tarjan {
        next: &next,
        index: vec![None; files],
        low: vec![0; files],
        on_stack: vec![false; files],
        stack: Vec::new(),
        counter: 0,
        components: Vec::new(),
    };
    for file in 0..files {
        if tarjan.index[file].is_none() {
            tarjan.visit(file);
        }
    }
    let mut components: Vec<Vec<usize>> = tarjan
        .components
        .into_iter()
        .filter(|component| component.len() > 1)
        .map(|mut component| {
            component.sort_unstable();
            component
        })
        .collect();
    components.sort();
    components
}

/// Tarjan's algorithm; recursion depth is at most the number of files, a few hundred.
struct Tarjan<'g> {
    next: &'g [BTreeSet<usize>],
    index: Vec<Option<usize>>,
    low: Vec<usize>,
    on_stack: Vec<bool>,
    stack: Vec<usize>,
    counter: usize,
    components: Vec<Vec<usize>>,
}

impl Tarjan<'_> {
    fn visit(&mut self, file: usize) {
        self.index[file] = Some(self.counter);
        self.low[file] = self.counter;
        self.counter += 1;
        self.stack.push(file);
        self.on_stack[file] = true;
        for &to in self.next[file].iter() {
            match self.index[to] {
                None => {
                    self.visit(to);
                    self.low[file] = self.low[file].min(self.low[to]);
                }
                Some(index) if self.on_stack[to] => {
                    self.low[file] = self.low[file].min(index);
                }
                Some(_) => {}
            }
        }
        if Some(self.low[file]) == self.index[file] {
            let mut component = Vec::new();
            while let Some(top) = self.stack.pop() {
                self.on_stack[top] = false;
                component.push(top);
                if top == file {
                    break;
                }
            }
            self.components.push(component);
        }
    }
}
