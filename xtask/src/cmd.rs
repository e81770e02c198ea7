//! Running commands, loudly: each is echoed and writes to the terminal or
//! the CI log, unless long work shows [`Progress`] on a terminal.

use std::{
    fs::{self, File},
    io::IsTerminal as _,
    path::{Path, PathBuf},
    process::Command,
    sync::Mutex,
    time::Duration,
};

use anyhow::{Context as _, Result, bail};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A pinned setting from .cargo/config.toml's [env].
pub fn pinned(name: &str) -> Result<String> {
    std::env::var(name).with_context(|| format!("{name} is not set; run through `cargo xtask`"))
}

/// The workspace root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

/// Runs a command to completion, failing on a non-zero exit.
pub fn run(cmd: &mut Command) -> Result<()> {
    let shown = show(cmd);
    let progress = PROGRESS.lock().unwrap_or_else(|e| e.into_inner());
    let log = match &*progress {
        Some(p) => {
            p.bar.set_message(shown.clone());
            let log = File::options().create(true).append(true).open(&p.log)?;
            cmd.stdout(log.try_clone()?).stderr(log);
            Some(p.log.clone())
        }
        None => {
            eprintln!("+ {shown}");
            None
        }
    };
    drop(progress);
    let status = cmd
        .status()
        .with_context(|| format!("cannot start {shown}"))?;
    if !status.success() {
        if let Some(log) = log {
            let tail = tail(&log, 30);
            match &*PROGRESS.lock().unwrap_or_else(|e| e.into_inner()) {
                // Printed under the bar, which would redraw over it.
                Some(p) => p.bar.suspend(|| eprintln!("{tail}")),
                None => eprintln!("{tail}"),
            }
        }
        bail!("{shown} failed ({status})");
    }
    Ok(())
}

/// Long work's steps, as a bar on a terminal; the commands' output then goes
/// to a log file, whose end is shown if one fails. Off a terminal (CI)
/// nothing changes: no bar, and the commands write where they always did.
pub struct Progress;

/// The bar in use, and the log the commands write to meanwhile.
struct Shown {
    what: String,
    bar: ProgressBar,
    log: PathBuf,
    /// Whether a step is under way (the bar counts the finished ones).
    stepping: bool,
}

static PROGRESS: Mutex<Option<Shown>> = Mutex::new(None);

impl Progress {
    /// `steps` steps of `what`; the commands' output goes to `log`.
    pub fn start(what: &str, steps: u64, log: &Path) -> Progress {
        if std::io::stderr().is_terminal() {
            let _ = fs::remove_file(log);
            let bar = ProgressBar::with_draw_target(Some(steps), ProgressDrawTarget::stderr());
            let style = ProgressStyle::with_template(
                "{prefix} [{bar:30}] {pos}/{len} {elapsed} {wide_msg}",
            )
            .map(|s| s.progress_chars("=> "))
            .unwrap_or_else(|_| ProgressStyle::default_bar());
            bar.set_style(style);
            bar.set_prefix(what.to_string());
            bar.enable_steady_tick(Duration::from_millis(200));
            eprintln!("xtask: {what}: output in {}", log.display());
            *PROGRESS.lock().unwrap_or_else(|e| e.into_inner()) = Some(Shown {
                what: what.to_string(),
                bar,
                log: log.to_path_buf(),
                stepping: false,
            });
        }
        Progress
    }

    /// The next step begins (shown on the bar only: off a terminal the
    /// commands' echo says it).
    pub fn step(&self, what: &str) {
        if let Some(p) = &mut *PROGRESS.lock().unwrap_or_else(|e| e.into_inner()) {
            if p.stepping {
                p.bar.inc(1);
            }
            p.stepping = true;
            p.bar.set_prefix(format!("{}: {what}", p.what));
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some(p) = PROGRESS.lock().unwrap_or_else(|e| e.into_inner()).take() {
            p.bar.finish_and_clear();
        }
    }
}

/// The last `n` lines of a log.
fn tail(log: &Path, n: usize) -> String {
    let text = fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    format!(
        "… the last lines of {}:\n{}",
        log.display(),
        lines[lines.len().saturating_sub(n)..].join("\n")
    )
}

/// Runs a command and returns its standard output, or `None` if it failed.
pub fn output(cmd: &mut Command) -> Option<String> {
    let out = cmd.output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `cargo ARGS` in the workspace root, with the toolchain
/// rust-toolchain.toml pins.
pub fn cargo(args: &[&str]) -> Result<()> {
    run(cargo_cmd(args)?.current_dir(root()))
}

pub fn cargo_cmd(args: &[&str]) -> Result<Command> {
    let mut cmd = Command::new("cargo");
    cmd.args(args);
    // The outer `cargo` may have been given another toolchain (`cargo
    // +TOOLCHAIN xtask`): the workspace's pin decides.
    cmd.env_remove("RUSTUP_TOOLCHAIN");
    Ok(cmd)
}

/// The channel the rust-toolchain.toml in `dir` (relative to the
/// workspace root) pins.
pub fn toolchain(dir: &str) -> Result<String> {
    let path = root().join(dir).join("rust-toolchain.toml");
    let text = fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let file: toml::Table = text
        .parse()
        .with_context(|| format!("parsing {}", path.display()))?;
    file.get("toolchain")
        .and_then(|t| t.get("channel"))
        .and_then(|c| c.as_str())
        .map(str::to_string)
        .with_context(|| format!("{} names no toolchain.channel", path.display()))
}

fn show(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}
