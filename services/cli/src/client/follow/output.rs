//! A job's output as JetStream has it (stream `MGPU_OUTPUT`): which subjects it is on, reading
//! it from the first message, what each message is (stdout, stderr, the end of one process),
//! which processes' ends were seen, and writing it to our stdout and stderr.

use std::io::Write;

use anyhow::{Context as _, Result};
use async_nats::jetstream::{self, consumer};
use futures::StreamExt;
use mgpu_nats::records;
use mgpu_protocol::ids::JobId;
use mgpu_protocol::job::JobRecord;
use mgpu_protocol::{output, subjects};

use super::ordered::Ordered;
pub use super::ordered::{OutputMessages, Received};
use crate::client::session::Session;
use crate::errors::{lookup, plain};

/// The job's output messages, oldest first and in the order each process wrote them
/// ([`Ordered`]), and how many were stored when we started.
pub struct OutputFeed {
    pub messages: Ordered,
    /// Messages stored when the consumers were created: 0 means there is nothing to replay.
    pub initially_pending: u64,
}

/// Where `record`'s output is: its one subject (`subjects::output_of`).
pub fn output_subjects_of(record: &JobRecord) -> Vec<String> {
    vec![subjects::output_of(record)]
}

/// Where the output of a job this user just submitted may be before its record says which:
/// the public subject, or the user's own private one (the cluster may make every job
/// private). Only one of them ever gets any.
pub fn own_output_subjects(own_key: &str, id: &JobId) -> Vec<String> {
    vec![subjects::output(id), subjects::private_output(own_key, id)]
}

/// Opens an ordered consumer on each of the job's output subjects from the very first message,
/// merged. Ordered consumers are ephemeral and need no acks, so readers leave nothing behind.
/// Named, so the request names its filter: the server lets a user filter on public output and
/// on their own private output only.
pub async fn open_output(js: &jetstream::Context, filters: &[String]) -> Result<OutputFeed> {
    let stream = js
        .get_stream(subjects::OUTPUT_STREAM)
        .await
        .map_err(lookup)?;
    let mut feeds = Vec::with_capacity(filters.len());
    let mut initially_pending = 0;
    for subject in filters {
        let consumer = records::create_reader("reading the job's output", || {
            stream.create_consumer(consumer::pull::OrderedConfig {
                name: Some(format!("mgpu-output-{}", JobId::random())),
                filter_subject: subject.clone(),
                deliver_policy: consumer::DeliverPolicy::All,
                ..Default::default()
            })
        })
        .await
        .map_err(plain)?;
        initially_pending += consumer.cached_info().num_pending;
        let messages = consumer
            .messages()
            .await
            .map_err(plain)
            .context("reading the job's output")?;
        feeds.push(messages);
    }
    let messages: OutputMessages = if feeds.len() == 1 {
        feeds.remove(0).boxed()
    } else {
        futures::stream::select_all(feeds).boxed()
    };
    Ok(OutputFeed {
        messages: Ordered::new(messages),
        initially_pending,
    })
}

/// Refuses, in words, to follow another user's private output the server will not let this
/// session read: the server's refusal ([`Session::refused`]) comes at once, where waiting for
/// the reader would take seconds. Admins, and the job's owner, pass.
pub async fn check_output_readable(session: &Session, record: &JobRecord) -> Result<()> {
    let own = record.user_key.as_deref() == Some(session.key.public_key().as_str());
    if !record.spec.private_output || own {
        return Ok(());
    }
    let filters = output_subjects_of(record);
    let refusal = session.refused(subjects::OUTPUT_STREAM);
    tokio::select! {
        _ = refusal => anyhow::bail!(
            "job {}'s output is private: only {} and admins may read it",
            record.id.short(),
            record.user
        ),
        opened = open_output(&session.js, &filters) => opened.map(drop),
    }
}

/// What one output message is.
#[derive(Debug, PartialEq, Eq)]
pub enum Chunk<'a> {
    Stdout(&'a [u8]),
    Stderr(&'a [u8]),
    /// The end of one attempt's output, with the process's exit status.
    Eof {
        attempt: Option<u32>,
        /// Which process of a distributed job ended (0 for others).
        rank: u32,
        exit_code: Option<i32>,
    },
}

/// End-of-output markers seen so far, by attempt: a distributed job's output is complete
/// once every rank's marker came.
#[derive(Debug, Default)]
pub struct Ends {
    seen: std::collections::BTreeMap<u32, std::collections::BTreeSet<u32>>,
    /// The first failing exit status per attempt, else the last one.
    exit_codes: std::collections::BTreeMap<u32, i32>,
}

impl Ends {
    pub fn saw(&mut self, attempt: u32, rank: u32, exit_code: Option<i32>) {
        self.seen.entry(attempt).or_default().insert(rank);
        let code = exit_code.unwrap_or(1);
        let kept = self.exit_codes.entry(attempt).or_insert(code);
        if *kept == 0 {
            *kept = code;
        }
    }

    /// Whether every process of `record`'s current attempt (or a later one) ended.
    pub fn complete_for(&self, record: &JobRecord) -> bool {
        let ranks = record
            .state
            .placement()
            .map_or(1, |p| p.launched_ranks().len());
        self.seen
            .range(record.attempt..)
            .any(|(_, seen)| seen.len() >= ranks)
    }

    /// The exit status to report for `attempt`: the first failure among its ranks.
    pub fn exit_code(&self, attempt: u32) -> Option<i32> {
        self.exit_codes.get(&attempt).copied()
    }
}

/// Reads an output message's headers. Unlabelled output counts as stdout: the payload is
/// raw bytes either way, and showing it beats dropping it.
pub fn classify(message: &async_nats::Message) -> Chunk<'_> {
    let header = |name: &str| {
        message
            .headers
            .as_ref()
            .and_then(|h| h.get(name))
            .map(|v| v.as_str().trim().to_owned())
    };
    match header(output::STREAM).as_deref() {
        Some(output::EOF) => Chunk::Eof {
            attempt: header(output::ATTEMPT).and_then(|a| a.parse().ok()),
            rank: header(output::RANK)
                .and_then(|r| r.parse().ok())
                .unwrap_or(0),
            exit_code: header(output::EXIT_CODE).and_then(|c| c.parse().ok()),
        },
        Some(output::STDERR) => Chunk::Stderr(&message.payload),
        _ => Chunk::Stdout(&message.payload),
    }
}

/// Writes a chunk's raw bytes to our stdout or stderr and flushes, so output appears as the
/// job writes it. Returns false for EOF markers, which carry no bytes.
pub fn write_chunk(chunk: &Chunk<'_>) -> std::io::Result<bool> {
    match chunk {
        Chunk::Stdout(bytes) => {
            let mut out = std::io::stdout().lock();
            out.write_all(bytes)?;
            out.flush()?;
            Ok(true)
        }
        Chunk::Stderr(bytes) => {
            let mut err = std::io::stderr().lock();
            err.write_all(bytes)?;
            err.flush()?;
            Ok(true)
        }
        Chunk::Eof { .. } => Ok(false),
    }
}

/// Bytes buffered before a write whether or not more output is at hand.
const WRITE_BUFFER: usize = 1024 * 1024;

/// A job's output on its way to our stdout and stderr, for readers that see many messages in
/// a row (`mgpu logs`). Each message written and flushed at once costs a job writing
/// gigabytes two system calls per 64 KiB (std's stdout is line-buffered, so it writes up to
/// the last newline, then the rest on flush). Here messages collect in a buffer and the caller
/// flushes once no further message is at hand, so output still appears as soon as it is read.
///
/// It writes to duplicates of file descriptors 1 and 2, past std's own buffering; nothing
/// else may print to stdout while it holds unflushed bytes. Dropping it flushes, ignoring
/// errors, like std's buffered writers; call [`OutputWriter::flush`] to see them.
pub struct OutputWriter {
    stdout: std::io::BufWriter<std::fs::File>,
    stderr: std::io::BufWriter<std::fs::File>,
}

impl OutputWriter {
    pub fn new() -> std::io::Result<Self> {
        use std::os::fd::AsFd;
        let stdout = std::fs::File::from(std::io::stdout().as_fd().try_clone_to_owned()?);
        let stderr = std::fs::File::from(std::io::stderr().as_fd().try_clone_to_owned()?);
        Ok(OutputWriter {
            stdout: std::io::BufWriter::with_capacity(WRITE_BUFFER, stdout),
            stderr: std::io::BufWriter::with_capacity(WRITE_BUFFER, stderr),
        })
    }

    /// Buffers a chunk's bytes. Returns false for EOF markers, which carry no bytes.
    pub fn write(&mut self, chunk: &Chunk<'_>) -> std::io::Result<bool> {
        match chunk {
            // What was buffered for the other stream goes first, so a terminal showing both
            // sees them in the order the job wrote them.
            Chunk::Stdout(bytes) => {
                self.stderr.flush()?;
                self.stdout.write_all(bytes)?;
                Ok(true)
            }
            Chunk::Stderr(bytes) => {
                self.stdout.flush()?;
                self.stderr.write_all(bytes)?;
                Ok(true)
            }
            Chunk::Eof { .. } => Ok(false),
        }
    }

    /// Writes out everything buffered.
    pub fn flush(&mut self) -> std::io::Result<()> {
        self.stdout.flush()?;
        self.stderr.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(headers: &[(&str, &str)], payload: &'static [u8]) -> async_nats::Message {
        let mut map = async_nats::HeaderMap::new();
        for (k, v) in headers {
            map.insert(*k, *v);
        }
        async_nats::Message {
            subject: "jobs.x.output".into(),
            reply: None,
            payload: bytes::Bytes::from_static(payload),
            headers: Some(map),
            status: None,
            description: None,
            length: payload.len(),
        }
    }

    #[test]
    fn output_messages_are_told_apart_by_their_headers() {
        let out = message(&[(output::STREAM, output::STDOUT)], b"hi\n");
        assert_eq!(classify(&out), Chunk::Stdout(b"hi\n"));
        let err = message(&[(output::STREAM, output::STDERR)], b"oops");
        assert_eq!(classify(&err), Chunk::Stderr(b"oops"));
        let unlabelled = message(&[], b"raw");
        assert_eq!(classify(&unlabelled), Chunk::Stdout(b"raw"));
        let eof = message(
            &[
                (output::STREAM, output::EOF),
                (output::ATTEMPT, "2"),
                (output::EXIT_CODE, "137"),
            ],
            b"",
        );
        assert_eq!(
            classify(&eof),
            Chunk::Eof {
                attempt: Some(2),
                rank: 0,
                exit_code: Some(137)
            }
        );
    }
}
