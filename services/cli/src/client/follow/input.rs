//! What a follower sends the job it follows on `jobs.<id>.input`, signed with the user's key:
//! - [`InputMode::Lines`]: our stdin as it is read (a pipe, or a terminal in its usual line
//!   mode), and an empty message when it ends, which closes the job's stdin;
//! - [`InputMode::Keys`], for a job on a terminal (`--pty`): this terminal in raw mode, every
//!   key passed on as the bytes it types, the window's size whenever it changes, and first a
//!   claim on the job's keyboard; `Ctrl+]` detaches instead of being sent. A read-only viewer
//!   sends nothing but still detaches with `Ctrl+]`.
//!
//! Reading happens on a plain thread: a blocking read of a terminal cannot be cancelled, and a
//! detached thread does not hold the process open once the job has ended.

use std::io::Read as _;
use std::sync::Arc;

use bytes::Bytes;
use mgpu_protocol::terminal::{self, DETACH_KEY, TerminalInput};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;

use super::raw_terminal::{self, RawInput};
use crate::console;

/// Stdin is sent in chunks well under the server's message size limit.
const STDIN_CHUNK: usize = 32 * 1024;

/// What the follower does with our stdin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InputMode {
    /// Nothing: the job takes no input, or it is not ours to type into.
    None,
    Lines,
    Keys {
        viewer: String,
        read_only: bool,
    },
}

impl InputMode {
    /// A viewer of a terminal job with a fresh id.
    pub fn keys(read_only: bool) -> InputMode {
        InputMode::Keys {
            viewer: uuid::Uuid::new_v4().simple().to_string(),
            read_only,
        }
    }
}

/// Where input goes and who signs it.
pub struct InputTarget {
    pub client: async_nats::Client,
    pub subject: String,
    pub key: Arc<nkeys::KeyPair>,
}

impl InputTarget {
    /// Publishes `payload`, signed; with a terminal control, its header is signed too.
    async fn send(&self, control: Option<&TerminalInput>, payload: Bytes) -> Result<(), String> {
        let header = control.map(TerminalInput::header);
        let signed_subject = terminal::signed_subject(&self.subject, header.as_deref());
        let mut headers = async_nats::HeaderMap::new();
        mgpu_nats::signing::sign(
            &self.key,
            &signed_subject,
            &payload,
            mgpu_protocol::now(),
            &mut headers,
        )
        .map_err(|err| format!("cannot sign input for the job: {err}"))?;
        if let Some(header) = header {
            headers.insert(terminal::TERMINAL, header.as_str());
        }
        self.client
            .publish_with_headers(self.subject.clone(), headers, payload)
            .await
            .map_err(|err| format!("cannot send input to the job: {err}"))
    }
}

/// Starts sending input in `mode`. In keys mode this terminal is raw until the returned guard
/// is dropped, and `detach` gets a message when `Ctrl+]` is pressed.
pub fn start(target: InputTarget, mode: InputMode, detach: mpsc::Sender<()>) -> Option<RawInput> {
    match mode {
        InputMode::None => None,
        InputMode::Lines => {
            tokio::spawn(forward_lines(target));
            None
        }
        InputMode::Keys { viewer, read_only } => {
            let raw = RawInput::enable();
            tokio::spawn(forward_keys(target, viewer, read_only, detach));
            raw
        }
    }
}

/// Sends our stdin to the job in chunks; an empty message tells the agent to close the job's
/// stdin, as our stdin ended.
async fn forward_lines(target: InputTarget) {
    let Some(mut chunks) = spawn_reader() else {
        return;
    };
    // The reader sends an empty chunk at end of input, then hangs up.
    while let Some(chunk) = chunks.recv().await {
        let last = chunk.is_empty();
        if let Err(err) = target.send(None, chunk).await {
            console::stderr_line(&format!("mgpu: {err}"));
            return;
        }
        if last {
            let _ = target.client.flush().await;
            return;
        }
    }
}

/// A terminal job's viewer: claims the keyboard, says the window's size and keeps it in step,
/// and passes keys on until `Ctrl+]`.
async fn forward_keys(
    target: InputTarget,
    viewer: String,
    read_only: bool,
    detach: mpsc::Sender<()>,
) {
    let Some(mut chunks) = spawn_reader() else {
        return;
    };
    let mut resized = signal(SignalKind::window_change()).ok();
    if !read_only {
        let claim = TerminalInput::Claim {
            viewer: viewer.clone(),
        };
        report(target.send(Some(&claim), Bytes::new()).await);
        send_size(&target).await;
    }
    let keys = TerminalInput::Keys { viewer };
    loop {
        tokio::select! {
            chunk = chunks.recv() => {
                let Some(chunk) = chunk.filter(|c| !c.is_empty()) else { return };
                let (typed, detached) = split_at_detach(chunk);
                if !read_only && !typed.is_empty() {
                    report(target.send(Some(&keys), typed).await);
                }
                if detached {
                    let _ = target.client.flush().await;
                    let _ = detach.send(()).await;
                    return;
                }
            }
            Some(()) = next_resize(&mut resized), if !read_only => send_size(&target).await,
        }
    }
}

/// The next SIGWINCH; never, where it cannot be watched.
async fn next_resize(resized: &mut Option<tokio::signal::unix::Signal>) -> Option<()> {
    match resized {
        Some(signal) => signal.recv().await,
        None => std::future::pending().await,
    }
}

async fn send_size(target: &InputTarget) {
    if let Some(size) = raw_terminal::size() {
        report(
            target
                .send(Some(&TerminalInput::Resize(size)), Bytes::new())
                .await,
        );
    }
}

fn report(sent: Result<(), String>) {
    if let Err(err) = sent {
        console::stderr_line(&format!("mgpu: {err}"));
    }
}

/// The keys typed before the detach key, and whether it was pressed.
fn split_at_detach(chunk: Bytes) -> (Bytes, bool) {
    match chunk.iter().position(|b| *b == DETACH_KEY) {
        Some(at) => (chunk.slice(..at), true),
        None => (chunk, false),
    }
}

/// Reads stdin on its own thread; each read arrives as a chunk, an empty one at the end.
fn spawn_reader() -> Option<mpsc::Receiver<Bytes>> {
    let (sender, chunks) = mpsc::channel::<Bytes>(4);
    let reader = std::thread::Builder::new()
        .name("stdin".into())
        .spawn(move || read_stdin(&sender));
    match reader {
        Ok(_) => Some(chunks),
        Err(err) => {
            console::stderr_line(&format!(
                "mgpu: cannot read stdin, the job gets no input: {err}"
            ));
            None
        }
    }
}

fn read_stdin(sender: &mpsc::Sender<Bytes>) {
    let mut stdin = std::io::stdin().lock();
    let mut buffer = vec![0u8; STDIN_CHUNK];
    loop {
        let read = match stdin.read(&mut buffer) {
            Ok(read) => read,
            Err(err) if err.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(err) => {
                console::stderr_line(&format!(
                    "mgpu: reading stdin failed, closing the job's input: {err}"
                ));
                0
            }
        };
        if sender
            .blocking_send(Bytes::copy_from_slice(&buffer[..read]))
            .is_err()
            || read == 0
        {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_detach_key_ends_what_is_sent() {
        let (typed, detached) = split_at_detach(Bytes::from_static(b"ls\r\x1dmore"));
        assert_eq!((&typed[..], detached), (&b"ls\r"[..], true));
        let (typed, detached) = split_at_detach(Bytes::from_static(b"\x03"));
        assert_eq!((&typed[..], detached), (&b"\x03"[..], false));
    }
}
