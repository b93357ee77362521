//! The final output of a scenario: aligned text tables for people, JSON for scripts, and a
//! Markdown block for BENCHMARKS.md — all from the same [`Report`].

use serde::Serialize;

use crate::sys::Machine;

#[derive(Debug, Clone, Serialize)]
pub struct Table {
    pub title: String,
    pub headers: Vec<String>,
    pub rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(title: impl Into<String>, headers: &[&str]) -> Self {
        Table {
            title: title.into(),
            headers: headers.iter().map(|h| h.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    fn widths(&self) -> Vec<usize> {
        let mut widths: Vec<usize> = self.headers.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (i, cell) in row.iter().enumerate() {
                if i < widths.len() {
                    widths[i] = widths[i].max(cell.chars().count());
                }
            }
        }
        widths
    }

    pub fn render_text(&self) -> String {
        let widths = self.widths();
        let line = |cells: &[String]| -> String {
            let parts: Vec<String> = cells
                .iter()
                .zip(&widths)
                .map(|(c, &w)| format!("{c:<w$}"))
                .collect();
            parts.join("  ").trim_end().to_string()
        };
        let mut out = format!("{}\n{}\n", self.title, line(&self.headers));
        for row in &self.rows {
            out.push_str(&line(row));
            out.push('\n');
        }
        out
    }

    pub fn render_markdown(&self) -> String {
        let mut out = format!("| {} |\n", self.headers.join(" | "));
        out.push_str(&format!(
            "|{}\n",
            self.headers.iter().map(|_| " --- |").collect::<String>()
        ));
        for row in &self.rows {
            out.push_str(&format!("| {} |\n", row.join(" | ")));
        }
        out
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub scenario: String,
    pub command: String,
    pub machine: Machine,
    pub tables: Vec<Table>,
    /// Observations a reader must not miss: targets met or missed, a saturated client,
    /// errors, early deliveries.
    pub notes: Vec<String>,
    /// Path of the lateness picture, when one was drawn.
    pub picture: Option<String>,
    /// Raw numbers for scripts.
    pub data: serde_json::Value,
}

impl Report {
    pub fn render_text(&self) -> String {
        let mut out = String::new();
        for table in &self.tables {
            out.push_str(&table.render_text());
            out.push('\n');
        }
        for note in &self.notes {
            out.push_str(&format!("* {note}\n"));
        }
        if let Some(picture) = &self.picture {
            out.push_str(&format!("* lateness CDF written to {picture}\n"));
        }
        out
    }

    /// The Markdown block for this scenario's sub-section of BENCHMARKS.md.
    /// `heading` names the run; `picture_link` is the picture's path relative to the Markdown file.
    pub fn render_markdown(&self, heading: &str, picture_link: Option<&str>) -> String {
        let mut out = format!("### `{heading}`\n\n");
        out.push_str(&format!(
            "Command: `{}`  \nCommit `{}`, {}, on {}.\n\n",
            self.command,
            self.machine.commit,
            self.machine.date_utc,
            self.machine.one_line()
        ));
        for table in &self.tables {
            out.push_str(&format!("**{}**\n\n", table.title));
            out.push_str(&table.render_markdown());
            out.push('\n');
        }
        for note in &self.notes {
            out.push_str(&format!("- {note}\n"));
        }
        if let Some(link) = picture_link {
            out.push_str(&format!("\n![firing lateness CDF]({link})\n"));
        }
        out
    }
}

/// The cell of a measure that was not taken.
pub fn dash() -> String {
    "-".into()
}

/// `value` shown by `show`, or a dash when it was not measured.
pub fn or_dash<T>(value: Option<T>, show: impl FnOnce(T) -> String) -> String {
    value.map_or_else(dash, show)
}

/// `a / b` as "0.87×", or "n/a" when there is no baseline.
pub fn ratio(a: f64, b: f64) -> String {
    if a > 0.0 && b > 0.0 && a.is_finite() {
        format!("{:.2}×", a / b)
    } else {
        "n/a".into()
    }
}

/// 1234567.8 → "1,234,568".
pub fn thousands(value: f64) -> String {
    let rounded = value.round().max(0.0) as u64;
    let digits = rounded.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// `part/whole` with thousands separators: "9,998/10,000" delivered, accepted, received.
pub fn part_of(part: u64, whole: u64) -> String {
    format!("{}/{}", thousands(part as f64), thousands(whole as f64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn number_formatting() {
        assert_eq!(thousands(1_234_567.8), "1,234,568");
        assert_eq!(thousands(999.0), "999");
        assert_eq!(thousands(0.0), "0");
        assert_eq!(part_of(9_998, 10_000), "9,998/10,000");
        assert_eq!(ratio(50.0, 100.0), "0.50×");
        assert_eq!(ratio(1.0, 0.0), "n/a");
        assert_eq!(ratio(0.0, 5.0), "n/a");
    }

    #[test]
    fn tables_render_aligned_and_as_markdown() {
        let mut t = Table::new("t", &["a", "long header"]);
        t.row(vec!["wide cell".into(), "x".into()]);
        let text = t.render_text();
        assert!(text.contains("a          long header\nwide cell  x\n"));
        assert_eq!(
            t.render_markdown(),
            "| a | long header |\n| --- | --- |\n| wide cell | x |\n"
        );
    }
}
