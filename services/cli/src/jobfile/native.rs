//! The TOML job format: one `[[job]]` table per job.
//!
//! ```toml
//! [[job]]
//! command = "python train.py --cuda {gpus}"   # a shell line, or ["python", "train.py"]
//! name = "train"
//! gpus = 2                                    # or 0.5; default from --llm / profiles, else 1
//! gpu_ids = "0-1"                             # or [0, 1]: exactly these GPUs
//! allowed_gpus = [4, 5, 6, 7]                 # any of these GPUs
//! mem = "24GiB"                               # or MiB as a number
//! cpus = 8                                    # as --cpus
//! mem_host = "64GiB"                          # as --mem-host
//! priority = 5                                # higher first, like --priority
//! time_limit = "2h"
//! on_timeout = "fail"                         # or "requeue" (the default)
//! conda = "pytorch_env"
//! env_setup_cmd = "source venv/bin/activate"
//! workdir = "/data/project"
//! dedup = true                                # the default in job files
//! profile = "qwen2.5-7b-inst"                 # like --profile
//! no_requeue = true                           # like --no-requeue
//! gpu_type = "h100,a100-80gb"                 # or a list: like --gpu-type
//! constraint = "ib&nvlink"                    # like --constraint
//! qos = "scavenger"                           # like --qos
//! signal = "USR1@300"                         # like --signal
//! idle_ok = true                              # like --idle-ok
//! reservation = "deadline"                    # like --reservation
//! ```
//!
//! Each value is checked with the command line's own parsers, so a mistake reads the same as
//! it would on the command line, prefixed with the job's number and the line it is on.

use std::collections::BTreeMap;

use mgpu_protocol::duration::parse_duration;
use mgpu_protocol::gpu_amount::GpuAmount;
use mgpu_protocol::job::OnTimeout;
use mgpu_protocol::stop::StopSignal;
use serde::Deserialize;
use toml::{Spanned, Value};

use super::draft::{Draft, Entry, FileError};
use crate::parse;

/// Every key a `[[job]]` table may hold.
const KEYS: [&str; 23] = [
    "command",
    "name",
    "gpus",
    "gpu_ids",
    "allowed_gpus",
    "mem",
    "cpus",
    "mem_host",
    "priority",
    "time_limit",
    "on_timeout",
    "conda",
    "env_setup_cmd",
    "workdir",
    "dedup",
    "profile",
    "no_requeue",
    "gpu_type",
    "constraint",
    "qos",
    "signal",
    "idle_ok",
    "reservation",
];

type Table = BTreeMap<Spanned<String>, Spanned<Value>>;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    job: Vec<Spanned<Table>>,
}

/// Every `[[job]]` of the file. A syntax error (or a top-level key other than `job`) makes the
/// whole file unusable; a bad job only makes that job unusable.
pub fn parse(text: &str) -> Result<Vec<Entry>, FileError> {
    let file: File = toml::from_str(text).map_err(|err| FileError {
        line: err.span().map(|s| line_of(text, s.start)).unwrap_or(1),
        message: err.message().to_owned(),
    })?;
    Ok(file
        .job
        .iter()
        .enumerate()
        .map(|(index, table)| {
            let number = index + 1;
            match job(table.get_ref()) {
                Ok(draft) => Entry {
                    line: line_of(text, table.span().start),
                    draft: Ok(draft),
                },
                Err((at, message)) => Entry {
                    line: line_of(text, at.unwrap_or(table.span().start)),
                    draft: Err(format!("job {number}: {message}")),
                },
            }
        })
        .collect())
}

/// 1-based line of a byte offset.
fn line_of(text: &str, offset: usize) -> usize {
    let end = offset.min(text.len());
    text.as_bytes()[..end]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

/// A problem and where it is (byte offset), when a key or value is to blame.
type Problem = (Option<usize>, String);

/// One `[[job]]` table's keys, read with their positions so a problem points at its value.
struct JobTable<'a>(&'a Table);

impl JobTable<'_> {
    fn get(&self, key: &str) -> Option<&Spanned<Value>> {
        self.0
            .iter()
            .find(|(k, _)| k.get_ref() == key)
            .map(|(_, v)| v)
    }

    /// The key's value converted by `convert` (which names the key in its messages); None
    /// when the key is absent.
    fn read<T>(
        &self,
        key: &'static str,
        convert: impl Fn(&str, &Value) -> Result<T, String>,
    ) -> Result<Option<T>, Problem> {
        self.get(key)
            .map(|value| convert(key, value.get_ref()).map_err(|m| (Some(value.span().start), m)))
            .transpose()
    }
}

/// The draft a `[[job]]` table describes. Keys are checked in a fixed order, so a table with
/// several mistakes always reports the same one.
fn job(table: &Table) -> Result<Draft, Problem> {
    if let Some(key) = table.keys().find(|k| !KEYS.contains(&k.get_ref().as_str())) {
        return Err((
            Some(key.span().start),
            format!(
                "unknown key `{}` (known keys: {})",
                key.get_ref(),
                KEYS.join(", ")
            ),
        ));
    }
    let table = JobTable(table);
    let Some(command) = table.read("command", |_, value| command_of(value))? else {
        return Err((None, "no `command`".into()));
    };
    let mut draft = Draft {
        command,
        dedup: true,
        ..Draft::default()
    };
    draft.name = table.read("name", string)?;
    draft.gpus = table.read("gpus", gpus)?;
    draft.gpu_ids = table.read("gpu_ids", ids)?;
    draft.allowed_gpus = table.read("allowed_gpus", ids)?.map(|mut allowed| {
        allowed.sort_unstable();
        allowed.dedup();
        allowed
    });
    draft.mem_mib = table.read("mem", mem)?;
    draft.cpus = table.read("cpus", cpus)?;
    draft.mem_host_mib = table.read("mem_host", mem)?;
    if let Some(priority) = table.read("priority", priority)? {
        draft.priority = priority;
    }
    draft.time_limit_secs = table.read("time_limit", time_limit)?;
    draft.on_timeout = table.read("on_timeout", on_timeout)?;
    draft.conda_env = table.read("conda", string)?;
    draft.env_setup_cmd = table.read("env_setup_cmd", string)?;
    draft.workdir = table.read("workdir", string)?;
    draft.profile = table.read("profile", string)?;
    if let Some(dedup) = table.read("dedup", boolean)? {
        draft.dedup = dedup;
    }
    draft.no_requeue = table.read("no_requeue", boolean)?;
    draft.gpu_types = table.read("gpu_type", gpu_types)?.unwrap_or_default();
    draft.constraint = table.read("constraint", constraint)?;
    draft.qos = table.read("qos", string)?;
    draft.signal = table.read("signal", signal)?;
    draft.idle_ok = table.read("idle_ok", boolean)?;
    draft.reservation = table.read("reservation", string)?;
    Ok(draft)
}

/// CPU cores: a whole number, 1 or more.
fn cpus(key: &str, value: &Value) -> Result<u32, String> {
    match value {
        Value::Integer(n) => u32::try_from(*n)
            .ok()
            .filter(|n| *n >= 1)
            .ok_or_else(|| format!("`{key}` {n}: a job needs at least 1 CPU core")),
        other => Err(expected(key, "a whole number of cores", other)),
    }
}

fn priority(key: &str, value: &Value) -> Result<i32, String> {
    match value {
        Value::Integer(p) => i32::try_from(*p).map_err(|_| format!("`{key}` {p} is out of range")),
        other => Err(expected(key, "a whole number", other)),
    }
}

/// `"2h"`, `"1h30m"`, or seconds as a number.
fn time_limit(key: &str, value: &Value) -> Result<u64, String> {
    let text = match value {
        Value::String(s) => s.clone(),
        Value::Integer(secs) => secs.to_string(),
        other => return Err(expected(key, "a duration like \"2h\"", other)),
    };
    let limit = parse_duration(&text).map_err(|e| format!("`{key}`: {e}"))?;
    Ok(limit.as_secs())
}

fn on_timeout(key: &str, value: &Value) -> Result<OnTimeout, String> {
    match value {
        Value::String(s) if s == "requeue" => Ok(OnTimeout::Requeue),
        Value::String(s) if s == "fail" => Ok(OnTimeout::Fail),
        other => Err(expected(key, "\"requeue\" or \"fail\"", other)),
    }
}

fn boolean(key: &str, value: &Value) -> Result<bool, String> {
    match value {
        Value::Boolean(b) => Ok(*b),
        other => Err(expected(key, "true or false", other)),
    }
}

fn expected(key: &str, what: &str, found: &Value) -> String {
    format!("`{key}` must be {what}, not {}", found.type_str())
}

/// `"h100,a100-80gb"` or `["h100", "a100-80gb"]`, preferred first.
fn gpu_types(key: &str, value: &Value) -> Result<Vec<String>, String> {
    let text = match value {
        Value::String(s) => s.clone(),
        Value::Array(items) => items
            .iter()
            .map(|item| string(key, item))
            .collect::<Result<Vec<_>, _>>()?
            .join(","),
        other => return Err(expected(key, "a GPU type or a list of them", other)),
    };
    mgpu_protocol::gpu_type::parse_types(&text).map_err(|e| format!("`{key}`: {e}"))
}

/// A node constraint (`"ib&nvlink"`), in its canonical form.
fn constraint(key: &str, value: &Value) -> Result<String, String> {
    let text = string(key, value)?;
    mgpu_protocol::gpu_type::Constraint::parse(&text)
        .map(|c| c.to_string())
        .map_err(|e| format!("`{key}`: {e}"))
}

/// The warning before a stop, in `--signal`'s syntax (`"USR1@300"`).
fn signal(key: &str, value: &Value) -> Result<StopSignal, String> {
    let text = string(key, value)?;
    StopSignal::parse(&text).map_err(|e| format!("`{key}`: {e}"))
}

fn string(key: &str, value: &Value) -> Result<String, String> {
    match value {
        Value::String(s) => Ok(s.clone()),
        other => Err(expected(key, "a string", other)),
    }
}

/// A string is one shell line; an array is a program and its arguments.
fn command_of(value: &Value) -> Result<Vec<String>, String> {
    let what = "a string (a shell line) or an array of strings (a program and its arguments)";
    match value {
        Value::String(line) => Ok(vec![line.clone()]),
        Value::Array(items) if !items.is_empty() => items
            .iter()
            .map(|item| match item {
                Value::String(word) => Ok(word.clone()),
                other => Err(expected("command", what, other)),
            })
            .collect(),
        Value::Array(_) => Err("`command` is an empty array".into()),
        other => Err(expected("command", what, other)),
    }
}

fn gpus(key: &str, value: &Value) -> Result<GpuAmount, String> {
    let text = match value {
        Value::Integer(n) => n.to_string(),
        Value::Float(x) => x.to_string(),
        Value::String(s) => s.clone(),
        other => return Err(expected(key, "a number of GPUs (2, 0.5)", other)),
    };
    text.parse::<GpuAmount>()
        .map_err(|e| format!("`{key}`: {e}"))
}

/// `[0, 1]` or `"0-1"`.
fn ids(key: &str, value: &Value) -> Result<Vec<u32>, String> {
    let what = "an array of GPU indices or a string like \"0-3\"";
    let text = match value {
        Value::String(s) => s.clone(),
        Value::Array(items) => items
            .iter()
            .map(|item| match item {
                Value::Integer(n) => Ok(n.to_string()),
                other => Err(expected(key, what, other)),
            })
            .collect::<Result<Vec<_>, _>>()?
            .join(","),
        other => return Err(expected(key, what, other)),
    };
    parse::gpu_ids(&text)
        .map(|ids| ids.0)
        .map_err(|e| format!("`{key}`: {e}"))
}

/// `"24GiB"` or MiB as a number.
fn mem(key: &str, value: &Value) -> Result<u64, String> {
    let text = match value {
        Value::String(s) => s.clone(),
        Value::Integer(n) => n.to_string(),
        other => {
            return Err(expected(
                key,
                "a size like \"24GiB\" or MiB as a number",
                other,
            ));
        }
    };
    parse::mem_mib(&text).map_err(|e| format!("`{key}`: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"# two jobs
[[job]]
command = "python train.py --cuda {gpus}"
name = "train"
gpus = 2
gpu_ids = "0-1"
mem = "24GiB"
cpus = 8
mem_host = "64GiB"
priority = 5
time_limit = "2h"
on_timeout = "fail"
conda = "pytorch_env"
env_setup_cmd = "source venv/bin/activate"
workdir = "/data"

[[job]]
command = ["python", "eval.py", "--llm", "qwen2.5-3b-inst"]
allowed_gpus = [7, 4, 5]
mem = 1024
time_limit = 90
dedup = false
profile = "qwen2.5-3b-inst"
no_requeue = true
"#;

    #[test]
    fn a_good_file_reads_every_key() {
        let entries = parse(GOOD).unwrap_or_default();
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[0].line, 2);
        assert_eq!(entries[1].line, 17);
        let train = entries[0].draft.clone().unwrap_or_default();
        assert_eq!(train.command, ["python train.py --cuda {gpus}"]);
        assert_eq!(train.name.as_deref(), Some("train"));
        assert_eq!(train.gpus, Some(GpuAmount::whole(2)));
        assert_eq!(train.gpu_ids, Some(vec![0, 1]));
        assert_eq!(train.mem_mib, Some(24_576));
        assert_eq!(train.cpus, Some(8));
        assert_eq!(train.mem_host_mib, Some(64 * 1024));
        assert_eq!(train.priority, 5);
        assert_eq!(train.time_limit_secs, Some(7_200));
        assert_eq!(train.on_timeout, Some(OnTimeout::Fail));
        assert_eq!(train.conda_env.as_deref(), Some("pytorch_env"));
        assert_eq!(
            train.env_setup_cmd.as_deref(),
            Some("source venv/bin/activate")
        );
        assert_eq!(train.workdir.as_deref(), Some("/data"));
        assert!(train.dedup, "on by default");
        assert_eq!(train.no_requeue, None, "the command line decides");
        let eval = entries[1].draft.clone().unwrap_or_default();
        assert_eq!(eval.command.len(), 4);
        assert_eq!(eval.allowed_gpus, Some(vec![4, 5, 7]));
        assert_eq!(eval.mem_mib, Some(1_024));
        assert_eq!(eval.time_limit_secs, Some(90));
        assert_eq!(eval.gpus, None);
        assert_eq!(eval.profile.as_deref(), Some("qwen2.5-3b-inst"));
        assert!(!eval.dedup);
        assert_eq!(eval.no_requeue, Some(true));
    }

    #[test]
    fn shares_and_empty_files_are_fine() {
        let entries = parse("[[job]]\ncommand = \"x\"\ngpus = 0.5\n").unwrap_or_default();
        let draft = entries.first().and_then(|e| e.draft.clone().ok());
        assert_eq!(
            draft.and_then(|d| d.gpus),
            Some(GpuAmount::from_units(5_000))
        );
        assert_eq!(parse("# nothing yet\n").map(|e| e.len()), Ok(0));
    }

    fn error_of(text: &str) -> (usize, String) {
        match parse(text) {
            Ok(entries) => entries
                .into_iter()
                .find_map(|e| e.draft.err().map(|m| (e.line, m)))
                .unwrap_or_default(),
            Err(err) => (err.line, format!("FILE {}", err.message)),
        }
    }

    #[test]
    fn bad_jobs_name_their_number_line_and_problem() {
        let (line, err) =
            error_of("[[job]]\ncommand = \"a\"\n\n[[job]]\ncommand = \"b\"\nbogus = 1\n");
        assert_eq!(line, 6);
        assert!(
            err.starts_with("job 2: unknown key `bogus` (known keys: command,"),
            "{err}"
        );
        let (line, err) = error_of("[[job]]\nname = \"x\"\n");
        assert_eq!((line, err.as_str()), (1, "job 1: no `command`"));
        for (text, why) in [
            ("command = 3", "`command` must be a string"),
            ("command = []", "empty array"),
            ("command = [\"a\", 1]", "must be a string"),
            ("command = \"a\"\ngpus = 1.5", "`gpus`: GPU count 1.5"),
            ("command = \"a\"\ngpus = true", "`gpus` must be a number"),
            (
                "command = \"a\"\ngpu_ids = \"3-1\"",
                "`gpu_ids`: `3-1` is not a GPU id list",
            ),
            (
                "command = \"a\"\nallowed_gpus = [\"x\"]",
                "`allowed_gpus` must be an array",
            ),
            (
                "command = \"a\"\nmem = \"12KiB\"",
                "`mem`: `12KiB` is not a memory size",
            ),
            (
                "command = \"a\"\npriority = 1.5",
                "`priority` must be a whole number, not float",
            ),
            ("command = \"a\"\npriority = 9999999999", "out of range"),
            ("command = \"a\"\ntime_limit = \"soon\"", "`time_limit`:"),
            (
                "command = \"a\"\non_timeout = \"retry\"",
                "\"requeue\" or \"fail\"",
            ),
            (
                "command = \"a\"\ndedup = \"yes\"",
                "`dedup` must be true or false",
            ),
            ("command = \"a\"\nconda = 1", "`conda` must be a string"),
        ] {
            let (_, err) = error_of(&format!("[[job]]\n{text}\n"));
            assert!(err.contains(why), "{text}: {err}");
        }
    }

    #[test]
    fn qos_and_signal_read_as_the_options_do() {
        let entries =
            parse("[[job]]\ncommand = \"a\"\nqos = \"scavenger\"\nsignal = \"USR1@300\"\n")
                .unwrap_or_default();
        let draft = entries.first().and_then(|e| e.draft.clone().ok());
        let draft = draft.unwrap_or_default();
        assert_eq!(draft.qos.as_deref(), Some("scavenger"));
        assert_eq!(draft.signal, StopSignal::parse("USR1@300").ok());
        let entries = parse("[[job]]\ncommand = \"a\"\nreservation = \"deadline\"\n");
        let draft = (entries.unwrap_or_default().first()).and_then(|e| e.draft.clone().ok());
        assert_eq!(
            draft.and_then(|d| d.reservation).as_deref(),
            Some("deadline")
        );
        let (line, err) = error_of("[[job]]\ncommand = \"a\"\nsignal = \"USR3@5\"\n");
        assert_eq!(line, 3);
        assert!(
            err.contains("`signal`: --signal \"USR3@5\": unknown signal \"USR3\""),
            "{err}"
        );
        let (_, err) = error_of("[[job]]\ncommand = \"a\"\nsignal = 10\n");
        assert!(err.contains("`signal` must be a string"), "{err}");
    }

    #[test]
    fn idle_ok_reads_as_the_option_does_and_must_be_a_boolean() {
        let draft = |text: &str| {
            parse(text)
                .unwrap_or_default()
                .first()
                .and_then(|e| e.draft.clone().ok())
                .unwrap_or_default()
        };
        assert_eq!(
            draft("[[job]]\ncommand = \"a\"\nidle_ok = true\n").idle_ok,
            Some(true)
        );
        assert_eq!(draft("[[job]]\ncommand = \"a\"\n").idle_ok, None);
        let (line, err) = error_of("[[job]]\ncommand = \"a\"\nidle_ok = \"yes\"\n");
        assert_eq!(line, 3);
        assert!(err.contains("`idle_ok`"), "{err}");
    }

    #[test]
    fn syntax_errors_and_stray_tables_spoil_the_file() {
        let (line, err) = error_of("[[job]]\ncommand = \"a\"\n[[job]]\ncommand = \n");
        assert_eq!(line, 4);
        assert!(err.starts_with("FILE "), "{err}");
        let (_, err) = error_of("[defaults]\ngpus = 1\n");
        assert!(err.contains("unknown field `defaults`"), "{err}");
    }
}
