//! One module per subcommand (`cli.rs` maps the parsed command line to them). Each takes its
//! parsed arguments whole, with the connection options, and returns the exit status; failures
//! come back as errors for `main` to print.

pub mod admin;
pub mod attach;
pub mod cancel;
pub mod completions;
pub mod history;
pub mod hold;
pub mod logs;
pub mod node_admin;
pub mod nodes;
pub mod notices;
pub mod notify;
pub mod queue;
pub mod report;
pub mod reservations;
pub mod reserve;
pub mod show;
pub mod submit;
pub mod top;
pub mod wait;
pub mod web;
pub mod why;
