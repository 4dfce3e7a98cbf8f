//! `mgpu-config`: how the mgpu services (`mgpu-scheduler`, `mgpu-node`) are set up from
//! outside: a TOML config file under their flags and environment, `--print-config`, and the
//! log format.
//!
//! # The config file
//! Each service reads a TOML file (`--config FILE`; by default `/etc/mgpu/scheduler.toml` or
//! `/etc/mgpu/node.toml`, which may be absent). Every flag has a key, its long name with `_`
//! for `-`: `heartbeat_interval = "2s"` is `--heartbeat-interval 2s`, `jobs_as_agent_user =
//! true` is `--jobs-as-agent-user`, and a repeatable flag takes a list (`label = ["rack=r1"]`).
//! The file's values become the defaults of their flags, so clap's own order decides, exactly
//! as for any other default: a flag on the command line, then its environment variable, then
//! the file, then the built-in default. A key that is no flag is an error naming the key and
//! the file, and so is a value the flag would refuse. Tables are sections the service reads
//! itself (the scheduler's `[policy]`); other tables are errors too.
//!
//! Because keys come from the flags, a flag added to a service has its key at once, and the
//! file cannot drift from the command line.
//!
//! # Layout
//! - [`file`]: finding and reading the file, keys to flags, sections, the merged parse.
//! - [`print`]: the effective settings and where each came from (`--print-config`).
//! - [`logging`]: `--log-format text|json` (JSON: one object per line, fields at the top).

pub mod file;
pub mod logging;
pub mod print;

pub use file::{Error, Legacy, Loaded, Service, load_from, load_or_exit};
pub use logging::LogFormat;
pub use print::{Setting, Settings, Source, section_settings};
