//! `pkeyfw events`: the refused frames (and foreign multicast joins) of
//! running attachments, pinned ones with no other process included, as the
//! traps an InfiniBand port sends its subnet manager: 257 Bad P_Key, 258
//! Bad Q_Key. Repeats from one source past a budget per window are
//! summarised, as OpenSM ages its traps. The kernel already limits events
//! per CPU and per second; the counters (`stats`) have every frame. Ports
//! of a switch's bridge that its policy does not list are reported too
//! ([`joins`]).

mod joins;

use std::{
    collections::BTreeMap,
    net::IpAddr,
    os::{
        fd::{AsRawFd, RawFd},
        unix::net::UnixDatagram,
    },
    path::{Path, PathBuf},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use anyhow::{Context as _, Result, bail};
use aya::maps::{Map, MapData, RingBuf};
use pkeyfw_common::{
    Direction, Reason, Verdict,
    abi::{Event, EventKind, name},
};
use serde_json::json;
use tokio::{
    io::{Interest, unix::AsyncFd},
    sync::mpsc,
};

use super::NetnsArg;
use crate::reporting::describe::cli_iface;
use crate::{
    loading::{
        maps::{Maps, SuppressedCounts},
        pins::{self, Holder},
    },
    reporting::{
        describe, events,
        live::{self, Found, Live},
    },
};

/// Stream refused frames as InfiniBand traps (257 Bad P_Key, 258 Bad Q_Key).
///
/// Reads the attachments' event rings: foreground and pinned alike, so it
/// needs no other pkeyfw process. A ring has one reader: an interface
/// whose events a foreground attach or another `pkeyfw events` reads is
/// named and left to it.
#[derive(clap::Args)]
pub struct EventsArgs {
    /// Only these interfaces (default: every attachment, of every network
    /// namespace unless --netns is given).
    pub ifaces: Vec<String>,
    #[command(flatten)]
    pub netns: NetnsArg,
    /// One JSON object per event.
    #[arg(long)]
    pub json: bool,
    /// Events shown per source address per window; the rest are counted
    /// and summarised at the window's end.
    #[arg(long, value_name = "N", default_value_t = 10)]
    pub per_source: u64,
    /// The window, in seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 10)]
    pub window: u64,
    /// Also send each trap and summary line to syslog (the journal, under
    /// systemd): a datagram socket, /dev/log unless given.
    #[arg(long, value_name = "SOCKET", num_args = 0..=1, default_missing_value = "/dev/log")]
    pub syslog: Option<PathBuf>,
}

/// Lines to syslog, RFC 3164 style (`<PRI>TAG[PID]: MSG`, facility daemon,
/// severity warning: each is a refused frame or a count of them).
struct Syslog {
    socket: UnixDatagram,
    tag: String,
}

impl Syslog {
    fn open(path: &Path) -> Result<Syslog> {
        let socket = UnixDatagram::unbound()?;
        socket
            .connect(path)
            .with_context(|| format!("connecting to syslog at {}", path.display()))?;
        Ok(Syslog {
            socket,
            tag: format!("pkeyfw[{}]", std::process::id()),
        })
    }

    fn send(&self, line: &str) {
        const DAEMON_WARNING: u8 = 3 * 8 + 4;
        // A full or gone log loses the line; stdout still has it.
        let _ = self
            .socket
            .send(format!("<{DAEMON_WARNING}>{}: {line}", self.tag).as_bytes());
    }
}

/// One attachment's ring, for readiness.
struct Ring {
    iface: String,
    ring: RingBuf<MapData>,
    /// Held while reading: the right to the ring.
    _reader: std::fs::File,
}

impl AsRawFd for Ring {
    fn as_raw_fd(&self) -> RawFd {
        self.ring.as_raw_fd()
    }
}

pub fn run(args: &EventsArgs) -> Result<()> {
    let netns = args.netns.enter()?;
    pins::host_bpffs("events")?;
    // Before anything is read: a log that cannot be reached is said now.
    let syslog = args.syslog.as_deref().map(Syslog::open).transpose()?;
    let live = attachments(args, netns)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (joined, joins) = mpsc::unbounded_channel();
    if let Err(e) = joins::watch(&live, &joined, &runtime) {
        eprintln!("pkeyfw: not watching for unlisted bridge ports: {e:#}");
    }
    drop(joined);
    let mut rings = Vec::new();
    let mut held = Vec::new();
    for a in live {
        let named = cli_iface(&a.pins.iface, netns);
        let Some(reader) = a.pins.events_reader()? else {
            let who = match a.holder {
                Holder::Foreground(pid) => {
                    format!("its foreground attach (process {pid}), which prints them")
                }
                _ => "another `pkeyfw events`".to_string(),
            };
            eprintln!("pkeyfw: {named}: its events are read by {who}; not here");
            continue;
        };
        // Refused frames, and the probes' reports on a ring of their own.
        for ring in [name::EVENTS, name::REPORTS] {
            let path = a.pins.dir.join(ring);
            let map =
                MapData::from_pin(&path).with_context(|| format!("opening {}", path.display()))?;
            rings.push(Ring {
                iface: a.pins.iface.clone(),
                ring: RingBuf::try_from(Map::RingBuf(map))?,
                _reader: reader.try_clone()?,
            });
        }
        held.push(HeldBack::new(a.pins.iface.clone(), a.maps)?);
    }
    if rings.is_empty() {
        bail!("no attachment's events to read");
    }
    runtime.block_on(stream(rings, held, joins, args, syslog))
}

/// The attachments to read, once none is being set up (said once).
fn attachments(args: &EventsArgs, netns: Option<&str>) -> Result<Vec<Live>> {
    let mut said = false;
    loop {
        let mut found = Found::default();
        if args.ifaces.is_empty() {
            found = live::attachments(None, netns)?;
        }
        for i in &args.ifaces {
            let one = live::attachments(Some(i), netns)?;
            found.live.extend(one.live);
            found.setting_up.extend(one.setting_up);
        }
        if found.setting_up.is_empty() {
            return Ok(found.live);
        }
        if !said {
            for s in &found.setting_up {
                eprintln!("pkeyfw: {}; waiting", s.text());
            }
            said = true;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// What an attachment's kernel budgets held back, for the window's
/// summary: the counts last summarised.
struct HeldBack {
    iface: String,
    maps: Maps,
    seen: SuppressedCounts,
}

impl HeldBack {
    fn new(iface: String, maps: Maps) -> Result<HeldBack> {
        let seen = maps.suppressed()?;
        Ok(HeldBack { iface, maps, seen })
    }

    /// The events of each kind held back since the last call.
    fn since(&mut self) -> Result<Vec<(EventKind, u64)>> {
        let now = self.maps.suppressed()?;
        let new = EventKind::ALL
            .into_iter()
            .map(|k| (k, now[k.index() as usize] - self.seen[k.index() as usize]))
            .filter(|&(_, n)| n > 0)
            .collect();
        self.seen = now;
        Ok(new)
    }
}

async fn stream(
    rings: Vec<Ring>,
    mut held: Vec<HeldBack>,
    mut joins: mpsc::UnboundedReceiver<joins::Unlisted>,
    args: &EventsArgs,
    syslog: Option<Syslog>,
) -> Result<()> {
    let (tx, mut rx) = mpsc::unbounded_channel();
    for ring in rings {
        let tx = tx.clone();
        // SAFETY: the ring's fd is owned by the ring, which the AsyncFd
        // owns; it closes only when the AsyncFd is dropped.
        let mut fd = unsafe { AsyncFd::register_with_interest(ring, Interest::READABLE) }
            .map_err(|e| e.into_parts().1)?;
        tokio::spawn(async move {
            loop {
                let Ok(mut guard) = fd.readable_mut().await else {
                    return;
                };
                let r = guard.get_inner_mut();
                while let Some(item) = r.ring.next() {
                    if let Some(e) = events::decode(&item) {
                        let _ = tx.send((r.iface.clone(), e));
                    }
                }
                guard.clear_ready();
            }
        });
    }
    drop(tx);
    let mut budget = Budget::new(args.per_source);
    let mut window = tokio::time::interval(Duration::from_secs(args.window.max(1)));
    window.tick().await;
    let mut out = std::io::stdout().lock();
    loop {
        tokio::select! {
            got = rx.recv() => {
                let Some((iface, e)) = got else { return Ok(()) };
                // The probes' reports (no source address: `::`) are each a
                // verb, budgeted in the kernel, and not one tenant's to
                // crowd out: only refused frames meet the per-source budget.
                if !is_frame(&e) || budget.allow((e.kind, source(&e))) {
                    use std::io::Write as _;
                    writeln!(out, "{}", if args.json { trap_json(&iface, &e).to_string() } else { trap_line(&iface, &e) })?;
                    if let Some(log) = &syslog {
                        log.send(&format!("{iface} {}", trap_text(&e)));
                    }
                }
            }
            Some(u) = joins.recv() => {
                use std::io::Write as _;
                let time = rfc3339(SystemTime::now());
                writeln!(out, "{}", if args.json { u.json(time).to_string() } else { format!("{time} {}", u.text()) })?;
                if let Some(log) = &syslog {
                    log.send(&u.text());
                }
            }
            _ = window.tick() => {
                use std::io::Write as _;
                let mut lines = Vec::new();
                for h in &mut held {
                    for (kind, n) in h.since()? {
                        lines.push(match args.json {
                            true => json!({"interface": h.iface, "kernel_suppressed": n, "kind": kind.name()}).to_string(),
                            false => format!("{}: {n} {} events over the kernel's budget (counted, not sent)", h.iface, kind.name()),
                        });
                    }
                }
                for line in lines {
                    writeln!(out, "{line}")?;
                    if let Some(log) = &syslog {
                        log.send(&line);
                    }
                }
                for ((_, src), hidden) in budget.close() {
                    if args.json {
                        writeln!(out, "{}", json!({"suppressed": hidden, "src": src.to_string()}))?;
                    } else {
                        writeln!(out, "… and {hidden} more from {src}")?;
                    }
                    if let Some(log) = &syslog {
                        log.send(&format!("… and {hidden} more from {src}"));
                    }
                }
            }
            _ = tokio::signal::ctrl_c() => return Ok(()),
        }
    }
}

/// Events per kind and source address in the current window: a flood of
/// one kind (refused frames of unknown source, say) never hides another.
struct Budget {
    per_source: u64,
    seen: BTreeMap<(u8, IpAddr), u64>,
}

impl Budget {
    fn new(per_source: u64) -> Budget {
        Budget {
            per_source,
            seen: BTreeMap::new(),
        }
    }

    /// Whether one more event from `src` may be shown.
    fn allow(&mut self, src: (u8, IpAddr)) -> bool {
        let n = self.seen.entry(src).or_default();
        *n += 1;
        *n <= self.per_source
    }

    /// Ends the window: the sources with events not shown, and how many.
    fn close(&mut self) -> Vec<((u8, IpAddr), u64)> {
        let hidden = self
            .seen
            .iter()
            .filter(|&(_, &n)| n > self.per_source)
            .map(|(&src, &n)| (src, n - self.per_source))
            .collect();
        self.seen.clear();
        hidden
    }
}

/// Whether an event is a refused frame's, not a probe's report.
fn is_frame(e: &Event) -> bool {
    e.kind == EventKind::Frame as u8 || e.kind == EventKind::SwitchPort as u8
}

fn source(e: &Event) -> IpAddr {
    events::addr(e.src)
}

/// The IB trap an event stands for: number and name.
fn trap(e: &Event) -> Option<(u16, &'static str)> {
    if e.kind == EventKind::SwitchPort as u8 {
        return (Reason::from_repr(e.reason.into())? == Reason::PkeyViolation)
            .then_some((259, "Bad P_Key (switch external port)"));
    }
    if e.kind != EventKind::Frame as u8 {
        return None;
    }
    match Reason::from_repr(e.reason.into())? {
        Reason::PkeyViolation => Some((257, "Bad P_Key")),
        Reason::QkeyViolation => Some((258, "Bad Q_Key")),
        _ => None,
    }
}

fn trap_line(iface: &str, e: &Event) -> String {
    format!("{} {iface} {}", rfc3339(SystemTime::now()), trap_text(e))
}

/// `trap 257 (Bad P_Key) drop pkey_violation: …`.
fn trap_text(e: &Event) -> String {
    let head = match trap(e) {
        Some((n, what)) => format!("trap {n} ({what}) "),
        None => String::new(),
    };
    format!("{head}{}", events::line(e))
}

fn trap_json(iface: &str, e: &Event) -> serde_json::Value {
    let switch = e.kind == EventKind::SwitchPort as u8;
    let frame = e.kind == EventKind::Frame as u8 || switch;
    let mut v = json!({
        "time": rfc3339(SystemTime::now()),
        "interface": iface,
        "trap": trap(e).map(|(n, _)| n),
        "kind": EventKind::from_repr(e.kind).map_or("?", EventKind::name),
    });
    if frame {
        v["reason"] = json!(Reason::from_repr(e.reason.into()).map_or("?", Reason::name));
        v["verdict"] = json!(Verdict::from_repr(e.verdict.into()).map_or("?", Verdict::name));
        if switch {
            // Trap 259 names the switch port and the direction it refused in.
            v["port"] = json!(iface);
            v["direction"] = json!(Direction::from_repr(e.direction).map_or("?", Direction::name));
        }
        v["src"] = json!(events::addr(e.src).to_string());
        v["dst"] = json!(events::addr(e.dst).to_string());
        v["pkey"] = json!(e.pkey);
        v["membership"] = json!(describe::pkey(e.pkey));
        v["dest_qp"] = json!(e.dest_qp);
        v["opcode"] = json!(e.opcode);
        if e.opcode & 0xe0 == 0x60 {
            v["qkey"] = json!(e.qkey);
            v["src_qp"] = json!(e.src_qp);
        }
    } else if e.kind == EventKind::QkeyMismatch as u8 {
        v["qp"] = json!(e.dest_qp);
        v["pkey"] = json!(e.pkey);
        v["qkey"] = json!(e.qkey);
        v["policy_qkey"] = json!(e.src_qp);
    } else if e.kind == EventKind::Quarantined as u8 {
        v["qp"] = json!(e.dest_qp);
        v["pkey"] = json!(e.pkey);
    } else if e.kind == EventKind::ForeignDevice as u8 {
        v["qp"] = json!(e.dest_qp);
        v["pkey"] = json!(e.pkey);
        v["pid"] = json!(e.src_qp);
    } else {
        v["qp"] = json!(e.dest_qp);
        v["pkey"] = json!(e.pkey);
        v["group"] = json!(events::addr(e.dst).to_string());
        v["group_pkey"] = json!(e.qkey);
    }
    v
}

/// `2026-11-23T22:51:03.123Z`.
fn rfc3339(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let (days, rest) = (secs / 86_400, secs % 86_400);
    // Civil from days (Howard Hinnant's algorithm), 1970-01-01 as day 0.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rest / 3600,
        rest / 60 % 60,
        rest % 60,
        d.subsec_millis()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_rfc3339_utc() {
        let at = |s: u64| rfc3339(UNIX_EPOCH + Duration::from_secs(s));
        assert_eq!(at(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(at(951_782_400), "2000-02-29T00:00:00.000Z");
        assert_eq!(at(1_795_476_663), "2026-11-23T23:31:03.000Z");
    }

    #[test]
    fn a_source_past_its_budget_is_summarised() {
        let mut b = Budget::new(2);
        let frame = EventKind::Frame as u8;
        let (a, c): (IpAddr, IpAddr) = ("10.0.0.7".parse().unwrap(), "10.0.0.8".parse().unwrap());
        let a = (frame, a);
        assert!(b.allow(a) && b.allow(a) && !b.allow(a) && !b.allow(a));
        assert!(b.allow((frame, c)));
        assert_eq!(b.close(), vec![(a, 2)]);
        assert!(b.allow(a), "a new window");
    }

    /// Probe reports carry no address, as frames too malformed to tell
    /// their source: a flood of those never hides a foreign join.
    #[test]
    fn a_flood_of_one_kind_leaves_another_its_budget() {
        let mut b = Budget::new(2);
        let unknown = events::addr([0; 16]);
        for _ in 0..100 {
            b.allow((EventKind::Frame as u8, unknown));
        }
        assert!(b.allow((EventKind::ForeignJoin as u8, unknown)));
    }
}
