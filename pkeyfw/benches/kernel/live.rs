//! The real receive path: frames made in the kernel (the test kit's
//! generator: BPF_PROG_TEST_RUN in live-frames mode, redirecting a template
//! frame into a veth, as xdp-trafficgen sends) and received on the peer,
//! side by side with no program, the empty program, the minimal partition
//! check, pkeyfw and the nftables rule a user would write by hand, the
//! receiver on the generator's CPU and on one of its own (`cpus`). Each
//! rate is what the receiver handled, as its own counters tell, and each
//! verdict is checked there.

mod cpus;

use std::{process::Command, time::Duration};

use anyhow::{Context as _, Result, bail, ensure};
use aya::programs::XdpMode;
use pkeyfw::{loading::filter::Filter, policy::Policy};
use pkeyfw_common::{Reason, Verdict};
use pkeyfw_testkit::{
    baseline::{self, Baseline, Generator},
    netns::{self, VethPair},
};
use serde::Serialize;

pub use self::cpus::Cpus;

/// Frames per timed run: a few hundred ms at the rates of this path.
pub const FRAMES: u32 = 1_000_000;
/// Frames per live-frames batch: the kernel's default, well under veth's
/// ring of 256, so that no frame is lost between flushes.
pub const BATCH: u32 = 64;
/// Runs per row; the median is reported.
pub const ROUNDS: usize = 5;
/// The bench's namespaces `pklive-a`/`pklive-b` and veths `pklivea`/`pkliveb`.
const TAG: &str = "pklive";
/// The nftables table of the nftables rows.
const NFT_TABLE: &str = "pkeyfw_bench";

/// One row: the receiver's rate for one frame in one CPU arrangement.
#[derive(Serialize)]
pub struct Rate {
    pub name: String,
    /// What the receiving veth has attached.
    pub attached: String,
    pub cpus: Cpus,
    /// Frames the receiver handled in the median run (and counted with the
    /// verdict), of [`FRAMES`] sent.
    pub delivered: u64,
    /// Median of the runs: delivered frames per second, in millions.
    pub mpps: f64,
    /// Median of the runs: wall-clock ns per delivered frame (with shared
    /// CPUs, the generator's share included).
    pub ns: f64,
    /// What the rate is: the receiver's, when it handled fewer frames than
    /// were sent (veth's ring was full; isolated CPUs only); the
    /// generator's, when it handled them all on a CPU of its own; both
    /// together on a shared CPU.
    pub limited_by: Limit,
}

#[derive(Clone, Copy, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Limit {
    Receiver,
    Generator,
    Both,
}

/// Lost frames above this share of those sent: the receiver could not
/// keep up.
const LOST_BY_RECEIVER: u64 = 100;

/// What the receiving end runs.
enum Receiver {
    /// No program: frames go to the stack (GRO on, for veth's NAPI).
    Stack,
    /// A program of the baseline object: the empty one, or the minimal check.
    Baseline(Baseline),
    Pkeyfw(Box<Filter>),
    /// The netdev ingress chain of [`nft_ruleset`].
    Nftables,
}

/// Benchmarks every receiver in namespaces of its own, removed on return
/// (the veth pair's drop). `pass` and `refused` are RoCE v2 frames that
/// `policy` passes and refuses for a P_Key violation; `filter` is a loaded
/// filter with `policy` applied; `baseline` the baseline object's bytes.
pub fn bench(
    policy: &Policy,
    filter: Filter,
    baseline: &[u8],
    pass: &[u8],
    refused: &[u8],
) -> Result<Vec<Rate>> {
    let pair = VethPair::create(TAG)?;
    // veth's ndo_xdp_xmit needs the peer's NAPI: an XDP program enables
    // it, and so does GRO, which the rows without a program need. On in
    // every row, so that a passed frame takes the same path after XDP.
    in_ns(&pair.ns_b, "ethtool", &["-K", &pair.b, "gro", "on"], None)?;
    let ifindex = netns::in_netns(&pair.ns_a, || netns::if_index(&pair.a))??;
    let generator = Generator::load(baseline, ifindex)?;
    let qps = policy.qps.len();
    let pkeys = policy.qps.iter().map(|(&qpn, qp)| (qpn, qp.pkey));
    let receivers = [
        (Receiver::Stack, "nothing (GRO on)".to_string()),
        (
            Receiver::Baseline(Baseline::empty(baseline)?),
            "XDP_PASS program, native".to_string(),
        ),
        (
            Receiver::Baseline(Baseline::minimal(baseline, pkeys)?),
            format!("minimal check, native; {qps} QPs"),
        ),
        (
            Receiver::Pkeyfw(Box::new(filter)),
            format!("pkeyfw XDP, native; {qps} QPs"),
        ),
        (
            Receiver::Nftables,
            format!("netdev ingress chain; set of {qps} DestQP . P_Key"),
        ),
    ];
    let mut rates = Vec::new();
    for (mut receiver, attached) in receivers {
        receiver.attach(&pair, policy)?;
        let frames: &[(&str, &[u8], bool)] = match &receiver {
            Receiver::Stack => &[("no program", pass, true)],
            Receiver::Baseline(b) if b.name() == baseline::EMPTY => {
                &[("empty program", pass, true)]
            }
            Receiver::Baseline(_) => &[
                ("minimal check: pass", pass, true),
                ("minimal check: refused", refused, false),
            ],
            Receiver::Pkeyfw(_) => &[
                ("pkeyfw: pass (ok RC)", pass, true),
                ("pkeyfw: refused (pkey_violation)", refused, false),
            ],
            Receiver::Nftables => &[
                ("nftables: pass", pass, true),
                ("nftables: refused", refused, false),
            ],
        };
        for cpus in Cpus::ALL {
            arrange(&pair, &generator, cpus, frames[0].1)?;
            for &(name, frame, passes) in frames {
                let mut runs = Vec::with_capacity(ROUNDS);
                for _ in 0..ROUNDS {
                    let one = run(&pair, &generator, &receiver, frame, passes, cpus);
                    runs.push(one.with_context(|| format!("{name}, {} CPUs", cpus.name()))?);
                }
                runs.sort_by(|a, b| a.1.total_cmp(&b.1));
                let (delivered, mpps) = runs[ROUNDS / 2];
                let lost = u64::from(FRAMES) - delivered;
                rates.push(Rate {
                    name: name.to_string(),
                    attached: attached.clone(),
                    cpus,
                    delivered,
                    mpps,
                    ns: 1e3 / mpps,
                    limited_by: match cpus {
                        Cpus::Shared => Limit::Both,
                        Cpus::Isolated if lost * LOST_BY_RECEIVER > u64::from(FRAMES) => {
                            Limit::Receiver
                        }
                        Cpus::Isolated => Limit::Generator,
                    },
                });
            }
        }
    }
    Ok(rates)
}

/// Frames of the untimed run that follows an arrangement.
const WARM_UP: u32 = 10_000;
/// Arrangements tried before the bench gives up on a receiver.
const ARRANGE_TRIES: usize = 3;

/// Arranges the CPUs and warms the receiver up with `frame`. A threaded
/// NAPI just switched on has been seen to handle no frame at all (1 run in
/// a few, on Linux 6.18): one that handled none of the warm-up's is
/// switched off and arranged anew.
fn arrange(pair: &VethPair, generator: &Generator, cpus: Cpus, frame: &[u8]) -> Result<()> {
    for _ in 0..ARRANGE_TRIES {
        cpus.arrange(pair)?;
        let before = veth_counts(pair)?.packets;
        netns::in_netns(&pair.ns_a, || {
            cpus::pin_generator()?;
            generator.send(frame, WARM_UP, BATCH)
        })??;
        if settled(pair)?.packets > before {
            return Ok(());
        }
        Cpus::Shared.arrange(pair)?;
    }
    bail!(
        "{} handled no frame in {ARRANGE_TRIES} arrangements ({} CPUs)",
        pair.b,
        cpus.name()
    )
}

/// One timed run: (frames delivered, Mpps). With the receiver on a CPU of
/// its own, veth drops what its ring cannot take while the receiver lags:
/// then the rate is the receiver's.
fn run(
    pair: &VethPair,
    generator: &Generator,
    receiver: &Receiver,
    frame: &[u8],
    passes: bool,
    cpus: Cpus,
) -> Result<(u64, f64)> {
    let before = (veth_counts(pair)?, receiver.verdicts(pair, passes)?);
    let took = netns::in_netns(&pair.ns_a, || {
        cpus::pin_generator()?;
        generator.send(frame, FRAMES, BATCH)
    })??;
    let veth = settled(pair)?;
    let delivered = veth.packets - before.0.packets;
    let dropped_by_xdp = veth.xdp_drops - before.0.xdp_drops;
    let verdicts = receiver.verdicts(pair, passes)? - before.1;
    // Only a receiver on a CPU of its own can fall behind.
    let least = match cpus {
        Cpus::Shared => u64::from(FRAMES) * 9 / 10,
        Cpus::Isolated => u64::from(FRAMES) / 100,
    };
    ensure!(
        delivered > least,
        "the receiver handled {delivered} of {FRAMES} frames"
    );
    ensure!(
        verdicts == delivered,
        "{delivered} frames delivered, {verdicts} counted with the expected verdict"
    );
    let xdp_drops = if passes || matches!(receiver, Receiver::Nftables) {
        0
    } else {
        delivered
    };
    ensure!(
        dropped_by_xdp == xdp_drops,
        "veth counted {dropped_by_xdp} XDP drops, expected {xdp_drops}"
    );
    Ok((delivered, delivered as f64 / took.as_secs_f64() / 1e6))
}

impl Receiver {
    /// Attaches to the receiving veth.
    fn attach(&mut self, pair: &VethPair, policy: &Policy) -> Result<()> {
        let b = &pair.b;
        match self {
            Receiver::Stack => Ok(()),
            Receiver::Baseline(baseline) => netns::in_netns(&pair.ns_b, || baseline.attach(b))?,
            Receiver::Pkeyfw(filter) => {
                netns::in_netns(&pair.ns_b, || filter.attach(b, XdpMode::Driver))?
            }
            Receiver::Nftables => {
                in_ns(
                    &pair.ns_b,
                    "nft",
                    &["-f", "-"],
                    Some(&nft_ruleset(b, policy)),
                )?;
                Ok(())
            }
        }
    }

    /// Frames the receiver counted with the verdict expected (`passes`);
    /// with no counter of its own, every frame veth's queue handled.
    fn verdicts(&self, pair: &VethPair, passes: bool) -> Result<u64> {
        match self {
            // The minimal check has no counters: veth counts its drops.
            Receiver::Stack | Receiver::Baseline(_) if passes => Ok(veth_counts(pair)?.packets),
            Receiver::Stack | Receiver::Baseline(_) => Ok(veth_counts(pair)?.xdp_drops),
            Receiver::Pkeyfw(filter) => {
                let counts = filter.maps().reasons()?;
                Ok(if passes {
                    counts.get(Reason::Ok, Verdict::Pass)
                } else {
                    counts.get(Reason::PkeyViolation, Verdict::Drop)
                })
            }
            Receiver::Nftables => {
                let [accepted, dropped] = nft_counters(&pair.ns_b)?;
                Ok(if passes { accepted } else { dropped })
            }
        }
    }
}

/// The rule a user would write by hand: the allowed DestQP . P_Key pairs
/// in a set, matched on the raw BTH bits after the UDP header (`@th` is
/// the transport header: 8 bytes of UDP, then the BTH, whose P_Key is
/// bytes 2-3 and DestQP bytes 5-7); any other RoCE v2 frame dropped.
fn nft_ruleset(dev: &str, policy: &Policy) -> String {
    let elements: Vec<String> = policy
        .qps
        .iter()
        .map(|(qpn, rule)| format!("{qpn} . {:#06x}", rule.pkey))
        .collect();
    format!(
        "table netdev {NFT_TABLE} {{
    set allowed {{
        typeof @th,104,24 . @th,80,16
        elements = {{ {} }}
    }}
    chain ingress {{
        type filter hook ingress device \"{dev}\" priority 0; policy accept;
        udp dport 4791 @th,104,24 . @th,80,16 @allowed counter accept
        udp dport 4791 counter drop
    }}
}}
",
        elements.join(", ")
    )
}

/// The packet counters of the ingress chain's two rules: [accept, drop].
fn nft_counters(ns: &str) -> Result<[u64; 2]> {
    let out = in_ns(
        ns,
        "nft",
        &["-j", "list", "chain", "netdev", NFT_TABLE, "ingress"],
        None,
    )?;
    let json: serde_json::Value = serde_json::from_str(&out).context("nft -j output")?;
    let counters: Vec<u64> = json["nftables"]
        .as_array()
        .context("nft -j: no nftables array")?
        .iter()
        .filter_map(|item| item["rule"]["expr"].as_array())
        .filter_map(|expr| expr.iter().find_map(|e| e["counter"]["packets"].as_u64()))
        .collect();
    match counters[..] {
        [accepted, dropped] => Ok([accepted, dropped]),
        _ => bail!("expected two rule counters in {NFT_TABLE}, found {counters:?}"),
    }
}

/// Runs `program ARGS` in namespace `ns`, with `input` on its standard
/// input, and returns its standard output (the bench installs the tools it
/// runs: nftables, ethtool).
fn in_ns(ns: &str, program: &str, args: &[&str], input: Option<&str>) -> Result<String> {
    use std::{io::Write as _, process::Stdio};
    let mut child = Command::new("ip")
        .args(["netns", "exec", ns, program])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("running {program} (cargo xtask bench installs it)"))?;
    if let Some(text) = input {
        child
            .stdin
            .take()
            .expect("piped")
            .write_all(text.as_bytes())?;
    }
    drop(child.stdin.take());
    let out = child.wait_with_output()?;
    ensure!(
        out.status.success(),
        "{program} {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// veth's counters of the receiving queue (`ethtool -S`).
#[derive(Clone, Copy)]
struct VethCounts {
    /// Frames the queue's NAPI handled, whatever became of them.
    packets: u64,
    /// Frames an XDP program dropped.
    xdp_drops: u64,
}

fn veth_counts(pair: &VethPair) -> Result<VethCounts> {
    let out = in_ns(&pair.ns_b, "ethtool", &["-S", &pair.b], None)?;
    let stat = |name: &str| -> Result<u64> {
        out.lines()
            .find_map(|l| l.trim().strip_prefix(name)?.strip_prefix(':'))
            .with_context(|| format!("ethtool -S {}: no {name}", pair.b))?
            .trim()
            .parse()
            .with_context(|| format!("ethtool -S {}: {name}", pair.b))
    };
    Ok(VethCounts {
        packets: stat("rx_queue_0_xdp_packets")?,
        xdp_drops: stat("rx_queue_0_xdp_drops")?,
    })
}

/// veth's counters once the last frames of a run have been handled (NAPI
/// may finish a run's last batch after the test run returns).
fn settled(pair: &VethPair) -> Result<VethCounts> {
    let mut last = veth_counts(pair)?;
    loop {
        std::thread::sleep(Duration::from_millis(20));
        let now = veth_counts(pair)?;
        if now.packets == last.packets {
            return Ok(now);
        }
        last = now;
    }
}
