//! What the guest labs come to, as test lines: an [`Outcome`] per lab, and
//! the protocol of the result files the guests' scripts write, one line
//! per check: `ok NAME`, or `FAILED NAME: why` (and `measure NAME VALUE`).
//! The scripts write them with [`SHELL`]'s functions, and declare their
//! checks by making each with a line `check NAME …`.

use std::{fs, path::Path, sync::Mutex};

use anyhow::{Context as _, Result, bail};

/// The scripts' half of the protocol, `/share/results.sh` in every guest.
pub const SHELL: &str = include_str!("results.sh");

/// Every failed test's line, printed again at the end of a run: CI keeps
/// only the head and the tail of a long log, and a failure's reason
/// printed amid the labs' output is lost there.
static FAILURES: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Prints the test line of `name`, failed for `why`, and keeps it for
/// [`print_failures`].
pub fn fail(name: &str, why: &str) {
    let line = format!("test {name} ... FAILED: {why}");
    println!("{line}");
    FAILURES
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(line);
}

/// The failed tests' lines so far, under one heading, if any.
pub fn print_failures() {
    let failures = FAILURES.lock().unwrap_or_else(|e| e.into_inner());
    if !failures.is_empty() {
        println!("\nfailures in the guests and the package:");
        for line in failures.iter() {
            println!("  {line}");
        }
    }
}

/// Tests passed and failed.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    pub passed: u64,
    pub failed: u64,
}

impl Outcome {
    /// One failed test, `NAME`, printed with why.
    pub fn failed(name: &str, why: &anyhow::Error) -> Outcome {
        fail(name, &format!("{why:#}"));
        Outcome {
            passed: 0,
            failed: 1,
        }
    }

    pub fn add(&mut self, other: Outcome) {
        self.passed += other.passed;
        self.failed += other.failed;
    }

    /// An error when any test failed.
    pub fn ok(self) -> Result<()> {
        if self.failed > 0 {
            bail!("{} tests in the guest failed", self.failed);
        }
        Ok(())
    }
}

/// The result file the scripts of a guest wrote into its `share`.
pub fn read(share: &Path) -> Result<String> {
    fs::read_to_string(share.join("results"))
        .context("the guest wrote no results (see its output above)")
}

/// What a guest's `scripts` came to: `read`, their result file (without
/// one, the guest fails as `name`), its `measure` lines printed after
/// `name`, and the test line of each check they declare ([`checks`]).
pub fn judge(read: Result<String>, name: &str, prefix: &str, scripts: &[&str]) -> Outcome {
    let mut outcome = Outcome::default();
    let results = read.unwrap_or_else(|e| {
        outcome.add(Outcome::failed(name, &e));
        String::new()
    });
    for line in results.lines().filter(|l| l.starts_with("measure ")) {
        println!("{name}: {line}");
    }
    outcome.add(checks(&results, prefix, scripts));
    outcome
}

/// The checks a script makes: the NAME of each of its lines `check NAME …`.
fn declared(script: &str) -> impl Iterator<Item = &str> {
    script
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("check "))
        .filter_map(|rest| rest.split_whitespace().next())
}

/// The test line (`test PREFIX::NAME`) of each check `scripts` declare, as
/// `results`, their result file, reports it: ok, FAILED with its reason,
/// or not run (which fails too).
fn checks(results: &str, prefix: &str, scripts: &[&str]) -> Outcome {
    let mut outcome = Outcome::default();
    for name in scripts.iter().flat_map(|s| declared(s)) {
        let ok = format!("ok {name}");
        let refused = format!("FAILED {name}:");
        match results
            .lines()
            .find(|l| *l == ok || l.starts_with(&refused))
        {
            Some(line) if line == ok => {
                println!("test {prefix}::{name} ... ok");
                outcome.passed += 1;
            }
            Some(line) => {
                let why = line.strip_prefix(&refused).unwrap_or(line).trim();
                fail(&format!("{prefix}::{name}"), why);
                outcome.failed += 1;
            }
            None => {
                fail(&format!("{prefix}::{name}"), "not run");
                outcome.failed += 1;
            }
        }
    }
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_check_is_ok_failed_or_not_run() {
        let script = "check one true\ncheck two stalls\nif x; then\n    check three true\nfi\n\
                      # check four: a comment\ncheck four sh -c 'check five'\n";
        assert_eq!(
            declared(script).collect::<Vec<_>>(),
            ["one", "two", "three", "four"]
        );
        let results = "ok one\nFAILED two: it stalled\nok three-and-more\n";
        let o = checks(results, "lab", &[script]);
        // "three" is not "three-and-more"; "four" never ran.
        assert_eq!(
            o,
            Outcome {
                passed: 1,
                failed: 3
            }
        );
    }
}
