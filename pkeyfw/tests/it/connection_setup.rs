//! Connection setup inside partitions: a CM request (REQ, SIDR_REQ) to QP1
//! meets only the partition of the listener it names — the live rules
//! matched against who made it — on the host and in the real programs
//! (BPF_PROG_TEST_RUN, XDP and TC ingress, the probes' records written as
//! they write them); and what egress makes of QP1's CM MADs and of a
//! tenant's datagrams to QP1 (the sender comes from rdma_rxe's socket,
//! which a test run has not: the host decision here, real rxe in the
//! soft-RoCE lab's `cm-*` scenarios).

use crate::common;

use std::{collections::BTreeMap, net::Ipv4Addr};

use pkeyfw::{loading::filter::Filter, policy::Policy};
use pkeyfw_common::{
    Reason, Stamp, Tables,
    abi::{
        BindSpec, ConnectionKind, Creation, GroupEntry, ListenKey, QpEntry,
        cm::cm_state::{RECORDS_CONNECTIONS, RECORDS_LISTENERS},
        connection_key, family, v4_mapped,
    },
    cm::{attr, listen_key, service_id},
    judge,
    stamp::{self, Action, Origin},
    tenant::Rules,
};
use pkeyfw_testkit::cm::{PS_TCP, PS_UDP, Request, gsi, mad};
use proptest::prelude::*;

/// The four-QP partition example's tenants, by uid: A a full member of
/// 0x0001, B and C limited ones, D a full member of 0x0002.
const POLICY: &str = "[port]\npkeys = [0xffff, 0x8001, 0x0001, 0x8002]\n\
    [[bind]]\nuid = 1001\npkey = 0x8001\n\
    [[bind]]\nuid = 1002\npkey = 0x0001\n\
    [[bind]]\nuid = 1003\npkey = 0x0001\n\
    [[bind]]\nuid = 1004\npkey = 0x8002\n";
const A: u32 = 1001;
const B: u32 = 1002;
const C: u32 = 1003;
const D: u32 = 1004;
/// A uid no rule names.
const NOBODY: u32 = 4242;

const CLIENT: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);
const SERVER: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 2);
const PORT: u16 = 7174;

/// IB_QPT_RC, IB_QPT_UD.
const RC: u8 = 2;
const UD: u8 = 4;

/// A listener made by a process of uid `uid`, of `enum ib_qp_type`
/// `qp_type`, as the listen probe records it.
fn by(uid: u32, qp_type: u8) -> Creation {
    Creation {
        qp: 0xffff_8880_0000_1000 + u64::from(uid),
        uid,
        gid: uid,
        pid: 100,
        cgroups: [1, 0, 0, 0, 0, 0, 0, 0],
        ib_qp_type: qp_type,
        ..Creation::default()
    }
}

/// The policy's tables, with the listeners and connections the probes
/// would have recorded.
struct Setup {
    policy: Policy,
    rules: Vec<BindSpec>,
    records: u64,
    listeners: BTreeMap<ListenKey, Creation>,
    unrecorded: u64,
    connections: BTreeMap<u64, u16>,
}

impl Setup {
    fn new(policy: Policy) -> Setup {
        Setup {
            rules: policy.binds.iter().map(|b| b.spec()).collect(),
            policy,
            records: RECORDS_LISTENERS | RECORDS_CONNECTIONS,
            listeners: BTreeMap::new(),
            unrecorded: 0,
            connections: BTreeMap::new(),
        }
    }

    fn listening(mut self, key: ListenKey, creator: Creation) -> Setup {
        self.listeners.insert(key, creator);
        self
    }

    /// The same in a loaded filter, as the probes and the loader write it.
    fn load(&self, filter: &mut Filter) {
        filter.apply(&self.policy).expect("apply");
        let maps = filter.maps_mut();
        maps.set_cm_records(self.records).unwrap();
        maps.set_unrecorded_listeners(self.unrecorded).unwrap();
        for (key, c) in &self.listeners {
            assert!(maps.record_listener(key, c).unwrap());
        }
    }
}

impl Tables for Setup {
    fn qp(&self, qpn: u32) -> Option<QpEntry> {
        self.policy.qp(qpn)
    }
    fn group(&self, addr: &[u8; 16]) -> Option<GroupEntry> {
        self.policy.group(addr)
    }
    fn port_flags(&self, key: u16) -> u8 {
        Tables::port_flags(&self.policy, key)
    }
    fn quarantined(&self, _qpn: u32) -> bool {
        false
    }
    fn cm_records(&self) -> u64 {
        self.records
    }
    fn listeners_unrecorded(&self) -> bool {
        self.unrecorded != 0
    }
    fn listener(&self, key: &ListenKey) -> Option<&Creation> {
        self.listeners.get(key)
    }
    fn connection(&self, key: u64) -> Option<u16> {
        self.connections.get(&key).copied()
    }
}

impl Rules for Setup {
    fn rule(&self, index: u32) -> Option<&BindSpec> {
        self.rules.get(index as usize)
    }
}

/// Where rping listens: the server's address, TCP port space.
fn at_server() -> ListenKey {
    listen_key(
        service_id(PS_TCP, PORT),
        family::INET,
        v4_mapped(SERVER.octets()),
        false,
    )
}

/// rdma_cm's wildcard (0.0.0.0, both families).
fn anywhere(ps: u32) -> ListenKey {
    listen_key(service_id(ps, PORT), family::INET, v4_mapped([0; 4]), false)
}

/// A REQ to the server's listener, with P_Key `pkey`.
fn req(pkey: u16) -> Vec<u8> {
    let r = Request::to(CLIENT, SERVER, PORT);
    gsi(r.req(), pkey, CLIENT, SERVER).bytes()
}

/// A SIDR_REQ to the server's UD listener.
fn sidr_req(pkey: u16) -> Vec<u8> {
    let r = Request {
        ps: PS_UDP,
        ..Request::to(CLIENT, SERVER, PORT)
    };
    gsi(r.sidr_req(), pkey, CLIENT, SERVER).bytes()
}

struct Case {
    name: &'static str,
    setup: Setup,
    frame: Vec<u8>,
    want: (Reason, bool),
}

fn cases() -> Vec<Case> {
    let policy = || common::policy(POLICY);
    let with = |toml: &str| common::policy(&format!("{POLICY}{toml}"));
    let a_listens = || Setup::new(policy()).listening(at_server(), by(A, RC));
    let case = |name, setup, frame, want| Case {
        name,
        setup,
        frame,
        want,
    };
    // D's REQ, its MAD cut after `keep` bytes (the lengths say so).
    let cut = |keep: usize| {
        let mut m = Request::to(CLIENT, SERVER, PORT).req();
        m.truncate(keep);
        gsi(m, 0x8002, CLIENT, SERVER).bytes()
    };
    // A's UD QPs and listeners are D's partition's.
    let by_type = || {
        common::policy(&POLICY.replace(
            "[[bind]]\nuid = 1001",
            "[[bind]]\nuid = 1001\ntype = \"ud\"\npkey = 0x8002\n[[bind]]\nuid = 1001",
        ))
    };
    vec![
        case(
            "A's listener, A's request",
            a_listens(),
            req(0x8001),
            (Reason::Ok, true),
        ),
        case(
            "A's listener, B's (limited) request: a full member answers",
            a_listens(),
            req(0x0001),
            (Reason::Ok, true),
        ),
        case(
            "A's listener, D's request: another partition",
            a_listens(),
            req(0x8002),
            (Reason::PkeyViolation, false),
        ),
        case(
            "A's listener, the default key's request",
            a_listens(),
            req(0xffff),
            (Reason::PkeyViolation, false),
        ),
        case(
            "B's listener, C's request: two limited members",
            Setup::new(policy()).listening(at_server(), by(B, RC)),
            req(0x0001),
            (Reason::PkeyViolation, false),
        ),
        case(
            "C's listener, A's request",
            Setup::new(policy()).listening(at_server(), by(C, RC)),
            req(0x8001),
            (Reason::Ok, true),
        ),
        case(
            "A's wildcard listener, D's request",
            Setup::new(policy()).listening(anywhere(PS_TCP), by(A, RC)),
            req(0x8002),
            (Reason::PkeyViolation, false),
        ),
        case(
            "A's wildcard listener, A's request",
            Setup::new(policy()).listening(anywhere(PS_TCP), by(A, RC)),
            req(0x8001),
            (Reason::Ok, true),
        ),
        case(
            "D's listener on another port: not the request's",
            Setup::new(policy()).listening(
                listen_key(
                    service_id(PS_TCP, PORT + 1),
                    family::INET,
                    v4_mapped(SERVER.octets()),
                    false,
                ),
                by(D, RC),
            ),
            req(0xffff),
            (Reason::UnknownQp, true),
        ),
        case(
            "A's UD listener, D's SIDR_REQ",
            Setup::new(policy()).listening(anywhere(PS_UDP), by(A, UD)),
            sidr_req(0x8002),
            (Reason::PkeyViolation, false),
        ),
        case(
            "A's UD listener, A's SIDR_REQ",
            Setup::new(policy()).listening(anywhere(PS_UDP), by(A, UD)),
            sidr_req(0x8001),
            (Reason::Ok, true),
        ),
        case(
            "a listener no rule binds, default-pkey: the default key",
            Setup::new(policy()).listening(at_server(), by(NOBODY, RC)),
            req(0xffff),
            (Reason::UnknownQp, true),
        ),
        case(
            "a listener no rule binds, default-pkey: another key",
            Setup::new(policy()).listening(at_server(), by(NOBODY, RC)),
            req(0x8001),
            (Reason::PkeyViolation, false),
        ),
        case(
            "a listener no rule binds, unknown_qp = drop",
            Setup::new(with("[enforcement]\nunknown_qp = \"drop\"\n"))
                .listening(at_server(), by(NOBODY, RC)),
            req(0xffff),
            (Reason::UnknownQp, false),
        ),
        case(
            "no listener, default-pkey",
            Setup::new(policy()),
            req(0xffff),
            (Reason::UnknownQp, true),
        ),
        case(
            "no listener while one found no room: refused",
            Setup {
                unrecorded: 1,
                ..Setup::new(policy())
            },
            req(0xffff),
            (Reason::UnknownQp, false),
        ),
        case(
            "a rule by type binds A's UD listener to D's partition",
            Setup::new(by_type()).listening(anywhere(PS_UDP), by(A, UD)),
            sidr_req(0x8002),
            (Reason::Ok, true),
        ),
        case(
            "... and not A's RC listener",
            Setup::new(by_type()).listening(at_server(), by(A, RC)),
            req(0x8002),
            (Reason::PkeyViolation, false),
        ),
        case(
            "connection setup not recorded: QP1's rule alone (as before)",
            Setup {
                records: 0,
                ..a_listens()
            },
            req(0x8002),
            (Reason::Ok, true),
        ),
        case(
            "a key the port's table lacks: QP1's rule refuses it first",
            a_listens(),
            req(0x8005),
            (Reason::PkeyViolation, false),
        ),
        case(
            "a REQ cut short of rdma_cm's header: unreadable, refused",
            a_listens(),
            cut(160),
            (Reason::Malformed, false),
        ),
        case(
            "a REQ cut after rdma_cm's header: judged by its listener",
            a_listens(),
            cut(200),
            (Reason::PkeyViolation, false),
        ),
        case(
            "an RTU: QP1's rule (the connection's later MADs pass)",
            a_listens(),
            gsi(mad(attr::RTU, 5, 6), 0x8002, CLIENT, SERVER).bytes(),
            (Reason::Ok, true),
        ),
    ]
}

#[test]
fn requests_meet_their_listeners_partition_on_the_host() {
    let failures: Vec<String> = cases()
        .iter()
        .filter_map(|c| {
            let o = judge(&c.frame[..], &c.setup, &c.setup.policy.config());
            ((o.reason, o.pass) != c.want).then(|| {
                format!(
                    "{}: want {:?}, got {:?}/{}",
                    c.name, c.want, o.reason, o.pass
                )
            })
        })
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The real programs give every case the host's verdict, counted under its
/// reason, with the probes' records written as the probes write them.
#[test]
fn requests_meet_their_listeners_partition_in_the_kernel() {
    common::require_root();
    let mut failures = Vec::new();
    for c in &cases() {
        // A filter of its own per case: the records outlive a policy.
        let mut filter = Filter::load_for(&c.setup.policy).expect("load");
        c.setup.load(&mut filter);
        let xdp = filter.run_counted(&c.frame).expect("run");
        let before = filter.maps().reasons().unwrap();
        let (tc, _) = filter.run_ingress(&c.frame).expect("run");
        let after = filter.maps().reasons().unwrap();
        let counted = Reason::ALL
            .into_iter()
            .find(|&r| after.total(r) != before.total(r));
        if (xdp.1, xdp.0) != c.want || (counted, tc) != (Some(c.want.0), c.want.1) {
            failures.push(format!(
                "{}: want {:?}, XDP {:?}, TC {counted:?}/{tc}",
                c.name, c.want, xdp
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Random listeners (bound to the server's address, a family's or both
    /// families' wildcard, by any tenant or none), random requests (REQ or
    /// SIDR_REQ, any key, any service): the kernel's verdict is the host's.
    #[test]
    fn the_kernels_verdict_on_requests_is_the_hosts(
        listeners in proptest::collection::vec((0usize..3, 0usize..6, 0u16..3), 0..4),
        requests in proptest::collection::vec(
            (any::<bool>(), prop::sample::select(vec![0xffffu16, 0x8001, 0x0001, 0x8002, 0x7fff]), 0u16..3),
            1..8,
        ),
        unknown in 0usize..3,
        unrecorded in any::<bool>(),
    ) {
        let uids = [A, B, C, D, NOBODY, A];
        let rule = ["default-pkey", "drop", "pass"][unknown];
        let policy = common::policy(&format!(
            "{POLICY}[enforcement]\nunknown_qp = \"{rule}\"\n"
        ));
        let mut setup = Setup {
            unrecorded: u64::from(unrecorded),
            ..Setup::new(policy)
        };
        for (kind, who, port) in listeners {
            let (ps, qp_type) = if who % 2 == 0 { (PS_TCP, RC) } else { (PS_UDP, UD) };
            let sid = service_id(ps, PORT + port);
            let key = match kind {
                0 => listen_key(sid, family::INET, v4_mapped(SERVER.octets()), false),
                1 => listen_key(sid, family::INET, v4_mapped([0; 4]), true),
                _ => listen_key(sid, family::INET, v4_mapped([0; 4]), false),
            };
            setup.listeners.insert(key, by(uids[who], qp_type));
        }
        let mut filter = Filter::load_for(&setup.policy).expect("load");
        setup.load(&mut filter);
        for (sidr, pkey, port) in requests {
            let r = Request {
                ps: if sidr { PS_UDP } else { PS_TCP },
                ..Request::to(CLIENT, SERVER, PORT + port)
            };
            let m = if sidr { r.sidr_req() } else { r.req() };
            let frame = gsi(m, pkey, CLIENT, SERVER).bytes();
            let host = judge(&frame[..], &setup, &setup.policy.config());
            let kernel = filter.run_counted(&frame).expect("run");
            prop_assert_eq!((host.pass, host.reason), kernel);
        }
    }
}

/// What a stamping egress does with a datagram to or from QP1, from
/// `origin`, given what the probes recorded (`setup`).
fn egress(setup: &Setup, frame: &[u8], origin: Origin) -> Option<(Stamp, Option<u16>)> {
    let mut config = setup.policy.config();
    config.stamp = 1;
    stamp::egress(frame, setup, &config, || origin).map(|a| match a {
        Action::Rewrite(plan, s) => (s, Some(plan.new)),
        Action::Leave(s) | Action::Drop(s) => (s, None),
    })
}

/// QP1's CM MADs leave with the P_Key their connection was recorded with
/// (its QP's, which may be gone by its last DREQ); one no recorded
/// connection explains, with the default key; a tenant's UD QP's datagram
/// to QP1 (a CM request of its own making) with its own QP's; a UDP
/// socket's does not leave at all.
#[test]
fn cm_mads_leave_with_their_connections_key() {
    let mut setup = Setup::new(common::policy(POLICY));
    let rep = |local, pkey| gsi(mad(attr::REP, local, 9), pkey, SERVER, CLIENT).bytes();
    let gsi_origin = Origin::Qp(1);
    setup
        .connections
        .insert(connection_key(ConnectionKind::Own, 0x77), 0x8001);
    // A REP of a recorded connection: its QP's key, stamped.
    assert_eq!(
        egress(&setup, &rep(0x77, 0xffff), gsi_origin),
        Some((Stamp::Cm, Some(0x8001)))
    );
    assert_eq!(
        egress(&setup, &rep(0x77, 0x8001), gsi_origin),
        Some((Stamp::Cm, None))
    );
    // Any other: the port's default key.
    assert_eq!(
        egress(&setup, &rep(0x78, 0x8001), gsi_origin),
        Some((Stamp::CmDefaulted, Some(0xffff)))
    );
    // A SIDR_REP by the request it answers, not by its own ID.
    let sidr_rep = gsi(mad(attr::SIDR_REP, 0x77, 0), 0xffff, SERVER, CLIENT).bytes();
    assert_eq!(
        egress(&setup, &sidr_rep, gsi_origin),
        Some((Stamp::CmDefaulted, None))
    );
    setup
        .connections
        .insert(connection_key(ConnectionKind::SidrRequest, 0x77), 0x8001);
    assert_eq!(
        egress(&setup, &sidr_rep, gsi_origin),
        Some((Stamp::Cm, Some(0x8001)))
    );
    // Where the probes record no connection, CM MADs keep their key.
    let unrecorded = Setup {
        records: RECORDS_LISTENERS,
        ..Setup::new(common::policy(POLICY))
    };
    assert_eq!(
        egress(&unrecorded, &rep(0x77, 0xffff), gsi_origin),
        Some((Stamp::Management, None))
    );
    // A tenant's UD QP sending QP1 a REQ of its own making: its own key
    // (D's here), which the listener then judges; a UDP socket's, with
    // another partition's key: dropped.
    let forged = Request::to(CLIENT, SERVER, PORT).req();
    setup.policy = common::policy(&format!(
        "{POLICY}[[qp]]\nqpn = 0x42\ntype = \"ud\"\npkey = 0x8002\nqkey = 1\n"
    ));
    let from_qp = pkeyfw_testkit::wire::Packet {
        src_qp: 0x42,
        ..gsi(forged.clone(), 0xffff, CLIENT, SERVER)
    }
    .bytes();
    assert_eq!(
        egress(&setup, &from_qp, Origin::Qp(0x42)),
        Some((Stamp::Stamped, Some(0x8002)))
    );
    let from_socket = gsi(forged, 0x8001, CLIENT, SERVER).bytes();
    assert_eq!(
        egress(&setup, &from_socket, Origin::Other),
        Some((Stamp::Forged, None))
    );
    // QP1's own non-CM MAD with a key the table lacks: the default key
    // (dropping it would only have rxe send it again).
    let other = pkeyfw_testkit::wire::Packet {
        payload: vec![0; 256],
        ..gsi(vec![], 0x8005, SERVER, CLIENT)
    }
    .bytes();
    assert_eq!(
        egress(&setup, &other, gsi_origin),
        Some((Stamp::Defaulted, Some(0xffff)))
    );
}
