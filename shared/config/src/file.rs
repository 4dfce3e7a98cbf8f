//! The config file under the flags: finding it (`--config`), reading it, turning its keys
//! into the defaults of the flags they name, and parsing the command line over them.
//!
//! Giving the file's values to clap as defaults (rather than, say, as extra arguments) is what
//! makes the order right without any code of ours: clap takes a flag from the command line,
//! else from its environment variable, else its default; and a repeated flag given on the
//! command line replaces the file's list instead of adding to it.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use clap::builder::Resettable;
use clap::parser::ValueSource;
use clap::{Arg, ArgAction, Command, Parser};

use crate::print::Settings;

/// The id of the flag naming the config file: each service's `--config FILE`, whose default
/// is the service's file under `/etc/mgpu`.
pub const CONFIG_ARG: &str = "config";

/// Flags that are never keys: they pick the file, or ask clap for something.
const NEVER_KEYS: [&str; 3] = [CONFIG_ARG, "help", "version"];

/// What a service tells this crate about its file beyond what its flags say.
#[derive(Clone, Copy, Debug, Default)]
pub struct Service {
    /// Ids of flags that are actions, not settings, and so have no key (`print_config`,
    /// `print_gpus`): a file that set one would make every start do that action.
    pub command_line_only: &'static [&'static str],
    /// Tables the service reads itself: `policy` for `[policy]`.
    pub sections: &'static [&'static str],
    /// The format from before sections, still read.
    pub legacy: Option<Legacy>,
}

/// An older file format: a file whose top-level keys are all among `keys` (and none a table)
/// is read as if it were section `section` alone. The scheduler's policy file was such a file.
#[derive(Clone, Copy, Debug)]
pub struct Legacy {
    pub section: &'static str,
    pub keys: &'static [&'static str],
}

/// A service's settings once its file, environment and flags are merged.
#[derive(Debug)]
pub struct Loaded<A> {
    pub args: A,
    /// The config file read (None: none named, or the default one is absent).
    pub file: Option<PathBuf>,
    /// The sections of the file that the service reads itself, by name (a table each).
    pub sections: toml::Table,
    /// Every setting, its value and where it came from, for `--print-config`.
    pub settings: Settings,
}

/// Why the settings could not be had.
#[derive(Debug)]
pub enum Error {
    /// The command line (or `--help`, `--version`): clap prints and exits with it.
    Clap(clap::Error),
    /// The config file: unreadable, not TOML, an unknown key, or a value its flag refuses.
    File(String),
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Clap(err) => write!(f, "{err}"),
            Error::File(message) => f.write_str(message),
        }
    }
}

impl std::error::Error for Error {}

/// [`load_from`] on this process's arguments; on an error it says why and exits as clap does
/// for a bad command line (status 2; 0 for `--help` and `--version`).
pub fn load_or_exit<A: Parser>(service: &Service) -> Loaded<A> {
    match load_from(service, std::env::args_os()) {
        Ok(loaded) => loaded,
        Err(Error::Clap(err)) => err.exit(),
        Err(Error::File(message)) => {
            eprintln!("error: {message}");
            std::process::exit(2)
        }
    }
}

/// The settings of a service whose flags are `A`, from `argv` (the program name first), the
/// environment and the config file `--config` names.
pub fn load_from<A, I, T>(service: &Service, argv: I) -> Result<Loaded<A>, Error>
where
    A: Parser,
    I: IntoIterator<Item = T>,
    T: Into<OsString>,
{
    let argv: Vec<OsString> = argv.into_iter().map(Into::into).collect();
    let command = A::command();
    // Kept for the order of the settings: a flag given a default below moves to the end.
    let original = command.clone();
    let mut location = locate(&command, &argv)?;
    let table = match location.as_mut() {
        Some(location) => read(location)?,
        None => None,
    };
    let path = location.as_ref().map(|l| l.path.as_path());
    let (values, sections) = match (table, path) {
        (Some(table), Some(path)) => split(service, &command, path, table)?,
        _ => (BTreeMap::new(), toml::Table::new()),
    };
    let mut command = with_file_defaults(command, &values);
    let mut matches = command
        .try_get_matches_from_mut(&argv)
        .map_err(Error::Clap)?;
    let from_file: BTreeSet<String> = values.keys().cloned().collect();
    let file = location.as_ref().filter(|l| l.read).map(|l| l.path.clone());
    let settings = Settings::collect(
        &original,
        &matches,
        &keyed_args(&original, service),
        &from_file,
        location.map(|l| (l.path, l.read)),
    );
    let args = A::from_arg_matches_mut(&mut matches)
        .map_err(|err| Error::Clap(err.format(&mut command)))?;
    Ok(Loaded {
        args,
        file,
        sections,
        settings,
    })
}

/// Where the config file is, and whether it was asked for by name.
struct Location {
    path: PathBuf,
    /// Named on the command line or in the environment: then it must exist.
    explicit: bool,
    /// Set once the file was found and read.
    read: bool,
}

/// The file `--config` (or its variable, or its default) names; None when the flag has no
/// value, or for `--help` and `--version`, which the real parse answers.
fn locate(command: &Command, argv: &[OsString]) -> Result<Option<Location>, Error> {
    // A first reading that ignores every error (a required flag the file will give, a value
    // clap will refuse in the real parse): it only looks for the config flag.
    let Ok(first) = command
        .clone()
        .ignore_errors(true)
        .try_get_matches_from(argv)
    else {
        return Ok(None);
    };
    let raw = first
        .try_get_raw(CONFIG_ARG)
        .map_err(|err| Error::File(format!("internal: no --{CONFIG_ARG} flag: {err}")))?;
    let Some(path) = raw.and_then(|mut values| values.next()) else {
        return Ok(None);
    };
    let explicit = matches!(
        first.value_source(CONFIG_ARG),
        Some(ValueSource::CommandLine | ValueSource::EnvVariable)
    );
    Ok(Some(Location {
        path: PathBuf::from(path),
        explicit,
        read: false,
    }))
}

/// The file's table; None when the default file is absent (a host set up by flags alone).
fn read(location: &mut Location) -> Result<Option<toml::Table>, Error> {
    let path = &location.path;
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound && !location.explicit => {
            return Ok(None);
        }
        Err(err) => {
            return Err(Error::File(format!(
                "cannot read the config file {}: {err}",
                path.display()
            )));
        }
    };
    let table = text
        .parse::<toml::Table>()
        .map_err(|err| Error::File(format!("config file {}: {err}", path.display())))?;
    location.read = true;
    Ok(Some(table))
}

/// The flags that have keys, by key: every long flag but the config flag, help, version and
/// the service's actions.
pub(crate) fn keyed_args<'a>(command: &'a Command, service: &Service) -> BTreeMap<String, &'a Arg> {
    command
        .get_arguments()
        .filter(|arg| !arg.is_positional())
        .filter(|arg| {
            let id = arg.get_id().as_str();
            !NEVER_KEYS.contains(&id) && !service.command_line_only.contains(&id)
        })
        .filter_map(|arg| Some((key_of(arg.get_long()?), arg)))
        .collect()
}

/// A flag's key: `--heartbeat-interval` is `heartbeat_interval`.
fn key_of(long: &str) -> String {
    long.replace('-', "_")
}

/// The file's values for flags, as clap would read them, by flag id; and the service's
/// sections.
fn split(
    service: &Service,
    command: &Command,
    path: &Path,
    table: toml::Table,
) -> Result<(BTreeMap<String, Vec<String>>, toml::Table), Error> {
    if let Some(legacy) = service.legacy.filter(|legacy| is_legacy(&table, legacy)) {
        let mut sections = toml::Table::new();
        sections.insert(legacy.section.to_owned(), toml::Value::Table(table));
        return Ok((BTreeMap::new(), sections));
    }
    let keyed = keyed_args(command, service);
    let mut values = BTreeMap::new();
    let mut sections = toml::Table::new();
    for (key, value) in table {
        if service.sections.contains(&key.as_str()) {
            if !value.is_table() {
                return Err(Error::File(format!(
                    "config file {}: `{key}` is a section: write it as [{key}]",
                    path.display()
                )));
            }
            sections.insert(key, value);
            continue;
        }
        let Some(arg) = keyed.get(&key) else {
            return Err(Error::File(unknown_key(
                service, command, path, &key, &value,
            )));
        };
        let texts = texts_of(arg, &value)
            .map_err(|why| Error::File(format!("config file {}: {key}: {why}", path.display())))?;
        values.insert(arg.get_id().as_str().to_owned(), texts);
    }
    Ok((values, sections))
}

/// Whether a file is in the legacy format: not empty, and its keys all the legacy section's.
fn is_legacy(table: &toml::Table, legacy: &Legacy) -> bool {
    !table.is_empty()
        && table
            .iter()
            .all(|(key, value)| legacy.keys.contains(&key.as_str()) && !value.is_table())
}

/// Why a key is refused, and what the person may have meant.
fn unknown_key(
    service: &Service,
    command: &Command,
    path: &Path,
    key: &str,
    value: &toml::Value,
) -> String {
    let file = path.display();
    let program = command.get_name();
    let dashed = key.replace('_', "-");
    let is_action = command
        .get_arguments()
        .any(|arg| arg.get_long() == Some(dashed.as_str()));
    if is_action {
        return format!(
            "config file {file}: `{key}` cannot be set in a config file, only as --{dashed}"
        );
    }
    if let Some(legacy) = service.legacy.filter(|l| l.keys.contains(&key)) {
        return format!(
            "config file {file}: `{key}` is a {0} key: put it under [{0}]",
            legacy.section
        );
    }
    if value.is_table() {
        let known: Vec<String> = service.sections.iter().map(|s| format!("[{s}]")).collect();
        let known = match known.is_empty() {
            true => format!("{program} reads no sections"),
            false => format!("{program} reads {}", known.join(", ")),
        };
        return format!("config file {file}: unknown section [{key}] ({known})");
    }
    let keys = keyed_args(command, service);
    let hint = match closest(key, keys.keys().map(String::as_str)) {
        Some(near) => format!("did you mean `{near}`? "),
        None => String::new(),
    };
    format!(
        "config file {file}: unknown key `{key}` ({hint}the keys are the long flags of \
         `{program} --help`, with `_` for `-`)"
    )
}

/// The known key nearest to a misspelt one, when it is near enough to be a typo.
fn closest<'a>(key: &str, known: impl Iterator<Item = &'a str>) -> Option<&'a str> {
    known
        .map(|candidate| (edit_distance(key, candidate), candidate))
        .filter(|(distance, _)| *distance <= 2.max(key.len() / 4))
        .min()
        .map(|(_, candidate)| candidate)
}

/// Levenshtein distance, by characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut current = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let replace = previous[j] + usize::from(ca != *cb);
            current.push(replace.min(previous[j + 1] + 1).min(current[j] + 1));
        }
        previous = current;
    }
    previous[b.len()]
}

/// A key's value as the command-line text(s) of its flag, each checked by the flag's own
/// parser so that a bad value is reported against the file, not a flag nobody typed.
fn texts_of(arg: &Arg, value: &toml::Value) -> Result<Vec<String>, String> {
    let switch = matches!(arg.get_action(), ArgAction::SetTrue | ArgAction::SetFalse);
    let repeatable = matches!(arg.get_action(), ArgAction::Append);
    let texts = match value {
        toml::Value::Boolean(on) => vec![on.to_string()],
        _ if switch => return Err(format!("is a switch: write true or false, not {value}")),
        toml::Value::Array(items) if repeatable => {
            items.iter().map(scalar_text).collect::<Result<_, _>>()?
        }
        toml::Value::Array(_) => return Err("takes one value, not a list".into()),
        other => vec![scalar_text(other)?],
    };
    if !switch {
        for text in &texts {
            check_value(arg, text)?;
        }
    }
    Ok(texts)
}

/// A single value as text: strings as they are, numbers and dates as written.
fn scalar_text(value: &toml::Value) -> Result<String, String> {
    match value {
        toml::Value::String(text) => Ok(text.clone()),
        toml::Value::Integer(n) => Ok(n.to_string()),
        toml::Value::Float(x) => Ok(x.to_string()),
        toml::Value::Boolean(on) => Ok(on.to_string()),
        toml::Value::Datetime(when) => Ok(when.to_string()),
        toml::Value::Array(_) => Err("a list inside a list".into()),
        toml::Value::Table(_) => Err("takes a value, not a table".into()),
    }
}

/// Runs `text` through the flag's value parser, alone (its requirements and conflicts are
/// the real parse's business).
fn check_value(arg: &Arg, text: &str) -> Result<(), String> {
    let probe = Arg::new("value")
        .long("value")
        .action(ArgAction::Set)
        .value_parser(arg.get_value_parser().clone());
    let parsed = Command::new("check")
        .no_binary_name(true)
        .arg(probe)
        .try_get_matches_from([format!("--value={text}")]);
    let Err(err) = parsed else {
        return Ok(());
    };
    // A parser of ours says why in its own words (the error's source); clap's own parsers
    // (numbers, choices) do not.
    if let Some(why) = std::error::Error::source(&err) {
        return Err(format!("`{text}`: {why}"));
    }
    let choices: Vec<String> = arg
        .get_possible_values()
        .iter()
        .map(|choice| choice.get_name().to_owned())
        .collect();
    if choices.is_empty() {
        Err(format!("`{text}`: {}", err.kind()))
    } else {
        Err(format!("`{text}` is not one of {}", choices.join(", ")))
    }
}

/// The command with the file's values as its flags' defaults. A required flag the file gives
/// is no longer required: clap counts only explicit values against a requirement.
fn with_file_defaults(command: Command, values: &BTreeMap<String, Vec<String>>) -> Command {
    values.iter().fold(command, |command, (id, texts)| {
        command.mut_arg(id, |arg| {
            arg.default_values(
                texts
                    .iter()
                    .map(|text| clap::builder::OsStr::from(clap::builder::Str::from(text.clone()))),
            )
            .required(false)
            .required_unless_present(Resettable::Reset)
        })
    })
}

#[cfg(test)]
#[path = "file_tests.rs"]
mod tests;
