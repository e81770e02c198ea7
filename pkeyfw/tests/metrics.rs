//! `pkeyfw metrics` scraped by a real Prometheus server (Debian's
//! `prometheus`, which `cargo xtask test` installs): frames are sent across
//! a veth pair the test makes, into the stamping filter and out of it, and
//! Prometheus's query API must give exactly the counts the host verdict and
//! stamping decision predict, per reason and verdict, per partition and per
//! stamping outcome; `promtool check metrics` must find the exposition
//! clean. Every query of the Grafana dashboard (deploy/monitoring) runs
//! against that Prometheus and must return the series the frames made; the
//! alerting rules pass `promtool check rules` and their unit tests.

mod common;

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
            && violation_key(o.reason, roce.pkey, true).is_some()
        {
            // Keys the port's table does not hold count as one "other".
            let in_table = pkeyfw_common::Tables::port_flags(&policy, pkey::key(roce.pkey)) != 0;
            let partition = match in_table {
                true => format!("{:#06x}", pkey::key(roce.pkey)),
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

    let exported = include_str!("../src/cmd/metrics.rs");
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
