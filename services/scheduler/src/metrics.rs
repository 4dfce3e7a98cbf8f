//! The scheduler's Prometheus metrics, served on `--metrics-listen` (`GET /metrics`).
//!
//! Two kinds of numbers, kept apart because they live in different places:
//! - the [`Tally`]: counters and histograms (submissions, refusals, pass durations, queue
//!   waits), counted as things happen and kept for the life of the process, across
//!   leadership terms, so a replica that loses and regains the lease does not reset them;
//! - the [`Gauges`]: what the job and node tables hold now (jobs by state and user, GPUs held
//!   per user, nodes by state). Only the active scheduler has those tables, and they can be
//!   large, so they are not copied after every pass: at each scrape the event loop is asked
//!   for them (`driver::replica::SchedulerMetrics::render`) and counts them between two inputs.
//!
//! A standby replica answers with `mgpu_scheduler_leader 0` and its tally, without gauges.
//! [`render`] turns both into the exposition; it is pure and tested here. Names, labels and
//! their DCGM counterparts are listed in docs/operations.md ("Metrics").

use std::collections::BTreeMap;
use std::time::Duration;

use mgpu_metrics::{Exposition, Histogram, Kind};
use mgpu_protocol::job::{JobRecord, JobState};
use mgpu_protocol::request::Action;
use mgpu_protocol::signing::SignatureError;

/// Pass duration buckets, in seconds: a pass over a handful of jobs takes well under a
/// millisecond, one over 100 000 queued jobs about a second.
static PASS_BOUNDS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];
/// Queue wait buckets, in seconds: from a second to a week.
static WAIT_BOUNDS: [f64; 15] = [
    1.0, 5.0, 15.0, 30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 7200.0, 14_400.0, 43_200.0, 86_400.0,
    259_200.0, 604_800.0,
];

/// Why a request was refused, as the refusals counter labels it: a few fixed values, where
/// the requester is told a sentence.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum RefusalReason {
    /// No signature at all.
    Unsigned,
    /// Signature headers that do not parse.
    BadSignature,
    /// A signature that does not match the message and key.
    Forged,
    /// Signed too long before it arrived.
    Stale,
    /// Seen before.
    Replayed,
    /// Signed by a key that belongs to no user.
    UnknownKey,
    /// Someone acting on another's job, or a non-admin administering nodes.
    NotPermitted,
    /// A request body that does not decode.
    Malformed,
    /// A submission whose spec (or sender) is invalid.
    Invalid,
    /// A `--dedup` submission identical to a job already queued or running.
    Duplicate,
    /// Sent by an mgpu speaking a protocol this scheduler cannot read.
    Incompatible,
}

impl RefusalReason {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            RefusalReason::Unsigned => "unsigned",
            RefusalReason::BadSignature => "bad_signature",
            RefusalReason::Forged => "forged",
            RefusalReason::Stale => "stale",
            RefusalReason::Replayed => "replayed",
            RefusalReason::UnknownKey => "unknown_key",
            RefusalReason::NotPermitted => "not_permitted",
            RefusalReason::Malformed => "malformed",
            RefusalReason::Invalid => "invalid",
            RefusalReason::Duplicate => "duplicate",
            RefusalReason::Incompatible => "incompatible_protocol",
        }
    }

    pub(crate) fn of_signature(err: &SignatureError) -> Self {
        match err {
            SignatureError::Unsigned => RefusalReason::Unsigned,
            SignatureError::Malformed(_) => RefusalReason::BadSignature,
            SignatureError::Forged => RefusalReason::Forged,
            SignatureError::Stale(_) => RefusalReason::Stale,
            SignatureError::Replayed => RefusalReason::Replayed,
        }
    }
}

/// How a recorded submission came out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SubmitOutcome {
    Queued,
    Rejected(RefusalReason),
}

impl SubmitOutcome {
    /// From the record a submission made (None: it made none, its sender field was not a
    /// user name) and whether `--dedup` found its twin.
    pub(crate) fn of(record: Option<&JobRecord>, twin_found: bool) -> Self {
        match record.map(|r| &r.state) {
            Some(JobState::Queued(_)) => SubmitOutcome::Queued,
            Some(_) if twin_found => SubmitOutcome::Rejected(RefusalReason::Duplicate),
            _ => SubmitOutcome::Rejected(RefusalReason::Invalid),
        }
    }
}

/// The counters and histograms, kept for the life of the process.
#[derive(Clone, Debug)]
pub struct Tally {
    pass_seconds: Histogram,
    queue_wait_seconds: Histogram,
    /// Recorded submissions by (user, outcome).
    submissions: BTreeMap<(String, &'static str), u64>,
    /// Refused requests by (action, reason).
    refusals: BTreeMap<(&'static str, &'static str), u64>,
}

impl Default for Tally {
    fn default() -> Self {
        Tally {
            pass_seconds: Histogram::new(&PASS_BOUNDS),
            queue_wait_seconds: Histogram::new(&WAIT_BOUNDS),
            submissions: BTreeMap::new(),
            refusals: BTreeMap::new(),
        }
    }
}

impl Tally {
    pub(crate) fn pass(&mut self, took: Duration) {
        self.pass_seconds.observe(took.as_secs_f64());
    }

    /// A job started after waiting `waited` in the queue.
    pub(crate) fn started_after(&mut self, waited: chrono::Duration) {
        let seconds = waited.num_milliseconds().max(0) as f64 / 1000.0;
        self.queue_wait_seconds.observe(seconds);
    }

    pub(crate) fn refused(&mut self, action: Action, reason: RefusalReason) {
        *self
            .refusals
            .entry((action.as_str(), reason.as_str()))
            .or_default() += 1;
    }

    /// A submission recorded for `user`; a rejected one is a refusal too.
    pub(crate) fn submitted(&mut self, user: &str, outcome: SubmitOutcome) {
        let label = match outcome {
            SubmitOutcome::Queued => "queued",
            SubmitOutcome::Rejected(reason) => {
                self.refused(Action::Submit, reason);
                "rejected"
            }
        };
        *self
            .submissions
            .entry((user.to_owned(), label))
            .or_default() += 1;
    }
}

/// One user's jobs in the job table now.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct UserJobs {
    pub queued: u64,
    pub held: u64,
    pub running: u64,
    /// GPUs their running jobs hold (a shared GPU counts for its share).
    pub gpus: f64,
}

/// What the job and node tables hold now.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Gauges {
    pub jobs: BTreeMap<String, UserJobs>,
    /// Nodes by state: `online`, `drained` (online, taking no new work), `incompatible`
    /// (online, speaking a protocol this scheduler cannot read), `offline`.
    pub nodes: BTreeMap<&'static str, u64>,
}

/// The scheduler's exposition: whether it leads, what its tables hold (`gauges`, from the
/// active scheduler only) and what it counted.
pub(crate) fn render(leader: bool, gauges: Option<&Gauges>, tally: &Tally) -> String {
    let mut out = Exposition::new();
    out.family(
        "mgpu_scheduler_leader",
        Kind::Gauge,
        "1 while this scheduler replica holds the lease and schedules, 0 while it stands by.",
    )
    .sample(&[], if leader { 1.0 } else { 0.0 });
    if let Some(gauges) = gauges {
        render_gauges(&mut out, gauges);
    }
    render_tally(&mut out, tally);
    out.finish()
}

fn render_gauges(out: &mut Exposition, gauges: &Gauges) {
    out.family(
        "mgpu_jobs",
        Kind::Gauge,
        "Jobs waiting or running, by state (queued, held, running) and user.",
    );
    for (user, counts) in &gauges.jobs {
        for (state, count) in [
            ("queued", counts.queued),
            ("held", counts.held),
            ("running", counts.running),
        ] {
            out.sample(&[("state", state), ("user", user)], count as f64);
        }
    }
    out.family(
        "mgpu_user_gpus",
        Kind::Gauge,
        "GPUs held by each user's running jobs (a shared GPU counts for its share).",
    );
    for (user, counts) in &gauges.jobs {
        out.sample(&[("user", user)], counts.gpus);
    }
    out.family(
        "mgpu_nodes",
        Kind::Gauge,
        "Nodes by state: online, drained (taking no new jobs), incompatible (speaking a \
         protocol this scheduler cannot read), offline.",
    );
    for state in ["online", "drained", "incompatible", "offline"] {
        let count = gauges.nodes.get(state).copied().unwrap_or(0);
        out.sample(&[("state", state)], count as f64);
    }
}

fn render_tally(out: &mut Exposition, tally: &Tally) {
    out.family(
        "mgpu_queue_wait_seconds",
        Kind::Histogram,
        "Time jobs waited in the queue before they started, observed at each start.",
    )
    .histogram(&[], &tally.queue_wait_seconds);
    out.family(
        "mgpu_scheduler_pass_duration_seconds",
        Kind::Histogram,
        "Duration of scheduling passes, writes of their decisions included.",
    )
    .histogram(&[], &tally.pass_seconds);
    out.family(
        "mgpu_scheduler_submissions_total",
        Kind::Counter,
        "Submissions recorded, by user and outcome (queued, or rejected as invalid or duplicate).",
    );
    for ((user, outcome), count) in &tally.submissions {
        out.sample(&[("outcome", outcome), ("user", user)], *count as f64);
    }
    out.family(
        "mgpu_scheduler_refusals_total",
        Kind::Counter,
        "Requests refused, by action and reason.",
    );
    for ((action, reason), count) in &tally.refusals {
        out.sample(&[("action", action), ("reason", reason)], *count as f64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sample lines of an exposition (its HELP and TYPE lines left out).
    fn samples(text: &str) -> Vec<&str> {
        text.lines().filter(|l| !l.starts_with('#')).collect()
    }

    #[test]
    fn a_standby_replica_says_so_and_shows_only_its_counters() {
        let text = render(false, None, &Tally::default());
        assert!(text.contains("mgpu_scheduler_leader 0\n"), "{text}");
        assert!(!text.contains("mgpu_jobs"), "{text}");
        assert!(!text.contains("mgpu_nodes"), "{text}");
        assert!(
            text.contains("mgpu_scheduler_pass_duration_seconds_count 0\n"),
            "{text}"
        );
        // Nothing counted yet: the labelled counters have no series.
        assert!(!text.contains("mgpu_scheduler_refusals_total"), "{text}");
    }

    #[test]
    fn the_leader_shows_jobs_by_state_and_user_gpus_and_nodes() {
        let mut gauges = Gauges::default();
        gauges.jobs.insert(
            "alice".into(),
            UserJobs {
                queued: 2,
                held: 1,
                running: 1,
                gpus: 1.5,
            },
        );
        gauges.nodes.insert("online", 3);
        gauges.nodes.insert("offline", 1);
        let text = render(true, Some(&gauges), &Tally::default());
        let lines = samples(&text);
        for expected in [
            "mgpu_scheduler_leader 1",
            "mgpu_jobs{state=\"queued\",user=\"alice\"} 2",
            "mgpu_jobs{state=\"held\",user=\"alice\"} 1",
            "mgpu_jobs{state=\"running\",user=\"alice\"} 1",
            "mgpu_user_gpus{user=\"alice\"} 1.5",
            "mgpu_nodes{state=\"online\"} 3",
            "mgpu_nodes{state=\"drained\"} 0",
            "mgpu_nodes{state=\"offline\"} 1",
        ] {
            assert!(lines.contains(&expected), "{expected} missing in\n{text}");
        }
    }

    #[test]
    fn submissions_refusals_waits_and_passes_are_counted() {
        let mut tally = Tally::default();
        tally.submitted("alice", SubmitOutcome::Queued);
        tally.submitted("alice", SubmitOutcome::Queued);
        tally.submitted("bob", SubmitOutcome::Rejected(RefusalReason::Duplicate));
        tally.refused(Action::Cancel, RefusalReason::NotPermitted);
        tally.started_after(chrono::Duration::seconds(20));
        tally.started_after(chrono::Duration::milliseconds(-5));
        tally.pass(Duration::from_micros(700));
        let text = render(true, None, &tally);
        let lines = samples(&text);
        for expected in [
            "mgpu_scheduler_submissions_total{outcome=\"queued\",user=\"alice\"} 2",
            "mgpu_scheduler_submissions_total{outcome=\"rejected\",user=\"bob\"} 1",
            "mgpu_scheduler_refusals_total{action=\"cancel\",reason=\"not_permitted\"} 1",
            "mgpu_scheduler_refusals_total{action=\"submit\",reason=\"duplicate\"} 1",
            "mgpu_queue_wait_seconds_bucket{le=\"1\"} 1",
            "mgpu_queue_wait_seconds_bucket{le=\"15\"} 1",
            "mgpu_queue_wait_seconds_bucket{le=\"30\"} 2",
            "mgpu_queue_wait_seconds_count 2",
            "mgpu_queue_wait_seconds_sum 20",
            "mgpu_scheduler_pass_duration_seconds_bucket{le=\"0.0005\"} 0",
            "mgpu_scheduler_pass_duration_seconds_bucket{le=\"0.001\"} 1",
            "mgpu_scheduler_pass_duration_seconds_count 1",
        ] {
            assert!(lines.contains(&expected), "{expected} missing in\n{text}");
        }
        assert!(text.contains("# TYPE mgpu_scheduler_refusals_total counter\n"));
        assert!(text.contains("# TYPE mgpu_queue_wait_seconds histogram\n"));
    }

    #[test]
    fn a_submission_s_outcome_follows_its_record() {
        use mgpu_protocol::job::{JobSpec, WaitReason, Waiting};
        let mut record = JobRecord {
            id: mgpu_protocol::ids::JobId::random(),
            user: "alice".into(),
            user_key: None,
            spec: JobSpec::new(vec!["true".into()], "/tmp"),
            submitted_at: mgpu_protocol::now(),
            attempt: 1,
            state: JobState::Queued(Waiting::new(WaitReason::Submitted)),
            last_request: None,
            preemptions: Vec::new(),
        };
        assert_eq!(
            SubmitOutcome::of(Some(&record), false),
            SubmitOutcome::Queued
        );
        record.state = JobState::Failed(mgpu_protocol::job::Ending {
            placement: None,
            started_at: None,
            ended_at: mgpu_protocol::now(),
            exit_code: None,
            signal: None,
            reason: Some("not added".into()),
            usage: None,
        });
        assert_eq!(
            SubmitOutcome::of(Some(&record), true),
            SubmitOutcome::Rejected(RefusalReason::Duplicate)
        );
        assert_eq!(
            SubmitOutcome::of(Some(&record), false),
            SubmitOutcome::Rejected(RefusalReason::Invalid)
        );
        assert_eq!(
            SubmitOutcome::of(None, false),
            SubmitOutcome::Rejected(RefusalReason::Invalid)
        );
    }
}
