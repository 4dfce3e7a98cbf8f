//! Standard input of interactive and terminal jobs: each message on `jobs.<id>.input` (core
//! NATS) is written to the job's stdin as it comes; an empty message closes the stdin of a job
//! on pipes (end of file). Forwarding stops when the job ends.
//!
//! Only signed input from the job's owner (or an admin) is taken: the assignment names the
//! keys; anything else (unsigned, forged, replayed, another user's) is dropped and logged.
//!
//! A terminal job's viewers also send control messages (`mgpu_protocol::terminal`): a resize
//! sets the job's terminal size, a claim gives that viewer the keyboard, and keys from a
//! viewer that does not hold it are dropped.

use async_nats::Subscriber;
use futures::StreamExt;
use mgpu_nats::signing::{self, Nonces};
use mgpu_protocol::terminal::{self, Keyboard, TerminalInput};
use tokio::io::AsyncWriteExt;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use crate::job_io::InputWriter;
use crate::pty::PtyResizer;
use crate::running::AttemptKey;

/// Where a job's input goes.
pub struct JobInput {
    pub stdin: InputWriter,
    /// The terminal's size control, for a terminal job.
    pub resizer: Option<PtyResizer>,
}

/// A running stdin forwarder; [`InputForwarder::stop`] ends it.
pub struct InputForwarder {
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

impl InputForwarder {
    /// Starts forwarding. The subscription is made before the process starts, so input sent
    /// right after the job starts is not lost.
    pub fn start(input: Subscriber, job: JobInput, key: AttemptKey, allowed: Vec<String>) -> Self {
        let (stop, stopped) = oneshot::channel();
        let task = tokio::spawn(forward(input, job, stopped, key, allowed));
        InputForwarder { stop, task }
    }

    /// Stops forwarding and waits for the task, which closes stdin and unsubscribes.
    pub async fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.task.await;
    }
}

/// What one message on `jobs.<id>.input` means. Any bytes are valid input (a job may read
/// binary data); the size is bounded by the server's `max_payload`, and the write waits
/// for the job to read, so no message can grow the agent's memory.
#[derive(Debug, PartialEq, Eq)]
pub enum Input<'a> {
    /// An empty message: close the job's stdin.
    EndOfInput,
    /// Bytes to write to the job's stdin, as they are.
    Bytes(&'a [u8]),
}

pub fn classify(payload: &[u8]) -> Input<'_> {
    if payload.is_empty() {
        Input::EndOfInput
    } else {
        Input::Bytes(payload)
    }
}

async fn forward(
    mut input: Subscriber,
    job: JobInput,
    mut stopped: oneshot::Receiver<()>,
    key: AttemptKey,
    allowed: Vec<String>,
) {
    let JobInput { mut stdin, resizer } = job;
    let mut nonces = Nonces::default();
    let mut keyboard = Keyboard::default();
    loop {
        let message = tokio::select! {
            _ = &mut stopped => break,
            message = input.next() => message,
        };
        let Some(message) = message else { break };
        let control = match accepted(&message, &allowed, &mut nonces) {
            Ok(control) => control,
            Err(why) => {
                warn!(job = %key.job_id, attempt = key.attempt, "input refused: {why}");
                continue;
            }
        };
        let viewer = match control {
            None => None,
            Some(TerminalInput::Keys { viewer }) => Some(viewer),
            Some(TerminalInput::Claim { viewer }) => {
                debug!(job = %key.job_id, attempt = key.attempt, viewer, "a viewer took the keyboard");
                keyboard.claim(&viewer);
                continue;
            }
            Some(TerminalInput::Resize(size)) => {
                if let Some(Err(err)) = resizer.as_ref().map(|r| r.resize(size)) {
                    warn!(job = %key.job_id, attempt = key.attempt, "cannot resize the job's terminal to {size}: {err}");
                }
                continue;
            }
        };
        if !keyboard.admits(viewer.as_deref()) {
            debug!(job = %key.job_id, attempt = key.attempt, "keys dropped: another viewer holds the keyboard");
            continue;
        }
        let bytes = match classify(&message.payload) {
            Input::Bytes(bytes) => bytes,
            // A terminal stays open for the next viewer: end of file is typed (Ctrl+D).
            Input::EndOfInput if resizer.is_some() => continue,
            Input::EndOfInput => {
                info!(job = %key.job_id, attempt = key.attempt, "closing the job's standard input (end of input received)");
                break;
            }
        };
        // A job that does not read its input fills the pipe; the write then waits, and must
        // still end when the job does.
        let written = tokio::select! {
            _ = &mut stopped => break,
            written = async {
                stdin.write_all(bytes).await?;
                stdin.flush().await
            } => written,
        };
        if let Err(err) = written {
            debug!(job = %key.job_id, attempt = key.attempt, "the job no longer reads its standard input: {err}");
            break;
        }
    }
    // Dropping `stdin` closes the pipe; unsubscribing stops the server sending us more.
    drop(stdin);
    let _ = input.unsubscribe().await;
}

/// Whether an input message is signed (recently, once) by a key the job accepts; the
/// terminal control it carries, if any (its header is part of what was signed).
fn accepted(
    message: &async_nats::Message,
    allowed: &[String],
    nonces: &mut Nonces,
) -> Result<Option<TerminalInput>, String> {
    let now = mgpu_protocol::now();
    let header = message
        .headers
        .as_ref()
        .and_then(|h| h.get(terminal::TERMINAL))
        .map(|v| v.as_str().to_owned());
    let control = header
        .as_deref()
        .map(TerminalInput::parse)
        .transpose()
        .map_err(|e| e.to_string())?;
    let subject = terminal::signed_subject(message.subject.as_str(), header.as_deref());
    let signed = signing::verify(message.headers.as_ref(), &subject, &message.payload, now)
        .map_err(|e| e.to_string())?;
    nonces.check(&signed, now).map_err(|e| e.to_string())?;
    if !allowed.contains(&signed.signer) {
        return Err(format!(
            "signed by {}, which is neither the job's owner nor an admin",
            signed.signer
        ));
    }
    Ok(control)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(
        subject: &str,
        payload: &'static [u8],
        headers: Option<async_nats::HeaderMap>,
    ) -> async_nats::Message {
        async_nats::Message {
            subject: subject.into(),
            reply: None,
            payload: bytes::Bytes::from_static(payload),
            headers,
            status: None,
            description: None,
            length: payload.len(),
        }
    }

    fn signed(key: &nkeys::KeyPair, subject: &str, payload: &[u8]) -> async_nats::HeaderMap {
        let mut headers = async_nats::HeaderMap::new();
        let _ = signing::sign(key, subject, payload, mgpu_protocol::now(), &mut headers);
        headers
    }

    #[test]
    fn only_the_owners_signed_input_reaches_the_job_and_only_once() {
        let owner = nkeys::KeyPair::new_user();
        let other = nkeys::KeyPair::new_user();
        let allowed = vec![owner.public_key()];
        let mut nonces = Nonces::default();
        let subject = "jobs.x.input";

        let good = message(subject, b"ls\n", Some(signed(&owner, subject, b"ls\n")));
        assert_eq!(accepted(&good, &allowed, &mut nonces), Ok(None));
        assert!(
            accepted(&good, &allowed, &mut nonces).is_err(),
            "a replay is refused"
        );

        let foreign = message(
            subject,
            b"rm -rf ~\n",
            Some(signed(&other, subject, b"rm -rf ~\n")),
        );
        let why = accepted(&foreign, &allowed, &mut nonces)
            .err()
            .unwrap_or_default();
        assert!(
            why.contains("neither the job's owner nor an admin"),
            "{why}"
        );

        let unsigned = message(subject, b"x", None);
        assert!(accepted(&unsigned, &allowed, &mut nonces).is_err());

        // Signed for another job's input: the subject is part of the signature.
        let elsewhere = message(subject, b"y", Some(signed(&owner, "jobs.y.input", b"y")));
        assert!(accepted(&elsewhere, &allowed, &mut nonces).is_err());
    }
}
