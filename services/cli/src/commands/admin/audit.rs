//! `mgpu admin audit [--since DUR] [--user U] [--json]`: the audit trail, read from its stream: every
//! request the scheduler handled, who signed it, and whether it was carried out.

use std::time::Duration;

use anyhow::Result;
use async_nats::jetstream::consumer;
use clap::Args;
use futures::StreamExt;
use mgpu_nats::records;
use mgpu_protocol::audit::AuditRecord;

use crate::client::session::{ConnectionArgs, Session};
use crate::console::{print, println};
use crate::errors::{lookup, plain};
use crate::tables::Table;

#[derive(Debug, Args)]
pub struct AuditArgs {
    /// Only records from this long ago on: `1h`, `2d`, `90` (seconds). Default: a day.
    #[arg(long, value_name = "DUR", default_value = "1d")]
    pub since: String,

    /// Only what this user (or node) asked for, by name.
    #[arg(long, value_name = "U")]
    pub user: Option<String>,

    /// Print one JSON object per line.
    #[arg(long)]
    pub json: bool,
}

/// Whether `--user` keeps the record: every record without it.
fn wanted(record: &AuditRecord, user: Option<&str>) -> bool {
    user.is_none_or(|user| record.by.as_deref() == Some(user))
}

/// Prints the audit records of the last `--since`.
pub async fn run(connection: &ConnectionArgs, args: &AuditArgs) -> Result<()> {
    let since = mgpu_protocol::duration::parse_duration(&args.since).map_err(plain)?;
    let session = Session::connect(connection).await?;
    let consumer = open_trail(&session, since).await?;
    let pending = consumer.cached_info().num_pending;
    let mut table = Table::new(["TIME", "ACTION", "BY", "TARGET", "OUTCOME", "DETAIL"]);
    let mut shown = 0usize;
    if pending > 0 {
        let mut messages = consumer.messages().await.map_err(plain)?;
        while let Some(message) = messages.next().await {
            let message = message.map_err(plain)?;
            let left = message.info().map_err(plain)?.pending;
            // A record this version cannot read is left out rather than ending the listing.
            let record = serde_json::from_slice::<AuditRecord>(&message.payload).ok();
            if let Some(record) = record.filter(|r| wanted(r, args.user.as_deref())) {
                shown += 1;
                if args.json {
                    println(&serde_json::to_string(&record)?)?;
                } else {
                    table.row(cells(&record));
                }
            }
            if left == 0 {
                break;
            }
        }
    }
    if !args.json {
        if shown == 0 {
            let whose = args
                .user
                .as_ref()
                .map(|user| format!(" of {user}"))
                .unwrap_or_default();
            println(&format!(
                "No audit records{whose} in the last {}.",
                args.since
            ))?;
        } else {
            print(&table.render())?;
        }
    }
    Ok(())
}

/// An ordered reader of the audit stream from `since` ago on.
async fn open_trail(
    session: &Session,
    since: Duration,
) -> Result<consumer::Consumer<consumer::pull::OrderedConfig>> {
    let start = mgpu_protocol::now()
        - chrono::Duration::from_std(since).unwrap_or_else(|_| chrono::Duration::days(1));
    let start_time = time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(
        start.timestamp_nanos_opt().unwrap_or(0),
    ))
    .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    let stream = session
        .js
        .get_stream(mgpu_protocol::subjects::AUDIT_STREAM)
        .await
        .map_err(lookup)?;
    records::create_reader("reading the audit trail", || {
        stream.create_consumer(consumer::pull::OrderedConfig {
            deliver_policy: consumer::DeliverPolicy::ByStartTime { start_time },
            ..Default::default()
        })
    })
    .await
    .map_err(plain)
}

/// One record as a table row; the signer by name, else by the start of its key.
fn cells(record: &AuditRecord) -> Vec<String> {
    let by = record
        .by
        .clone()
        .or_else(|| {
            record
                .key
                .as_ref()
                .map(|k| format!("key {}…", k.chars().take(12).collect::<String>()))
        })
        .unwrap_or_else(|| "unsigned".into());
    vec![
        record.at.format("%Y-%m-%d %H:%M:%S").to_string(),
        record.action.clone(),
        by,
        record.target.clone().unwrap_or_default(),
        if record.accepted { "done" } else { "refused" }.to_owned(),
        record.detail.clone(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(by: Option<&str>, key: Option<&str>) -> AuditRecord {
        AuditRecord {
            at: mgpu_protocol::now(),
            action: "cancel".into(),
            by: by.map(str::to_owned),
            key: key.map(str::to_owned),
            target: Some("3f9a".into()),
            accepted: false,
            detail: "not the owner".into(),
        }
    }

    #[test]
    fn rows_name_the_signer_else_the_start_of_its_key() {
        let named = cells(&record(Some("alice"), Some("UALICEKEY")));
        assert_eq!(
            named[1..],
            ["cancel", "alice", "3f9a", "refused", "not the owner"]
        );
        let keyed = cells(&record(None, Some("UABCDEFGHIJKLMNOP")));
        assert_eq!(keyed[2], "key UABCDEFGHIJK…");
        let short = cells(&record(None, Some("UAB")));
        assert_eq!(short[2], "key UAB…");
        assert_eq!(cells(&record(None, None))[2], "unsigned");
    }
}
