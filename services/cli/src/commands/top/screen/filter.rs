//! The `/` filter: words typed by the user, each narrowing what the panes show. A word is
//! `user:NAME`, `node:NAME`, `state:STATE`, or bare text matching any of those (and a job's id
//! or name). Matching ignores ASCII case and takes parts (`ali` finds alice); every word must
//! match.

use mgpu_protocol::job::{JobRecord, JobState};

/// What one word of a filter looks at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Field {
    Any,
    User,
    Node,
    State,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Term {
    field: Field,
    /// Lower-cased, so each comparison lower-cases only the text it looks in.
    needle: String,
}

/// A parsed filter; the empty one keeps everything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Filter {
    text: String,
    terms: Vec<Term>,
}

/// A GPU line as the filter sees it.
pub struct GpuFacts<'a> {
    pub node: &'a str,
    pub node_state: &'a str,
    pub paused: bool,
    pub job: Option<&'a JobRecord>,
}

impl Filter {
    pub fn parse(text: &str) -> Filter {
        let terms = text
            .split_whitespace()
            .map(|word| {
                let (field, needle) = match word.split_once(':') {
                    Some(("user" | "u", rest)) => (Field::User, rest),
                    Some(("node" | "n", rest)) => (Field::Node, rest),
                    Some(("state" | "s", rest)) => (Field::State, rest),
                    _ => (Field::Any, word),
                };
                Term {
                    field,
                    needle: needle.to_ascii_lowercase(),
                }
            })
            // `user:` alone is half typed: it narrows nothing yet.
            .filter(|term| !term.needle.is_empty())
            .collect();
        Filter {
            text: text.to_owned(),
            terms,
        }
    }

    pub fn text(&self) -> &str {
        &self.text
    }

    pub fn is_empty(&self) -> bool {
        self.terms.is_empty()
    }

    /// Whether the queue shows `job`.
    pub fn keeps_job(&self, job: &JobRecord) -> bool {
        self.terms.iter().all(|term| job_matches(term, job))
    }

    /// Whether the nodes pane shows a GPU line.
    pub fn keeps_gpu(&self, gpu: &GpuFacts<'_>) -> bool {
        self.terms.iter().all(|term| {
            let node = || contains(gpu.node, &term.needle);
            let state = || {
                contains(gpu.node_state, &term.needle)
                    || (gpu.paused && contains("paused", &term.needle))
                    || (gpu.job.is_none() && !gpu.paused && contains("free", &term.needle))
            };
            let job = |field| {
                gpu.job.is_some_and(|job| {
                    job_matches(
                        &Term {
                            field,
                            needle: term.needle.clone(),
                        },
                        job,
                    )
                })
            };
            match term.field {
                Field::Node => node(),
                Field::User => job(Field::User),
                Field::State => state() || job(Field::State),
                Field::Any => node() || state() || job(Field::Any),
            }
        })
    }
}

fn job_matches(term: &Term, job: &JobRecord) -> bool {
    let needle = term.needle.as_str();
    let user = || contains(&job.user, needle);
    let node = || {
        job.state
            .placement()
            .is_some_and(|p| p.node_names().iter().any(|n| contains(n, needle)))
    };
    let state = || {
        contains(job.state.name(), needle)
            || matches!(&job.state, JobState::Queued(w) if w.held_by.is_some() && contains("held", needle))
    };
    match term.field {
        Field::User => user(),
        Field::Node => node(),
        Field::State => state(),
        Field::Any => {
            user()
                || node()
                || state()
                || job.id.as_str().starts_with(needle)
                || contains(&job.spec.display_name(), needle)
        }
    }
}

/// Whether `haystack` contains `needle` (already lower case), ignoring ASCII case, without
/// allocating: the filter runs over every job on each change.
fn contains(haystack: &str, needle: &str) -> bool {
    let (hay, needle) = (haystack.as_bytes(), needle.as_bytes());
    needle.is_empty()
        || hay
            .windows(needle.len())
            .any(|window| window.eq_ignore_ascii_case(needle))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::top::screen::test_data::{job, queued, running};

    #[test]
    fn words_narrow_by_user_node_and_state() {
        let alice_running = job("alice", "train", running("node001", &[0]));
        let bob_queued = job("bob", "eval", queued());
        let user = Filter::parse("user:ali");
        assert!(user.keeps_job(&alice_running));
        assert!(!user.keeps_job(&bob_queued));
        let node = Filter::parse("node:node001");
        assert!(node.keeps_job(&alice_running));
        assert!(!node.keeps_job(&bob_queued));
        let state = Filter::parse("state:QUEUED");
        assert!(!state.keeps_job(&alice_running));
        assert!(state.keeps_job(&bob_queued));
        // Bare words look everywhere; every word must match.
        assert!(Filter::parse("bob").keeps_job(&bob_queued));
        assert!(Filter::parse("eval queued").keeps_job(&bob_queued));
        assert!(!Filter::parse("eval running").keeps_job(&bob_queued));
        assert!(Filter::parse("").is_empty());
        assert!(Filter::parse("user:").is_empty());
    }

    #[test]
    fn gpu_lines_match_their_node_and_their_job() {
        let alice = job("alice", "train", running("node001", &[0]));
        let busy = GpuFacts {
            node: "node001",
            node_state: "online",
            paused: false,
            job: Some(&alice),
        };
        let idle = GpuFacts {
            node: "node002",
            node_state: "drained",
            paused: true,
            job: None,
        };
        assert!(Filter::parse("alice").keeps_gpu(&busy));
        assert!(!Filter::parse("user:alice").keeps_gpu(&idle));
        assert!(Filter::parse("node:002").keeps_gpu(&idle));
        assert!(Filter::parse("state:paused").keeps_gpu(&idle));
        assert!(Filter::parse("drained").keeps_gpu(&idle));
        assert!(Filter::parse("state:running").keeps_gpu(&busy));
        assert!(!Filter::parse("state:free").keeps_gpu(&busy));
    }
}
