//! The switch policy file: a Linux bridge or router as the InfiniBand
//! switch (seed 001), each of its ports with a P_Key table and the checks it
//! makes. Each port becomes a [`Policy`] of its own, with a [`SwitchRole`]
//! and no QP, group or bind rule; the kernel side is `pkeyfw_common::switch`.
//!
//! ```toml
//! [switch]
//! violation = "corrupt"            # or "drop" (the default)
//! partitions = "partitions.conf"   # for ports given by `guid`
//!
//! [[switch.port]]
//! interface = "swp1"
//! pkeys = [0x8001]
//! stamp = 0x8001                   # an access port: its host cannot stamp
//!
//! [[switch.port]]
//! interface = "swp2"
//! guid = "0x0002c90300000002"      # table derived as for that host's port
//! outbound = false
//! ```

use std::{collections::BTreeMap, path::Path};

use pkeyfw_common::abi::SWITCH_PORTS;
use serde::Deserialize;
use toml::Spanned;

use super::{
    Policy, PolicyError,
    ctx::{self, Ctx, Source},
    file::{self, PortTable},
};

/// What a port of a switch does (`Config::switch`, `access_pkey`).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct SwitchRole {
    /// Check frames received on the port.
    pub inbound: bool,
    /// Check frames forwarded out of the port.
    pub outbound: bool,
    /// Pass refused frames with a broken ICRC rather than drop them.
    pub corrupt: bool,
    /// An access port's P_Key: frames entering with 0xFFFF get it, frames
    /// leaving get 0xFFFF back.
    pub access: Option<u16>,
}

/// A validated switch policy: its ports, by interface, in file order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SwitchPolicy {
    pub ports: Vec<(String, Policy)>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    switch: Spanned<RawSwitch>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSwitch {
    violation: Option<Spanned<String>>,
    mode: Option<Spanned<String>>,
    partitions: Option<Spanned<String>>,
    #[serde(default)]
    port: Vec<Spanned<RawPort>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPort {
    interface: Option<Spanned<String>>,
    pkeys: Option<Spanned<Vec<Spanned<i64>>>>,
    guid: Option<Spanned<String>>,
    inbound: Option<bool>,
    outbound: Option<bool>,
    violation: Option<Spanned<String>>,
    stamp: Option<Spanned<i64>>,
}

/// Longest interface name Linux takes (IFNAMSIZ - 1).
const IFNAME_MAX: usize = 15;

impl SwitchPolicy {
    /// Reads and validates a switch policy file.
    pub fn load(path: &Path) -> Result<SwitchPolicy, PolicyError> {
        let source = Source::read(path)?;
        if let Some(switch) = SwitchPolicy::from_source(&source)? {
            return Ok(switch);
        }
        // Not TOML at all: say where.
        source.ctx().toml::<toml::Table>()?;
        Err(PolicyError {
            file: path.display().to_string(),
            line: 0,
            column: 0,
            field: "switch".to_string(),
            message: "missing; expected a switch policy, with a [switch] table".to_string(),
        })
    }

    /// Reads and validates a policy file if it is a switch's (it has a
    /// `[switch]` table); `None` if it is a host's.
    pub fn read(path: &Path) -> Result<Option<SwitchPolicy>, PolicyError> {
        SwitchPolicy::from_source(&Source::read(path)?)
    }

    pub(super) fn from_source(source: &Source) -> Result<Option<SwitchPolicy>, PolicyError> {
        let is_switch = source
            .text
            .parse::<toml::Table>()
            .is_ok_and(|t| t.contains_key("switch"));
        if !is_switch {
            return Ok(None);
        }
        parse(&source.ctx()).map(Some)
    }

    /// The policy of one port, or an error naming the ports there are.
    pub fn port(&self, iface: &str, path: &Path) -> Result<Policy, PolicyError> {
        self.ports
            .iter()
            .find(|(name, _)| name == iface)
            .map(|(_, policy)| policy.clone())
            .ok_or_else(|| PolicyError {
                file: path.display().to_string(),
                line: 0,
                column: 0,
                field: "switch.port".to_string(),
                message: format!(
                    "no port is {iface}; expected one of {}",
                    self.ports
                        .iter()
                        .map(|(n, _)| n.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            })
    }
}

fn parse(cx: &Ctx) -> Result<SwitchPolicy, PolicyError> {
    let raw: RawFile = cx.toml()?;
    let switch = raw.switch.get_ref();
    let corrupt = violation(cx, switch.violation.as_ref(), "switch.violation")?.unwrap_or(false);
    let monitor = match &switch.mode {
        Some(m) => file::monitor_mode(cx, m, "switch.mode")?,
        None => false,
    };
    if switch.port.is_empty() {
        return Err(cx.err(
            raw.switch.span(),
            "switch.port",
            "missing; expected [[switch.port]] tables, one per interface",
        ));
    }
    let mut ports = Vec::new();
    let mut lines = BTreeMap::new();
    for (i, p) in switch.port.iter().enumerate() {
        let field = format!("switch.port[{i}]");
        let (iface, policy) = port(cx, switch, p, &field, corrupt, monitor)?;
        let (line, _) = super::error::position(cx.text, p.span().start);
        if let Some(first) = lines.insert(iface.clone(), line) {
            return Err(cx.err(
                p.get_ref()
                    .interface
                    .as_ref()
                    .map_or(p.span(), Spanned::span),
                &format!("{field}.interface"),
                format!("{iface} is already a port at line {first}; expected each interface once"),
            ));
        }
        ports.push((iface, policy));
    }
    if ports.len() > SWITCH_PORTS as usize {
        return Err(cx.err(
            raw.switch.span(),
            "switch.port",
            format!("{} ports; expected at most {SWITCH_PORTS}", ports.len()),
        ));
    }
    let listed: Vec<String> = ports.iter().map(|(iface, _)| iface.clone()).collect();
    for (_, policy) in &mut ports {
        policy.listed = listed.clone();
    }
    Ok(SwitchPolicy { ports })
}

/// `violation`: `Some(true)` for "corrupt".
fn violation(
    cx: &Ctx,
    v: Option<&Spanned<String>>,
    field: &str,
) -> Result<Option<bool>, PolicyError> {
    v.map(|v| match v.get_ref().as_str() {
        "drop" => Ok(false),
        "corrupt" => Ok(true),
        other => Err(cx.err(
            v.span(),
            field,
            format!("`{other}` is not a violation action; expected \"drop\" or \"corrupt\""),
        )),
    })
    .transpose()
}

fn port(
    cx: &Ctx,
    switch: &RawSwitch,
    p: &Spanned<RawPort>,
    field: &str,
    corrupt: bool,
    monitor: bool,
) -> Result<(String, Policy), PolicyError> {
    let raw = p.get_ref();
    let name = cx.need(
        &raw.interface,
        p.span(),
        &format!("{field}.interface"),
        "the port's interface name",
    )?;
    let iface = name.get_ref().clone();
    // Linux's own rule (dev_valid_name).
    let valid = !iface.is_empty()
        && iface.len() <= IFNAME_MAX
        && iface != "."
        && iface != ".."
        && !iface.contains(|c: char| c == '/' || c == ':' || c.is_whitespace() || c == '\0');
    if !valid {
        return Err(cx.err(
            name.span(),
            &format!("{field}.interface"),
            format!("`{iface}` is not an interface name; expected 1 to {IFNAME_MAX} characters, not . or .., no '/', ':' or space"),
        ));
    }
    let table = table(cx, switch, p, field)?;
    let access = raw
        .stamp
        .as_ref()
        .map(|s| access_key(cx, s, &table.pkeys, &format!("{field}.stamp")))
        .transpose()?;
    let role = SwitchRole {
        inbound: raw.inbound.unwrap_or(true),
        outbound: raw.outbound.unwrap_or(true),
        corrupt: violation(cx, raw.violation.as_ref(), &format!("{field}.violation"))?
            .unwrap_or(corrupt),
        access,
    };
    if role.access.is_some() && !(role.inbound && role.outbound) {
        return Err(cx.err(
            raw.stamp.as_ref().map_or(p.span(), Spanned::span),
            &format!("{field}.stamp"),
            "an access port checks both ways (it would stamp or restore unchecked frames); expected `inbound` and `outbound` left on",
        ));
    }
    if !role.inbound && !role.outbound && role.access.is_none() {
        return Err(cx.err(
            p.span(),
            field,
            "checks nothing; expected `inbound` or `outbound` true, or `stamp`",
        ));
    }
    let mut policy = Policy::with_table(table.pkeys);
    policy.names = table.names;
    policy.guid = table.guid;
    policy.warnings = table.warnings;
    policy.monitor = monitor;
    policy.switch = Some(role);
    Ok((iface, policy))
}

/// The port's table: `pkeys`, or derived for `guid` from the switch's
/// `partitions`, as a host port's would be.
fn table(
    cx: &Ctx,
    switch: &RawSwitch,
    p: &Spanned<RawPort>,
    field: &str,
) -> Result<PortTable, PolicyError> {
    let raw = p.get_ref();
    match (&raw.pkeys, &raw.guid) {
        (Some(_), Some(g)) => Err(cx.err(
            g.span(),
            &format!("{field}.guid"),
            "given together with `pkeys`; expected one of the two",
        )),
        (None, None) => Err(cx.err(
            p.span(),
            &format!("{field}.pkeys"),
            "missing; expected `pkeys` (the port's P_Key table) or `guid` (the host behind the port, with [switch].partitions)",
        )),
        (Some(list), None) => Ok(PortTable {
            pkeys: file::pkey_table(cx, list, field)?,
            names: Vec::new(),
            guid: None,
            groups: Vec::new(),
            warnings: Vec::new(),
        }),
        (None, Some(g)) => {
            let guid = file::parse_guid(g.get_ref()).ok_or_else(|| {
                cx.err(
                    g.span(),
                    &format!("{field}.guid"),
                    format!(
                        "`{}` is not a GUID; expected 64 bits such as \"0x0002c90300a1b2c3\"",
                        g.get_ref()
                    ),
                )
            })?;
            let Some(partitions) = &switch.partitions else {
                return Err(cx.err(
                    g.span(),
                    &format!("{field}.guid"),
                    "needs a partitions file: set `partitions` under [switch]",
                ));
            };
            file::partitions_table(cx, partitions, "switch.partitions", guid, false)
        }
    }
}

/// `stamp`: a key of the port's own table other than the default.
fn access_key(cx: &Ctx, v: &Spanned<i64>, pkeys: &[u16], field: &str) -> Result<u16, PolicyError> {
    let key = cx.pkey(v, field)?;
    let refuse = |why: String| Err(cx.err(v.span(), field, why));
    if key == pkeyfw_common::pkey::DEFAULT {
        return refuse(format!(
            "{key:#06x} is what the host sends already; expected the partition's key its frames get"
        ));
    }
    if !pkeys.contains(&key) {
        return refuse(format!(
            "{key:#06x} is not in the port's table {}; expected one of its keys",
            ctx::hex_list(pkeys)
        ));
    }
    Ok(key)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::{Ctx, SwitchPolicy, SwitchRole, parse};
    use crate::policy::PolicyError;

    fn switch(text: &str) -> Result<SwitchPolicy, PolicyError> {
        parse(&Ctx {
            path: Path::new("s.toml"),
            text,
            dir: Path::new(""),
        })
    }

    #[track_caller]
    fn refused(text: &str, line: usize, column: usize, field: &str, says: &str) {
        let e = switch(text).expect_err("must be refused");
        assert_eq!(
            (e.line, e.column, e.field.as_str()),
            (line, column, field),
            "{e}"
        );
        assert!(e.message.contains(says), "{e}");
    }

    const FOUR: &str = r#"[switch]
violation = "corrupt"

[[switch.port]]
interface = "swa"
pkeys = [0x8001]
stamp = 0x8001

[[switch.port]]
interface = "swb"
pkeys = [0x0001]
outbound = false
violation = "drop"
"#;

    #[test]
    fn ports_with_their_tables_and_roles() {
        let s = switch(FOUR).unwrap();
        let (a, b) = (&s.ports[0], &s.ports[1]);
        assert_eq!((a.0.as_str(), &a.1.pkeys[..]), ("swa", &[0x8001][..]));
        assert_eq!(
            a.1.switch,
            Some(SwitchRole {
                inbound: true,
                outbound: true,
                corrupt: true,
                access: Some(0x8001)
            })
        );
        assert_eq!(
            b.1.switch,
            Some(SwitchRole {
                inbound: true,
                outbound: false,
                corrupt: false,
                access: None
            })
        );
        let config = a.1.config();
        assert_eq!((config.switch, config.access_pkey), (0b1111, 0x8001));
        // Each port lists every port of the switch.
        assert_eq!(
            (&a.1.listed, &b.1.listed),
            (&vec!["swa".to_string(), "swb".to_string()], &a.1.listed)
        );
        assert!(s.port("swc", Path::new("s.toml")).is_err());
    }

    #[test]
    fn refusals_name_the_place() {
        refused("[switch]\n", 1, 1, "switch.port", "missing");
        refused(
            "[switch]\nviolation = \"reset\"\n[[switch.port]]\ninterface = \"a\"\npkeys = [1]\n",
            2,
            13,
            "switch.violation",
            "expected \"drop\" or \"corrupt\"",
        );
        refused(
            "[switch]\n[[switch.port]]\ninterface = \"swa\"\npkeys = [0x8001]\nstamp = 0x8002\n",
            5,
            9,
            "switch.port[0].stamp",
            "not in the port's table",
        );
        refused(
            "[switch]\n[[switch.port]]\ninterface = \"swa\"\npkeys = [0xffff]\nstamp = 0xffff\n",
            5,
            9,
            "switch.port[0].stamp",
            "what the host sends already",
        );
        refused(
            "[switch]\n[[switch.port]]\ninterface = \"a\"\npkeys = [1]\n[[switch.port]]\ninterface = \"a\"\npkeys = [1]\n",
            6,
            13,
            "switch.port[1].interface",
            "already a port at line 2",
        );
        refused(
            "[switch]\n[[switch.port]]\ninterface = \"a\"\nguid = \"0x1\"\n",
            4,
            8,
            "switch.port[0].guid",
            "set `partitions` under [switch]",
        );
        refused(
            "[switch]\n[[switch.port]]\ninterface = \"a\"\npkeys = [1]\ninbound = false\noutbound = false\n",
            2,
            1,
            "switch.port[0]",
            "checks nothing",
        );
        refused(
            "[switch]\n[[switch.port]]\ninterface = \"a\"\npkeys = [1]\nstamp = 1\noutbound = false\n",
            5,
            9,
            "switch.port[0].stamp",
            "an access port checks both ways",
        );
        refused(
            "[switch]\n[[switch.port]]\ninterface = \"..\"\npkeys = [1]\n",
            3,
            13,
            "switch.port[0].interface",
            "not an interface name",
        );
        refused(
            "[switch]\n[[switch.port]]\ninterface = \"a/b\"\npkeys = [1]\n",
            3,
            13,
            "switch.port[0].interface",
            "not an interface name",
        );
        refused(
            "[switch]\n[[switch.port]]\ninterface = \"a\"\npkeys = [0x8000]\n",
            4,
            10,
            "switch.port[0].pkeys[0]",
            "key portion 0",
        );
        refused(
            "[switch]\n[[switch.port]]\ninterface = \"a\"\npkeys = [1]\nmtu = 9000\n",
            5,
            1,
            "",
            "unknown field `mtu`",
        );
    }

    /// A port given by the GUID of its host gets that host's table.
    #[test]
    fn guid_table_from_partitions_conf() {
        let conf = pkeyfw_testkit::fixtures::partitions("ufm_manual_examples.conf");
        let text = format!(
            "[switch]\npartitions = \"{}\"\n[[switch.port]]\ninterface = \"a\"\nguid = \"0x123451\"\n",
            conf.display()
        );
        let s = switch(&text).unwrap();
        let host = crate::policy::partitions::derive(
            &conf,
            &std::fs::read_to_string(&conf).unwrap(),
            &crate::policy::partitions::Options {
                port_guid: 0x123451,
                is_sm: false,
            },
        )
        .unwrap();
        assert_eq!(s.ports[0].1.pkeys, host.pkeys);
        assert!(
            s.ports[0].1.pkeys.contains(&0x8080),
            "{:x?}",
            s.ports[0].1.pkeys
        );
    }
}
