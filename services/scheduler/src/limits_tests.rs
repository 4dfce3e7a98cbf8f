//! The `[limits]` tables: parsing, resolution by user and group, refusals at submit.

use super::*;

fn limits(text: &str) -> Result<Limits> {
    let table: toml::Table = text.parse().unwrap_or_else(|e| panic!("{e}"));
    Limits::parse(table.get("limits"))
}

const UNIT: u64 = GpuAmount::UNITS_PER_GPU as u64;

fn limits_of(text: &str) -> Limits {
    limits(text).unwrap_or_else(|e| panic!("{e:#}"))
}

/// The error `text` is refused with (empty if it is not).
fn error_of(text: &str) -> String {
    limits(text)
        .err()
        .map(|e| format!("{e:#}"))
        .unwrap_or_default()
}

#[test]
fn caps_per_gpu_type_sit_beside_the_total_and_resolve_type_by_type() {
    let limits = limits_of(
        r#"
        [limits.default.max_gpus_running]
        total = 4
        h100 = 1
        [limits.group.students.max_gpus_running]
        a100-80gb = 2
        [limits.user.alice]
        max_gpus_running = 3
        "#,
    );
    let alice = limits.for_user("alice", Some("students"));
    assert_eq!(alice.max_gpus_running.map(|l| l.value), Some(3 * UNIT));
    let by_type: Vec<(String, u64, String)> = alice
        .max_gpus_running_by_type
        .into_iter()
        .map(|(t, l)| (t, l.value, l.from))
        .collect();
    assert_eq!(
        by_type,
        [
            (
                "a100-80gb".to_owned(),
                2 * UNIT,
                "[limits.group.students]".to_owned()
            ),
            ("h100".to_owned(), UNIT, "[limits.default]".to_owned()),
        ]
    );
    let caps = limits.running_type_caps([("carol", None)]);
    assert_eq!(caps.get("carol").and_then(|c| c.get("h100")), Some(&UNIT));
    let printed = limits.printable();
    assert!(
        printed
            .iter()
            .any(|(_, settings)| settings.iter().any(|s| s.key == "max_gpus_running.h100"))
    );
    let bad = error_of("[limits.default.max_gpus_running]\nH_100 = 1");
    assert!(bad.contains("max_gpus_running.H_100"), "{bad}");
}

#[test]
fn each_key_comes_from_the_most_specific_table_that_sets_it() {
    let limits = limits_of(
        r#"
        [limits.default]
        max_gpus_running = 4
        max_jobs_queued = 100
        [limits.group.students]
        max_gpus_running = 2
        max_time_limit = "1d"
        [limits.user.alice]
        max_gpus_running = 0.5
        "#,
    );
    let alice = limits.for_user("alice", Some("students"));
    assert_eq!(
        alice.max_gpus_running.as_ref().map(|l| l.value),
        Some(UNIT / 2)
    );
    assert_eq!(
        alice.max_gpus_running.map(|l| l.from),
        Some("[limits.user.alice]".to_owned())
    );
    assert_eq!(alice.max_time_limit_secs.map(|l| l.value), Some(86_400));
    assert_eq!(alice.max_jobs_queued.map(|l| l.value), Some(100));
    let bob = limits.for_user("bob", Some("students"));
    assert_eq!(bob.max_gpus_running.map(|l| l.value), Some(2 * UNIT));
    let carol = limits.for_user("carol", None);
    assert_eq!(carol.max_gpus_running.map(|l| l.value), Some(4 * UNIT));
    assert_eq!(carol.max_time_limit_secs, None);
    let caps = limits.running_caps([("alice", Some("students")), ("carol", None)]);
    assert_eq!(caps.get("carol"), Some(&(4 * UNIT)));
}

#[test]
fn bad_limits_name_the_table_and_the_key() {
    let err = error_of("[limits.user.bob]\nmax_gpus_running = -1\n");
    assert!(
        err.contains("max_gpus_running in [limits.user.bob]"),
        "{err}"
    );
    let err = error_of("[limits.default]\nmax_gpu = 1\n");
    assert!(err.contains("max_gpu"), "{err}");
    let err = error_of("[limits.default]\nmax_time_limit = \"soon\"\n");
    assert!(err.contains("max_time_limit in [limits.default]"), "{err}");
    assert!(limits("").map(|l| l.is_empty()).unwrap_or(false));
}

#[test]
fn submissions_over_a_limit_are_refused_naming_it() {
    let limits = limits_of(
        r#"
        [limits.default]
        max_jobs_queued = 2
        max_gpus_per_job = 4
        max_time_limit = "2h"
        "#,
    );
    let alice = limits.for_user("alice", None);
    let mut spec = JobSpec::new(vec!["true".into()], "/w");
    assert_eq!(alice.refusal("alice", &spec, 1), None);
    let queued = alice.refusal("alice", &spec, 2).unwrap_or_default();
    assert!(
        queued.contains("max_jobs_queued = 2 ([limits.default])"),
        "{queued}"
    );
    spec.gpus = GpuAmount::whole(2);
    spec.nodes = 3;
    let big = alice.refusal("alice", &spec, 0).unwrap_or_default();
    assert!(
        big.contains("max_gpus_per_job = 4") && big.contains("6 GPUs"),
        "{big}"
    );
    spec.nodes = 1;
    spec.time_limit_secs = Some(3 * 3600);
    let long = alice.refusal("alice", &spec, 0).unwrap_or_default();
    assert!(long.contains("max_time_limit = 2h"), "{long}");
    spec.time_limit_secs = None;
    alice.cap_time_limit(&mut spec);
    assert_eq!(spec.time_limit_secs, Some(7200));
    let capped = limits_of("[limits.default]\nmax_gpus_running = 2\n").for_user("bob", None);
    spec.gpus = GpuAmount::whole(3);
    let never = capped.refusal("bob", &spec, 0).unwrap_or_default();
    assert!(
        never.contains("max_gpus_running = 2") && never.contains("never start"),
        "{never}"
    );
    spec.gpus = GpuAmount::whole(2);
    assert_eq!(capped.refusal("bob", &spec, 0), None);
}

#[test]
fn a_job_over_the_cap_of_every_type_it_names_is_refused_and_an_uncapped_type_saves_it() {
    let limits = limits_of("[limits.default.max_gpus_running]\nh100 = 1\na100 = 2\n");
    let bob = limits.for_user("bob", None);
    let mut spec = JobSpec::new(vec!["true".into()], "/w");
    spec.gpus = GpuAmount::whole(2);
    spec.gpu_types = vec!["h100".into()];
    let never = bob.refusal("bob", &spec, 0).unwrap_or_default();
    assert!(
        never.contains("max_gpus_running.h100 = 1 ([limits.default])")
            && never.contains("2 GPUs of type h100")
            && never.contains("never start"),
        "{never}"
    );
    // a100's cap of 2 lets it start there.
    spec.gpu_types = vec!["h100".into(), "a100".into()];
    assert_eq!(bob.refusal("bob", &spec, 0), None);
    spec.gpus = GpuAmount::whole(3);
    let both = bob.refusal("bob", &spec, 0).unwrap_or_default();
    assert!(both.contains("h100 or a100"), "{both}");
    // rtx-4090 has no cap.
    spec.gpu_types.push("rtx-4090".into());
    assert_eq!(bob.refusal("bob", &spec, 0), None);
    spec.gpu_types.clear();
    assert_eq!(bob.refusal("bob", &spec, 0), None);
}

#[test]
fn print_config_shows_each_table_set() {
    let limits = limits(
        "[limits.default]\nmax_gpus_running = 2\n[limits.user.bob]\nmax_gpus_per_job = 0.5\n",
    )
    .unwrap_or_else(|e| panic!("{e:#}"));
    let printed: Vec<(String, Vec<String>)> = limits
        .printable()
        .into_iter()
        .map(|(name, settings)| {
            let values = settings
                .iter()
                .map(|s| format!("{} = {:?}", s.key, s.value))
                .collect();
            (name, values)
        })
        .collect();
    assert_eq!(printed.len(), 2, "{printed:?}");
    assert_eq!(printed[0].0, "limits.default");
    assert_eq!(printed[0].1, ["max_gpus_running = Some(Integer(2))"]);
    assert_eq!(printed[1].1, ["max_gpus_per_job = Some(Float(0.5))"]);
}

#[test]
fn a_class_sets_limits_keys_for_each_users_jobs_of_it_and_bad_ones_are_named() {
    let qos: toml::Table = r#"
        [qos.scavenger]
        preemptible = true
        max_gpus_running = 2
        max_jobs_queued = 10
        max_time_limit = "1h"
        "#
    .parse()
    .unwrap_or_else(|e| panic!("{e}"));
    let limits = limits_of("")
        .with_classes(qos.get("qos"))
        .unwrap_or_else(|e| panic!("{e:#}"));
    assert!(!limits.is_empty());
    let class = limits.for_class(Some("scavenger"));
    let running = class.as_ref().and_then(|c| c.max_gpus_running.clone());
    assert_eq!(
        running.map(|l| (l.value, l.from)),
        Some((2 * UNIT, "[qos.scavenger]".to_owned()))
    );
    assert_eq!(limits.for_class(None), None);
    assert_eq!(
        limits.class_running_caps().get("scavenger"),
        Some(&(2 * UNIT))
    );
    let mut spec = JobSpec::new(vec!["true".into()], "/w");
    spec.time_limit_secs = Some(7200);
    let why = class
        .and_then(|c| c.refusal("bob", &spec, 0))
        .unwrap_or_default();
    assert!(
        why.contains("max_time_limit = 1h00m ([qos.scavenger])"),
        "{why}"
    );
    assert!(
        limits
            .class_settings("scavenger")
            .iter()
            .any(|s| s.key == "max_jobs_queued")
    );

    let bad: toml::Table = "[qos.scavenger]\nmax_gpus_running = -1\n"
        .parse()
        .unwrap_or_else(|e| panic!("{e}"));
    let error = limits_of("")
        .with_classes(bad.get("qos"))
        .err()
        .map(|e| format!("{e:#}"))
        .unwrap_or_default();
    assert!(error.contains("[qos.scavenger]"), "{error}");
}

#[test]
fn caps_per_type_read_the_same_as_dotted_keys() {
    let dotted =
        limits_of("[limits.default]\nmax_gpus_running.total = 4\nmax_gpus_running.h100 = 1\n");
    let table = limits_of("[limits.default.max_gpus_running]\ntotal = 4\nh100 = 1\n");
    assert_eq!(dotted, table);
    let caps = dotted.running_type_caps([("alice", None)]);
    assert_eq!(caps.get("alice").and_then(|c| c.get("h100")), Some(&UNIT));
}

#[test]
fn a_table_with_caps_per_type_prints_its_total_as_a_key_that_reads_back() {
    let limits = limits_of("[limits.default.max_gpus_running]\ntotal = 4\nh100 = 1\n");
    let printed = limits.printable();
    let text: String = printed
        .iter()
        .flat_map(|(name, settings)| {
            std::iter::once(format!("[{name}]\n")).chain(settings.iter().map(|s| {
                let value = s
                    .value
                    .as_ref()
                    .map(ToString::to_string)
                    .unwrap_or_default();
                format!("{} = {value}\n", s.key)
            }))
        })
        .collect();
    assert!(text.contains("max_gpus_running.total = 4"), "{text}");
    assert_eq!(limits_of(&text), limits, "{text}");
}
