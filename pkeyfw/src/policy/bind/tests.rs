//! `[[bind]]` rules: their shape, every refusal with its position, and how
//! they bind discovered QPs.

use std::path::Path;

use pkeyfw_common::abi::{QpType, qp_flags};

use super::{BindRule, Binding};
use crate::{
    host::rdma::{IbQpType, Qp},
    policy::{Policy, PolicyError, QpRule},
};

const EXAMPLE: &str = r#"
[port]
pkeys = [0xffff, 0x8001, 0x0002]

[[qp]]
qpn = 0x11
type = "ud"
pkey = 0x8001
qkey = 0x11111111

[[bind]]
comm = "ibv_ud_pingpong"   # the owner's command, exactly as /proc/PID/comm
type = "ud"                # rc | uc | ud | xrc
pkey = 0x8001              # or pkey_index; it must be in [port].pkeys
qkey = 0x22222222          # or the Q_Key each QP sets

[[bind]]
pid = 4242
qpn = [0x100, 0x1ff]       # or a single QPN
pkey_index = 2
qkey = 0x33333333          # for the UD QPs it binds; others have none

[[bind]]
comm = "rping"
pkey = 0x8001
"#;

const PORT: &str = "[port]\npkeys = [0xffff, 0x8001]\n";

fn parse(text: &str) -> Result<Policy, PolicyError> {
    Policy::parse(Path::new("p.toml"), text)
}

fn bind(body: &str) -> String {
    format!("{PORT}[[bind]]\n{body}")
}

#[track_caller]
fn refused(text: &str, line: usize, field: &str, says: &str) {
    let e = parse(text).expect_err("must be refused");
    assert_eq!((e.line, e.field.as_str()), (line, field), "{e}");
    assert!(e.message.contains(says), "{e} lacks {says:?}");
    assert!(e.to_string().starts_with(&format!("p.toml:{line}:")), "{e}");
}

/// A `[[qp]]` entry's binding.
fn rule(qp_type: QpType, pkey: u16, qkey: Option<u32>) -> QpRule {
    QpRule {
        qp_type,
        pkey,
        qkey,
        flags: 0,
    }
}

/// A `[[bind]]` rule's binding.
fn by_rule(qp_type: QpType, pkey: u16, qkey: Option<u32>) -> QpRule {
    QpRule {
        flags: qp_flags::RULE,
        ..rule(qp_type, pkey, qkey)
    }
}

#[test]
fn the_documented_example() {
    let p = parse(EXAMPLE).unwrap();
    assert_eq!(
        p.binds,
        [
            BindRule {
                line: 11,
                comm: Some("ibv_ud_pingpong".into()),
                pid: None,
                cgroup: None,
                uid: None,
                gid: None,
                netns: None,
                kernel: false,
                port: None,
                device: None,
                qpns: None,
                qp_type: Some(QpType::Ud),
                pkey: 0x8001,
                qkey: Some(0x22222222),
                own: None,
            },
            BindRule {
                line: 17,
                comm: None,
                pid: Some(4242),
                cgroup: None,
                uid: None,
                gid: None,
                netns: None,
                kernel: false,
                port: None,
                device: None,
                qpns: Some(0x100..=0x1ff),
                qp_type: None,
                pkey: 0x0002,
                qkey: Some(0x33333333),
                own: None,
            },
            BindRule {
                line: 23,
                comm: Some("rping".into()),
                pid: None,
                cgroup: None,
                uid: None,
                gid: None,
                netns: None,
                kernel: false,
                port: None,
                device: None,
                qpns: None,
                qp_type: None,
                pkey: 0x8001,
                qkey: None,
                own: None,
            },
        ]
    );
    let single = parse(&bind("qpn = 0x2\npkey = 0xffff\n")).unwrap();
    assert_eq!(single.binds[0].qpns, Some(2..=2));
    let fifteen = parse(&bind("comm = \"ibv_rc_pingpong\"\npkey = 0xffff\n")).unwrap();
    assert_eq!(fifteen.binds[0].comm.as_deref(), Some("ibv_rc_pingpong"));
}

#[test]
fn a_rule_must_match_something() {
    refused(
        &bind("pkey = 0x8001\n"),
        3,
        "bind[0]",
        "at least one of cgroup, uid, gid, netns, kernel, port, device, comm, pid, qpn, type",
    );
    refused(
        &format!(
            "{}\n[[bind]]\nqkey = 1\npkey = 0xffff\n",
            bind("pid = 1\npkey = 0xffff")
        ),
        6,
        "bind[1]",
        "matches every QP",
    );
}

#[test]
fn matchers() {
    refused(
        &bind("comm = \"ibv_ud_pingpong_x\"\npkey = 0xffff\n"),
        4,
        "bind[0].comm",
        "at most 15",
    );
    refused(
        &bind("comm = \"\"\npkey = 0xffff\n"),
        4,
        "bind[0].comm",
        "is empty",
    );
    for pid in ["0", "-1", "4194305"] {
        refused(
            &bind(&format!("pid = {pid}\npkey = 0xffff\n")),
            4,
            "bind[0].pid",
            "1..=4194304",
        );
    }
    for qpn in ["1", "0xffffff", "[0, 0xff]", "[2, 0x1000000]"] {
        refused(
            &bind(&format!("qpn = {qpn}\npkey = 0xffff\n")),
            4,
            "bind[0].qpn",
            "0x2..=0xfffffe",
        );
    }
    for qpn in ["\"0x100\"", "[2]", "[2, 3, 4]", "[2, \"3\"]"] {
        refused(
            &bind(&format!("qpn = {qpn}\npkey = 0xffff\n")),
            4,
            "bind[0].qpn",
            "not a QPN or a range",
        );
    }
    refused(
        &bind("qpn = [0x1ff, 0x100]\npkey = 0xffff\n"),
        4,
        "bind[0].qpn",
        "[0x1ff, 0x100] is empty",
    );
    refused(
        &bind("type = \"rd\"\npkey = 0xffff\n"),
        4,
        "bind[0].type",
        "not a QP type",
    );
    refused(
        &bind("pid = 1\ncolour = 2\npkey = 0xffff\n"),
        5,
        "",
        "colour",
    );
}

#[test]
fn partitions_and_qkeys() {
    refused(&bind("pid = 1\n"), 3, "bind[0].pkey", "`pkey_index`");
    refused(
        &bind("pid = 1\npkey = 0x8002\n"),
        5,
        "bind[0].pkey",
        "not in [port].pkeys",
    );
    refused(
        &bind("pid = 1\npkey_index = 2\n"),
        5,
        "bind[0].pkey_index",
        "0..=1",
    );
    refused(
        &bind("pid = 1\npkey = 0xffff\npkey_index = 0\n"),
        6,
        "bind[0].pkey_index",
        "one of the two",
    );
    refused(
        &bind("type = \"rc\"\npkey = 0xffff\nqkey = 5\n"),
        6,
        "bind[0].qkey",
        "only UD QPs",
    );
    refused(
        &bind("pid = 1\npkey = 0xffff\nqkey = -1\n"),
        6,
        "bind[0].qkey",
        "out of range",
    );
}

#[test]
fn first_match_wins() {
    let p = parse(&format!(
        "{PORT}[[bind]]\ncomm = \"app\"\ntype = \"rc\"\npkey = 0x8001\n\
         [[bind]]\ncomm = \"app\"\npkey = 0xffff\nqkey = 7\n"
    ))
    .unwrap();
    let qps = [
        Qp::user(0x20, IbQpType::Rc, 1, "app"),
        Qp::user(0x21, IbQpType::Ud, 1, "app"),
        Qp::user(0x22, IbQpType::Rc, 1, "other"),
    ];
    let (effective, bindings) = p.with_discovered(&qps);
    assert_eq!(
        bindings,
        [
            Binding::Rule {
                rule: 0,
                line: 3,
                bound: by_rule(QpType::Rc, 0x8001, None),
            },
            Binding::Rule {
                rule: 1,
                line: 7,
                bound: by_rule(QpType::Ud, 0xffff, Some(7)),
            },
            Binding::Unbound,
        ]
    );
    assert_eq!(effective.qps.len(), 2);
    assert_eq!(effective.qps[&0x20], by_rule(QpType::Rc, 0x8001, None));
    assert_eq!(effective.qps[&0x21], by_rule(QpType::Ud, 0xffff, Some(7)));
    // The rest of the policy is the file's.
    assert_eq!(
        Policy {
            qps: p.qps.clone(),
            ..effective
        },
        p
    );
}

#[test]
fn entries_win_over_rules() {
    let p = parse(EXAMPLE).unwrap();
    let qps = [
        Qp::user(0x11, IbQpType::Ud, 1, "ibv_ud_pingpong"),
        Qp::user(0x12, IbQpType::Ud, 1, "ibv_ud_pingpong"),
    ];
    let (effective, bindings) = p.with_discovered(&qps);
    let entry = rule(QpType::Ud, 0x8001, Some(0x11111111));
    assert_eq!(bindings[0], Binding::Entry(entry));
    assert_eq!(effective.qps[&0x11], entry);
    assert_eq!(
        effective.qps[&0x12],
        by_rule(QpType::Ud, 0x8001, Some(0x22222222))
    );
}

/// A tenant that creates and destroys QPs until it holds a QPN a `[[qp]]`
/// entry names gets that entry's partition only if no boundary rule
/// (cgroup, uid, gid, netns) claims it: a QPN comes by chance, who made
/// the QP does not. A rule that matches only what a process chooses does
/// not beat the entry.
#[test]
fn boundary_rules_beat_entries_by_number() {
    let p = parse(
        "[port]\npkeys = [0xffff, 0x8001, 0x8002]\n\
         [[qp]]\nqpn = 0x11\ntype = \"rc\"\npkey = 0x8001\n\
         [[qp]]\nqpn = 0x12\ntype = \"rc\"\npkey = 0x8001\n\
         [[bind]]\nuid = 1001\npkey = 0x8002\n\
         [[bind]]\ncomm = \"squatter\"\npkey = 0x8002\n",
    )
    .unwrap();
    let tenant = |qpn, comm| Qp::user(qpn, IbQpType::Rc, 7, comm).made_by(1001, 1001, &[1, 20]);
    let by_name = Qp::user(0x12, IbQpType::Rc, 8, "squatter").made_by(1002, 1002, &[1, 30]);
    let (effective, bindings) = p.with_discovered(&[tenant(0x11, "app"), by_name]);
    let tenants = by_rule(QpType::Rc, 0x8002, None);
    assert_eq!(
        bindings,
        [
            Binding::Rule {
                rule: 0,
                line: 11,
                bound: tenants
            },
            Binding::Entry(rule(QpType::Rc, 0x8001, None)),
        ]
    );
    assert_eq!(effective.qps[&0x11], tenants);
    assert_eq!(effective.qps[&0x12], rule(QpType::Rc, 0x8001, None));
    assert!(p.binds[0].beats_entries() && p.binds[0].spec().beats_entries());
    assert!(!p.binds[1].beats_entries() && !p.binds[1].spec().beats_entries());
    // Every entry is warned about, as a comm rule is.
    let by_number: Vec<&String> = p
        .warnings
        .iter()
        .filter(|w| w.contains("[[qp]] entry binds QPN"))
        .collect();
    assert_eq!(by_number.len(), 2, "{:?}", p.warnings);
    assert!(
        by_number[0].contains(":3:") && by_number[0].contains("0x11"),
        "{by_number:?}"
    );
}

#[test]
fn types_map_to_transports() {
    let p = parse(&bind("pid = 9\npkey = 0x8001\nqkey = 3\n")).unwrap();
    let qps = [
        Qp::user(0, IbQpType::Smi, 9, "x"),
        Qp::user(1, IbQpType::Gsi, 9, "x"),
        Qp::user(0x30, IbQpType::Rc, 9, "x"),
        Qp::user(0x31, IbQpType::Uc, 9, "x"),
        Qp::user(0x32, IbQpType::Ud, 9, "x"),
        Qp::user(0x33, IbQpType::XrcIni, 9, "x"),
        Qp::user(0x34, IbQpType::XrcTgt, 9, "x"),
        Qp::user(0x35, IbQpType::RawPacket, 9, "x"),
        Qp::user(0x36, IbQpType::Driver, 9, "x"),
    ];
    let (effective, bindings) = p.with_discovered(&qps);
    let bound: Vec<Option<QpType>> = bindings
        .iter()
        .map(|b| match b {
            Binding::Rule { bound, .. } => Some(bound.qp_type),
            Binding::Exempt => None,
            other => panic!("{other:?}"),
        })
        .collect();
    use QpType::*;
    assert_eq!(
        bound,
        [
            None,
            None,
            Some(Rc),
            Some(Uc),
            Some(Ud),
            Some(Xrc),
            Some(Xrc),
            None,
            None
        ]
    );
    assert_eq!(effective.qps[&0x32].qkey, Some(3));
    assert_eq!(effective.qps[&0x30].qkey, None);

    let xrc = parse(&bind("type = \"xrc\"\npkey = 0xffff\n")).unwrap();
    let (_, bindings) = xrc.with_discovered(&qps);
    let matched: Vec<u32> = qps
        .iter()
        .zip(&bindings)
        .filter(|(_, b)| matches!(b, Binding::Rule { .. }))
        .map(|(q, _)| q.qpn)
        .collect();
    assert_eq!(matched, [0x33, 0x34]);
}

#[test]
fn a_ud_qp_without_a_qkey_in_its_rule_keeps_its_own() {
    let p = parse(&format!(
        "{PORT}[[bind]]\ncomm = \"app\"\npkey = 0x8001\n\
         [[bind]]\ntype = \"ud\"\npkey = 0xffff\nqkey = 7\n"
    ))
    .unwrap();
    let qps = [
        Qp::user(0x40, IbQpType::Ud, 1, "app"),
        Qp::user(0x41, IbQpType::Rc, 1, "app"),
    ];
    let (effective, bindings) = p.with_discovered(&qps);
    // Not handed on to the second rule.
    let own = QpRule {
        flags: qp_flags::RULE | qp_flags::OWN_QKEY,
        ..rule(QpType::Ud, 0x8001, None)
    };
    assert_eq!(
        bindings[0],
        Binding::Rule {
            rule: 0,
            line: 3,
            bound: own
        }
    );
    // Until the loader knows the Q_Key it set, every UD frame is refused.
    let entry = Policy::qp_entry(&effective.qps[&0x40]);
    assert_ne!(entry.flags & qp_flags::UNSET_QKEY, 0);
    assert_eq!(effective.qps[&0x41], by_rule(QpType::Rc, 0x8001, None));
}

#[test]
fn matchers_combine() {
    let p = parse(&bind(
        "comm = \"app\"\npid = 5\nqpn = [0x10, 0x1f]\ntype = \"rc\"\npkey = 0x8001\n",
    ))
    .unwrap();
    let yes = Qp::user(0x10, IbQpType::Rc, 5, "app");
    assert!(p.binds[0].matches(&yes));
    let unknown = Qp {
        maker: crate::host::rdma::Maker::Unknown,
        ..yes.clone()
    };
    for no in [
        Qp::user(0x10, IbQpType::Rc, 5, "ap"),
        Qp::user(0x10, IbQpType::Rc, 6, "app"),
        unknown,
        Qp::user(0x20, IbQpType::Rc, 5, "app"),
        Qp::user(0x10, IbQpType::Uc, 5, "app"),
    ] {
        assert!(!p.binds[0].matches(&no), "{no:?}");
    }
    // A kernel QP matches a kernel rule by its kernel module's name; a
    // process of that name does not, nor does a user rule match the ULP.
    let kernel = parse(&bind("kernel = true\ncomm = \"rdma_cm\"\npkey = 0xffff\n")).unwrap();
    let user = parse(&bind("comm = \"rdma_cm\"\npkey = 0xffff\n")).unwrap();
    let mut ulp = Qp {
        pid: None,
        kernel: true,
        ..Qp::user(0x50, IbQpType::Rc, 0, "rdma_cm")
    };
    crate::host::rdma::identify(std::slice::from_mut(&mut ulp), &Default::default());
    let posing = Qp::user(0x51, IbQpType::Rc, 7, "rdma_cm");
    assert!(kernel.binds[0].matches(&ulp));
    assert!(!kernel.binds[0].matches(&posing));
    assert!(!user.binds[0].matches(&ulp));
    assert!(!kernel.binds[0].no_boundary());
    refused(
        &bind("kernel = true\nuid = 0\npkey = 0xffff\n"),
        4,
        "bind[0].kernel",
        "have no process",
    );
    refused(
        &bind("kernel = true\ncomm = \"ib_uverbs\"\npkey = 0xffff\n"),
        5,
        "bind[0].comm",
        "QPs for processes",
    );
}

#[test]
fn one_qpn_on_two_devices_is_bound_once() {
    let p = parse(&bind("type = \"rc\"\npkey = 0x8001\n")).unwrap();
    let other = Qp {
        device: "rxe1".into(),
        ..Qp::user(0x60, IbQpType::Rc, 2, "b")
    };
    let (effective, bindings) = p.with_discovered(&[Qp::user(0x60, IbQpType::Rc, 1, "a"), other]);
    assert!(matches!(bindings[0], Binding::Rule { .. }));
    assert_eq!(
        bindings[1],
        Binding::Taken(by_rule(QpType::Rc, 0x8001, None))
    );
    assert_eq!(effective.qps.len(), 1);
}

#[test]
fn the_same_qps_give_the_same_policy() {
    let p = parse(EXAMPLE).unwrap();
    let qps = [
        Qp::user(0x11, IbQpType::Ud, 1, "ibv_ud_pingpong"),
        Qp::user(0x150, IbQpType::Rc, 4242, "x"),
        Qp::user(0x151, IbQpType::Ud, 4242, "x"),
    ];
    assert_eq!(p.with_discovered(&qps), p.with_discovered(&qps));
    let (fewer, _) = p.with_discovered(&qps[..2]);
    assert_ne!(fewer, p.with_discovered(&qps).0);
    let (none, bindings) = p.with_discovered(&[]);
    assert_eq!((none, bindings), (p, vec![]));
}

/// The creator matchers: each path is checked for what it claims, every
/// refusal names its line and column, and the rule compiles to what the
/// QP-creation probe reads.
#[test]
fn creator_matchers_are_checked_and_compiled() {
    refused(
        &bind("cgroup = \"/nonexistent/tenant\"\npkey = 0x8001\n"),
        4,
        "bind[0].cgroup",
        "cannot read it",
    );
    refused(
        &bind("cgroup = \"/tmp\"\npkey = 0x8001\n"),
        4,
        "bind[0].cgroup",
        "not a cgroup v2 directory",
    );
    refused(
        &bind("netns = \"/proc/self/ns/uts\"\npkey = 0x8001\n"),
        4,
        "bind[0].netns",
        "not a network namespace",
    );
    refused(
        &bind("netns = \"/etc/hostname\"\npkey = 0x8001\n"),
        4,
        "bind[0].netns",
        "not a namespace file",
    );
    refused(
        &bind("uid = 4294967295\npkey = 0x8001\n"),
        4,
        "bind[0].uid",
        "out of range",
    );
    refused(
        &bind("gid = -1\npkey = 0x8001\n"),
        4,
        "bind[0].gid",
        "out of range",
    );
    let rules: String = (0..65)
        .map(|i| format!("[[bind]]\nuid = {i}\npkey = 0x8001\n"))
        .collect();
    refused(&format!("{PORT}{rules}"), 195, "bind[64]", "at most 64");

    let p = parse(&bind(
        "uid = 1001\ngid = 1002\nnetns = \"/proc/self/ns/net\"\npkey = 0x8001\n",
    ))
    .unwrap();
    let b = &p.binds[0];
    assert!(!b.no_boundary());
    let spec = b.spec();
    use pkeyfw_common::abi::matcher;
    assert_eq!(
        spec.matchers,
        matcher::IN_USE | matcher::UID | matcher::GID | matcher::NETNS
    );
    assert_eq!(
        (spec.uid, spec.gid, spec.pkey, spec.pinned_qkey),
        (1001, 1002, 0x8001, 0)
    );
    // The namespace's cookie, which is never reused, not its inode number.
    let cookie = crate::host::netns::cookie_of_pid(std::process::id());
    assert_eq!(Some(spec.netns), cookie);
}

/// Creator matchers read who made the QP: a QP whose maker is unknown
/// (its thread gone before any probe saw it) matches none of them.
#[test]
fn creator_matchers_match_the_maker() {
    let p = parse(&format!(
        "{PORT}[[bind]]\ncgroup = \"{}\"\nuid = 1001\npkey = 0x8001\n",
        crate::host::identity::cgroup2_mount()
            .expect("cgroup2 is mounted")
            .display()
    ))
    .unwrap();
    let mut qp = Qp::user(0x40, IbQpType::Rc, 1, "app");
    let rule = &p.binds[0];
    assert!(!rule.matches(&qp), "no ids, no match");
    qp = qp.made_by(1001, 5, &[1, 40]);
    assert!(rule.matches(&qp), "the root cgroup holds every cgroup");
    qp.maker = crate::host::rdma::Maker::Unknown;
    assert!(!rule.matches(&qp), "an unknown maker matches nothing");
    qp = Qp::user(0x40, IbQpType::Rc, 1, "app").made_by(1002, 5, &[1, 40]);
    assert!(!rule.matches(&qp));
}

/// A process in a network namespace of its own, made by an unprivileged
/// user as a tenant would (`unshare -Urn` as nobody); killed when dropped.
struct Unshared(std::process::Child);

impl Unshared {
    fn start() -> Unshared {
        let mut child = std::process::Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .args(["unshare", "-Urn", "sleep", "60"])
            .spawn()
            .expect("setpriv unshare -Urn");
        use std::os::unix::fs::MetadataExt as _;
        let me = std::fs::metadata("/proc/self/ns/net").unwrap().ino();
        let path = format!("/proc/{}/ns/net", child.id());
        for _ in 0..200 {
            if std::fs::metadata(&path).is_ok_and(|m| m.ino() != me) {
                return Unshared(child);
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let _ = child.kill();
        let _ = child.wait();
        panic!("unshare -Urn made no namespace");
    }

    fn pid(&self) -> u32 {
        self.0.id()
    }

    fn netns(&self) -> crate::host::identity::Netns {
        crate::host::identity::netns(Path::new(&format!("/proc/{}/ns/net", self.pid()))).unwrap()
    }
}

impl Drop for Unshared {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A `netns` rule outlives its namespace: once the tenant's namespace is
/// gone, an unprivileged `unshare -Urn` gets its inode number again (the
/// kernel hands out the lowest free one). The rule holds the namespace's
/// cookie, which no other namespace gets, so the newcomer's QPs are not
/// the deleted tenant's: neither in the kernel's rule nor in the match
/// against the QPs already there. (Another test's namespace may take the
/// number first: then the whole attempt is made again.)
#[test]
fn a_reused_namespace_inode_is_not_the_rules_namespace() {
    let squatted = (0..5).any(|_| namespace_squatted());
    assert!(
        squatted,
        "the inode number never came back to a new namespace"
    );
}

/// One attempt of the test above: whether the newcomer got the number.
fn namespace_squatted() -> bool {
    use crate::host::rdma::{Maker, creation_of};
    let tenant = Unshared::start();
    let gone = tenant.netns();
    let p = parse(&format!(
        "[port]\npkeys = [0xffff, 0x8001]\n\
         [[bind]]\nnetns = \"/proc/{}/ns/net\"\npkey = 0x8001\n",
        tenant.pid()
    ))
    .unwrap();
    let rule = &p.binds[0];
    assert_eq!(
        rule.spec().netns,
        gone.cookie,
        "the kernel's rule holds the cookie"
    );
    // As /proc tells it, for a QP made before any probe ran.
    let qp_of = |u: &Unshared, _inode| {
        let mut qp = Qp::user(0x11, IbQpType::Ud, u.pid(), "tenant");
        qp.maker = creation_of(u.pid()).map_or(Maker::Unknown, Maker::Read);
        qp
    };
    assert!(
        rule.matches(&qp_of(&tenant, gone.inode)),
        "the tenant's own QP"
    );
    drop(tenant);

    let Some(squatter) = (0..64)
        .map(|_| Unshared::start())
        .find(|u| u.netns().inode == gone.inode)
    else {
        return false;
    };
    let now = squatter.netns();
    assert_ne!(now.cookie, gone.cookie, "a cookie is never reused");
    assert!(
        !rule.matches(&qp_of(&squatter, now.inode)),
        "the squatter's QP is not the tenant's"
    );
    assert_ne!(rule.spec().netns, now.cookie);
    true
}

/// A kernel rule may name the rdma_cm port its users serve or connect to;
/// a process's rule may not (its QPs are bound by who made them), nor
/// may a port be 0 or past 65535; a kernel rule without one is warned
/// about, as it binds RDS's QPs with NVMe's.
#[test]
fn kernel_rules_by_port() {
    let p = parse(&bind(
        "kernel = true\ncomm = \"rdma_cm\"\nport = 4420\npkey = 0xffff\n",
    ))
    .unwrap();
    assert_eq!(p.binds[0].port, Some(4420));
    let spec = p.binds[0].spec();
    assert_eq!(
        (
            spec.port,
            spec.matchers & pkeyfw_common::abi::matcher::PORT != 0
        ),
        (4420, true)
    );
    assert!(
        p.warnings.iter().all(|w| !w.contains("names no port")),
        "{:?}",
        p.warnings
    );
    let unported = parse(&bind("kernel = true\ncomm = \"rdma_cm\"\npkey = 0xffff\n")).unwrap();
    assert!(
        unported
            .warnings
            .iter()
            .any(|w| w.contains("names no port")),
        "{:?}",
        unported.warnings
    );
    refused(
        &bind("uid = 1001\nport = 4420\npkey = 0xffff\n"),
        5,
        "bind[0].port",
        "kernel = true rules",
    );
    refused(
        &bind("kernel = true\nport = 70000\npkey = 0xffff\n"),
        5,
        "bind[0].port",
        "out of range",
    );
    // Named by what RDMA netlink says: "no RDMA device here", or here,
    // with no RDMA netlink at all, that it cannot be asked.
    refused(
        &bind("kernel = true\ndevice = \"no-such-rdma-device\"\npkey = 0xffff\n"),
        5,
        "bind[0].device",
        "RDMA device",
    );
}
