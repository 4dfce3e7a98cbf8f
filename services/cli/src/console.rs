//! What `mgpu` itself writes to its stdout and stderr: text, lines, JSON for scripts, and
//! notes on stderr. A closed pipe comes back as an error (stdout) or is ignored (stderr),
//! never a panic as `print!` would raise.

use std::io::Write as _;

use anyhow::Result;
use serde::Serialize;

/// Writes text to stdout and flushes.
pub fn print(text: &str) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())?;
    out.flush()
}

/// Writes one line to stdout.
pub fn println(text: &str) -> std::io::Result<()> {
    print(&format!("{text}\n"))
}

/// Writes a value as pretty JSON on stdout, for scripts.
pub fn print_json(value: &impl Serialize) -> Result<()> {
    let text = serde_json::to_string_pretty(value)?;
    println(&text)?;
    Ok(())
}

/// Writes one line to stderr. A closed stderr is not worth failing (or panicking) over.
pub fn stderr_line(text: &str) {
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "{text}");
    let _ = err.flush();
}
