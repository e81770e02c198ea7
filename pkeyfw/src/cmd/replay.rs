//! `pkeyfw replay`: what a policy would do to captured traffic, decided by the
//! real XDP program in the kernel.

use std::{
    io::Write,
    path::{Path, PathBuf},
};

use anyhow::Result;
use pkeyfw_common::{Reason, Verdict};
use serde_json::json;

use super::PortArgs;
use crate::{
    capture,
    loading::{filter::Filter, maps::ReasonCounts},
    policy::Policy,
    reporting::describe,
};

/// Run a capture through the XDP program in the kernel (BPF_PROG_TEST_RUN)
/// and print each frame's verdict and reason, then totals per reason.
///
/// Nothing is attached to any interface. Needs root.
#[derive(clap::Args)]
pub struct ReplayArgs {
    /// Partition policy (TOML).
    #[arg(long, value_name = "FILE")]
    pub policy: PathBuf,
    /// A pcap or pcapng capture (Ethernet or Linux cooked link type).
    pub capture: PathBuf,
    /// One JSON object per frame, then one with the totals.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub port: PortArgs,
}

pub fn run(args: &ReplayArgs) -> Result<()> {
    let policy = Policy::load_for(&args.policy, args.port.guid()?)?;
    replay(
        &policy,
        &args.capture,
        args.json,
        &mut std::io::stdout().lock(),
    )?;
    Ok(())
}

/// Bytes of an Ethernet header.
const ETH_HLEN: usize = 14;

/// The verdict the kernel gave one frame.
pub struct FrameVerdict {
    pub index: usize,
    pub pass: bool,
    pub reason: Reason,
}

/// Totals over a replay.
#[derive(Default)]
pub struct Totals {
    pub reasons: ReasonCounts,
    pub passed: u64,
    pub dropped: u64,
}

impl Totals {
    fn add(&mut self, v: &FrameVerdict, verdict: Verdict) {
        self.reasons.add(v.reason, verdict);
        if v.pass {
            self.passed += 1;
        } else {
            self.dropped += 1;
        }
    }

    pub fn json(&self) -> serde_json::Value {
        let reasons = describe::reasons_json(&self.reasons);
        json!({
            "totals": reasons,
            "frames": self.passed + self.dropped,
            "passed": self.passed,
            "dropped": self.dropped,
        })
    }
}

pub fn verdict_name(pass: bool) -> &'static str {
    if pass { "pass" } else { "drop" }
}

/// Runs every frame of `capture` through the program with `policy` applied,
/// writing one line (or JSON object) per frame and then the totals.
pub fn replay(policy: &Policy, capture: &Path, json: bool, out: &mut impl Write) -> Result<Totals> {
    let frames = capture::read(capture)?;
    let mut filter = Filter::load_for(policy)?;
    filter.apply(policy)?;
    let mut totals = Totals::default();
    let mut cut = 0;
    if !json {
        writeln!(
            out,
            "{:>6}  {:<7} {:<16} frame",
            "index", "verdict", "reason"
        )?;
    }
    let mut runts = Vec::new();
    let progress = crate::reporting::progress::bar(frames.len() as u64, "replaying");
    for frame in &frames {
        progress.inc(1);
        // No driver hands XDP a frame shorter than its Ethernet header, and
        // BPF_PROG_TEST_RUN refuses one.
        if frame.data.len() < ETH_HLEN {
            runts.push(frame.index);
            continue;
        }
        let (counted, reason) = filter.run_verdict(&frame.data)?;
        let pass = counted != Verdict::Drop;
        let verdict = FrameVerdict {
            index: frame.index,
            pass,
            reason,
        };
        totals.add(&verdict, counted);
        cut += usize::from(frame.wire_len > frame.data.len());
        if json {
            let line = json!({
                "index": verdict.index,
                "verdict": verdict_name(pass),
                "reason": reason.name(),
            });
            writeln!(out, "{line}")?;
        } else {
            writeln!(
                out,
                "{:>6}  {:<7} {:<16} {}",
                verdict.index,
                verdict_name(pass),
                reason.name(),
                describe::frame(&frame.data)
            )?;
        }
    }
    progress.finish_and_clear();
    if json {
        writeln!(out, "{}", totals.json())?;
    } else {
        writeln!(
            out,
            "\n{} frames: {} passed, {} dropped",
            totals.passed + totals.dropped,
            totals.passed,
            totals.dropped
        )?;
        describe::reasons_text(&totals.reasons, out)?;
    }
    if !runts.is_empty() {
        eprintln!(
            "warning: frames {runts:?} are shorter than an Ethernet header ({ETH_HLEN} bytes); no XDP program sees such frames, so they were not run"
        );
    }
    if cut > 0 {
        eprintln!(
            "warning: {cut} frames were cut short by the capture's snap length; they were judged as captured"
        );
    }
    Ok(totals)
}
