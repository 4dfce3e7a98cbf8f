//! What opens over the panes: a job's details (`enter`) in a box over both panes, and its
//! live output (`l`) in place of the queue.

use mgpu_protocol::Timestamp;
use mgpu_protocol::job::{JobRecord, JobState};
use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::{Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Block, Borders, Clear, Paragraph, Widget, Wrap};

use super::format;
use super::log::LogPane;
use super::model::Model;
use super::rows::{is_mine, queued_at};
use super::widgets::title;

pub(super) fn detail(model: &Model, job: &JobRecord, body: Rect, buf: &mut Buffer) {
    let width = body.width.saturating_sub(4).min(110);
    let texts: Vec<String> = detail_lines(model, job)
        .into_iter()
        .map(|(label, value)| format!("{label:<11}{value}"))
        .collect();
    // As tall as the wrapped lines need, within the panes.
    let inner = usize::from(width.saturating_sub(2)).max(1);
    let needed: usize = texts
        .iter()
        .map(|text| text.chars().count().div_ceil(inner).max(1))
        .sum();
    let height = u16::try_from(needed + 2)
        .unwrap_or(u16::MAX)
        .min(body.height.saturating_sub(2));
    if width < 10 || height < 3 {
        return;
    }
    let area = Rect::new(
        body.x + (body.width - width) / 2,
        body.y + (body.height - height) / 2,
        width,
        height,
    );
    Clear.render(area, buf);
    let block = Block::default()
        .borders(Borders::ALL)
        .title(format!(" Job {} · esc closes ", job.id.short()));
    let lines: Vec<Line<'_>> = texts.into_iter().map(Line::from).collect();
    Paragraph::new(lines)
        .block(block)
        .wrap(Wrap { trim: false })
        .render(area, buf);
}

fn detail_lines(model: &Model, job: &JobRecord) -> Vec<(&'static str, String)> {
    let now = model.now;
    let owner = if is_mine(&model.me, job) {
        format!("{} (you)", job.user)
    } else {
        job.user.clone()
    };
    let effective = model
        .rows
        .jobs
        .iter()
        .find(|line| {
            model
                .data
                .jobs
                .get(line.job)
                .is_some_and(|j| j.id == job.id)
        })
        .and_then(|line| line.effective);
    let priority = match effective {
        Some(effective) => format!("{} (effective {effective})", job.spec.priority),
        None => job.spec.priority.to_string(),
    };
    let placement = job
        .state
        .placement()
        .map_or_else(|| "-".to_owned(), format::placement);
    vec![
        ("Id", job.id.to_string()),
        ("Name", job.spec.display_name()),
        ("User", owner),
        ("State", state_words(job, now)),
        ("Priority", priority),
        ("GPUs", format!("{} on {placement}", job.spec.gpus)),
        (
            "Submitted",
            format!(
                "{} ago (attempt {})",
                format::since(job.submitted_at, now),
                job.attempt
            ),
        ),
        ("Command", job.spec.command_line()),
        ("Directory", job.spec.workdir.clone()),
    ]
}

/// The job's state as a sentence: how long, and why it waits or how it ended.
fn state_words(job: &JobRecord, now: Timestamp) -> String {
    match &job.state {
        JobState::Queued(waiting) => match &waiting.held_by {
            Some(by) => format!(
                "queued for {}, held by {by}",
                format::since(queued_at(job), now)
            ),
            None => format!(
                "queued for {}: {}",
                format::since(queued_at(job), now),
                waiting.reason.describe()
            ),
        },
        JobState::Running(run) => match run.started_at {
            Some(started) => format!("running for {}", format::since(started, now)),
            None => "starting".to_owned(),
        },
        finished => match finished.ending() {
            Some(end) => format!(
                "{} {} ago{}",
                finished.name(),
                format::since(end.ended_at, now),
                end.reason
                    .as_ref()
                    .map(|r| format!(": {r}"))
                    .unwrap_or_default()
            ),
            None => finished.name().to_owned(),
        },
    }
}

pub(super) fn log(pane: &LogPane, area: Rect, buf: &mut Buffer) {
    if area.height == 0 {
        return;
    }
    let mut text = format!("Output of {}", pane.title);
    if pane.scroll > 0 {
        text.push_str(&format!(" · {} lines back (G: the end)", pane.scroll));
    }
    title(area, &text, true, buf);
    let height = usize::from(area.height - 1);
    let note_lines = usize::from(pane.note.is_some());
    let room = height.saturating_sub(note_lines);
    let end = pane.line_count().saturating_sub(pane.scroll);
    let start = end.saturating_sub(room);
    let mut y = area.y + 1;
    for line in pane.all_lines().skip(start).take(end - start) {
        buf.set_stringn(area.x, y, line, usize::from(area.width), Style::default());
        y += 1;
    }
    if pane.line_count() == 0 && pane.note.is_none() {
        buf.set_stringn(
            area.x,
            y,
            "(no output yet)",
            usize::from(area.width),
            Style::default().add_modifier(Modifier::DIM),
        );
    }
    if let Some(note) = &pane.note {
        buf.set_stringn(
            area.x,
            y,
            format!("— {note} —"),
            usize::from(area.width),
            Style::default().add_modifier(Modifier::DIM),
        );
    }
}
