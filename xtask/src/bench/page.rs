//! The figures of the benchmarks page (`docs/benchmarks.md`), rendered from
//! the committed bench document (`docs/bench.json`) between two markers.

use std::path::PathBuf;

use anyhow::{Context as _, Result};
use serde_json::Value;

use super::render;
use crate::cmd;

const BEGIN: &str = "<!-- bench:begin (cargo xtask bench-readme renders docs/bench.json) -->\n";
const END: &str = "<!-- bench:end -->";

/// The committed document the page's figures come from.
pub fn document_path() -> PathBuf {
    cmd::root().join("docs/bench.json")
}

fn page_path() -> PathBuf {
    cmd::root().join("docs/benchmarks.md")
}

/// `cargo xtask bench-readme`: rewrites the page's figures from the
/// committed document.
pub fn run() -> Result<()> {
    let path = page_path();
    let page = std::fs::read_to_string(&path)?;
    std::fs::write(&path, with_figures(&page, &document()?)?)
        .with_context(|| format!("writing {}", path.display()))
}

fn document() -> Result<Value> {
    let path = document_path();
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

/// `page` with the text between the markers replaced by `doc`'s figures.
fn with_figures(page: &str, doc: &Value) -> Result<String> {
    let start = page
        .find(BEGIN)
        .context("docs/benchmarks.md has no bench:begin marker")?
        + BEGIN.len();
    let end = start
        + page[start..]
            .find(END)
            .context("docs/benchmarks.md has no bench:end marker")?;
    Ok(format!(
        "{}{}\n{}",
        &page[..start],
        render::markdown(doc)?,
        &page[end..]
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The benchmarks page shows exactly what the committed document
    /// holds: after a bench run, `cargo xtask bench --json docs/bench.json`
    /// then `cargo xtask bench-readme`.
    #[test]
    fn the_pages_figures_are_the_committed_documents() {
        let page = std::fs::read_to_string(page_path()).unwrap();
        let rendered = with_figures(&page, &document().unwrap()).unwrap();
        assert!(
            page == rendered,
            "docs/benchmarks.md's figures differ from docs/bench.json: run `cargo xtask bench-readme`"
        );
    }
}
