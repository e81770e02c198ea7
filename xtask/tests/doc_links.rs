//! Every relative link in README.md and docs/*.md leads somewhere: its file
//! exists, and its `#anchor` is a heading of that file (as GitHub makes
//! anchors of headings). Documentation rots through its links first.

use std::{
    collections::HashSet,
    path::{Path, PathBuf},
};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// README.md and every docs/*.md.
fn documents() -> Vec<PathBuf> {
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    docs.insert(0, root().join("README.md"));
    docs
}

/// `text` with its fenced code blocks' lines emptied (so that line numbers
/// stay) and its code spans blanked (a run of backticks up to the next run
/// of as many, which may be on a later line): what code shows is never
/// taken for a link or a heading.
fn prose(text: &str) -> String {
    let mut fence: Option<&str> = None;
    let mut lines = Vec::new();
    for line in text.lines() {
        let trimmed = line.trim_start();
        let marker = ["```", "~~~"].into_iter().find(|m| trimmed.starts_with(m));
        lines.push(match (fence, marker) {
            (None, Some(m)) => {
                fence = Some(m);
                ""
            }
            (Some(open), Some(m)) if open == m && trimmed.trim_end() == m => {
                fence = None;
                ""
            }
            (None, None) => line,
            _ => "",
        });
    }
    without_code(&lines.join("\n"))
}

/// The length of the run of backticks at the start of `s`.
fn backticks(s: &str) -> usize {
    s.len() - s.trim_start_matches('`').len()
}

fn without_code(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while let Some(c) = text[i..].chars().next() {
        if c != '`' {
            out.push(c);
            i += c.len_utf8();
            continue;
        }
        let run = backticks(&text[i..]);
        let mut j = i + run;
        let close = loop {
            let Some(k) = text[j..].find('`') else {
                break None;
            };
            let n = backticks(&text[j + k..]);
            if n == run {
                break Some(j + k);
            }
            j += k + n;
        };
        match close {
            Some(k) => {
                let blank = |c: char| if c == '\n' { '\n' } else { ' ' };
                out.extend(text[i..k + run].chars().map(blank));
                i = k + run;
            }
            None => {
                out.push_str(&text[i..i + run]);
                i += run;
            }
        }
    }
    out
}

/// The targets of the inline links `[text](target)` in `text`.
fn link_targets(text: &str) -> Vec<String> {
    let mut targets = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        let mut depth = 0;
        let end = after.char_indices().find_map(|(i, c)| match c {
            '(' => {
                depth += 1;
                None
            }
            ')' if depth == 0 => Some(i),
            ')' => {
                depth -= 1;
                None
            }
            _ => None,
        });
        let Some(end) = end else { break };
        let target = after[..end].split_whitespace().next().unwrap_or("");
        targets.push(target.to_string());
        rest = &after[end..];
    }
    targets
}

/// GitHub's anchor for a heading: lower case, spaces to hyphens, every
/// other character but letters, digits, `-` and `_` dropped.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .chars()
        .flat_map(char::to_lowercase)
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a document's headings; a repeated one gets `-1`, `-2`, ….
fn anchors(text: &str) -> HashSet<String> {
    let mut seen = HashSet::new();
    // Headings from the text outside fences, read whole: code in a heading
    // keeps its words in the anchor.
    let outside = prose(text);
    for (line, _) in text
        .lines()
        .zip(outside.lines())
        .filter(|(_, p)| !p.is_empty())
    {
        let hashes = line.len() - line.trim_start_matches('#').len();
        if !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
            continue;
        }
        let base = slug(line[hashes..].trim().trim_end_matches('#'));
        let mut anchor = base.clone();
        let mut n = 0;
        while seen.contains(&anchor) {
            n += 1;
            anchor = format!("{base}-{n}");
        }
        seen.insert(anchor);
    }
    seen
}

/// What is wrong with each relative link of the document at `path`
/// (whose text is `text`): "file:line: why".
fn broken_links(path: &Path, text: &str) -> Vec<String> {
    let here = path.parent().unwrap();
    let name = path
        .strip_prefix(root())
        .unwrap_or(path)
        .display()
        .to_string();
    let mut broken = Vec::new();
    for (i, line) in prose(text).lines().enumerate() {
        let number = i + 1;
        for target in link_targets(line) {
            let external = target.contains("://") || target.starts_with("mailto:");
            if external {
                continue;
            }
            let (file, anchor) = target.split_once('#').unwrap_or((&target, ""));
            let linked = if file.is_empty() {
                path.to_path_buf()
            } else {
                here.join(file)
            };
            if target.is_empty() || !linked.exists() {
                broken.push(format!("{name}:{number}: {target}: no such file"));
                continue;
            }
            if anchor.is_empty() {
                continue;
            }
            let linked_text = if file.is_empty() {
                text.to_string()
            } else {
                std::fs::read_to_string(&linked).unwrap_or_default()
            };
            if linked.extension().is_none_or(|e| e != "md")
                || !anchors(&linked_text).contains(anchor)
            {
                broken.push(format!(
                    "{name}:{number}: {target}: no heading with anchor #{anchor}"
                ));
            }
        }
    }
    broken
}

#[test]
fn every_relative_link_and_anchor_resolves() {
    let docs = documents();
    assert!(docs.len() > 1, "README.md and docs/*.md: {docs:?}");
    let broken: Vec<String> = docs
        .iter()
        .flat_map(|p| broken_links(p, &std::fs::read_to_string(p).unwrap()))
        .collect();
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// The checker itself: it finds a missing file, a missing anchor, and
/// leaves links inside code alone.
#[test]
fn a_broken_link_is_found() {
    let readme = root().join("README.md");
    let text = "# Title: `the` one\n\n\
                [ok](#title-the-one) [ok](docs/policy.md#the-rules)\n\
                [gone](docs/none.md) [no anchor](#nowhere)\n\
                `[code](nowhere.md)` and\n```\n[fenced](nowhere.md)\n```\n";
    let broken = broken_links(&readme, text);
    assert_eq!(
        broken,
        [
            "README.md:4: docs/none.md: no such file",
            "README.md:4: #nowhere: no heading with anchor #nowhere"
        ]
    );
    assert_eq!(slug("Quick start 1: the lab"), "quick-start-1-the-lab");
    assert_eq!(
        slug("From OpenSM's partitions.conf"),
        "from-opensms-partitionsconf"
    );
    assert_eq!(
        anchors("# A\n## A\n")
            .into_iter()
            .collect::<std::collections::BTreeSet<_>>(),
        ["a", "a-1"].into_iter().map(String::from).collect()
    );
}
