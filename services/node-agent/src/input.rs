//! Standard input of interactive jobs: each message on `jobs.<id>.input` (core NATS) is written
//! to the job's stdin as it comes; an empty message closes stdin (end of file). Forwarding stops
//! when the job ends.

use async_nats::Subscriber;
use futures::StreamExt;
use tokio::io::AsyncWriteExt;
use tokio::process::ChildStdin;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tracing::{debug, info};

use crate::running::AttemptKey;

/// A running stdin forwarder; [`InputForwarder::stop`] ends it.
pub struct InputForwarder {
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

impl InputForwarder {
    /// Starts forwarding. The subscription is made before the process starts, so input sent
    /// right after the job starts is not lost.
    pub fn start(input: Subscriber, stdin: ChildStdin, key: AttemptKey) -> Self {
        let (stop, stopped) = oneshot::channel();
        let task = tokio::spawn(forward(input, stdin, stopped, key));
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
    mut stdin: ChildStdin,
    mut stopped: oneshot::Receiver<()>,
    key: AttemptKey,
) {
    loop {
        let message = tokio::select! {
            _ = &mut stopped => break,
            message = input.next() => message,
        };
        let Some(message) = message else { break };
        let Input::Bytes(bytes) = classify(&message.payload) else {
            info!(%key, "closing the job's standard input (end of input received)");
            break;
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
            debug!(%key, "the job no longer reads its standard input: {err}");
            break;
        }
    }
    // Dropping `stdin` closes the pipe; unsubscribing stops the server sending us more.
    drop(stdin);
    let _ = input.unsubscribe().await;
}
