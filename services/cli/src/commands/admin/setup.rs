//! `mgpu admin setup [--replicas N]`: create (or update) mgpu's JetStream streams and
//! buckets, with admin credentials. Streams that exist keep their sizes and ages (the
//! scheduler's `output_max_mib` and `history_max_gib`); new ones get the defaults.

use anyhow::{Result, anyhow};
use clap::Args;
use mgpu_nats::streams::{self, Replicas, StreamSettings};

use crate::client::session::{ConnectionArgs, Session};
use crate::console::println;
use crate::errors::plain;

#[derive(Debug, Args)]
pub struct SetupArgs {
    /// Copies of each stream and bucket: `auto` = min(3, distinct servers in --server), as
    /// the scheduler does, or 1 to 5. Existing streams are updated to this count.
    #[arg(long, default_value = "auto")]
    pub replicas: Replicas,
}

pub async fn run(connection: &ConnectionArgs, args: &SetupArgs) -> Result<()> {
    let session = Session::connect(connection).await?;
    let settings = StreamSettings {
        replicas: args.replicas.resolve(&connection.server),
        // The sizes are the scheduler's settings: streams it made keep them.
        keep_existing_sizes: true,
        ..StreamSettings::default()
    };
    streams::ensure(&session.js, &settings)
        .await
        .map_err(plain)
        .map_err(|err| anyhow!("{err:#} (are these admin credentials?)"))?;
    println(&format!(
        "mgpu streams ready ({} replica(s) each)",
        settings.replicas
    ))?;
    Ok(())
}
