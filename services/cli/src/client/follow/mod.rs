//! Following a job from JetStream: its output (stream `MGPU_OUTPUT`), its record (bucket
//! `mgpu-jobs`) and, followed from a terminal, this terminal's keys and size. Everything that
//! follows a job goes through here: `mgpu logs` ([`tail`]), `mgpu submit -i` and `mgpu attach`
//! ([`follower`]), `mgpu wait`, `mgpu cancel` and `mgpu hold`, which watch records
//! ([`record`]), and `mgpu top`'s log pane ([`output`]).
//!
//! - [`output`]: where a job's output is, reading it, what each message is, writing it out;
//!   `ordered`: its messages put back in the order each process wrote them (a chunk the agent
//!   had to offer twice may be stored late, or twice);
//! - [`record`]: watching one record or many; the exit status a finished record gives;
//! - `feed`: a job's output and record read together, and the grace given late output: the
//!   one loop both [`tail`] and [`follower`] follow a job with;
//! - [`tail`]: the output printed as stored, or until the job ended (`logs -f`);
//! - [`follower`]: a job followed until it ends, with its status and our input; `watcher`:
//!   what each version of its record means to the follower; `status`: the follower's lines;
//! - [`input`]: what is sent to the job; [`raw_terminal`]: this terminal, raw, and its size.

mod feed;
pub mod follower;
pub mod input;
mod ordered;
pub mod output;
pub mod raw_terminal;
pub mod record;
mod status;
pub mod tail;
mod watcher;
