//! `mgpu why ID`: asks the active scheduler why a job waits (a signed request on
//! `mgpu.scheduler.why`: owners ask about their own jobs, admins about any) and prints its
//! answer, one cause per line with the numbers behind it, or `--json` for scripts.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Result, anyhow, bail};
use async_nats::HeaderMap;
use clap::Args;
use mgpu_protocol::subjects;
use mgpu_protocol::why::{WhyAnswer, WhyRequest};

use crate::client::session::{ConnectionArgs, Session};
use crate::console::{print, print_json};
use crate::model::jobs;

#[derive(Debug, Args)]
pub struct WhyArgs {
    /// Job id, or a unique prefix of it.
    #[arg(value_name = "ID")]
    pub id: String,

    /// Print the scheduler's answer as JSON: position, expected start and causes.
    #[arg(long)]
    pub json: bool,
}

/// How long the scheduler is given to answer (a pass over a huge queue may be under way).
const ANSWER_WITHIN: Duration = Duration::from_secs(15);

pub async fn run(connection: &ConnectionArgs, args: &WhyArgs) -> Result<ExitCode> {
    let session = Session::connect(connection).await?;
    let job = jobs::resolve(&session.js, &args.id).await?;
    let body = serde_json::to_vec(&WhyRequest { job })?;
    let mut headers = HeaderMap::new();
    mgpu_nats::signing::sign(
        &session.key,
        subjects::SCHEDULER_WHY,
        &body,
        mgpu_protocol::now(),
        &mut headers,
    )
    .map_err(|e| anyhow!(e))?;
    let asked = session
        .client
        .request_with_headers(subjects::SCHEDULER_WHY, headers, body.into());
    let message = match tokio::time::timeout(ANSWER_WITHIN, asked).await {
        Ok(Ok(message)) => message,
        Ok(Err(err)) => bail!(
            "no scheduler answered ({err}): is one running? `mgpu queue` still lists the job and its reason"
        ),
        Err(_) => bail!(
            "the scheduler did not answer within {}s; try again",
            ANSWER_WITHIN.as_secs()
        ),
    };
    if let Some(refusal) = message
        .headers
        .as_ref()
        .and_then(|h| h.get("Nats-Service-Error"))
    {
        bail!("{}", refusal.as_str());
    }
    let answer: WhyAnswer = serde_json::from_slice(&message.payload)
        .map_err(|e| anyhow!("the scheduler's answer could not be read: {e}"))?;
    if args.json {
        print_json(&answer)?;
    } else {
        print(&render(&answer))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// The answer in words: a headline, then one cause per line.
fn render(answer: &WhyAnswer) -> String {
    let mut text = match answer.position {
        Some(position) => format!(
            "job {} is {}, {position} of {} in line\n",
            answer.job.short(),
            answer.state,
            answer.queued
        ),
        None => format!("job {} is {}\n", answer.job.short(), answer.state),
    };
    for cause in &answer.causes {
        text.push_str("  - ");
        text.push_str(&cause.text);
        text.push('\n');
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use mgpu_protocol::ids::JobId;
    use mgpu_protocol::why::{Cause, CauseKind};

    #[test]
    fn an_answer_reads_as_a_headline_and_one_line_per_cause() {
        let answer = WhyAnswer {
            job: JobId::random(),
            state: "queued".into(),
            position: Some(2),
            queued: 5,
            effective_priority: Some(12),
            expected_start: None,
            causes: vec![
                Cause {
                    kind: CauseKind::Held,
                    text: "held by alice".into(),
                    jobs: vec![],
                },
                Cause {
                    kind: CauseKind::FairShare,
                    text: "position 2 of 5".into(),
                    jobs: vec![],
                },
            ],
        };
        let text = render(&answer);
        assert!(
            text.ends_with("2 of 5 in line\n  - held by alice\n  - position 2 of 5\n"),
            "{text}"
        );
    }
}
