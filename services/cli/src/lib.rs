//! The `mgpu` command-line tool as a library; the `mgpu` binary (`main.rs`) only parses the
//! command line and dispatches it here. It talks only to NATS: requests (submissions,
//! cancellations, holds, node administration) go to JetStream streams, and everything it shows
//! (queue, records, nodes, output) is read straight from JetStream, so most commands work
//! while the scheduler is down.
//!
//! Layout (no file imports one that imports it back):
//!
//! - `cli`: the command line (clap) and the dispatch to the commands; `process`: the log
//!   output and how a command's result becomes the exit status. Both are `main.rs`'s.
//! - `client/`: the client library the commands are built on.
//!   - `session`: the connection options and the connection as the current user;
//!   - `request`: the one request path: signed, published to JetStream under a `Nats-Msg-Id`,
//!     acknowledged, and retried through a leader election without being applied twice;
//!     submit, cancel, hold/release and node administration all take it;
//!   - `submit`: submissions on that path, pipelined, each job's environment stored first;
//!   - `verdict`: the scheduler's verdicts on submissions and reservation requests, heard on
//!     a subject of the user's inbox;
//!   - `answer`: the scheduler's answer to a request about a job (its record changes, or it
//!     refuses), listened to from before the request (`cancel`, `hold`);
//!   - `follow/`: following a job: its output (`output`), its record (`record`), both read
//!     together (`feed`), the output printed (`tail`: `logs`), the job followed to its end
//!     with its status and our input (`follower`, `watcher`, `status`, `input`,
//!     `raw_terminal`: `submit -i`, `attach`).
//! - `commands/`: one module per subcommand, each taking its parsed arguments and returning
//!   the exit status. `submit/`: `args` (its options), `spec` (the job spec from options or a
//!   job file's draft), `plan` (each form, a job, an array or a job file, as prepared
//!   submissions), `pipeline` (check, skip duplicates via `dedup`, store), `printer` (what
//!   each form prints), `file` (job files, `--watch`), `batch_script` with `directives` and
//!   `shell_words` (`#MGPU` lines). `queue`, `show/` (the request's lines; `state`, the
//!   state's), `nodes`, `history`, `report` (accounting), `logs`, `wait`, `notices` (the
//!   scheduler's notices, followed live), `attach`, `cancel`, `hold` (and release), `node_admin`
//!   (`node` and `gpu`), `reserve` (book or cancel a reservation) and `reservations` (list
//!   them), `completions` (and `man`), `top/` (the command's I/O; `screen/`, its
//!   pure model and drawing), `web/` (the dashboard's page, embedded by `build.rs` as
//!   `assets`, served by `site`, pointed at the WebSocket URL from `websocket`), and
//!   `admin/`, one file per subcommand (`init`, `add_user`,
//!   `add_node`, `list`, `remove`, `audit`, `setup`, `site/`) with the registry's files
//!   (`registry`) and the reload and audit record after a change (`announce`).
//! - `model/`: the jobs-and-nodes read model: the cluster bucket (`cluster`), jobs, nodes and
//!   cluster read together (`snapshot`), finding a job and the queue's order (`jobs`), a
//!   node's row (`nodes`), history, accounting and a job's environment.
//! - `jobfile/`: the job-file formats (`csv` lines, `native` TOML tables) parsed into drafts.
//! - `gpu_profiles`: the JSON profiles file giving each model's GPU requirement.
//! - `parse`: value parsers for the command line (GPU ids, memory sizes, arrays, `NODE:IDX`,
//!   points in time).
//! - `console` (our stdout and stderr), `human` (ages, states, lists), `tables`: output.
//! - `errors`: library errors as one-line messages.
//! - `setup/`: the cluster set-up `mgpu admin init` writes (keys, server configuration, TLS).
//! - `fixtures` (tests only): job records and heartbeats.
//!
//! Public: `cli` and `process` (for `main.rs`); `client`; `setup`, so that the test harness
//! and the benchmarks set up their clusters exactly as an administrator does; and `top`
//! (`commands/top/screen`), so that the benchmarks draw frames of a large cluster with the
//! command's own code.

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
