//! `mgpu-notify`: tells job owners what they asked to hear (`mgpu submit --notify
//! end,fail,start,preempt,time80,idle`) through the destinations they set (`mgpu notify add`).
//!
//! It reads two durable consumers and keeps no state of its own beyond JetStream, so it loses
//! nothing across restarts: job events become notices on `users.<key>.notices` (kept by the
//! stream `MGPU_NOTICES`, with the scheduler's idle notices), and notices go to destinations,
//! each at most once (marks in the bucket `mgpu-notify-sent`), throttled per destination.
//!
//! # Layout
//! - [`config`]: flags, the config file and its `[notify]` section.
//! - [`derive`]: what an event or the clock tells an owner (pure), with its tests beside it.
//! - [`events`]: the events consumer and the time-limit sweep, publishing notices.
//! - [`deliver`]: the notices consumer: marks, throttle, summaries, retries.
//! - [`destinations`]: users' destinations and secrets, followed from their bucket.
//! - [`render`]: each destination's payload (pure); [`sign`]: the webhook signature.
//! - [`http`], [`smtp`]: the two ways out; [`deliver_error`]: what a failure means.
//! - [`throttle`]: deliveries per destination per window (pure).

pub mod config;
pub mod deliver;
pub mod deliver_error;
pub mod derive;
pub mod destinations;
pub mod events;
pub mod http;
pub mod render;
pub mod sign;
pub mod smtp;
pub mod throttle;
