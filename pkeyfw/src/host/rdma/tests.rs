//! nldev messages laid out as Linux 6.1 (drivers/infiniband/core/nldev.c)
//! sends them for a soft-RoCE device `rxe0` on `veth0`, through the codec,
//! the dump loop's datagram handling and the QP selection.

use std::net::SocketAddr;

use netlink_packet_core::{
    NLM_F_DUMP, NLM_F_MULTIPART, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload,
};

use super::{
    CmId, Device, Driver, IbQpType, Qp, QpState, assemble,
    nldev::{self, Request, attr, command},
    socket::take,
};

/// Attribute numbers the kernel sends that pkeyfw skips.
const CAP_FLAGS: u16 = 4;
const NODE_GUID: u16 = 6;
const SYS_IMAGE_GUID: u16 = 7;
const PORT_STATE: u16 = 12;
const PORT_PHYS_STATE: u16 = 13;
const DEV_NODE_TYPE: u16 = 14;
const RES_RQ_PSN: u16 = 23;
const RES_SQ_PSN: u16 = 24;
const RES_PATH_MIG_STATE: u16 = 25;
const RES_PS: u16 = 32;
const RES_PDN: u16 = 60;
const RES_CM_IDN: u16 = 63;
const NDEV_NAME: u16 = 51;
const DEV_PROTOCOL: u16 = 67;
const DEV_DIM: u16 = 84;

const SEQ: u32 = 7;
/// Our socket's port id, which the kernel writes in its replies.
const PORT_ID: u32 = 0x4d2;
const VETH0: u32 = 4;

/// `nla_put`: header, value, zero padding to 4 bytes.
fn nla(kind: u16, value: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&(4 + value.len() as u16).to_ne_bytes());
    out.extend_from_slice(&kind.to_ne_bytes());
    out.extend_from_slice(value);
    out.resize(out.len().next_multiple_of(4), 0);
    out
}

fn u8a(kind: u16, v: u8) -> Vec<u8> {
    nla(kind, &[v])
}

fn u32a(kind: u16, v: u32) -> Vec<u8> {
    nla(kind, &v.to_ne_bytes())
}

/// `nla_put_u64_64bit`: no pad attribute on x86-64 (efficient unaligned
/// access); [`pad`] is what other architectures put before it.
fn u64a(kind: u16, v: u64) -> Vec<u8> {
    nla(kind, &v.to_ne_bytes())
}

/// `RDMA_NLDEV_ATTR_PAD`, an empty attribute of type 0.
fn pad() -> Vec<u8> {
    nla(0, &[])
}

fn string(kind: u16, s: &str) -> Vec<u8> {
    nla(kind, format!("{s}\0").as_bytes())
}

/// `nla_nest_start_noflag` … `nla_nest_end`.
fn nest(kind: u16, parts: &[Vec<u8>]) -> Vec<u8> {
    nla(kind, &parts.concat())
}

/// A `struct __kernel_sockaddr_storage` (128 bytes) holding `addr`.
fn storage(addr: SocketAddr) -> Vec<u8> {
    let mut s = vec![0; 128];
    s[2..4].copy_from_slice(&addr.port().to_be_bytes());
    match addr {
        SocketAddr::V4(a) => {
            s[0..2].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
            s[4..8].copy_from_slice(&a.ip().octets());
        }
        SocketAddr::V6(a) => {
            s[0..2].copy_from_slice(&(libc::AF_INET6 as u16).to_ne_bytes());
            s[4..8].copy_from_slice(&a.flowinfo().to_be_bytes());
            s[8..24].copy_from_slice(&a.ip().octets());
            s[24..28].copy_from_slice(&a.scope_id().to_ne_bytes());
        }
    }
    s
}

fn header(kind: u16, flags: u16, seq: u32, payload: usize) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&(16 + payload as u32).to_ne_bytes());
    out.extend_from_slice(&kind.to_ne_bytes());
    out.extend_from_slice(&flags.to_ne_bytes());
    out.extend_from_slice(&seq.to_ne_bytes());
    out.extend_from_slice(&PORT_ID.to_ne_bytes());
    out
}

/// One message of a dump (`nlmsg_put(…, NLM_F_MULTI)`).
fn dump_message(command: u16, seq: u32, attrs: &[Vec<u8>]) -> Vec<u8> {
    let payload = attrs.concat();
    let mut out = header(
        nldev::message_type(command),
        NLM_F_MULTIPART,
        seq,
        payload.len(),
    );
    out.extend_from_slice(&payload);
    out
}

/// `netlink_dump_done`: NLMSG_DONE carrying the dump's errno.
fn done(seq: u32, errno: i32) -> Vec<u8> {
    let mut out = header(3, NLM_F_MULTIPART, seq, 4);
    out.extend_from_slice(&errno.to_ne_bytes());
    out
}

/// `netlink_ack` refusing `request`: NLMSG_ERROR with the errno and a copy
/// of the whole request.
fn refusal(seq: u32, errno: i32, request: &[u8]) -> Vec<u8> {
    let mut out = header(2, 0, seq, 4 + request.len());
    out.extend_from_slice(&errno.to_ne_bytes());
    out.extend_from_slice(request);
    out
}

fn handle(index: u32, name: &str) -> Vec<Vec<u8>> {
    vec![u32a(attr::DEV_INDEX, index), string(attr::DEV_NAME, name)]
}

/// `fill_dev_info` for a one-port soft-RoCE device.
fn rxe_device(index: u32, name: &str) -> Vec<u8> {
    let mut attrs = handle(index, name);
    attrs.extend([
        u32a(attr::PORT_INDEX, 1),
        u64a(CAP_FLAGS, 0x0000_1000_0020_0c76),
        u64a(NODE_GUID, 0x5054_00ff_fe12_3456),
        u64a(SYS_IMAGE_GUID, 0x5054_00ff_fe12_3456),
        u8a(DEV_NODE_TYPE, 1),
        u8a(DEV_DIM, 0),
        string(DEV_PROTOCOL, "roce"),
    ]);
    dump_message(command::GET, SEQ, &attrs)
}

/// `fill_port_info` for a RoCE port bound to `netdev` in our namespace.
fn rxe_port(index: u32, name: &str, netdev: Option<(u32, &str)>) -> Vec<u8> {
    let mut attrs = handle(index, name);
    attrs.extend([
        u32a(attr::PORT_INDEX, 1),
        u64a(CAP_FLAGS, 0x0001_0000),
        u8a(PORT_STATE, 4),
        u8a(PORT_PHYS_STATE, 5),
    ]);
    if let Some((ifindex, ifname)) = netdev {
        attrs.extend([u32a(attr::NDEV_INDEX, ifindex), string(NDEV_NAME, ifname)]);
    }
    dump_message(command::PORT_GET, SEQ, &attrs)
}

/// ib_core's GSI QP (QP1), a kernel QP.
fn gsi_entry() -> Vec<u8> {
    nest(
        attr::RES_QP_ENTRY,
        &[
            u32a(attr::PORT_INDEX, 1),
            u32a(attr::RES_LQPN, 1),
            string(attr::RES_KERN_NAME, "ib_core"),
            u32a(RES_SQ_PSN, 0),
            u8a(attr::RES_TYPE, 1),
            u8a(attr::RES_STATE, 3),
        ],
    )
}

/// A user UD QP of `ibv_ud_pingpong`, pid 4242.
fn ud_entry(qpn: u32) -> Vec<u8> {
    nest(
        attr::RES_QP_ENTRY,
        &[
            u32a(attr::PORT_INDEX, 1),
            u32a(attr::RES_LQPN, qpn),
            u32a(RES_PDN, 2),
            u32a(attr::RES_PID, 4242),
            u32a(RES_SQ_PSN, 0x1b2c3d),
            u8a(attr::RES_TYPE, 4),
            u8a(attr::RES_STATE, 3),
        ],
    )
}

/// A user RC QP: connected to `rqpn`, or just created (no port, RESET).
fn rc_entry(qpn: u32, rqpn: Option<u32>) -> Vec<u8> {
    let mut attrs = Vec::new();
    if rqpn.is_some() {
        attrs.push(u32a(attr::PORT_INDEX, 1));
    }
    attrs.extend([
        u32a(attr::RES_LQPN, qpn),
        u32a(RES_PDN, 3),
        u32a(attr::RES_PID, 5151),
        u32a(attr::RES_RQPN, rqpn.unwrap_or(0)),
        u32a(RES_RQ_PSN, 0),
        u32a(RES_SQ_PSN, 0),
        u8a(RES_PATH_MIG_STATE, 0),
        u8a(attr::RES_TYPE, 2),
        u8a(attr::RES_STATE, if rqpn.is_some() { 3 } else { 0 }),
    ]);
    nest(attr::RES_QP_ENTRY, &attrs)
}

fn qp_message(entries: &[Vec<u8>]) -> Vec<u8> {
    let mut attrs = handle(3, "rxe0");
    attrs.push(nest(attr::RES_QP, entries));
    dump_message(command::RES_QP_GET, SEQ, &attrs)
}

fn attrs_of(message: &[u8]) -> &[u8] {
    &message[16..]
}

fn user_qp(qpn: u32, qp_type: IbQpType, state: QpState, pid: u32) -> Qp {
    Qp {
        device: "rxe0".into(),
        device_index: 0,
        port: Some(1),
        qpn,
        remote_qpn: None,
        qp_type,
        state,
        pid: Some(pid),
        comm: None,
        maker: super::Maker::Unasked,
        kernel: false,
        local: None,
        peer: None,
    }
}

#[test]
fn a_dump_request_is_the_header_and_the_device_index() {
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST | NLM_F_DUMP;
    header.sequence_number = SEQ;
    let request = Request {
        command: command::RES_QP_GET,
        device: Some(3),
    };
    let mut message = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(request));
    message.finalize();
    let mut buf = vec![0; message.buffer_len()];
    message.serialize(&mut buf);
    let mut expected = 24u32.to_ne_bytes().to_vec();
    expected.extend_from_slice(&0x140au16.to_ne_bytes());
    expected.extend_from_slice(&0x0301u16.to_ne_bytes());
    expected.extend_from_slice(&SEQ.to_ne_bytes());
    expected.extend_from_slice(&0u32.to_ne_bytes());
    expected.extend_from_slice(&u32a(attr::DEV_INDEX, 3));
    assert_eq!(buf, expected);

    let list = Request {
        command: command::GET,
        device: None,
    };
    let mut message =
        NetlinkMessage::new(NetlinkHeader::default(), NetlinkPayload::InnerMessage(list));
    message.finalize();
    assert_eq!(
        (message.header.length, message.header.message_type),
        (16, 0x1401)
    );
}

#[test]
fn devices_and_ports() {
    let dev = nldev::device(attrs_of(&rxe_device(3, "rxe0"))).unwrap();
    assert_eq!((dev.index, dev.name.as_str(), dev.ports), (3, "rxe0", 1));

    let port = nldev::port(attrs_of(&rxe_port(3, "rxe0", Some((VETH0, "veth0"))))).unwrap();
    assert_eq!(port.port, 1);
    assert_eq!(port.netdev, Some(VETH0));
    // A netdev in another network namespace is not reported.
    let elsewhere = nldev::port(attrs_of(&rxe_port(3, "rxe0", None))).unwrap();
    assert_eq!(elsewhere.netdev, None);
}

#[test]
fn pad_attributes_and_nested_flags_are_skipped() {
    let mut attrs = handle(3, "rxe0");
    attrs.extend([u32a(attr::PORT_INDEX, 2), pad(), u64a(NODE_GUID, 1)]);
    let dev = nldev::device(&attrs.concat()).unwrap();
    assert_eq!(dev.ports, 2);

    // nla_nest_start() sets NLA_F_NESTED; the type is read without it.
    let mut flagged = nest(attr::RES_QP, &[ud_entry(0x11)]);
    flagged[2..4].copy_from_slice(&(attr::RES_QP | 0x8000).to_ne_bytes());
    let mut message = handle(3, "rxe0");
    message.push(flagged);
    assert_eq!(nldev::qps(&message.concat()).unwrap().len(), 1);
}

#[test]
fn missing_or_malformed_attributes_are_errors() {
    let no_name = [u32a(attr::DEV_INDEX, 3), u32a(attr::PORT_INDEX, 1)].concat();
    assert!(
        nldev::device(&no_name)
            .unwrap_err()
            .to_string()
            .contains("DEV_NAME")
    );
    let short = [handle(3, "rxe0").concat(), u8a(attr::PORT_INDEX, 1)].concat();
    assert!(nldev::port(&short).is_err());
    let mut cut = attrs_of(&rxe_device(3, "rxe0")).to_vec();
    cut.truncate(cut.len() - 6);
    assert!(nldev::device(&cut).is_err());
    let no_type = nest(
        attr::RES_QP_ENTRY,
        &[u32a(attr::RES_LQPN, 5), u8a(attr::RES_STATE, 3)],
    );
    assert!(
        nldev::qps(attrs_of(&qp_message(&[no_type])))
            .unwrap_err()
            .to_string()
            .contains("RES_TYPE")
    );
}

#[test]
fn qps_of_every_kind() {
    let message = qp_message(&[
        gsi_entry(),
        ud_entry(0x11),
        rc_entry(0x12, Some(0x13)),
        rc_entry(0x14, None),
    ]);
    let qps = nldev::qps(attrs_of(&message)).unwrap();
    let gsi = Qp {
        pid: None,
        comm: Some("ib_core".into()),
        kernel: true,
        ..user_qp(1, IbQpType::Gsi, QpState::Rts, 0)
    };
    let ud = user_qp(0x11, IbQpType::Ud, QpState::Rts, 4242);
    let rc = Qp {
        remote_qpn: Some(0x13),
        ..user_qp(0x12, IbQpType::Rc, QpState::Rts, 5151)
    };
    let fresh = Qp {
        port: None,
        ..user_qp(0x14, IbQpType::Rc, QpState::Reset, 5151)
    };
    assert_eq!(qps, [gsi, ud, rc, fresh]);
}

#[test]
fn qp_types_and_states_by_number() {
    let types: Vec<String> = (0..=11)
        .chain([0xff])
        .map(|t| IbQpType::from(t).to_string())
        .collect();
    assert_eq!(
        types,
        [
            "SMI",
            "GSI",
            "RC",
            "UC",
            "UD",
            "RAW_IPV6",
            "RAW_ETHERTYPE",
            "UNKNOWN(7)",
            "RAW_PACKET",
            "XRC_INI",
            "XRC_TGT",
            "UNKNOWN(11)",
            "DRIVER"
        ]
    );
    let states: Vec<String> = (0..=7).map(|s| QpState::from(s).to_string()).collect();
    assert_eq!(
        states,
        [
            "RESET",
            "INIT",
            "RTR",
            "RTS",
            "SQD",
            "SQE",
            "ERR",
            "UNKNOWN(7)"
        ]
    );
}

#[test]
fn cm_ids_with_a_qp_and_their_addresses() {
    let connected: SocketAddr = "10.0.0.1:18515".parse().unwrap();
    let peer: SocketAddr = "10.0.0.2:41234".parse().unwrap();
    let v6: SocketAddr = "[fd00::1]:7471".parse().unwrap();
    let v6_peer: SocketAddr = "[fd00::2]:50000".parse().unwrap();
    let listener = nest(
        attr::RES_CM_ID_ENTRY,
        &[
            u32a(attr::PORT_INDEX, 1),
            u32a(RES_PS, 0x106),
            u8a(attr::RES_STATE, 8),
            nla(
                attr::RES_SRC_ADDR,
                &storage("0.0.0.0:18515".parse().unwrap()),
            ),
            u32a(RES_CM_IDN, 0),
            u32a(attr::RES_PID, 5151),
        ],
    );
    let entry = |qpn: u32, local: SocketAddr, remote: SocketAddr| {
        nest(
            attr::RES_CM_ID_ENTRY,
            &[
                u32a(attr::PORT_INDEX, 1),
                u32a(attr::RES_LQPN, qpn),
                u8a(attr::RES_TYPE, 2),
                u32a(RES_PS, 0x106),
                u8a(attr::RES_STATE, 5),
                nla(attr::RES_SRC_ADDR, &storage(local)),
                nla(attr::RES_DST_ADDR, &storage(remote)),
                u32a(RES_CM_IDN, 1),
                u32a(attr::RES_PID, 5151),
            ],
        )
    };
    let mut attrs = handle(3, "rxe0");
    attrs.push(nest(
        attr::RES_CM_ID,
        &[
            listener,
            entry(0x12, connected, peer),
            entry(0x15, v6, v6_peer),
        ],
    ));
    let message = dump_message(command::RES_CM_ID_GET, SEQ, &attrs);
    let ids = nldev::cm_ids(attrs_of(&message)).unwrap();
    assert_eq!(
        ids,
        [
            CmId {
                qpn: 0x12,
                local: Some(connected),
                peer: Some(peer),
            },
            CmId {
                qpn: 0x15,
                local: Some(v6),
                peer: Some(v6_peer),
            },
        ]
    );
}

#[test]
fn sockaddrs_other_than_ip_are_unknown() {
    let mut ib = vec![0; 128];
    ib[0..2].copy_from_slice(&27u16.to_ne_bytes());
    assert_eq!(nldev::sockaddr(&ib), None);
    assert_eq!(nldev::sockaddr(&[2, 0]), None);
}

#[test]
fn a_dump_in_several_datagrams() {
    let mut replies = Vec::new();
    let first = [
        qp_message(&[gsi_entry(), ud_entry(0x11)]),
        qp_message(&[ud_entry(0x12)]),
    ]
    .concat();
    assert!(!take(&first, SEQ, &mut replies).unwrap());
    let last = [qp_message(&[ud_entry(0x13)]), done(SEQ, 0)].concat();
    assert!(take(&last, SEQ, &mut replies).unwrap());
    let qpns: Vec<u32> = replies
        .iter()
        .flat_map(|r| {
            assert_eq!(r.command, command::RES_QP_GET);
            nldev::qps(&r.attrs).unwrap()
        })
        .map(|q| q.qpn)
        .collect();
    assert_eq!(qpns, [1, 0x11, 0x12, 0x13]);
    // An empty table sends no message at all, only NLMSG_DONE.
    let mut none = Vec::new();
    assert!(take(&done(SEQ, 0), SEQ, &mut none).unwrap());
    assert!(none.is_empty());
}

#[test]
fn failures_end_the_dump_with_the_errno() {
    let mut replies = Vec::new();
    let failed = take(&done(SEQ, -libc::EINVAL), SEQ, &mut replies).unwrap_err();
    assert!(
        format!("{failed:#}").contains("Invalid argument"),
        "{failed:#}"
    );

    let request = header(nldev::message_type(10), NLM_F_REQUEST | NLM_F_DUMP, SEQ, 0);
    let refused = take(
        &refusal(SEQ, -libc::EOPNOTSUPP, &request),
        SEQ,
        &mut replies,
    )
    .unwrap_err();
    assert!(format!("{refused:#}").contains("refused"), "{refused:#}");

    let stale = take(&qp_message(&[gsi_entry()]), SEQ + 1, &mut replies).unwrap_err();
    assert!(stale.to_string().contains("waiting for 8"), "{stale}");

    let mut other = qp_message(&[]);
    other[4..6].copy_from_slice(&0x0401u16.to_ne_bytes());
    assert!(take(&other, SEQ, &mut replies).is_err());

    let cut = &qp_message(&[gsi_entry()])[..30];
    assert!(take(cut, SEQ, &mut replies).is_err());
    assert!(replies.is_empty());
}

#[test]
fn assembling_selects_bound_ports_and_fills_owners() {
    let rc = Qp {
        remote_qpn: Some(0x13),
        ..user_qp(0x12, IbQpType::Rc, QpState::Rts, 5151)
    };
    let on_port_2 = Qp {
        port: Some(2),
        ..user_qp(0x20, IbQpType::Ud, QpState::Rts, 4242)
    };
    let fresh = Qp {
        port: None,
        ..user_qp(0x14, IbQpType::Rc, QpState::Reset, 5151)
    };
    let kernel = Qp {
        pid: None,
        comm: Some("ib_core".into()),
        kernel: true,
        ..user_qp(1, IbQpType::Gsi, QpState::Rts, 0)
    };
    let gone = Qp {
        pid: None,
        ..user_qp(0x30, IbQpType::Ud, QpState::Err, 0)
    };
    let qps = vec![
        kernel.clone(),
        rc.clone(),
        on_port_2,
        fresh.clone(),
        gone.clone(),
    ];
    let cm = [CmId {
        qpn: 0x12,
        local: Some("10.0.0.1:18515".parse().unwrap()),
        peer: Some("10.0.0.2:41234".parse().unwrap()),
    }];
    let mut comm = |pid: u32| (pid == 5151).then(|| "rping".to_string());

    // Port 1 of two: port 2's QP and the one on no port yet are left out.
    let two_ports = Device {
        index: 3,
        name: "mlx4_0".into(),
        ports: vec![1],
        port_count: 2,
        driver: Driver::Hardware("mlx4_core".into()),
    };
    let got = assemble(&two_ports, qps.clone(), &cm, &mut comm);
    let on = |qp: Qp| Qp {
        device_index: 3,
        ..qp
    };
    let (kernel, gone) = (on(kernel), on(gone));
    let rc_named = Qp {
        device_index: 3,
        comm: Some("rping".into()),
        local: cm[0].local,
        peer: cm[0].peer,
        ..rc
    };
    assert_eq!(got, [kernel.clone(), rc_named.clone(), gone.clone()]);

    // Every port bound: a QP on no port yet belongs here too.
    let one_port = Device {
        port_count: 1,
        ..two_ports
    };
    let got = assemble(&one_port, qps, &cm, &mut comm);
    let fresh_named = Qp {
        device_index: 3,
        comm: Some("rping".into()),
        ..fresh
    };
    assert_eq!(got, [kernel, rc_named, fresh_named, gone]);
}

/// Without CAP_SYS_PTRACE (as under the shipped systemd unit) another
/// user's `/proc/PID/ns/net` cannot be read; its ids and cgroup, which
/// anyone may read, still tell who made its QPs, so a cgroup or uid rule
/// still binds them when they are matched from `/proc`. Capabilities are
/// per thread: only this test's thread gives CAP_SYS_PTRACE up.
#[test]
fn a_maker_is_read_without_ptrace_access() {
    use std::os::unix::process::CommandExt as _;
    let mut child = std::process::Command::new("sleep")
        .arg("30")
        .uid(65534)
        .gid(65534)
        .spawn()
        .expect("sleep as nobody (run as root)");
    let pid = child.id();
    let owner = std::thread::spawn(move || {
        drop_effective(CAP_SYS_PTRACE);
        assert!(
            std::fs::metadata(format!("/proc/{pid}/ns/net")).is_err(),
            "without CAP_SYS_PTRACE another user's namespace is hidden"
        );
        super::creation_of(pid)
    })
    .join()
    .unwrap();
    let _ = child.kill();
    let _ = child.wait();
    let made = owner.expect("who made it, all but its namespace");
    assert_eq!((made.uid, made.gid, made.netns), (65534, 65534, 0));
    assert_eq!(made.cgroups[0], 1, "the root cgroup, at level 0");
}

/// A tenant names its process with bytes that are not UTF-8 (exec through
/// a link named `\xff`; the kernel does not escape them in
/// `/proc/PID/status`). Who made its QPs is still read, name and all.
#[test]
fn a_maker_named_with_any_bytes_is_read() {
    use std::os::unix::{ffi::OsStrExt as _, process::CommandExt as _};
    let dir = std::env::temp_dir().join(format!("pkeyfw-name-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let link = dir.join(std::ffi::OsStr::from_bytes(b"\xff\xfeapp"));
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink("/bin/sleep", &link).unwrap();
    let mut child = std::process::Command::new(&link)
        .arg("30")
        .uid(65534)
        .gid(65534)
        .spawn()
        .expect("sleep through the link, as nobody");
    let pid = child.id();
    let mut made = None;
    for _ in 0..100 {
        made = super::creation_of(pid).filter(|c| c.comm[0] == 0xff);
        if made.is_some() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
    let made = made.expect("who made it, though its name is no UTF-8");
    assert_eq!(&made.comm[..6], b"\xff\xfeapp\0");
    assert_eq!((made.uid, made.gid, made.pid), (65534, 65534, pid));
}

/// linux/capability.h.
const CAP_SYS_PTRACE: u32 = 19;

/// Clears capability `cap` from the calling thread's effective set.
fn drop_effective(cap: u32) {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Copy, Clone, Default)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const VERSION_3: u32 = 0x2008_0522;
    let mut header = Header {
        version: VERSION_3,
        pid: 0,
    };
    let mut data = [Data::default(); 2];
    // SAFETY: capget and capset with a v3 header and its two data words.
    unsafe {
        assert_eq!(
            libc::syscall(libc::SYS_capget, &mut header, data.as_mut_ptr()),
            0
        );
        data[(cap / 32) as usize].effective &= !(1 << (cap % 32));
        assert_eq!(libc::syscall(libc::SYS_capset, &header, data.as_ptr()), 0);
    }
}

/// Who made each QP: the probe's record where it is this QP's (a process's
/// or a kernel user's as RDMA netlink says, of its type), `/proc` only for
/// a process's QP without one, and nothing for a process's QP whose
/// process RDMA netlink does not name. uverbs's XRC target QPs, which RDMA
/// netlink reports as ib_uverbs's kernel QPs, are the process's.
#[test]
fn identify_reads_the_record_of_this_qp() {
    use pkeyfw_common::abi::Creation;
    let record = |kernel: u8, ib_qp_type: u8| Creation {
        uid: 1001,
        kernel,
        ib_qp_type,
        ..Creation::default()
    };
    let xrc = Qp {
        pid: None,
        comm: Some("ib_uverbs".into()),
        kernel: true,
        ..user_qp(0x20, IbQpType::XrcTgt, QpState::Rts, 0)
    };
    let gone = Qp {
        pid: None,
        ..user_qp(0x21, IbQpType::Ud, QpState::Rts, 0)
    };
    let retyped = user_qp(0x22, IbQpType::Rc, QpState::Rts, std::process::id());
    let mut qps = [xrc.clone(), gone.clone(), retyped.clone()];
    let records = super::Records::from([
        (0x20, record(0, IbQpType::XrcTgt.raw())),
        (0x21, record(0, IbQpType::Ud.raw())),
        // An earlier QP's with the number, of another type.
        (0x22, record(0, IbQpType::Ud.raw())),
    ]);
    super::identify(&mut qps, &records);
    assert_eq!(qps[0].maker, super::Maker::Seen(records[&0x20]));
    assert_eq!(qps[1].maker, super::Maker::Seen(records[&0x21]));
    assert!(
        matches!(qps[2].maker, super::Maker::Read(c) if c.uid != 1001),
        "{:?}",
        qps[2].maker
    );
    // Without records: /proc for the live process, nothing for the others.
    let mut qps = [xrc, gone, retyped];
    super::identify(&mut qps, &super::Records::new());
    assert_eq!(qps[0].maker, super::Maker::Unknown);
    assert_eq!(qps[1].maker, super::Maker::Unknown);
    assert!(matches!(qps[2].maker, super::Maker::Read(_)));
}
