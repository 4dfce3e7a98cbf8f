//! What the panes and the overlays draw with: a pane's title bar, a line of padded cells, a
//! percentage bar. Shared by `view`, `panes` and `overlay`, and importing none of them.

use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::{Modifier, Style};

use super::format;

/// A pane's title bar: its name and counts, then a rule to the edge.
pub fn title(area: Rect, text: &str, focused: bool, buf: &mut Buffer) {
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
pub struct LineWriter<'a> {
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
pub fn percent_bar(fraction: f64, bar: u16) -> String {
    format!(
        "{} {:>3}%",
        format::bar(fraction, usize::from(bar)),
        (fraction.clamp(0.0, 1.0) * 100.0).round() as u32
    )
}
