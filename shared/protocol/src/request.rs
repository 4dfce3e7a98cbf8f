//! Every request a person sends the scheduler, decoded once from its subject and payload:
//! `jobs.submit` ([`crate::submit`]), `jobs.<id>.cancel` ([`crate::cancel`]),
//! `jobs.<id>.hold` and `.release` ([`crate::hold`]), `admin.requests` ([`crate::node_admin`])
//! and `reservations.requests` ([`crate::reservation`]).
//! The scheduler checks the signature on the raw message, then acts on the [`Request`];
//! the audit trail names each by its [`Action`].

use crate::cancel::CancelRequest;
use crate::error::InvalidInput;
use crate::hold::HoldRequest;
use crate::ids::JobId;
use crate::node_admin::AdminRequest;
use crate::reservation::ReservationRequest;
use crate::subjects;
use crate::submit::{MAX_SUBMIT_BYTES, SubmitRequest};
use crate::wire::{self, MAX_REQUEST_BYTES};

/// What a request asks for, as the audit trail and refusals name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    Submit,
    Cancel,
    Hold,
    Release,
    Admin,
    /// A reservation booked or cancelled.
    Reserve,
    /// A node's report about a job's process (`jobs.<id>.events`): no request, but refused
    /// and audited like one when its signer is not the node it names.
    Report,
}

impl Action {
    /// The action a request on `subject` asks for; None for a subject that carries no request.
    pub fn of_subject(subject: &str) -> Option<Action> {
        if subject == subjects::SUBMIT {
            return Some(Action::Submit);
        }
        if subject == subjects::ADMIN_REQUESTS {
            return Some(Action::Admin);
        }
        if subject == subjects::RESERVATION_REQUESTS {
            return Some(Action::Reserve);
        }
        subjects::job_id_of(subject)?;
        match subject.rsplit('.').next() {
            Some("cancel") => Some(Action::Cancel),
            Some("hold") => Some(Action::Hold),
            Some("release") => Some(Action::Release),
            _ => None,
        }
    }

    /// Its name in audit records and their subjects (`audit.<action>`).
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Submit => "submit",
            Action::Cancel => "cancel",
            Action::Hold => "hold",
            Action::Release => "release",
            Action::Admin => "admin",
            Action::Reserve => "reserve",
            Action::Report => "report",
        }
    }
}

impl std::fmt::Display for Action {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A request, decoded and checked as far as its payload alone allows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    /// A new job. Its sender and spec are checked when it is recorded, where an invalid spec
    /// still makes a (failed) record its submitter can see. Boxed: a spec is far larger than
    /// the other requests.
    Submit(Box<SubmitRequest>),
    Cancel {
        job: JobId,
        request: CancelRequest,
    },
    Hold {
        job: JobId,
        request: HoldRequest,
    },
    Release {
        job: JobId,
        request: HoldRequest,
    },
    Admin(AdminRequest),
    Reserve(ReservationRequest),
}

impl Request {
    /// Decodes the request `payload` published on `subject`: size limit, strict JSON, the
    /// job id in the subject, and (but for a submission) the payload's own checks.
    /// The requests one message carries: several for a batch of submissions
    /// ([`crate::submit::SubmitBatch`]), one otherwise ([`Request::decode`]).
    pub fn decode_all(subject: &str, payload: &[u8]) -> Result<Vec<Request>, InvalidInput> {
        if Action::of_subject(subject) == Some(Action::Submit) {
            let tasks = crate::submit::submissions_in(payload)?;
            return Ok(tasks
                .into_iter()
                .map(|task| Request::Submit(Box::new(task)))
                .collect());
        }
        Request::decode(subject, payload).map(|one| vec![one])
    }

    pub fn decode(subject: &str, payload: &[u8]) -> Result<Request, InvalidInput> {
        let action = Action::of_subject(subject)
            .ok_or_else(|| InvalidInput::new(format!("`{subject}` carries no request")))?;
        let job = || -> Result<JobId, InvalidInput> {
            let id = subjects::job_id_of(subject).unwrap_or_default();
            id.parse::<JobId>()
                .map_err(|_| InvalidInput::new(format!("`{id}` is not a job id")))
        };
        Ok(match action {
            Action::Submit => Request::Submit(Box::new(wire::decode(
                "submission",
                payload,
                MAX_SUBMIT_BYTES,
            )?)),
            Action::Cancel => {
                let request: CancelRequest =
                    wire::decode("cancel request", payload, MAX_REQUEST_BYTES)?;
                request.validate()?;
                Request::Cancel {
                    job: job()?,
                    request,
                }
            }
            Action::Hold | Action::Release => {
                let request: HoldRequest =
                    wire::decode("hold request", payload, MAX_REQUEST_BYTES)?;
                request.validate()?;
                let job = job()?;
                if action == Action::Hold {
                    Request::Hold { job, request }
                } else {
                    Request::Release { job, request }
                }
            }
            Action::Admin => {
                let request: AdminRequest =
                    wire::decode("admin request", payload, MAX_REQUEST_BYTES)?;
                request.validate()?;
                Request::Admin(request)
            }
            Action::Reserve => {
                let request: ReservationRequest =
                    wire::decode("reservation request", payload, MAX_REQUEST_BYTES)?;
                request.validate()?;
                Request::Reserve(request)
            }
            Action::Report => {
                return Err(InvalidInput::new(format!(
                    "{subject} carries job events, not requests"
                )));
            }
        })
    }

    pub fn action(&self) -> Action {
        match self {
            Request::Submit(_) => Action::Submit,
            Request::Cancel { .. } => Action::Cancel,
            Request::Hold { .. } => Action::Hold,
            Request::Release { .. } => Action::Release,
            Request::Admin(_) => Action::Admin,
            Request::Reserve(_) => Action::Reserve,
        }
    }

    /// The job the request is about, where it names one.
    pub fn job(&self) -> Option<&JobId> {
        match self {
            Request::Submit(submit) => Some(&submit.id),
            Request::Cancel { job, .. }
            | Request::Hold { job, .. }
            | Request::Release { job, .. } => Some(job),
            Request::Admin(_) | Request::Reserve(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "0123456789abcdef0123456789abcdef";

    #[test]
    fn each_subject_names_its_action_and_others_none() {
        assert_eq!(Action::of_subject("jobs.submit"), Some(Action::Submit));
        assert_eq!(Action::of_subject("admin.requests"), Some(Action::Admin));
        assert_eq!(
            Action::of_subject("reservations.requests"),
            Some(Action::Reserve)
        );
        assert_eq!(
            Action::of_subject(&format!("jobs.{ID}.cancel")),
            Some(Action::Cancel)
        );
        assert_eq!(
            Action::of_subject(&format!("jobs.{ID}.hold")),
            Some(Action::Hold)
        );
        assert_eq!(
            Action::of_subject(&format!("jobs.{ID}.release")),
            Some(Action::Release)
        );
        assert_eq!(Action::of_subject(&format!("jobs.{ID}.output")), None);
        assert_eq!(Action::of_subject("jobs.cancel"), None);
    }

    #[test]
    fn a_cancel_is_decoded_with_its_job_and_checked() {
        let subject = format!("jobs.{ID}.cancel");
        let decoded = Request::decode(&subject, br#"{"user":"alice","reason":"oops"}"#);
        let Ok(Request::Cancel { job, request }) = decoded else {
            panic!("not a cancel: {decoded:?}");
        };
        assert_eq!(job.as_str(), ID);
        assert_eq!(request.reason.as_deref(), Some("oops"));
        assert!(
            Request::decode(&subject, b"{\"user\":\"alice\",\"reason\":\"a\\nb\"}").is_err(),
            "a reason that forges a second line is refused"
        );
        assert!(Request::decode(&subject, br#"{"user":"alice","x":1}"#).is_err());
        assert!(Request::decode("jobs.NOT-AN-ID.cancel", br#"{"user":"alice"}"#).is_err());
    }

    #[test]
    fn hold_and_release_differ_by_subject_only() {
        let hold = Request::decode(&format!("jobs.{ID}.hold"), br#"{"user":"bob"}"#);
        let release = Request::decode(&format!("jobs.{ID}.release"), br#"{"user":"bob"}"#);
        assert_eq!(hold.map(|r| r.action()), Ok(Action::Hold));
        assert_eq!(release.map(|r| r.action()), Ok(Action::Release));
    }

    #[test]
    fn an_oversized_submission_is_refused_before_parsing() {
        let payload = vec![b' '; MAX_SUBMIT_BYTES + 1];
        let refused = Request::decode("jobs.submit", &payload);
        assert!(refused.is_err_and(|e| e.to_string().contains("larger than")));
    }
}
