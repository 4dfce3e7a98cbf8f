//! The live output pane (`l`): the selected job's output as lines, the newest kept. A job
//! writes whatever bytes it likes; only printable text reaches the screen, since an escape
//! sequence passed through would move the cursor or change colours under the drawing.

use std::collections::VecDeque;

use mgpu_protocol::ids::JobId;

/// Lines kept; older ones are dropped (`mgpu logs` has them all).
pub const MAX_LINES: usize = 5_000;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogPane {
    pub job: JobId,
    /// What the pane's title says the job is.
    pub title: String,
    pub lines: VecDeque<String>,
    /// The last line, not ended yet.
    partial: String,
    /// Lines scrolled back from the newest (0: following the end).
    pub scroll: usize,
    /// Said once the output ended or could not be read.
    pub note: Option<String>,
    /// Inside an escape sequence that an earlier chunk began.
    escape: Escape,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Escape {
    #[default]
    None,
    /// After ESC.
    Start,
    /// In a control sequence (`ESC [ … final`).
    Csi,
    /// In an operating-system command (`ESC ] … BEL`), a window title say.
    Osc,
}

impl LogPane {
    pub fn new(job: JobId, title: String) -> LogPane {
        LogPane {
            job,
            title,
            lines: VecDeque::new(),
            partial: String::new(),
            scroll: 0,
            note: None,
            escape: Escape::None,
        }
    }

    /// Output as the job wrote it.
    pub fn push(&mut self, bytes: &[u8]) {
        for c in String::from_utf8_lossy(bytes).chars() {
            self.push_char(c);
        }
        let excess = self.lines.len().saturating_sub(MAX_LINES);
        self.lines.drain(..excess);
        self.scroll = self.scroll.min(self.line_count().saturating_sub(1));
    }

    fn push_char(&mut self, c: char) {
        match (self.escape, c) {
            (Escape::None, '\u{1b}') => self.escape = Escape::Start,
            (Escape::Start, '[') => self.escape = Escape::Csi,
            (Escape::Start, ']') => self.escape = Escape::Osc,
            (Escape::Start, _) => self.escape = Escape::None,
            // A CSI sequence ends at its final byte, `@` to `~`.
            (Escape::Csi, '@'..='~') => self.escape = Escape::None,
            (Escape::Csi, _) => {}
            (Escape::Osc, '\u{7}' | '\u{1b}') => self.escape = Escape::None,
            (Escape::Osc, _) => {}
            (Escape::None, '\n') => {
                let line = std::mem::take(&mut self.partial);
                self.lines.push_back(line);
                if self.scroll > 0 {
                    // Scrolled back: the view stays on the same lines.
                    self.scroll += 1;
                }
            }
            // Progress bars rewrite their line: keep the latest version of it.
            (Escape::None, '\r') => self.partial.clear(),
            (Escape::None, '\t') => self.partial.push_str("    "),
            (Escape::None, c) if c.is_control() => {}
            (Escape::None, c) => self.partial.push(c),
        }
    }

    /// Every line to show, oldest first, the unfinished last one included.
    pub fn all_lines(&self) -> impl Iterator<Item = &str> {
        self.lines
            .iter()
            .map(String::as_str)
            .chain((!self.partial.is_empty()).then_some(self.partial.as_str()))
    }

    pub fn line_count(&self) -> usize {
        self.lines.len() + usize::from(!self.partial.is_empty())
    }

    /// Scrolls back (positive) or forward, never past the first line or the end.
    pub fn scroll_by(&mut self, lines: isize) {
        let most = self.line_count().saturating_sub(1);
        self.scroll = self.scroll.saturating_add_signed(lines).min(most);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pane() -> LogPane {
        LogPane::new(JobId::random(), "train".into())
    }

    #[test]
    fn lines_split_across_chunks_and_escapes_are_dropped() {
        let mut log = pane();
        log.push(b"epoch 1\nepo");
        log.push(b"ch 2\x1b[31m red\x1b[0m\n\x1b]0;title\x07done");
        let lines: Vec<&str> = log.all_lines().collect();
        assert_eq!(lines, ["epoch 1", "epoch 2 red", "done"]);
        // An escape split between two chunks is still dropped.
        log.push(b"\n\x1b[");
        log.push(b"1mbold\n");
        assert_eq!(log.lines.back().map(String::as_str), Some("bold"));
    }

    #[test]
    fn carriage_returns_keep_the_latest_progress() {
        let mut log = pane();
        log.push(b"10%\r50%\r100%\n\tx\x08\n");
        let lines: Vec<&str> = log.all_lines().collect();
        assert_eq!(lines, ["100%", "    x"]);
    }

    #[test]
    fn old_lines_go_and_scrolling_stays_in_range() {
        let mut log = pane();
        for n in 0..MAX_LINES + 10 {
            log.push(format!("{n}\n").as_bytes());
        }
        assert_eq!(log.lines.len(), MAX_LINES);
        assert_eq!(log.lines.front().map(String::as_str), Some("10"));
        log.scroll_by(3);
        assert_eq!(log.scroll, 3);
        log.push(b"more\n");
        assert_eq!(log.scroll, 4, "scrolled back, the view keeps its lines");
        log.scroll_by(-100);
        assert_eq!(log.scroll, 0);
        log.scroll_by(1_000_000);
        assert_eq!(log.scroll, MAX_LINES - 1);
    }
}
