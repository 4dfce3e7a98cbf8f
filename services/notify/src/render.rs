//! What one delivery says, shaped for its destination: Slack and Mattermost take `{"text"}`,
//! Discord `{"content"}`, a generic webhook the whole notice as JSON, and a mail a subject and
//! a plain-text body. Pure: the senders (`http.rs`, `smtp.rs`) only move these bytes.

use serde::Serialize;

use mgpu_protocol::idle::Notice;
use mgpu_protocol::notify::destination::Destination;

/// One delivery: a notice, or a summary of the notices a throttled destination missed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Outgoing {
    /// The notice's id, or `summary-…` for a summary: what receivers deduplicate by.
    pub id: String,
    /// The owner's public key.
    pub user: String,
    /// One line (or, for a summary, a few) a person reads.
    pub text: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub notice: Option<Notice>,
    /// The notices a summary stands for.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub summarised: Vec<Notice>,
}

/// Lines of a summary before the rest are only counted.
const SUMMARY_LINES: usize = 20;
/// Discord refuses a message longer than this.
const DISCORD_MAX_CHARS: usize = 2000;

impl Outgoing {
    pub fn single(id: String, user: String, notice: Notice) -> Outgoing {
        Outgoing {
            text: line(&notice),
            id,
            user,
            notice: Some(notice),
            summarised: Vec::new(),
        }
    }

    /// A summary of `notices` (those a throttled destination did not get one by one).
    pub fn summary(id: String, user: String, notices: Vec<Notice>) -> Outgoing {
        let mut text = format!(
            "mgpu: {} more notice(s) while notices to here were throttled:",
            notices.len()
        );
        for notice in notices.iter().take(SUMMARY_LINES) {
            text.push_str("\n- ");
            text.push_str(&line(notice));
        }
        if notices.len() > SUMMARY_LINES {
            text.push_str(&format!("\n- … and {} more", notices.len() - SUMMARY_LINES));
        }
        Outgoing {
            id,
            user,
            text,
            notice: None,
            summarised: notices,
        }
    }
}

/// A notice in one line: its job and what it says.
fn line(notice: &Notice) -> String {
    format!("mgpu {}: {}", notice.about(), notice.message)
}

/// The HTTP body for a webhook destination (JSON), or None for e-mail.
pub fn http_body(destination: &Destination, outgoing: &Outgoing) -> Option<Vec<u8>> {
    let value = match destination {
        Destination::Slack { .. } | Destination::Mattermost { .. } => {
            serde_json::json!({ "text": outgoing.text })
        }
        Destination::Discord { .. } => {
            let content: String = outgoing.text.chars().take(DISCORD_MAX_CHARS).collect();
            serde_json::json!({ "content": content })
        }
        Destination::Webhook { .. } => serde_json::to_value(outgoing).ok()?,
        Destination::Email { .. } => return None,
    };
    serde_json::to_vec(&value).ok()
}

/// A mail's subject and body.
pub fn mail(outgoing: &Outgoing) -> (String, String) {
    let first = outgoing.text.lines().next().unwrap_or("mgpu notice");
    let subject: String = first.chars().take(150).collect();
    let body = format!(
        "{}\n\n-- \nmgpu notice {} (mgpu submit --notify; mgpu notify list)\n",
        outgoing.text, outgoing.id
    );
    (format!("[mgpu] {subject}"), body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use mgpu_protocol::idle::NoticeKind;
    use mgpu_protocol::ids::JobId;

    fn notice(message: &str) -> Notice {
        Notice {
            job: Some(JobId::random()),
            at: mgpu_protocol::now(),
            message: message.to_owned(),
            kind: NoticeKind::Test,
        }
    }

    #[test]
    fn each_kind_gets_its_shape() {
        let out = Outgoing::single("n1".into(), "UKEY".into(), notice("ended: succeeded"));
        let url = "https://x".to_owned();
        let slack = http_body(&Destination::Slack { url: url.clone() }, &out);
        let slack: serde_json::Value =
            serde_json::from_slice(&slack.unwrap_or_default()).unwrap_or_default();
        assert!(
            slack["text"]
                .as_str()
                .unwrap_or("")
                .ends_with("ended: succeeded")
        );
        let discord = http_body(&Destination::Discord { url: url.clone() }, &out);
        let discord: serde_json::Value =
            serde_json::from_slice(&discord.unwrap_or_default()).unwrap_or_default();
        assert!(discord["content"].is_string());
        let hook = http_body(&Destination::Webhook { url }, &out);
        let hook: serde_json::Value =
            serde_json::from_slice(&hook.unwrap_or_default()).unwrap_or_default();
        assert_eq!(hook["id"], "n1");
        assert_eq!(hook["notice"]["kind"], "test");
        let email = Destination::Email {
            address: "a@b.c".into(),
        };
        assert!(http_body(&email, &out).is_none());
        let (subject, body) = mail(&out);
        assert!(subject.starts_with("[mgpu] mgpu job"), "{subject}");
        assert!(body.contains("n1"));
    }

    #[test]
    fn a_summary_lists_some_and_counts_the_rest() {
        let notices: Vec<Notice> = (0..25).map(|i| notice(&format!("n{i}"))).collect();
        let out = Outgoing::summary("summary-1".into(), "U".into(), notices);
        assert!(out.text.starts_with("mgpu: 25 more notice(s)"));
        assert!(out.text.contains("… and 5 more"));
        assert_eq!(out.summarised.len(), 25);
    }
}
