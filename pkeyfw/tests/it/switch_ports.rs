//! Every port of a switch's bridge is judged (issue 25 §2): `switch attach`
//! refuses a bridge with a port its policy does not list, naming it; a port
//! that joins later is reported (`events`, `stats`, `metrics`) and its RoCE
//! reaches no listed port, until a `switch reload` lists it, which attaches
//! it. On a bridge in a namespace the test makes, with a host namespace
//! behind each port; everything is removed at the end.

use crate::common;

use std::{
    process::Command,
    sync::mpsc,
    time::{Duration, Instant},
};

use pkeyfw_common::parse;
use pkeyfw_testkit::{
    netns::{self, ip},
    wire::Packet,
};
use serde_json::Value;

/// Bridge `br0` in a namespace of its own, and behind each port `swX` a
/// host namespace whose `eth0` is the port's peer; removed on drop, with
/// the ports' pins.
struct Bridge {
    tag: String,
    hosts: Vec<char>,
}

fn port(h: char) -> String {
    format!("sw{h}")
}

fn mac(h: char) -> [u8; 6] {
    [0x02, 0, 0, 0, 0x25, h as u8]
}

impl Bridge {
    fn create(hosts: &[char]) -> Bridge {
        let b = Bridge {
            tag: common::tag("sp"),
            hosts: hosts.to_vec(),
        };
        let s = b.switch();
        ip(&["netns", "add", &s]).unwrap();
        ip(&["-n", &s, "link", "add", "br0", "type", "bridge"]).unwrap();
        ip(&["-n", &s, "link", "set", "br0", "up"]).unwrap();
        for &h in hosts {
            let mac = mac(h).map(|b| format!("{b:02x}")).join(":");
            ip(&["netns", "add", &b.host(h)]).unwrap();
            ip(&[
                "link",
                "add",
                &port(h),
                "netns",
                &s,
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "address",
                &mac,
                "netns",
                &b.host(h),
            ])
            .unwrap();
            ip(&["-n", &b.host(h), "link", "set", "eth0", "up"]).unwrap();
            ip(&["-n", &s, "link", "set", &port(h), "up"]).unwrap();
        }
        b
    }

    fn switch(&self) -> String {
        format!("{}s", self.tag)
    }

    fn host(&self, h: char) -> String {
        format!("{}{h}", self.tag)
    }

    /// Makes host `h`'s port a port of the bridge.
    fn join(&self, h: char) {
        ip(&[
            "-n",
            &self.switch(),
            "link",
            "set",
            &port(h),
            "master",
            "br0",
        ])
        .unwrap();
    }

    /// `pkeyfw` in the bridge's namespace.
    fn pkeyfw(&self) -> Command {
        common::pkeyfw_in(&self.switch())
    }

    /// Whether an RC frame with `pkey` from `from` reaches `to`.
    fn reaches(&self, from: char, to: char, pkey: u16) -> bool {
        let mut frame = Packet::rc(pkey, 0x100).bytes();
        frame[..6].copy_from_slice(&mac(to));
        frame[6..12].copy_from_slice(&mac(from));
        let (sent, got) =
            netns::capture_during(&self.host(to), "eth0", Duration::from_millis(200), || {
                netns::send(&self.host(from), "eth0", &[frame])
            })
            .unwrap();
        sent.unwrap();
        got.iter().any(|f| {
            parse::classify(&f[..])
                .roce()
                .is_some_and(|r| r.dest_qp() == 0x100)
        })
    }

    /// `pkeyfw stats --json` of this switch's ports, by interface (it
    /// lists every attachment of the host: other tests' attach meanwhile).
    fn stats(&self) -> Vec<Value> {
        let out = common::succeed(self.pkeyfw().args(["stats", "--json"]));
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .filter(|s| s["netns"] == self.switch().as_str())
            .collect()
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        for &h in &self.hosts {
            let _ = common::pins(&self.switch(), &port(h)).remove();
        }
        for &h in &self.hosts {
            let _ = ip(&["netns", "delete", &self.host(h)]);
        }
        let _ = ip(&["netns", "delete", &self.switch()]);
    }
}

/// A switch policy with one port per host, each in partition 0x0001 as a
/// full member.
fn switch_policy(hosts: &[char]) -> String {
    let mut text = "[switch]\n".to_string();
    for &h in hosts {
        text += &format!(
            "[[switch.port]]\ninterface = \"{}\"\npkeys = [0x8001]\n",
            port(h)
        );
    }
    text
}

#[test]
fn switch_attach_refuses_a_bridge_with_a_port_its_policy_does_not_list() {
    let _root = common::pins_root();
    common::require_root();
    let br = Bridge::create(&['a', 'x']);
    br.join('a');
    br.join('x');
    let (_dir, policy) = common::policy_file(&switch_policy(&['a']));
    let out = br
        .pkeyfw()
        .args(["switch", "attach", "--policy", policy.to_str().unwrap()])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains(&format!(
            "{}: bridge br0 has ports the policy does not list: swx",
            policy.display()
        )),
        "{said}"
    );
    assert!(
        !common::pins(&br.switch(), "swa").exists(),
        "nothing is attached"
    );
}

/// The next line `rx` gets that `wanted` accepts, within 10 s.
fn next(rx: &mpsc::Receiver<String>, wanted: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = rx
            .recv_timeout(left)
            .expect("pkeyfw events printed the line");
        let v: Value = serde_json::from_str(&line).unwrap();
        if wanted(&v) {
            return v;
        }
    }
}

/// The `pkeyfw_switch_unlisted_port` series of the exposition, of namespace
/// `netns`: (bridge, port, value).
fn unlisted_series(netns: &str) -> Vec<String> {
    let text = pkeyfw::cmd::metrics::exposition().unwrap();
    text.lines()
        .filter(|l| l.starts_with("pkeyfw_switch_unlisted_port{"))
        .filter(|l| l.contains(&format!("netns=\"{netns}\"")))
        .map(str::to_string)
        .collect()
}

#[test]
fn a_port_that_joins_is_reported_and_held_until_a_reload_lists_it() {
    let _root = common::pins_root();
    common::require_root();
    let br = Bridge::create(&['a', 'b', 'e']);
    br.join('a');
    br.join('b');
    let (dir, policy) = common::policy_file(&switch_policy(&['a', 'b']));
    let policy = policy.to_str().unwrap();
    common::succeed(br.pkeyfw().args(["switch", "attach", "--policy", policy]));
    // Its own ports' events: `events` alone would read every attachment
    // of the host, other tests' among them, and keep their readers from
    // them.
    let (_events, rx) = common::lines_of(br.pkeyfw().args(["events", "swa", "swb", "--json"]));
    std::thread::sleep(Duration::from_millis(300));

    // E's port joins after the attach: reported, an event, a metric.
    br.join('e');
    let joined = next(&rx, |v| v["kind"] == "unlisted_port");
    assert_eq!(
        (&joined["interface"], &joined["bridge"], &joined["netns"]),
        (
            &Value::from("swe"),
            &Value::from("br0"),
            &Value::from(br.switch())
        ),
        "{joined}"
    );
    for s in br.stats() {
        let (name, switch) = (&s["interface"], &s["switch"]);
        assert_eq!(switch["bridge"], "br0", "{name}: {s}");
        assert_eq!(
            switch["unlisted_ports"],
            serde_json::json!(["swe"]),
            "{name}: {s}"
        );
    }
    let series = unlisted_series(&br.switch());
    assert!(
        series.len() == 1
            && series[0].contains("bridge=\"br0\"")
            && series[0].contains("port=\"swe\"")
            && series[0].ends_with(" 1"),
        "{series:?}"
    );

    // Its RoCE, as a full member of A's partition, reaches no one; A's
    // port counts and reports the drop.
    assert!(!br.reaches('e', 'a', 0x8001), "E's frame reached A");
    let refused = next(&rx, |v| v["reason"] == "unlisted_port");
    assert_eq!(
        (&refused["port"], &refused["direction"], &refused["verdict"]),
        (
            &Value::from("swa"),
            &Value::from("outbound"),
            &Value::from("drop")
        ),
        "{refused}"
    );
    let swa = br
        .stats()
        .into_iter()
        .find(|s| s["interface"] == "swa")
        .unwrap();
    assert_eq!(
        swa["switch"]["outbound"]["unlisted_port"]["drop"], 1,
        "{swa}"
    );
    // The listed ports still meet.
    assert!(br.reaches('b', 'a', 0x8001), "B's frame did not reach A");

    // Listed and reloaded: attached, no longer reported, and judged.
    let listed = dir.path().join("listed.toml");
    std::fs::write(&listed, switch_policy(&['a', 'b', 'e'])).unwrap();
    let reload = common::succeed(br.pkeyfw().args([
        "switch",
        "reload",
        "--policy",
        listed.to_str().unwrap(),
    ]));
    let said = String::from_utf8_lossy(&reload.stdout);
    assert!(said.contains("(attached: swe)"), "{said}");
    for s in br.stats() {
        assert_eq!(s["switch"]["unlisted_ports"], serde_json::json!([]), "{s}");
    }
    assert!(unlisted_series(&br.switch()).is_empty());
    assert!(
        br.reaches('e', 'a', 0x8001),
        "E's frame did not reach A once listed"
    );
    assert!(!br.reaches('e', 'a', 0x8002), "E's port judges it now");
}
