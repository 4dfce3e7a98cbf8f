//! The pure part of `mgpu top`: its state, what each input does to it, and how it is drawn.
//! No network and no terminal here: the command (`commands/top/mod.rs`) reads the cluster and
//! the keyboard, feeds what it reads to [`model::Model::update`], carries out the
//! [`model::Effect`]s that come back, and draws with [`view::render`].
//!
//! The library exports it as `mgpu_cli::top`, so that the benchmarks draw frames of a large
//! cluster with the code the command draws with, and without a cluster.
//!
//! - [`me`]: who is looking; [`data`]: the jobs, heartbeats, marks, policy and usage as last
//!   heard; [`filter`]: the `/` filter; [`keys`]: which key is which action; [`log`]: the
//!   output pane's lines; [`layout`]: where each part of the screen goes; [`format`]: bars,
//!   sizes and times; [`widgets`]: title bars, cells and bars as drawn.
//! - [`rows`]: the lines both panes list and the summary counts, worked out from the data;
//! - [`model`]: the state, the inputs and the effects; [`actions`]: what each key does;
//! - [`panes`]: the nodes and queue panes; [`overlay`]: a job's details and output;
//!   [`view`]: the whole screen (header, panes, overlays, status line);
//! - `test_data` (tests only): records and heartbeats; `frames` (tests only): whole frames
//!   read as text.
//!
//! Each module imports only those listed before it (the model asks [`layout`], not [`view`],
//! how many lines a page holds), so no file imports one that imports it back.

mod actions;
pub mod data;
pub mod filter;
mod format;
#[cfg(test)]
mod frames;
pub mod keys;
mod layout;
pub mod log;
mod me;
pub mod model;
mod overlay;
mod panes;
pub mod rows;
#[cfg(test)]
mod test_data;
pub mod view;
mod widgets;
