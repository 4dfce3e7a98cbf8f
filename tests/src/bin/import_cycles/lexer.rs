//! Rust source as the few tokens the checker reads: identifiers, `::`, string literals (for
//! `#[path = "..."]`) and single punctuation characters, each with its line. Comments, other
//! literals and lifetimes are dropped, so a path written in a doc comment or a string is never
//! taken for a reference.

/// One token and the line it starts on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Token {
    pub kind: Kind,
    pub line: usize,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    /// An identifier or keyword (`r#type` reads as `type`).
    Ident(String),
    /// `::`
    PathSep,
    /// A string literal's contents, escapes left as written.
    Str(String),
    /// Any other single punctuation character.
    Punct(char),
}

impl Token {
    pub fn ident(&self) -> Option<&str> {
        match &self.kind {
            Kind::Ident(name) => Some(name),
            _ => None,
        }
    }

    pub fn is_ident(&self, word: &str) -> bool {
        self.ident() == Some(word)
    }

    pub fn is_punct(&self, c: char) -> bool {
        self.kind == Kind::Punct(c)
    }

    pub fn is_path_sep(&self) -> bool {
        self.kind == Kind::PathSep
    }
}

/// Splits `source` into tokens.
pub fn tokenize(source: &str) -> Vec<Token> {
    let mut lexer = Lexer {
        chars: source.chars().collect(),
        at: 0,
        line: 1,
        out: Vec::new(),
    };
    lexer.run();
    lexer.out
}

struct Lexer {
    chars: Vec<char>,
    at: usize,
    line: usize,
    out: Vec<Token>,
}

fn is_ident_start(c: char) -> bool {
    c == '_' || c.is_alphabetic()
}

fn is_ident_char(c: char) -> bool {
    c == '_' || c.is_alphanumeric()
}

impl Lexer {
    fn peek(&self, ahead: usize) -> Option<char> {
        self.chars.get(self.at + ahead).copied()
    }

    /// Moves on one character, counting lines.
    fn bump(&mut self) -> Option<char> {
        let c = self.peek(0)?;
        self.at += 1;
        if c == '\n' {
            self.line += 1;
        }
        Some(c)
    }

    fn push(&mut self, kind: Kind, line: usize) {
        self.out.push(Token { kind, line });
    }

    fn run(&mut self) {
        while let Some(c) = self.peek(0) {
            let line = self.line;
            match c {
                c if c.is_whitespace() => {
                    self.bump();
                }
                '/' if self.peek(1) == Some('/') => self.skip_line(),
                '/' if self.peek(1) == Some('*') => self.skip_block_comment(),
                '"' => {
                    let text = self.quoted();
                    self.push(Kind::Str(text), line);
                }
                '\'' => self.quote_or_lifetime(),
                ':' if self.peek(1) == Some(':') => {
                    self.at += 2;
                    self.push(Kind::PathSep, line);
                }
                c if c.is_ascii_digit() => self.skip_number(),
                c if is_ident_start(c) => self.word(),
                c => {
                    self.bump();
                    self.push(Kind::Punct(c), line);
                }
            }
        }
    }

    fn skip_line(&mut self) {
        while let Some(c) = self.peek(0) {
            if c == '\n' {
                break;
            }
            self.bump();
        }
    }

    /// Block comments nest in Rust.
    fn skip_block_comment(&mut self) {
        let mut depth = 0usize;
        while let Some(c) = self.peek(0) {
            if c == '/' && self.peek(1) == Some('*') {
                self.at += 2;
                depth += 1;
            } else if c == '*' && self.peek(1) == Some('/') {
                self.at += 2;
                depth -= 1;
                if depth == 0 {
                    return;
                }
            } else {
                self.bump();
            }
        }
    }

    /// A `"..."` literal from its opening quote; returns its contents.
    fn quoted(&mut self) -> String {
        self.bump();
        let mut text = String::new();
        while let Some(c) = self.bump() {
            match c {
                '\\' => {
                    text.push(c);
                    if let Some(escaped) = self.bump() {
                        text.push(escaped);
                    }
                }
                '"' => break,
                c => text.push(c),
            }
        }
        text
    }

    /// A raw string from its `r`: `r"..."`, `r#"..."#` and so on.
    fn raw_string(&mut self) -> String {
        self.bump();
        let mut hashes = 0;
        while self.peek(0) == Some('#') {
            self.bump();
            hashes += 1;
        }
        self.bump();
        let mut text = String::new();
        while let Some(c) = self.bump() {
            if c == '"' && (0..hashes).all(|i| self.peek(i) == Some('#')) {
                self.at += hashes;
                break;
            }
            text.push(c);
        }
        text
    }

    /// `'x'`, `'\n'` and `'\u{..}'` are characters; `'a` is a lifetime or a label. Neither
    /// names a module, so both are dropped.
    fn quote_or_lifetime(&mut self) {
        self.bump();
        if self.peek(0) == Some('\\') {
            // The backslash and the character it escapes, then up to the closing quote
            // (`'\u{1F600}'` has more before it).
            self.at += 2;
            while let Some(c) = self.bump() {
                if c == '\'' {
                    break;
                }
            }
        } else if self.peek(1) == Some('\'') {
            self.at += 2;
        } else {
            while self.peek(0).is_some_and(is_ident_char) {
                self.bump();
            }
        }
    }

    /// Digits, suffixes and a fraction; `1..2` keeps its range dots.
    fn skip_number(&mut self) {
        while let Some(c) = self.peek(0) {
            let fraction = c == '.' && self.peek(1).is_some_and(|n| n.is_ascii_digit());
            if !(is_ident_char(c) || fraction) {
                break;
            }
            self.bump();
        }
    }

    /// An identifier, or a literal that starts like one (`r"…"`, `b"…"`, `br#"…"#`, `b'x'`).
    fn word(&mut self) {
        let line = self.line;
        let start = self.at;
        while self.peek(0).is_some_and(is_ident_char) {
            self.bump();
        }
        let word: String = self.chars[start..self.at].iter().collect();
        let next = self.peek(0);
        let raw_prefix = matches!(word.as_str(), "r" | "br" | "cr");
        if raw_prefix && (next == Some('"') || (next == Some('#') && self.raw_string_ahead())) {
            self.at -= 1;
            let text = self.raw_string();
            self.push(Kind::Str(text), line);
        } else if word == "r" && next == Some('#') {
            // A raw identifier: `r#type` is the identifier `type`.
            self.bump();
            let start = self.at;
            while self.peek(0).is_some_and(is_ident_char) {
                self.bump();
            }
            let name: String = self.chars[start..self.at].iter().collect();
            self.push(Kind::Ident(name), line);
        } else if matches!(word.as_str(), "b" | "c") && next == Some('"') {
            let text = self.quoted();
            self.push(Kind::Str(text), line);
        } else if word == "b" && next == Some('\'') {
            self.quote_or_lifetime();
        } else {
            self.push(Kind::Ident(word), line);
        }
    }

    /// After `r`: `#`s then a quote (a raw string), not `#ident` (a raw identifier).
    fn raw_string_ahead(&self) -> bool {
        let mut i = 0;
        while self.peek(i) == Some('#') {
            i += 1;
        }
        self.peek(i) == Some('"')
    }
}
