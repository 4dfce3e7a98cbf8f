//! One file's tokens read for what the checker needs: the modules it declares (`mod x;`, and
//! inline `mod x { .. }`, with their `#[path]`), and every path that may name a module of its
//! crate, from `use` items (grouped ones flattened, with the name each brings in) and from
//! code (`crate::a::f()`, `super::x::Y`, `child::g()`). Test-only code (an item under
//! `#[cfg(test)]` or `#[test]`) is skipped whole: test code may reach anywhere.
//!
//! Paths are kept as written, with the inline module they stand in; which file they name is
//! decided later, when the whole crate's modules are known (`graph.rs`).

use crate::lexer::{Kind, Token, tokenize};

/// A module this file declares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModDecl {
    /// The inline modules of this file the declaration stands in (outermost first).
    pub scope: Vec<String>,
    pub name: String,
    /// `mod x { .. }`: its items are in this file.
    pub inline: bool,
    /// `#[path = "..."]`, as written.
    pub path_attr: Option<String>,
}

/// A path that may name something of this crate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reference {
    pub scope: Vec<String>,
    /// As written; a leading `::` is kept as a segment of its own, a `$crate` reads `crate`,
    /// and a `use a::{self}` reads `a`.
    pub segments: Vec<String>,
    pub line: usize,
    /// The name a `use` brings into scope (`use a::b` brings `b`, `use a::b as c` brings `c`);
    /// None for paths in code and for globs.
    pub alias: Option<String>,
}

#[derive(Debug, Default)]
pub struct FileScan {
    pub mods: Vec<ModDecl>,
    pub refs: Vec<Reference>,
}

/// Reads `source`.
pub fn scan(source: &str) -> FileScan {
    let tokens = tokenize(source);
    let mut scanner = Scanner {
        tokens: &tokens,
        at: 0,
        depth: 0,
        scopes: Vec::new(),
        pending: Pending::default(),
        out: FileScan::default(),
    };
    scanner.run();
    scanner.out
}

/// Attributes read and not yet applied to an item.
#[derive(Default)]
struct Pending {
    test_only: bool,
    path: Option<String>,
}

struct Scanner<'t> {
    tokens: &'t [Token],
    at: usize,
    /// Depth of `{` braces.
    depth: usize,
    /// Open inline modules, with the brace depth inside each.
    scopes: Vec<(String, usize)>,
    pending: Pending,
    out: FileScan,
}

/// Keywords after which `#[cfg(test)]` applies to an item that ends with `;` or a block, not
/// with a `,` (a field or a match arm does).
const ITEM_WORDS: &[&str] = &[
    "fn",
    "struct",
    "enum",
    "union",
    "impl",
    "mod",
    "trait",
    "const",
    "static",
    "type",
    "use",
    "extern",
    "unsafe",
    "async",
    "macro_rules",
    "let",
];

impl Scanner<'_> {
    fn token(&self, at: usize) -> Option<&Token> {
        self.tokens.get(at)
    }

    fn scope(&self) -> Vec<String> {
        self.scopes.iter().map(|(name, _)| name.clone()).collect()
    }

    fn run(&mut self) {
        while let Some(token) = self.token(self.at) {
            let line = token.line;
            match &token.kind {
                Kind::Punct('#') => self.attribute(),
                _ if self.pending.test_only => {
                    self.at = skip_item(self.tokens, self.at);
                    self.pending = Pending::default();
                }
                Kind::Ident(word) if word == "mod" => self.module(),
                Kind::Ident(word) if word == "use" => self.use_item(line),
                Kind::Ident(_) => self.code_path(),
                Kind::Punct('{') => {
                    self.depth += 1;
                    self.pending = Pending::default();
                    self.at += 1;
                }
                Kind::Punct('}') => {
                    self.depth = self.depth.saturating_sub(1);
                    while self.scopes.last().is_some_and(|(_, d)| *d > self.depth) {
                        self.scopes.pop();
                    }
                    self.pending = Pending::default();
                    self.at += 1;
                }
                Kind::Punct(';') => {
                    self.pending = Pending::default();
                    self.at += 1;
                }
                _ => self.at += 1,
            }
        }
    }

    /// `#[...]` (an outer attribute, remembered for the next item) or `#![...]` (ignored).
    fn attribute(&mut self) {
        let inner = self.token(self.at + 1).is_some_and(|t| t.is_punct('!'));
        let open = self.at + if inner { 2 } else { 1 };
        if !self.token(open).is_some_and(|t| t.is_punct('[')) {
            self.at += 1;
            return;
        }
        let close = matching(self.tokens, open);
        let body = &self.tokens[open + 1..close.saturating_sub(1).max(open + 1)];
        self.at = close;
        if inner {
            return;
        }
        match body.first().and_then(Token::ident) {
            Some("test") if body.len() == 1 => self.pending.test_only = true,
            Some("cfg") => self.pending.test_only |= cfg_is_test_only(&body[1..]),
            Some("path") => {
                if let (
                    Some(eq),
                    Some(Token {
                        kind: Kind::Str(path),
                        ..
                    }),
                ) = (body.get(1), body.get(2))
                    && eq.is_punct('=')
                {
                    self.pending.path = Some(path.clone());
                }
            }
            _ => {}
        }
    }

    /// `mod name;` or `mod name { .. }`.
    fn module(&mut self) {
        let path_attr = self.pending.path.take();
        self.pending = Pending::default();
        let Some(name) = self.token(self.at + 1).and_then(Token::ident) else {
            self.at += 1;
            return;
        };
        let name = name.to_owned();
        let inline = self.token(self.at + 2).is_some_and(|t| t.is_punct('{'));
        self.out.mods.push(ModDecl {
            scope: self.scope(),
            name: name.clone(),
            inline,
            path_attr,
        });
        self.at += 2;
        if inline {
            self.depth += 1;
            self.scopes.push((name, self.depth));
            self.at += 1;
        }
    }

    /// A `use` item, up to its `;`. (`use<'a>` in an `impl Trait` bound is no item.)
    fn use_item(&mut self, line: usize) {
        self.pending = Pending::default();
        if self.token(self.at + 1).is_some_and(|t| t.is_punct('<')) {
            self.at += 1;
            return;
        }
        let mut trees = Vec::new();
        let end = use_tree(self.tokens, self.at + 1, &[], &mut trees);
        let scope = self.scope();
        for (segments, alias) in trees {
            self.out.refs.push(Reference {
                scope: scope.clone(),
                segments,
                line,
                alias,
            });
        }
        self.at = end;
    }

    /// `a::b::c` in code, from its first segment: recorded when it has two segments or more
    /// and does not continue another path (`x::a::b`) or a method call (`v.a::<T>()`).
    fn code_path(&mut self) {
        let start = self.at;
        let continues = start
            .checked_sub(1)
            .and_then(|i| self.token(i))
            .is_some_and(|t| t.is_path_sep() || t.is_punct('.'));
        let mut segments = Vec::new();
        let mut at = start;
        while let Some(name) = self.token(at).and_then(Token::ident) {
            segments.push(name.to_owned());
            if self.token(at + 1).is_some_and(Token::is_path_sep)
                && self.token(at + 2).and_then(Token::ident).is_some()
            {
                at += 2;
            } else {
                break;
            }
        }
        self.at = at + 1;
        if !continues && segments.len() >= 2 {
            let line = self.tokens[start].line;
            self.out.refs.push(Reference {
                scope: self.scope(),
                segments,
                line,
                alias: None,
            });
        }
    }
}

/// Whether a `cfg(...)` predicate (the tokens after `cfg`) holds only in test builds:
/// `test`, or `all(..)` with `test` among its terms. `any(test, ..)` and `not(test)` do not.
fn cfg_is_test_only(predicate: &[Token]) -> bool {
    let words: Vec<&str> = predicate.iter().filter_map(Token::ident).collect();
    match words.as_slice() {
        ["test"] => true,
        ["all", ..] => {
            // Only `test` as a direct term of `all(..)`: depth 1 inside its parentheses.
            let mut depth = 0usize;
            predicate.iter().any(|t| {
                match t.kind {
                    Kind::Punct('(') => depth += 1,
                    Kind::Punct(')') => depth = depth.saturating_sub(1),
                    _ => {}
                }
                depth == 2 && t.is_ident("test")
            })
        }
        _ => false,
    }
}

/// The index after the bracket that closes the one at `open` (`(`, `[` or `{`).
fn matching(tokens: &[Token], open: usize) -> usize {
    let mut depth = 0usize;
    for (i, token) in tokens.iter().enumerate().skip(open) {
        match token.kind {
            Kind::Punct('(' | '[' | '{') => depth += 1,
            Kind::Punct(')' | ']' | '}') => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return i + 1;
                }
            }
            _ => {}
        }
    }
    tokens.len()
}

/// The index after the item (or field, or statement) that starts at `start`: an item ends
/// with a `;` or its closing brace, a field or an arm also with a `,`; a closing bracket of
/// the enclosing block ends it too, and is left to the caller.
fn skip_item(tokens: &[Token], start: usize) -> usize {
    let mut at = start;
    // Further attributes and the visibility do not say what the item is.
    while let Some(token) = tokens.get(at) {
        if token.is_punct('#') {
            at = matching(tokens, at + 1);
        } else if token.is_ident("pub") {
            at += 1;
            if tokens.get(at).is_some_and(|t| t.is_punct('(')) {
                at = matching(tokens, at);
            }
        } else {
            break;
        }
    }
    let is_item = tokens
        .get(at)
        .and_then(Token::ident)
        .is_some_and(|word| ITEM_WORDS.contains(&word));
    let mut depth = 0usize;
    while let Some(token) = tokens.get(at) {
        match token.kind {
            Kind::Punct('(' | '[' | '{') => depth += 1,
            Kind::Punct(')' | ']' | '}') if depth == 0 => return at,
            Kind::Punct(c @ (')' | ']' | '}')) => {
                depth -= 1;
                if depth == 0 && c == '}' {
                    return at + 1;
                }
            }
            Kind::Punct(';') if depth == 0 => return at + 1,
            Kind::Punct(',') if depth == 0 && !is_item => return at + 1,
            _ => {}
        }
        at += 1;
    }
    at
}

/// Reads one use tree at `at` under `prefix`, adding each path it ends in (with the name it
/// brings in) to `out`; returns the index after it (after the `;` at the top level).
fn use_tree(
    tokens: &[Token],
    mut at: usize,
    prefix: &[String],
    out: &mut Vec<(Vec<String>, Option<String>)>,
) -> usize {
    let mut segments = prefix.to_vec();
    if tokens.get(at).is_some_and(Token::is_path_sep) {
        segments.push("::".to_owned());
        at += 1;
    }
    loop {
        let Some(token) = tokens.get(at) else {
            return at;
        };
        match &token.kind {
            Kind::Punct('{') => {
                at += 1;
                while tokens.get(at).is_some_and(|t| !t.is_punct('}')) {
                    at = use_tree(tokens, at, &segments, out);
                    if tokens.get(at).is_some_and(|t| t.is_punct(',')) {
                        at += 1;
                    }
                }
                return finish(tokens, at + 1);
            }
            Kind::Punct('*') => {
                out.push((segments, None));
                return finish(tokens, at + 1);
            }
            Kind::Ident(name) => {
                segments.push(name.clone());
                at += 1;
                if tokens.get(at).is_some_and(Token::is_path_sep) {
                    at += 1;
                    continue;
                }
                let mut alias = Some(name.clone());
                if tokens.get(at).is_some_and(|t| t.is_ident("as")) {
                    alias = tokens.get(at + 1).and_then(Token::ident).map(str::to_owned);
                    at += 2;
                }
                // `a::{self}` is `a` itself.
                if name == "self" && segments.len() > 1 {
                    segments.pop();
                    if alias.as_deref() == Some("self") {
                        alias = segments.last().cloned();
                    }
                }
                let alias = alias.filter(|a| a != "_");
                out.push((segments, alias));
                return finish(tokens, at);
            }
            _ => return finish(tokens, at),
        }
    }
}

/// After a use tree: past a `;` that ends the item, if that is what follows.
fn finish(tokens: &[Token], at: usize) -> usize {
    if tokens.get(at).is_some_and(|t| t.is_punct(';')) {
        at + 1
    } else {
        at
    }
}
