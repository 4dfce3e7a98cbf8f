//! Job files for `mgpu submit --file`: many jobs in one file, in one of two formats.
//!
//! - CSV lines, `priority,script_path,conda_env,arguments,allowed_gpus` ([`csv`]);
//! - TOML, one `[[job]]` table per job, chosen by the `.toml` extension ([`native`]).
//!
//! Parsing is pure: each job becomes a [`Draft`] (or the reason it cannot), tagged with its
//! line. What depends on the submitter (GPU count from profiles, workdir, environment) is
//! settled by `mgpu submit` (`commands/submit/spec.rs`).

pub mod csv;
pub mod draft;
pub mod native;

use std::path::Path;

pub use draft::{Draft, Entry, FileError};

/// Which parser a file gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Csv,
    Toml,
}

impl Format {
    /// `.toml` files are TOML job files; anything else is read as CSV lines.
    pub fn of(path: &Path) -> Format {
        match path.extension().and_then(|e| e.to_str()) {
            Some(ext) if ext.eq_ignore_ascii_case("toml") => Format::Toml,
            _ => Format::Csv,
        }
    }
}

/// Every job in `text`, in file order.
pub fn parse(format: Format, text: &str) -> Result<Vec<Entry>, FileError> {
    match format {
        Format::Csv => Ok(csv::parse(text)),
        Format::Toml => native::parse(text),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_format_follows_the_extension() {
        assert_eq!(Format::of(Path::new("jobs.toml")), Format::Toml);
        assert_eq!(Format::of(Path::new("jobs.TOML")), Format::Toml);
        assert_eq!(Format::of(Path::new("jobs.txt")), Format::Csv);
        assert_eq!(Format::of(Path::new("jobs.csv")), Format::Csv);
        assert_eq!(Format::of(Path::new("jobs")), Format::Csv);
    }
}
