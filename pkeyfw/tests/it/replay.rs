//! `pkeyfw replay` end to end: the real capture with known totals, the JSON
//! format, pcapng and Linux cooked captures, and the errors a user meets.

use crate::common;

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
};

use pcap_file::{
    DataLink,
    pcap::{PcapHeader, PcapPacket, PcapWriter},
    pcapng::{
        PcapNgWriter,
        blocks::{
            enhanced_packet::EnhancedPacketBlock, interface_description::InterfaceDescriptionBlock,
        },
    },
};
use pkeyfw::capture;
use pkeyfw_testkit::{fixtures, wire::Packet};
use serde_json::Value;

const CAPTURE: &str = "rc-connectx-oferby-proxy.pcap";

fn pkeyfw(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pkeyfw"))
        .args(args)
        .output()
        .expect("run pkeyfw")
}

/// A scratch file in the directory cargo keeps for integration tests.
fn tmp(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("replay");
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn write(name: &str, text: &str) -> PathBuf {
    let path = tmp(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn json_lines(out: &Output) -> Vec<Value> {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone())
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON object per line"))
        .collect()
}

fn replay_json(policy: &Path, capture: &Path) -> (Vec<Value>, Value) {
    common::require_root();
    let mut lines = json_lines(&pkeyfw(&[
        "replay",
        "--policy",
        policy.to_str().unwrap(),
        capture.to_str().unwrap(),
        "--json",
    ]));
    let totals = lines.pop().expect("a totals object");
    (lines, totals)
}

/// The ConnectX capture (checked independently): 123 frames, 18 not RoCE,
/// 68 RC frames to QP 0x45 and 37 to QP 0x48, all with P_Key 0xffff.
#[test]
fn connectx_capture_with_one_qp_bound_and_unknown_dropped() {
    let policy = write(
        "connectx.toml",
        "[port]\npkeys = [0xffff]\n[enforcement]\nunknown_qp = \"drop\"\n[[qp]]\nqpn = 0x45\ntype = \"rc\"\npkey = 0xffff\n",
    );
    let (frames, totals) = replay_json(&policy, &fixtures::capture(CAPTURE));
    assert_eq!(frames.len(), 123);
    for (i, f) in frames.iter().enumerate() {
        assert_eq!(f["index"], i);
        assert!(f["verdict"] == "pass" || f["verdict"] == "drop");
    }
    let t = &totals["totals"];
    assert_eq!(t["ok"], 68);
    assert_eq!(t["not_roce"], 18);
    assert_eq!(t["unknown_qp"], 37);
    assert_eq!(
        t.as_object().unwrap().len(),
        pkeyfw_common::Reason::COUNT,
        "every reason"
    );
    assert_eq!(totals["passed"], 86);
    assert_eq!(totals["dropped"], 37);
    assert_eq!(frames[0]["reason"], "not_roce");
}

#[test]
fn connectx_capture_against_a_partition_it_is_not_in() {
    let policy = write(
        "partition.toml",
        "[port]\npkeys = [0xffff, 0x8001]\n[[qp]]\nqpn = 0x45\ntype = \"rc\"\npkey = 0x8001\n[[qp]]\nqpn = 0x48\ntype = \"uc\"\npkey = 0xffff\n",
    );
    let (_, totals) = replay_json(&policy, &fixtures::capture(CAPTURE));
    let t = &totals["totals"];
    assert_eq!(t["pkey_violation"], 68);
    assert_eq!(t["opcode_mismatch"], 37);
    assert_eq!(t["not_roce"], 18);
}

#[test]
fn text_output_has_a_line_per_frame_and_totals() {
    common::require_root();
    let policy = write("text.toml", "[port]\npkeys = [0xffff]\n");
    let out = pkeyfw(&[
        "replay",
        "--policy",
        policy.to_str().unwrap(),
        fixtures::capture(CAPTURE).to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("unknown_qp                105"), "{text}");
    assert!(
        text.contains("RoCE RC → QP 0x000045, P_Key 0xffff"),
        "{text}"
    );
    assert!(text.contains("123 frames: 123 passed, 0 dropped"), "{text}");
}

/// The ICRC the frame builder writes is the one real hardware writes, and
/// the capture check finds every real frame's ICRC right.
#[test]
fn icrc_matches_real_connectx_frames() {
    let frames = capture::read(&fixtures::capture(CAPTURE)).unwrap();
    let mut checked = 0;
    for f in frames
        .iter()
        .filter(|f| f.data.len() > 60 && f.data[12..14] == [8, 0] && f.data[23] == 17)
    {
        let d = &f.data;
        let ihl = usize::from(d[14] & 0xf) * 4;
        let (body, crc) = d.split_at(d.len() - 4);
        let want = u32::from_le_bytes(crc.try_into().unwrap());
        assert_eq!(
            pkeyfw_testkit::wire::icrc_of(body, 14, 14 + ihl, 14 + ihl + 8),
            want,
            "frame {}",
            f.index
        );
        assert_eq!(
            pkeyfw_testkit::wire::icrc_holds(d),
            Some(true),
            "frame {}",
            f.index
        );
        let mut bent = d.clone();
        bent[14 + ihl + 8 + 2] ^= 0x80; // the BTH P_Key's membership bit
        assert_eq!(
            pkeyfw_testkit::wire::icrc_holds(&bent),
            Some(false),
            "frame {}",
            f.index
        );
        checked += 1;
    }
    assert_eq!(checked, 105);
}

fn frames() -> Vec<Vec<u8>> {
    vec![
        Packet::rc(0xffff, 0x45).bytes(),
        Packet::rc(0x8001, 0x45).bytes(),
        Packet::ud(0xffff, 1, pkeyfw_common::verdict::GSI_QKEY).bytes(),
    ]
}

#[test]
fn pcapng_and_linux_cooked_captures() {
    let policy = write(
        "cooked.toml",
        "[port]\npkeys = [0xffff]\n[enforcement]\nunknown_qp = \"default-pkey\"\n",
    );

    let ng = tmp("frames.pcapng");
    let mut w = PcapNgWriter::new(std::fs::File::create(&ng).unwrap()).unwrap();
    w.write_pcapng_block(InterfaceDescriptionBlock {
        linktype: DataLink::ETHERNET,
        snaplen: 0,
        options: vec![],
    })
    .unwrap();
    for f in frames() {
        w.write_pcapng_block(EnhancedPacketBlock {
            interface_id: 0,
            timestamp: Default::default(),
            original_len: f.len() as u32,
            data: f.into(),
            options: vec![],
        })
        .unwrap();
    }
    drop(w);

    // SLL: packet type, ARPHRD, address length, address (8), protocol.
    let sll = tmp("frames-sll.pcap");
    let header = PcapHeader {
        datalink: DataLink::LINUX_SLL,
        ..Default::default()
    };
    let mut w = PcapWriter::with_header(std::fs::File::create(&sll).unwrap(), header).unwrap();
    for f in frames() {
        let mut c = vec![0, 0, 0, 1, 0, 6];
        c.extend_from_slice(&f[6..12]);
        c.extend_from_slice(&[0, 0]);
        c.extend_from_slice(&f[12..]);
        w.write_packet(&PcapPacket::new(Default::default(), c.len() as u32, &c))
            .unwrap();
    }
    drop(w);

    for capture in [&ng, &sll] {
        let (frames, totals) = replay_json(&policy, capture);
        let reasons: Vec<&str> = frames
            .iter()
            .map(|f| f["reason"].as_str().unwrap())
            .collect();
        assert_eq!(
            reasons,
            ["unknown_qp", "pkey_violation", "ok"],
            "{}",
            capture.display()
        );
        assert_eq!(totals["dropped"], 1);
    }
}

fn fails_with(args: &[&str], want: &[&str]) {
    let out = pkeyfw(args);
    assert!(!out.status.success(), "{args:?} should fail");
    let err = String::from_utf8_lossy(&out.stderr);
    for w in want {
        assert!(err.contains(w), "{args:?}: {err:?} lacks {w:?}");
    }
}

#[test]
fn clear_errors() {
    let policy = write("ok.toml", "[port]\npkeys = [0xffff]\n");
    let p = policy.to_str().unwrap();
    fails_with(
        &["replay", "--policy", p, "/nonexistent/x.pcap"],
        &["/nonexistent/x.pcap", "cannot read the capture"],
    );

    let garbage = write("garbage.pcap", "this is not a capture at all");
    fails_with(
        &["replay", "--policy", p, garbage.to_str().unwrap()],
        &["garbage.pcap", "not a pcap or pcapng capture"],
    );

    let raw_ip = tmp("rawip.pcap");
    let header = PcapHeader {
        datalink: DataLink::RAW,
        ..Default::default()
    };
    let mut w = PcapWriter::with_header(std::fs::File::create(&raw_ip).unwrap(), header).unwrap();
    w.write_packet(&PcapPacket::new(Default::default(), 20, &[0x45; 20]))
        .unwrap();
    drop(w);
    fails_with(
        &["replay", "--policy", p, raw_ip.to_str().unwrap()],
        &["rawip.pcap", "unsupported link type"],
    );

    let bad = write(
        "bad.toml",
        "[port]\npkeys = [0xffff]\n\n[[qp]]\nqpn = 1\ntype = \"rc\"\npkey = 0xffff\n",
    );
    fails_with(
        &[
            "replay",
            "--policy",
            bad.to_str().unwrap(),
            fixtures::capture(CAPTURE).to_str().unwrap(),
        ],
        &["bad.toml:5:7: qp[0].qpn", "0x2..=0xfffffe"],
    );
}

/// Without root the program cannot be loaded; say so, not just EPERM.
/// Everything nobody runs and reads is copied to a directory of its own:
/// the clone may be under a home directory only root can enter.
#[test]
fn unprivileged_run_says_it_needs_root() {
    use std::os::unix::fs::PermissionsExt as _;
    common::require_root();
    let dir = tempfile::Builder::new()
        .prefix("pkeyfw-unprivileged")
        .tempdir()
        .unwrap();
    let open = |path: &Path, mode| {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap()
    };
    open(dir.path(), 0o755);
    let (exe, policy, capture) = (
        dir.path().join("pkeyfw"),
        dir.path().join("unpriv.toml"),
        dir.path().join("unpriv.pcap"),
    );
    std::fs::copy(env!("CARGO_BIN_EXE_pkeyfw"), &exe).unwrap();
    std::fs::write(&policy, "[port]\npkeys = [0xffff]\n").unwrap();
    std::fs::copy(fixtures::capture(CAPTURE), &capture).unwrap();
    open(&exe, 0o755);
    for f in [&policy, &capture] {
        open(f, 0o644);
    }
    // setpriv (util-linux) drops to nobody with no capabilities.
    let out = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
        ])
        .arg(&exe)
        .args([
            "replay",
            "--policy",
            policy.to_str().unwrap(),
            capture.to_str().unwrap(),
        ])
        .output()
        .expect("setpriv");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("needs root"), "{err}");
}

/// A frame shorter than an Ethernet header is reported, not run.
#[test]
fn runt_frames_are_skipped_with_a_warning() {
    common::require_root();
    let policy = write("runt.toml", "[port]\npkeys = [0xffff]\n");
    let capture = tmp("runt.pcap");
    let mut w = PcapWriter::new(std::fs::File::create(&capture).unwrap()).unwrap();
    let good = Packet::rc(0xffff, 0x45).bytes();
    for f in [&good[..], &good[..10], &good[..]] {
        w.write_packet(&PcapPacket::new(Default::default(), f.len() as u32, f))
            .unwrap();
    }
    drop(w);
    let out = pkeyfw(&[
        "replay",
        "--policy",
        policy.to_str().unwrap(),
        capture.to_str().unwrap(),
        "--json",
    ]);
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    let lines = json_lines(&out);
    let indexes: Vec<u64> = lines[..lines.len() - 1]
        .iter()
        .map(|l| l["index"].as_u64().unwrap())
        .collect();
    assert_eq!(indexes, [0, 2]);
    assert_eq!(lines.last().unwrap()["frames"], 2);
    assert!(
        err.contains("frames [1] are shorter than an Ethernet header"),
        "{err}"
    );
}
