//! GPU types and node features, as jobs ask for them and agents report them.
//!
//! A GPU type is a short lower-case name (`h100`, `a100-80gb`, `rtx-4090`): letters, digits
//! and dashes. A job lists the types it takes, preferred first (`--gpu-type h100,a100-80gb`).
//! A node's features are names of the same form (`ib`, `nvlink`); a job selects nodes with a
//! constraint over them (`--constraint 'ib&nvlink'`, `'ib|roce'`, parentheses to group; `&`
//! binds tighter than `|`, as Slurm's `--constraint` reads).

use std::fmt;

use crate::error::InvalidInput;

/// Longest type or feature name accepted.
const MAX_NAME: usize = 40;
/// Most types a job may list, and most terms a constraint may have.
pub const MAX_TYPES: usize = 16;
const MAX_TERMS: usize = 32;

/// Checks a type or feature name: lower-case letters, digits and dashes, not starting with
/// a dash. `what` names it in the error ("GPU type", "feature").
pub fn check_name(name: &str, what: &str) -> Result<(), InvalidInput> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME
        && !name.starts_with('-')
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(InvalidInput::new(format!(
            "{what} `{name}` is not a name: use lower-case letters, digits and dashes (e.g. \
             h100, a100-80gb, rtx-4090), at most {MAX_NAME} characters"
        )))
    }
}

/// Parses a comma-separated list of GPU types, preferred first (`h100,a100-80gb`).
pub fn parse_types(text: &str) -> Result<Vec<String>, InvalidInput> {
    let mut types: Vec<String> = Vec::new();
    for name in text.split(',').map(str::trim) {
        let name = name.to_ascii_lowercase();
        check_name(&name, "GPU type")?;
        if !types.contains(&name) {
            types.push(name);
        }
    }
    if types.len() > MAX_TYPES {
        return Err(InvalidInput::new(format!(
            "at most {MAX_TYPES} GPU types may be listed"
        )));
    }
    Ok(types)
}

/// A node selection over features: `ib&nvlink`, `ib|roce`, `(ib|roce)&nvlink`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Constraint {
    Feature(String),
    All(Vec<Constraint>),
    Any(Vec<Constraint>),
}

impl Constraint {
    /// Parses a constraint; the error says where it went wrong.
    pub fn parse(text: &str) -> Result<Constraint, InvalidInput> {
        let tokens = tokenize(text)?;
        if tokens
            .iter()
            .filter(|t| matches!(t, Token::Name(_)))
            .count()
            > MAX_TERMS
        {
            return Err(InvalidInput::new(format!(
                "constraint `{text}` has more than {MAX_TERMS} features"
            )));
        }
        let mut parser = Parser {
            tokens: &tokens,
            at: 0,
            text,
        };
        let constraint = parser.any()?;
        if parser.at != tokens.len() {
            return Err(parser.error("an operator (& or |) or the end"));
        }
        Ok(constraint)
    }

    /// Whether a node with `features` satisfies it.
    pub fn holds_for(&self, features: &[String]) -> bool {
        match self {
            Constraint::Feature(name) => features.iter().any(|f| f == name),
            Constraint::All(parts) => parts.iter().all(|p| p.holds_for(features)),
            Constraint::Any(parts) => parts.iter().any(|p| p.holds_for(features)),
        }
    }

    /// Every feature it names, each once, in order of appearance.
    pub fn features(&self) -> Vec<&str> {
        let mut names = Vec::new();
        self.collect(&mut names);
        names
    }

    fn collect<'a>(&'a self, names: &mut Vec<&'a str>) {
        match self {
            Constraint::Feature(name) => {
                if !names.contains(&name.as_str()) {
                    names.push(name);
                }
            }
            Constraint::All(parts) | Constraint::Any(parts) => {
                parts.iter().for_each(|p| p.collect(names));
            }
        }
    }
}

/// The canonical form: `&` and `|` without spaces, parentheses only where needed.
impl fmt::Display for Constraint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Constraint::Feature(name) => f.write_str(name),
            Constraint::All(parts) => {
                for (i, part) in parts.iter().enumerate() {
                    if i > 0 {
                        f.write_str("&")?;
                    }
                    match part {
                        Constraint::Any(_) => write!(f, "({part})")?,
                        _ => write!(f, "{part}")?,
                    }
                }
                Ok(())
            }
            Constraint::Any(parts) => {
                for (i, part) in parts.iter().enumerate() {
                    if i > 0 {
                        f.write_str("|")?;
                    }
                    write!(f, "{part}")?;
                }
                Ok(())
            }
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
enum Token {
    Name(String),
    And,
    Or,
    Open,
    Close,
}

fn tokenize(text: &str) -> Result<Vec<Token>, InvalidInput> {
    let mut tokens = Vec::new();
    let mut chars = text.chars().peekable();
    while let Some(&c) = chars.peek() {
        match c {
            ' ' | '\t' => {
                chars.next();
            }
            '&' | ',' => {
                chars.next();
                tokens.push(Token::And);
            }
            '|' => {
                chars.next();
                tokens.push(Token::Or);
            }
            '(' => {
                chars.next();
                tokens.push(Token::Open);
            }
            ')' => {
                chars.next();
                tokens.push(Token::Close);
            }
            _ => {
                let mut name = String::new();
                while let Some(&c) = chars.peek() {
                    if matches!(c, ' ' | '\t' | '&' | ',' | '|' | '(' | ')') {
                        break;
                    }
                    name.push(c.to_ascii_lowercase());
                    chars.next();
                }
                check_name(&name, "feature")?;
                tokens.push(Token::Name(name));
            }
        }
    }
    if tokens.is_empty() {
        return Err(InvalidInput::new(
            "empty constraint: name node features joined by & (all) or | (any), e.g. ib&nvlink",
        ));
    }
    Ok(tokens)
}

struct Parser<'a> {
    tokens: &'a [Token],
    at: usize,
    text: &'a str,
}

impl Parser<'_> {
    fn error(&self, expected: &str) -> InvalidInput {
        InvalidInput::new(format!(
            "constraint `{}`: expected {expected} at term {}",
            self.text,
            self.at + 1
        ))
    }

    fn any(&mut self) -> Result<Constraint, InvalidInput> {
        let mut parts = vec![self.all()?];
        while self.tokens.get(self.at) == Some(&Token::Or) {
            self.at += 1;
            parts.push(self.all()?);
        }
        Ok(one_or(parts, Constraint::Any))
    }

    fn all(&mut self) -> Result<Constraint, InvalidInput> {
        let mut parts = vec![self.term()?];
        while self.tokens.get(self.at) == Some(&Token::And) {
            self.at += 1;
            parts.push(self.term()?);
        }
        Ok(one_or(parts, Constraint::All))
    }

    fn term(&mut self) -> Result<Constraint, InvalidInput> {
        match self.tokens.get(self.at) {
            Some(Token::Name(name)) => {
                self.at += 1;
                Ok(Constraint::Feature(name.clone()))
            }
            Some(Token::Open) => {
                self.at += 1;
                let inner = self.any()?;
                if self.tokens.get(self.at) != Some(&Token::Close) {
                    return Err(self.error("a closing parenthesis"));
                }
                self.at += 1;
                Ok(inner)
            }
            _ => Err(self.error("a feature name or an opening parenthesis")),
        }
    }
}

fn one_or(mut parts: Vec<Constraint>, many: fn(Vec<Constraint>) -> Constraint) -> Constraint {
    if parts.len() == 1 {
        parts.remove(0)
    } else {
        many(parts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn features(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| (*n).to_owned()).collect()
    }

    #[test]
    fn and_binds_tighter_than_or() {
        let c = Constraint::parse("ib | roce & nvlink").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.to_string(), "ib|roce&nvlink");
        assert!(c.holds_for(&features(&["ib"])));
        assert!(!c.holds_for(&features(&["roce"])));
        assert!(c.holds_for(&features(&["roce", "nvlink"])));
        let grouped = Constraint::parse("(ib|roce)&nvlink").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(grouped.to_string(), "(ib|roce)&nvlink");
        assert!(!grouped.holds_for(&features(&["ib"])));
        assert!(grouped.holds_for(&features(&["ib", "nvlink"])));
        assert_eq!(grouped.features(), vec!["ib", "roce", "nvlink"]);
    }

    #[test]
    fn bad_constraints_say_what_is_wrong() {
        for (text, says) in [
            ("", "empty constraint"),
            ("ib&", "expected a feature name"),
            ("(ib|roce", "closing parenthesis"),
            ("ib nvlink", "an operator"),
            ("IB_x", "is not a name"),
        ] {
            let err = Constraint::parse(text).err().map(|e| e.to_string());
            assert!(
                err.as_deref().is_some_and(|e| e.contains(says)),
                "{text:?}: {err:?}"
            );
        }
    }

    #[test]
    fn types_are_lower_case_names_listed_once_in_order() {
        assert_eq!(
            parse_types("H100, a100-80gb,h100").ok(),
            Some(vec!["h100".to_owned(), "a100-80gb".to_owned()])
        );
        assert!(parse_types("h100,,a100").is_err());
        assert!(parse_types("rtx 4090").is_err());
    }
}
