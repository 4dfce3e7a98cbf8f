//! Job output on `jobs.<id>.output`: the payload is the raw bytes the job wrote, so any NATS
//! client shows readable text; headers say which stream and rank they came from. The last
//! message of an attempt has [`STREAM`] = [`EOF`], an empty payload and the exit status.

/// `stdout`, `stderr` or `eof`.
pub const STREAM: &str = "Mgpu-Stream";
/// Sequence number of the chunk within its attempt and rank, starting at 1, across stdout and
/// stderr.
pub const SEQ: &str = "Mgpu-Seq";
/// Rank of the process that wrote it (0 for single-node jobs).
pub const RANK: &str = "Mgpu-Rank";
/// Attempt number of the job run that wrote it.
pub const ATTEMPT: &str = "Mgpu-Attempt";
/// On the EOF message: the exit status (128 + N after signal N).
pub const EXIT_CODE: &str = "Mgpu-Exit-Code";

pub const STDOUT: &str = "stdout";
pub const STDERR: &str = "stderr";
pub const EOF: &str = "eof";

/// Largest chunk an agent puts in one message (well under the server's 1 MiB default limit).
pub const MAX_CHUNK: usize = 64 * 1024;
