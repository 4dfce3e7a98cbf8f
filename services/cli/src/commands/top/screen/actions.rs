//! What each key's [`Action`] does to the model, mode by mode: moving, filtering, opening a
//! job's details or output, and the requests (cancel after a confirmation, hold, release),
//! which leave as [`Effect`]s once the model agrees they make sense.

use mgpu_protocol::job::{JobRecord, JobState};

use super::filter::Filter;
use super::keys::{Action, KeyMode};
use super::log::LogPane;
use super::model::{Effect, Mode, Model, Pane};
use super::rows::is_mine;

impl Model {
    pub(super) fn act(&mut self, action: Action) -> Vec<Effect> {
        if action == Action::Quit {
            return vec![Effect::Quit];
        }
        match self.key_mode() {
            KeyMode::Normal => self.browse(action),
            KeyMode::Typing => {
                self.type_filter(action);
                Vec::new()
            }
            KeyMode::Confirm => self.confirm(action),
            KeyMode::Overlay => self.overlay(action),
        }
    }

    fn browse(&mut self, action: Action) -> Vec<Effect> {
        match action {
            Action::SwitchPane => {
                self.focus = match self.focus {
                    Pane::Nodes => Pane::Jobs,
                    Pane::Jobs => Pane::Nodes,
                };
            }
            Action::Show => match self.selected_job() {
                Some(job) => self.mode = Mode::Detail(Box::new(job.clone())),
                None => self.say("No job on this line."),
            },
            Action::Log => return self.open_log(),
            Action::Cancel => self.ask_to_cancel(),
            Action::Hold | Action::Release => return self.hold(action == Action::Hold),
            Action::Filter => {
                self.mode = Mode::Typing {
                    before: self.filter.clone(),
                };
            }
            Action::Dismiss if !self.filter.is_empty() => self.set_filter(Filter::default()),
            Action::Dismiss => self.status = None,
            movement => self.move_selection(movement),
        }
        Vec::new()
    }

    fn move_selection(&mut self, movement: Action) {
        let (nodes_page, jobs_page) = self.page_heights();
        let (len, page) = match self.focus {
            Pane::Nodes => (self.rows.gpus.len(), nodes_page),
            Pane::Jobs => (self.rows.jobs.len(), jobs_page),
        };
        let cursor = match self.focus {
            Pane::Nodes => &mut self.nodes_cursor,
            Pane::Jobs => &mut self.jobs_cursor,
        };
        let last = len.saturating_sub(1);
        cursor.index = match movement {
            Action::Up => cursor.index.saturating_sub(1),
            Action::Down => (cursor.index + 1).min(last),
            Action::PageUp => cursor.index.saturating_sub(page.max(1)),
            Action::PageDown => (cursor.index + page.max(1)).min(last),
            Action::Top => 0,
            Action::Bottom => last,
            _ => return,
        };
        let index = cursor.index;
        let key = match self.focus {
            Pane::Jobs => self.job_key(index),
            Pane::Nodes => self
                .rows
                .gpus
                .get(index)
                .and_then(|line| self.gpu_key(line)),
        };
        match self.focus {
            Pane::Jobs => self.jobs_cursor.key = key,
            Pane::Nodes => self.nodes_cursor.key = key,
        }
        self.scroll_into_view();
    }

    fn open_log(&mut self) -> Vec<Effect> {
        let Some(job) = self.selected_job() else {
            self.say("No job on this line.");
            return Vec::new();
        };
        if job.spec.private_output && self.admin == Some(false) && !is_mine(&self.me, job) {
            let said = format!(
                "Job {}'s output is private: only {} and admins may read it.",
                job.id.short(),
                job.user
            );
            self.say(&said);
            return Vec::new();
        }
        let id = job.id.clone();
        let subject = mgpu_protocol::subjects::output_of(job);
        let title = format!("{} {} ({})", id.short(), job.spec.display_name(), job.user);
        self.mode = Mode::Log(LogPane::new(id.clone(), title));
        vec![Effect::FollowLog(id, subject)]
    }

    /// Why the user may not change `job`, if we know they may not: the scheduler refuses
    /// requests about others' jobs from anyone but an admin.
    fn refusal(&self, job: &JobRecord, verb: &str) -> Option<String> {
        (self.admin == Some(false) && !is_mine(&self.me, job)).then(|| {
            format!(
                "Job {} is {}'s: only its owner or an admin may {verb} it.",
                job.id.short(),
                job.user
            )
        })
    }

    fn ask_to_cancel(&mut self) {
        let Some(job) = self.selected_job() else {
            return self.say("No job on this line.");
        };
        if let Some(refusal) = self.refusal(job, "cancel") {
            return self.say(&refusal);
        }
        let question = format!(
            "Cancel job {} ({}, {}, {})? y/n",
            job.id.short(),
            job.spec.display_name(),
            job.user,
            job.state.name()
        );
        self.mode = Mode::Confirm {
            job: job.id.clone(),
            question,
        };
    }

    fn hold(&mut self, hold: bool) -> Vec<Effect> {
        let Some(job) = self.selected_job() else {
            self.say("No job on this line.");
            return Vec::new();
        };
        let verb = if hold { "hold" } else { "release" };
        let short = job.id.short().to_owned();
        let problem = match (&job.state, hold) {
            (JobState::Queued(waiting), true) => waiting
                .held_by
                .as_ref()
                .map(|by| format!("Job {short} is already held by {by}.")),
            (JobState::Queued(waiting), false) => waiting
                .held_by
                .is_none()
                .then(|| format!("Job {short} is not held.")),
            _ => Some(format!(
                "Job {short} is {}: only queued jobs can be {}.",
                job.state.name(),
                if hold { "held" } else { "released" }
            )),
        };
        if let Some(problem) = problem.or_else(|| self.refusal(job, verb)) {
            self.say(&problem);
            return Vec::new();
        }
        let id = job.id.clone();
        self.say(&format!(
            "{} job {short}…",
            if hold { "Holding" } else { "Releasing" }
        ));
        vec![if hold {
            Effect::Hold(id)
        } else {
            Effect::Release(id)
        }]
    }

    fn confirm(&mut self, action: Action) -> Vec<Effect> {
        let Mode::Confirm { job, .. } = &self.mode else {
            return Vec::new();
        };
        let job = job.clone();
        match action {
            Action::Yes => {
                self.mode = Mode::Normal;
                self.say(&format!("Cancelling job {}…", job.short()));
                vec![Effect::Cancel(job)]
            }
            Action::No => {
                self.mode = Mode::Normal;
                self.say(&format!("Job {} not cancelled.", job.short()));
                Vec::new()
            }
            // Nothing else answers the question: it stays open.
            _ => Vec::new(),
        }
    }

    fn overlay(&mut self, action: Action) -> Vec<Effect> {
        if action == Action::Dismiss {
            let was_log = matches!(self.mode, Mode::Log(_));
            self.mode = Mode::Normal;
            return if was_log {
                vec![Effect::StopLog]
            } else {
                Vec::new()
            };
        }
        let (_, page) = self.page_heights();
        let page = isize::try_from(page.max(1)).unwrap_or(1);
        if let Mode::Log(pane) = &mut self.mode {
            match action {
                Action::Up => pane.scroll_by(1),
                Action::Down => pane.scroll_by(-1),
                Action::PageUp => pane.scroll_by(page),
                Action::PageDown => pane.scroll_by(-page),
                Action::Top => pane.scroll_by(isize::MAX),
                Action::Bottom => pane.scroll = 0,
                _ => {}
            }
        }
        Vec::new()
    }

    fn type_filter(&mut self, action: Action) {
        let mut text = self.filter.text().to_owned();
        match action {
            Action::Type(c) => text.push(c),
            Action::Erase => {
                text.pop();
            }
            Action::Accept => {
                self.mode = Mode::Normal;
                return;
            }
            Action::Dismiss => {
                if let Mode::Typing { before } = std::mem::replace(&mut self.mode, Mode::Normal) {
                    self.set_filter(before);
                }
                return;
            }
            _ => return,
        }
        // The panes narrow as the user types.
        self.set_filter(Filter::parse(&text));
    }

    fn set_filter(&mut self, filter: Filter) {
        self.filter = filter;
        self.mark_stale();
        self.settle();
    }

    fn say(&mut self, text: &str) {
        self.status = Some(text.to_owned());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::top::screen::model::{Input, LineKey};
    use crate::commands::top::screen::test_data::{alice, heartbeat, held, job, queued, running};
    use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

    fn press(model: &mut Model, code: KeyCode) -> Vec<Effect> {
        model.update(Input::Key(KeyEvent::new(code, KeyModifiers::NONE)))
    }

    fn typed(model: &mut Model, text: &str) {
        for c in text.chars() {
            press(model, KeyCode::Char(c));
        }
    }

    /// Alice's running job, bob's queued one, alice's queued one, in that order on screen.
    fn cluster() -> (Model, Vec<JobRecord>) {
        let mut model = Model::new(alice(), mgpu_protocol::now(), (120, 40));
        model.update(Input::heartbeat(heartbeat("node001", 2)));
        let mut jobs = vec![
            job("alice", "train", running("node001", &[0])),
            job("bob", "eval", queued()),
            job("alice", "sweep", queued()),
        ];
        jobs[1].submitted_at -= chrono::Duration::seconds(10);
        for record in &jobs {
            model.update(Input::job(record.clone()));
        }
        model.settle();
        (model, jobs)
    }

    #[test]
    fn moving_filtering_and_cancelling_with_a_confirmation() {
        let (mut model, jobs) = cluster();
        press(&mut model, KeyCode::Char('j'));
        press(&mut model, KeyCode::Down);
        assert_eq!(model.selected_job().map(|j| &j.id), Some(&jobs[2].id));
        // Filtering keeps the selection on its job, now the second line.
        press(&mut model, KeyCode::Char('/'));
        typed(&mut model, "user:alice");
        press(&mut model, KeyCode::Enter);
        assert_eq!(model.rows.jobs.len(), 2);
        assert_eq!(model.jobs_cursor.index, 1);
        assert_eq!(model.mode, Mode::Normal);
        // `c` asks first; only `y` sends the request.
        assert!(press(&mut model, KeyCode::Char('c')).is_empty());
        assert!(
            matches!(&model.mode, Mode::Confirm { question, .. } if question.contains("sweep"))
        );
        assert!(press(&mut model, KeyCode::Char('x')).is_empty());
        let effects = press(&mut model, KeyCode::Char('y'));
        assert_eq!(effects, [Effect::Cancel(jobs[2].id.clone())]);
        assert_eq!(model.mode, Mode::Normal);
        // Esc clears the filter.
        press(&mut model, KeyCode::Esc);
        assert_eq!(model.rows.jobs.len(), 3);
        assert_eq!(press(&mut model, KeyCode::Char('q')), [Effect::Quit]);
    }

    #[test]
    fn no_keeps_the_job_and_others_jobs_need_an_admin() {
        let (mut model, jobs) = cluster();
        press(&mut model, KeyCode::Char('c'));
        assert!(press(&mut model, KeyCode::Char('n')).is_empty());
        assert!(model.status().is_some_and(|s| s.contains("not cancelled")));
        press(&mut model, KeyCode::Down);
        assert_eq!(model.selected_job().map(|j| &j.id), Some(&jobs[1].id));
        // Not known to be an admin: the scheduler will decide.
        press(&mut model, KeyCode::Char('c'));
        assert!(matches!(model.mode, Mode::Confirm { .. }));
        press(&mut model, KeyCode::Esc);
        model.update(Input::Admin(false));
        press(&mut model, KeyCode::Char('c'));
        assert_eq!(model.mode, Mode::Normal);
        assert!(model.status().is_some_and(|s| s.contains("bob's")));
        model.update(Input::Admin(true));
        press(&mut model, KeyCode::Char('c'));
        assert!(matches!(model.mode, Mode::Confirm { .. }));
    }

    #[test]
    fn another_users_private_output_is_not_followed_but_said_to_be_private() {
        let (mut model, jobs) = cluster();
        let mut private = jobs[1].clone();
        private.spec.private_output = true;
        model.update(Input::job(private));
        model.update(Input::Admin(false));
        press(&mut model, KeyCode::Down);
        assert_eq!(model.selected_job().map(|j| &j.id), Some(&jobs[1].id));
        assert!(press(&mut model, KeyCode::Char('l')).is_empty());
        assert!(model.status().is_some_and(|s| s.contains("private")));
        // An admin follows it, on its owner's private subject.
        model.update(Input::Admin(true));
        let effects = press(&mut model, KeyCode::Char('l'));
        assert!(
            matches!(&effects[..], [Effect::FollowLog(_, subject)] if subject.starts_with("users.")),
            "{effects:?}"
        );
    }

    #[test]
    fn only_queued_jobs_are_held_and_only_held_ones_released() {
        let (mut model, jobs) = cluster();
        assert!(press(&mut model, KeyCode::Char('h')).is_empty());
        assert!(model.status().is_some_and(|s| s.contains("running")));
        press(&mut model, KeyCode::Char('G'));
        assert!(press(&mut model, KeyCode::Char('r')).is_empty());
        let effects = press(&mut model, KeyCode::Char('h'));
        assert_eq!(effects, [Effect::Hold(jobs[2].id.clone())]);
        let mut now_held = jobs[2].clone();
        now_held.state = held("alice");
        model.update(Input::job(now_held));
        let effects = press(&mut model, KeyCode::Char('r'));
        assert_eq!(effects, [Effect::Release(jobs[2].id.clone())]);
    }

    #[test]
    fn details_and_logs_open_over_the_panes_and_close_with_esc() {
        let (mut model, jobs) = cluster();
        press(&mut model, KeyCode::Enter);
        assert!(matches!(&model.mode, Mode::Detail(job) if job.id == jobs[0].id));
        press(&mut model, KeyCode::Esc);
        assert_eq!(model.mode, Mode::Normal);
        let effects = press(&mut model, KeyCode::Char('l'));
        let subject = mgpu_protocol::subjects::output(&jobs[0].id);
        assert_eq!(effects, [Effect::FollowLog(jobs[0].id.clone(), subject)]);
        model.update(Input::Log {
            job: jobs[0].id.clone(),
            bytes: b"step 1\n".to_vec(),
        });
        assert!(matches!(&model.mode, Mode::Log(pane) if pane.line_count() == 1));
        assert_eq!(press(&mut model, KeyCode::Char('q')), [Effect::StopLog]);
    }

    #[test]
    fn the_nodes_pane_selects_gpus_and_their_jobs() {
        let (mut model, jobs) = cluster();
        press(&mut model, KeyCode::Tab);
        assert_eq!(model.selected_job().map(|j| &j.id), Some(&jobs[0].id));
        press(&mut model, KeyCode::Char('g'));
        assert_eq!(
            model.nodes_cursor.key,
            Some(LineKey::Gpu("node001".into(), Some(0)))
        );
        press(&mut model, KeyCode::Down);
        assert!(model.selected_job().is_none(), "GPU 1 is free");
        press(&mut model, KeyCode::Enter);
        assert!(model.status().is_some_and(|s| s.contains("No job")));
    }
}
