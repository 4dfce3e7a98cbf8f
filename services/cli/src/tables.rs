//! A tiny column-aligning table for human listings (`mgpu queue`, `mgpu nodes`).
//!
//! Columns are left-aligned and separated by two spaces, like `squeue` or `ps`; the last column
//! is not padded so lines carry no trailing blanks. Cells come from job names, reasons and
//! node reports, so control characters are replaced: a newline in a reason must not break
//! the table.

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

    /// Adds a row; missing cells are blank and extra cells are dropped.
    pub fn row(&mut self, cells: Vec<String>) {
        let mut cells: Vec<String> = cells.into_iter().map(|c| clean(&c)).collect();
        cells.resize(self.headers.len(), String::new());
        self.rows.push(cells);
    }

    /// The table as text, one line per row after the header, each ending in a newline.
    pub fn render(&self) -> String {
        let columns = self.headers.len();
        let mut widths: Vec<usize> = self.headers.iter().map(|h| width(h)).collect();
        for row in &self.rows {
            for (column, cell) in row.iter().enumerate() {
                widths[column] = widths[column].max(width(cell));
            }
        }
        let mut out = String::new();
        for line in std::iter::once(&self.headers).chain(&self.rows) {
            let mut text = " ".repeat(self.indent);
            for (column, cell) in line.iter().enumerate() {
                text.push_str(cell);
                if column + 1 < columns {
                    text.push_str(&" ".repeat(widths[column] - width(cell)));
                    text.push_str(GAP);
                }
            }
            out.push_str(text.trim_end());
            out.push('\n');
        }
        out
    }
}

/// Width in characters; mgpu's own cells are ASCII, and names are counted per character.
fn width(text: &str) -> usize {
    text.chars().count()
}

fn clean(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
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
