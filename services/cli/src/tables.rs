//! A tiny column-aligning table for human listings (`mgpu queue`, `mgpu nodes`).
//!
//! Columns are left-aligned and separated by two spaces, like `squeue` or `ps`; the last column
//! is not padded so lines carry no trailing blanks. Cells come from job names, reasons and
//! node reports, so control characters are replaced: a newline in a reason must not break
//! the table.
//!
//! `mgpu queue` may list 100 000 jobs: cells are kept as given unless they hold a control
//! character, and [`Table::write_to`] writes line by line to a buffered writer rather than
//! building the whole text.

use std::io::Write;

pub struct Table {
    headers: Vec<String>,
    rows: Vec<Vec<String>>,
    indent: usize,
}

const GAP: &str = "  ";

impl Table {
    pub fn new<const N: usize>(headers: [&str; N]) -> Table {
        Table {
            headers: headers.iter().map(|h| (*h).to_owned()).collect(),
            rows: Vec::new(),
            indent: 0,
        }
    }

    /// Shifts every line right, for tables nested under a heading.
    pub fn indent(mut self, spaces: usize) -> Table {
        self.indent = spaces;
        self
    }

    /// Room for `rows` rows, for a caller that knows how many are coming.
    pub fn with_capacity(mut self, rows: usize) -> Table {
        self.rows.reserve(rows);
        self
    }

    /// Adds a row; missing cells are blank and extra cells are dropped.
    pub fn row(&mut self, mut cells: Vec<String>) {
        for cell in &mut cells {
            clean(cell);
        }
        cells.resize(self.headers.len(), String::new());
        self.rows.push(cells);
    }

    /// The table as text, one line per row after the header, each ending in a newline.
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        // Writing to a Vec cannot fail, and every cell is a str: the bytes are UTF-8.
        let _ = self.write_to(&mut out);
        String::from_utf8_lossy(&out).into_owned()
    }

    /// Writes the table as [`Table::render`] returns it.
    pub fn write_to(&self, out: &mut impl Write) -> std::io::Result<()> {
        let columns = self.headers.len();
        let mut widths: Vec<usize> = self.headers.iter().map(|h| width(h)).collect();
        for row in &self.rows {
            for (column, cell) in row.iter().enumerate() {
                widths[column] = widths[column].max(width(cell));
            }
        }
        let mut line = String::new();
        for cells in std::iter::once(&self.headers).chain(&self.rows) {
            line.clear();
            line.extend(std::iter::repeat_n(' ', self.indent));
            for (column, cell) in cells.iter().enumerate() {
                line.push_str(cell);
                if column + 1 < columns {
                    line.extend(std::iter::repeat_n(' ', widths[column] - width(cell)));
                    line.push_str(GAP);
                }
            }
            out.write_all(line.trim_end().as_bytes())?;
            out.write_all(b"\n")?;
        }
        Ok(())
    }
}

/// Width in characters; mgpu's own cells are ASCII, and names are counted per character.
fn width(text: &str) -> usize {
    if text.is_ascii() {
        text.len()
    } else {
        text.chars().count()
    }
}

/// Replaces control characters with blanks, leaving (and not copying) a cell without any.
fn clean(text: &mut String) {
    if text.chars().any(char::is_control) {
        *text = text
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_line_up_without_trailing_blanks() {
        let mut table = Table::new(["ID", "NAME", "STATE"]);
        table.row(vec!["3f9a".into(), "train-large".into(), "running".into()]);
        table.row(vec!["b2".into(), "x".into(), "queued".into()]);
        let expected = "\
ID    NAME         STATE
3f9a  train-large  running
b2    x            queued
";
        assert_eq!(table.render(), expected);
    }

    #[test]
    fn blank_last_cells_leave_no_trailing_space_and_short_rows_are_padded() {
        let mut table = Table::new(["A", "B"]).indent(2);
        table.row(vec!["long-cell".into()]);
        assert_eq!(table.render(), "  A          B\n  long-cell\n");
    }

    #[test]
    fn control_characters_cannot_break_a_row() {
        let mut table = Table::new(["REASON"]);
        table.row(vec!["line one\nline two".into()]);
        assert_eq!(table.render(), "REASON\nline one line two\n");
    }

    #[test]
    fn wide_characters_count_once() {
        let mut table = Table::new(["N", "X"]);
        table.row(vec!["été".into(), "1".into()]);
        assert_eq!(table.render(), "N    X\nété  1\n");
    }
}
