//! The README's Benchmarks figures, rendered from the committed bench
//! document (`docs/bench.json`) between two markers.

use std::path::PathBuf;

use anyhow::{Context as _, Result};
use serde_json::Value;

use super::render;
use crate::cmd;

const BEGIN: &str = "<!-- bench:begin (cargo xtask bench-readme renders docs/bench.json) -->\n";
const END: &str = "<!-- bench:end -->";

/// The committed document the README's figures come from.
pub fn document_path() -> PathBuf {
    cmd::root().join("docs/bench.json")
}

fn readme_path() -> PathBuf {
    cmd::root().join("README.md")
}

/// `cargo xtask bench-readme`: rewrites the README's figures from the
/// committed document.
pub fn run() -> Result<()> {
    let path = readme_path();
    let readme = std::fs::read_to_string(&path)?;
    std::fs::write(&path, with_figures(&readme, &document()?)?)
        .with_context(|| format!("writing {}", path.display()))
}

fn document() -> Result<Value> {
    let path = document_path();
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

/// `readme` with the text between the markers replaced by `doc`'s figures.
fn with_figures(readme: &str, doc: &Value) -> Result<String> {
    let start = readme
        .find(BEGIN)
        .context("the README has no bench:begin marker")?
        + BEGIN.len();
    let end = start
        + readme[start..]
            .find(END)
            .context("the README has no bench:end marker")?;
    Ok(format!(
        "{}{}\n{}",
        &readme[..start],
        render::markdown(doc)?,
        &readme[end..]
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The README shows exactly what the committed document holds: after
    /// a bench run, `cargo xtask bench --json docs/bench.json` then
    /// `cargo xtask bench-readme`.
    #[test]
    fn readme_figures_are_the_committed_documents() {
        let readme = std::fs::read_to_string(readme_path()).unwrap();
        let rendered = with_figures(&readme, &document().unwrap()).unwrap();
        assert!(
            readme == rendered,
            "the README's Benchmarks figures differ from docs/bench.json: run `cargo xtask bench-readme`"
        );
    }
}
