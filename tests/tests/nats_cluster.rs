//! NATS as the distributed engine, told as a story: mgpu runs on a cluster of three
//! nats-servers, and one of them is SIGKILLed while jobs run and users keep submitting.
//! Nothing is lost and nothing runs twice.
//!
//! Every stream and bucket has three replicas (the scheduler's `--replicas auto` with three
//! server URLs), so each one survives the loss of any single server: the two left keep a Raft
//! majority and elect new leaders. The server killed is the one leading the most of mgpu's
//! streams and buckets, so the most leader elections happen at once, the request stream's
//! leader among them when that is a tie: every submission waiting to be stored, and every
//! request the scheduler takes, goes through that leader. Components connected to it lose
//! their connection and must reconnect to another server from the list they were given.
//!
//! Each job appends its id to a marker file: every id must appear there exactly once. A hold
//! and a cancel sent as the server dies take the same retried path as the submissions, and
//! each is applied exactly once.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use mgpu_protocol::principals::Role;
use mgpu_protocol::subjects;
use mgpu_tests::{Cluster, NodeSpec, bin_dir, wait_for};
use serde_json::Value;

/// The stories' agents beat every 200 ms, and while the heartbeat stream has no leader each
/// beat waits up to 1 s for its acknowledgement before the next: 3 missed beats (0.6 s) would
/// call a healthy node lost. With the default 2 s interval, beats stay 2 s apart and 3 missed
/// (6 s) outlast the elections; 10 × 200 ms gives the stories the same margin.
const MISSED_HEARTBEATS: [&str; 2] = ["--missed-heartbeats", "10"];

/// The stream of the bucket holding the scheduler's lease.
const LEASE_STREAM: &str = "KV_mgpu-leader";

static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// One submission: when it started, how long `mgpu submit` took, and the job id (or the error).
struct Submission {
    at: Instant,
    took: Duration,
    result: Result<String, String>,
}

/// How `mgpu submit` is run from the submitting thread (the test thread keeps the cluster).
struct Submitter {
    mgpu: PathBuf,
    server: String,
    creds: PathBuf,
    dir: PathBuf,
    marker: PathBuf,
}

impl Submitter {
    /// `mgpu ARGS` as the submitting user.
    fn mgpu(&self, args: &[&str]) -> std::io::Result<std::process::Output> {
        Command::new(&self.mgpu)
            .args(args)
            .env("MGPU_SERVER", &self.server)
            .env("MGPU_CREDS", &self.creds)
            .env("USER", "alice")
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .output()
    }

    fn submit(&self) -> Submission {
        let at = Instant::now();
        let command = format!("echo \"$MGPU_JOB_ID\" >> '{}'", self.marker.display());
        let out = self.mgpu(&["submit", "--json", "--", &command]);
        let result = match out {
            Ok(out) if out.status.success() => serde_json::from_slice::<Value>(&out.stdout)
                .ok()
                .and_then(|json| json["id"].as_str().map(str::to_owned))
                .ok_or_else(|| format!("no id in {}", String::from_utf8_lossy(&out.stdout))),
            Ok(out) => Err(String::from_utf8_lossy(&out.stderr).into_owned()),
            Err(err) => Err(err.to_string()),
        };
        Submission {
            at,
            took: at.elapsed(),
            result,
        }
    }
}

/// The server to kill: the one leading the most streams, the request stream's leader first.
fn busiest_leader(leaders: &BTreeMap<String, String>) -> String {
    let mut count: BTreeMap<&str, usize> = BTreeMap::new();
    for leader in leaders.values() {
        *count.entry(leader).or_default() += 1;
    }
    let requests = leaders
        .get(subjects::REQUESTS_STREAM)
        .map(String::as_str)
        .unwrap_or("");
    count
        .iter()
        .max_by_key(|(name, n)| (**n, **name == requests))
        .map(|(name, _)| (*name).to_owned())
        .unwrap_or_else(|| panic!("no stream has a leader: {leaders:?}"))
}

fn replicas_of(cluster: &Cluster, stream: &'static str) -> usize {
    cluster.with_nats(&cluster.admin_creds(), |client| async move {
        let js = async_nats::jetstream::new(client);
        let mut handle = js
            .get_stream(stream)
            .await
            .unwrap_or_else(|e| panic!("stream {stream}: {e}"));
        handle
            .info()
            .await
            .map(|info| info.config.num_replicas)
            .unwrap_or_else(|e| panic!("stream {stream}: {e}"))
    })
}

/// The server leading the fewest of mgpu's streams.
fn quietest_server(cluster: &Cluster, leaders: &BTreeMap<String, String>) -> String {
    cluster
        .nats_server_names()
        .into_iter()
        .min_by_key(|name| leaders.values().filter(|l| *l == name).count())
        .unwrap_or_else(|| panic!("no servers"))
}

/// A server whose streams were handed over first (as before maintenance, or after JetStream
/// rebalanced) is SIGKILLed: the clients connected to it reconnect to the other two, the
/// replicas it held are simply missing, and nothing waits for an election but the audit
/// trail, which it still led.
#[test]
fn one_of_three_nats_servers_killed_while_jobs_run_loses_nothing_and_runs_nothing_twice() {
    lose_a_server(true);
}

/// The server leading the most streams is SIGKILLed: every stream it led is without a leader
/// for about 5 s. Submissions wait and are stored (the CLI retries); the scheduler retries its
/// own writes (job records, assignments, kills) and does not count the time it could not see
/// heartbeats as the node's silence. The bucket holding the scheduler's lease is moved onto
/// that server first: its election outlasts the lease, and the scheduler must take its
/// expired lease again and go on, not step down and start over.
#[test]
fn the_busiest_of_three_nats_servers_killed_while_jobs_run_loses_nothing() {
    lose_a_server(false);
}

/// Measured with nats-server 2.14.6: a SIGKILLed stream leader is replaced after about 5 s, a
/// step-down within a second. The agent fences itself only after 15 s without a stored
/// heartbeat here (the production default is 10 s), longer than an election: a server lost
/// must stop no job.
fn lose_a_server(hand_over_first: bool) {
    // One story at a time: two three-server clusters at once on a small machine make
    // elections, not mgpu, the subject of the story.
    let _one_at_a_time = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let mut cluster = Cluster::start_on_nats_cluster(
        3,
        &[NodeSpec::new("node001", "4x24GiB").agent_args(&["--fence-after", "15s"])],
        &MISSED_HEARTBEATS,
    );
    assert_eq!(cluster.server_url().split(',').count(), 3);
    for stream in [subjects::REQUESTS_STREAM, subjects::JOBS_BUCKET_STREAM] {
        assert_eq!(replicas_of(&cluster, stream), 3, "{stream}");
    }

    let marker = cluster.dir.path().join("ran.marks");
    let submitter = Submitter {
        mgpu: bin_dir().join("mgpu"),
        server: cluster.server_url(),
        creds: cluster.creds(Role::User, "alice"),
        dir: cluster.dir.path().to_path_buf(),
        marker: marker.clone(),
    };
    // A running job to cancel and a waiting one to hold once the server is gone.
    let sleeper = cluster.submit(&["--gpus", "0"], "sleep 600");
    let waiter = cluster.submit(&["--gpus", "0", "--after", &sleeper], "true");
    cluster.wait_state(&sleeper, "running", Duration::from_secs(20));
    cluster.wait_reason(
        &waiter,
        "waiting for the jobs it depends on",
        Duration::from_secs(20),
    );
    // Handed over before any job runs, as an operator would before maintenance.
    let planned = hand_over_first.then(|| {
        let victim = quietest_server(&cluster, &cluster.stream_leaders());
        cluster.move_leaders_off(&victim);
        // All but the audit trail's: the hold and the cancel below are applied at once, while
        // the stream recording them elects a leader, and their records must be stored all
        // the same.
        cluster.move_leader_onto(subjects::AUDIT_STREAM, &victim);
        victim
    });
    let stop = AtomicBool::new(false);
    let completed = std::sync::atomic::AtomicUsize::new(0);
    let (submissions, killed, at, (held, cancelled)) = std::thread::scope(|scope| {
        let submitting = scope.spawn(|| {
            let mut done = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                done.push(submitter.submit());
                completed.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(50));
            }
            done
        });
        // Jobs are running and more are being submitted: pull the plug on a server.
        // A panic here must still stop the submitting thread, or the scope never ends.
        let started = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            wait_for("the first jobs to run", Duration::from_secs(20), || {
                let ran = std::fs::read_to_string(&marker).unwrap_or_default();
                (ran.lines().count() >= 3).then_some(())
            })
        }));
        if let Err(panic) = started {
            stop.store(true, Ordering::Relaxed);
            std::panic::resume_unwind(panic);
        }
        let mut leaders = cluster.stream_leaders();
        let victim = planned.clone().unwrap_or_else(|| busiest_leader(&leaders));
        if planned.is_none() {
            // The scheduler's lease goes down with it too: its bucket's election outlasts the
            // lease, which must not make the scheduler step down and start over.
            cluster.move_leader_onto(LEASE_STREAM, &victim);
            leaders = cluster.stream_leaders();
        }
        eprintln!("stream leaders: {leaders:?}; killing {victim}");
        let at = Instant::now();
        let before_kill = completed.load(Ordering::Relaxed);
        cluster.kill_nats_server(&victim);
        let requests = scope.spawn(|| {
            (
                submitter.mgpu(&["hold", &waiter]),
                submitter.mgpu(&["cancel", &sleeper]),
            )
        });
        // Past the election (about 5 s): until a few submissions made after the kill are done
        // (each waits the election out), however long a loaded machine takes.
        let waited = Instant::now();
        while completed.load(Ordering::Relaxed) < before_kill + 4
            && waited.elapsed() < Duration::from_secs(60)
        {
            std::thread::sleep(Duration::from_millis(100));
        }
        std::thread::sleep(Duration::from_secs(2));
        stop.store(true, Ordering::Relaxed);
        let submissions = submitting
            .join()
            .unwrap_or_else(|_| panic!("the submitting thread panicked"));
        let requested = requests
            .join()
            .unwrap_or_else(|_| panic!("the requesting thread panicked"));
        (submissions, victim, at, requested)
    });

    // Every submission was accepted, those during the elections included.
    let failed: Vec<&String> = submissions
        .iter()
        .filter_map(|s| s.result.as_ref().err())
        .collect();
    assert!(failed.is_empty(), "submissions failed: {failed:?}");
    let after: Vec<&Submission> = submissions.iter().filter(|s| s.at > at).collect();
    // One submission in flight at a time: one that meets the election waits it out (the
    // CLI retries), so how many follow depends on how long the election takes.
    assert!(!after.is_empty(), "no submission after the kill");
    let slowest = after.iter().map(|s| s.took).max().unwrap_or_default();
    eprintln!(
        "{} submissions, {} after killing {killed}; slowest after the kill took {slowest:?}",
        submissions.len(),
        after.len()
    );

    // Every job ends `succeeded`, and each ran exactly once.
    let ids: Vec<String> = submissions
        .iter()
        .filter_map(|s| s.result.clone().ok())
        .collect();
    let settled = Instant::now();
    for id in &ids {
        cluster.finished_as(id, "succeeded", Duration::from_secs(30));
    }
    eprintln!(
        "all {} jobs succeeded {:?} after the kill ({:?} waiting at the end)",
        ids.len(),
        at.elapsed(),
        settled.elapsed()
    );
    let ran = std::fs::read_to_string(&marker).unwrap_or_default();
    let mut runs: BTreeMap<&str, usize> = BTreeMap::new();
    for line in ran.lines() {
        *runs.entry(line.trim()).or_default() += 1;
    }
    let twice: Vec<(&&str, &usize)> = runs.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "jobs that ran more than once: {twice:?}");
    let submitted: BTreeSet<&str> = ids.iter().map(String::as_str).collect();
    let ran_ids: BTreeSet<&str> = runs.keys().copied().collect();
    assert_eq!(
        ran_ids, submitted,
        "the jobs that ran are the jobs submitted"
    );

    // The scheduler acted throughout: it never stepped down to start over.
    let scheduler_log = std::fs::read_to_string(cluster.log_path("scheduler")).unwrap_or_default();
    assert_eq!(
        scheduler_log.matches("scheduler ready").count(),
        1,
        "the scheduler started over"
    );

    // Every stream is led by a surviving server, still with three replicas (one offline).
    let leaders = cluster.stream_leaders();
    assert!(
        leaders.values().all(|leader| *leader != killed),
        "{killed} still leads: {leaders:?}"
    );
    assert_eq!(replicas_of(&cluster, subjects::REQUESTS_STREAM), 3);

    requests_through_the_election_were_applied_once(&cluster, (&sleeper, &waiter), held, cancelled);

    // The clients carry on: a new submission runs, and the queue answers.
    let last = cluster.submit(
        &[],
        &format!("echo \"$MGPU_JOB_ID\" >> '{}'", marker.display()),
    );
    cluster.finished_as(&last, "succeeded", Duration::from_secs(30));
    assert!(cluster.all_jobs().len() > ids.len());
    // Reads may take a few tries each while a server is missing (see `create_reader`).
    cluster.wait_nodes_online_within(1, Duration::from_secs(60));
}

/// The hold of `waiter` and the cancel of `sleeper`, sent as the server died, were stored
/// through the elections (the CLI retries them as it does submissions) and applied once each:
/// a retry whose first try was stored after all is dropped by its message id.
fn requests_through_the_election_were_applied_once(
    cluster: &Cluster,
    (sleeper, waiter): (&str, &str),
    held: std::io::Result<std::process::Output>,
    cancelled: std::io::Result<std::process::Output>,
) {
    let said = |out: &std::process::Output| {
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    };
    let held = held.unwrap_or_else(|e| panic!("mgpu hold: {e}"));
    // Stored, and then seen applied; or stored and applied later than the command waits for
    // (the scheduler meets the elections too). A request that was not stored fails otherwise.
    assert!(
        held.status.success() || said(&held).contains("did not hold job"),
        "mgpu hold: {}",
        said(&held)
    );
    let cancelled = cancelled.unwrap_or_else(|e| panic!("mgpu cancel: {e}"));
    eprintln!(
        "as the server died: mgpu hold said {:?}, mgpu cancel said {:?}",
        said(&held).trim(),
        said(&cancelled).trim()
    );
    assert!(
        cancelled.status.success(),
        "mgpu cancel: {}",
        said(&cancelled)
    );
    cluster.finished_as(sleeper, "cancelled", Duration::from_secs(30));
    let applied = |action: &str, target: &str| {
        let audit = cluster.mgpu_ok_with(&cluster.admin_creds(), &["admin", "audit", "--json"]);
        audit
            .lines()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .filter(|r| r["action"] == action && r["target"] == target)
            .count()
    };
    wait_for(
        "the hold and the cancel in the audit trail",
        Duration::from_secs(30),
        || (applied("hold", waiter) > 0 && applied("cancel", sleeper) > 0).then_some(()),
    );
    assert_eq!(
        applied("hold", waiter),
        1,
        "the hold was applied more than once"
    );
    assert_eq!(
        applied("cancel", sleeper),
        1,
        "the cancel was applied more than once"
    );
}

/// The scheduler reads agents' reports, and an agent its assignments, through a continuous
/// pull: one request waiting at the server that leads the consumer. Here that server dies
/// while the reader stays connected to another one, so nothing but the pull's idle
/// heartbeats can tell the reader its request may be gone.
#[test]
fn a_pull_whose_consumer_leader_dies_resumes_soon_after_the_election() {
    pull_across_a_lost_leader(false);
}

/// As above, but the reader was connected to the server that dies, which also led the
/// stream: it reconnects to another while both the stream and the consumer elect a leader.
#[test]
fn a_pull_whose_server_dies_with_the_leaders_resumes_soon_after_the_election() {
    pull_across_a_lost_leader(true);
}

/// A message stored after the election must arrive within seconds, not when a lost pull
/// request would have expired (half a minute with async-nats's defaults).
fn pull_across_a_lost_leader(reader_on_leader: bool) {
    use async_nats::jetstream::{self, AckKind, consumer, stream};
    use mgpu_nats::pull::Pull;

    const STREAM: &str = "PULL_TEST";
    const CONSUMER: &str = "pull-test";
    let _one_at_a_time = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let mut cluster = Cluster::start_on_nats_cluster(3, &[], &MISSED_HEARTBEATS);
    let runtime = runtime_for_a_reader();
    // The JetStream context spawns its acknowledgement task on the current runtime.
    let _in_runtime = runtime.enter();
    // A reader given every server (it reconnects to another when its own dies), or only one
    // (killing any other never disconnects it).
    let urls = if reader_on_leader {
        cluster.server_url()
    } else {
        cluster.nats_url_of(&cluster.nats_server_names()[0])
    };
    let client = runtime.block_on(cluster.connect(&urls, &cluster.admin_creds()));
    let home = client.server_info().server_name;
    let js = jetstream::new(client.clone());
    let consumer = runtime.block_on(async {
        let stream = js
            .create_stream(stream::Config {
                name: STREAM.to_owned(),
                subjects: vec!["pulltest.>".to_owned()],
                num_replicas: 3,
                ..Default::default()
            })
            .await
            .unwrap_or_else(|e| panic!("creating the stream: {e}"));
        stream
            .create_consumer(consumer::pull::Config {
                durable_name: Some(CONSUMER.to_owned()),
                ack_policy: consumer::AckPolicy::Explicit,
                ..Default::default()
            })
            .await
            .unwrap_or_else(|e| panic!("creating the consumer: {e}"))
    });
    // Leaders are moved by step-downs until they sit where the story wants them.
    let placed = |leader: &str| (leader == home) == reader_on_leader;
    let victim = wait_for("the leaders to be placed", Duration::from_secs(60), || {
        runtime.block_on(async {
            let consumer_leader = consumer
                .clone()
                .info()
                .await
                .ok()
                .and_then(|info| info.cluster.clone())
                .and_then(|cluster| cluster.leader)?;
            let stream_leader = js
                .get_stream(STREAM)
                .await
                .ok()?
                .info()
                .await
                .ok()
                .and_then(|info| info.cluster.clone())
                .and_then(|cluster| cluster.leader)?;
            let stream_placed = !reader_on_leader || stream_leader == consumer_leader;
            if placed(&consumer_leader) && stream_placed {
                return Some(consumer_leader);
            }
            let step_down = if placed(&consumer_leader) {
                format!("$JS.API.STREAM.LEADER.STEPDOWN.{STREAM}")
            } else {
                format!("$JS.API.CONSUMER.LEADER.STEPDOWN.{STREAM}.{CONSUMER}")
            };
            let _ = client.request(step_down, "".into()).await;
            tokio::time::sleep(Duration::from_millis(500)).await;
            None
        })
    });
    let mut pull = runtime
        .block_on(Pull::new(consumer, "pull test"))
        .unwrap_or_else(|e| panic!("starting the pull: {e}"));

    let publish_until_stored = |payload: &'static str| {
        runtime.block_on(async {
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                let stored = match js.publish("pulltest.message", payload.into()).await {
                    Ok(ack) => ack.await.is_ok(),
                    Err(_) => false,
                };
                if stored {
                    return Instant::now();
                }
                assert!(Instant::now() < deadline, "{payload} was never stored");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
    };
    let mut receive = |within: Duration| {
        runtime.block_on(async {
            let message = tokio::time::timeout(within, pull.next()).await.ok()?;
            let _ = message.ack_with(AckKind::Ack).await;
            Some(String::from_utf8_lossy(&message.payload).into_owned())
        })
    };
    publish_until_stored("before");
    assert_eq!(receive(Duration::from_secs(10)).as_deref(), Some("before"));

    eprintln!("the consumer is led by {victim}, the reader connected to {home}; killing {victim}");
    let killed = Instant::now();
    cluster.kill_nats_server(&victim);
    // Stored once the stream has a leader again (the publish waits out its election).
    let stored = publish_until_stored("after");
    let got = receive(Duration::from_secs(60));
    let delivered = stored.elapsed();
    eprintln!(
        "stored {:?} after the kill, delivered {delivered:?} after that",
        stored - killed
    );
    assert_eq!(
        got.as_deref(),
        Some("after"),
        "nothing delivered within 60 s"
    );
    assert!(
        delivered < Duration::from_secs(12),
        "delivered {delivered:?} after it was stored: the pull waited on its lost request"
    );
}

/// A scheduler that stops acting (its lease taken, or shut down) hands back what it had
/// pulled and not handled: whoever reads the consumer next gets those messages at once, not
/// after the 30 s acknowledgement wait.
#[test]
fn messages_pulled_and_handed_back_go_to_the_next_reader_at_once() {
    use async_nats::jetstream::{AckKind, consumer, stream};
    use mgpu_nats::pull::Pull;

    let (_cluster, runtime, js) = single_server_with_an_admin_context();
    let _in_runtime = runtime.enter();
    runtime.block_on(async {
        let stream = js
            .create_stream(stream::Config {
                name: "HAND_BACK".to_owned(),
                subjects: vec!["handback.>".to_owned()],
                ..Default::default()
            })
            .await
            .unwrap_or_else(|e| panic!("creating the stream: {e}"));
        let consumer = stream
            .create_consumer(consumer::pull::Config {
                durable_name: Some("hand-back".to_owned()),
                ack_policy: consumer::AckPolicy::Explicit,
                ack_wait: Duration::from_secs(30),
                ..Default::default()
            })
            .await
            .unwrap_or_else(|e| panic!("creating the consumer: {e}"));
        for n in 0..3 {
            js.publish("handback.message", format!("{n}").into())
                .await
                .unwrap_or_else(|e| panic!("publishing: {e}"))
                .await
                .unwrap_or_else(|e| panic!("not stored: {e}"));
        }
        let mut first_reader = Pull::new(consumer.clone(), "first reader")
            .await
            .unwrap_or_else(|e| panic!("starting the pull: {e}"));
        let handled = first_reader.next().await;
        assert_eq!(&handled.payload[..], b"0");
        let _ = handled.ack_with(AckKind::Ack).await;
        // The other two arrived with the same pull and wait in this process.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(first_reader.give_back().await, 2);
        drop(first_reader);

        let mut next_reader = Pull::new(consumer, "next reader")
            .await
            .unwrap_or_else(|e| panic!("starting the pull: {e}"));
        let mut got = Vec::new();
        while got.len() < 2 {
            let message = tokio::time::timeout(Duration::from_secs(10), next_reader.next())
                .await
                .unwrap_or_else(|_| {
                    panic!("only {got:?} within 10 s: the rest waits for the ack wait")
                });
            got.push(String::from_utf8_lossy(&message.payload).into_owned());
            let _ = message.ack_with(AckKind::Ack).await;
        }
        got.sort();
        assert_eq!(got, ["1", "2"]);
    });
}

/// A read of the latest record per subject whose consumer is lost partway starts over with a
/// new one, and hands each subject's latest message once. (async-nats's own recovery would go
/// on from the last sequence seen, and deliver the older revisions stored after it.)
#[test]
fn a_latest_records_read_that_loses_its_consumer_starts_over() {
    use async_nats::jetstream::stream;
    use mgpu_nats::records::{Delivery, for_each_last_per_subject};
    use std::collections::BTreeMap;

    // Over one pull's batch (500), so the read still needs the consumer after its loss.
    const SUBJECTS: usize = 2000;
    let (_cluster, runtime, js) = single_server_with_an_admin_context();
    let _in_runtime = runtime.enter();
    runtime.block_on(async {
        js.create_stream(stream::Config {
            name: "LATEST".to_owned(),
            subjects: vec!["latest.>".to_owned()],
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("creating the stream: {e}"));
        // Every subject once, then the even ones again: the latest of an odd subject comes
        // before older revisions of even ones in the stream.
        let mut acks = Vec::new();
        let revisions = (0..SUBJECTS)
            .map(|n| (n, "v1"))
            .chain((0..SUBJECTS).step_by(2).map(|n| (n, "v2")));
        for (n, revision) in revisions {
            let ack = js
                .publish(format!("latest.{n}"), revision.into())
                .await
                .unwrap_or_else(|e| panic!("publishing: {e}"));
            acks.push(ack);
        }
        for ack in acks {
            ack.await.unwrap_or_else(|e| panic!("not stored: {e}"));
        }
    });

    let mut delivered: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut started_over = 0;
    let mut consumer_deleted = false;
    runtime
        .block_on(for_each_last_per_subject(
            &js,
            "LATEST",
            "latest.>",
            false,
            |delivery| {
                match delivery {
                    Delivery::StartOver => {
                        started_over += 1;
                        delivered.clear();
                    }
                    Delivery::Message(message, _) => {
                        delivered
                            .entry(message.subject.to_string())
                            .or_default()
                            .push(String::from_utf8_lossy(&message.payload).into_owned());
                    }
                }
                if !consumer_deleted {
                    consumer_deleted = true;
                    // As when the server holding it dies: the consumer is gone mid-read.
                    tokio::task::block_in_place(|| {
                        tokio::runtime::Handle::current().block_on(delete_every_consumer(&js))
                    });
                }
                Ok(())
            },
        ))
        .unwrap_or_else(|e| panic!("reading the latest records: {e}"));

    assert_eq!(delivered.len(), SUBJECTS);
    for (subject, revisions) in &delivered {
        let n: usize = subject
            .trim_start_matches("latest.")
            .parse()
            .unwrap_or_else(|e| panic!("{subject}: {e}"));
        let latest = if n.is_multiple_of(2) { "v2" } else { "v1" };
        assert_eq!(revisions, &[latest], "{subject}");
    }
    assert!(
        started_over >= 1,
        "the read never noticed its lost consumer"
    );
}

async fn delete_every_consumer(js: &async_nats::jetstream::Context) {
    use futures::TryStreamExt as _;
    let stream = js
        .get_stream("LATEST")
        .await
        .unwrap_or_else(|e| panic!("the stream: {e}"));
    let names: Vec<String> = stream
        .consumer_names()
        .try_collect()
        .await
        .unwrap_or_else(|e| panic!("listing consumers: {e}"));
    assert!(!names.is_empty(), "the read has no consumer");
    for name in names {
        stream
            .delete_consumer(&name)
            .await
            .unwrap_or_else(|e| panic!("deleting consumer {name}: {e}"));
    }
}

/// A lone nats-server (no mgpu service), the runtime a story reads on, and a JetStream context
/// with admin rights on that server.
fn single_server_with_an_admin_context() -> (
    Cluster,
    tokio::runtime::Runtime,
    async_nats::jetstream::Context,
) {
    let cluster = Cluster::server_only(&[]);
    let runtime = runtime_for_a_reader();
    let js = runtime.block_on(async {
        let client = cluster
            .connect(&cluster.server_url(), &cluster.admin_creds())
            .await;
        async_nats::jetstream::new(client)
    });
    (cluster, runtime, js)
}

/// The runtime a pull story reads on, kept across its steps (a kill in between): the pull's
/// background task and the acknowledgements need it running while the story waits.
fn runtime_for_a_reader() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("tokio runtime: {e}"))
}
