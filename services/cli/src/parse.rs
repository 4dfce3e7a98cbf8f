//! Parsers for what people type on the command line that the shared crate does not cover:
//! GPU id lists, memory sizes, job array specs and `NODE:IDX`. Each error says what was wrong
//! and what would be accepted.

use std::fmt;

use mgpu_protocol::gpu_amount::GpuAmount;
use mgpu_protocol::ids::validate_node_name;

/// `--gpu-ids 0,2` or `0-3` or `0-1,4`: physical GPU indices, in the order given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuIds(pub Vec<u32>);

impl fmt::Display for GpuIds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&crate::human::index_list(&self.0))
    }
}

pub fn gpu_ids(text: &str) -> Result<GpuIds, String> {
    let bad = |detail: String| {
        format!("`{text}` is not a GPU id list ({detail}): use indices like 0,2 or ranges like 0-3")
    };
    let index = |word: &str| -> Result<u32, String> {
        let word = word.trim();
        let value: u32 = word
            .parse()
            .map_err(|_| bad(format!("`{word}` is not a GPU index")))?;
        // Anything this large is a typo, and a range up to it would allocate for nothing.
        if value >= GpuAmount::MAX_GPUS {
            return Err(bad(format!("GPU {value} is beyond any node")));
        }
        Ok(value)
    };
    let mut ids = Vec::new();
    for part in text.split(',') {
        if part.trim().is_empty() {
            return Err(bad("an empty entry".into()));
        }
        match part.split_once('-') {
            Some((first, last)) => {
                let (first, last) = (index(first)?, index(last)?);
                if first > last {
                    return Err(bad(format!("the range {first}-{last} runs backwards")));
                }
                ids.extend(first..=last);
            }
            None => ids.push(index(part)?),
        }
    }
    Ok(GpuIds(ids))
}

/// `--mem`: GPU memory in MiB. A plain number is MiB; `512MiB`, `24GiB`, `1TiB` (and the
/// short `M`, `G`, `T`, or `MB`, `GB`, `TB`, read as the same binary units) are accepted.
pub fn mem_mib(text: &str) -> Result<u64, String> {
    mgpu_protocol::host::parse_mib(text)
}

/// Most tasks one `--array` may create: more is almost surely a typo, and each task is a
/// message carrying the submitter's whole environment.
pub const MAX_ARRAY_TASKS: u64 = 10_000;

/// `--array 0-9`, `1,3,5-7`, `0-99%4`: the task indices, ascending, and the `%N` limit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArraySpec {
    pub indices: Vec<u32>,
    pub max_running: Option<u32>,
}

pub fn array_spec(text: &str) -> Result<ArraySpec, String> {
    let bad = |detail: String| {
        format!(
            "`{text}` is not an array spec ({detail}): use indices and ranges like 0-9 or \
             1,3,5-7, optionally with %N to run at most N at once (0-99%4)"
        )
    };
    let (body, limit) = match text.split_once('%') {
        Some((body, limit)) => {
            let limit: u32 = limit
                .trim()
                .parse()
                .map_err(|_| bad(format!("`%{limit}` is not a whole number")))?;
            if limit == 0 {
                return Err(bad("the %N limit must be at least 1".into()));
            }
            (body, Some(limit))
        }
        None => (text, None),
    };
    let index = |word: &str| -> Result<u32, String> {
        word.trim()
            .parse()
            .map_err(|_| bad(format!("`{}` is not an index", word.trim())))
    };
    // Ranges are counted before they are expanded, so `0-4000000000` fails fast and small.
    let mut ranges = Vec::new();
    let mut count: u64 = 0;
    for part in body.split(',') {
        if part.trim().is_empty() {
            return Err(bad("an empty entry".into()));
        }
        let (first, last) = match part.split_once('-') {
            Some((first, last)) => (index(first)?, index(last)?),
            None => {
                let one = index(part)?;
                (one, one)
            }
        };
        if first > last {
            return Err(bad(format!("the range {first}-{last} runs backwards")));
        }
        count += u64::from(last - first) + 1;
        if count > MAX_ARRAY_TASKS {
            return Err(bad(format!("more than {MAX_ARRAY_TASKS} tasks")));
        }
        ranges.push((first, last));
    }
    let mut indices: Vec<u32> = ranges.into_iter().flat_map(|(a, b)| a..=b).collect();
    indices.sort_unstable();
    if let Some(pair) = indices.windows(2).find(|pair| pair[0] == pair[1]) {
        return Err(bad(format!("index {} is given twice", pair[0])));
    }
    Ok(ArraySpec {
        indices,
        max_running: limit,
    })
}

/// `NODE:IDX`: one GPU of one node (`node001:3`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeGpu {
    pub node: String,
    pub index: u32,
}

impl fmt::Display for NodeGpu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.node, self.index)
    }
}

pub fn node_gpu(text: &str) -> Result<NodeGpu, String> {
    let Some((node, index)) = text.trim().rsplit_once(':') else {
        return Err(format!(
            "`{text}` does not name a GPU: use NODE:INDEX, like node001:3"
        ));
    };
    validate_node_name(node).map_err(|e| e.to_string())?;
    let index: u32 = index.parse().map_err(|_| {
        format!("`{text}`: `{index}` is not a GPU index (NODE:INDEX, like node001:3)")
    })?;
    if index >= GpuAmount::MAX_GPUS {
        return Err(format!("`{text}`: GPU {index} is beyond any node"));
    }
    Ok(NodeGpu {
        node: node.to_owned(),
        index,
    })
}

/// `--since` / `--until`: a point in time as people say it, a bare age counting back from
/// now.
pub fn point_in_time(text: &str) -> Result<mgpu_protocol::Timestamp, String> {
    point_in_time_at(text, mgpu_protocol::now())
}

/// `mgpu reserve --start`: a point in time as [`point_in_time`] reads it, but a bare age
/// (`2h`) counts forward: the window starts that long from now.
pub fn start_time(text: &str) -> Result<mgpu_protocol::Timestamp, String> {
    moment_at(text, mgpu_protocol::now(), Ages::FromNow)
}

/// [`point_in_time`] with the clock given.
pub fn point_in_time_at(
    text: &str,
    now: mgpu_protocol::Timestamp,
) -> Result<mgpu_protocol::Timestamp, String> {
    moment_at(text, now, Ages::Ago)
}

/// Which way a bare age (`3d`, `12h`) counts from now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ages {
    /// Back: `--since 3d` is three days ago.
    Ago,
    /// Forward: `--start 2h` is two hours from now.
    FromNow,
}

/// A point in time, `now` given, all in UTC: `now`; `today`, `yesterday` and `tomorrow`
/// (midnight), each optionally with a time of day (`tomorrow 09:00`); a time of day alone
/// (`14:00`, today); a date (`2026-11-01`, midnight) with or without a time
/// (`2026-11-01 08:00`, `2026-11-01T08:00`); an RFC 3339 time with its offset
/// (`2026-11-01T08:00:00Z`); an age before now (`3h ago`) or after it (`in 2h`, `+2h`);
/// or a bare age, counted as `ages` says.
pub fn moment_at(
    text: &str,
    now: mgpu_protocol::Timestamp,
    ages: Ages,
) -> Result<mgpu_protocol::Timestamp, String> {
    let text = text.trim();
    let found = match text {
        "now" => Some(now),
        _ => day_and_time(text, now)
            .or_else(|| {
                chrono::DateTime::parse_from_rfc3339(text)
                    .ok()
                    .map(|at| at.with_timezone(&chrono::Utc))
            })
            .or_else(|| offset(text, now, ages)),
    };
    found.ok_or_else(|| {
        let age = match ages {
            Ages::Ago => "an age (3d, 12h)",
            Ages::FromNow => "a time from now (2h, in 90m)",
        };
        format!(
            "`{text}` is not a time: use a date (2026-11-01), a date and time \
             (2026-11-01T08:00:00Z, 2026-11-01 08:00), {age}, now, or today / yesterday / \
             tomorrow with a time or not (tomorrow 09:00); times are UTC"
        )
    })
}

/// A day (a word or a date; today when only a time is given) and a time of day, UTC.
fn day_and_time(text: &str, now: mgpu_protocol::Timestamp) -> Option<mgpu_protocol::Timestamp> {
    let (day, time) = match text.split_once([' ', 'T']) {
        Some((day, time)) => (day.trim(), Some(time.trim())),
        None if text.contains(':') => ("today", Some(text)),
        None => (text, None),
    };
    let today = now.date_naive();
    let date = match day {
        "today" => today,
        "yesterday" => today.pred_opt()?,
        "tomorrow" => today.succ_opt()?,
        date => chrono::NaiveDate::parse_from_str(date, "%Y-%m-%d").ok()?,
    };
    let time = match time {
        None => chrono::NaiveTime::MIN,
        Some(time) => chrono::NaiveTime::parse_from_str(time, "%H:%M")
            .or_else(|_| chrono::NaiveTime::parse_from_str(time, "%H:%M:%S"))
            .ok()?,
    };
    Some(date.and_time(time).and_utc())
}

/// An age from now: `in 2h` and `+2h` ahead, `3h ago` back, a bare one as `ages` says.
fn offset(
    text: &str,
    now: mgpu_protocol::Timestamp,
    ages: Ages,
) -> Option<mgpu_protocol::Timestamp> {
    let (age, ahead) = if let Some(age) = text.strip_prefix("in ").or(text.strip_prefix('+')) {
        (age, true)
    } else if let Some(age) = text.strip_suffix(" ago") {
        (age, false)
    } else {
        (text, ages == Ages::FromNow)
    };
    let age = mgpu_protocol::duration::parse_duration(age.trim()).ok()?;
    let age = chrono::Duration::from_std(age).ok()?;
    match ahead {
        true => now.checked_add_signed(age),
        false => now.checked_sub_signed(age),
    }
}

/// A node name as typed, checked against the rules node agents follow.
pub fn node_name(text: &str) -> Result<String, String> {
    validate_node_name(text.trim()).map_err(|e| e.to_string())?;
    Ok(text.trim().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn array_specs_take_ranges_lists_and_limits() {
        let spec = |t: &str| array_spec(t).ok();
        assert_eq!(
            spec("0-3"),
            Some(ArraySpec {
                indices: vec![0, 1, 2, 3],
                max_running: None
            })
        );
        assert_eq!(
            spec("1,3,5-7").map(|s| s.indices),
            Some(vec![1, 3, 5, 6, 7])
        );
        assert_eq!(
            spec("7,0-1").map(|s| s.indices),
            Some(vec![0, 1, 7]),
            "indices come out in order"
        );
        let limited = spec("0-99%4");
        assert_eq!(limited.as_ref().map(|s| s.indices.len()), Some(100));
        assert_eq!(limited.and_then(|s| s.max_running), Some(4));
        assert_eq!(spec("5").map(|s| s.indices), Some(vec![5]));
        assert_eq!(
            spec("0-9999").map(|s| s.indices.len()),
            Some(10_000),
            "exactly the limit is fine"
        );
    }

    #[test]
    fn bad_array_specs_say_why() {
        for (bad, why) in [
            ("", "empty entry"),
            ("3-1", "runs backwards"),
            ("0-10000", "more than 10000"),
            ("0-4000000000", "more than 10000"),
            ("1,1", "given twice"),
            ("0-3,2", "given twice"),
            ("0-9%0", "at least 1"),
            ("0-9%x", "not a whole number"),
            ("a", "not an index"),
            ("1,,2", "empty entry"),
            ("-1", "not an index"),
        ] {
            let err = array_spec(bad).err().unwrap_or_default();
            assert!(err.contains(why), "`{bad}`: {err}");
        }
    }

    #[test]
    fn node_gpus_are_node_colon_index() {
        assert_eq!(
            node_gpu("node001:3").ok(),
            Some(NodeGpu {
                node: "node001".into(),
                index: 3
            })
        );
        assert_eq!(
            node_gpu("gpu-box_2:0").map(|g| g.to_string()).ok(),
            Some("gpu-box_2:0".into())
        );
        for bad in [
            "node001",
            "node001:",
            ":3",
            "node.1:3",
            "node001:x",
            "node001:-1",
            "n:5000",
        ] {
            assert!(node_gpu(bad).is_err(), "`{bad}` accepted");
        }
        assert!(node_name("node001").is_ok());
        assert!(node_name("node*").is_err());
    }

    fn ids(text: &str) -> Option<Vec<u32>> {
        gpu_ids(text).ok().map(|ids| ids.0)
    }

    #[test]
    fn gpu_ids_take_lists_and_ranges() {
        assert_eq!(ids("0"), Some(vec![0]));
        assert_eq!(ids("0,2"), Some(vec![0, 2]));
        assert_eq!(ids("0-3"), Some(vec![0, 1, 2, 3]));
        assert_eq!(ids("0-1, 4"), Some(vec![0, 1, 4]));
        assert_eq!(ids("3-3"), Some(vec![3]));
    }

    #[test]
    fn bad_gpu_ids_say_why() {
        for bad in [
            "", "a", "0,", ",1", "3-1", "-1", "1-", "0-99999", "1.5", "0;1",
        ] {
            let err = gpu_ids(bad).err();
            assert!(err.is_some(), "`{bad}` accepted");
            assert!(err.unwrap_or_default().contains("GPU id list"));
        }
        let err = gpu_ids("3-1").err().unwrap_or_default();
        assert!(err.contains("runs backwards"), "{err}");
    }

    #[test]
    fn memory_sizes_take_mib_and_units() {
        assert_eq!(mem_mib("24576").ok(), Some(24_576));
        assert_eq!(mem_mib("512MiB").ok(), Some(512));
        assert_eq!(mem_mib("24GiB").ok(), Some(24_576));
        assert_eq!(mem_mib("24G").ok(), Some(24_576));
        assert_eq!(mem_mib("24gb").ok(), Some(24_576));
        assert_eq!(mem_mib("1.5GiB").ok(), Some(1_536));
        assert_eq!(mem_mib("1TiB").ok(), Some(1_048_576));
        assert_eq!(mem_mib(" 80 GiB ").ok(), Some(81_920));
    }

    #[test]
    fn points_in_time_are_dates_ages_and_words() {
        let now = chrono::DateTime::parse_from_rfc3339("2026-11-25T06:30:00Z")
            .map(|t| t.with_timezone(&chrono::Utc))
            .unwrap_or_else(|e| panic!("{e}"));
        let at = |text: &str| point_in_time_at(text, now).map(|t| t.to_rfc3339());
        assert_eq!(at("2026-11-01"), Ok("2026-11-01T00:00:00+00:00".into()));
        assert_eq!(at("yesterday"), Ok("2026-11-24T00:00:00+00:00".into()));
        assert_eq!(at("today"), Ok("2026-11-25T00:00:00+00:00".into()));
        assert_eq!(at("3d"), Ok("2026-11-22T06:30:00+00:00".into()));
        assert_eq!(
            at("2026-11-20T08:00:00+01:00"),
            Ok("2026-11-20T07:00:00+00:00".into())
        );
        let bad = at("garbage").err().unwrap_or_default();
        assert!(
            bad.contains("`garbage` is not a time") && bad.contains("2026-11-01"),
            "{bad}"
        );
    }

    #[test]
    fn points_in_time_take_future_forms_and_times_of_day() {
        let now = chrono::DateTime::parse_from_rfc3339("2026-11-27T06:30:00Z")
            .map(|t| t.with_timezone(&chrono::Utc))
            .unwrap_or_else(|e| panic!("{e}"));
        let start = |text: &str| moment_at(text, now, Ages::FromNow).map(|t| t.to_rfc3339());
        assert_eq!(start("now"), Ok("2026-11-27T06:30:00+00:00".into()));
        assert_eq!(start("tomorrow"), Ok("2026-11-28T00:00:00+00:00".into()));
        assert_eq!(
            start("tomorrow 09:00"),
            Ok("2026-11-28T09:00:00+00:00".into())
        );
        assert_eq!(
            start(" today 14:15:30 "),
            Ok("2026-11-27T14:15:30+00:00".into())
        );
        assert_eq!(start("14:00"), Ok("2026-11-27T14:00:00+00:00".into()));
        assert_eq!(
            start("2026-12-01 08:00"),
            Ok("2026-12-01T08:00:00+00:00".into())
        );
        assert_eq!(
            start("2026-12-01T08:00"),
            Ok("2026-12-01T08:00:00+00:00".into())
        );
        assert_eq!(
            start("2026-12-01T08:00:00+01:00"),
            Ok("2026-12-01T07:00:00+00:00".into())
        );
        // A bare age counts forward for a start, back for --since; `in` and `ago` say which.
        assert_eq!(start("2h"), Ok("2026-11-27T08:30:00+00:00".into()));
        assert_eq!(start("in 90m"), Ok("2026-11-27T08:00:00+00:00".into()));
        assert_eq!(start("+1d"), Ok("2026-11-28T06:30:00+00:00".into()));
        assert_eq!(start("1h ago"), Ok("2026-11-27T05:30:00+00:00".into()));
        let since = |text: &str| point_in_time_at(text, now).map(|t| t.to_rfc3339());
        assert_eq!(since("2h"), Ok("2026-11-27T04:30:00+00:00".into()));
        assert_eq!(since("in 2h"), Ok("2026-11-27T08:30:00+00:00".into()));
        assert_eq!(
            since("yesterday 23:00"),
            Ok("2026-11-26T23:00:00+00:00".into())
        );
        for bad in [
            "tomorrow 25:00",
            "tomorrow noon",
            "in",
            "soon",
            "2026-13-01 08:00",
        ] {
            let err = start(bad).err().unwrap_or_default();
            assert!(
                err.contains(&format!("`{bad}` is not a time")) && err.contains("in 90m"),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn bad_memory_sizes_are_refused() {
        for bad in [
            "",
            "GiB",
            "abc",
            "-5",
            "12KiB",
            "1.5",
            "0.3MiB",
            "1e3",
            "99999999999999999999T",
        ] {
            assert!(mem_mib(bad).is_err(), "`{bad}` accepted");
        }
    }
}
