//! The benchmark program of issue #6: starts real clusters (nats-server, scheduler, agents, all
//! release binaries, through the test harness) and measures what a user sees, printing one JSON
//! object per scenario on stdout. Progress goes to stderr. Run it with `scripts/bench.sh`
//! (`--quick` for reduced sizes, `--only GROUP` for one group); it is not a test and asserts
//! no timing.
//!
//! Groups: `cli` (scenarios 1 to 4, see [`cli`]), `queue` (4 with 100 000 jobs waiting, see
//! [`queue`]), `scale` (5, see [`scale`], its simulated nodes in [`fleet`]), `output` (6: job output throughput and line
//! latency, see [`output`]), `recovery` (7, see [`recovery`]), `history` (8: queue, query
//! and restart with a large history, see [`history`]), `top` (9: `mgpu top`'s frames of a
//! 1 000-node cluster, in memory, see [`top`]), `durability` (10: the drain and the submission
//! rate with JetStream's `sync_interval: always` and with nats-server's default, see
//! [`durability`]).

mod cli;
mod common;
mod durability;
mod estimates;
mod fleet;
mod history;
mod output;
mod queue;
mod recovery;
mod scale;
mod top;
mod tsp;
mod web;

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use anyhow::{Result, bail};

use common::{Run, progress};

/// The scenario groups, in the order a full run takes them.
const GROUPS: &[&str] = &[
    "cli",
    "queue",
    "scale",
    "output",
    "recovery",
    "history",
    "top",
    "durability",
    "estimates",
    "web",
];

fn main() -> Result<()> {
    let mut quick = false;
    let mut only: Vec<String> = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--quick" => quick = true,
            "--only" => match args.next() {
                Some(group) if GROUPS.contains(&group.as_str()) => only.push(group),
                other => bail!("--only takes one of {GROUPS:?}, not {other:?}"),
            },
            // `cargo bench` passes --bench to every bench target.
            "--bench" => {}
            other => bail!("unknown argument {other:?} (use --quick, --only GROUP)"),
        }
    }
    // The harness finds nats-server through this, like scripts/test.sh sets it.
    if std::env::var_os("MGPU_NATS_SERVER").is_none() {
        let local = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.tools/bin/nats-server");
        if !local.exists()
            && Command::new("nats-server")
                .arg("--version")
                .output()
                .is_err()
        {
            bail!("no nats-server: run scripts/setup.sh");
        }
    }
    let ctx = Run::new(quick);
    let started = Instant::now();
    for group in GROUPS {
        if !only.is_empty() && !only.iter().any(|o| o == group) {
            continue;
        }
        progress(&format!("group {group}"));
        match *group {
            "cli" => cli::run(&ctx)?,
            "queue" => queue::run(&ctx)?,
            "scale" => scale::run(&ctx)?,
            "output" => output::run(&ctx)?,
            "recovery" => recovery::run(&ctx)?,
            "history" => history::run(&ctx)?,
            "top" => top::run(&ctx)?,
            "durability" => durability::run(&ctx)?,
            "estimates" => estimates::run(&ctx)?,
            "web" => web::run(&ctx)?,
            other => bail!("no group {other}"),
        }
    }
    progress(&format!("done in {:.0} s", started.elapsed().as_secs_f64()));
    Ok(())
}
