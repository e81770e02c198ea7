//! Progress on long work (a large replay, the bench): a bar on a terminal,
//! nothing at all where standard error is not one (a CI log, a pipe).

use std::{io::IsTerminal as _, time::Duration};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A bar of `len` steps saying `what`, on standard error if it is a
/// terminal, else hidden (its calls then cost next to nothing).
pub fn bar(len: u64, what: &str) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
    let style = ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len} {elapsed}")
        .map(|s| s.progress_chars("=> "))
        .unwrap_or_else(|_| ProgressStyle::default_bar());
    bar.set_style(style);
    bar.set_message(what.to_string());
    bar.enable_steady_tick(Duration::from_millis(200));
    bar
}

#[cfg(test)]
mod tests {
    /// Under `cargo test` standard error is captured, not a terminal: the
    /// bar draws nothing, whatever is done with it.
    #[test]
    fn a_bar_off_a_terminal_is_hidden() {
        let bar = super::bar(10, "testing");
        bar.inc(3);
        assert!(bar.is_hidden());
        bar.finish_and_clear();
    }
}
