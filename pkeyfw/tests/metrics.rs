//! `pkeyfw metrics` scraped by a real Prometheus server (Debian's
//! `prometheus`, which `cargo xtask test` installs): frames are sent across
//! a veth pair the test makes, and Prometheus's query API must give exactly
//! the counts the host verdict predicts, per reason and verdict and per
//! partition; `promtool check metrics` must find the exposition clean.

mod common;

use std::{
    collections::BTreeMap,
    io::{Read as _, Write as _},
    net::{TcpListener, TcpStream},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use pkeyfw_common::{Reason, abi::violation_key, judge, pkey};
use pkeyfw_testkit::netns::{VethPair, send};
use serde_json::Value;

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

/// `query`'s value through Prometheus's HTTP API (`None`: no series yet).
fn query(port: u16, query: &str) -> Option<u64> {
    let encoded: String = query
        .bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect();
    let body = get(port, &format!("/api/v1/query?query={encoded}"))?;
    let v: Value = serde_json::from_str(&body).ok()?;
    let result = v["data"]["result"].as_array()?;
    let sample = result.first()?;
    sample["value"][1].as_str()?.parse().ok()
}

#[test]
fn prometheus_scrapes_what_the_kernel_counted() {
    common::require_root();
    let pair = VethPair::create(&common::tag("pm")).unwrap();
    pair.set_mtu(9000).unwrap();
    let (dir, policy_path) = common::policy_file(common::cases::BASE);
    let policy = common::policy(common::cases::BASE);
    let _fg = common::Foreground::start(&pair, &policy_path, "native");

    // Every case of the base policy, and what the verdict says of each.
    let frames: Vec<Vec<u8>> = common::cases::all()
        .into_iter()
        .filter(|c| c.policy == policy)
        .map(|c| c.frame)
        .collect();
    let mut want_frames: BTreeMap<(&str, &str), u64> = BTreeMap::new();
    let mut want_partitions: BTreeMap<(Reason, String), u64> = BTreeMap::new();
    for f in &frames {
        let o = judge(&f[..], &policy, &policy.config());
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
    send(&pair.ns_a, &pair.a, &frames).unwrap();
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
}
