//! The CNI protocol as a plugin sees it (the CNI specification 1.1.0,
//! sections 2 and 5; 0.4.0 and 1.0.0 likewise): the command and the
//! attachment from the `CNI_*` environment variables, the versions this
//! plugin speaks, `CNI_ARGS`, and errors as the specification's error
//! objects (`cniVersion`, `code`, `msg`, `details`). Pure functions over
//! strings, so that every refusal is tested without a runtime.

use std::{collections::BTreeMap, fmt};

use serde_json::{Value, json};

/// The versions of the specification this plugin speaks, oldest first:
/// 0.4.0 (CHECK, prevResult on DEL), 1.0.0, and 1.1.0 (STATUS, GC).
pub const VERSIONS: [&str; 3] = ["0.4.0", "1.0.0", "1.1.0"];

/// The newest of [`VERSIONS`]: what an error says when the configuration
/// names none this plugin speaks.
pub const NEWEST: &str = "1.1.0";

/// The error codes of the specification (section 5) and this plugin's own
/// (100 and up).
pub mod code {
    /// Incompatible CNI version.
    pub const VERSION: u32 = 1;
    /// Unsupported field in network configuration (the message names the
    /// key and its value).
    pub const UNSUPPORTED_FIELD: u32 = 2;
    /// Invalid necessary environment variables (the message names them).
    pub const ENV: u32 = 4;
    /// I/O failure.
    pub const IO: u32 = 5;
    /// Failed to decode content.
    pub const DECODE: u32 = 6;
    /// Invalid network config.
    pub const CONFIG: u32 = 7;
    /// Try again later: a transient condition.
    pub const TRY_AGAIN: u32 = 11;
    /// STATUS: the plugin cannot service ADD requests.
    pub const UNAVAILABLE: u32 = 50;
    /// The node cannot give a pod a device of its own, isolated: the RDMA
    /// subsystem's mode or the kernel's rdma_rxe.
    pub const NODE: u32 = 100;
    /// Setting the pod's device or port up (or taking it down) failed.
    pub const SETUP: u32 = 101;
    /// CHECK found the attachment not as ADD left it.
    pub const CHECK: u32 = 102;
}

/// An error as the specification's error object: `msg` short, `details`
/// what to do about it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CniError {
    pub code: u32,
    pub msg: String,
    pub details: String,
}

impl CniError {
    pub fn new(code: u32, msg: impl Into<String>, details: impl Into<String>) -> CniError {
        CniError {
            code,
            msg: msg.into(),
            details: details.into(),
        }
    }

    /// An invalid configuration, `field: what` in `msg`.
    pub fn config(field: &str, what: impl fmt::Display, details: impl Into<String>) -> CniError {
        CniError::new(code::CONFIG, format!("{field}: {what}"), details)
    }

    /// Setting the pod's device or port up (or taking it down) failed:
    /// `what`, and why.
    pub fn setup(e: anyhow::Error, what: &str) -> CniError {
        CniError::new(code::SETUP, what, format!("{e:#}"))
    }

    /// The error object, in the version the runtime speaks.
    pub fn to_json(&self, version: &str) -> Value {
        json!({
            "cniVersion": version,
            "code": self.code,
            "msg": self.msg,
            "details": self.details,
        })
    }
}

impl fmt::Display for CniError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.msg, self.details)
    }
}

impl std::error::Error for CniError {}

/// `CNI_COMMAND`.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Command {
    Add,
    Del,
    Check,
    Status,
    Gc,
    Version,
}

impl Command {
    fn parse(value: &str) -> Result<Command, CniError> {
        Ok(match value {
            "ADD" => Command::Add,
            "DEL" => Command::Del,
            "CHECK" => Command::Check,
            "STATUS" => Command::Status,
            "GC" => Command::Gc,
            "VERSION" => Command::Version,
            other => {
                return Err(CniError::new(
                    code::ENV,
                    format!("CNI_COMMAND: `{other}` is not a CNI command"),
                    "expected ADD, DEL, CHECK, STATUS, GC or VERSION",
                ));
            }
        })
    }

    /// Its name, as `CNI_COMMAND` says it.
    pub fn name(self) -> &'static str {
        match self {
            Command::Add => "ADD",
            Command::Del => "DEL",
            Command::Check => "CHECK",
            Command::Status => "STATUS",
            Command::Gc => "GC",
            Command::Version => "VERSION",
        }
    }

    /// The oldest version of the specification that has the command.
    pub fn since(self) -> &'static str {
        match self {
            Command::Status | Command::Gc => "1.1.0",
            _ => "0.4.0",
        }
    }

    /// Whether it acts on one attachment (container, interface).
    fn attachment(self) -> bool {
        matches!(self, Command::Add | Command::Del | Command::Check)
    }
}

/// One invocation, from the environment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Invocation {
    pub command: Command,
    /// `CNI_CONTAINERID`, `CNI_IFNAME`: the attachment (ADD, DEL, CHECK).
    pub container: String,
    pub ifname: String,
    /// `CNI_NETNS`: required by ADD and CHECK; DEL may come without.
    pub netns: Option<String>,
    /// `CNI_ARGS`, by key.
    pub args: BTreeMap<String, String>,
}

/// The keys of `CNI_ARGS` this plugin reads; with `IgnoreUnknown` any
/// other is ignored, as libcni's own plugins do.
pub const ARGS: [&str; 5] = [
    "PKEY",
    "K8S_POD_NAMESPACE",
    "K8S_POD_NAME",
    "K8S_POD_INFRA_CONTAINER_ID",
    "K8S_POD_UID",
];

impl Invocation {
    /// Reads the invocation through `var` (`std::env::var`'s view of the
    /// `CNI_*` variables).
    pub fn from_env(var: impl Fn(&str) -> Option<String>) -> Result<Invocation, CniError> {
        let command = var("CNI_COMMAND").ok_or_else(|| {
            CniError::new(
                code::ENV,
                "CNI_COMMAND: missing",
                "a CNI runtime sets CNI_COMMAND (ADD, DEL, CHECK, STATUS, GC or VERSION)",
            )
        })?;
        let command = Command::parse(&command)?;
        let mut inv = Invocation {
            command,
            container: String::new(),
            ifname: String::new(),
            netns: var("CNI_NETNS").filter(|n| !n.is_empty()),
            args: BTreeMap::new(),
        };
        if !command.attachment() {
            return Ok(inv);
        }
        let need = |name: &str| {
            var(name).filter(|v| !v.is_empty()).ok_or_else(|| {
                CniError::new(
                    code::ENV,
                    format!("{name}: missing"),
                    format!("{} needs {name}", command.name()),
                )
            })
        };
        inv.container = need("CNI_CONTAINERID")?;
        if !container_id(&inv.container) {
            return Err(CniError::new(
                code::ENV,
                format!("CNI_CONTAINERID: `{}` is not a container ID", inv.container),
                "expected an alphanumeric character, then alphanumerics, '_', '.' or '-'",
            ));
        }
        inv.ifname = need("CNI_IFNAME")?;
        if !interface_name(&inv.ifname) {
            return Err(CniError::new(
                code::ENV,
                format!("CNI_IFNAME: `{}` is not an interface name", inv.ifname),
                "expected 1 to 15 characters, not . or .., no '/', ':' or space",
            ));
        }
        if command != Command::Del && inv.netns.is_none() {
            need("CNI_NETNS")?;
        }
        // DEL reads nothing from CNI_ARGS that could stop it.
        inv.args = match parse_args(var("CNI_ARGS").as_deref().unwrap_or("")) {
            Err(_) if command == Command::Del => BTreeMap::new(),
            parsed => parsed?,
        };
        Ok(inv)
    }

    /// The pod the runtime says the attachment is for (Kubernetes'
    /// `K8S_POD_NAMESPACE/K8S_POD_NAME`, which podman and CRI runtimes
    /// pass), if it says.
    pub fn pod(&self) -> Option<String> {
        let name = self.args.get("K8S_POD_NAME")?;
        Some(match self.args.get("K8S_POD_NAMESPACE") {
            Some(ns) => format!("{ns}/{name}"),
            None => name.clone(),
        })
    }
}

/// `CNI_ARGS`: `KEY=VALUE` pairs separated by semicolons. A key this
/// plugin does not read is refused unless `IgnoreUnknown` is 1 or true.
pub fn parse_args(text: &str) -> Result<BTreeMap<String, String>, CniError> {
    let mut args = BTreeMap::new();
    for pair in text.split(';').filter(|p| !p.is_empty()) {
        let Some((key, value)) = pair.split_once('=') else {
            return Err(CniError::new(
                code::ENV,
                format!("CNI_ARGS: `{pair}` is not KEY=VALUE"),
                "expected KEY=VALUE pairs separated by semicolons, as FOO=BAR;ABC=123",
            ));
        };
        args.insert(key.to_string(), value.to_string());
    }
    let ignore = args
        .remove("IgnoreUnknown")
        .is_some_and(|v| matches!(v.to_ascii_lowercase().as_str(), "1" | "true"));
    if !ignore && let Some(key) = args.keys().find(|k| !ARGS.contains(&k.as_str())) {
        return Err(CniError::new(
            code::ENV,
            format!("CNI_ARGS: unknown key `{key}`"),
            format!(
                "pkeyfw reads {}; set IgnoreUnknown=1 to pass others",
                ARGS.join(", ")
            ),
        ));
    }
    Ok(args)
}

/// The specification's rule for container IDs.
fn container_id(id: &str) -> bool {
    let mut chars = id.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

/// Linux's rule for interface names (dev_valid_name).
pub fn interface_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 15
        && name != "."
        && name != ".."
        && !name.contains(|c: char| c == '/' || c == ':' || c.is_whitespace() || c == '\0')
}

/// The version of the configuration (`cniVersion`), if this plugin speaks
/// it and the command exists in it.
pub fn negotiate(version: Option<&Value>, command: Command) -> Result<&'static str, CniError> {
    let Some(given) = version else {
        return Err(CniError::new(
            code::VERSION,
            "cniVersion: missing",
            format!("expected one of {}", VERSIONS.join(", ")),
        ));
    };
    let Some(ours) = given
        .as_str()
        .and_then(|v| VERSIONS.into_iter().find(|&s| s == v))
    else {
        return Err(CniError::new(
            code::VERSION,
            format!("cniVersion: {given} is not supported"),
            format!("pkeyfw speaks CNI {}", VERSIONS.join(", ")),
        ));
    };
    if semver(ours) < semver(command.since()) {
        return Err(CniError::new(
            code::VERSION,
            format!(
                "cniVersion: {} needs CNI {}",
                command.name(),
                command.since()
            ),
            format!("the configuration says {ours}"),
        ));
    }
    Ok(ours)
}

/// VERSION's answer: the version asked in (the newest if it named none)
/// and every version this plugin speaks.
pub fn version_reply(asked: Option<&str>) -> Value {
    json!({
        "cniVersion": asked.unwrap_or(NEWEST),
        "supportedVersions": VERSIONS,
    })
}

fn semver(v: &str) -> (u32, u32, u32) {
    let mut parts = v.split('.').map(|p| p.parse().unwrap_or(0));
    let mut next = || parts.next().unwrap_or(0);
    (next(), next(), next())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: BTreeMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| map.get(k).cloned()
    }

    const ADD: [(&str, &str); 4] = [
        ("CNI_COMMAND", "ADD"),
        ("CNI_CONTAINERID", "f00d-1.x_y"),
        ("CNI_NETNS", "/run/netns/a"),
        ("CNI_IFNAME", "eth0"),
    ];

    #[test]
    fn an_add_with_its_pod() {
        let mut vars = ADD.to_vec();
        vars.push((
            "CNI_ARGS",
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=a;FOO=1",
        ));
        let inv = Invocation::from_env(env(&vars)).unwrap();
        assert_eq!(inv.command, Command::Add);
        assert_eq!(
            (inv.container.as_str(), inv.ifname.as_str()),
            ("f00d-1.x_y", "eth0")
        );
        assert_eq!(inv.netns.as_deref(), Some("/run/netns/a"));
        assert_eq!(inv.pod().as_deref(), Some("ns/a"));
    }

    #[track_caller]
    fn refused(vars: &[(&str, &str)], code: u32, msg: &str) {
        let e = Invocation::from_env(env(vars)).expect_err("must be refused");
        assert_eq!(e.code, code, "{e}");
        assert!(e.msg.starts_with(msg), "{e}");
    }

    /// Each refusal names the variable at fault, with code 4.
    #[test]
    fn refusals_name_the_variable() {
        refused(&[], code::ENV, "CNI_COMMAND: missing");
        refused(
            &[("CNI_COMMAND", "UPDATE")],
            code::ENV,
            "CNI_COMMAND: `UPDATE`",
        );
        refused(&ADD[..1], code::ENV, "CNI_CONTAINERID: missing");
        let mut bad = ADD.to_vec();
        bad[1].1 = "-x";
        refused(&bad, code::ENV, "CNI_CONTAINERID: `-x`");
        bad = ADD.to_vec();
        bad[3].1 = "eth0/1";
        refused(&bad, code::ENV, "CNI_IFNAME: `eth0/1`");
        refused(&[ADD[0], ADD[1], ADD[3]], code::ENV, "CNI_NETNS: missing");
        bad = ADD.to_vec();
        bad.push(("CNI_ARGS", "PKEY=0x1;PKEYY=2"));
        refused(&bad, code::ENV, "CNI_ARGS: unknown key `PKEYY`");
        bad.pop();
        bad.push(("CNI_ARGS", "PKEY"));
        refused(&bad, code::ENV, "CNI_ARGS: `PKEY` is not KEY=VALUE");
    }

    /// DEL may come without a namespace (it is gone); VERSION needs no
    /// attachment at all.
    #[test]
    fn del_without_netns_and_version_alone() {
        let del = Invocation::from_env(env(&[
            ("CNI_COMMAND", "DEL"),
            ("CNI_CONTAINERID", "c1"),
            ("CNI_IFNAME", "net1"),
        ]))
        .unwrap();
        assert_eq!((del.command, del.netns), (Command::Del, None));
        let del = Invocation::from_env(env(&[
            ("CNI_COMMAND", "DEL"),
            ("CNI_CONTAINERID", "c1"),
            ("CNI_IFNAME", "net1"),
            ("CNI_ARGS", "PKEYY=1"),
        ]))
        .unwrap();
        assert!(del.args.is_empty());
        let v = Invocation::from_env(env(&[("CNI_COMMAND", "VERSION")])).unwrap();
        assert_eq!(v.command, Command::Version);
    }

    #[test]
    fn version_negotiation() {
        let v = |s: &str| Value::String(s.to_string());
        assert_eq!(negotiate(Some(&v("1.0.0")), Command::Add), Ok("1.0.0"));
        assert_eq!(negotiate(Some(&v("0.4.0")), Command::Check), Ok("0.4.0"));
        assert_eq!(negotiate(Some(&v("1.1.0")), Command::Status), Ok("1.1.0"));
        for (given, command, msg) in [
            (
                Some(v("0.3.1")),
                Command::Add,
                "cniVersion: \"0.3.1\" is not supported",
            ),
            (
                Some(v("2.0.0")),
                Command::Add,
                "cniVersion: \"2.0.0\" is not supported",
            ),
            (
                Some(json!(1)),
                Command::Add,
                "cniVersion: 1 is not supported",
            ),
            (None, Command::Del, "cniVersion: missing"),
            (
                Some(v("1.0.0")),
                Command::Status,
                "cniVersion: STATUS needs CNI 1.1.0",
            ),
            (
                Some(v("0.4.0")),
                Command::Gc,
                "cniVersion: GC needs CNI 1.1.0",
            ),
        ] {
            let e = negotiate(given.as_ref(), command).unwrap_err();
            assert_eq!((e.code, e.msg.as_str()), (code::VERSION, msg));
        }
        assert_eq!(
            version_reply(Some("1.0.0")),
            json!({"cniVersion": "1.0.0", "supportedVersions": ["0.4.0", "1.0.0", "1.1.0"]})
        );
        assert_eq!(version_reply(None)["cniVersion"], "1.1.0");
    }

    #[test]
    fn error_objects() {
        let e = CniError::config("pkey", "missing", "expected a string such as \"0x8001\"");
        assert_eq!(
            e.to_json("1.0.0"),
            json!({
                "cniVersion": "1.0.0",
                "code": 7,
                "msg": "pkey: missing",
                "details": "expected a string such as \"0x8001\"",
            })
        );
    }
}
