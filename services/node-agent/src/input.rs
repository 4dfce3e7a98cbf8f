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
        if message.payload.is_empty() {
            info!(%key, "closing the job's standard input (end of input received)");
            break;
        }
        // A job that does not read its input fills the pipe; the write then waits, and must
        // still end when the job does.
        let written = tokio::select! {
            _ = &mut stopped => break,
            written = async {
                stdin.write_all(&message.payload).await?;
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
