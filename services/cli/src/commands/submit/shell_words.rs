//! Splitting a line into words as a POSIX shell would, without expanding anything: for the
//! `#MGPU` directives of a batch script (`#MGPU --name "bert large" --time-limit 2h`).
//!
//! Blanks separate words; single quotes keep everything up to the next one; double quotes
//! keep everything but `\"`, `\\`, `\$` and `` \` ``, which lose their backslash; a backslash
//! outside quotes keeps the next character; a `#` starting a word starts a comment. Nothing
//! is expanded (`$HOME` stays as written): a directive is read at submit, not by a shell.

/// The words of `line`, or what is wrong with it (an unclosed quote, a trailing backslash).
pub fn split(line: &str) -> Result<Vec<String>, String> {
    let mut words = Vec::new();
    let mut word = String::new();
    // Whether a word is under way: `''` is a word, though empty.
    let mut in_word = false;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            ' ' | '\t' | '\n' | '\r' => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            '#' if !in_word => break,
            '\'' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(c) => word.push(c),
                        None => return Err("a single quote (') is not closed".to_owned()),
                    }
                }
            }
            '"' => {
                in_word = true;
                double_quoted(&mut chars, &mut word)?;
            }
            '\\' => {
                in_word = true;
                match chars.next() {
                    Some(next) => word.push(next),
                    None => return Err("the line ends with a backslash".to_owned()),
                }
            }
            other => {
                in_word = true;
                word.push(other);
            }
        }
    }
    if in_word {
        words.push(word);
    }
    Ok(words)
}

/// Reads up to the closing double quote into `word`.
fn double_quoted(chars: &mut std::str::Chars<'_>, word: &mut String) -> Result<(), String> {
    loop {
        match chars.next() {
            Some('"') => return Ok(()),
            Some('\\') => match chars.next() {
                Some(next @ ('"' | '\\' | '$' | '`')) => word.push(next),
                Some(other) => {
                    word.push('\\');
                    word.push(other);
                }
                None => break,
            },
            Some(c) => word.push(c),
            None => break,
        }
    }
    Err("a double quote (\") is not closed".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(line: &str) -> Vec<String> {
        split(line).unwrap_or_else(|e| panic!("{line:?}: {e}"))
    }

    #[test]
    fn blanks_separate_words() {
        assert_eq!(
            words("--gpus 2  --time-limit\t2h"),
            ["--gpus", "2", "--time-limit", "2h"]
        );
        assert_eq!(words("   "), Vec::<String>::new());
        assert_eq!(words(""), Vec::<String>::new());
    }

    #[test]
    fn quotes_keep_blanks_and_nothing_is_expanded() {
        assert_eq!(words(r#"--name "bert large""#), ["--name", "bert large"]);
        assert_eq!(words("--name 'it''s'"), ["--name", "its"]);
        assert_eq!(
            words(r#"--env-setup-cmd 'source $HOME/venv/bin/activate'"#),
            ["--env-setup-cmd", "source $HOME/venv/bin/activate"]
        );
        assert_eq!(words(r#"a"b c"d"#), ["ab cd"]);
        assert_eq!(words("''"), [""]);
        assert_eq!(words(r#""""#), [""]);
    }

    #[test]
    fn backslashes_escape_as_in_a_shell() {
        assert_eq!(words(r"bert\ large"), ["bert large"]);
        assert_eq!(words(r#""say \"hi\" \$x \n""#), [r#"say "hi" $x \n"#]);
        assert_eq!(words(r"'a\b'"), [r"a\b"]);
    }

    #[test]
    fn a_hash_starting_a_word_starts_a_comment() {
        assert_eq!(words("--gpus 2 # two is enough"), ["--gpus", "2"]);
        assert_eq!(words("--name a#b"), ["--name", "a#b"]);
        assert_eq!(words("--name '#x'"), ["--name", "#x"]);
    }

    #[test]
    fn unclosed_quotes_are_named() {
        assert_eq!(
            split("--name 'bert").err().as_deref(),
            Some("a single quote (') is not closed")
        );
        assert_eq!(
            split(r#"--name "bert"#).err().as_deref(),
            Some("a double quote (\") is not closed")
        );
        assert_eq!(
            split(r"--name bert\").err().as_deref(),
            Some("the line ends with a backslash")
        );
    }
}
