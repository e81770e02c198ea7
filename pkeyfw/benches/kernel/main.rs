//! `cargo xtask bench`: what the filter costs in the real kernel.
//!
//! Every figure comes from the loaded XDP program: per-packet cost of each
//! verdict path beside the empty XDP_PASS program and the minimal partition
//! check (BPF_PROG_TEST_RUN; the test kit's baselines, an object of their
//! own), the
//! same at table sizes from 1 to 1,000,000 QPs, the maps' kernel memory, and
//! the wall-clock time to load a filter and apply a policy, what P_Key
//! stamping costs by frame size, a switch port's paths, and the rates of
//! the real receive path (`live`). Needs root.

mod live;
mod loading;

use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail, ensure};
use pkeyfw::{
    control::limits::TENANT_QPS,
    loading::filter::{Filter, Load},
    policy::{Group, Policy, QpRule, SwitchRole},
};
use pkeyfw_common::{
    Direction, Reason, Stamp, Verdict,
    abi::{
        Capacity, Creation, MIN_QPNS, PROBE_ROOM, QpType, RXE_QPNS, UnknownQp, cm::cm_state,
        family, v4_mapped,
    },
    cm::{listen_key, service_id},
};
use pkeyfw_testkit::{
    baseline::Baseline,
    cases::{self, frames},
    cm::{PS_TCP, Request, gsi},
    cpus,
    wire::Packet,
};
use serde_json::{Value, json};

/// The baseline object, built with the filter's by pkeyfw's build script:
/// OUT_DIR is this package's, so the bench includes it itself.
static BASELINE: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/pkeyfw-baseline"));

/// Kernel repetitions per timed run: the kernel reports their mean in whole
/// ns, which takes many repetitions to be stable.
const REPEAT: u32 = 1_000_000;
/// Alternating filter/empty runs per path; the median of each (and of the
/// rounds' differences) is reported, so that a few disturbed runs (the
/// machine has 2 CPUs) do not show.
const ROUNDS: usize = 15;
/// QPs in the policy of the per-path table: a busy host.
const PATH_QPS: u32 = 1_000;
/// Table sizes of the scaling, memory and load tables.
const SIZES: [u32; 4] = [1, 1_000, 100_000, 1_000_000];

/// The partition of every QP.
const PKEY: u16 = 0x8001;
/// In the port's table, but bound to no QP: a P_Key violation at any QP.
const OTHER_PKEY: u16 = 0x8002;
const QKEY: u32 = 0x1111_1111;
/// The QP the known-QP paths address; the policy gives it their type.
const TARGET_QPN: u32 = 2;
/// In the QP table of every filter the bench loads, and in no policy: its
/// entry is a stored zero.
const UNKNOWN_QPN: u32 = 0x10;
/// In quarantine in every filter the bench loads, as a QP the creation
/// probe had no room to bind is (its bit is read only where the QP table
/// has no entry: the paths to bound QPs never read it).
const QUARANTINED_QPN: u32 = UNKNOWN_QPN + 1;
/// The first QPN of a policy's QPs after [`TARGET_QPN`]'s, above the
/// unknown and quarantined ones.
const FIRST_QPN: u32 = 0x20;

fn main() -> Result<()> {
    let baseline = Baseline::empty(BASELINE)?;
    // `--only SECTION --json FILE`: that section alone, into FILE's
    // document (the rest of a full run's figures stay).
    if let Some(section) = arg("--only") {
        let path = json_path().context("--only updates the document --json names")?;
        let mut doc: Value = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
        doc[&section] = match section.as_str() {
            "per_path" => per_path(&baseline)?,
            "live" => live()?,
            "binding" => binding()?,
            "probe_memory" => probe_memory()?,
            "verifier" => loading::verifier()?,
            "attach" => loading::attach()?,
            other => bail!(
                "--only takes per_path, live, binding, probe_memory, verifier or attach, not {other:?}"
            ),
        };
        let text = serde_json::to_string_pretty(&doc)? + "\n";
        return std::fs::write(&path, text).with_context(|| format!("writing {path}"));
    }
    let paths = paths();
    let sized: Vec<Path> = paths.iter().filter(|p| p.sized).cloned().collect();

    // Every path, each table size, stamping: a bar on a terminal only.
    let progress = pkeyfw::reporting::progress::bar(SIZES.len() as u64 + 4, "bench");
    progress.set_message(format!("bench: every path at {PATH_QPS} QPs"));
    let per_path = per_path(&baseline)?;
    progress.inc(1);
    let mut runs = Vec::new();
    for qps in SIZES {
        progress.set_message(format!("bench: {qps} QPs"));
        runs.push(bench_at(qps, &sized, &baseline, None)?);
        progress.inc(1);
    }

    progress.set_message("bench: stamping");
    let stamping = stamping()?;
    progress.set_message("bench: switch ports");
    let switch = switch(&baseline)?;
    progress.inc(1);
    progress.set_message("bench: binding under churn");
    let binding = binding()?;
    progress.set_message("bench: live frames");
    let live = live()?;
    progress.set_message("bench: verifier and attach");
    let verifier = loading::verifier()?;
    let attach = loading::attach()?;
    progress.finish_and_clear();
    let document = json!({
        "machine": machine()?,
        "per_path": per_path,
        "sweep": sweep(&sized, &runs),
        "memory": memory(&runs),
        "probe_memory": probe_memory()?,
        "load": load(&runs),
        "partitions": partitions()?,
        "stamping": stamping,
        "switch": switch,
        "binding": binding,
        "live": live,
        "verifier": verifier,
        "attach": attach,
    });
    let text = serde_json::to_string_pretty(&document)? + "\n";
    match json_path() {
        Some(path) => std::fs::write(&path, text).with_context(|| format!("writing {path}")),
        None => {
            print!("{text}");
            Ok(())
        }
    }
}

/// Where `--json FILE` says the document goes; standard output without it
/// (cargo passes `--bench` too, which is ignored).
fn json_path() -> Option<String> {
    arg("--json")
}

/// The value after `name` on the command line.
fn arg(name: &str) -> Option<String> {
    let mut args = std::env::args().skip_while(|a| a != name);
    args.next()?;
    args.next()
}

/// The kernel and the CPU the figures belong to.
fn machine() -> Result<Value> {
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .context("reading the kernel version")?;
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .and_then(|l| l.split_once(':'))
        .map_or("unknown CPU", |(_, m)| m.trim());
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    Ok(json!({ "kernel": kernel.trim(), "cpu": model, "cpus": cpus }))
}

/// One verdict path: a frame and the verdict the kernel must give it.
#[derive(Clone)]
struct Path {
    name: &'static str,
    frame: Vec<u8>,
    pass: bool,
    reason: Reason,
    /// The type the QP at [`TARGET_QPN`] must have for the frame to take this path.
    qp_type: QpType,
    /// Also measured at every table size.
    sized: bool,
    /// A path of the goal against the minimal check, which must judge it
    /// as the filter does.
    goal: bool,
}

fn path(name: &'static str, packet: Packet, pass: bool, reason: Reason) -> Path {
    Path {
        name,
        frame: packet.bytes(),
        pass,
        reason,
        qp_type: QpType::Rc,
        sized: false,
        goal: false,
    }
}

impl Path {
    fn at(self, qp_type: QpType) -> Path {
        Path { qp_type, ..self }
    }

    fn sized(self) -> Path {
        Path {
            sized: true,
            ..self
        }
    }

    fn goal(self) -> Path {
        Path { goal: true, ..self }
    }
}

/// Every verdict path through the program. The paths that read no QP entry
/// take the case table's own frames (the test kit's `cases::frames`); the
/// others address the bench's QPs.
fn paths() -> Vec<Path> {
    use Reason::*;
    vec![
        path("not_roce (TCP)", frames::tcp(), true, NotRoce).sized(),
        path("malformed (TVer 1)", frames::tver_1(), false, Malformed),
        path("smi (QP0)", frames::smi(), true, Smi),
        path("ok GSI (QP1)", frames::gsi(), true, Ok),
        path("ok CM REQ (listener's partition)", cm_req(PKEY), true, Ok),
        path(
            "pkey_violation (CM REQ, another partition)",
            cm_req(OTHER_PKEY),
            false,
            PkeyViolation,
        ),
        path("ok RC", Packet::rc(PKEY, TARGET_QPN), true, Ok)
            .sized()
            .goal(),
        path("ok UD", Packet::ud(PKEY, TARGET_QPN, QKEY), true, Ok)
            .at(QpType::Ud)
            .sized()
            .goal(),
        path("ok multicast group", frames::group(), true, Ok),
        path(
            "unknown_qp (drop rule)",
            Packet::rc(PKEY, UNKNOWN_QPN),
            false,
            UnknownQp,
        )
        .sized(),
        path(
            "unknown_qp (quarantined QP)",
            Packet::rc(PKEY, QUARANTINED_QPN),
            false,
            UnknownQp,
        ),
        path(
            "pkey_violation",
            Packet::rc(OTHER_PKEY, TARGET_QPN),
            false,
            PkeyViolation,
        )
        .sized()
        .goal(),
        path(
            "qkey_violation",
            Packet::ud(PKEY, TARGET_QPN, QKEY + 1),
            false,
            QkeyViolation,
        )
        .at(QpType::Ud),
        path(
            "opcode_mismatch (UD to RC)",
            Packet::ud(PKEY, TARGET_QPN, QKEY),
            false,
            OpcodeMismatch,
        ),
    ]
}

/// The CM paths' listener: rping's, bound by the policy's `[[bind]]` rule
/// (its maker's uid) to [`PKEY`], as the listen probe records it.
const LISTENER_UID: u32 = 1001;
const CM_PORT: u16 = 7174;
const CM_CLIENT: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);
const CM_SERVER: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 2);

/// A CM REQ to the listener, with P_Key `pkey`.
fn cm_req(pkey: u16) -> Packet {
    let req = Request::to(CM_CLIENT, CM_SERVER, CM_PORT).req();
    gsi(req, pkey, CM_CLIENT, CM_SERVER)
}

/// Records the listener in `filter` as the probes would, and says they
/// keep their records (on every kernel with probes, 6.1 on).
fn listening(filter: &mut Filter) -> Result<()> {
    let maps = filter.maps_mut();
    let key = listen_key(
        service_id(PS_TCP, CM_PORT),
        family::INET,
        v4_mapped(CM_SERVER.octets()),
        false,
    );
    let maker = Creation {
        uid: LISTENER_UID,
        gid: LISTENER_UID,
        ib_qp_type: IB_QPT_RC,
        ..Creation::default()
    };
    maps.record_listener(&key, &maker)?;
    maps.set_cm_records(cm_state::RECORDS_LISTENERS | cm_state::RECORDS_CONNECTIONS)
}

/// `enum ib_qp_type`'s IB_QPT_RC.
const IB_QPT_RC: u8 = 2;

/// A policy binding `qps` QPs, QPN 2 and from [`FIRST_QPN`] on, all in
/// [`PKEY`], the case table's multicast group and the CM paths' listener.
/// QP 2, which the known-QP paths address, has `target`'s type (so that
/// even a one-QP table serves them); the others cycle through all four
/// types.
fn policy(qps: u32, target: QpType) -> Policy {
    let rule = |qp_type| QpRule {
        qp_type,
        pkey: PKEY,
        qkey: (qp_type == QpType::Ud).then_some(QKEY),
        flags: 0,
    };
    let qps = std::iter::once(TARGET_QPN)
        .chain(FIRST_QPN..FIRST_QPN + qps - 1)
        .map(|qpn| {
            let qp_type = if qpn == TARGET_QPN {
                target
            } else {
                QpType::ALL[qpn as usize % QpType::ALL.len()]
            };
            (qpn, rule(qp_type))
        })
        .collect();
    let group = Group {
        addr: IpAddr::V6(cases::GROUP),
        pkey: cases::GROUP_PKEY,
        qkey: cases::GROUP_QKEY,
    };
    let listener = format!(
        "[port]\npkeys = [0xffff, {PKEY:#06x}]\n[[bind]]\nuid = {LISTENER_UID}\npkey = {PKEY:#06x}\n"
    );
    let binds = Policy::parse(std::path::Path::new("bench.toml"), &listener)
        .expect("the listener's rule")
        .binds;
    Policy {
        unknown_qp: UnknownQp::Drop,
        qps,
        groups: BTreeMap::from([(Group::key_addr(group.addr), group)]),
        binds,
        ..Policy::with_table(vec![0xffff, PKEY, OTHER_PKEY])
    }
}

/// QPs bound while the binding bench runs: a busy host and a large one.
const BOUND: [u32; 2] = [1_000, 30_000];
/// QPs created (bound) then destroyed (released) at each size, a reload
/// half-way through.
const CHURN: u32 = 4_000;

/// What the foreground attach's loop pays per QP it binds or releases with
/// `BOUND` QPs bound, and what a reload (SIGHUP) costs among them: the loop
/// serves a signal between two map updates, so a reload waits at most one
/// bind and then takes `reload_ms`.
fn binding() -> Result<Value> {
    let rule = QpRule {
        qp_type: QpType::Rc,
        pkey: PKEY,
        qkey: None,
        flags: pkeyfw_common::abi::qp_flags::RULE,
    };
    let mut rows = Vec::new();
    for bound in BOUND {
        let policy = policy(bound, QpType::Rc);
        let first = policy.qpns();
        let mut filter = Filter::load(first + CHURN)?;
        filter.apply(&policy)?;
        let churned = first..first + CHURN;
        let (mut binds, mut releases) = (Duration::ZERO, Duration::ZERO);
        let mut reload = Duration::ZERO;
        for half in [0, 1] {
            let qpns = churned
                .clone()
                .skip(half * CHURN as usize / 2)
                .take(CHURN as usize / 2);
            let (done, took) = timed(|| {
                qpns.clone()
                    .try_for_each(|q| filter.maps_mut().bind_live(q, &rule))
            });
            done?;
            binds += took;
            if half == 0 {
                let (done, took) = timed(|| filter.apply(&policy));
                done?;
                reload = took;
            }
            let (done, took) = timed(|| {
                qpns.clone()
                    .try_for_each(|q| filter.maps_mut().unbind_live(q))
            });
            done?;
            releases += took;
        }
        rows.push(json!({
            "bound": bound,
            "binds_per_s": f64::from(CHURN) / binds.as_secs_f64(),
            "releases_per_s": f64::from(CHURN) / releases.as_secs_f64(),
            "reload_ms": reload.as_secs_f64() * 1e3,
        }));
    }
    Ok(json!({ "churn": CHURN, "rows": rows }))
}

/// Per-packet cost of a path, in ns, through the filter, the empty program
/// and (in the per-path table) the minimal partition check.
#[derive(Clone, Copy)]
struct Cost {
    filter: f64,
    empty: f64,
    /// The filter's cost above the empty program's: the median of each
    /// round's difference (see [`measure`]).
    added: f64,
    minimal: Option<Floor>,
}

/// The minimal partition check on a path: its cost, its cost above the
/// empty program's (as [`Cost::added`]), and its verdict.
#[derive(Clone, Copy)]
struct Floor {
    ns: f64,
    added: f64,
    pass: bool,
}

/// Everything measured on one freshly loaded filter.
struct Run {
    qps: u32,
    /// `Filter::load`: the verifier and the maps.
    load: Duration,
    /// The first `apply`, into the fresh filter.
    apply: Duration,
    memory: Vec<(&'static str, u64)>,
    /// In the order of the paths measured.
    costs: Vec<Cost>,
}

/// Every path at [`PATH_QPS`], beside the empty program and the minimal
/// partition check holding the same QPs' P_Keys.
fn per_path(baseline: &Baseline) -> Result<Value> {
    let paths = paths();
    let qps = policy(PATH_QPS, QpType::Rc).qps;
    let minimal = Baseline::minimal(BASELINE, qps.iter().map(|(&qpn, qp)| (qpn, qp.pkey)))?;
    let run = bench_at(PATH_QPS, &paths, baseline, Some(&minimal))?;
    Ok(per_path_figures(&paths, &run))
}

/// Loads a filter for `qps` QPs and measures `paths` under policies of that
/// size: one with QP 2 of RC type, then one with it UD; `minimal` beside
/// them if given.
fn bench_at(
    qps: u32,
    paths: &[Path],
    baseline: &Baseline,
    minimal: Option<&Baseline>,
) -> Result<Run> {
    let (filter, load) = timed(|| Filter::load(policy(qps, QpType::Rc).qpns()));
    let mut filter = filter?;
    filter.maps_mut().quarantine(QUARANTINED_QPN)?;
    listening(&mut filter)?;
    let mut apply = None;
    let mut costs = vec![None; paths.len()];
    for target in [QpType::Rc, QpType::Ud] {
        let policy = policy(qps, target);
        let (applied, took) = timed(|| filter.apply(&policy));
        applied.with_context(|| format!("applying {qps} QPs"))?;
        apply.get_or_insert(took);
        for (i, path) in paths.iter().enumerate() {
            if path.qp_type == target {
                costs[i] = Some(measure(&filter, baseline, minimal, path)?);
            }
        }
    }
    Ok(Run {
        qps,
        load,
        apply: apply.expect("applied at least once"),
        memory: filter.maps().memory()?,
        costs: costs
            .into_iter()
            .map(|c| c.expect("every path has an RC or UD target"))
            .collect(),
    })
}

/// Checks that the kernel gives `path` its intended verdict (and, on the
/// goal's paths, that the minimal check gives the same), then times it
/// through the filter, the empty program and the minimal check,
/// alternating, so that a change of machine state in between hits all.
fn measure(
    filter: &Filter,
    baseline: &Baseline,
    minimal: Option<&Baseline>,
    path: &Path,
) -> Result<Cost> {
    let judged = filter.run_counted(&path.frame)?;
    ensure!(
        judged == (path.pass, path.reason),
        "{}: the kernel judged (pass, reason) = {judged:?}, expected ({}, {:?})",
        path.name,
        path.pass,
        path.reason
    );
    let minimal_pass = minimal.map(|m| m.run(&path.frame)).transpose()?;
    ensure!(
        !path.goal || minimal_pass.is_none_or(|pass| pass == path.pass),
        "{}: the minimal check's verdict differs from pkeyfw's (pass: {})",
        path.name,
        path.pass
    );
    let (mut through_filter, mut through_empty, mut through_minimal) =
        (Vec::new(), Vec::new(), Vec::new());
    on_one_cpu(|| {
        for _ in 0..ROUNDS {
            through_filter.push(cpu_ns(|| filter.time(&path.frame, REPEAT))?);
            through_empty.push(cpu_ns(|| baseline.time(&path.frame, REPEAT))?);
            if let Some(minimal) = minimal {
                through_minimal.push(cpu_ns(|| minimal.time(&path.frame, REPEAT))?);
            }
        }
        Ok(())
    })?;
    Ok(Cost {
        added: added(&through_filter, &through_empty),
        minimal: minimal_pass.map(|pass| Floor {
            added: added(&through_minimal, &through_empty),
            ns: median(through_minimal),
            pass,
        }),
        filter: median(through_filter),
        empty: median(through_empty),
    })
}

/// Runs `f` with this thread kept on one CPU (the last it may run on):
/// the programs compared are timed on the same CPU and its caches, never
/// moved between two runs.
fn on_one_cpu<T>(f: impl FnOnce() -> Result<T>) -> Result<T> {
    let last = *cpus::allowed()?
        .last()
        .context("this thread may run on no CPU")?;
    cpus::on(last, f)?
}

/// A program's cost above the empty program's: the median of the rounds'
/// differences, each between two runs made back to back, so that what
/// slows the machine for a while (the other CPU's work, frequency) moves
/// both sides of a difference alike, where it would move one median and
/// not the other.
fn added(through: &[f64], empty: &[f64]) -> f64 {
    median(through.iter().zip(empty).map(|(t, e)| t - e).collect())
}

/// ns per repetition of a timed run of [`REPEAT`] repetitions, from the
/// CPU time of the thread that made it (the test run's own, in the
/// system call): the kernel's figure is whole ns, too coarse for costs
/// of a few ns above the empty program's; this one has the clock's
/// resolution, and leaves out what ran while the thread waited.
fn cpu_ns(run: impl FnOnce() -> Result<Duration>) -> Result<f64> {
    let start = thread_cpu_time();
    run()?;
    let took = thread_cpu_time() - start;
    Ok(took.as_nanos() as f64 / f64::from(REPEAT))
}

fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid clock id and timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// The kernel reports the mean run time of the repetitions (in whole ns), not
/// their total: `Filter::time`'s duration already is the per-packet cost.
fn ns_per_packet(mean: Duration) -> f64 {
    mean.as_nanos() as f64
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn timed<T>(f: impl FnOnce() -> T) -> (T, Duration) {
    let start = Instant::now();
    let out = f();
    (out, start.elapsed())
}

/// Every path at [`PATH_QPS`]: its verdict, and the ns of the filter, the
/// empty program and the minimal check (with its verdict).
fn per_path_figures(paths: &[Path], run: &Run) -> Value {
    let rows: Vec<Value> = paths
        .iter()
        .zip(&run.costs)
        .map(|(path, cost)| {
            let mut row = json!({
                "path": path.name,
                "pass": path.pass,
                "goal": path.goal,
                "ns": cost.filter,
                "empty_ns": cost.empty,
                "added_ns": cost.added,
            });
            if let Some(floor) = cost.minimal {
                row["minimal_ns"] = floor.ns.into();
                row["minimal_added_ns"] = floor.added.into();
                row["minimal_pass"] = floor.pass.into();
            }
            row
        })
        .collect();
    json!({
        "qps": run.qps,
        "unknown_qp": "drop",
        "repeat": REPEAT,
        "rounds": ROUNDS,
        "paths": rows,
    })
}

/// Filter cost per path at every size; the empty program's (the median
/// over the paths) shows how much of a spread is the machine's noise.
fn sweep(paths: &[Path], runs: &[Run]) -> Value {
    let rows: Vec<Value> = paths
        .iter()
        .enumerate()
        .map(|(i, path)| {
            let ns: Vec<f64> = runs.iter().map(|r| r.costs[i].filter).collect();
            json!({ "path": path.name, "ns": ns })
        })
        .collect();
    let empty: Vec<f64> = runs
        .iter()
        .map(|r| median(r.costs.iter().map(|c| c.empty).collect()))
        .collect();
    json!({
        "qps": runs.iter().map(|r| r.qps).collect::<Vec<_>>(),
        "paths": rows,
        "empty_ns": empty,
    })
}

/// Every map's kernel memory (fdinfo memlock, bytes) at every size.
fn memory(runs: &[Run]) -> Value {
    runs.iter()
        .map(|run| json!({ "qps": run.qps, "bytes": by_map(&run.memory) }))
        .collect()
}

/// rdma_rxe's `max_qp` (`RXE_MAX_QP`, 2^20 - 16, as the guest's device
/// reports it): the probe's room `attach` makes on an interface with one
/// rxe device.
const RXE_MAX_QP: u32 = (1 << 20) - 16;

/// Every map's kernel memory with one QP in the policy, the QP table and
/// the probe's tables sized as on an interface with no RDMA device (the
/// least QP table, the probe's [`PROBE_ROOM`]), on a tenant's own rxe
/// device (every QPN it hands out; [`TENANT_QPS`]: what each tenant's port
/// weighs) and with an rxe device (every QPN it hands out, its `max_qp`):
/// what room for every QP a device can hold costs before any exists (each
/// QP the probe records then adds its entries).
fn probe_memory() -> Result<Value> {
    [
        (MIN_QPNS, PROBE_ROOM),
        (RXE_QPNS, TENANT_QPS),
        (RXE_QPNS, RXE_MAX_QP),
    ]
    .into_iter()
    .map(|(qpns, probed)| {
        let filter = Filter::load_with(&Load {
            capacity: Capacity {
                qpns,
                probed,
                ..Capacity::of(0)
            },
            ..Load::host(0)
        })?;
        let memory = filter.maps().memory()?;
        Ok(json!({ "probed": probed, "bytes": by_map(&memory) }))
    })
    .collect()
}

/// Bytes by map name, as the document keeps them.
fn by_map(memory: &[(&str, u64)]) -> serde_json::Map<String, Value> {
    memory
        .iter()
        .map(|&(map, bytes)| (map.to_string(), bytes.into()))
        .collect()
}

/// Load and first apply, wall clock, at every size.
fn load(runs: &[Run]) -> Value {
    runs.iter()
        .map(|r| {
            json!({
                "qps": r.qps,
                "load_s": r.load.as_secs_f64(),
                "apply_s": r.apply.as_secs_f64(),
            })
        })
        .collect()
}

/// Single runs per stamping figure. A rewritten frame stays rewritten for
/// the kernel's further repetitions, which would then time the no-op path:
/// each figure is the median of this many one-repetition runs instead.
const STAMP_RUNS: usize = 20_001;
/// Payloads of the stamping table: a small frame and the largest each
/// BPF_PROG_TEST_RUN takes (one page of linear skb for TC; 4096 for XDP).
const SMALL_PAYLOAD: usize = 64;
const EGRESS_LARGE_PAYLOAD: usize = 3400;
const XDP_LARGE_PAYLOAD: usize = 4096;

/// What stamping costs, small frame against large: the ICRC and checksum
/// patches are O(1), so the ratio must stay near 1 (flat within 20%). Each
/// rewriting path is shown beside the same program leaving the frame alone.
fn stamping() -> Result<Value> {
    let mut policy = policy(PATH_QPS, QpType::Rc);
    policy.stamp = true;
    let mut filter = Filter::load(PATH_QPS)?;
    filter.apply(&policy)?;
    let sized = |p: Packet, len: usize| Packet {
        payload: vec![0x5a; len],
        ..p
    };
    let outgoing = |pkey| Packet {
        src_qp: TARGET_QPN,
        ..Packet::ud(pkey, UNKNOWN_QPN, QKEY)
    };
    // A test run's socket is no rdma_rxe QP's: egress gives its frames the
    // default key, which is the same rewrite a QP's key is.
    let rows: [(&str, Packet, usize, Stamp); 4] = [
        (
            "egress: rewrite to the default key",
            outgoing(PKEY),
            EGRESS_LARGE_PAYLOAD,
            Stamp::Defaulted,
        ),
        (
            "egress: the default key, left",
            outgoing(0xffff),
            EGRESS_LARGE_PAYLOAD,
            Stamp::Unbound,
        ),
        (
            "XDP: verdict + restore",
            Packet::rc(PKEY, TARGET_QPN),
            XDP_LARGE_PAYLOAD,
            Stamp::Restored,
        ),
        (
            "XDP: verdict, 0xFFFF (QP1)",
            frames::gsi(),
            XDP_LARGE_PAYLOAD,
            Stamp::Restored,
        ),
    ];
    let mut out = Vec::new();
    for (name, packet, large, outcome) in rows {
        let egress = name.starts_with("egress");
        let mut ns = Vec::new();
        for len in [SMALL_PAYLOAD, large] {
            let frame = sized(packet.clone(), len).bytes();
            let before = filter.maps().stamps()?;
            if egress {
                ensure!(filter.run_egress(&frame)?.is_some(), "{name}: dropped");
            } else {
                ensure!(filter.run(&frame)?, "{name}: dropped");
            }
            let after = filter.maps().stamps()?;
            let i = outcome.index() as usize;
            let counted = after[i] - before[i];
            let restores = packet.pkey != 0xffff;
            ensure!(
                counted == u64::from(egress || restores),
                "{name}, {len} bytes: {counted} frames counted as {}",
                outcome.name()
            );
            let mut runs = Vec::with_capacity(STAMP_RUNS);
            for _ in 0..STAMP_RUNS {
                let took = if egress {
                    filter.time_egress(&frame, 1)?
                } else {
                    filter.time(&frame, 1)?
                };
                runs.push(ns_per_packet(took));
            }
            ns.push(median(runs));
        }
        out.push(json!({
            "path": name,
            "large_payload": large,
            "small_ns": ns[0],
            "large_ns": ns[1],
        }));
    }
    Ok(json!({
        "runs": STAMP_RUNS,
        "small_payload": SMALL_PAYLOAD,
        "paths": out,
    }))
}

/// A switch port's paths per frame (64-byte payload): the inbound check
/// (XDP), the outbound check (TC egress), an access port's stamp and
/// restore, and a corruption, beside the empty XDP program. Single runs, as
/// for stamping: a rewritten frame would not be rewritten again.
fn switch(baseline: &Baseline) -> Result<Value> {
    let port = |pkeys: &[u16], role: SwitchRole| {
        let mut policy = Policy::with_table(pkeys.to_vec());
        policy.switch = Some(role);
        let mut filter = Filter::load_for(&policy)?;
        filter.apply(&policy)?;
        Ok::<_, anyhow::Error>(filter)
    };
    let checks = SwitchRole {
        inbound: true,
        outbound: true,
        corrupt: false,
        access: None,
    };
    let trunk = port(&[PKEY], checks)?;
    let access = port(
        &[PKEY],
        SwitchRole {
            access: Some(PKEY),
            ..checks
        },
    )?;
    let corrupting = port(
        &[PKEY],
        SwitchRole {
            corrupt: true,
            ..checks
        },
    )?;
    let frame = |pkey| Packet::rc(pkey, TARGET_QPN).bytes();
    // (path, port, direction, the frame's P_Key, verdict, stamping outcome)
    type Row<'a> = (
        &'static str,
        &'a Filter,
        Direction,
        u16,
        Verdict,
        Option<Stamp>,
    );
    let rows: [Row; 7] = [
        (
            "inbound: pass",
            &trunk,
            Direction::Inbound,
            PKEY,
            Verdict::Pass,
            None,
        ),
        (
            "inbound: drop",
            &trunk,
            Direction::Inbound,
            OTHER_PKEY,
            Verdict::Drop,
            None,
        ),
        (
            "outbound: pass",
            &trunk,
            Direction::Outbound,
            0x0001,
            Verdict::Pass,
            None,
        ),
        (
            "outbound: drop",
            &trunk,
            Direction::Outbound,
            OTHER_PKEY,
            Verdict::Drop,
            None,
        ),
        (
            "inbound: access stamp",
            &access,
            Direction::Inbound,
            0xffff,
            Verdict::Pass,
            Some(Stamp::Stamped),
        ),
        (
            "outbound: access restore",
            &access,
            Direction::Outbound,
            0x0001,
            Verdict::Pass,
            Some(Stamp::Restored),
        ),
        (
            "outbound: corrupt",
            &corrupting,
            Direction::Outbound,
            OTHER_PKEY,
            Verdict::Corrupt,
            None,
        ),
    ];
    let single = |f: &dyn Fn() -> Result<Duration>| -> Result<f64> {
        let mut runs = Vec::with_capacity(STAMP_RUNS);
        for _ in 0..STAMP_RUNS {
            runs.push(ns_per_packet(f()?));
        }
        Ok(median(runs))
    };
    let empty = single(&|| baseline.time(&frame(PKEY), 1))?;
    let mut out = Vec::new();
    for (name, filter, direction, pkey, verdict, stamp) in rows {
        let frame = frame(pkey);
        // What the path does, checked before it is timed.
        let (counts, stamps) = (filter.maps().reasons()?, filter.maps().xmit_reasons()?);
        let before_stamps = filter.maps().stamps()?;
        let inbound = direction == Direction::Inbound;
        let passed = if inbound {
            filter.run(&frame)?
        } else {
            filter.run_egress(&frame)?.is_some()
        };
        let (after, before) = if inbound {
            (filter.maps().reasons()?, counts)
        } else {
            (filter.maps().xmit_reasons()?, stamps)
        };
        let counted = Reason::ALL
            .into_iter()
            .map(|r| after.get(r, verdict) - before.get(r, verdict))
            .sum::<u64>();
        ensure!(
            counted == 1 && passed == (verdict != Verdict::Drop),
            "{name}: not {}",
            verdict.name()
        );
        if let Some(stamp) = stamp {
            let i = stamp.index() as usize;
            ensure!(
                filter.maps().stamps()?[i] == before_stamps[i] + 1,
                "{name}: not {}",
                stamp.name()
            );
        }
        let ns = single(&|| match direction {
            Direction::Inbound => filter.time(&frame, 1),
            Direction::Outbound => filter.time_egress(&frame, 1),
        })?;
        out.push(json!({ "path": name, "ns": ns }));
    }
    Ok(json!({
        "runs": STAMP_RUNS,
        "payload": SMALL_PAYLOAD,
        "empty_ns": empty,
        "paths": out,
    }))
}

/// The live rates: pkeyfw with the per-path table's policy, nftables with
/// the same QPs.
fn live() -> Result<Value> {
    let policy = policy(PATH_QPS, QpType::Rc);
    let mut filter = Filter::load(PATH_QPS)?;
    filter.apply(&policy)?;
    let pass = Packet::rc(PKEY, TARGET_QPN).bytes();
    let refused = Packet::rc(OTHER_PKEY, TARGET_QPN).bytes();
    let rates = live::bench(&policy, filter, BASELINE, &pass, &refused)?;
    Ok(json!({
        "frames": live::FRAMES,
        "batch": live::BATCH,
        "rounds": live::ROUNDS,
        "rows": rates,
    }))
}

/// Parsing a large OpenSM partitions.conf: every valid partition (0x0001 to
/// 0x7ffe, plus the default 0x7fff: 32,767, key 0 being invalid) naming
/// 100,000 member GUIDs, this port in every one of them, so that the derived
/// table has 32,767 entries.
fn partitions() -> Result<Value> {
    const PARTITIONS: u32 = 0x7ffe;
    const GUIDS: u32 = 100_000;
    const PORT: u64 = 0x0002_c903_00a1_b2c3;
    let mut text = String::from("Default=0x7fff : ALL=full ;\n");
    for p in 1..=PARTITIONS {
        text += &format!("p{p}=0x{p:04x} : {PORT:#x}=full");
        // Spread the other member GUIDs over the partitions.
        for g in (p - 1) * GUIDS / PARTITIONS..p * GUIDS / PARTITIONS {
            text += &format!(", {:#x}", 0x1000 + u64::from(g));
        }
        text += " ;\n";
    }
    let opts = pkeyfw::policy::partitions::Options {
        port_guid: PORT,
        is_sm: false,
    };
    let path = std::path::Path::new("bench-partitions.conf");
    let rounds: Vec<f64> = (0..5)
        .map(|_| {
            let (derived, took) = timed(|| pkeyfw::policy::partitions::derive(path, &text, &opts));
            derived.map(|d| {
                assert_eq!(d.pkeys.len(), PARTITIONS as usize + 1);
                took.as_secs_f64()
            })
        })
        .collect::<Result<_, _>>()?;
    Ok(json!({
        "partitions": PARTITIONS + 1,
        "guids": GUIDS,
        "bytes": text.len(),
        "runs": rounds.len(),
        "parse_s": median(rounds),
    }))
}
