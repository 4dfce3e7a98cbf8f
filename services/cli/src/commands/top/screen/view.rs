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
use super::model::{Mode, Model};
use super::overlay;
use super::panes;
use super::rows::GpuCounts;

/// Where each part of the screen goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub header: Rect,
    pub nodes: Rect,
    pub jobs: Rect,
    pub status: Rect,
}

/// Header lines: the cluster's counts, then GPUs by model.
const HEADER: u16 = 2;

/// The screen of `size` (columns, rows) cut into parts. The nodes pane takes what its
/// `gpu_lines` need, up to a little over half of the space, so a small cluster leaves the
/// rest to the queue.
pub fn layout(size: (u16, u16), gpu_lines: usize) -> Layout {
    let (width, height) = size;
    let header = Rect::new(0, 0, width, HEADER.min(height));
    let status_height = u16::from(height > HEADER);
    let status = Rect::new(
        0,
        height.saturating_sub(status_height),
        width,
        status_height,
    );
    let body = height.saturating_sub(header.height + status_height);
    let wanted = u16::try_from(gpu_lines.saturating_add(2)).unwrap_or(u16::MAX);
    let most = u16::try_from(u32::from(body) * 11 / 20)
        .unwrap_or(body)
        .max(body.min(3));
    let nodes_height = wanted.min(most);
    let nodes = Rect::new(0, header.height, width, nodes_height);
    let jobs = Rect::new(0, header.height + nodes_height, width, body - nodes_height);
    Layout {
        header,
        nodes,
        jobs,
        status,
    }
}

/// Lines of a pane left for its rows (its title and column headings take two).
pub fn visible_lines(pane: Rect) -> usize {
    usize::from(pane.height.saturating_sub(2))
}

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

/// A pane's title bar: its name and counts, then a rule to the edge.
pub(super) fn title(area: Rect, text: &str, focused: bool, buf: &mut Buffer) {
    if area.height == 0 {
        return;
    }
    let rule = "─".repeat(usize::from(area.width));
    buf.set_stringn(
        area.x,
        area.y,
        rule,
        usize::from(area.width),
        Style::default().add_modifier(Modifier::DIM),
    );
    let style = if focused {
        Style::default().add_modifier(Modifier::BOLD | Modifier::REVERSED)
    } else {
        Style::default().add_modifier(Modifier::BOLD)
    };
    buf.set_stringn(
        area.x + 1,
        area.y,
        format!(" {text} "),
        usize::from(area.width.saturating_sub(2)),
        style,
    );
}

/// Writes cells left to right along one screen line, each padded to its width and cut at
/// the pane's edge.
pub(super) struct LineWriter<'a> {
    pub buf: &'a mut Buffer,
    pub x: u16,
    pub y: u16,
    pub right: u16,
}

impl LineWriter<'_> {
    pub fn cell(&mut self, text: &str, width: u16, style: Style) {
        if self.x < self.right {
            let room = usize::from(width.min(self.right - self.x));
            self.buf.set_stringn(self.x, self.y, text, room, style);
        }
        self.x = self.x.saturating_add(width).saturating_add(1);
    }

    /// Right-aligned within `width` (numbers).
    pub fn number(&mut self, text: &str, width: u16, style: Style) {
        let pad = usize::from(width).saturating_sub(text.chars().count());
        self.cell(&format!("{}{text}", " ".repeat(pad)), width, style);
    }

    /// The rest of the line.
    pub fn rest(&mut self, text: &str, style: Style) {
        let width = self.right.saturating_sub(self.x);
        self.cell(text, width, style);
    }
}

/// `[|||   ] 45%` in `width` columns at most.
pub(super) fn percent_bar(fraction: f64, bar: u16) -> String {
    format!(
        "{} {:>3}%",
        format::bar(fraction, usize::from(bar)),
        (fraction.clamp(0.0, 1.0) * 100.0).round() as u32
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::top::model::Input;
    use crate::top::test_data::{alice, heartbeat, job, queued, running};

    #[test]
    fn the_layout_gives_a_small_cluster_only_the_lines_it_needs() {
        let small = layout((120, 40), 2);
        assert_eq!(small.header.height, 2);
        assert_eq!(small.nodes.height, 4);
        assert_eq!(small.jobs.height, 40 - 2 - 4 - 1);
        assert_eq!(small.status.y, 39);
        let large = layout((120, 40), 8_000);
        assert_eq!(large.nodes.height, 37 * 11 / 20);
        // A terminal too small for anything still lays out without overflowing.
        let tiny = layout((10, 2), 100);
        assert_eq!(tiny.nodes.height + tiny.jobs.height, 0);
    }

    #[test]
    fn a_frame_shows_nodes_gpus_jobs_and_whose_they_are() {
        let mut model = Model::new(alice(), mgpu_protocol::now(), (120, 20));
        model.update(Input::heartbeat(heartbeat("node001", 2)));
        let train = job("alice", "train", running("node001", &[1]));
        let waiting = job("bob", "eval", queued());
        model.update(Input::job(train.clone()));
        model.update(Input::job(waiting.clone()));
        model.settle();
        let area = Rect::new(0, 0, 120, 20);
        let mut buf = Buffer::empty(area);
        render(&model, area, &mut buf);
        let text = to_text(&buf);
        assert!(text.contains("1 free, 1 used, 0 paused"), "{text}");
        assert!(text.contains("A100: 1 free, 1 used, 0 paused"), "{text}");
        let gpu1 = text
            .lines()
            .find(|l| l.contains(train.id.short()) && l.contains("A100"))
            .unwrap_or_default();
        assert!(gpu1.contains("alice") && gpu1.contains("10%"), "{text}");
        let queued_line = text
            .lines()
            .find(|l| l.contains(waiting.id.short()))
            .unwrap_or_default();
        assert!(
            queued_line.contains("waiting for GPUs to become free"),
            "{text}"
        );
        // Alice's own job is marked; the selected one too.
        let own = text
            .lines()
            .find(|l| l.contains(train.id.short()) && l.contains("running"))
            .unwrap_or_default();
        assert!(own.starts_with(">*"), "{text}");
    }
}
