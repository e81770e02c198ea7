//! `pkeyfw metrics` scraped by a real Prometheus server (Debian's
//! `prometheus`, which `cargo xtask test` installs): frames are sent across
//! a veth pair the test makes, into the stamping filter and out of it, and
//! Prometheus's query API must give exactly the counts the host verdict and
//! stamping decision predict, per reason and verdict, per partition and per
//! stamping outcome; `promtool check metrics` must find the exposition
//! clean. Every query of the Grafana dashboard (deploy/monitoring) runs
//! against that Prometheus and must return the series the frames made; the
//! alerting rules pass `promtool check rules` and their unit tests.
//! Connections of user nobody's that pipeline requests and never read the
//! answers keep neither a scrape nor that Prometheus from being answered.

use crate::common;

use std::{
    collections::{BTreeMap, BTreeSet},
    io::{Read as _, Write as _},
    net::{TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use pkeyfw_common::{
    Reason, Stamp,
    abi::{EventKind, violation_key},
    judge, pkey,
    stamp::{self, Action, Origin},
};
use pkeyfw_testkit::netns::{VethPair, send};
use serde_json::Value;

/// The alerting rules, their unit tests and the dashboard.
fn monitoring() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/monitoring")
}

/// A port nothing listens on now.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The body of `GET path` on 127.0.0.1:`port`, once it answers.
fn get(port: u16, path: &str) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.").then(|| body.to_string())
}

/// The series `query` gives through Prometheus's HTTP API: `Err` when
/// Prometheus refuses it (or does not answer yet).
fn series(port: u16, query: &str) -> Result<Vec<Value>, String> {
    let encoded: String = query
        .bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect();
    let body =
        get(port, &format!("/api/v1/query?query={encoded}")).ok_or("Prometheus does not answer")?;
    let v: Value = serde_json::from_str(&body).map_err(|e| format!("{e}: {body}"))?;
    match v["data"]["result"].as_array() {
        Some(result) if v["status"] == "success" => Ok(result.clone()),
        _ => Err(format!("refused: {body}")),
    }
}

/// `query`'s value (`None`: no series yet).
fn query(port: u16, query: &str) -> Option<u64> {
    let result = series(port, query).ok()?;
    result.first()?["value"][1].as_str()?.parse().ok()
}

/// What the stamping decision does with `frame` sent out of the port by a
/// packet socket (no QP's): the outcome counted, and whether it is dropped.
fn egress(policy: &pkeyfw::policy::Policy, frame: &[u8]) -> Option<(Stamp, bool)> {
    stamp::egress(frame, policy, &policy.config(), || Origin::Other).map(|a| match a {
        Action::Rewrite(_, s) | Action::Leave(s) => (s, false),
        Action::Drop(s) => (s, true),
    })
}

/// The stamping outcome counted for `frame` received and `judged`.
fn ingress(
    policy: &pkeyfw::policy::Policy,
    frame: &[u8],
    judged: &pkeyfw_common::Outcome,
) -> Option<Stamp> {
    stamp::ingress(frame, judged, &policy.config())
        .map(|r| r.map_or_else(|s| s, |_| Stamp::Restored))
}

#[test]
fn prometheus_scrapes_what_the_kernel_counted() {
    let _root = common::pins_root();
    common::require_root();
    let pair = VethPair::create(&common::tag("pm")).unwrap();
    pair.set_mtu(9000).unwrap();
    // The base policy, stamping: egress counts what leaves the port too.
    let text =
        common::cases::BASE.replace("mode = \"enforce\"", "mode = \"enforce\"\nstamp = true");
    let (dir, policy_path) = common::policy_file(&text);
    let policy = common::policy(&text);
    assert!(policy.stamp);
    let _fg = common::Foreground::start(&pair, &policy_path, "native");

    // Every case of the base policy, and what the verdict says of each.
    let base = common::policy(common::cases::BASE);
    let frames: Vec<Vec<u8>> = common::cases::all()
        .into_iter()
        .filter(|c| c.policy == base)
        .map(|c| c.frame)
        .collect();
    let mut want_frames: BTreeMap<(&str, &str), u64> = BTreeMap::new();
    let mut want_partitions: BTreeMap<(Reason, String), u64> = BTreeMap::new();
    // The same frames received, then sent out of the port by a packet
    // socket (no QP's: what a process crafting RoCE sends).
    let mut want_stamps: BTreeMap<&str, u64> = BTreeMap::new();
    let mut dropped_at_egress = Vec::new();
    for f in &frames {
        let o = judge(&f[..], &policy, &policy.config());
        let out = egress(&policy, f);
        dropped_at_egress.push(out.is_some_and(|(_, dropped)| dropped));
        for s in [ingress(&policy, f, &o), out.map(|(s, _)| s)]
            .into_iter()
            .flatten()
        {
            *want_stamps.entry(s.name()).or_default() += 1;
        }
        *want_frames
            .entry((o.reason.name(), o.verdict().name()))
            .or_default() += 1;
        if let Some(roce) = o.roce
            && !o.allowed
            && violation_key(o.reason, roce.pkey(), true).is_some()
        {
            // Keys the port's table does not hold count as one "other".
            let in_table = pkeyfw_common::Tables::port_flags(&policy, pkey::key(roce.pkey())) != 0;
            let partition = match in_table {
                true => format!("{:#06x}", pkey::key(roce.pkey())),
                false => "other".to_string(),
            };
            *want_partitions.entry((o.reason, partition)).or_default() += 1;
        }
    }
    assert!(
        want_partitions
            .keys()
            .any(|(r, _)| *r == Reason::PkeyViolation)
            && want_partitions
                .keys()
                .any(|(r, _)| *r == Reason::QkeyViolation),
        "the cases must refuse by P_Key and by Q_Key for this to mean anything"
    );
    assert!(
        want_partitions.keys().any(|(_, p)| p == "other"),
        "and with keys the port's table does not hold (one \"other\" series)"
    );
    assert!(
        want_stamps.contains_key(Stamp::Forged.name()),
        "some of the frames must be forged at egress for the dashboard's panel to mean anything"
    );
    send(&pair.ns_a, &pair.a, &frames).unwrap();
    // A frame egress drops fails its send (ENOBUFS): one at a time.
    for (f, dropped) in frames.iter().zip(dropped_at_egress) {
        let sent = send(&pair.ns_b, &pair.b, std::slice::from_ref(f));
        assert_eq!(sent.is_err(), dropped, "sending {f:02x?}: {sent:?}");
    }
    // One reload refused (an invalid file), one applied: counted by result.
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "[port]\npkeys = [0x10000]\n").unwrap();
    let refused = common::pkeyfw_in(&pair.ns_b)
        .args(["reload", &pair.b, "--policy", bad.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!refused.status.success());
    common::succeed(common::pkeyfw_in(&pair.ns_b).args([
        "reload",
        &pair.b,
        "--policy",
        policy_path.to_str().unwrap(),
    ]));

    let metrics_port = free_port();
    let _metrics = common::Killed(
        Command::new(env!("CARGO_BIN_EXE_pkeyfw"))
            .args(["metrics", "--listen", &format!("127.0.0.1:{metrics_port}")])
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    let exposition = loop {
        if let Some(body) = get(metrics_port, "/metrics") {
            break body;
        }
        assert!(Instant::now() < deadline, "pkeyfw metrics never answered");
        std::thread::sleep(Duration::from_millis(50));
    };

    // promtool reads the exposition as Prometheus does.
    let mut promtool = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (cargo xtask test installs it)");
    promtool
        .stdin
        .take()
        .unwrap()
        .write_all(exposition.as_bytes())
        .unwrap();
    let checked = promtool.wait_with_output().unwrap();
    assert!(
        checked.status.success() && checked.stdout.is_empty() && checked.stderr.is_empty(),
        "promtool check metrics: {}{}\n{exposition}",
        String::from_utf8_lossy(&checked.stdout),
        String::from_utf8_lossy(&checked.stderr)
    );

    let data = tempfile::tempdir().unwrap();
    let config = data.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: pkeyfw\n    static_configs:\n      - targets: ['127.0.0.1:{metrics_port}']\n"
        ),
    )
    .unwrap();
    let prometheus_port = free_port();
    let _prometheus = common::Killed(
        Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                data.path().join("tsdb").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{prometheus_port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus (cargo xtask test installs it)"),
    );

    let iface = &pair.b;
    let mut checks: Vec<(String, u64)> = want_frames
        .iter()
        .map(|((reason, verdict), n)| {
            (
                format!(
                    "pkeyfw_frames_total{{interface=\"{iface}\",reason=\"{reason}\",verdict=\"{verdict}\"}}"
                ),
                *n,
            )
        })
        .collect();
    for ((reason, partition), n) in &want_partitions {
        let metric = match reason {
            Reason::PkeyViolation => "pkeyfw_pkey_violations_total",
            _ => "pkeyfw_qkey_violations_total",
        };
        checks.push((
            format!("{metric}{{interface=\"{iface}\",partition=\"{partition}\"}}"),
            *n,
        ));
    }
    for (outcome, n) in &want_stamps {
        checks.push((
            format!("pkeyfw_stamp_frames_total{{interface=\"{iface}\",outcome=\"{outcome}\"}}"),
            *n,
        ));
    }
    checks.extend([
        (
            format!("pkeyfw_policy_reloads_total{{interface=\"{iface}\",result=\"applied\"}}"),
            1,
        ),
        (
            format!("pkeyfw_policy_reloads_total{{interface=\"{iface}\",result=\"refused\"}}"),
            1,
        ),
        (
            format!(
                "pkeyfw_policy_info{{interface=\"{iface}\",file=\"{}\"}}",
                std::path::absolute(&policy_path).unwrap().display()
            ),
            1,
        ),
        (
            format!("pkeyfw_qps_bound{{interface=\"{iface}\",by=\"entry\"}}"),
            policy.qps.len() as u64,
        ),
    ]);
    // Prometheus needs a start-up and a scrape or two.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let got: Vec<(String, Option<u64>)> = checks
            .iter()
            .map(|(q, _)| (q.clone(), query(prometheus_port, q)))
            .collect();
        let wrong: Vec<String> = checks
            .iter()
            .zip(&got)
            .filter(|((_, want), (_, got))| *got != Some(*want))
            .map(|((q, want), (_, got))| format!("{q}: want {want}, got {got:?}"))
            .collect();
        if wrong.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "Prometheus does not have what the kernel counted:\n{}",
            wrong.join("\n")
        );
        std::thread::sleep(Duration::from_millis(500));
    }

    // Each dashboard query, for this attachment, gives the series the
    // frames made: the label its panel shows, across them.
    let partitions = |reason| {
        want_partitions
            .keys()
            .filter(move |(r, _)| *r == reason)
            .map(|(_, p)| p.as_str())
    };
    let policy_file = std::path::absolute(&policy_path).unwrap();
    let expected = BTreeMap::from([
        (
            "Frames by verdict/A",
            values("verdict", want_frames.keys().map(|(_, v)| *v)),
        ),
        (
            "Refused frames by reason/A",
            values(
                "reason",
                want_frames
                    .keys()
                    .filter(|(_, v)| *v != "pass")
                    .map(|(r, _)| *r),
            ),
        ),
        (
            "P_Key violations by partition/A",
            values("partition", partitions(Reason::PkeyViolation)),
        ),
        (
            "Q_Key violations by partition/A",
            values("partition", partitions(Reason::QkeyViolation)),
        ),
        (
            "Stamping outcomes/A",
            values("outcome", want_stamps.keys().copied()),
        ),
        (
            "Dropped at egress: RoCE no QP sent/A",
            values(
                "outcome",
                want_stamps
                    .keys()
                    .copied()
                    .filter(|o| NO_QP_SENDS.contains(o)),
            ),
        ),
        ("QPs bound/A", values("by", ["entry", "rule", "probe"])),
        ("QPs quarantined/A", values("interface", [iface.as_str()])),
        // The probes count RDMA verbs: a veth has no RDMA device.
        ("RDMA verbs the probes saw/A", values("outcome", [])),
        (
            "Events over the kernel's budget/A",
            values("kind", EventKind::ALL.map(|k| k.name())),
        ),
        ("Policy reloads/A", values("result", ["applied", "refused"])),
        (
            "Policies in force/A",
            values("file", [policy_file.to_str().unwrap()]),
        ),
        ("Policies in force/B", values("interface", [iface.as_str()])),
        ("Attachments/A", values("mode", ["native"])),
        // Attached: no longer setting up.
        ("Attachments/B", values("pid", [])),
        // Other tests' switches may be attached meanwhile: no interface
        // of this test's to narrow it to.
        ("Switch ports not in the policy/A", Expect::Anything),
        (
            "pkeyfw versions/A",
            values("version", [env!("CARGO_PKG_VERSION")]),
        ),
    ]);
    let instance = format!("127.0.0.1:{metrics_port}");
    check_dashboard(prometheus_port, &instance, iface, &expected);
}

/// Runs every query of the dashboard for `iface` on `instance` until each
/// returns what `expected` says of its panel (for at most 30 s).
fn check_dashboard(port: u16, instance: &str, iface: &str, expected: &BTreeMap<&str, Expect>) {
    let queries = dashboard_queries(instance, iface);
    assert_eq!(
        queries.keys().map(String::as_str).collect::<Vec<_>>(),
        expected.keys().copied().collect::<Vec<_>>(),
        "every dashboard query has what it must return here, and no other"
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let wrong: Vec<String> = queries
            .iter()
            .filter_map(|(panel, q)| {
                series(port, q)
                    .and_then(|got| expected[panel.as_str()].check(&got, iface))
                    .err()
                    .map(|e| format!("{panel}: {q}: {e}"))
            })
            .collect();
        if wrong.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "dashboard queries:\n{}",
            wrong.join("\n")
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Egress outcomes of RoCE no rdma_rxe QP sends: what the dashboard's
/// panel and the PkeyfwForgedEgress alert single out.
const NO_QP_SENDS: [&str; 4] = ["forged", "gso", "malformed", "too_long"];

/// What a dashboard query must return.
enum Expect {
    /// Series whose `label` takes exactly these values (none: no series),
    /// each of this test's interface if it names one.
    Values(&'static str, BTreeSet<String>),
    /// Any series, as long as Prometheus runs the query.
    Anything,
}

/// Series whose `label` takes exactly `these` values.
fn values<'a>(label: &'static str, these: impl IntoIterator<Item = &'a str>) -> Expect {
    Expect::Values(label, these.into_iter().map(str::to_string).collect())
}

impl Expect {
    fn check(&self, got: &[Value], iface: &str) -> Result<(), String> {
        let Expect::Values(label, want) = self else {
            return Ok(());
        };
        let values: BTreeSet<String> = got
            .iter()
            .map(|s| s["metric"][label].as_str().unwrap_or_default().to_string())
            .collect();
        let foreign = got.iter().any(|s| {
            s["metric"]["interface"]
                .as_str()
                .is_some_and(|i| i != iface)
        });
        if values != *want || foreign {
            return Err(format!("want {label} in {want:?}, got {got:?}"));
        }
        Ok(())
    }
}

/// Every query of the dashboard's panels, by "panel title/refId", with
/// Grafana's variables filled as it would for `iface` on `instance`.
fn dashboard_queries(instance: &str, iface: &str) -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(monitoring().join("pkeyfw-dashboard.json")).unwrap();
    let dashboard: Value = serde_json::from_str(&text).unwrap();
    let mut queries = BTreeMap::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        let title = panel["title"].as_str().unwrap();
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"]
                .as_str()
                .unwrap()
                .replace("$__rate_interval", "1m")
                .replace("$instance", instance)
                .replace("$interface", iface);
            assert!(
                !expr.contains('$'),
                "{title}: a variable the test does not fill: {expr}"
            );
            let key = format!("{title}/{}", target["refId"].as_str().unwrap());
            assert!(
                queries.insert(key, expr).is_none(),
                "{title}: two targets with one refId"
            );
        }
    }
    queries
}

/// The metric names `promql` reads.
fn metric_names(promql: &str) -> BTreeSet<String> {
    promql
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with("pkeyfw_"))
        .map(str::to_string)
        .collect()
}

/// The alerting rules as promtool reads them: `check rules` finds them
/// clean, `test rules` passes their unit tests, and the unit tests catch
/// rules that never fire (thresholds out of reach) and rules that fire
/// at once (no `for`); every metric the rules and the dashboard read is
/// one `pkeyfw metrics` exports.
#[test]
fn the_alerting_rules_pass_promtool() {
    let promtool = |dir: &Path, args: &[&str]| {
        let out = Command::new("promtool")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("promtool (cargo xtask test installs it)");
        let said = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        (out.status.success(), said)
    };
    let dir = monitoring();
    let (ok, said) = promtool(&dir, &["check", "rules", "pkeyfw.rules.yml"]);
    assert!(
        ok && said.contains("SUCCESS") && !said.contains("WARN"),
        "{said}"
    );
    let (ok, said) = promtool(&dir, &["test", "rules", "pkeyfw.rules.test.yml"]);
    assert!(ok, "{said}");

    let rules = std::fs::read_to_string(dir.join("pkeyfw.rules.yml")).unwrap();
    let tests = std::fs::read_to_string(dir.join("pkeyfw.rules.test.yml")).unwrap();
    let never_fires = rules
        .replace(") > 0", ") > 1e9")
        .replace("== 0", "== 2")
        .replace("== 1", "== 2");
    let at_once: String = rules
        .lines()
        .filter(|l| !l.trim_start().starts_with("for:"))
        .map(|l| format!("{l}\n"))
        .collect();
    for (what, broken) in [("never firing", never_fires), ("firing at once", at_once)] {
        assert_ne!(broken, rules);
        let copy = tempfile::tempdir().unwrap();
        std::fs::write(copy.path().join("pkeyfw.rules.yml"), broken).unwrap();
        std::fs::write(copy.path().join("pkeyfw.rules.test.yml"), &tests).unwrap();
        let (ok, said) = promtool(copy.path(), &["test", "rules", "pkeyfw.rules.test.yml"]);
        assert!(
            !ok && said.contains("FAILED"),
            "the unit tests pass rules {what}: {said}"
        );
    }

    let exported = include_str!("../../src/cmd/metrics.rs");
    let dashboard = std::fs::read_to_string(dir.join("pkeyfw-dashboard.json")).unwrap();
    let named = metric_names(&rules);
    assert!(named.len() >= 10, "{named:?}");
    for name in named.iter().chain(&metric_names(&dashboard)) {
        assert!(
            exported.contains(&format!("\"{name}\"")),
            "{name} is not a metric `pkeyfw metrics` exports"
        );
    }
}

/// User nobody, who runs the flood.
const NOBODY: libc::uid_t = 65534;

/// Connections the flood keeps open: more than the server once served at
/// once (32), and more than one address may hold now.
const FLOOD_CONNECTIONS: usize = 64;

/// How long a scrape may take, connecting included, while the flood runs.
const SCRAPE_DEADLINE: Duration = Duration::from_secs(2);

/// `pkeyfw metrics` on a free port of 127.0.0.1, once it answers; killed
/// on drop. Its port.
fn start_metrics() -> (common::Killed, u16) {
    let port = free_port();
    let server = common::Killed(
        Command::new(env!("CARGO_BIN_EXE_pkeyfw"))
            .args(["metrics", "--listen", &format!("127.0.0.1:{port}")])
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while get(port, "/metrics").is_none() {
        assert!(Instant::now() < deadline, "pkeyfw metrics never answered");
        std::thread::sleep(Duration::from_millis(50));
    }
    (server, port)
}

/// One scrape of 127.0.0.1:`port` as a scraper does it: a connection of
/// its own, `GET /metrics`, the answer read at once; all of it within
/// `deadline`. How long it took.
fn scrape(port: u16, deadline: Duration) -> Result<Duration, String> {
    let start = Instant::now();
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut s = TcpStream::connect_timeout(&addr, deadline).map_err(|e| format!("connect: {e}"))?;
    let left = || {
        deadline
            .checked_sub(start.elapsed())
            .filter(|d| !d.is_zero())
            .ok_or("out of time")
    };
    s.set_write_timeout(Some(left()?)).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .map_err(|e| format!("sending the request: {e}"))?;
    let mut text = Vec::new();
    let mut buf = [0u8; 16384];
    loop {
        s.set_read_timeout(Some(left()?)).unwrap();
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => text.extend_from_slice(&buf[..n]),
            // A signal to this process (one test binary) is not the
            // server's answer: a read with a timeout is not restarted.
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(format!("reading the answer: {e}")),
        }
    }
    let text = String::from_utf8_lossy(&text);
    if !text.starts_with("HTTP/1.1 200") || !text.contains("\npkeyfw_build_info{") {
        return Err(format!("not the exposition: {text:.200}"));
    }
    Ok(start.elapsed())
}

/// What the flood did, as it reports when it stops.
#[derive(Debug)]
struct Flooded {
    /// Connections it made.
    connections: u64,
    /// Bytes of pipelined requests the server took.
    sent: u64,
    /// Connections the server closed on it.
    closed: u64,
}

/// A flood of `FLOOD_CONNECTIONS` connections to 127.0.0.1:`port`, for
/// `secs` seconds, from a forked child that drops to user `nobody` first:
/// each pipelines `GET /metrics` requests as fast as the server takes them
/// and never reads an answer (its receive buffer as small as may be); one
/// the server closes is made again. Killed when dropped.
struct Flood {
    pid: libc::pid_t,
    report: std::fs::File,
}

impl Flood {
    fn start(port: u16, secs: i64) -> Flood {
        use std::os::fd::FromRawFd as _;
        // Everything the child uses is made before the fork: it only makes
        // system calls (async-signal-safe) on it, then _exits.
        let requests = b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n".repeat(1000);
        let addr = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: port.to_be(),
            sin_addr: libc::in_addr {
                s_addr: u32::from_ne_bytes([127, 0, 0, 1]),
            },
            sin_zero: [0; 8],
        };
        let mut pipe = [0; 2];
        // SAFETY: a two-element array for pipe(2).
        assert_eq!(
            unsafe { libc::pipe2(pipe.as_mut_ptr(), libc::O_CLOEXEC) },
            0
        );
        // SAFETY: the child only makes system calls on memory prepared
        // before the fork, then _exits.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
        if pid == 0 {
            // SAFETY: plain system calls; see above.
            unsafe { flood(pipe[1], &addr, &requests, secs) }
        }
        // SAFETY: the write end is the child's; the read end is ours alone.
        let report = unsafe {
            libc::close(pipe[1]);
            std::fs::File::from_raw_fd(pipe[0])
        };
        Flood { pid, report }
    }

    /// Waits for the flood to stop by itself; what it did. It must have
    /// run as nobody, for as long as it was told.
    fn report(mut self) -> Flooded {
        let mut status = 0;
        // SAFETY: our own child.
        unsafe { libc::waitpid(self.pid, &mut status, 0) };
        self.pid = 0;
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "the flood failed (status {status:#x}; exit codes: 10-13 dropping privileges)"
        );
        let mut counts = [0u8; 24];
        self.report.read_exact(&mut counts).unwrap();
        let at = |i: usize| u64::from_ne_bytes(counts[i * 8..i * 8 + 8].try_into().unwrap());
        Flooded {
            connections: at(0),
            sent: at(1),
            closed: at(2),
        }
    }
}

impl Drop for Flood {
    fn drop(&mut self) {
        if self.pid > 0 {
            // SAFETY: our own child, not yet reaped.
            unsafe {
                libc::kill(self.pid, libc::SIGKILL);
                libc::waitpid(self.pid, std::ptr::null_mut(), 0);
            }
        }
    }
}

/// The flood's child: drops to nobody, floods, writes its counts to
/// `report` and _exits.
///
/// # Safety
/// Only in the child of a fork: makes system calls alone.
unsafe fn flood(report: i32, addr: &libc::sockaddr_in, requests: &[u8], secs: i64) -> ! {
    unsafe {
        let step = |ok: bool, code: i32| {
            if !ok {
                libc::_exit(code)
            }
        };
        step(libc::setgroups(0, std::ptr::null()) == 0, 10);
        step(libc::setresgid(NOBODY, NOBODY, NOBODY) == 0, 11);
        step(libc::setresuid(NOBODY, NOBODY, NOBODY) == 0, 12);
        step(libc::geteuid() == NOBODY && libc::getuid() == NOBODY, 13);
        let now = || {
            let mut t = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t);
            t.tv_sec
        };
        let end = now() + secs;
        let int = size_of::<libc::c_int>() as libc::socklen_t;
        let (mut connections, mut sent, mut closed) = (0u64, 0u64, 0u64);
        let mut fds = [-1; FLOOD_CONNECTIONS];
        while now() < end {
            for fd in &mut fds {
                if *fd < 0 {
                    let s = libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
                    if s < 0 {
                        continue;
                    }
                    // The smallest receive buffer: the server's answers
                    // stall at once.
                    let small: libc::c_int = 1;
                    libc::setsockopt(
                        s,
                        libc::SOL_SOCKET,
                        libc::SO_RCVBUF,
                        (&raw const small).cast(),
                        int,
                    );
                    // connect(2) gives up after this (a backlog nobody
                    // accepts from).
                    let wait = libc::timeval {
                        tv_sec: 0,
                        tv_usec: 200_000,
                    };
                    libc::setsockopt(
                        s,
                        libc::SOL_SOCKET,
                        libc::SO_SNDTIMEO,
                        (&raw const wait).cast(),
                        size_of::<libc::timeval>() as libc::socklen_t,
                    );
                    let size = size_of::<libc::sockaddr_in>() as libc::socklen_t;
                    if libc::connect(s, (addr as *const libc::sockaddr_in).cast(), size) != 0 {
                        libc::close(s);
                        continue;
                    }
                    connections += 1;
                    *fd = s;
                }
                // What the server has not taken yet stays in the buffer;
                // more is sent while it takes it.
                let n = libc::send(
                    *fd,
                    requests.as_ptr().cast(),
                    requests.len(),
                    libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
                );
                let mut p = libc::pollfd {
                    fd: *fd,
                    events: libc::POLLRDHUP,
                    revents: 0,
                };
                libc::poll(&mut p, 1, 0);
                let gone = p.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0;
                if n > 0 {
                    sent += n as u64;
                }
                if gone || (n < 0 && *libc::__errno_location() != libc::EAGAIN) {
                    libc::close(*fd);
                    *fd = -1;
                    closed += 1;
                }
            }
            let pause = libc::timespec {
                tv_sec: 0,
                tv_nsec: 20_000_000,
            };
            libc::nanosleep(&pause, std::ptr::null_mut());
        }
        let mut counts = [0u8; 24];
        for (i, n) in [connections, sent, closed].into_iter().enumerate() {
            counts[i * 8..i * 8 + 8].copy_from_slice(&n.to_ne_bytes());
        }
        step(
            libc::write(report, counts.as_ptr().cast(), counts.len()) == counts.len() as isize,
            14,
        );
        libc::_exit(0)
    }
}

/// Sixty-four connections of user nobody's from 127.0.0.1, the address a
/// local Prometheus scrapes from too, that pipeline requests and never
/// read the answers, made again as the server closes them (issue 36 §4:
/// thirty-two such connections once held every slot, and the server
/// stopped accepting): every scrape still gets its answer within
/// [`SCRAPE_DEADLINE`], again and again, and a real Prometheus scraping
/// meanwhile never misses (`up` stays 1).
#[test]
fn scrapes_are_answered_through_a_flood_of_unread_connections() {
    common::require_root();
    // `pkeyfw metrics` reads every attachment in the root.
    let _root = common::pins_root();
    let _cpus = common::cpus_alone();
    let (_metrics, port) = start_metrics();
    let data = tempfile::tempdir().unwrap();
    let config = data.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n  - job_name: pkeyfw\n    static_configs:\n      - targets: ['127.0.0.1:{port}']\n"
        ),
    )
    .unwrap();
    let prometheus_port = free_port();
    let _prometheus = common::Killed(
        Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                data.path().join("tsdb").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{prometheus_port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus (cargo xtask test installs it)"),
    );
    let up = "up{job=\"pkeyfw\"}";
    let deadline = Instant::now() + Duration::from_secs(60);
    while query(prometheus_port, up) != Some(1) {
        assert!(Instant::now() < deadline, "Prometheus never scraped");
        std::thread::sleep(Duration::from_millis(250));
    }

    const SECS: u64 = 15;
    let flood = Flood::start(port, SECS as i64 + 1);
    // Long enough for the flood to hold what it can.
    std::thread::sleep(Duration::from_secs(1));
    let start = Instant::now();
    let mut failed = Vec::new();
    let mut slowest = Duration::ZERO;
    let mut scrapes = 0;
    while start.elapsed() < Duration::from_secs(SECS - 2) {
        scrapes += 1;
        match scrape(port, SCRAPE_DEADLINE) {
            Ok(took) => slowest = slowest.max(took),
            Err(e) => failed.push(format!("{:.1?}: {e}", start.elapsed())),
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    // Every scrape Prometheus made meanwhile succeeded (what
    // PkeyfwMetricsDown alerts on), and it made them.
    let window = format!("[{}s]", start.elapsed().as_secs());
    let prometheus_min = query(prometheus_port, &format!("min_over_time({up}{window})"));
    let prometheus_count = query(prometheus_port, &format!("count_over_time({up}{window})"));
    let flooded = flood.report();
    println!(
        "{scrapes} scrapes, the slowest {slowest:.1?}; the flood: {flooded:?}; Prometheus: up at least {prometheus_min:?} in {prometheus_count:?} scrapes"
    );
    assert!(
        failed.is_empty(),
        "{} of {scrapes} scrapes failed during the flood:\n{}",
        failed.len(),
        failed.join("\n")
    );
    assert!(
        flooded.connections >= FLOOD_CONNECTIONS as u64 && flooded.sent > 0 && flooded.closed > 0,
        "the flood did not take hold, or the server shed none of it: {flooded:?}"
    );
    assert_eq!(
        prometheus_min,
        Some(1),
        "Prometheus missed scrapes during the flood"
    );
    assert!(
        prometheus_count.is_some_and(|n| n >= SECS - 5),
        "Prometheus scraped {prometheus_count:?} times during the flood"
    );
}
