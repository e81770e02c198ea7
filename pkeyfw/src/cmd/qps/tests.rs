//! What `pkeyfw qps` prints for discovered QPs, with and without a policy.

use std::{collections::BTreeMap, path::Path};

use pkeyfw_common::abi::QpStats;
use serde_json::json;

use super::View;
use crate::{
    host::rdma::{Device, Driver, IbQpType, Qp},
    policy::Policy,
};

const POLICY: &str = "[port]\npkeys = [0xffff, 0x8001]\n\
    [enforcement]\nunknown_qp = \"drop\"\n\
    [[qp]]\nqpn = 0x13\ntype = \"rc\"\npkey = 0xffff\n\
    [[bind]]\ncomm = \"ibv_ud_pingpong\"\ntype = \"ud\"\npkey = 0x8001\nqkey = 0x11111111\n\
    [[bind]]\ncomm = \"loose\"\npkey = 0x8001\n";

fn qps() -> Vec<Qp> {
    vec![
        Qp {
            pid: None,
            kernel: true,
            ..Qp::user(1, IbQpType::Gsi, 0, "ib_core")
        },
        Qp::user(0x11, IbQpType::Ud, 4242, "ibv_ud_pingpong"),
        Qp {
            remote_qpn: Some(0x14),
            local: Some("10.0.0.1:18515".parse().unwrap()),
            peer: Some("10.0.0.2:41234".parse().unwrap()),
            ..Qp::user(0x12, IbQpType::Rc, 5151, "rping")
        },
        Qp::user(0x13, IbQpType::Rc, 5151, "rping"),
        Qp::user(0x15, IbQpType::Ud, 6000, "loose"),
    ]
}

fn view(with_policy: bool) -> View {
    let qps = qps();
    let policy = with_policy.then(|| {
        let p = Policy::parse(Path::new("p.toml"), POLICY).unwrap();
        let (effective, bindings) = p.with_discovered(&qps);
        ("/etc/pkeyfw/p.toml".into(), effective, bindings)
    });
    View {
        iface: "veth0".into(),
        devices: vec![Device {
            index: 3,
            name: "rxe0".into(),
            ports: vec![1],
            port_count: 1,
            driver: Driver::Rxe,
        }],
        qps,
        policy,
        counters: BTreeMap::from([(
            0x11,
            QpStats {
                passed: 12,
                dropped: 3,
            },
        )]),
    }
}

fn text(view: &View) -> String {
    let mut out = Vec::new();
    view.text(&mut out).unwrap();
    String::from_utf8(out).unwrap()
}

#[test]
fn text_with_bindings() {
    assert_eq!(
        text(&view(true)),
        "\
veth0: 5 QPs on rxe0 (rdma_rxe) port 1; policy /etc/pkeyfw/p.toml (unknown QPs: drop)
  rxe0/1 QP 0x000001 GSI     RTS   [ib_core]
      QP0/QP1: fixed rules
  rxe0/1 QP 0x000011 UD      RTS   pid 4242 ibv_ud_pingpong
      bind[0] (line 9): P_Key 0x8001 (full, partition 0x0001), Q_Key 0x11111111; passed 12, dropped 3
  rxe0/1 QP 0x000012 RC      RTS   pid 5151 rping, peer QP 0x000014, 10.0.0.1:18515 → 10.0.0.2:41234
      unbound → unknown_qp drop
  rxe0/1 QP 0x000013 RC      RTS   pid 5151 rping
      [[qp]] entry: P_Key 0xffff (full, partition 0x7fff)
  rxe0/1 QP 0x000015 UD      RTS   pid 6000 loose
      bind[1] (line 14): P_Key 0x8001 (full, partition 0x0001), the Q_Key its program sets
warning: rxe0 has QPs bound to partitions 0x0001, 0x7fff: traffic between QPs of one rxe device stays inside the driver, where pkeyfw cannot judge it; give each tenant its own RDMA device
"
    );
}

#[test]
fn text_without_a_policy() {
    let out = text(&view(false));
    assert!(
        out.starts_with(
            "veth0: 5 QPs on rxe0 (rdma_rxe) port 1; no policy (give --policy to see bindings)\n"
        ),
        "{out}"
    );
    assert_eq!(out.lines().count(), 6, "{out}");
}

#[test]
fn json_per_qp() {
    let v = view(true).json();
    assert_eq!(v["interface"], "veth0");
    assert_eq!(v["policy"], "/etc/pkeyfw/p.toml");
    assert_eq!(
        v["devices"],
        json!([{"name": "rxe0", "index": 3, "ports": [1], "driver": "rdma_rxe", "in_reach": true}])
    );
    assert_eq!(
        v["qps"][1],
        json!({
            "device": "rxe0", "port": 1, "qpn": 0x11, "type": "UD", "state": "RTS",
            "remote_qpn": null, "pid": 4242, "comm": "ibv_ud_pingpong", "kernel": false,
            "local": null, "peer": null,
            "binding": {"by": "bind", "rule": 0, "line": 9, "pkey": 0x8001,
                        "qkey": 0x11111111, "unknown_qp": null},
            "passed": 12, "dropped": 3,
        })
    );
    assert_eq!(v["qps"][0]["binding"]["by"], "exempt");
    assert_eq!(v["qps"][0]["kernel"], true);
    assert_eq!(v["qps"][2]["peer"], "10.0.0.2:41234");
    assert_eq!(
        v["qps"][2]["binding"],
        json!({"by": "unknown_qp", "rule": null, "line": null, "pkey": null, "qkey": null,
               "unknown_qp": "drop"})
    );
    assert_eq!(v["qps"][3]["binding"]["by"], "qp");
    assert_eq!(v["qps"][4]["binding"]["rule"], 1);
    assert_eq!(v["qps"][4]["passed"], json!(null));
    assert_eq!(view(false).json()["qps"][1]["binding"], json!(null));
    assert_eq!(
        v["warnings"].as_array().unwrap().len(),
        1,
        "{}",
        v["warnings"]
    );
    assert_eq!(view(false).json()["warnings"], json!([]));
}

/// A hardware device's QPs are listed, and its traffic said to be out of
/// the filter's reach, with or without a policy.
#[test]
fn hardware_device_is_warned_of() {
    for with_policy in [false, true] {
        let mut v = view(with_policy);
        v.devices[0].name = "mlx5_0".into();
        v.devices[0].driver = Driver::Hardware("mlx5_core".into());
        let out = text(&v);
        assert!(
            out.starts_with("veth0: 5 QPs on mlx5_0 (mlx5_core) port 1;"),
            "{out}"
        );
        assert!(
            out.contains("\nwarning: mlx5_0 (mlx5_core) is a hardware RDMA device: the NIC handles its RDMA traffic, which never passes through XDP or TC, so pkeyfw enforces nothing on it;"),
            "{out}"
        );
        let j = v.json();
        assert_eq!(j["devices"][0]["driver"], "mlx5_core");
        assert_eq!(j["devices"][0]["in_reach"], false);
        assert!(
            j["warnings"][0]
                .as_str()
                .unwrap()
                .contains("(`pkeyfw switch`, see the README)"),
            "{}",
            j["warnings"]
        );
    }
}
