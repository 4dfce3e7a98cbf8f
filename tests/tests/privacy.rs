//! Users who don't trust each other, told as attacks by a second user or a second node with
//! the real server's permissions: bob looks for alice's environment everywhere a user can
//! look (her job's record in KV, her submission, the environments' bucket, `mgpu show`) and
//! finds nothing of it, while her job gets it and she still sees it; a node cannot make its
//! assignment consumer take another node's assignments; a wall screen's viewer reads what it
//! shows and nothing else.

use std::time::Duration;

use mgpu_protocol::ids::JobId;
use mgpu_protocol::principals::Role;
use mgpu_protocol::subjects;
use mgpu_tests::{Cluster, NodeSpec, wait_for};
use serde_json::Value;

const T: Duration = Duration::from_secs(30);

/// How long an answer a refused request will never get is waited for.
const REFUSED_WAIT: Duration = Duration::from_secs(2);

/// `mgpu show ID --json` as `creds`.
fn show_as(cluster: &Cluster, creds: &std::path::Path, id: &str) -> (Value, String) {
    let out = cluster.mgpu_ok_with(creds, &["show", id, "--json"]);
    let value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    (value, out)
}

/// The answer `creds` gets to a request of `body` on `subject`; None when none comes (the
/// server refused the request: it answers nothing then).
fn request_as(
    cluster: &Cluster,
    creds: &std::path::Path,
    subject: String,
    body: String,
) -> Option<async_nats::Message> {
    cluster.with_nats(creds, |client| async move {
        tokio::time::timeout(REFUSED_WAIT, client.request(subject, body.into()))
            .await
            .ok()
            .and_then(Result::ok)
    })
}

/// The payload of `request_as`'s answer, as text.
fn answer_text(reply: async_nats::Message) -> String {
    String::from_utf8_lossy(&reply.payload).into_owned()
}

/// The bytes `creds` gets from a direct get (empty when refused or when there is nothing).
fn direct_get_as(cluster: &Cluster, creds: &std::path::Path, request: String) -> Vec<u8> {
    request_as(cluster, creds, request, String::new())
        .filter(|reply| reply.status.is_none())
        .map(|reply| reply.payload.to_vec())
        .unwrap_or_default()
}

/// Asserts that `creds` can read what `request` (a direct get) answers, which names `id`, and
/// that `secret` is not in it.
fn readable_without(
    cluster: &Cluster,
    creds: &std::path::Path,
    request: String,
    (id, secret): (&str, &str),
) {
    let read = String::from_utf8_lossy(&direct_get_as(cluster, creds, request)).into_owned();
    assert!(read.contains(id), "bob could not read it at all: {read}");
    assert!(!read.contains(secret), "it has the secret: {read}");
}

#[test]
fn another_user_finds_a_jobs_environment_nowhere_while_the_job_and_its_owner_get_it() {
    let mut cluster = Cluster::start(&[NodeSpec::new("node001", "1x24GiB")]);
    let secret = format!("wandb-{}", JobId::random());
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let expected = dir.path().join("expected");
    let go = dir.path().join("go");
    std::fs::write(&expected, &secret).unwrap_or_else(|e| panic!("{e}"));
    // The job waits for the word, then says whether the key reached it (never the key: its
    // output is readable by every user).
    let command = format!(
        "while [ ! -e {go} ]; do sleep 0.1; done; \
         [ \"$WANDB_API_KEY\" = \"$(cat {expected})\" ] && echo key-arrived",
        go = go.display(),
        expected = expected.display()
    );
    cluster.set_cli_env("WANDB_API_KEY", &secret);
    let id = cluster.submit(&[], &command);
    cluster.wait_state(&id, "running", T);

    let bob = cluster.user_creds("bob");
    // mgpu show: withheld, in both forms.
    let (shown, text) = show_as(&cluster, &bob, &id);
    assert_eq!(shown["environment"], "withheld", "{text}");
    assert!(!text.contains(&secret), "bob's show has the key: {text}");
    let human = cluster.mgpu_ok_with(&bob, &["show", &id]);
    assert!(
        human.contains("environment:") && human.contains("withheld"),
        "{human}"
    );
    assert!(!human.contains(&secret), "{human}");

    // The job record, straight from KV.
    readable_without(
        &cluster,
        &bob,
        format!(
            "$JS.API.DIRECT.GET.{}.$KV.{}.{id}",
            subjects::JOBS_BUCKET_STREAM,
            subjects::JOBS_BUCKET
        ),
        (&id, &secret),
    );

    // The environments' bucket, under alice's key: the server refuses, nothing comes.
    let alice_key = shown["record"]["user_key"]
        .as_str()
        .unwrap_or_else(|| panic!("no owner key in {shown}"))
        .to_owned();
    let job: JobId = id.parse().unwrap_or_else(|e| panic!("{e}"));
    let stolen = direct_get_as(
        &cluster,
        &bob,
        mgpu_nats::job_env::get_subject(&alice_key, &job),
    );
    assert!(
        stolen.is_empty(),
        "bob read alice's environment: {stolen:?}"
    );

    // The owner and an admin see it.
    let (own, _) = show_as(&cluster, &cluster.user_creds("alice"), &id);
    assert_eq!(own["environment"], "shown");
    assert_eq!(
        own["record"]["spec"]["env"]["WANDB_API_KEY"],
        secret.as_str()
    );
    let (admin, _) = show_as(&cluster, &cluster.admin_creds(), &id);
    assert_eq!(
        admin["record"]["spec"]["env"]["WANDB_API_KEY"],
        secret.as_str()
    );

    // And the job got it through its assignment.
    std::fs::write(&go, "").unwrap_or_else(|e| panic!("{e}"));
    cluster.finished_as(&id, "succeeded", T);
    let logs = cluster.mgpu_ok(&["logs", &id]);
    assert!(logs.contains("key-arrived"), "{logs}");
}

#[test]
fn a_pending_submission_carries_no_environment_for_another_user_to_read() {
    let mut cluster = Cluster::start(&[NodeSpec::new("node001", "1x24GiB")]);
    // With the scheduler stopped, the submission waits in MGPU_REQUESTS, where users read
    // pending submissions (mgpu queue lists them).
    cluster.kill_scheduler();
    let secret = format!("token-{}", JobId::random());
    cluster.set_cli_env("HF_TOKEN", &secret);
    let id = cluster.submit(&[], "true");
    readable_without(
        &cluster,
        &cluster.user_creds("bob"),
        format!(
            "$JS.API.DIRECT.GET.{}.{}",
            subjects::REQUESTS_STREAM,
            subjects::SUBMIT
        ),
        (&id, &secret),
    );
    // The scheduler takes it later, and the job runs with it.
    cluster.start_scheduler();
    let job = cluster.finished_as(&id, "succeeded", T);
    assert_eq!(job["id"], id.as_str());
}

#[test]
fn a_node_cannot_make_its_consumer_take_another_nodes_assignments() {
    let cluster = Cluster::start(&[
        NodeSpec::new("node001", "1x24GiB"),
        NodeSpec::without_agent("node002"),
    ]);
    let stream = subjects::ASSIGN_STREAM;
    let victim = subjects::assign("node001");
    // node002 asks for consumers filtering node001's assignments: named as its own, named as
    // node001's, named with the filter in the body only (no filter in the subject), and
    // ephemeral.
    let mine = subjects::node_consumer("node002");
    let theirs = subjects::node_consumer("node001");
    let body = serde_json::json!({
        "stream_name": stream,
        "config": {
            "durable_name": mine,
            "filter_subject": victim,
            "ack_policy": "explicit",
        },
    })
    .to_string();
    let attempts = [
        format!("$JS.API.CONSUMER.CREATE.{stream}.{mine}.{victim}"),
        format!("$JS.API.CONSUMER.CREATE.{stream}.{theirs}.{victim}"),
        format!("$JS.API.CONSUMER.CREATE.{stream}.{mine}"),
        format!("$JS.API.CONSUMER.CREATE.{stream}"),
    ];
    let node = cluster.creds(Role::Node, "node002");
    for subject in attempts {
        let answered = request_as(&cluster, &node, subject, body.clone()).map(answer_text);
        assert!(
            answered.is_none(),
            "the server answered node002: {answered:?}"
        );
    }
    // node002's own filter, as its agent asks, is allowed.
    let own_filter = subjects::node_assignment_filter("node002");
    let own = serde_json::json!({
        "stream_name": stream,
        "config": {
            "durable_name": mine,
            "filter_subject": own_filter,
            "ack_policy": "explicit",
        },
    })
    .to_string();
    let subject = format!("$JS.API.CONSUMER.CREATE.{stream}.{mine}.{own_filter}");
    let created = request_as(&cluster, &node, subject, own)
        .map(answer_text)
        .unwrap_or_else(|| panic!("node002 may create its own consumer"));
    assert!(!created.contains("\"error\""), "{created}");

    // node001's jobs still reach node001.
    let id = cluster.submit(&[], "echo on-node001");
    let job = cluster.finished_as(&id, "succeeded", T);
    assert_eq!(job["nodes"][0], "node001", "{job}");
    wait_for("the output", T, || {
        cluster
            .mgpu_ok(&["logs", &id])
            .contains("on-node001")
            .then_some(())
    });
}

/// What arrives on `subscriptions` until nothing more comes for half a second.
async fn drained(subscriptions: &mut [async_nats::Subscriber]) -> Vec<String> {
    use futures::StreamExt;
    let mut seen = Vec::new();
    for subscription in subscriptions.iter_mut() {
        while let Ok(Some(message)) =
            tokio::time::timeout(Duration::from_millis(500), subscription.next()).await
        {
            seen.push(format!(
                "{}: {}",
                message.subject,
                String::from_utf8_lossy(&message.payload)
            ));
        }
    }
    seen
}

#[test]
fn private_output_reaches_its_owner_and_admins_and_not_a_byte_of_it_anyone_else() {
    let cluster = Cluster::start(&[NodeSpec::new("node001", "1x24GiB")]);
    let bob = cluster.user_creds("bob");
    let cluster_ref = &cluster;
    let (private, public, heard) = cluster.with_nats(&bob, |client| async move {
        let cluster = cluster_ref;
        // Bob listens wherever he may, and where he may not, before the jobs run.
        let mut subscriptions = Vec::new();
        for subject in [subjects::ALL_OUTPUT, subjects::ALL_PRIVATE_OUTPUT, ">"] {
            if let Ok(subscription) = client.subscribe(subject).await {
                subscriptions.push(subscription);
            }
        }
        let _ = client.flush().await;
        let private = cluster.submit(&["--private"], "echo private-words");
        let public = cluster.submit(&[], "echo public-words");
        for id in [&private, &public] {
            while cluster.state(id) != "succeeded" {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        (private, public, drained(&mut subscriptions).await)
    });
    let heard = heard.join("\n");
    assert!(
        heard.contains("public-words"),
        "nats sub 'jobs.*.output' still works: {heard}"
    );
    assert!(
        !heard.contains("private-words"),
        "bob heard private output: {heard}"
    );

    // Its owner and admins read it with mgpu logs; bob is told it is private, and gets none.
    let own = cluster.mgpu_ok(&["logs", &private]);
    assert!(own.contains("private-words"), "{own}");
    let admin = cluster.mgpu_ok_with(&cluster.admin_creds(), &["logs", &private]);
    assert!(admin.contains("private-words"), "{admin}");
    let refused = cluster.mgpu_with(&bob, &["logs", &private], None);
    let said = String::from_utf8_lossy(&refused.stderr).into_owned();
    assert!(!refused.status.success(), "{said}");
    assert!(said.contains("output is private"), "{said}");
    assert!(!String::from_utf8_lossy(&refused.stdout).contains("private-words"));
    let theirs = cluster.mgpu_ok_with(&bob, &["logs", &public]);
    assert!(theirs.contains("public-words"), "{theirs}");

    // Nor can bob make a consumer read it from the stream, under any filter that covers it.
    let alice_key = cluster.show(&private)["record"]["user_key"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let job: JobId = private.parse().unwrap_or_else(|e| panic!("{e}"));
    let stream = subjects::OUTPUT_STREAM;
    for filter in [
        subjects::private_output(&alice_key, &job),
        subjects::ALL_PRIVATE_OUTPUT.to_owned(),
        ">".to_owned(),
    ] {
        let name = format!("bob-{}", JobId::random());
        let body = serde_json::json!({
            "stream_name": stream,
            "config": {"name": name, "filter_subject": filter, "deliver_policy": "all"},
        })
        .to_string();
        for subject in [
            format!("$JS.API.CONSUMER.CREATE.{stream}.{name}.{filter}"),
            format!("$JS.API.CONSUMER.CREATE.{stream}.{name}"),
            format!("$JS.API.CONSUMER.CREATE.{stream}"),
        ] {
            let answered = request_as(&cluster, &bob, subject, body.clone()).map(answer_text);
            assert!(
                answered.is_none(),
                "bob made a consumer on {filter}: {answered:?}"
            );
        }
    }
}

#[test]
fn a_cluster_that_makes_output_private_by_default_keeps_every_jobs_output_to_its_owner() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let config = dir.path().join("scheduler.toml");
    std::fs::write(&config, "[policy]\nprivate_output = true\n").unwrap_or_else(|e| panic!("{e}"));
    let config = config.display().to_string();
    let cluster = Cluster::start_with(
        &[NodeSpec::new("node001", "1x24GiB")],
        &["--config", &config],
    );
    let id = cluster.submit(&[], "echo by-default");
    cluster.finished_as(&id, "succeeded", T);
    let job = cluster.show(&id);
    assert_eq!(job["record"]["spec"]["private_output"], true, "{job}");
    assert!(cluster.mgpu_ok(&["logs", &id]).contains("by-default"));
    let refused = cluster.mgpu_with(&cluster.user_creds("bob"), &["logs", &id], None);
    assert!(!refused.status.success());
    // -i follows it too (the CLI cannot know beforehand that the cluster made it private).
    let out = cluster.mgpu_with(
        &cluster.user_creds("alice"),
        &["submit", "-i", "--", "echo interactive-private"],
        None,
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("interactive-private"), "{text}");
}

#[test]
fn an_environment_sent_inline_is_put_apart_by_the_scheduler() {
    let cluster = Cluster::start(&[NodeSpec::new("node001", "1x24GiB")]);
    // As a program of its own (or an mgpu of before) submits: the environment in the
    // submission, signed with alice's key.
    let secret = format!("inline-{}", JobId::random());
    let id = JobId::random();
    let mut spec = mgpu_protocol::job::JobSpec::new(
        vec!["[ -n \"$OLD_TOKEN\" ] && echo token-arrived".into()],
        "/tmp",
    );
    spec.env = [("OLD_TOKEN", secret.as_str()), ("PATH", "/usr/bin:/bin")]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    let request = mgpu_protocol::submit::SubmitRequest {
        id: id.clone(),
        user: "alice".into(),
        spec,
    };
    let payload = serde_json::to_vec(&request).unwrap_or_default();
    cluster.publish_signed(&cluster.user_creds("alice"), subjects::SUBMIT, payload, &[]);
    cluster.finished_as(id.as_str(), "succeeded", T);
    assert!(
        cluster
            .mgpu_ok(&["logs", id.as_str()])
            .contains("token-arrived")
    );
    readable_without(
        &cluster,
        &cluster.user_creds("bob"),
        format!(
            "$JS.API.DIRECT.GET.{}.$KV.{}.{id}",
            subjects::JOBS_BUCKET_STREAM,
            subjects::JOBS_BUCKET
        ),
        (id.as_str(), &secret),
    );
    let (own, _) = show_as(&cluster, &cluster.user_creds("alice"), id.as_str());
    assert_eq!(own["record"]["spec"]["env"]["OLD_TOKEN"], secret.as_str());
}

/// A wall screen's principal (`mgpu admin add-user wall --role viewer`), tried as an
/// attacker: it reads the nodes, the queue and public output, and the server refuses it
/// every request, every environment, private output and history.
#[test]
fn a_viewer_reads_the_nodes_the_queue_and_public_output_and_the_server_refuses_it_the_rest() {
    let mut cluster = Cluster::start(&[NodeSpec::new("node001", "2x24GiB")]);
    let wall = cluster.creds(Role::Viewer, "wall");
    let secret = format!("wandb-{}", JobId::random());
    cluster.set_cli_env("WANDB_API_KEY", &secret);
    let public = cluster.submit(&[], "echo public-words; sleep 60");
    let private = cluster.submit(&["--private"], "echo private-words");
    cluster.wait_state(&public, "running", T);
    cluster.finished_as(&private, "succeeded", T);

    // What a wall shows.
    let nodes = cluster.mgpu_ok_with(&wall, &["nodes", "--json"]);
    assert!(nodes.contains("node001"), "{nodes}");
    let queue = cluster.mgpu_ok_with(&wall, &["queue", "--json"]);
    assert!(queue.contains(&public), "{queue}");
    assert!(!queue.contains(&secret), "{queue}");
    wait_for("the public output", T, || {
        let logs = cluster.mgpu_ok_with(&wall, &["logs", &public]);
        logs.contains("public-words").then_some(())
    });

    // Private output: refused by the CLI, and by the server under any filter.
    let refused = cluster.mgpu_with(&wall, &["logs", &private], None);
    assert!(!refused.status.success());
    assert!(!String::from_utf8_lossy(&refused.stdout).contains("private-words"));
    let alice_key = cluster.show(&public)["record"]["user_key"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let private_job: JobId = private.parse().unwrap_or_else(|e| panic!("{e}"));
    let output = subjects::OUTPUT_STREAM;
    let history = subjects::HISTORY_STREAM;
    let consumers = [
        (output, subjects::private_output(&alice_key, &private_job)),
        (output, subjects::ALL_PRIVATE_OUTPUT.to_owned()),
        (history, subjects::history(&alice_key, &private_job)),
        (history, ">".to_owned()),
    ];
    for (stream, filter) in consumers {
        let name = format!("wall-{}", JobId::random());
        let body = serde_json::json!({
            "stream_name": stream,
            "config": {"name": name, "filter_subject": filter, "deliver_policy": "all"},
        })
        .to_string();
        let subject = format!("$JS.API.CONSUMER.CREATE.{stream}.{name}.{filter}");
        let answered = request_as(&cluster, &wall, subject, body).map(answer_text);
        assert!(
            answered.is_none(),
            "the viewer made a consumer on {stream} {filter}: {answered:?}"
        );
    }

    // The environment: not in the record, not in the environments' bucket.
    let job: JobId = public.parse().unwrap_or_else(|e| panic!("{e}"));
    let stolen = direct_get_as(
        &cluster,
        &wall,
        mgpu_nats::job_env::get_subject(&alice_key, &job),
    );
    assert!(
        stolen.is_empty(),
        "the viewer read an environment: {stolen:?}"
    );
    let shown = cluster.mgpu_ok_with(&wall, &["show", &public, "--json"]);
    assert!(!shown.contains(&secret), "{shown}");

    // No request: its submit and its cancel are refused by the server, and change nothing.
    // The CLI says so from the server's refusal (not after the acknowledgement's timeout).
    let submitted = cluster.mgpu_with(&wall, &["submit", "--", "echo wall-job"], None);
    assert!(!submitted.status.success());
    let said = String::from_utf8_lossy(&submitted.stderr);
    assert!(
        said.contains("permission denied: the server does not let your key submit jobs")
            && said.contains("Permissions Violation"),
        "{said}"
    );
    let cancelled = cluster.mgpu_with(&wall, &["cancel", &public], None);
    assert!(!cancelled.status.success());
    let said = String::from_utf8_lossy(&cancelled.stderr);
    assert!(
        said.contains("permission denied") && said.contains("Permissions Violation"),
        "{said}"
    );
    assert_eq!(cluster.state(&public), "running");
    let all = cluster.all_jobs();
    assert!(
        !all.iter().any(|j| j.to_string().contains("wall-job")),
        "{all:?}"
    );
}
