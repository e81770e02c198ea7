//! What the guest labs come to, as test lines: an [`Outcome`] per lab, and
//! the protocol of the result files the guests' scripts write, one line
//! per check: `ok NAME`, or `FAILED NAME: why`.

use anyhow::{Result, bail};

/// Tests passed and failed.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    pub passed: u64,
    pub failed: u64,
}

impl Outcome {
    /// One failed test, `NAME`, printed with why.
    pub fn failed(name: &str, why: &anyhow::Error) -> Outcome {
        println!("test {name} ... FAILED: {why:#}");
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

/// The test line of each of `names` (`test PREFIX::NAME`) as `results`, a
/// script's result file, reports it: ok, FAILED with its reason, or not
/// run (which fails too).
pub fn checks<'a>(
    results: &str,
    prefix: &str,
    names: impl IntoIterator<Item = &'a str>,
) -> Outcome {
    let mut outcome = Outcome::default();
    for name in names {
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
                println!("test {prefix}::{name} ... {line}");
                outcome.failed += 1;
            }
            None => {
                println!("test {prefix}::{name} ... FAILED: not run");
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
        let results = "ok one\nFAILED two: it stalled\nok three-and-more\n";
        let o = checks(results, "lab", ["one", "two", "three", "four"]);
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
