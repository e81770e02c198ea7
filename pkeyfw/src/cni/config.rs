//! The network configuration the runtime hands the plugin on stdin: the
//! partition (`pkey`, spelled as ib-sriov-cni spells it: a string such as
//! "0x8001"), the optional `qkey` (which every UD QP of the pods is held
//! to) and the bridge's `trunk` port, what the
//! runtime adds (`cniVersion`, `name`, `prevResult`, `runtimeConfig`,
//! `args`), and a pod's own key where the runtime passes one. Every refusal
//! names the field at fault.
//!
//! A pod may ask for its network's key or the limited membership of the
//! same partition (`runtimeConfig.pkey`, `args.cni.pkey` as Multus passes a
//! network selection's `cni-args`, or `CNI_ARGS` `PKEY`), never another
//! partition or more membership: whoever writes a pod's annotations must
//! not be able to choose its partition.

use serde_json::{Map, Value};

use super::protocol::{self, CniError, Command, Invocation, code};

/// A validated network configuration, for one invocation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetConf {
    /// The version the runtime speaks (`cniVersion`), one of ours.
    pub version: &'static str,
    /// The network's name.
    pub name: String,
    /// The network's key (`pkey`).
    pub network_pkey: u16,
    /// The pod's key: the network's, or the limited one the pod asked for.
    pub pkey: u16,
    /// `qkey`, if given.
    pub qkey: Option<u32>,
    /// `trunk`: the bridge's uplink, a port that carries every partition's
    /// stamped keys between nodes.
    pub trunk: Option<String>,
    /// `prevResult`: what the plugins before this one returned.
    pub prev_result: Option<Value>,
    /// GC's `cni.dev/valid-attachments`: (container ID, interface name).
    pub valid_attachments: Vec<(String, String)>,
}

/// The fields a configuration may have: the specification's, and ours.
const FIELDS: [&str; 12] = [
    "cniVersion",
    "cniVersions",
    "name",
    "type",
    "capabilities",
    "runtimeConfig",
    "args",
    "prevResult",
    "dns",
    "pkey",
    "qkey",
    "trunk",
];

/// The example a refused `pkey` is shown.
const PKEY_EXAMPLE: &str = "expected a string such as \"0x8001\" (full member of partition 0x0001) or \"0x0001\" (limited member), as ib-sriov-cni's pkey";

impl NetConf {
    /// Reads the configuration `stdin` holds for `inv`. The version comes
    /// first: a refusal must be said in one the runtime speaks.
    pub fn parse(stdin: &[u8], inv: &Invocation) -> Result<NetConf, (CniError, &'static str)> {
        let value: Value = serde_json::from_slice(stdin).map_err(|e| {
            (
                CniError::new(
                    code::DECODE,
                    "the network configuration is not JSON",
                    format!("stdin: {e}"),
                ),
                protocol::NEWEST,
            )
        })?;
        let Value::Object(map) = value else {
            return Err((
                CniError::new(
                    code::DECODE,
                    "the network configuration is not a JSON object",
                    "expected the plugin's configuration object on stdin",
                ),
                protocol::NEWEST,
            ));
        };
        let version = protocol::negotiate(map.get("cniVersion"), inv.command).map_err(|e| {
            let said = map
                .get("cniVersion")
                .and_then(Value::as_str)
                .and_then(|v| protocol::VERSIONS.into_iter().find(|&s| s == v));
            (e, said.unwrap_or(protocol::NEWEST))
        })?;
        fields(&map, inv, version).map_err(|e| (e, version))
    }
}

fn fields(
    map: &Map<String, Value>,
    inv: &Invocation,
    version: &'static str,
) -> Result<NetConf, CniError> {
    let mut conf = NetConf {
        version,
        name: String::new(),
        network_pkey: 0,
        pkey: 0,
        qkey: None,
        trunk: None,
        prev_result: None,
        valid_attachments: Vec::new(),
    };
    // DEL removes what ADD made of the attachment, whatever the
    // configuration says now: nothing in it may stop a DEL.
    if inv.command == Command::Del {
        return Ok(conf);
    }
    if let Some((key, value)) = map
        .iter()
        .find(|(k, _)| !FIELDS.contains(&k.as_str()) && !k.starts_with("cni.dev/"))
    {
        return Err(CniError::new(
            code::UNSUPPORTED_FIELD,
            format!("{key}: unsupported field (its value: {value})"),
            format!(
                "pkeyfw takes pkey, qkey and trunk besides the CNI fields; fields: {}",
                FIELDS.join(", ")
            ),
        ));
    }
    let name = string(map, "name")?.ok_or_else(|| {
        CniError::config("name", "missing", "the runtime sets the network's name")
    })?;
    // The specification's rule for network names.
    let mut chars = name.chars();
    let valid = chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
    if !valid {
        return Err(CniError::config(
            "name",
            format!("`{name}` is not a network name"),
            "expected an alphanumeric character, then alphanumerics, '_', '.' or '-'",
        ));
    }
    conf.name = name.to_string();
    string(map, "type")?
        .ok_or_else(|| CniError::config("type", "missing", "expected \"pkeyfw\""))?;
    let pkey = string(map, "pkey")?.ok_or_else(|| {
        CniError::config(
            "pkey",
            "missing",
            format!("the partition of the network's pods: {PKEY_EXAMPLE}"),
        )
    })?;
    conf.network_pkey = parse_pkey(pkey, "pkey")?;
    conf.pkey = pod_pkey(map, inv, conf.network_pkey)?;
    conf.qkey = string(map, "qkey")?
        .map(|q| parse_qkey(q, "qkey"))
        .transpose()?;
    conf.trunk = string(map, "trunk")?
        .map(|t| {
            if protocol::interface_name(t) {
                Ok(t.to_string())
            } else {
                Err(CniError::config(
                    "trunk",
                    format!("`{t}` is not an interface name"),
                    "expected the bridge's uplink port, as `ip link` names it",
                ))
            }
        })
        .transpose()?;
    conf.prev_result = match map.get("prevResult") {
        None | Some(Value::Null) => None,
        Some(v @ Value::Object(_)) => Some(v.clone()),
        Some(other) => {
            return Err(CniError::config(
                "prevResult",
                format!("{other} is not a result"),
                "expected the previous plugin's result object",
            ));
        }
    };
    if inv.command == Command::Gc {
        conf.valid_attachments = valid_attachments(map)?;
    }
    Ok(conf)
}

/// The string at `key`, if there; anything but a string is refused.
fn string<'a>(map: &'a Map<String, Value>, key: &str) -> Result<Option<&'a str>, CniError> {
    match map.get(key) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(CniError::config(
            key,
            format!("{other} is not a string"),
            match key {
                "pkey" => PKEY_EXAMPLE.to_string(),
                "qkey" => "expected a string such as \"0x11111111\"".to_string(),
                _ => "expected a string".to_string(),
            },
        )),
    }
}

/// A P_Key as ib-sriov-cni writes it: "0x" and one to four hex digits.
/// Partition 0 is no partition (IBA 10.9.1.2); the default partition's
/// full key gives a pod no partition of its own.
pub fn parse_pkey(text: &str, field: &str) -> Result<u16, CniError> {
    let key = hex(text, 4)
        .ok_or_else(|| CniError::config(field, format!("`{text}` is not a P_Key"), PKEY_EXAMPLE))?
        as u16;
    if key & 0x7fff == 0 {
        return Err(CniError::config(
            field,
            format!("{key:#06x} names partition 0, which is no partition"),
            PKEY_EXAMPLE,
        ));
    }
    if key == pkeyfw_common::pkey::DEFAULT {
        return Err(CniError::config(
            field,
            "0xffff is the default partition's full key, which every unmodified soft-RoCE host sends",
            "a pod there is isolated from nothing; give the network a partition of its own, such as \"0x8001\"",
        ));
    }
    Ok(key)
}

/// A Q_Key: "0x" and one to eight hex digits.
fn parse_qkey(text: &str, field: &str) -> Result<u32, CniError> {
    hex(text, 8).ok_or_else(|| {
        CniError::config(
            field,
            format!("`{text}` is not a Q_Key"),
            "expected a string such as \"0x11111111\": 0x and 1 to 8 hex digits",
        )
    })
}

/// "0x" (or "0X") and 1 to `digits` hex digits.
fn hex(text: &str, digits: usize) -> Option<u32> {
    let body = text
        .strip_prefix("0x")
        .or_else(|| text.strip_prefix("0X"))?;
    if body.is_empty() || body.len() > digits || !body.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u32::from_str_radix(body, 16).ok()
}

/// The pod's key: the network's, unless the runtime passes the pod's own
/// (`runtimeConfig.pkey` first, then `args.cni.pkey`, then `CNI_ARGS`
/// `PKEY`, which the conventions let `args` override), which may only be
/// the network's or its limited membership.
fn pod_pkey(map: &Map<String, Value>, inv: &Invocation, network: u16) -> Result<u16, CniError> {
    let nested = |outer: &str, path: &[&str]| -> Result<Option<(String, String)>, CniError> {
        let mut at = map.get(outer);
        for key in path {
            at = at.and_then(|v| v.get(key));
        }
        let field = [outer]
            .iter()
            .chain(path)
            .copied()
            .collect::<Vec<_>>()
            .join(".");
        match at {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some((field, s.clone()))),
            Some(other) => Err(CniError::config(
                &field,
                format!("{other} is not a string"),
                PKEY_EXAMPLE,
            )),
        }
    };
    let asked = match nested("runtimeConfig", &["pkey"])? {
        Some(a) => Some(a),
        None => match nested("args", &["cni", "pkey"])? {
            Some(a) => Some(a),
            None => inv
                .args
                .get("PKEY")
                .map(|p| ("CNI_ARGS PKEY".to_string(), p.clone())),
        },
    };
    let Some((field, text)) = asked else {
        return Ok(network);
    };
    let key = parse_pkey(&text, &field)?;
    let limited = network & 0x7fff;
    if key != network && key != limited {
        return Err(CniError::config(
            &field,
            format!("{key:#06x} is not this network's key"),
            format!(
                "the network is partition {limited:#06x} ({network:#06x}); a pod may take {network:#06x} or, a limited member, {limited:#06x}, never another partition or more membership"
            ),
        ));
    }
    Ok(key)
}

/// GC's list of the attachments still in use.
fn valid_attachments(map: &Map<String, Value>) -> Result<Vec<(String, String)>, CniError> {
    const FIELD: &str = "cni.dev/valid-attachments";
    let bad = |what: String| {
        CniError::config(
            FIELD,
            what,
            "expected a list of {\"containerID\": …, \"ifname\": …} objects",
        )
    };
    let Some(list) = map.get(FIELD) else {
        return Err(bad("missing".to_string()));
    };
    let Value::Array(list) = list else {
        return Err(bad(format!("{list} is not a list")));
    };
    list.iter()
        .map(|a| {
            let id = a.get("containerID").and_then(Value::as_str);
            let ifname = a.get("ifname").and_then(Value::as_str);
            match (id, ifname) {
                (Some(id), Some(ifname)) => Ok((id.to_string(), ifname.to_string())),
                _ => Err(bad(format!("{a} is not an attachment"))),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde_json::json;

    use super::*;

    fn add() -> Invocation {
        Invocation {
            command: Command::Add,
            container: "c1".to_string(),
            ifname: "eth0".to_string(),
            netns: Some("/run/netns/a".to_string()),
            args: BTreeMap::new(),
        }
    }

    fn conf(v: Value) -> Result<NetConf, (CniError, &'static str)> {
        NetConf::parse(v.to_string().as_bytes(), &add())
    }

    fn base() -> Value {
        json!({"cniVersion": "1.0.0", "name": "roce-a", "type": "pkeyfw", "pkey": "0x8001"})
    }

    fn with(key: &str, value: Value) -> Value {
        let mut v = base();
        v[key] = value;
        v
    }

    #[track_caller]
    fn refused(v: Value, code: u32, msg: &str) {
        let (e, _) = conf(v).expect_err("must be refused");
        assert_eq!(e.code, code, "{e}");
        assert!(e.msg.starts_with(msg), "{e}");
    }

    #[test]
    fn the_issue_example() {
        let c = conf(with("qkey", json!("0x11111111"))).unwrap();
        assert_eq!(
            (c.version, c.name.as_str(), c.network_pkey, c.pkey, c.qkey),
            ("1.0.0", "roce-a", 0x8001, 0x8001, Some(0x1111_1111))
        );
        let c = conf(json!({
            "cniVersion": "0.4.0", "name": "n", "type": "pkeyfw", "pkey": "0X1",
            "trunk": "eth1", "prevResult": {"interfaces": []},
            "runtimeConfig": {"portMappings": []}, "args": {"cni": {"labels": []}},
            "cni.dev/something": 1,
        }))
        .unwrap();
        assert_eq!((c.pkey, c.trunk.as_deref()), (0x0001, Some("eth1")));
        assert!(c.prev_result.is_some());
    }

    /// Each refusal names the field at fault, with the code the
    /// specification gives it.
    #[test]
    fn refusals_name_the_field() {
        let (e, said) = NetConf::parse(b"{", &add()).unwrap_err();
        assert_eq!((e.code, said), (code::DECODE, "1.1.0"));
        refused(
            json!([]),
            code::DECODE,
            "the network configuration is not a JSON object",
        );
        refused(
            with("cniVersion", json!("0.3.1")),
            code::VERSION,
            "cniVersion: \"0.3.1\"",
        );
        refused(
            with("pKey", json!("0x8001")),
            code::UNSUPPORTED_FIELD,
            "pKey: unsupported field (its value: \"0x8001\")",
        );
        refused(
            with("ipam", json!({})),
            code::UNSUPPORTED_FIELD,
            "ipam: unsupported field",
        );
        let mut v = base();
        v.as_object_mut().unwrap().remove("pkey");
        refused(v, code::CONFIG, "pkey: missing");
        refused(
            with("pkey", json!(32769)),
            code::CONFIG,
            "pkey: 32769 is not a string",
        );
        for bad in ["8001", "0x", "0x10000", "0xg001", " 0x8001", "0x8001 "] {
            refused(
                with("pkey", json!(bad)),
                code::CONFIG,
                &format!("pkey: `{bad}` is not a P_Key"),
            );
        }
        refused(
            with("pkey", json!("0x8000")),
            code::CONFIG,
            "pkey: 0x8000 names partition 0",
        );
        refused(
            with("pkey", json!("0x0")),
            code::CONFIG,
            "pkey: 0x0000 names partition 0",
        );
        refused(
            with("pkey", json!("0xffff")),
            code::CONFIG,
            "pkey: 0xffff is the default partition's full key",
        );
        refused(
            with("qkey", json!("0x123456789")),
            code::CONFIG,
            "qkey: `0x123456789` is not a Q_Key",
        );
        refused(
            with("qkey", json!(7)),
            code::CONFIG,
            "qkey: 7 is not a string",
        );
        refused(
            with("trunk", json!("a b")),
            code::CONFIG,
            "trunk: `a b` is not an interface name",
        );
        refused(
            with("prevResult", json!("x")),
            code::CONFIG,
            "prevResult: \"x\" is not a result",
        );
        refused(
            with("name", json!(null)),
            code::CONFIG,
            "name: null is not a string",
        );
        refused(
            with("name", json!("a b")),
            code::CONFIG,
            "name: `a b` is not a network name",
        );
        let mut v = base();
        v.as_object_mut().unwrap().remove("type");
        refused(v, code::CONFIG, "type: missing");
    }

    /// A refusal is said in the version the configuration names when this
    /// plugin speaks it, else in the newest.
    #[test]
    fn refusals_in_the_runtimes_version() {
        let (_, said) = conf(with("pkey", json!("1"))).unwrap_err();
        assert_eq!(said, "1.0.0");
        let (_, said) = conf(with("cniVersion", json!("0.2.0"))).unwrap_err();
        assert_eq!(said, "1.1.0");
    }

    /// A pod narrows its network's key, never widens or leaves it; the
    /// runtime's config wins over args, args over CNI_ARGS.
    #[test]
    fn a_pods_own_key() {
        let key = |v: Value, cni_args: &[(&str, &str)]| {
            let mut inv = add();
            inv.args = cni_args
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            NetConf::parse(v.to_string().as_bytes(), &inv).map(|c| c.pkey)
        };
        assert_eq!(key(base(), &[("PKEY", "0x0001")]), Ok(0x0001));
        assert_eq!(key(base(), &[("PKEY", "0x8001")]), Ok(0x8001));
        assert_eq!(
            key(
                with("args", json!({"cni": {"pkey": "0x1"}})),
                &[("PKEY", "0x8002")]
            ),
            Ok(0x0001)
        );
        assert_eq!(
            key(
                with("runtimeConfig", json!({"pkey": "0x8001"})),
                &[("PKEY", "0x0001")]
            ),
            Ok(0x8001)
        );
        for (v, args, msg) in [
            (
                base(),
                vec![("PKEY", "0x8002")],
                "CNI_ARGS PKEY: 0x8002 is not this network's key",
            ),
            (
                with("pkey", json!("0x0001")),
                vec![("PKEY", "0x8001")],
                "CNI_ARGS PKEY: 0x8001 is not this network's key",
            ),
            (
                with("args", json!({"cni": {"pkey": "0x0002"}})),
                vec![],
                "args.cni.pkey: 0x0002 is not this network's key",
            ),
            (
                with("runtimeConfig", json!({"pkey": 1})),
                vec![],
                "runtimeConfig.pkey: 1 is not a string",
            ),
            (
                with("runtimeConfig", json!({"pkey": "0xffff"})),
                vec![],
                "runtimeConfig.pkey: 0xffff is the default",
            ),
        ] {
            let (e, _) = key(v, &args).unwrap_err();
            assert_eq!(e.code, code::CONFIG, "{e}");
            assert!(e.msg.starts_with(msg), "{e}");
        }
    }

    /// Nothing in the configuration but its version stops a DEL: it
    /// removes what ADD made of the attachment.
    #[test]
    fn del_takes_any_configuration() {
        let mut inv = add();
        inv.command = Command::Del;
        let parse = |v: Value| NetConf::parse(v.to_string().as_bytes(), &inv);
        assert!(parse(json!({"cniVersion": "1.0.0", "pkey": "0x8000", "pKey": 1})).is_ok());
        let (e, _) = parse(json!({"cniVersion": "0.1.0"})).unwrap_err();
        assert_eq!(e.code, code::VERSION);
    }

    #[test]
    fn gc_attachments() {
        let mut inv = add();
        inv.command = Command::Gc;
        let mut v = with("cniVersion", json!("1.1.0"));
        v["cni.dev/valid-attachments"] = json!([{"containerID": "c1", "ifname": "eth0"}]);
        let c = NetConf::parse(v.to_string().as_bytes(), &inv).unwrap();
        assert_eq!(
            c.valid_attachments,
            [("c1".to_string(), "eth0".to_string())]
        );
        v["cni.dev/valid-attachments"] = json!([{"containerID": "c1"}]);
        let (e, _) = NetConf::parse(v.to_string().as_bytes(), &inv).unwrap_err();
        assert!(e.msg.starts_with("cni.dev/valid-attachments: {"), "{e}");
    }
}
