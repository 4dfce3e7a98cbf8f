//! The pure part of `mgpu top`: its state, what each input does to it, and how it is drawn.
//! No network and no terminal here: the command (`commands/top/` in the binary) reads the
//! cluster and the keyboard, feeds what it reads to [`model::Model::update`], carries out the
//! [`model::Effect`]s that come back, and draws with [`view::render`].
//!
//! It is compiled into the library (`mgpu_cli::top`) rather than the binary so that the
//! benchmarks can draw frames of a large cluster without one.
//!
//! - [`model`]: the state, the inputs and the effects; [`actions`]: what each key does;
//! - [`data`]: the jobs, heartbeats, marks, policy and usage as last heard;
//! - [`rows`]: the lines both panes list and the summary counts, worked out from the data;
//! - [`filter`]: the `/` filter; [`keys`]: which key is which action; [`log`]: the output pane;
//! - [`view`]: the layout, header and status line; [`panes`]: the nodes and queue panes;
//!   [`overlay`]: a job's details and output; [`format`]: bars, sizes and times.

mod actions;
pub mod data;
pub mod filter;
mod format;
pub mod keys;
pub mod log;
pub mod model;
mod overlay;
mod panes;
pub mod rows;
#[cfg(test)]
mod test_data;
pub mod view;
