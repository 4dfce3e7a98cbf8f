//! The guard's command line: what the agent writes reads back, and what it never writes is
//! refused with the position of the bad argument.

use std::vec::Vec;

use super::*;

fn parse<'a>(args: &[&'a str]) -> Result<Arguments<'a>, ArgumentError> {
    let bytes: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
    Arguments::parse(&bytes)
}

#[test]
fn a_full_command_line_reads_back() {
    let args = [
        "42",
        "1500",
        "800",
        "/state/n1.contact",
        "1000:1000:1000,27",
        "/sys/fs/cgroup/mgpu/n1/job-1-1/cgroup.procs",
        "/bin/sh",
        "-c",
        "x",
    ];
    assert_eq!(
        parse(&args),
        Ok(Arguments {
            agent: 42,
            grace: Duration::from_millis(1500),
            fence: Some(Fence {
                after: Duration::from_millis(800),
                contact: b"/state/n1.contact",
            }),
            account: Some(b"1000:1000:1000,27"),
            cgroup: Cgroup::Join(b"/sys/fs/cgroup/mgpu/n1/job-1-1/cgroup.procs"),
        })
    );
}

#[test]
fn dashes_and_zero_mean_none() {
    let parsed = parse(&["7", "0", "0", "-", "-", "-", "true"]);
    assert_eq!(
        parsed,
        Ok(Arguments {
            agent: 7,
            grace: Duration::ZERO,
            fence: None,
            account: None,
            cgroup: Cgroup::None,
        })
    );
}

#[test]
fn the_cgroup_is_joined_by_the_guard_unless_the_agent_did() {
    let v1 = "/cg/freezer/j/cgroup.procs:/cg/memory/j/cgroup.procs";
    let cgroup =
        |text: &'static str| parse(&["1", "0", "0", "-", "-", text, "true"]).map(|a| a.cgroup);
    let join = cgroup(v1).unwrap_or(Cgroup::None);
    assert_eq!(
        join.to_join().collect::<Vec<_>>(),
        [
            &b"/cg/freezer/j/cgroup.procs"[..],
            b"/cg/memory/j/cgroup.procs"
        ]
    );
    assert_eq!(join.members(), Some(&b"/cg/freezer/j/cgroup.procs"[..]));

    let joined = cgroup("@/cg/j/cgroup.procs").unwrap_or(Cgroup::None);
    assert_eq!(joined, Cgroup::Joined(b"/cg/j/cgroup.procs"));
    assert_eq!(joined.to_join().count(), 0);
    assert_eq!(joined.members(), Some(&b"/cg/j/cgroup.procs"[..]));

    for none in ["-", "@-"] {
        let none = cgroup(none).unwrap_or(Cgroup::Join(b"x"));
        assert_eq!(none, Cgroup::None);
        assert_eq!((none.to_join().count(), none.members()), (0, None));
    }
}

#[test]
fn bad_arguments_are_named_with_their_position() {
    let error = |args: &[&str]| parse(args).err();
    assert_eq!(
        error(&["1", "0", "0", "-", "-", "-"]),
        Some(ArgumentError::Usage)
    );
    assert_eq!(error(&[]), Some(ArgumentError::Usage));
    let bad = [
        (0, "p"),
        (0, "-1"),
        (0, "4294967296"),
        (1, "y"),
        (1, "-5"),
        (2, "x"),
        (2, ""),
    ];
    for (position, value) in bad {
        let mut args = ["1", "0", "0", "-", "-", "-", "true"];
        args[position] = value;
        let found = error(&args);
        assert_eq!(
            found.and_then(ArgumentError::position),
            Some(position),
            "{args:?}"
        );
    }
    assert_eq!(
        error(&["p", "0", "0", "-", "-", "-", "true"]),
        Some(ArgumentError::AgentPid)
    );
    assert_eq!(
        error(&["1", "y", "0", "-", "-", "-", "true"]),
        Some(ArgumentError::Grace)
    );
    assert_eq!(ArgumentError::Fence.message(), "bad fence");
    assert_eq!(ArgumentError::Usage.position(), None);
    assert!(USAGE.starts_with("AGENT_PID") && USAGE.contains("PROGRAM"));
    assert_eq!(
        USAGE.split(' ').position(|a| a == "PROGRAM"),
        Some(PROGRAM_AT)
    );
    let contact = USAGE.split(' ').position(|a| a == "CONTACT_FILE");
    assert_eq!(contact, Some(CONTACT_AT));
}

#[test]
fn accounts_are_uid_gid_and_groups() {
    let mut groups = [0u32; 4];
    assert_eq!(
        parse_account(b"1000:100:27,44", &mut groups),
        Some(AccountIds {
            uid: 1000,
            gid: 100,
            groups: 2
        })
    );
    assert_eq!(groups[..2], [27, 44]);
    assert_eq!(
        parse_account(b"0:0:", &mut groups),
        Some(AccountIds {
            uid: 0,
            gid: 0,
            groups: 0
        })
    );
    for bad in [
        &b"1000"[..],
        b"1000:100",
        b"a:1:",
        b"1:b:",
        b"1:1:x",
        b"1:1:1,2,3,4,5",
    ] {
        assert_eq!(parse_account(bad, &mut groups), None, "{bad:?}");
    }
}
