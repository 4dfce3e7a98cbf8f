//! `mgpu-metrics`: what the scheduler and the node agent need to be scraped by Prometheus,
//! shared so neither carries its own copy.
//!
//! # Layout
//! - [`exposition`]: the text exposition format (version 0.0.4): metric families, samples
//!   with escaped labels, and cumulative histograms. Pure: state in, text out.
//! - [`http`]: a tiny HTTP/1.1 endpoint on a tokio `TcpListener` answering `GET /metrics`
//!   with whatever the service renders at that moment (404 elsewhere). Its server underneath
//!   (bounded connections, one request each) is public: `mgpu web` serves the dashboard on it.
//!
//! Each service renders its own metrics from the state it already keeps (the scheduler's job
//! and node tables, the agent's latest GPU sample); nothing here knows what they mean.

pub mod exposition;
pub mod http;

pub use exposition::{Exposition, Histogram, Kind};
