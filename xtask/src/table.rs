//! A table printed twice: aligned for the terminal, in markdown for the
//! pages under docs/ that show figures (benchmarks.md, kernels.md).

pub struct Table {
    pub title: String,
    pub columns: Vec<String>,
    pub rows: Vec<Vec<String>>,
}

impl Table {
    /// First column left-aligned, the figures right-aligned.
    pub fn text(&self) -> String {
        let widths: Vec<usize> = (0..self.columns.len())
            .map(|c| {
                self.rows
                    .iter()
                    .map(|r| r[c].chars().count())
                    .chain([self.columns[c].chars().count()])
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let line = |cells: Vec<&str>| {
            cells
                .iter()
                .zip(&widths)
                .enumerate()
                .map(|(c, (cell, &w))| {
                    if c == 0 {
                        format!("{cell:<w$}")
                    } else {
                        format!("{cell:>w$}")
                    }
                })
                .collect::<Vec<_>>()
                .join("  ")
        };
        let rules: Vec<String> = widths.iter().map(|&w| "-".repeat(w)).collect();
        let mut out = vec![self.title.clone(), line(strs(&self.columns))];
        out.push(line(strs(&rules)));
        out.extend(self.rows.iter().map(|r| line(strs(r))));
        out.join("\n")
    }

    pub fn markdown(&self) -> String {
        let line = |cells: Vec<&str>| format!("| {} |", cells.join(" | "));
        let mut align = vec![":---"];
        align.resize(self.columns.len(), "---:");
        let mut out = vec![format!("**{}**", self.title), String::new()];
        out.push(line(strs(&self.columns)));
        out.push(line(align));
        out.extend(self.rows.iter().map(|r| line(strs(r))));
        out.join("\n")
    }
}

fn strs(cells: &[String]) -> Vec<&str> {
    cells.iter().map(String::as_str).collect()
}

/// 123456 as 123,456.
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}
