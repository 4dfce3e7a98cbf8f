//! What must hold once the faults stopped and the cluster settled, read from the jobs'
//! records (`mgpu queue --all --json`, `mgpu show --json` for those moved to history), their
//! output (`mgpu logs`), the ledgers their attempts wrote on their nodes, and the processes
//! left on the machine. Every broken promise is one violation, named with its job. Each check
//! is first shown a history it must fault (`self_check.rs`).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::workload::{Cli, Job, Kind, Submitted};

pub mod self_check;

const TERMINAL: [&str; 5] = [
    "succeeded",
    "failed",
    "cancelled",
    "timed_out",
    "node_failed",
];

/// The jobs as the cluster says they ended: record by id (None: found nowhere).
pub struct Settled {
    records: HashMap<String, Value>,
    /// Ids of jobs running our script that no CLI was told of.
    unacknowledged: Vec<String>,
}

/// The check's findings.
pub struct Report {
    pub attempts: usize,
    pub violations: Vec<String>,
    pub queue_answers_ms: Value,
    /// What could not be checked, and how often.
    pub unchecked: Value,
}

/// Waits (up to `within`) until every submitted job is in a terminal state. Meanwhile it
/// releases held jobs and resumes drained nodes, as their users would: a hold or drain whose
/// command timed out while the scheduler was unreachable is stored all the same, and may take
/// effect after the workload undid it.
pub fn settle(cli: &Cli, submitted: &Submitted, within: Duration) -> (Settled, usize) {
    let deadline = Instant::now() + within;
    let mut said = Instant::now();
    let mut undone = 0;
    loop {
        undone += undo_late_holds_and_drains(cli, submitted);
        let settled = read(cli, submitted);
        let open = submitted
            .jobs
            .iter()
            .filter(|job| !settled.records.get(&job.id).is_some_and(is_terminal))
            .count();
        let interrupted = crate::INTERRUPTED.load(std::sync::atomic::Ordering::SeqCst);
        if open == 0 || Instant::now() > deadline || interrupted {
            return (settled, undone);
        }
        if said.elapsed() > Duration::from_secs(10) {
            eprintln!("chaos: settling, {open} job(s) not ended yet");
            said = Instant::now();
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// Releases the campaign's held jobs and resumes its drained nodes; how many.
fn undo_late_holds_and_drains(cli: &Cli, submitted: &Submitted) -> usize {
    let mut undone = 0;
    let held = cli
        .json("admin", &["queue", "--json"])
        .and_then(|v| v["jobs"].as_array().cloned())
        .unwrap_or_default();
    for record in held.iter().filter(|r| r["held_by"].is_string()) {
        let id = record["id"].as_str().unwrap_or_default();
        if let Some(job) = submitted.jobs.iter().find(|j| j.id == id) {
            let _ = cli.run(job.user, &["release", id]);
            undone += 1;
        }
    }
    let nodes = cli
        .json("admin", &["nodes", "--json"])
        .and_then(|v| v.as_array().cloned())
        .unwrap_or_default();
    for node in nodes {
        let state = node["state"].as_str().unwrap_or_default();
        if state == "drained" || state == "draining" {
            let name = node["node"].as_str().unwrap_or_default();
            let _ = cli.run("admin", &["node", "resume", name]);
            undone += 1;
        }
    }
    undone
}

fn is_terminal(record: &Value) -> bool {
    TERMINAL.contains(&state_of(record))
}

fn state_of(record: &Value) -> &str {
    record["state"].as_str().unwrap_or_default()
}

/// Every job's record: the live ones listed at once, the others (moved to history) one by one.
fn read(cli: &Cli, submitted: &Submitted) -> Settled {
    let listed = cli
        .json("admin", &["queue", "--all", "--json"])
        .and_then(|v| v["jobs"].as_array().cloned())
        .unwrap_or_default();
    let ours: HashSet<&str> = submitted.jobs.iter().map(|j| j.id.as_str()).collect();
    let mut records = HashMap::new();
    let mut unacknowledged = Vec::new();
    for record in listed {
        let id = record["id"].as_str().unwrap_or_default().to_owned();
        if !ours.contains(id.as_str()) {
            if record.to_string().contains("chaos-line") {
                unacknowledged.push(id);
            }
            continue;
        }
        records.insert(id, record);
    }
    for job in &submitted.jobs {
        if !records.contains_key(&job.id)
            && let Some(record) = cli.json("admin", &["show", "--json", &job.id])
        {
            records.insert(job.id.clone(), record);
        }
    }
    Settled {
        records,
        unacknowledged,
    }
}

/// Between a job's id and a rank above 0, in the ledgers' keys.
const RANK_MARK: &str = "/rank";
/// How long after its recorded end a job's attempt may be seen starting: an agent's clock may
/// be stepped up to 30 s, and exits are dated by their agent.
const AFTER_END_SLACK_NS: u128 = 31_000_000_000;

/// One attempt as its ledger lines tell it.
#[derive(Clone, Debug, Default)]
struct Attempt {
    node: String,
    gpus: Vec<String>,
    start: u128,
    end: Option<u128>,
}

/// The ledgers: attempts by (job, attempt number).
fn ledgers(dir: &Path) -> BTreeMap<(String, u32), Attempt> {
    let mut attempts: BTreeMap<(String, u32), Attempt> = BTreeMap::new();
    let files = std::fs::read_dir(dir).into_iter().flatten().flatten();
    for line in files
        .filter_map(|file| std::fs::read_to_string(file.path()).ok())
        .flat_map(|text| text.lines().map(str::to_owned).collect::<Vec<_>>())
    {
        let words: Vec<&str> = line.split_whitespace().collect();
        let [what, job, attempt, node, gpus, at, rank] = words[..] else {
            continue;
        };
        let (Ok(attempt), Ok(at)) = (attempt.parse::<u32>(), at.parse::<u128>()) else {
            continue;
        };
        // A gang's other ranks apart from its first, which stands for the job.
        let key = match rank {
            "0" => job.to_owned(),
            rank => format!("{job}{RANK_MARK}{rank}"),
        };
        let entry = attempts.entry((key, attempt)).or_default();
        if what == "start" {
            entry.node = node.to_owned();
            entry.gpus = gpus.split(',').map(str::to_owned).collect();
            entry.start = at;
        } else {
            entry.end = Some(at);
        }
    }
    attempts
}

/// Every check, over the settled cluster.
pub fn check(cli: &Cli, submitted: &Submitted, dir: &Path, settled: Settled) -> Report {
    let attempts = ledgers(dir);
    let mut violations = Vec::new();
    let mut unchecked: BTreeMap<&str, usize> = BTreeMap::new();
    if settled.unacknowledged.len() > submitted.uncertain {
        violations.push(format!(
            "jobs nobody was told of: {:?} ({} submission(s) failed at the CLI)",
            settled.unacknowledged, submitted.uncertain
        ));
    }
    let by_job = group_by_job(&attempts);
    for job in &submitted.jobs {
        let Some(record) = settled.records.get(&job.id) else {
            violations.push(format!("{}: lost (no record anywhere)", job.id));
            continue;
        };
        if !is_terminal(record) {
            violations.push(format!(
                "{}: still {} after settling ({})",
                job.id,
                state_of(record),
                record["reason"].as_str().unwrap_or("no reason given")
            ));
        }
        let runs = by_job.get(job.id.as_str()).cloned().unwrap_or_default();
        check_job(job, record, &runs, &mut violations);
        check_dependency(job, &runs, &settled, &by_job, &mut violations);
    }
    let shares: HashMap<&str, u32> = submitted
        .jobs
        .iter()
        .map(|j| (j.id.as_str(), j.kind.share()))
        .collect();
    check_gpus(&attempts, &shares, &mut violations, &mut unchecked);
    check_after_end(&attempts, &settled, &mut violations);
    check_arrays(submitted, &attempts, &mut violations, &mut unchecked);
    check_output(cli, submitted, &settled, &by_job, &mut violations);
    check_survivors(dir, &mut violations);
    check_cgroups(submitted, &mut violations);
    Report {
        attempts: attempts.len(),
        violations,
        queue_answers_ms: queue_answers(cli),
        unchecked: json!(unchecked),
    }
}

/// Each job's attempts, by attempt number.
fn group_by_job(
    attempts: &BTreeMap<(String, u32), Attempt>,
) -> HashMap<&str, BTreeMap<u32, Attempt>> {
    let mut by_job: HashMap<&str, BTreeMap<u32, Attempt>> = HashMap::new();
    for ((job, number), attempt) in attempts {
        by_job
            .entry(job.as_str())
            .or_default()
            .insert(*number, attempt.clone());
    }
    by_job
}

/// A job's end agrees with its ledger; a `--no-requeue` job ran at most once.
fn check_job(
    job: &Job,
    record: &Value,
    runs: &BTreeMap<u32, Attempt>,
    violations: &mut Vec<String>,
) {
    let attempt = record["attempt"].as_u64().unwrap_or(1) as u32;
    if state_of(record) == "succeeded" && runs.get(&attempt).and_then(|a| a.end).is_none() {
        violations.push(format!(
            "{}: succeeded, but its attempt {attempt} wrote no end in its ledger",
            job.id
        ));
    }
    if job.kind == Kind::NoRequeue && runs.len() > 1 {
        violations.push(format!(
            "{}: --no-requeue, yet it started {} times",
            job.id,
            runs.len()
        ));
    }
}

/// A job `--after` another started only after that one succeeded.
fn check_dependency(
    job: &Job,
    runs: &BTreeMap<u32, Attempt>,
    settled: &Settled,
    by_job: &HashMap<&str, BTreeMap<u32, Attempt>>,
    violations: &mut Vec<String>,
) {
    let Kind::Dependent { on } = &job.kind else {
        return;
    };
    let Some(first) = runs.values().map(|a| a.start).min() else {
        return;
    };
    let succeeded = settled
        .records
        .get(on)
        .is_some_and(|r| state_of(r) == "succeeded");
    let ended = by_job
        .get(on.as_str())
        .and_then(|runs| runs.values().filter_map(|a| a.end).max());
    match ended {
        Some(end) if succeeded && end <= first => {}
        _ => violations.push(format!(
            "{}: started before {on}, which it depends on, succeeded",
            job.id
        )),
    }
}

/// When an attempt started and ended (ns), and which it was.
type Span = (u128, u128, String);
/// A moment an array's running count changed, and by how much.
type Change = (u128, i32);

/// No GPU was held beyond its whole at any moment: the shares of the attempts holding it
/// (whole jobs 100, half-GPU jobs 50) never add up to more than 100. Attempts without an end
/// line are not checked: when their process died is not known.
fn check_gpus(
    attempts: &BTreeMap<(String, u32), Attempt>,
    shares: &HashMap<&str, u32>,
    violations: &mut Vec<String>,
    unchecked: &mut BTreeMap<&'static str, usize>,
) {
    let mut held: BTreeMap<(String, String), Vec<Span>> = BTreeMap::new();
    for ((job, number), attempt) in attempts {
        let Some(end) = attempt.end else {
            *unchecked.entry("attempts_without_end").or_default() += 1;
            continue;
        };
        for gpu in &attempt.gpus {
            held.entry((attempt.node.clone(), gpu.clone()))
                .or_default()
                .push((attempt.start, end, format!("{job}#{number}")));
        }
    }
    let share_of = |name: &str| {
        let job = name.split(['#', '/']).next().unwrap_or_default();
        shares.get(job).copied().unwrap_or(100)
    };
    for ((node, gpu), spans) in held {
        // Ends before starts at the same instant.
        let mut changes: Vec<(u128, bool, &str)> = spans
            .iter()
            .flat_map(|(start, end, name)| [(*start, true, name.as_str()), (*end, false, name)])
            .collect();
        changes.sort();
        let mut holders: Vec<&str> = Vec::new();
        for (_, starts, name) in changes {
            if !starts {
                holders.retain(|h| *h != name);
                continue;
            }
            holders.push(name);
            let total: u32 = holders.iter().map(|h| share_of(h)).sum();
            if total > 100 {
                violations.push(format!(
                    "{} held GPU {gpu} of {node} at the same time ({total} hundredths of it)",
                    holders.join(" and ")
                ));
                break;
            }
        }
    }
}

/// No attempt of a job started after the job's recorded end (within the slack of a stepped
/// agent clock).
fn check_after_end(
    attempts: &BTreeMap<(String, u32), Attempt>,
    settled: &Settled,
    violations: &mut Vec<String>,
) {
    for ((key, number), attempt) in attempts {
        let job = key.split(RANK_MARK).next().unwrap_or_default();
        let ended = settled
            .records
            .get(job)
            .filter(|r| is_terminal(r))
            .and_then(|r| r["ended_at"].as_str())
            .and_then(|t| t.parse::<chrono::DateTime<chrono::Utc>>().ok())
            .and_then(|t| t.timestamp_nanos_opt());
        let Some(ended) = ended.and_then(|ns| u128::try_from(ns).ok()) else {
            continue;
        };
        if attempt.start > ended + AFTER_END_SLACK_NS {
            violations.push(format!(
                "{key}: attempt {number} started {:.1} s after the job's recorded end",
                (attempt.start - ended) as f64 / 1e9
            ));
        }
    }
}

/// An array `%N` never ran more than N tasks at once.
fn check_arrays(
    submitted: &Submitted,
    attempts: &BTreeMap<(String, u32), Attempt>,
    violations: &mut Vec<String>,
    unchecked: &mut BTreeMap<&'static str, usize>,
) {
    let mut arrays: BTreeMap<&str, (u32, Vec<Change>)> = BTreeMap::new();
    for job in &submitted.jobs {
        let Kind::ArrayTask { array, max_running } = &job.kind else {
            continue;
        };
        let entry = arrays
            .entry(array.as_str())
            .or_insert((*max_running, Vec::new()));
        for ((id, _), attempt) in attempts.range((job.id.clone(), 0)..(job.id.clone(), u32::MAX)) {
            debug_assert_eq!(id, &job.id);
            match attempt.end {
                Some(end) => entry.1.extend([(attempt.start, 1), (end, -1)]),
                None => *unchecked.entry("array_attempts_without_end").or_default() += 1,
            }
        }
    }
    for (array, (max_running, mut events)) in arrays {
        // Ends before starts at the same instant.
        events.sort_by_key(|(at, delta)| (*at, *delta));
        let mut running = 0;
        for (_, delta) in events {
            running += delta;
            if running > max_running as i32 {
                violations.push(format!(
                    "array {array}: {running} tasks ran at once, above its %{max_running}"
                ));
                break;
            }
        }
    }
}

/// A succeeded job's output holds its final attempt's numbered lines, in order, for each of
/// its ranks (every line says its attempt and rank: a gang's ranks print into one output);
/// exactly them when it ran once. A line of an earlier attempt may come anywhere: an agent
/// frozen while its attempt ran sends the rest of that attempt's output once it is thawed,
/// while the next attempt already runs elsewhere.
fn check_output(
    cli: &Cli,
    submitted: &Submitted,
    settled: &Settled,
    by_job: &HashMap<&str, BTreeMap<u32, Attempt>>,
    violations: &mut Vec<String>,
) {
    for job in &submitted.jobs {
        let succeeded = settled
            .records
            .get(&job.id)
            .is_some_and(|r| state_of(r) == "succeeded");
        if !succeeded {
            continue;
        }
        let attempt = settled
            .records
            .get(&job.id)
            .and_then(|r| r["attempt"].as_u64())
            .unwrap_or(1);
        let out = cli.run(job.user, &["logs", &job.id]);
        let text = String::from_utf8_lossy(&out.stdout);
        let ran_once = by_job
            .get(job.id.as_str())
            .is_some_and(|runs| runs.len() == 1);
        let ranks = if job.kind == Kind::Gang { 2 } else { 1 };
        for rank in 0..ranks {
            let numbers = numbered_lines(&text, attempt, rank);
            let expected: Vec<u32> = (1..=job.lines).collect();
            let mut wanted = expected.iter().peekable();
            for number in &numbers {
                if wanted.peek() == Some(&number) {
                    wanted.next();
                }
            }
            if wanted.peek().is_some() || (ran_once && numbers != expected) {
                violations.push(format!(
                    "{}: rank {rank}'s numbered lines of attempt {attempt} are {numbers:?}, \
                     not 1 to {} in order",
                    job.id, job.lines
                ));
            }
        }
    }
}

/// The numbers of the lines `chaos-line N ATTEMPT RANK` of `attempt` and `rank` in `text`, in
/// the order they come.
fn numbered_lines(text: &str, attempt: u64, rank: u32) -> Vec<u32> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.trim().strip_prefix("chaos-line ")?.split_whitespace();
            let number = fields.next()?.parse().ok()?;
            let of_attempt: u64 = fields.next()?.parse().ok()?;
            let of_rank: u32 = fields.next()?.parse().ok()?;
            (of_attempt == attempt && of_rank == rank).then_some(number)
        })
        .collect()
}

/// No process of any job is left once every job ended.
fn check_survivors(dir: &Path, violations: &mut Vec<String>) {
    let marker = dir.display().to_string();
    let me = std::process::id().to_string();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name == me || !name.chars().all(|c| c.is_ascii_digit()) {
            continue;
        }
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmdline.contains(&marker) && cmdline.contains("chaos-line") {
            violations.push(format!("process {name} of a job outlived it: {cmdline}"));
        }
    }
}

/// No cgroup of any of the campaign's jobs still holds a process once every job ended (the
/// agents' `mgpu/<node>/job-<id>-<attempt>` under every controller mounted).
fn check_cgroups(submitted: &Submitted, violations: &mut Vec<String>) {
    let ours: HashSet<&str> = submitted.jobs.iter().map(|j| j.id.as_str()).collect();
    let controllers = std::fs::read_dir("/sys/fs/cgroup")
        .into_iter()
        .flatten()
        .flatten();
    for controller in controllers {
        for node in crate::NODES {
            let dir = controller.path().join("mgpu").join(node);
            for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                let job = name
                    .strip_prefix("job-")
                    .and_then(|rest| rest.split('-').next())
                    .unwrap_or_default();
                if !ours.contains(job) {
                    continue;
                }
                let procs =
                    std::fs::read_to_string(entry.path().join("cgroup.procs")).unwrap_or_default();
                if !procs.trim().is_empty() {
                    violations.push(format!(
                        "cgroup {} still holds processes {}",
                        entry.path().display(),
                        procs.split_whitespace().collect::<Vec<_>>().join(",")
                    ));
                }
            }
        }
    }
}

/// How long `mgpu queue` takes to answer now, five times: median and longest, in ms.
/// How long `mgpu queue` took, five times in a row. A slow one (over a second) prints its
/// debug log, which says what it waited for.
fn queue_answers(cli: &Cli) -> Value {
    let mut took: Vec<f64> = (0..5)
        .map(|_| {
            let began = Instant::now();
            let out = cli.run_logged("alice", &["queue"]);
            let ms = began.elapsed().as_secs_f64() * 1000.0;
            if ms > 1000.0 {
                let log = String::from_utf8_lossy(&out.stderr);
                let lines: Vec<&str> = log.lines().collect();
                let tail = lines[lines.len().saturating_sub(40)..].join("\n  ");
                eprintln!("chaos: mgpu queue took {ms:.0} ms; its log ends:\n  {tail}");
            }
            ms
        })
        .collect();
    took.sort_by(f64::total_cmp);
    json!({"p50": took[2].round(), "max": took[4].round()})
}
