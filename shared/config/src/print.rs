//! `--print-config`: every setting of a service with the value in effect and where it came
//! from, written as TOML, so that the output is itself a config file a person can start from.

use std::any::TypeId;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::PathBuf;

use clap::parser::ValueSource;
use clap::{Arg, ArgAction, ArgMatches, Command};

/// Where a setting's value came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// The service's built-in default.
    Default,
    /// The config file.
    File,
    /// This environment variable.
    Env(String),
    /// The command line.
    Flag,
    /// Said in words: another setting decided it (the scheduler's `placement` flag over the
    /// `[policy]` key of the same name).
    Note(String),
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Default => f.write_str("default"),
            Source::File => f.write_str("file"),
            Source::Env(variable) => write!(f, "env {variable}"),
            Source::Flag => f.write_str("flag"),
            Source::Note(note) => f.write_str(note),
        }
    }
}

/// One setting: its key, its value in effect (None: not set, no default) and its source.
#[derive(Clone, Debug, PartialEq)]
pub struct Setting {
    pub key: String,
    pub value: Option<toml::Value>,
    pub source: Source,
}

/// A section's settings (`[idle]`, `[qos.<name>]`…) as `--print-config` shows them: each key
/// with its value in force, from the file where `written` (the section as the file has it)
/// names the key, else the default.
pub fn section_settings<'a>(
    values: impl IntoIterator<Item = (&'a str, Option<toml::Value>)>,
    written: Option<&toml::Table>,
) -> Vec<Setting> {
    values
        .into_iter()
        .map(|(key, value)| Setting {
            key: key.to_owned(),
            value,
            source: match written.is_some_and(|table| table.contains_key(key)) {
                true => Source::File,
                false => Source::Default,
            },
        })
        .collect()
}

/// A service's settings: the flags' (top-level keys), then the sections the service adds.
#[derive(Clone, Debug, Default)]
pub struct Settings {
    program: String,
    /// The config file, and whether it was there to read.
    file: Option<(PathBuf, bool)>,
    top: Vec<Setting>,
    sections: Vec<(String, Vec<Setting>)>,
}

/// Value types clap parses that TOML writes as integers.
fn is_integer_type(kind: &clap::builder::ValueParser) -> bool {
    let id = kind.type_id();
    [
        TypeId::of::<u8>(),
        TypeId::of::<u16>(),
        TypeId::of::<u32>(),
        TypeId::of::<u64>(),
        TypeId::of::<usize>(),
        TypeId::of::<i8>(),
        TypeId::of::<i16>(),
        TypeId::of::<i32>(),
        TypeId::of::<i64>(),
        TypeId::of::<isize>(),
    ]
    .into_iter()
    .any(|t| id == t)
}

impl Settings {
    /// The settings of the flags that have keys (`keyed`), in the order `command` declares
    /// them, with their values in `matches`. `from_file`: ids of the flags whose default the
    /// file gave.
    pub(crate) fn collect(
        command: &Command,
        matches: &ArgMatches,
        keyed: &BTreeMap<String, &Arg>,
        from_file: &BTreeSet<String>,
        file: Option<(PathBuf, bool)>,
    ) -> Settings {
        let top = command
            .get_arguments()
            .filter_map(|arg| {
                let key = arg.get_long()?.replace('-', "_");
                keyed
                    .contains_key(&key)
                    .then(|| setting(arg, key, matches, from_file))
            })
            .collect();
        Settings {
            program: command.get_name().to_owned(),
            file,
            top,
            sections: Vec::new(),
        }
    }

    /// A top-level setting by key.
    pub fn get(&self, key: &str) -> Option<&Setting> {
        self.top.iter().find(|setting| setting.key == key)
    }

    /// Adds a section the service read itself (`[policy]`), printed after the flags.
    pub fn add_section(&mut self, name: &str, settings: Vec<Setting>) {
        self.sections.push((name.to_owned(), settings));
    }

    /// The settings as TOML, each followed by where it came from.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "# {}: the settings in effect.", self.program);
        let _ = match &self.file {
            Some((path, true)) => writeln!(out, "# Config file: {}.", path.display()),
            Some((path, false)) => {
                writeln!(out, "# Config file: {} (absent).", path.display())
            }
            None => writeln!(out, "# No config file."),
        };
        let _ = writeln!(
            out,
            "# After each value, where it came from: flag, env VARIABLE, file or default."
        );
        render_block(&mut out, &self.top);
        for (name, settings) in &self.sections {
            let _ = writeln!(out, "\n[{name}]");
            render_block(&mut out, settings);
        }
        out
    }
}

/// One flag's setting.
fn setting(arg: &Arg, key: String, matches: &ArgMatches, from_file: &BTreeSet<String>) -> Setting {
    let id = arg.get_id().as_str();
    let source = match matches.value_source(id) {
        Some(ValueSource::DefaultValue) if from_file.contains(id) => Source::File,
        Some(ValueSource::EnvVariable) => Source::Env(
            arg.get_env()
                .map(|name| name.to_string_lossy().into_owned())
                .unwrap_or_default(),
        ),
        Some(ValueSource::CommandLine) => Source::Flag,
        _ => Source::Default,
    };
    let raw: Vec<String> = matches
        .try_get_raw(id)
        .ok()
        .flatten()
        .map(|values| {
            values
                .map(|value| value.to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    let value = if matches!(arg.get_action(), ArgAction::Append) {
        Some(toml::Value::Array(
            raw.iter().map(|text| typed(arg, text)).collect(),
        ))
    } else {
        raw.first().map(|text| typed(arg, text))
    };
    Setting { key, value, source }
}

/// A flag's text as the TOML value a person would write: a switch as a boolean, a count as
/// an integer, anything else (durations, sizes, names) as a string. Only the flag's type can
/// tell: a node called `001` is a string.
fn typed(arg: &Arg, text: &str) -> toml::Value {
    let parser = arg.get_value_parser();
    let switch = matches!(arg.get_action(), ArgAction::SetTrue | ArgAction::SetFalse);
    let boolean = switch || parser.type_id() == TypeId::of::<bool>();
    if boolean && let Ok(on) = text.parse::<bool>() {
        return toml::Value::Boolean(on);
    }
    if is_integer_type(parser)
        && let Ok(n) = text.parse::<i64>()
        && n.to_string() == text
    {
        return toml::Value::Integer(n);
    }
    let float = parser.type_id() == TypeId::of::<f64>() || parser.type_id() == TypeId::of::<f32>();
    if float
        && let Ok(x) = text.parse::<f64>()
        && x.is_finite()
    {
        return toml::Value::Float(x);
    }
    toml::Value::String(text.to_owned())
}

/// `key = value  # source` lines, the comments lined up.
fn render_block(out: &mut String, settings: &[Setting]) {
    let lines: Vec<(String, Option<&Source>)> = settings
        .iter()
        .map(|setting| match &setting.value {
            Some(value) => (format!("{} = {value}", setting.key), Some(&setting.source)),
            None => (format!("# {}: not set", setting.key), None),
        })
        .collect();
    // Very long values (a list of servers) would push every comment far right: they are
    // left out of the alignment.
    let width = lines
        .iter()
        .filter(|(_, source)| source.is_some())
        .map(|(line, _)| line.chars().count())
        .filter(|width| *width <= 48)
        .max()
        .unwrap_or(0);
    for (line, source) in lines {
        let _ = match source {
            Some(source) => writeln!(out, "{line:<width$}  # {source}"),
            None => writeln!(out, "{line}"),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_written_by_their_flags_type() {
        let number = Arg::new("n")
            .long("n")
            .value_parser(clap::value_parser!(u32));
        let name = Arg::new("node").long("node");
        let share = Arg::new("s")
            .long("s")
            .value_parser(clap::value_parser!(f64));
        let switch = Arg::new("b").long("b").action(ArgAction::SetTrue);
        assert_eq!(typed(&number, "4096"), toml::Value::Integer(4096));
        assert_eq!(typed(&number, "007"), toml::Value::String("007".into()));
        assert_eq!(typed(&name, "001"), toml::Value::String("001".into()));
        assert_eq!(typed(&share, "0.8"), toml::Value::Float(0.8));
        assert_eq!(typed(&switch, "true"), toml::Value::Boolean(true));
    }

    #[test]
    fn unset_settings_are_comments_and_sections_follow() {
        let mut settings = Settings {
            program: "mgpu-test".into(),
            file: Some((PathBuf::from("/etc/mgpu/test.toml"), false)),
            top: vec![
                Setting {
                    key: "server".into(),
                    value: Some(toml::Value::String("nats://a:4222".into())),
                    source: Source::Env("MGPU_SERVER".into()),
                },
                Setting {
                    key: "ca".into(),
                    value: None,
                    source: Source::Default,
                },
            ],
            sections: Vec::new(),
        };
        settings.add_section(
            "policy",
            vec![Setting {
                key: "half_life".into(),
                value: Some(toml::Value::String("1d".into())),
                source: Source::File,
            }],
        );
        let text = settings.render();
        assert!(text.contains("(absent)"), "{text}");
        assert!(
            text.contains("server = \"nats://a:4222\"  # env MGPU_SERVER"),
            "{text}"
        );
        assert!(text.contains("# ca: not set"), "{text}");
        assert!(
            text.contains("\n[policy]\nhalf_life = \"1d\"  # file\n"),
            "{text}"
        );
        assert!(text.parse::<toml::Table>().is_ok(), "{text}");
    }
}
