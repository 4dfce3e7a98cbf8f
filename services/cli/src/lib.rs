//! The `mgpu` command-line tool as a library; the `mgpu` binary (`main.rs`) only parses the
//! command line and dispatches it here. It talks only to NATS: requests (submissions,
//! cancellations, holds, node administration) go to JetStream streams, and everything it shows
//! (queue, records, nodes, output) is read straight from JetStream, so most commands work
//! while the scheduler is down.
//!
//! Layout (no file imports one that imports it back):
//!
//! - `cli`: the command line (clap) and the dispatch to the commands; `process`: the log
//!   output and how a command's result becomes the exit status.
//! - `commands/`: one module per subcommand. `submit/`: `args` (its options), `spec` (the job
//!   spec from options or a job file's draft), `plan` (each form, a job, an array or a job
//!   file, as prepared submissions), `pipeline` (check, skip duplicates via `dedup`, store),
//!   `printer` (what each form prints), `file` (job files, `--watch`).
//!   `queue`, `show`, `nodes`, `logs`, `cancel`, `hold` (and release), `node_admin` (`node`
//!   and `gpu`), `top/` (the command's I/O; `screen/`, its pure model and drawing), and
//!   `admin/`, one file per subcommand (`init`, `add_user`, `add_node`, `list`, `remove`,
//!   `audit`, `setup`) with the registry's files (`registry`) and the reload and audit
//!   record after a change (`announce`).
//! - `model/`: the jobs-and-nodes read model: the cluster bucket (`cluster`), jobs, nodes and
//!   cluster read together (`snapshot`), finding a job and the queue's order (`jobs`), a
//!   node's row (`nodes`).
//! - `client/`: the client library the commands share: the connection as the current user
//!   (`session`), the one request path, signed, acknowledged and retried through leader
//!   elections (`request`), submissions on it (`submit`), the scheduler's answer to a request
//!   about a job (`answer`), and following a job, its output, record and terminal (`follow/`),
//!   for `logs`, `wait`, `attach`, `submit -i`, `cancel`, `hold` and `top`.
//! - `jobfile/`: the job-file formats (`csv` lines, `native` TOML tables) parsed into drafts.
//! - `gpu_profiles`: the JSON profiles file giving each model's GPU requirement.
//! - `parse`: value parsers for the command line (GPU ids, memory sizes, arrays, `NODE:IDX`).
//! - `console` (our stdout and stderr), `human` (ages, states, lists), `tables`: output.
//! - `errors`: library errors as one-line messages.
//! - `setup/`: the cluster set-up `mgpu admin init` writes (keys, server configuration, TLS),
//!   public so that the test harness and the benchmarks set up their clusters exactly as an
//!   administrator does.
//! - `fixtures` (tests only): job records and heartbeats.
//!
//! Public: `cli` and `process` (for `main.rs`), `client`, `setup`, and `top`
//! (`commands/top/screen`, for the benchmarks, which draw frames of a large cluster with the
//! command's own code).

pub mod cli;
pub mod client;
mod commands;
mod console;
mod errors;
#[cfg(test)]
mod fixtures;
mod gpu_profiles;
mod human;
mod jobfile;
mod model;
mod parse;
pub mod process;
pub mod setup;
mod tables;

pub use commands::top::screen as top;
