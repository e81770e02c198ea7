//! Policy files: the documented shape, and every refusal with its position.

use std::path::Path;

use pkeyfw_common::abi::{OnForeignJoin, QpType, UnknownQp};

use super::{Policy, PolicyError};

const EXAMPLE: &str = r#"
[port]
pkeys = [0xffff, 0x8001, 0x0002]   # this port's P_Key table; index 0 is the default P_Key

[enforcement]
mode = "enforce"                   # enforce | monitor
unknown_qp = "default-pkey"        # default-pkey | drop | pass

[[qp]]
qpn = 0x11
type = "ud"                        # rc | uc | ud | xrc
pkey = 0x8001                      # or pkey_index = 1; either way it must be in [port].pkeys
qkey = 0x11111111                  # required for ud, refused for the other types

[[group]]
addr = "ff12:401b::1"              # a multicast IPv6 or IPv4 address
pkey = 0x8001
qkey = 0x00000b1b
"#;

fn parse(text: &str) -> Result<Policy, PolicyError> {
    Policy::parse(Path::new("p.toml"), text)
}

/// The error for `text`, as `line:column field: message`.
fn error(text: &str) -> PolicyError {
    parse(text).expect_err("must be refused")
}

#[track_caller]
fn refused(text: &str, line: usize, field: &str, says: &str) {
    let e = error(text);
    assert_eq!((e.line, e.field.as_str()), (line, field), "{e}");
    assert!(e.message.contains(says), "{e} lacks {says:?}");
    assert!(e.to_string().starts_with(&format!("p.toml:{line}:")), "{e}");
}

#[test]
fn the_documented_example() {
    let p = parse(EXAMPLE).unwrap();
    assert_eq!(p.pkeys, [0xffff, 0x8001, 0x0002]);
    assert!(!p.monitor);
    assert_eq!(p.unknown_qp, UnknownQp::DefaultPkey);
    let qp = p.qps[&0x11];
    assert_eq!(
        (qp.qp_type, qp.pkey, qp.qkey),
        (QpType::Ud, 0x8001, Some(0x11111111))
    );
    assert_eq!(p.groups.len(), 1);
    let g = p.groups.values().next().unwrap();
    assert_eq!(
        (g.addr.to_string().as_str(), g.pkey, g.qkey),
        ("ff12:401b::1", 0x8001, 0xb1b)
    );
}

#[test]
fn defaults_and_pkey_index() {
    let p =
        parse("[port]\npkeys = [0x7fff, 0x8005]\n[[qp]]\nqpn = 2\ntype = \"rc\"\npkey_index = 1\n")
            .unwrap();
    assert!(!p.monitor);
    assert_eq!(p.unknown_qp, UnknownQp::DefaultPkey);
    assert_eq!(p.qps[&2].pkey, 0x8005);
    assert_eq!(p.qps[&2].qkey, None);
    assert_eq!(p.default_pkey(), 0x7fff);
    let p = parse(
        "[port]\npkeys = [0xffff]\n[enforcement]\nmode = \"monitor\"\nunknown_qp = \"drop\"\n",
    )
    .unwrap();
    assert!(p.monitor);
    assert_eq!(p.unknown_qp, UnknownQp::Drop);
}

#[test]
fn ipv4_groups_are_keyed_v4_mapped() {
    let p = parse(
        "[port]\npkeys = [0xffff]\n[[group]]\naddr = \"239.1.2.3\"\npkey = 0xffff\nqkey = 1\n",
    )
    .unwrap();
    let key = *p.groups.keys().next().unwrap();
    assert_eq!(
        key,
        [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 239, 1, 2, 3]
    );
}

const PORT: &str = "[port]\npkeys = [0xffff, 0x8001]\n";

fn qp(body: &str) -> String {
    format!("{PORT}[[qp]]\n{body}")
}

#[test]
fn toml_syntax_and_types() {
    refused("[port\npkeys = [1]\n", 1, "", "");
    refused("[port]\npkeys = [0xffff]\nbogus = 1\n", 3, "", "bogus");
    refused("[port]\npkeys = \"0xffff\"\n", 2, "", "");
    refused(
        &qp("qpn = \"two\"\ntype = \"rc\"\npkey = 0xffff\n"),
        4,
        "",
        "",
    );
    refused(
        &qp("qpn = 2\ntype = \"rc\"\npkey = 0xffff\ncolour = 1\n"),
        7,
        "",
        "colour",
    );
}

#[test]
fn port_table() {
    refused("[enforcement]\nmode = \"enforce\"\n", 1, "port", "[port]");
    refused("[port]\n", 1, "port.pkeys", "missing");
    refused("[port]\npkeys = []\n", 2, "port.pkeys", "empty");
    refused(
        "[port]\npkeys = [0xffff, 0x8000]\n",
        2,
        "port.pkeys[1]",
        "key portion 0",
    );
    refused(
        "[port]\npkeys = [0x0000]\n",
        2,
        "port.pkeys[0]",
        "key portion 0",
    );
    refused(
        "[port]\npkeys = [0x10000]\n",
        2,
        "port.pkeys[0]",
        "out of range",
    );
    refused("[port]\npkeys = [-1]\n", 2, "port.pkeys[0]", "out of range");
    refused(
        "[port]\npkeys = [0xffff, 0x8001, 0xffff]\n",
        2,
        "port.pkeys[2]",
        "repeats index 0",
    );
}

#[test]
fn enforcement() {
    refused(
        &format!("{PORT}[enforcement]\nmode = \"strict\"\n"),
        4,
        "enforcement.mode",
        "\"enforce\" or \"monitor\"",
    );
    refused(
        &format!("{PORT}[enforcement]\nunknown_qp = \"allow\"\n"),
        4,
        "enforcement.unknown_qp",
        "\"default-pkey\", \"drop\" or \"pass\"",
    );
    refused(
        &format!("{PORT}[enforcement]\nforeign_join = \"refuse\"\n"),
        4,
        "enforcement.foreign_join",
        "\"report\" or \"kill\"",
    );
}

/// Foreign multicast joins are reported unless the policy says to kill,
/// which monitor mode never does, and says so.
#[test]
fn foreign_joins() {
    let parse = |text: &str| Policy::parse(Path::new("p.toml"), &format!("{PORT}{text}")).unwrap();
    let kill = parse("[enforcement]\nforeign_join = \"kill\"\n");
    assert_eq!(kill.foreign_join, OnForeignJoin::Kill);
    assert_eq!(kill.join_action(), OnForeignJoin::Kill);
    assert!(kill.warnings.is_empty(), "{:?}", kill.warnings);
    assert_eq!(parse("").foreign_join, OnForeignJoin::Report);
    let monitor = parse("[enforcement]\nmode = \"monitor\"\nforeign_join = \"kill\"\n");
    assert_eq!(monitor.join_action(), OnForeignJoin::Report);
    assert!(
        monitor
            .warnings
            .iter()
            .any(|w| w.starts_with("p.toml:5:") && w.contains("kills nothing in monitor mode")),
        "{:?}",
        monitor.warnings
    );
}

#[test]
fn qps() {
    for qpn in ["0", "1", "0xffffff", "0x1000000", "-3"] {
        refused(
            &qp(&format!("qpn = {qpn}\ntype = \"rc\"\npkey = 0xffff\n")),
            4,
            "qp[0].qpn",
            "0x2..=0xfffffe",
        );
    }
    refused(
        &qp("type = \"rc\"\npkey = 0xffff\n"),
        3,
        "qp[0].qpn",
        "missing",
    );
    refused(
        &qp("qpn = 2\ntype = \"rd\"\npkey = 0xffff\n"),
        5,
        "qp[0].type",
        "not a QP type",
    );
    refused(&qp("qpn = 2\npkey = 0xffff\n"), 3, "qp[0].type", "missing");
    refused(
        &qp("qpn = 2\ntype = \"rc\"\n"),
        3,
        "qp[0].pkey",
        "`pkey_index`",
    );
    refused(
        &qp("qpn = 2\ntype = \"rc\"\npkey = 0x8002\n"),
        6,
        "qp[0].pkey",
        "not in [port].pkeys",
    );
    refused(
        &qp("qpn = 2\ntype = \"rc\"\npkey = 0x0001\n"),
        6,
        "qp[0].pkey",
        "not in [port].pkeys",
    );
    refused(
        &qp("qpn = 2\ntype = \"rc\"\npkey = 0x8000\n"),
        6,
        "qp[0].pkey",
        "key portion 0",
    );
    refused(
        &qp("qpn = 2\ntype = \"rc\"\npkey_index = 2\n"),
        6,
        "qp[0].pkey_index",
        "0..=1",
    );
    refused(
        &qp("qpn = 2\ntype = \"rc\"\npkey = 0xffff\npkey_index = 0\n"),
        7,
        "qp[0].pkey_index",
        "one of the two",
    );
    refused(
        &qp("qpn = 2\ntype = \"ud\"\npkey = 0xffff\n"),
        3,
        "qp[0].qkey",
        "UD QP needs",
    );
    refused(
        &qp("qpn = 2\ntype = \"rc\"\npkey = 0xffff\nqkey = 5\n"),
        7,
        "qp[0].qkey",
        "only UD QPs",
    );
    refused(
        &qp("qpn = 2\ntype = \"ud\"\npkey = 0xffff\nqkey = 0x100000000\n"),
        7,
        "qp[0].qkey",
        "out of range",
    );
    let twice = format!(
        "{}\n[[qp]]\nqpn = 0x2\ntype = \"uc\"\npkey = 0x8001\n",
        qp("qpn = 2\ntype = \"rc\"\npkey = 0xffff")
    );
    refused(&twice, 8, "qp[1].qpn", "already bound at line 3");
}

#[test]
fn groups() {
    let g = |body: &str| format!("{PORT}[[group]]\n{body}");
    refused(
        &g("addr = \"10.0.0.1\"\npkey = 0xffff\nqkey = 1\n"),
        4,
        "group[0].addr",
        "not multicast",
    );
    refused(
        &g("addr = \"fe80::1\"\npkey = 0xffff\nqkey = 1\n"),
        4,
        "group[0].addr",
        "not multicast",
    );
    refused(
        &g("addr = \"ff12::zz\"\npkey = 0xffff\nqkey = 1\n"),
        4,
        "group[0].addr",
        "not an IP address",
    );
    refused(
        &g("addr = \"ff12::1\"\npkey = 0x8003\nqkey = 1\n"),
        5,
        "group[0].pkey",
        "not in [port].pkeys",
    );
    refused(
        &g("addr = \"ff12::1\"\npkey = 0xffff\n"),
        3,
        "group[0].qkey",
        "missing",
    );
    refused(
        &g("pkey = 0xffff\nqkey = 1\n"),
        3,
        "group[0].addr",
        "missing",
    );
    let twice = format!(
        "{}[[group]]\naddr = \"ff12:0::1\"\npkey = 0xffff\nqkey = 2\n",
        g("addr = \"ff12::1\"\npkey = 0xffff\nqkey = 1\n")
    );
    refused(&twice, 8, "group[1].addr", "defined twice");
}

#[test]
fn unreadable_file() {
    let e = Policy::load(Path::new("/nonexistent/policy.toml")).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("/nonexistent/policy.toml: cannot read"),
        "{e}"
    );
}

/// A rule that tells tenants apart by the name a process gives itself is
/// no boundary: an enforcing policy says so, naming the rule's line.
#[test]
fn rules_by_command_name_only_are_warned_about() {
    let rule = |extra: &str| {
        format!(
            "[port]\npkeys = [0xffff, 0x8001]\n{extra}\n[[bind]]\ncomm = \"tenant-a\"\ntype = \"rc\"\npkey = 0x8001\n"
        )
    };
    let warned = |p: &Policy| p.warnings.iter().any(|w| w.contains("no boundary"));
    let enforce = parse(&rule("")).unwrap();
    assert!(warned(&enforce), "{:?}", enforce.warnings);
    assert!(enforce.warnings.iter().any(|w| w.contains("p.toml:4:")));
    let monitor = parse(&rule("[enforcement]\nmode = \"monitor\"\n")).unwrap();
    assert!(!warned(&monitor), "{:?}", monitor.warnings);
}

/// A ConfigMap volume as the kubelet writes it: each version in a
/// directory of its own, `..data` pointing at the current one, and every
/// file a link through `..data`. A swap between reading the policy and
/// reading the partitions.conf it names (relative or absolute) must not
/// give the new partitions with the old policy: both come from the version
/// the policy was read from.
#[test]
fn a_configmap_swap_never_mixes_the_policy_and_its_partitions() {
    use std::os::unix::fs::symlink;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let version = |name: &str, partition: u16| {
        let v = root.join(name);
        std::fs::create_dir(&v).unwrap();
        std::fs::write(
            v.join("partitions.conf"),
            format!("Default=0x7fff : ALL=full ;\nt={partition:#06x} : ALL=full ;\n"),
        )
        .unwrap();
        v
    };
    let (old, new) = (version("..v1", 0x0001), version("..v2", 0x0002));
    symlink("..v1", root.join("..data")).unwrap();
    for file in ["policy.toml", "partitions.conf"] {
        symlink(format!("..data/{file}"), root.join(file)).unwrap();
    }
    for named in [
        "partitions.conf".to_string(),
        root.join("partitions.conf").display().to_string(),
    ] {
        for v in [&old, &new] {
            std::fs::write(
                v.join("policy.toml"),
                format!("[port]\nguid = \"0x42\"\npartitions = \"{named}\"\n"),
            )
            .unwrap();
        }
        let _ = std::fs::remove_file(root.join("..data"));
        symlink("..v1", root.join("..data")).unwrap();
        let source = super::ctx::Source::read(&root.join("policy.toml")).unwrap();
        // The kubelet swaps: a new link, renamed over `..data`.
        symlink("..v2", root.join("..new")).unwrap();
        std::fs::rename(root.join("..new"), root.join("..data")).unwrap();
        let policy = super::file::parse(&source.ctx(), None).unwrap();
        assert_eq!(
            policy.pkeys,
            [0xffff, 0x8001],
            "{named}: the old version whole"
        );
        let after = Policy::load(&root.join("policy.toml")).unwrap();
        assert_eq!(
            after.pkeys,
            [0xffff, 0x8002],
            "{named}: the new version whole"
        );
    }
}
