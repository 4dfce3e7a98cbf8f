//! A job's environment as the reader may see it. A job's captured environment is kept apart
//! from its record (`mgpu_nats::job_env`), readable by its owner and admins only: the server
//! refuses anyone else's read, and they are told it is withheld.

use std::collections::BTreeMap;
use std::time::Duration;

use mgpu_nats::job_env;
use mgpu_protocol::job::JobRecord;
use mgpu_protocol::subjects;

use crate::client::session::Session;

/// How long a read of another user's environment is waited for: the server's refusal comes
/// at once, an admin's answer as fast; only a lost server takes this long.
const READ_WAIT: Duration = Duration::from_secs(5);

/// What the reader gets of a job's environment.
#[derive(Debug, PartialEq, Eq)]
pub enum Environment {
    /// The variables (in the record itself for a job submitted without keeping it apart).
    Shown(BTreeMap<String, String>),
    /// Another user's: not the reader's to see.
    Withheld,
    /// No longer kept: the job is in history (or the read failed, saying why).
    NotKept(String),
}

impl Environment {
    /// One line for `mgpu show`.
    pub fn describe(&self) -> String {
        match self {
            Environment::Shown(env) if env.is_empty() => "none".to_owned(),
            Environment::Shown(env) => {
                format!("{} variables (mgpu show --json lists them)", env.len())
            }
            Environment::Withheld => "withheld (only its owner and admins may read it)".to_owned(),
            Environment::NotKept(why) => format!("not available: {why}"),
        }
    }
}

/// `record`'s environment as this session may read it (a refused read is known at once from
/// the server's refusal, [`Session::refused`]).
pub async fn read(session: &Session, record: &JobRecord) -> Environment {
    if !record.spec.private_env {
        return Environment::Shown(record.spec.env.clone());
    }
    let owner = subjects::history_owner(record);
    let subject = job_env::get_subject(owner, &record.id);
    let refused = session.refused(&subject);
    let array = record.spec.array.as_ref().map(|member| &member.array_id);
    let read = tokio::time::timeout(
        READ_WAIT,
        job_env::get_for(&session.client, owner, &record.id, array),
    );
    tokio::select! {
        _ = refused => Environment::Withheld,
        read = read => match read {
            Ok(Ok(Some(env))) => Environment::Shown(env),
            Ok(Ok(None)) => Environment::NotKept(
                "an environment is kept while the job is live, not in history".to_owned(),
            ),
            Ok(Err(err)) => Environment::NotKept(err.to_string()),
            // Only a refused read goes unanswered.
            Err(_) => Environment::Withheld,
        },
    }
}
