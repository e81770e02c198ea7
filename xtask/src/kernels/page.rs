//! docs/kernels.md's tables, rendered from docs/kernels.json (what
//! `cargo xtask kernels --json` found on each kernel): feature × kernel,
//! scenario × kernel, and what each program costs each kernel's verifier.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};
use serde_json::Value;

use crate::{
    cmd,
    table::{Table, thousands},
};

const BEGIN: &str = "<!-- kernels:begin (cargo xtask kernels --json docs/kernels.json renders docs/kernels.json) -->\n";
const END: &str = "<!-- kernels:end -->";

/// The committed document.
pub fn document_path() -> PathBuf {
    cmd::root().join("docs/kernels.json")
}

fn page_path() -> PathBuf {
    cmd::root().join("docs/kernels.md")
}

/// Merges `rows` (kernels just run) into the document at `path`, replacing
/// a kernel's row where it had one, in the guest's kernel order; then, for
/// the committed document, rewrites the page's tables.
pub fn write(path: &Path, rows: Vec<Value>) -> Result<()> {
    let mut doc: Value = std::fs::read_to_string(path)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_else(|| serde_json::json!({ "kernels": [] }));
    let mut kernels: Vec<Value> = doc["kernels"].as_array().cloned().unwrap_or_default();
    for row in rows {
        match kernels.iter_mut().find(|k| k["name"] == row["name"]) {
            Some(k) => *k = row,
            None => kernels.push(row),
        }
    }
    let order = |k: &Value| {
        crate::guest::KERNELS
            .iter()
            .position(|g| Some(g.name) == k["name"].as_str())
            .unwrap_or(usize::MAX)
    };
    kernels.sort_by_key(order);
    doc["kernels"] = kernels.into();
    std::fs::write(path, serde_json::to_string_pretty(&doc)? + "\n")
        .with_context(|| format!("writing {}", path.display()))?;
    if path.canonicalize().ok() == document_path().canonicalize().ok() {
        let page = std::fs::read_to_string(page_path())?;
        std::fs::write(page_path(), with_tables(&page, &doc)?)?;
    }
    Ok(())
}

/// `page` with the text between the markers replaced by `doc`'s tables.
fn with_tables(page: &str, doc: &Value) -> Result<String> {
    let start = page
        .find(BEGIN)
        .context("docs/kernels.md has no kernels:begin marker")?
        + BEGIN.len();
    let end = start
        + page[start..]
            .find(END)
            .context("docs/kernels.md has no kernels:end marker")?;
    let tables: Vec<String> = tables(doc)?.iter().map(Table::markdown).collect();
    Ok(format!(
        "{}{}\n{}",
        &page[..start],
        tables.join("\n\n") + "\n",
        &page[end..]
    ))
}

fn tables(doc: &Value) -> Result<Vec<Table>> {
    let kernels = doc["kernels"]
        .as_array()
        .context("the document lists no kernels")?;
    let mut columns = vec!["".to_string()];
    columns.extend(kernels.iter().map(|k| {
        format!(
            "Linux {} ({})",
            k["name"].as_str().unwrap_or("?"),
            k["kernel"].as_str().unwrap_or("?")
        )
    }));
    // Features, in the order the first kernel lists them.
    let features: Vec<String> = kernels
        .first()
        .and_then(|k| k["features"].as_object())
        .map(|f| f.keys().cloned().collect())
        .unwrap_or_default();
    let feature_rows = features
        .iter()
        .map(|f| {
            let mut row = vec![f.clone()];
            row.extend(kernels.iter().map(|k| yes_no(&k["features"][f])));
            row
        })
        .collect();
    let mut scenario_names: Vec<String> = Vec::new();
    for k in kernels {
        for s in k["scenarios"].as_array().into_iter().flatten() {
            let name = s["name"].as_str().unwrap_or("?").to_string();
            if !scenario_names.contains(&name) {
                scenario_names.push(name);
            }
        }
    }
    let mut scenario_rows = vec![{
        let mut row = vec!["the README's lab (`pkeyfw lab`)".to_string()];
        row.extend(kernels.iter().map(|k| pass(&k["lab"])));
        row
    }];
    scenario_rows.extend(scenario_names.iter().map(|name| {
        let mut row = vec![format!("soft-RoCE `{name}`")];
        row.extend(kernels.iter().map(|k| {
            let ran = k["scenarios"]
                .as_array()
                .and_then(|s| s.iter().find(|s| s["name"] == name.as_str()));
            match ran {
                Some(s) => pass(&s["ok"]),
                // The primary kernel runs every scenario in rxe-lab.
                None if k["scenarios"].as_array().is_some_and(|s| s.is_empty()) => {
                    "in the full set".to_string()
                }
                None => "—".to_string(),
            }
        }));
        row
    }));
    let mut programs: Vec<(String, String)> = Vec::new();
    for k in kernels {
        for p in k["programs"].as_array().into_iter().flatten() {
            let key = (
                p["program"].as_str().unwrap_or("?").to_string(),
                p["role"].as_str().unwrap_or("?").to_string(),
            );
            if !programs.contains(&key) {
                programs.push(key);
            }
        }
    }
    let program_rows = programs
        .iter()
        .map(|(program, role)| {
            let mut row = vec![format!("{program} ({role} port)")];
            row.extend(kernels.iter().map(|k| {
                let found = k["programs"].as_array().and_then(|ps| {
                    ps.iter()
                        .find(|p| p["program"] == program.as_str() && p["role"] == role.as_str())
                });
                match found {
                    Some(p) => format!(
                        "{} / {:.0} ms",
                        p["verified"].as_u64().map_or("—".to_string(), thousands),
                        p["load_ms"].as_f64().unwrap_or(0.0)
                    ),
                    None => "not loaded".to_string(),
                }
            }));
            row
        })
        .collect();
    Ok(vec![
        Table {
            title: "What each kernel offers pkeyfw (`pkeyfw kernel`)".to_string(),
            columns: columns.clone(),
            rows: feature_rows,
        },
        Table {
            title: "What ran on each kernel, as tested".to_string(),
            columns: columns.clone(),
            rows: scenario_rows,
        },
        Table {
            title: "Each program: instructions the verifier processed / load time under emulation (`pkeyfw kernel --programs`; — where the kernel does not say, before 5.16)".to_string(),
            columns,
            rows: program_rows,
        },
    ])
}

fn yes_no(v: &Value) -> String {
    match v.as_bool() {
        Some(true) => "yes".to_string(),
        Some(false) => "no".to_string(),
        None => "—".to_string(),
    }
}

fn pass(v: &Value) -> String {
    match v.as_bool() {
        Some(true) => "✓".to_string(),
        Some(false) => "✗".to_string(),
        None => "—".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// docs/kernels.md shows exactly what the committed document holds:
    /// `cargo xtask kernels --json docs/kernels.json` writes both.
    #[test]
    fn the_pages_tables_are_the_committed_documents() {
        let page = std::fs::read_to_string(page_path()).unwrap();
        let doc: Value =
            serde_json::from_str(&std::fs::read_to_string(document_path()).unwrap()).unwrap();
        assert!(
            page == with_tables(&page, &doc).unwrap(),
            "docs/kernels.md's tables differ from docs/kernels.json: run `cargo xtask kernels --json docs/kernels.json`"
        );
    }
}
