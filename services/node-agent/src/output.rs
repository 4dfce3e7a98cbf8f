//! A job's output on `jobs.<id>.output`: two reader tasks (stdout, stderr) pass on whatever
//! each read returns, at once and without line buffering (people watch it live), through one
//! channel to a single publisher that numbers the chunks in arrival order and publishes them
//! to JetStream with a window of acknowledgements in flight (a job writing gigabytes must not
//! wait one round trip per chunk). A restarted attempt's output starts with a line of the
//! agent's saying why the attempt before it stopped ([`restart_line`]), published before
//! anything the job writes.

use std::time::{Duration, Instant};

use async_nats::HeaderMap;
use async_nats::jetstream::{self, context::PublishError};
use bytes::Bytes;
use futures::stream::{FuturesUnordered, StreamExt};
use mgpu_protocol::output;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tracing::{debug, warn};

use crate::running::AttemptKey;

/// Publish acknowledgements awaited at once; with 64 KiB chunks that is 16 MiB on the wire.
const ACKS_IN_FLIGHT: usize = 256;
/// How long a chunk JetStream does not confirm is offered again before it counts as lost:
/// longer than a stream takes to elect a new leader, or a paused server to come back.
const RETRY_FOR: Duration = Duration::from_secs(30);
/// The pause before a chunk is offered again.
const RETRY_PAUSE: Duration = Duration::from_millis(250);
/// Chunks queued between the readers and the publisher. When NATS is slower than the job, the
/// queue fills, the readers stop reading and the job blocks on its full pipe: backpressure
/// rather than unbounded memory.
const QUEUED_CHUNKS: usize = 64;

struct Chunk {
    stream: &'static str,
    data: Bytes,
}

/// How a job's output publishing went.
#[derive(Debug)]
pub struct OutputSummary {
    /// Sequence number the EOF message takes (one past the last chunk's).
    pub next_seq: u64,
    pub bytes: u64,
    /// Chunks JetStream did not confirm within [`RETRY_FOR`] (stream missing, NATS down).
    pub lost_chunks: u64,
}

/// The running output tasks of one job attempt.
pub struct OutputPipeline {
    readers: Vec<JoinHandle<()>>,
    publisher: JoinHandle<OutputSummary>,
}

impl OutputPipeline {
    /// `rank`: which of the job's processes this is (0 unless it is distributed);
    /// `preamble`: the agent's own line, published first, on stdout.
    pub fn start(
        js: jetstream::Context,
        (key, subject): (AttemptKey, String),
        rank: u32,
        preamble: Option<String>,
        (stdout, stderr): (
            impl AsyncRead + Unpin + Send + 'static,
            impl AsyncRead + Unpin + Send + 'static,
        ),
    ) -> Self {
        let (tx, rx) = mpsc::channel(QUEUED_CHUNKS);
        // Queued before the readers start, and the channel keeps its order: the preamble is
        // the first chunk published, whatever the job writes at once.
        if let Some(line) = preamble {
            let chunk = Chunk {
                stream: output::STDOUT,
                data: Bytes::from(line),
            };
            // A fresh channel has room; a full one would only mean the line is not shown.
            let _ = tx.try_send(chunk);
        }
        let readers = vec![
            tokio::spawn(read_pipe(stdout, output::STDOUT, tx.clone(), key.clone())),
            tokio::spawn(read_pipe(stderr, output::STDERR, tx, key.clone())),
        ];
        let publisher = tokio::spawn(publish_chunks(js, (key, subject), rank, rx));
        OutputPipeline { readers, publisher }
    }

    /// Waits for the readers to reach end of file and for every chunk to be acknowledged.
    ///
    /// Called once the job's process group is dead, so end of file comes at once unless a
    /// process that left the group (a daemon) still holds a pipe: after `drain_limit` the rest
    /// of the output is dropped rather than keeping the job open forever.
    pub async fn finish(self, key: &AttemptKey, drain_limit: Duration) -> OutputSummary {
        let OutputPipeline {
            mut readers,
            publisher,
        } = self;
        let drained = tokio::time::timeout(drain_limit, async {
            for reader in &mut readers {
                let _ = reader.await;
            }
        })
        .await;
        if drained.is_err() {
            warn!(job = %key.job_id, attempt = key.attempt, "a process outside the job's process group still holds its output open; dropping the rest of its output");
            // Aborting drops the readers' channel ends, which lets the publisher finish.
            for reader in &readers {
                reader.abort();
            }
        }
        match publisher.await {
            Ok(summary) => summary,
            Err(err) => {
                warn!(job = %key.job_id, attempt = key.attempt, "the output publisher of the job failed: {err}");
                // How far it got is unknown; the EOF message still goes out so readers stop.
                OutputSummary {
                    next_seq: 1,
                    bytes: 0,
                    lost_chunks: 0,
                }
            }
        }
    }
}

async fn read_pipe(
    mut pipe: impl AsyncRead + Unpin,
    stream: &'static str,
    tx: mpsc::Sender<Chunk>,
    key: AttemptKey,
) {
    let mut buffer = vec![0u8; output::MAX_CHUNK];
    loop {
        match pipe.read(&mut buffer).await {
            Ok(0) => break,
            Ok(n) => {
                let chunk = Chunk {
                    stream,
                    data: Bytes::copy_from_slice(&buffer[..n]),
                };
                if tx.send(chunk).await.is_err() {
                    break;
                }
            }
            Err(err) if err.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(err) => {
                warn!(job = %key.job_id, attempt = key.attempt, "cannot read the job's {stream}: {err}");
                break;
            }
        }
    }
}

/// The line that opens a restarted attempt's output: `--- mgpu: attempt 2 starts; attempt 1
/// stopped: preempted by 4f2a… (bob) ---`. None for a first attempt, or when the scheduler did
/// not say why the last one stopped. The reason is the scheduler's text, kept to one line.
pub fn restart_line(attempt: u32, previous_stop: Option<&str>) -> Option<String> {
    let why = previous_stop?;
    if attempt < 2 {
        return None;
    }
    let why: String = why
        .trim()
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    Some(format!(
        "--- mgpu: attempt {attempt} starts; attempt {} stopped: {why} ---\n",
        attempt - 1
    ))
}

/// Headers of an output message; see [`mgpu_protocol::output`].
pub fn output_headers(stream: &str, seq: u64, attempt: u32, rank: u32) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert(output::STREAM, stream);
    headers.insert(output::SEQ, seq.to_string());
    headers.insert(output::RANK, rank.to_string());
    headers.insert(output::ATTEMPT, attempt.to_string());
    headers
}

/// A chunk on its way to JetStream: its number, and since when JetStream has not confirmed it.
struct Numbered {
    seq: u64,
    chunk: Chunk,
    failing_since: Option<Instant>,
}

/// One offer of a chunk to JetStream, and how it went.
type Sending = std::pin::Pin<Box<dyn Future<Output = (Numbered, Result<(), PublishError>)> + Send>>;

/// Where a job's chunks go, and under which headers.
struct Destination {
    js: jetstream::Context,
    subject: String,
    attempt: u32,
    rank: u32,
}

impl Destination {
    /// Offers `numbered` to JetStream after `pause`, until stored or refused.
    fn send(&self, numbered: Numbered, pause: Duration) -> Sending {
        let (js, subject) = (self.js.clone(), self.subject.clone());
        let headers = output_headers(numbered.chunk.stream, numbered.seq, self.attempt, self.rank);
        Box::pin(async move {
            if !pause.is_zero() {
                tokio::time::sleep(pause).await;
            }
            let data = numbered.chunk.data.clone();
            let stored = async { js.publish_with_headers(subject, headers, data).await?.await };
            let stored = stored.await.map(|_| ());
            (numbered, stored)
        })
    }
}

/// Counts chunks JetStream did not confirm in time; logs the first failure, the total comes
/// at the end.
struct Losses<'a> {
    key: &'a AttemptKey,
    subject: &'a str,
    failures: u64,
    count: u64,
}

impl Losses<'_> {
    fn failed(&mut self, err: &PublishError) {
        self.failures += 1;
        if self.failures == 1 {
            warn!(job = %self.key.job_id, attempt = self.key.attempt, "job output is not being stored on {} ({err}); offering it again for up to {RETRY_FOR:?}", self.subject);
        }
    }
}

/// What to do with an offer that came back: nothing once stored; offered again after a pause
/// while JetStream has refused it for less than [`RETRY_FOR`]; counted lost after that.
fn settle(
    (mut numbered, stored): (Numbered, Result<(), PublishError>),
    losses: &mut Losses<'_>,
    destination: &Destination,
) -> Option<Sending> {
    let err = stored.err()?;
    losses.failed(&err);
    let since = *numbered.failing_since.get_or_insert_with(Instant::now);
    if since.elapsed() >= RETRY_FOR {
        losses.count += 1;
        return None;
    }
    Some(destination.send(numbered, RETRY_PAUSE))
}

async fn publish_chunks(
    js: jetstream::Context,
    (key, subject): (AttemptKey, String),
    rank: u32,
    mut rx: mpsc::Receiver<Chunk>,
) -> OutputSummary {
    let destination = Destination {
        js,
        subject: subject.clone(),
        attempt: key.attempt,
        rank,
    };
    let mut losses = Losses {
        key: &key,
        subject: &subject,
        failures: 0,
        count: 0,
    };
    let mut in_flight: FuturesUnordered<Sending> = FuturesUnordered::new();
    let mut last_seq: u64 = 0;
    let mut bytes: u64 = 0;
    loop {
        // Offered again, a chunk keeps its place in the window: while JetStream is away the
        // window fills, the job's pipe with it, and the job waits rather than losing output.
        while in_flight.len() >= ACKS_IN_FLIGHT {
            if let Some(done) = in_flight.next().await {
                in_flight.extend(settle(done, &mut losses, &destination));
            }
        }
        // Taking acknowledgements as they come keeps the window small while the job is quiet.
        let chunk = tokio::select! {
            biased;
            Some(done) = in_flight.next(), if !in_flight.is_empty() => {
                in_flight.extend(settle(done, &mut losses, &destination));
                continue;
            }
            chunk = rx.recv() => chunk,
        };
        let Some(chunk) = chunk else { break };
        last_seq += 1;
        bytes += chunk.data.len() as u64;
        let numbered = Numbered {
            seq: last_seq,
            chunk,
            failing_since: None,
        };
        in_flight.push(destination.send(numbered, Duration::ZERO));
    }
    // Each offer ends on its own (an acknowledgement times out after the context's 5 s, a
    // chunk is offered for at most RETRY_FOR), so this flush is bounded even when NATS is gone.
    while let Some(done) = in_flight.next().await {
        in_flight.extend(settle(done, &mut losses, &destination));
    }
    let lost_chunks = losses.count;
    if lost_chunks > 0 {
        warn!(job = %key.job_id, attempt = key.attempt, "{lost_chunks} of {last_seq} output chunks of the job were not stored");
    } else {
        debug!(job = %key.job_id, attempt = key.attempt, chunks = last_seq, bytes, offers_refused = losses.failures, "job output published");
    }
    OutputSummary {
        next_seq: last_seq + 1,
        bytes,
        lost_chunks,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_restarted_attempt_says_why_the_one_before_stopped_on_one_line() {
        assert_eq!(
            restart_line(2, Some("preempted by 4f2a1b2c3d (bob)")).as_deref(),
            Some(
                "--- mgpu: attempt 2 starts; attempt 1 stopped: preempted by 4f2a1b2c3d (bob) ---\n"
            )
        );
        assert_eq!(
            restart_line(3, Some("node lost\n\x1b[2Jcleared")).as_deref(),
            Some("--- mgpu: attempt 3 starts; attempt 2 stopped: node lost  [2Jcleared ---\n")
        );
        assert_eq!(restart_line(1, Some("preempted")), None);
        assert_eq!(restart_line(2, None), None);
    }
}
