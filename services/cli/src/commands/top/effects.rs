//! Carrying out what `mgpu top`'s model asks for, with the same code as the commands (`mgpu
//! cancel`, `mgpu hold`, `mgpu release`, `mgpu logs -f`); each outcome comes back as an
//! [`Input`] for the status line or the log pane.

use super::screen::model::Input;
use async_nats::jetstream;
use futures::StreamExt;
use futures::stream::{self, BoxStream};
use mgpu_protocol::ids::JobId;

use crate::client::follow::output::{self, Chunk};
use crate::client::session::Session;
use crate::commands::{cancel, hold};

/// Cancels the job and waits (a while) to see it stop, as `mgpu cancel` does.
pub async fn cancel(session: &Session, id: JobId) -> Input {
    Input::Said(match cancel::cancel_one(session, id.as_str()).await {
        Ok(cancel::Outcome::Stopped(id)) => format!("Cancelled job {}.", id.short()),
        Ok(cancel::Outcome::StillStopping(id)) => {
            format!(
                "Cancel requested for job {}; it is still stopping.",
                id.short()
            )
        }
        Err(err) => format!("Job {} not cancelled: {err:#}", id.short()),
    })
}

/// Holds or releases the job, as `mgpu hold` and `mgpu release` do.
pub async fn hold(session: &Session, id: JobId, action: hold::Action) -> Input {
    Input::Said(match hold::one(session, id.as_str(), action).await {
        Ok(outcome) => outcome.sentence(),
        Err(err) => format!("Job {}: {err:#}", id.short()),
    })
}

/// The job's output from its first line on, and what follows, as `mgpu logs -f` reads it.
pub fn follow_log(js: jetstream::Context, id: JobId, subject: String) -> BoxStream<'static, Input> {
    stream::once(async move {
        match output::open_output(&js, &[subject]).await {
            Ok(feed) => {
                let job = id.clone();
                feed.messages
                    .map(move |message| match message {
                        Ok(message) => chunk(&job, output::classify(&message)),
                        Err(err) => Input::LogEnded {
                            job: job.clone(),
                            note: format!("the output could not be read: {err}"),
                        },
                    })
                    .boxed()
            }
            Err(err) => stream::iter([Input::LogEnded {
                job: id,
                note: format!("the output could not be read: {err:#}"),
            }])
            .boxed(),
        }
    })
    .flatten()
    .boxed()
}

fn chunk(job: &JobId, chunk: Chunk<'_>) -> Input {
    let bytes = match chunk {
        Chunk::Stdout(bytes) | Chunk::Stderr(bytes) => bytes.to_vec(),
        // An attempt's end is a line of its own: a requeued job's next attempt follows it.
        Chunk::Eof {
            attempt, exit_code, ..
        } => {
            let attempt = attempt.map(|a| format!(" {a}")).unwrap_or_default();
            let status = exit_code.map_or("no exit status".to_owned(), |c| format!("exit {c}"));
            format!("\n[attempt{attempt} ended: {status}]\n").into_bytes()
        }
    };
    Input::Log {
        job: job.clone(),
        bytes,
    }
}
