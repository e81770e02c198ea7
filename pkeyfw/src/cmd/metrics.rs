//! `pkeyfw metrics`: the kernel's counters of every attachment, pinned and
//! foreground alike, in the Prometheus text format over HTTP.
//! Each scrape reads the pinned maps afresh (the counters live in the
//! kernel, not in this process), so it needs no other pkeyfw process and
//! loses nothing when it restarts.
//!
//! No client can wedge it ([`server`]): an answer left unread is given up
//! on after 2 s (5 s for a whole answer), a connection waits at most 5 s
//! for a request, makes at most 100 and lives at most 60 s; past 16
//! connections from one address (every loopback address counting as one)
//! or 64 in all, the one least worth keeping is closed at once (one whose
//! answer has waited 0.5 s unread, else the one idle longest): accepting
//! never stops, and a scraper that reads its answer is served through a
//! flood.

mod server;

use std::{
    net::SocketAddr,
    sync::Mutex,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use http_body_util::Full;
use hyper::{Request, Response, StatusCode, body::Bytes, header};
use prometheus::{IntCounterVec, IntGaugeVec, Opts, Registry, TextEncoder};
use tokio::net::TcpListener;

use pkeyfw_common::{Capture, Reason, Stamp, Verdict, abi::EventKind};

use crate::{
    cni,
    loading::pins::{self, record as tenants},
    reporting::{describe, live},
};

/// Serve Prometheus metrics: frames per reason and verdict, P_Key and
/// Q_Key violations per partition, stamping and probe outcomes, bound QPs.
///
/// Reads every attachment's pinned maps at each scrape (GET /metrics);
/// no QPN labels, so the series stay few.
#[derive(clap::Args)]
pub struct MetricsArgs {
    /// Address and port to listen on.
    #[arg(long, default_value = "127.0.0.1:9435")]
    pub listen: SocketAddr,
}

/// Prometheus's text format, version 0.0.4.
const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

pub fn run(args: &MetricsArgs) -> Result<()> {
    pins::host_bpffs("metrics")?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(serve(args.listen))
}

async fn serve(addr: SocketAddr) -> Result<()> {
    let listener = TcpListener::bind(addr)
        .await
        .with_context(|| format!("listening on {addr}"))?;
    println!("pkeyfw: serving metrics on http://{addr}/metrics");
    server::serve(listener, answer).await
}

fn answer(req: &Request<hyper::body::Incoming>) -> Response<Full<Bytes>> {
    let (status, kind, body) = match req.uri().path() {
        "/metrics" => match shared_exposition() {
            Ok(text) => (StatusCode::OK, CONTENT_TYPE, text),
            Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, "text/plain", e),
        },
        _ => (
            StatusCode::NOT_FOUND,
            "text/plain",
            Bytes::from_static(b"pkeyfw serves /metrics\n"),
        ),
    };
    let mut response = Response::new(Full::new(body));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, header::HeaderValue::from_static(kind));
    response
}

/// How long one read of the maps answers every scrape: clients polling at
/// any rate cost one read a second, and none starves Prometheus.
const FRESH: Duration = Duration::from_secs(1);

/// The exposition, read again only when the last read is older than
/// [`FRESH`].
fn shared_exposition() -> Result<Bytes, Bytes> {
    type Read = (Instant, Result<Bytes, Bytes>);
    static LAST: Mutex<Option<Read>> = Mutex::new(None);
    let mut last = LAST.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((at, read)) = &*last
        && at.elapsed() < FRESH
    {
        return read.clone();
    }
    let read = exposition()
        .map(Bytes::from)
        .map_err(|e| Bytes::from(format!("{e:#}\n")));
    *last = Some((Instant::now(), read.clone()));
    read
}

/// The families of one scrape, registered under their full names.
struct Families {
    registry: Registry,
}

impl Families {
    fn counter(&self, name: &str, help: &str, labels: &[&str]) -> Result<IntCounterVec> {
        let family = IntCounterVec::new(Opts::new(name, help), labels)?;
        self.registry.register(Box::new(family.clone()))?;
        Ok(family)
    }

    fn gauge(&self, name: &str, help: &str, labels: &[&str]) -> Result<IntGaugeVec> {
        let family = IntGaugeVec::new(Opts::new(name, help), labels)?;
        self.registry.register(Box::new(family.clone()))?;
        Ok(family)
    }
}

/// The text of one scrape: every attachment's counters now.
pub fn exposition() -> Result<String> {
    let f = Families {
        registry: Registry::new(),
    };
    let at = ["interface", "netns"];
    let frames = f.counter(
        "pkeyfw_frames_total",
        "RoCE and other frames the filter judged, by reason and verdict",
        &[at[0], at[1], "reason", "verdict"],
    )?;
    let xmit = f.counter(
        "pkeyfw_switch_xmit_frames_total",
        "Frames a switch port's outbound check judged, by reason and verdict (its inbound ones are pkeyfw_frames_total)",
        &[at[0], at[1], "reason", "verdict"],
    )?;
    let pkey = f.counter(
        "pkeyfw_pkey_violations_total",
        "Frames refused for their P_Key, per partition of the port's table or other (an IB port's P_KeyViolations)",
        &[at[0], at[1], "partition"],
    )?;
    let qkey = f.counter(
        "pkeyfw_qkey_violations_total",
        "Datagrams refused for their Q_Key, per partition of their P_Key (an IB port's Q_KeyViolations)",
        &[at[0], at[1], "partition"],
    )?;
    let stamps = f.counter(
        "pkeyfw_stamp_frames_total",
        "Outgoing and restored frames per stamping outcome",
        &[at[0], at[1], "outcome"],
    )?;
    let probes = f.counter(
        "pkeyfw_probe_verbs_total",
        "RDMA verbs the probes saw, per outcome",
        &[at[0], at[1], "outcome"],
    )?;
    let suppressed = f.counter(
        "pkeyfw_events_suppressed_total",
        "Events the kernel counted but did not send, over its budget for their kind (64 per CPU per second each)",
        &[at[0], at[1], "kind"],
    )?;
    let lost = f.counter(
        "pkeyfw_events_lost_total",
        "Events within the kernel's budget that found their ring full (the probes' reports have a ring of their own, sized for every CPU's budget)",
        &[at[0], at[1], "kind"],
    )?;
    let bound = f.gauge(
        "pkeyfw_qps_bound",
        "QPs the policy in force binds, by what bound them: a [[qp]] entry, a rule applied by pkeyfw, or by the QP-creation probe",
        &[at[0], at[1], "mode", "held", "by"],
    )?;
    let quarantined = f.gauge(
        "pkeyfw_qps_quarantined",
        "QPs a rule would bind that the QP-creation probe had no room for: every frame to or from them is refused",
        &[at[0], at[1]],
    )?;
    let reloads = f.counter(
        "pkeyfw_policy_reloads_total",
        "Policy reloads, applied or refused (an invalid file, or the kernel refused it)",
        &[at[0], at[1], "result"],
    )?;
    let policy = f.gauge(
        "pkeyfw_policy_info",
        "The policy in force: its file and the map generation it lives in (always 1)",
        &[at[0], at[1], "file", "generation"],
    )?;
    let applied = f.gauge(
        "pkeyfw_policy_applied_timestamp_seconds",
        "When the policy in force was applied (Unix time)",
        &[at[0], at[1]],
    )?;
    let unlisted = f.gauge(
        "pkeyfw_switch_unlisted_port",
        "A port of a switch's bridge that its policy does not list: its RoCE reaches none of the switch's ports (always 1)",
        &["netns", "bridge", "port"],
    )?;
    let pods = f.gauge(
        "pkeyfw_cni_port_info",
        "A bridge port the CNI plugin made an access port of a pod's partition: the pod as its runtime names it (empty where it does not), its network, RDMA device and key (always 1)",
        &[at[0], at[1], "bridge", "pod", "network", "device", "pkey"],
    )?;
    for (netns, bridge) in cni::node::Bridge::everywhere() {
        for p in &bridge.ports {
            pods.with_label_values(&[
                &p.interface,
                &netns,
                &bridge.name,
                p.pod.as_deref().unwrap_or(""),
                &p.network,
                &p.device,
                &format!("{:#06x}", p.pkey),
            ])
            .set(1);
        }
    }
    let tenants = f.gauge(
        "pkeyfw_tenant_device_info",
        "A soft-RoCE device pkeyfw made for one tenant (own_device): its port (interface), uplink, device, the key of its tenant's rule and the rule's line (always 1)",
        &[at[0], at[1], "uplink", "device", "pkey", "rule_line"],
    )?;
    for (host, record) in tenants::everywhere() {
        for t in &record.devices {
            tenants
                .with_label_values(&[
                    &t.made.iface,
                    &host.netns.label(),
                    &host.iface,
                    &t.made.device,
                    &format!("{:#06x}", t.pkey),
                    &t.line.to_string(),
                ])
                .set(1);
        }
    }
    let build = f.gauge(
        "pkeyfw_build_info",
        "The pkeyfw serving these metrics (always 1)",
        &["version"],
    )?;
    build.with_label_values(&[env!("CARGO_PKG_VERSION")]).set(1);
    let (snaps, setting_up) = live::summaries()?;
    let starting = f.gauge(
        "pkeyfw_attachment_setting_up",
        "An attachment a `pkeyfw attach` (process pid) is still loading: its counters appear once it is attached (always 1)",
        &[at[0], at[1], "pid"],
    )?;
    for s in &setting_up {
        starting
            .with_label_values(&[&s.iface, &s.netns.label(), &s.pid.to_string()])
            .set(1);
    }
    for snap in snaps {
        let netns = snap.netns.clone().unwrap_or_else(|| "host".to_string());
        let at = [snap.iface.as_str(), netns.as_str()];
        let directions = [
            Some((&frames, &snap.reasons)),
            snap.switch.as_ref().map(|x| (&xmit, x)),
        ];
        for (family, counts) in directions.into_iter().flatten() {
            for reason in Reason::ALL {
                for verdict in Verdict::ALL {
                    let n = counts.get(reason, verdict);
                    if n > 0 {
                        family
                            .with_label_values(&[at[0], at[1], reason.name(), verdict.name()])
                            .inc_by(n);
                    }
                }
            }
        }
        for &(reason, partition, n) in &snap.violations {
            let family = if reason == Reason::PkeyViolation {
                &pkey
            } else {
                &qkey
            };
            family
                .with_label_values(&[at[0], at[1], &describe::violation_partition(partition)])
                .inc_by(n);
        }
        let outcomes = Stamp::ALL
            .iter()
            .map(|s| (&stamps, s.name(), snap.stamps[s.index() as usize]))
            .chain(
                Capture::ALL
                    .iter()
                    .map(|c| (&probes, c.name(), snap.captures[c.index() as usize])),
            );
        for (family, outcome, n) in outcomes.filter(|&(_, _, n)| n > 0) {
            family.with_label_values(&[at[0], at[1], outcome]).inc_by(n);
        }
        for kind in EventKind::ALL {
            // Every kind from the start, at 0.
            suppressed
                .with_label_values(&[at[0], at[1], kind.name()])
                .inc_by(snap.suppressed[kind.index() as usize]);
            lost.with_label_values(&[at[0], at[1], kind.name()])
                .inc_by(snap.lost[kind.index() as usize]);
        }
        for (by, n) in snap.bound_by {
            bound
                .with_label_values(&[at[0], at[1], snap.mode.name(), &snap.held(), by])
                .set(n as i64);
        }
        quarantined
            .with_label_values(&[at[0], at[1]])
            .set(snap.quarantined.len() as i64);
        for (result, n) in [
            ("applied", snap.record.reloaded),
            ("refused", snap.record.refused),
        ] {
            // A counter that exists from the start, at 0.
            reloads.with_label_values(&[at[0], at[1], result]).inc_by(n);
        }
        let file = snap
            .policy_file
            .as_ref()
            .map_or(String::new(), |p| p.display().to_string());
        policy
            .with_label_values(&[at[0], at[1], &file, &snap.generation.to_string()])
            .set(1);
        // Each port of the bridge says it: one series.
        if let Some(b) = &snap.bridge {
            for port in &b.unlisted {
                unlisted.with_label_values(&[at[1], &b.name, port]).set(1);
            }
        }
        if snap.record.applied_at > 0 {
            applied
                .with_label_values(&[at[0], at[1]])
                .set(snap.record.applied_at as i64);
        }
    }
    Ok(TextEncoder::new().encode_to_string(&f.registry.gather())?)
}
