//! The labs behind `pkeyfw lab` (its command, with the arguments, is
//! `cmd::lab`): this one, [`switch`] and [`rxe`].
//!
//! `pkeyfw lab`: a self-contained RoCE partition lab. Two network namespaces
//! joined by a veth pair; `pkeyfw attach` (native XDP) on the receiving end
//! with the four-QP partition example as policy; real RoCE v2 frames (valid IP/UDP
//! headers, BTH, DETH, ICRC) sent from the other end, one case at a time. For
//! each case the table shows what the rules expect and what happened: whether
//! the frame crossed the veth (a packet socket past XDP) and which counter
//! moved. Everything is removed at the end, also on failure or Ctrl-C.

pub mod rxe;
pub mod scenario;
pub mod switch;

use std::{
    io::{BufRead as _, BufReader},
    process::{Child, Command, Stdio},
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use pkeyfw_common::Reason;
use pkeyfw_testkit::netns::{self, VethPair};

use crate::{
    host::netlink::XdpMode, loading::maps::Maps, loading::pins::Pins, reporting::describe,
    reporting::snapshot::Snapshot,
};

/// Set by SIGINT/SIGTERM: stop after the current case and clean up.
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

fn catch_signals() {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only stores to an atomic.
        unsafe { libc::signal(sig, on_signal as *const () as libc::sighandler_t) };
    }
}

/// The foreground `pkeyfw attach` of the lab, stopped on drop.
struct Attach(Child);

impl Drop for Attach {
    fn drop(&mut self) {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        let _ = self.0.wait();
    }
}

/// What one case did.
struct Observed {
    crossed: bool,
    reason: Option<Reason>,
}

/// Runs the lab's cases over the veth pair; `Ok(true)` when every case went
/// as the rules say.
pub fn veth() -> Result<bool> {
    // SAFETY: no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("the lab creates network namespaces and attaches XDP; run it as root");
    }
    catch_signals();
    // Per process, so that two labs (or a lab and the tests) never collide.
    let pair = VethPair::create(&format!("pkeyfw-lab{}", std::process::id() % 10000))?;
    let dir = std::env::temp_dir().join(format!("pkeyfw-lab-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let result = run_in(&pair, &dir);
    let _ = std::fs::remove_dir_all(&dir);
    let _ = netns::in_netns(&pair.ns_b, || Pins::of(&pair.b).remove());
    drop(pair);
    result
}

fn run_in(pair: &VethPair, dir: &std::path::Path) -> Result<bool> {
    let policy = dir.join("lab.toml");
    std::fs::write(&policy, scenario::POLICY)?;
    println!(
        "pkeyfw lab: {} ⟷ {} (namespaces {} ⟷ {})",
        pair.a, pair.b, pair.ns_a, pair.ns_b
    );
    let mut child = Command::new("nsenter")
        .arg(format!("--net={}", VethPair::netns_path(&pair.ns_b)))
        .arg(std::env::current_exe()?)
        .args([
            "attach",
            &pair.b,
            "--mode",
            "native",
            "--log-rate",
            "0",
            "--policy",
        ])
        .arg(&policy)
        .stdout(Stdio::piped())
        .spawn()
        .context("starting pkeyfw attach")?;
    let mut first = String::new();
    BufReader::new(child.stdout.as_mut().expect("piped")).read_line(&mut first)?;
    let _attach = Attach(child);
    if !first.contains("attached to") {
        bail!("pkeyfw attach did not attach");
    }
    print!("{first}");
    let maps = Maps::from_pins(&netns::in_netns(&pair.ns_b, || Pins::of(&pair.b))?.dir)?;

    let cases = scenario::cases();
    let mut rows = Vec::new();
    for case in &cases {
        if STOP.load(Ordering::Relaxed) {
            bail!("interrupted");
        }
        rows.push(observe(pair, &maps, &case.packet.bytes())?);
    }
    let all_ok = table(&cases, &rows);
    println!();
    Snapshot::read(&pair.b, XdpMode::Native, false, &maps)?.text(&mut std::io::stdout().lock())?;
    Ok(all_ok)
}

/// Sends one frame and sees whether it crossed and which counter moved.
fn observe(pair: &VethPair, maps: &Maps, frame: &[u8]) -> Result<Observed> {
    let before = maps.reasons()?;
    let (sent, got) =
        netns::capture_during(&pair.ns_b, &pair.b, Duration::from_millis(150), || {
            netns::send(&pair.ns_a, &pair.a, &[frame.to_vec()])
        })?;
    sent?;
    let deadline = Instant::now() + Duration::from_secs(2);
    let reason = loop {
        let after = maps.reasons()?;
        if let Some(r) = Reason::ALL
            .into_iter()
            .find(|&r| after.total(r) > before.total(r))
        {
            break Some(r);
        }
        if Instant::now() > deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    Ok(Observed {
        crossed: got.iter().any(|f| f == frame),
        reason,
    })
}

fn verdict(pass: bool) -> &'static str {
    if pass { "pass" } else { "drop" }
}

/// Prints the table; whether every case matched.
fn table(cases: &[scenario::Case], rows: &[Observed]) -> bool {
    let header = [
        "#",
        "sender (P_Key, Q_Key)",
        "receiver",
        "receiver's keys",
        "expected",
        "observed",
    ];
    println!(
        "\n {:>2}  {:<28} {:<19} {:<24} {:<21} {:<21} rule",
        header[0], header[1], header[2], header[3], header[4], header[5]
    );
    let mut all_ok = true;
    for (i, (c, o)) in cases.iter().zip(rows).enumerate() {
        let expected = format!("{} {}", verdict(c.pass), c.reason.name());
        let observed = format!(
            "{} {}",
            verdict(o.crossed),
            o.reason.map_or("(no count)", Reason::name)
        );
        let ok = o.crossed == c.pass && o.reason == Some(c.reason);
        all_ok &= ok;
        println!(
            " {:>2}  {:<28} {:<19} {:<24} {:<21} {:<21} {} {}",
            i + 1,
            c.from,
            c.to,
            c.receiver,
            expected,
            observed,
            if ok { "✓" } else { "✗" },
            c.why
        );
    }
    let matched = rows
        .iter()
        .zip(cases)
        .filter(|(o, c)| o.crossed == c.pass && o.reason == Some(c.reason))
        .count();
    println!(
        "\n{matched} of {} cases as the partition rules say. P_Key {} and {} can talk; two limited members cannot.",
        cases.len(),
        describe::pkey(0x8001),
        describe::pkey(0x0001)
    );
    all_ok
}
