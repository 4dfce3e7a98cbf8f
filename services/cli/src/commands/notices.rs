//! `mgpu notices`: the scheduler's notices to the signed-in user about their jobs (an idle
//! warning, the warning withdrawn, an idle job reclaimed), followed live on
//! `users.<their key>.notices` until Ctrl+C: one line each, or each as a JSON line.
//!
//! Notices are plain NATS messages, not stored: only those sent while the command runs are
//! seen (a job's current warning stays in its record, for `mgpu show`). The server lets each
//! user subscribe to their own subject only; admins may follow anyone's (`--user`), whose key
//! is read from the credentials directory's registry.

use std::io::IsTerminal as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Result, anyhow};
use clap::Args;
use futures::StreamExt as _;
use mgpu_protocol::Timestamp;
use mgpu_protocol::idle::{IdleAction, Notice, NoticeKind};
use mgpu_protocol::principals::{REGISTRY_FILE, Registry, Role};
use mgpu_protocol::subjects;

use crate::client::session::{ConnectionArgs, Session};
use crate::console;
use crate::errors::plain;
use crate::human;

#[derive(Debug, Args)]
#[command(after_long_help = "\
Each notice is one line: when the scheduler sent it, the job's id, and what it says:
  16:02 4f2a1b2c3d idle warning: idle since 14:02; requeue from 16:32 if another job waits
  16:20 4f2a1b2c3d idle cleared: its GPUs work again, the warning is withdrawn
  16:40 4f2a1b2c3d idle, requeued: job 9c1e2f3a4b waited for its GPUs

Only notices sent while the command runs are shown; none are kept for later. A running job's
current warning is also in `mgpu show ID` (the `idle:` line). A job submitted with
--idle-ok gets none, where its QoS class allows that.

Examples:
  mgpu notices                          # yours, until Ctrl+C
  mgpu notices --json | jq -r .message  # one JSON object per notice
  mgpu notices --user alice             # admins: alice's notices")]
pub struct NoticesArgs {
    /// Print each notice as one JSON object per line: `job`, `at`, `message` and `kind`
    /// (`idle_warning` with its `warning`, `idle_cleared`, or `idle_reclaimed` with `action`
    /// and `for_job`).
    #[arg(long)]
    pub json: bool,

    #[command(flatten)]
    pub other: OtherUser,
}

/// Another user's notices or destinations, which only admins may read (the server refuses
/// anyone else).
#[derive(Debug, Args)]
pub struct OtherUser {
    /// Another user's (admins only): their name in the credentials directory's
    /// principals.json (see --dir), or their public key.
    #[arg(long, value_name = "NAME|KEY")]
    pub user: Option<String>,

    /// Credentials directory whose principals.json gives --user's key.
    #[arg(
        long,
        env = "MGPU_AUTH_DIR",
        default_value = ".mgpu/auth",
        value_name = "DIR"
    )]
    pub dir: PathBuf,
}

impl OtherUser {
    /// The public key of the user named by --user, if one is; resolved before connecting, so
    /// a name the registry lacks needs no server to say so.
    pub fn key(&self) -> Result<Option<String>> {
        self.user
            .as_deref()
            .map(|user| resolve_user(user, &self.dir))
            .transpose()
    }
}

pub async fn run(connection: &ConnectionArgs, args: &NoticesArgs) -> Result<ExitCode> {
    let other = args.other.key()?;
    let session = Session::connect(connection).await?;
    let key = other.unwrap_or_else(|| session.key.public_key());
    let subject = subjects::notices(&key);
    let mut notices = session
        .client
        .subscribe(subject.clone())
        .await
        .map_err(plain)?;
    // Once the server has the subscription, what the scheduler sends from now on reaches us.
    session.client.flush().await.map_err(plain)?;
    if std::io::stderr().is_terminal() {
        let whose = args
            .other
            .user
            .as_deref()
            .map_or("your".to_owned(), |user| format!("{user}'s"));
        console::stderr_line(&format!("Following {whose} notices (Ctrl+C ends)."));
    }
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    let mut ctrl_c_armed = true;
    let refused = session.refused(&subject);
    tokio::pin!(refused);
    loop {
        tokio::select! {
            signal = &mut ctrl_c, if ctrl_c_armed => {
                if signal.is_err() {
                    // No handler: Ctrl+C then ends us the default way.
                    ctrl_c_armed = false;
                    continue;
                }
                return Ok(ExitCode::SUCCESS);
            }
            _ = &mut refused => return Err(refusal(args.other.user.as_deref(), &subject)),
            message = notices.next() => {
                let Some(message) = message else {
                    return Err(anyhow!("the connection to the server closed"));
                };
                match line_for(&message.payload, args.json, mgpu_protocol::now()) {
                    Ok(line) => console::println(&line)?,
                    Err(note) => console::stderr_line(&note),
                }
            }
        }
    }
}

/// The public key of `user`: a key as given, else the user (or admin) of that name in the
/// registry in `dir`.
pub(crate) fn resolve_user(user: &str, dir: &Path) -> Result<String> {
    if user.starts_with('U') && nkeys::KeyPair::from_public_key(user).is_ok() {
        return Ok(user.to_owned());
    }
    let registry = Registry::load(dir)
        .map_err(|err| anyhow!("cannot read the principals in {}: {err}", dir.display()))?;
    registry
        .find(Role::User, user)
        .or_else(|| registry.find(Role::Admin, user))
        .map(|principal| principal.public_key.clone())
        .ok_or_else(|| {
            anyhow!(
                "no user `{user}` in {}: give the credentials directory with --dir, or their \
                 public key",
                dir.join(REGISTRY_FILE).display()
            )
        })
}

/// Why the server refused the subscription, said for the one who asked.
fn refusal(other: Option<&str>, subject: &str) -> anyhow::Error {
    match other {
        Some(user) => anyhow!("only admins may follow another user's notices ({user}'s)"),
        None => anyhow!(
            "the server does not let you read your notices ({subject}): its permissions were \
             written by an older mgpu; ask an admin to write them again"
        ),
    }
}

/// What one message prints: the line for stdout, or a note for stderr when it is no notice.
/// A notice of a kind this mgpu does not know (from a newer scheduler) still prints, as JSON
/// as it came or with its `message` as the text.
fn line_for(payload: &[u8], json: bool, now: Timestamp) -> Result<String, String> {
    if let Ok(notice) = serde_json::from_slice::<Notice>(payload) {
        return if json {
            serde_json::to_string(&notice).map_err(|err| err.to_string())
        } else {
            Ok(notice_line(&notice, now))
        };
    }
    let unreadable = || {
        format!(
            "a notice mgpu cannot read was skipped: {}",
            one_line(&String::from_utf8_lossy(payload))
        )
    };
    let value: serde_json::Value = serde_json::from_slice(payload).map_err(|_| unreadable())?;
    if !value.is_object() {
        return Err(unreadable());
    }
    if json {
        return Ok(value.to_string());
    }
    other_line(&value, now).ok_or_else(unreadable)
}

/// `16:02 4f2a1b2c3d idle warning: …`: when it was sent, the job's short id, and what it says.
fn notice_line(notice: &Notice, now: Timestamp) -> String {
    format!(
        "{} {} {}",
        human::clock(notice.at, now),
        notice
            .job
            .as_ref()
            .map_or_else(|| notice.about(), |job| job.short().to_owned()),
        notice_text(notice, now)
    )
}

/// What a notice says, in mgpu's words for the kinds it knows.
fn notice_text(notice: &Notice, now: Timestamp) -> String {
    match &notice.kind {
        NoticeKind::IdleWarning { warning } => format!(
            "idle warning: idle since {}; {}",
            human::clock(warning.idle_since, now),
            human::idle_action(warning, now)
        ),
        NoticeKind::IdleCleared => {
            "idle cleared: its GPUs work again, the warning is withdrawn".to_owned()
        }
        NoticeKind::IdleReclaimed { action, for_job } => {
            let waiting = for_job.short();
            match action {
                IdleAction::Requeue => {
                    format!("idle, requeued: job {waiting} waited for its GPUs")
                }
                IdleAction::Cancel => {
                    format!("idle, cancelled: job {waiting} waited for its GPUs")
                }
                IdleAction::Warn => {
                    format!("idle while job {waiting} waits for its GPUs (warned only)")
                }
            }
        }
        // mgpu-notify's notices (`--notify`) say it in their message.
        _ => notice.message.clone(),
    }
}

/// A notice of a kind this mgpu does not know: its time, job and `message`, where it has them.
fn other_line(value: &serde_json::Value, now: Timestamp) -> Option<String> {
    let message = value.get("message")?.as_str()?;
    let at: Timestamp = serde_json::from_value(value.get("at")?.clone()).ok()?;
    let job: String = value
        .get("job")?
        .as_str()?
        .chars()
        .take(mgpu_protocol::ids::JobId::SHORT_LEN)
        .collect();
    Some(format!(
        "{} {} {}",
        human::clock(at, now),
        one_line(&job),
        one_line(message)
    ))
}

/// The scheduler's text stays on its line.
fn one_line(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone as _;
    use mgpu_protocol::idle::IdleWarning;
    use mgpu_protocol::ids::JobId;

    /// 16:02 local time on a November day, when DST changes nothing.
    fn at(hour: u32, minute: u32) -> Timestamp {
        chrono::Local
            .with_ymd_and_hms(2026, 11, 27, hour, minute, 0)
            .single()
            .map(|t| t.with_timezone(&chrono::Utc))
            .unwrap_or_else(mgpu_protocol::now)
    }

    fn notice(kind: NoticeKind) -> Notice {
        Notice {
            job: Some(JobId::random()),
            at: at(16, 2),
            message: "job idle".to_owned(),
            kind,
        }
    }

    fn warning(action: IdleAction) -> NoticeKind {
        NoticeKind::IdleWarning {
            warning: IdleWarning {
                idle_since: at(14, 2),
                warned_at: at(16, 2),
                action,
                action_from: at(16, 32),
            },
        }
    }

    fn printed(notice: &Notice, json: bool) -> Result<String, String> {
        let payload = serde_json::to_vec(notice).unwrap_or_default();
        line_for(&payload, json, at(16, 5))
    }

    #[test]
    fn a_warning_reads_as_a_line_with_its_time_job_and_what_comes_next() {
        let warned = notice(warning(IdleAction::Requeue));
        let id = warned
            .job
            .as_ref()
            .map(|j| j.short().to_owned())
            .unwrap_or_default();
        assert_eq!(
            printed(&warned, false),
            Ok(format!(
                "16:02 {id} idle warning: idle since 14:02; requeue from 16:32 if another job \
                 waits"
            ))
        );
        let only = notice(warning(IdleAction::Warn));
        let text = printed(&only, false).unwrap_or_default();
        assert!(text.ends_with("idle since 14:02; warned only"), "{text}");
    }

    #[test]
    fn cleared_and_reclaimed_notices_say_what_happened() {
        let cleared = printed(&notice(NoticeKind::IdleCleared), false).unwrap_or_default();
        assert!(cleared.ends_with(" idle cleared: its GPUs work again, the warning is withdrawn"));
        let waiting = JobId::random();
        let reclaimed = notice(NoticeKind::IdleReclaimed {
            action: IdleAction::Cancel,
            for_job: waiting.clone(),
        });
        let text = printed(&reclaimed, false).unwrap_or_default();
        assert!(
            text.ends_with(&format!(
                "idle, cancelled: job {} waited for its GPUs",
                waiting.short()
            )),
            "{text}"
        );
    }

    #[test]
    fn json_prints_each_notice_on_one_line_that_reads_back() {
        let warned = notice(warning(IdleAction::Cancel));
        let line = printed(&warned, true).unwrap_or_default();
        assert!(!line.contains('\n'), "{line}");
        let back: Option<Notice> = serde_json::from_str(&line).ok();
        assert_eq!(back, Some(warned));
    }

    #[test]
    fn an_unknown_kind_prints_its_message_and_garbage_is_a_note() {
        let payload = serde_json::json!({
            "job": "4f2a1b2c3d5e6f708192a3b4c5d6e7f8",
            "at": at(16, 2),
            "message": "idle for 3h:\nplease look",
            "kind": "idle_summary",
        })
        .to_string();
        let now = at(16, 5);
        assert_eq!(
            line_for(payload.as_bytes(), false, now),
            Ok("16:02 4f2a1b2c3d idle for 3h: please look".to_owned())
        );
        let json = line_for(payload.as_bytes(), true, now).unwrap_or_default();
        assert!(json.contains("\"kind\":\"idle_summary\""), "{json}");
        let note = line_for(b"not json", false, now).err().unwrap_or_default();
        assert!(note.starts_with("a notice mgpu cannot read"), "{note}");
        assert!(line_for(b"[1]", true, now).is_err());
    }

    #[test]
    fn a_user_is_a_key_or_a_name_in_the_registry() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let mut registry = Registry::default();
        let added =
            crate::setup::auth::RegistryFiles::add(&mut registry, dir.path(), Role::User, "alice");
        assert!(added.is_ok(), "{added:?}");
        let saved = crate::setup::auth::RegistryFiles::save(&registry, dir.path());
        assert!(saved.is_ok(), "{saved:?}");
        let key = registry
            .find(Role::User, "alice")
            .map(|p| p.public_key.clone())
            .unwrap_or_default();
        assert_eq!(resolve_user("alice", dir.path()).ok(), Some(key.clone()));
        assert_eq!(resolve_user(&key, Path::new("/nowhere")).ok(), Some(key));
        let err = resolve_user("carol", dir.path())
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("no user `carol`"), "{err}");
    }
}
