//! What `mgpu.scheduler.status` answers (the counters below, the latest passes), and the
//! answer to one status request; the micro service that serves it is the driver's
//! (`driver::replica`).

use serde::{Deserialize, Serialize};

/// What `mgpu.scheduler.status` answers.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Status {
    pub jobs_queued: usize,
    pub jobs_running: usize,
    pub jobs_total: usize,
    pub nodes_known: usize,
    pub nodes_online: usize,
    pub passes: u64,
    /// The latest scheduling passes, oldest first (at most [`RECENT_PASSES`]): what the
    /// benchmark reads, and what an operator asks when the queue seems slow.
    pub recent_passes: std::collections::VecDeque<PassSample>,
}

/// Passes kept in [`Status::recent_passes`].
pub const RECENT_PASSES: usize = 2_000;

/// How long one scheduling pass took, and over how much.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct PassSample {
    /// Jobs waiting when it began.
    pub queued: usize,
    pub running: usize,
    /// Building the core's view of jobs and nodes.
    pub view_us: u64,
    /// The core's decisions (`core::plan`).
    pub plan_us: u64,
    /// The whole pass, writes of its decisions and assignments included.
    pub total_us: u64,
    /// Decisions that changed something (starts, new wait reasons, rejections, preemptions).
    pub changes: usize,
}

/// What a status request may ask: nothing (an empty body: the whole status), or a JSON
/// object with `recent_passes`, the most passes to return (the newest).
#[derive(Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
struct StatusQuery {
    #[serde(default)]
    recent_passes: Option<usize>,
}

/// The answer to a status request with this body: the status as JSON, or a refusal (code
/// 400) of a body that is not a [`StatusQuery`].
pub(crate) fn answer(body: &[u8], status: &Status) -> Result<Vec<u8>, (String, usize)> {
    let query: StatusQuery = if body.iter().all(u8::is_ascii_whitespace) {
        StatusQuery::default()
    } else {
        serde_json::from_slice(body).map_err(|err| {
            let said = format!("a status request is empty or {{\"recent_passes\": N}}: {err}");
            (said, 400)
        })?
    };
    let encoded = match query.recent_passes {
        Some(keep) if keep < status.recent_passes.len() => {
            let mut trimmed = status.clone();
            let drop = trimmed.recent_passes.len() - keep;
            trimmed.recent_passes.drain(..drop);
            serde_json::to_vec(&trimmed)
        }
        _ => serde_json::to_vec(status),
    };
    encoded.map_err(|err| (format!("encoding the status: {err}"), 500))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status_with_passes(passes: u64) -> Status {
        let mut status = Status {
            jobs_queued: 3,
            ..Status::default()
        };
        for total_us in 0..passes {
            status.recent_passes.push_back(PassSample {
                total_us,
                ..PassSample::default()
            });
        }
        status
    }

    fn decoded(answer: Result<Vec<u8>, (String, usize)>) -> serde_json::Value {
        let bytes = answer.unwrap_or_else(|e| panic!("refused: {e:?}"));
        serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("not JSON: {e}"))
    }

    #[test]
    fn an_empty_request_gets_the_whole_status() {
        let status = status_with_passes(5);
        for body in [&b""[..], b" \n"] {
            let whole = decoded(answer(body, &status));
            assert_eq!(whole["jobs_queued"], 3);
            assert_eq!(whole["recent_passes"].as_array().map(Vec::len), Some(5));
        }
    }

    #[test]
    fn a_request_may_ask_for_the_newest_passes_only() {
        let status = status_with_passes(5);
        let newest = decoded(answer(br#"{"recent_passes": 2}"#, &status));
        let passes = newest["recent_passes"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let totals: Vec<_> = passes.iter().map(|p| p["total_us"].clone()).collect();
        assert_eq!(totals, vec![3, 4]);
        let all = decoded(answer(br#"{"recent_passes": 50}"#, &status));
        assert_eq!(all["recent_passes"].as_array().map(Vec::len), Some(5));
    }

    #[test]
    fn a_request_that_is_not_a_query_is_refused_with_400() {
        let status = status_with_passes(1);
        for body in [&b"status please"[..], br#"{"passes": 1}"#, br#""1""#] {
            match answer(body, &status) {
                Err((said, code)) => assert_eq!(code, 400, "{said}"),
                Ok(_) => panic!("{} was answered", String::from_utf8_lossy(body)),
            }
        }
    }
}
