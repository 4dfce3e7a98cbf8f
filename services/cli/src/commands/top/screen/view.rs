//! Drawing `mgpu top` into a ratatui [`Buffer`]: the header (cluster counts and GPUs by
//! model), the nodes pane, the queue pane, the status line, and what opens over them. Pure:
//! the same model and size always draw the same frame, so `--once`, the live screen and the
//! benchmark all go through [`render`].
//!
//! Only the lines on screen are formatted, whatever the cluster's size.

use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::{Color, Modifier, Style};

use super::format;
use super::layout::layout;
use super::model::{Mode, Model};
use super::overlay;
use super::panes;
use super::rows::GpuCounts;

/// Draws the whole screen into `buf` over `area`. Call [`Model::settle`] first.
pub fn render(model: &Model, area: Rect, buf: &mut Buffer) {
    let layout = layout((area.width, area.height), model.rows.gpus.len());
    header(model, layout.header, buf);
    panes::nodes(model, layout.nodes, buf);
    match model.mode() {
        Mode::Log(pane) => overlay::log(pane, layout.jobs, buf),
        _ => panes::jobs(model, layout.jobs, buf),
    }
    if let Mode::Detail(job) = model.mode() {
        let body = Rect::new(
            0,
            layout.nodes.y,
            area.width,
            layout.nodes.height + layout.jobs.height,
        );
        overlay::detail(model, job, body, buf);
    }
    status(model, layout.status, buf);
}

/// A blank frame of `size` (columns, rows) to draw into, away from a terminal (`--once`, the
/// benchmark).
pub fn blank(size: (u16, u16)) -> Buffer {
    Buffer::empty(Rect::new(0, 0, size.0, size.1))
}

/// The frame as text, one line per row, trailing blanks trimmed (`--once`).
pub fn to_text(buf: &Buffer) -> String {
    let area = buf.area;
    let mut out = String::with_capacity(usize::from(area.width + 1) * usize::from(area.height));
    for y in area.top()..area.bottom() {
        let start = out.len();
        for x in area.left()..area.right() {
            out.push_str(buf[(x, y)].symbol());
        }
        let kept = out[start..].trim_end().len();
        out.truncate(start + kept);
        out.push('\n');
    }
    out
}

fn header(model: &Model, area: Rect, buf: &mut Buffer) {
    if area.height == 0 {
        return;
    }
    let s = &model.rows.summary;
    let mut line = format!(
        "mgpu top · {}, {} online · GPUs {} · jobs {} running, {} queued",
        format::count(s.nodes, "node"),
        s.nodes_online,
        counts(&s.gpus),
        s.running,
        s.queued
    );
    if s.held > 0 {
        line.push_str(&format!(" ({} held)", s.held));
    }
    line.push_str(&format!(
        " · yours {} running, {} queued",
        s.mine_running, s.mine_queued
    ));
    let clock = model
        .now
        .with_timezone(&chrono::Local)
        .format("%H:%M:%S")
        .to_string();
    let bold = Style::default().add_modifier(Modifier::BOLD);
    buf.set_stringn(area.x, area.y, &line, usize::from(area.width), bold);
    let clock_x = area.right().saturating_sub(8);
    if usize::from(clock_x) > line.chars().count() {
        buf.set_string(clock_x, area.y, clock, bold);
    }
    if area.height > 1 {
        let models: Vec<String> = s
            .models
            .iter()
            .map(|(name, c)| format!("{name}: {}", counts(c)))
            .collect();
        let text = if models.is_empty() {
            "No node has reported yet.".to_owned()
        } else {
            models.join(" · ")
        };
        buf.set_stringn(
            area.x,
            area.y + 1,
            text,
            usize::from(area.width),
            Style::default(),
        );
    }
}

/// `3 free, 5 used, 1 paused`, and offline ones when there are any.
fn counts(c: &GpuCounts) -> String {
    let mut text = format!("{} free, {} used, {} paused", c.free, c.used, c.paused);
    if c.offline > 0 {
        text.push_str(&format!(", {} offline", c.offline));
    }
    text
}

fn status(model: &Model, area: Rect, buf: &mut Buffer) {
    if area.height == 0 {
        return;
    }
    let width = usize::from(area.width);
    let (text, style) = match model.mode() {
        Mode::Typing { .. } => (
            format!(
                "Filter (user:NAME node:NAME state:STATE or any text; enter keeps, esc undoes): {}_",
                model.filter.text()
            ),
            Style::default().fg(Color::Yellow),
        ),
        Mode::Confirm { question, .. } => (
            question.clone(),
            Style::default()
                .fg(Color::Yellow)
                .add_modifier(Modifier::BOLD),
        ),
        Mode::Detail(_) | Mode::Log(_) => (
            "esc/q/enter close · j/k scroll · ctrl+c quit".to_owned(),
            Style::default().add_modifier(Modifier::DIM),
        ),
        Mode::Normal => match model.status() {
            Some(said) => (said.to_owned(), Style::default().fg(Color::Cyan)),
            None => (
                "q quit · j/k move · tab pane · enter show · l log · c cancel · h/r hold/release · / filter"
                    .to_owned(),
                Style::default().add_modifier(Modifier::DIM),
            ),
        },
    };
    buf.set_stringn(area.x, area.y, text, width, style);
}
