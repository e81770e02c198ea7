//! GSO/GRO bypass (issue "Security", part 1): an unprivileged process sends
//! one UDP_SEGMENT datagram holding several RoCE v2 packets, the first one
//! allowed, the others refused. Every segment the kernel delivers to UDP
//! port 4791 must have been judged: only allowed segments may arrive, in
//! every mode pkeyfw offers. Also: native XDP attaches to a jumbo-MTU veth.
//!
//! What makes the super-packet reach the filter whole: the sender's veth
//! keeps UDP GSO (`tx-udp-segmentation`, on by default on veth), so the
//! datagram crosses the veth as one skb with `gso_size` set; without native
//! XDP on the receiving veth nothing segments it on the way in, and the UDP
//! stack segments it only at delivery (`udp_unexpected_gso`, the socket has
//! no UDP_GRO), after any hook pkeyfw has. Generic XDP there judged only the
//! first BTH and let the refused segments through. Native XDP on a veth turns
//! the peer's GSO off (the sender then segments before transmitting), so
//! each segment is judged on its own.

use crate::common;

use common::Foreground;

use std::{net::UdpSocket, time::Duration};

use pkeyfw_common::judge;
use pkeyfw_testkit::{
    netns::{VethPair, in_netns},
    wire::Packet,
};
use serde_json::Value;

/// `nobody`: the sender has no privilege at all.
const NOBODY: libc::uid_t = 65534;
/// `SOL_UDP` / `UDP_SEGMENT` (linux/udp.h).
const SOL_UDP: libc::c_int = 17;
const UDP_SEGMENT: libc::c_int = 103;
const ROCE_PORT: u16 = 4791;
const ADDR_A: [u8; 4] = [10, 77, 0, 1];
const ADDR_B: [u8; 4] = [10, 77, 0, 2];

fn ip(args: &[&str]) {
    let out = std::process::Command::new("ip")
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn dotted(a: [u8; 4]) -> String {
    format!("{}.{}.{}.{}", a[0], a[1], a[2], a[3])
}

/// A veth pair with addresses (and `mtu` on both ends).
fn pair_with_addresses(mtu: u32) -> VethPair {
    let pair = VethPair::create(&common::tag("pg")).unwrap();
    pair.set_mtu(mtu).unwrap();
    for (ns, dev, addr) in [(&pair.ns_a, &pair.a, ADDR_A), (&pair.ns_b, &pair.b, ADDR_B)] {
        ip(&[
            "-n",
            ns,
            "addr",
            "add",
            &format!("{}/24", dotted(addr)),
            "dev",
            dev,
        ]);
    }
    pair
}

fn stats_json(pair: &VethPair) -> Value {
    let out = common::succeed(common::pkeyfw_in(&pair.ns_b).args(["stats", &pair.b, "--json"]));
    let text = String::from_utf8(out.stdout).unwrap();
    serde_json::from_str(text.lines().next().unwrap()).unwrap()
}

/// The RoCE packets of the super-packet: QP0 (allowed: the SMI is in every
/// partition), then a UD frame to an RC QP and one with a foreign P_Key to
/// an unknown QP (both refused by the base policy). All the same size, as
/// GSO segments are.
fn segments() -> Vec<(Packet, bool)> {
    let policy = common::policy(common::cases::BASE);
    [
        Packet::ud(0xffff, 0, 0x1234),
        Packet::ud(0x8001, common::cases::QPA, 0x1234),
        Packet::ud(0x7777, common::cases::UNKNOWN, 0x1234),
    ]
    .into_iter()
    .map(|p| {
        let allowed = judge(&p.bytes()[..], &policy, &policy.config()).allowed;
        (p, allowed)
    })
    .collect()
}

/// The RoCE payload of a frame: what follows its UDP header.
fn udp_payload(p: &Packet) -> Vec<u8> {
    p.bytes()[p.bth_at()..].to_vec()
}

/// Sends `payload` as one UDP_SEGMENT datagram of `gso_size` segments from
/// namespace `ns` to B's port 4791, as user `nobody` (a forked child that
/// drops every privilege first).
fn send_gso_unprivileged(ns: &str, payload: &[u8], gso_size: u16) {
    let dst = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: ROCE_PORT.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from_ne_bytes(ADDR_B),
        },
        sin_zero: [0; 8],
    };
    let status = in_netns(ns, || {
        // SAFETY: the child only makes async-signal-safe system calls on
        // memory prepared before the fork, then _exits.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
        if pid == 0 {
            // SAFETY: plain system calls; see above.
            unsafe {
                let step = |ok: bool, code: i32| {
                    if !ok {
                        libc::_exit(code)
                    }
                };
                step(libc::setgroups(0, std::ptr::null()) == 0, 10);
                step(libc::setresgid(NOBODY, NOBODY, NOBODY) == 0, 11);
                step(libc::setresuid(NOBODY, NOBODY, NOBODY) == 0, 12);
                step(libc::geteuid() == NOBODY, 13);
                let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM, 0);
                step(fd >= 0, 14);
                let size = libc::c_int::from(gso_size);
                step(
                    libc::setsockopt(
                        fd,
                        SOL_UDP,
                        UDP_SEGMENT,
                        (&raw const size).cast(),
                        size_of::<libc::c_int>() as u32,
                    ) == 0,
                    15,
                );
                let n = libc::sendto(
                    fd,
                    payload.as_ptr().cast(),
                    payload.len(),
                    0,
                    (&raw const dst).cast(),
                    size_of::<libc::sockaddr_in>() as u32,
                );
                step(n == payload.len() as isize, 16);
                libc::_exit(0);
            }
        }
        let mut status = 0;
        // SAFETY: our own child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        status
    })
    .unwrap();
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "the unprivileged sender failed (status {status:#x}; exit codes: 10-13 dropping privileges, 15 UDP_SEGMENT, 16 sendto)"
    );
}

/// Sends the super-packet and returns the destination QPs of the datagrams
/// B's port-4791 socket received.
fn send_and_receive(pair: &VethPair) -> Vec<u32> {
    let packets: Vec<Packet> = segments().into_iter().map(|(p, _)| p).collect();
    send_and_receive_keys(pair, &packets)
        .into_iter()
        .map(|(qp, _)| qp)
        .collect()
}

/// Sends `packets` as one super-packet from A, unprivileged, and returns
/// the (destination QP, P_Key) of the datagrams B's port-4791 socket
/// received.
fn send_and_receive_keys(pair: &VethPair, packets: &[Packet]) -> Vec<(u32, u16)> {
    let payloads: Vec<Vec<u8>> = packets.iter().map(udp_payload).collect();
    let size = payloads[0].len();
    assert!(payloads.iter().all(|p| p.len() == size));
    let socket = in_netns(&pair.ns_b, || {
        UdpSocket::bind(("0.0.0.0", ROCE_PORT)).expect("bind UDP 4791 in B")
    })
    .unwrap();
    socket
        .set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    send_gso_unprivileged(&pair.ns_a, &payloads.concat(), size as u16);
    let mut got = Vec::new();
    let mut buf = [0u8; 65536];
    while let Ok(n) = socket.recv(&mut buf) {
        assert_eq!(n, size, "a datagram of one segment's size");
        got.push((
            u32::from_be_bytes([0, buf[5], buf[6], buf[7]]),
            u16::from_be_bytes([buf[2], buf[3]]),
        ));
    }
    got
}

/// Only the allowed segments reach the socket; returns what arrived.
fn only_allowed_arrive(mode: &str) -> (VethPair, Foreground, Vec<u32>) {
    common::require_root();
    let pair = pair_with_addresses(1500);
    let (_dir, policy) = common::policy_file(common::cases::BASE);
    let fg = Foreground::start(&pair, &policy, mode);
    let got = send_and_receive(&pair);
    let allowed: Vec<u32> = segments()
        .iter()
        .filter(|(_, ok)| *ok)
        .map(|(p, _)| p.dest_qp)
        .collect();
    assert!(
        allowed.len() < segments().len(),
        "some segments must be refused for this to mean anything"
    );
    let bypassed: Vec<&u32> = got.iter().filter(|q| !allowed.contains(q)).collect();
    assert!(
        bypassed.is_empty(),
        "{mode} mode: refused segments reached UDP 4791 (dest QPs {bypassed:x?}); all received: {got:x?}"
    );
    (pair, fg, got)
}

#[test]
fn gso_super_packet_skb_mode() {
    let _root = common::pins_root();
    let (pair, _fg, got) = only_allowed_arrive("skb");
    // The TC program refuses the super-packet whole, and says so.
    assert!(got.is_empty(), "{got:x?}");
    let stats = stats_json(&pair);
    assert_eq!(stats["mode"], "tc");
    assert_eq!(stats["verdicts"]["gso"]["drop"], 1, "{stats}");
}

#[test]
fn gso_super_packet_native_mode() {
    let _root = common::pins_root();
    let (pair, _fg, got) = only_allowed_arrive("native");
    // Segmented before the veth, each segment judged: the QP0 one arrives.
    assert_eq!(got, vec![0], "{got:x?}");
    let stats = stats_json(&pair);
    assert_eq!(stats["mode"], "native");
    assert_eq!(stats["verdicts"]["smi"]["pass"], 1, "{stats}");
}

/// Jumbo MTUs are normal for RoCE: the multi-buffer aware XDP program
/// attaches natively to a veth of MTU 9000, and `auto` does not fall back.
#[test]
fn jumbo_mtu_veth_attaches_native() {
    let _root = common::pins_root();
    common::require_root();
    for mode in ["native", "auto"] {
        let pair = pair_with_addresses(9000);
        let (_dir, policy) = common::policy_file(common::cases::BASE);
        let fg = Foreground::start(&pair, &policy, mode);
        assert!(fg.first.contains("native mode"), "{mode}: {}", fg.first);
        assert_eq!(stats_json(&pair)["mode"], "native", "{mode}");
        // And the filter still judges across it.
        let got = send_and_receive(&pair);
        assert_eq!(got, vec![0], "{mode}: {got:x?}");
    }
}

/// Both ways the TC ingress program is hooked in refuse the super-packet:
/// tcx (6.6+) and the clsact filter that kernels before 6.6 get.
#[test]
fn gso_super_packet_tc_ingress_tcx_and_clsact() {
    use pkeyfw::loading::filter::{Egress, Filter};
    common::require_root();
    for how in [Egress::Tcx, Egress::Clsact] {
        let pair = pair_with_addresses(1500);
        let policy = common::policy(common::cases::BASE);
        let got = in_netns(&pair.ns_b, || {
            let mut filter = Filter::load(policy.qpns()).unwrap();
            filter.apply(&policy).unwrap();
            filter.attach_ingress(&pair.b, how).unwrap();
            let got = send_and_receive(&pair);
            let gso = filter
                .maps()
                .reasons()
                .unwrap()
                .total(pkeyfw_common::Reason::Gso);
            filter.detach().unwrap();
            (got, gso)
        })
        .unwrap();
        assert_eq!(got, (vec![], 1), "{how:?}");
        // Detached: the super-packet is segmented at delivery, all of it.
        assert_eq!(
            send_and_receive(&pair),
            vec![0, common::cases::QPA, common::cases::UNKNOWN],
            "{how:?}"
        );
    }
}

/// Stamping judges what will actually leave: an unprivileged UDP_SEGMENT
/// datagram whose first segment egress leaves alone (QP0, the default key)
/// carries a bound QP's key and another partition's in its later segments,
/// which the far end would judge one by one. The stamping egress drops the
/// super-packet whole: nothing but the default key reaches the far end's
/// port 4791.
#[test]
fn stamping_egress_drops_a_super_packet_whole() {
    use pkeyfw::loading::filter::{Egress, Filter};
    use pkeyfw_common::Stamp;
    common::require_root();
    let pair = pair_with_addresses(1500);
    let packets = [
        Packet::ud(0xffff, 0, 0x1234),
        Packet::ud(0x8001, common::cases::QPA, 0x1234),
        Packet::ud(0x8002, common::cases::UNKNOWN, 0x1234),
    ];
    let (got, gso) = in_netns(&pair.ns_a, || {
        let mut filter = Filter::load(0).unwrap();
        filter.apply(&common::stamping::stamping_policy()).unwrap();
        filter.attach_egress(&pair.a, Egress::Auto).unwrap();
        let got = send_and_receive_keys(&pair, &packets);
        let gso = filter.maps().stamps().unwrap()[Stamp::Gso.index() as usize];
        filter.detach().unwrap();
        (got, gso)
    })
    .unwrap();
    let foreign: Vec<&(u32, u16)> = got.iter().filter(|(_, k)| *k != 0xffff).collect();
    assert!(
        foreign.is_empty(),
        "segments with other keys left the host: {foreign:x?} (all: {got:x?})"
    );
    assert_eq!((got, gso), (vec![], 1));
    // Without stamping's egress, all three arrive: the test sends what it
    // means to.
    assert_eq!(
        send_and_receive_keys(&pair, &packets),
        vec![
            (0, 0xffff),
            (common::cases::QPA, 0x8001),
            (common::cases::UNKNOWN, 0x8002)
        ]
    );
}
