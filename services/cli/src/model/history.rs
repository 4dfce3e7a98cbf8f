//! Finished jobs as `mgpu history` finds them: those still in the live bucket (within the
//! scheduler's `keep_finished`) and those in the history stream, read with a consumer filtered
//! on the user's subjects (`history.<user>.>`) starting at `--since`, never by loading the
//! whole stream; then filtered, and ordered by when they ended.

use std::collections::HashSet;

use anyhow::Result;
use async_nats::jetstream;
use mgpu_nats::records::{self, Delivery};
use mgpu_protocol::Timestamp;
use mgpu_protocol::job::JobRecord;
use mgpu_protocol::subjects;

use crate::errors::plain;

/// What `mgpu history` keeps.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HistoryFilter {
    /// Whose jobs, by the key that signed them (the subject history files them under, which
    /// a user may read for their own key only); None: everyone's.
    pub owner: Option<String>,
    /// Whose jobs, by user name; None: any.
    pub user: Option<String>,
    /// Ended in one of these states (`failed`, …); empty: any.
    pub states: Vec<String>,
    /// Ended at or after.
    pub since: Option<Timestamp>,
    /// Ended before.
    pub until: Option<Timestamp>,
    /// Ran on this node (any rank).
    pub node: Option<String>,
    /// Its name matches this pattern (`*`, `?`).
    pub name: Option<String>,
}

impl HistoryFilter {
    /// Whether a record is a finished job this filter keeps.
    pub fn keeps(&self, record: &JobRecord) -> bool {
        let Some(ending) = record.state.ending() else {
            return false;
        };
        self.user.as_ref().is_none_or(|user| &record.user == user)
            && self
                .owner
                .as_deref()
                .is_none_or(|owner| subjects::history_owner(record) == owner)
            && (self.states.is_empty() || self.states.iter().any(|s| s == record.state.name()))
            && self.since.is_none_or(|since| ending.ended_at >= since)
            && self.until.is_none_or(|until| ending.ended_at < until)
            && self.node.as_ref().is_none_or(|node| {
                ending
                    .placement
                    .as_ref()
                    .is_some_and(|p| p.node_names().contains(&node.as_str()))
            })
            && self
                .name
                .as_ref()
                .is_none_or(|glob| glob_matches(glob, &record.spec.display_name()))
    }

    /// The history subjects this filter reads.
    fn subject(&self) -> String {
        match &self.owner {
            Some(owner) => format!("history.{owner}.>"),
            None => subjects::ALL_HISTORY.to_owned(),
        }
    }
}

/// `*` (any run of characters) and `?` (one character) against the whole of `text`.
pub fn glob_matches(glob: &str, text: &str) -> bool {
    let (glob, text): (Vec<char>, Vec<char>) = (glob.chars().collect(), text.chars().collect());
    // Greedy matching with one backtrack point, the last `*` seen.
    let (mut g, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        match glob.get(g) {
            Some('*') => {
                star = Some((g, t));
                g += 1;
            }
            Some(&c) if c == '?' || c == text[t] => {
                g += 1;
                t += 1;
            }
            _ => match star {
                Some((star_g, star_t)) => {
                    g = star_g + 1;
                    t = star_t + 1;
                    star = Some((star_g, star_t + 1));
                }
                None => return false,
            },
        }
    }
    glob[g..].iter().all(|c| *c == '*')
}

/// Whether the server lets this user read the history `filter` names: everyone may read their
/// own, admins anyone's. A refused request gets no answer, so a short wait tells.
pub async fn may_read(js: &jetstream::Context, filter: &HistoryFilter) -> bool {
    let Ok(stream) = js.get_stream(subjects::HISTORY_STREAM).await else {
        // Nothing in history yet: nothing to refuse.
        return true;
    };
    let probe = stream.create_consumer(jetstream::consumer::pull::OrderedConfig {
        name: Some(format!(
            "mgpu-probe-{}",
            mgpu_protocol::ids::JobId::random()
        )),
        filter_subject: filter.subject(),
        deliver_policy: jetstream::consumer::DeliverPolicy::Last,
        ..Default::default()
    });
    matches!(
        tokio::time::timeout(super::jobs::ANYONE_WAIT, probe).await,
        Ok(Ok(_))
    )
}

/// The finished jobs `filter` keeps, live and in history, by when they ended (each once).
pub async fn read(js: &jetstream::Context, filter: &HistoryFilter) -> Result<Vec<JobRecord>> {
    let mut jobs: Vec<JobRecord> = records::list_jobs(js)
        .await
        .map_err(plain)?
        .into_iter()
        .filter(|record| filter.keeps(record))
        .collect();
    let mut seen: HashSet<_> = jobs.iter().map(|record| record.id.clone()).collect();
    if js.get_stream(subjects::HISTORY_STREAM).await.is_ok() {
        let subject = filter.subject();
        records::for_each_since(
            js,
            subjects::HISTORY_STREAM,
            &subject,
            filter.since,
            |delivery| {
                match delivery {
                    Delivery::Message(message, _) => {
                        if let Ok(record) = serde_json::from_slice::<JobRecord>(&message.payload)
                            && filter.keeps(&record)
                            && seen.insert(record.id.clone())
                        {
                            jobs.push(record);
                        }
                    }
                    Delivery::StartOver => {}
                }
                Ok(())
            },
        )
        .await
        .map_err(plain)?;
    }
    jobs.sort_by_key(|record| record.state.ending().map(|end| end.ended_at));
    Ok(jobs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_the_whole_name() {
        assert!(glob_matches("bert*", "bert-large"));
        assert!(glob_matches("*large", "bert-large"));
        assert!(glob_matches("b?rt-*e", "bert-large"));
        assert!(glob_matches("*", ""));
        assert!(!glob_matches("bert", "bert-large"));
        assert!(!glob_matches("*small*", "bert-large"));
        assert!(glob_matches("a*b*c", "aXXbYYc"));
        assert!(!glob_matches("a*b*c", "aXXbYY"));
    }

    #[test]
    fn only_finished_jobs_the_filter_names_are_kept() {
        let mut record = crate::fixtures::job("train", crate::fixtures::queued(), 0, 120);
        assert!(
            !HistoryFilter::default().keeps(&record),
            "a queued job is no history"
        );
        record.state = crate::fixtures::finished(60);
        assert!(HistoryFilter::default().keeps(&record));
        let mine = HistoryFilter {
            user: Some("alice".into()),
            states: vec!["succeeded".into()],
            name: Some("tr*".into()),
            ..HistoryFilter::default()
        };
        assert!(mine.keeps(&record));
        let theirs = HistoryFilter {
            user: Some("bob".into()),
            ..HistoryFilter::default()
        };
        assert!(!theirs.keeps(&record));
        let failed_only = HistoryFilter {
            states: vec!["failed".into()],
            ..HistoryFilter::default()
        };
        assert!(!failed_only.keeps(&record));
        let later = HistoryFilter {
            since: Some(mgpu_protocol::now()),
            ..HistoryFilter::default()
        };
        assert!(!later.keeps(&record), "it ended a minute ago");
    }
}
