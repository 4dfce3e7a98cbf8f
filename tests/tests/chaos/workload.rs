//! The campaign's workload, through the real CLI as alice and bob: single jobs, `--no-requeue`
//! jobs, arrays with `%N`, jobs `--after` another, two-GPU jobs, half-GPU jobs, gangs over two
//! nodes (`--distributed`), jobs with a hard time limit, cancels, holds released a few seconds
//! later, and (as the admin) nodes drained and resumed a few seconds later. Every job runs the
//! same script: a `start` line in its node's ledger (appended and flushed), numbered output
//! lines, an `end` line. A submission whose CLI gave no id is counted as uncertain: it may or
//! may not have been recorded. When the workload ends, every hold is released and every node
//! resumed, so that every job can end.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use mgpu_tests::{Cluster, bin_dir};
use serde_json::Value;

use crate::draw::Draw;

/// What each kind of job is, for the checks that concern it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    Single,
    NoRequeue,
    /// A task of array `array` run at most `max_running` at a time.
    ArrayTask {
        array: String,
        max_running: u32,
    },
    /// Submitted `--after` the job `on`.
    Dependent {
        on: String,
    },
    /// Half a GPU (`--gpus 0.5`): two may share one.
    HalfGpu,
    /// One GPU on each of two nodes, the script run once per node (`--distributed`).
    Gang,
    /// Stopped at 3 s (`--time-limit 3 --on-timeout fail`) if it runs that long.
    TimeLimited,
}

impl Kind {
    /// The share of each of its GPUs it holds, in hundredths.
    pub fn share(&self) -> u32 {
        match self {
            Kind::HalfGpu => 50,
            _ => 100,
        }
    }
}

/// Something the workload undoes a few seconds later, and at its end.
enum Undo {
    Release { user: &'static str, job: String },
    Resume { node: &'static str },
}

/// One job the CLI gave an id for.
#[derive(Clone, Debug)]
pub struct Job {
    pub id: String,
    pub user: &'static str,
    pub kind: Kind,
    /// How many numbered lines it prints.
    pub lines: u32,
    /// A cancel was asked for (the CLI said so or not).
    pub cancel_asked: bool,
}

/// Everything submitted.
#[derive(Default)]
pub struct Submitted {
    pub jobs: Vec<Job>,
    /// Submissions whose CLI failed: recorded or not, nobody was told an id.
    pub uncertain: usize,
}

/// The `mgpu` CLI of the campaign's cluster, usable without the cluster (which the fault
/// injector holds).
#[derive(Clone)]
pub struct Cli {
    bin: PathBuf,
    servers: String,
    dir: PathBuf,
    alice: PathBuf,
    bob: PathBuf,
    admin: PathBuf,
}

impl Cli {
    pub fn of(cluster: &Cluster) -> Cli {
        Cli {
            bin: bin_dir().join("mgpu"),
            servers: cluster.server_url(),
            dir: cluster.dir.path().to_owned(),
            alice: cluster.user_creds("alice"),
            bob: cluster.user_creds("bob"),
            admin: cluster.admin_creds(),
        }
    }

    /// `mgpu ARGS` as `user` (`alice`, `bob` or `admin`).
    pub fn run(&self, user: &str, args: &[&str]) -> Output {
        self.command(user, args)
            .output()
            .unwrap_or_else(|e| panic!("running mgpu: {e}"))
    }

    /// [`Cli::run`] with the CLI's and the NATS client's debug log on its stderr.
    pub fn run_logged(&self, user: &str, args: &[&str]) -> Output {
        self.command(user, args)
            .env("RUST_LOG", "debug")
            .output()
            .unwrap_or_else(|e| panic!("running mgpu: {e}"))
    }

    fn command(&self, user: &str, args: &[&str]) -> Command {
        let creds = match user {
            "alice" => &self.alice,
            "bob" => &self.bob,
            _ => &self.admin,
        };
        let mut command = Command::new(&self.bin);
        command
            .args(args)
            .env("MGPU_SERVER", &self.servers)
            .env("MGPU_CREDS", creds)
            .current_dir(&self.dir)
            .stdin(Stdio::null());
        command
    }

    /// What `mgpu ARGS --json` printed, when it succeeded.
    pub fn json(&self, user: &str, args: &[&str]) -> Option<Value> {
        let out = self.run(user, args);
        if !out.status.success() {
            return None;
        }
        serde_json::from_slice(&out.stdout).ok()
    }
}

/// The script every job runs: its ledger lines around `lines` numbered lines, `pause`
/// seconds apart, each tagged with its attempt and rank (`chaos-line 3 1 0`), so that a gang's
/// ranks, printing into one output, are checked each on its own.
pub fn job_script(ledgers: &Path, lines: u32, pause: f64) -> String {
    let ledger = ledgers.display();
    format!(
        "note() {{ echo \"$1 $MGPU_JOB_ID $MGPU_ATTEMPT $MGPU_NODE $MGPU_GPUS $(date +%s%N) \
         ${{MGPU_NODE_RANK:-0}}\" \
         | dd of={ledger}/$MGPU_NODE oflag=append conv=notrunc,fsync status=none; }}; \
         note start; i=1; while [ $i -le {lines} ]; do echo \"chaos-line $i $MGPU_ATTEMPT ${{MGPU_NODE_RANK:-0}}\"; \
         sleep {pause}; \
         i=$((i+1)); done; note end"
    )
}

/// Submits, cancels, holds and drains until `until`; what was submitted. A hold or a drain
/// runs on a thread of its own (its command may wait for a stalled scheduler's answer) and is
/// undone a few seconds later; every one is undone before this returns.
pub fn run(cli: &Cli, ledgers: &Path, seed: u64, until: Instant) -> Submitted {
    let mut draw = Draw::new(seed, 1);
    let mut submitted = Submitted::default();
    let mut undoing: Vec<std::thread::JoinHandle<()>> = Vec::new();
    while Instant::now() < until && !crate::INTERRUPTED.load(std::sync::atomic::Ordering::SeqCst) {
        let user = *draw.pick(&["alice", "bob"]);
        let mut job = |kind: Kind, flags: &[&str], draw: &mut Draw| {
            submit(cli, &mut submitted, draw, user, kind, flags, ledgers)
        };
        match draw.between(1, 100) {
            1..=30 => job(Kind::Single, &[], &mut draw),
            31..=40 => job(Kind::NoRequeue, &["--no-requeue"], &mut draw),
            41..=50 => submit_array(cli, &mut submitted, &mut draw, user, ledgers),
            51..=60 => submit_dependent(cli, &mut submitted, &mut draw, user, ledgers),
            61..=66 => job(Kind::Single, &["--gpus", "2"], &mut draw),
            67..=72 => job(Kind::HalfGpu, &["--gpus", "0.5"], &mut draw),
            73..=77 => job(
                Kind::Gang,
                &["--nodes", "2", "--gpus", "1", "--distributed"],
                &mut draw,
            ),
            78..=82 => job(
                Kind::TimeLimited,
                &["--time-limit", "3", "--on-timeout", "fail"],
                &mut draw,
            ),
            83..=88 => {
                let own: Vec<&Job> = submitted.jobs.iter().filter(|j| j.user == user).collect();
                if !own.is_empty() {
                    let job = draw.pick(&own).id.clone();
                    let hold = vec!["hold".to_owned(), job.clone()];
                    let later = Duration::from_millis(draw.between(1_000, 6_000));
                    let undo = Undo::Release { user, job };
                    undoing.push(do_then_undo(cli, user, hold, later, undo));
                }
            }
            89..=91 => {
                let node = *draw.pick(&crate::NODES);
                let drain = ["node", "drain", node, "--reason", "chaos"].map(str::to_owned);
                let later = Duration::from_millis(draw.between(2_000, 8_000));
                let undo = Undo::Resume { node };
                undoing.push(do_then_undo(cli, "admin", drain.to_vec(), later, undo));
            }
            _ => cancel_one(cli, &mut submitted, &mut draw),
        }
        std::thread::sleep(Duration::from_millis(draw.between(100, 700)));
    }
    for thread in undoing {
        let _ = thread.join();
    }
    submitted
}

/// On a thread: `mgpu ARGS` as `user`, then `undo` after `later`.
fn do_then_undo(
    cli: &Cli,
    user: &'static str,
    args: Vec<String>,
    later: Duration,
    undo: Undo,
) -> std::thread::JoinHandle<()> {
    let cli = cli.clone();
    std::thread::spawn(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let _ = cli.run(user, &args);
        std::thread::sleep(later);
        undo_one(&cli, undo);
    })
}

/// Releases a hold or resumes a node, retrying through faults: a job left held or a node left
/// drained would never let its jobs end.
fn undo_one(cli: &Cli, what: Undo) {
    let args: Vec<&str> = match &what {
        Undo::Release { job, .. } => vec!["release", job],
        Undo::Resume { node } => vec!["node", "resume", node],
    };
    let user = match &what {
        Undo::Release { user, .. } => user,
        Undo::Resume { .. } => "admin",
    };
    for _ in 0..30 {
        let out = cli.run(user, &args);
        let said = String::from_utf8_lossy(&out.stderr).to_lowercase();
        // Done, or nothing to undo (the job had started or ended, so the hold was refused).
        if out.status.success() || said.contains("is running") || said.contains("already finished")
        {
            return;
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    eprintln!("chaos: could not undo `mgpu {}`", args.join(" "));
}

fn submit(
    cli: &Cli,
    submitted: &mut Submitted,
    draw: &mut Draw,
    user: &'static str,
    kind: Kind,
    flags: &[&str],
    ledgers: &Path,
) {
    let lines = draw.between(2, 10) as u32;
    let pause = draw.between(5, 40) as f64 / 100.0;
    let script = job_script(ledgers, lines, pause);
    let mut args = vec!["submit", "--json"];
    args.extend_from_slice(flags);
    args.extend_from_slice(&["--", &script]);
    match cli
        .json(user, &args)
        .and_then(|v| v["id"].as_str().map(str::to_owned))
    {
        Some(id) => submitted.jobs.push(Job {
            id,
            user,
            kind,
            lines,
            cancel_asked: false,
        }),
        None => submitted.uncertain += 1,
    }
}

fn submit_array(
    cli: &Cli,
    submitted: &mut Submitted,
    draw: &mut Draw,
    user: &'static str,
    ledgers: &Path,
) {
    let (tasks, max_running) = (draw.between(2, 5), draw.between(1, 2) as u32);
    let lines = draw.between(2, 6) as u32;
    let script = job_script(ledgers, lines, 0.2);
    let spec = format!("1-{tasks}%{max_running}");
    let args = ["submit", "--json", "--array", &spec, "--", &script];
    let Some(answer) = cli.json(user, &args) else {
        submitted.uncertain += tasks as usize;
        return;
    };
    let array = answer["array_id"].as_str().unwrap_or_default().to_owned();
    for id in answer["ids"].as_array().into_iter().flatten() {
        if let Some(id) = id.as_str() {
            submitted.jobs.push(Job {
                id: id.to_owned(),
                user,
                kind: Kind::ArrayTask {
                    array: array.clone(),
                    max_running,
                },
                lines,
                cancel_asked: false,
            });
        }
    }
}

fn submit_dependent(
    cli: &Cli,
    submitted: &mut Submitted,
    draw: &mut Draw,
    user: &'static str,
    ledgers: &Path,
) {
    let own: Vec<String> = submitted
        .jobs
        .iter()
        .filter(|job| job.user == user)
        .map(|job| job.id.clone())
        .collect();
    if own.is_empty() {
        return submit(cli, submitted, draw, user, Kind::Single, &[], ledgers);
    }
    let on = draw.pick(&own).clone();
    let kind = Kind::Dependent { on: on.clone() };
    submit(cli, submitted, draw, user, kind, &["--after", &on], ledgers);
}

fn cancel_one(cli: &Cli, submitted: &mut Submitted, draw: &mut Draw) {
    if submitted.jobs.is_empty() {
        return;
    }
    let index = draw.between(0, submitted.jobs.len() as u64 - 1) as usize;
    let job = &mut submitted.jobs[index];
    job.cancel_asked = true;
    // Its answer does not matter: a finished job cannot be cancelled, and a cancel lost to a
    // fault leaves the job to end by itself. The checks allow either.
    let _ = cli.run(job.user, &["cancel", &job.id]);
}
