//! Partition policy: this port's P_Key table, the QPs and multicast groups it
//! binds, and how to treat what it does not know. Parsed and fully validated
//! before anything touches the kernel.

mod bind;
mod ctx;
mod error;
mod file;
mod own_device;
pub mod partitions;
mod switch;

use std::{collections::BTreeMap, net::IpAddr, path::Path};

use pkeyfw_common::{
    Tables,
    abi::{
        BindSpec, Config, GroupEntry, OnForeignJoin, QpEntry, QpType, UnknownQp, matcher, qp_flags,
        switch_flags, v4_mapped,
    },
    pkey,
    tenant::Rules,
};

pub use bind::{BindRule, Binding};
pub use error::PolicyError;
pub use file::parse_guid;
pub use own_device::{OwnDevice, Prefix};
pub use switch::{SwitchPolicy, SwitchRole};

/// A validated policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    /// The port's P_Key table; index 0 is the default P_Key.
    pub pkeys: Vec<u16>,
    /// Partition names per table entry, when derived from partitions.conf.
    pub names: Vec<String>,
    /// The port GUID the table was derived for, when known.
    pub guid: Option<u64>,
    /// What the partitions file did that deserves a look.
    pub warnings: Vec<String>,
    /// Count drops but pass them.
    pub monitor: bool,
    pub unknown_qp: UnknownQp,
    /// Receiving QPs by QPN.
    pub qps: BTreeMap<u32, QpRule>,
    /// Multicast groups by destination address (IPv4 as v4-mapped IPv6).
    pub groups: BTreeMap<[u8; 16], Group>,
    /// Rules that bind discovered QPs, in file order; see
    /// [`Policy::with_discovered`].
    pub binds: Vec<BindRule>,
    /// Rewrite outgoing frames' P_Key to the sending QP's binding, and
    /// incoming passed frames' back to the default (`[enforcement] stamp`).
    pub stamp: bool,
    /// What the probes do about a local QP joining another partition's
    /// multicast group (`[enforcement] foreign_join`).
    pub foreign_join: OnForeignJoin,
    /// QPs the QP-creation probe may bind at once, when lower than what
    /// the interface's RDMA devices hold (`[enforcement] probe_capacity`;
    /// read at attach, when the tables are made).
    pub probe_capacity: Option<u32>,
    /// This port is a switch's (a switch policy's port), not a host's: only
    /// the table and the role apply.
    pub switch: Option<SwitchRole>,
    /// A switch port's: the interfaces of every port of its switch (its
    /// own included), the only ones RoCE it forwards out may have entered
    /// through.
    pub listed: Vec<String>,
    /// The port of a tenant's own device: the rule (of `binds`) whose
    /// tenant it was made for, the only one that binds there (see
    /// [`OwnDevice`]).
    pub owner: Option<usize>,
}

/// A QP bound to a partition.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct QpRule {
    pub qp_type: QpType,
    pub pkey: u16,
    /// Required Q_Key; UD only. None for a UD QP bound with its own Q_Key
    /// (`qp_flags::OWN_QKEY`) that has not set one.
    pub qkey: Option<u32>,
    /// `qp_flags::RULE` and `qp_flags::OWN_QKEY`, as the entry carries them.
    pub flags: u8,
}

/// A multicast group.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Group {
    pub addr: IpAddr,
    pub pkey: u16,
    pub qkey: u32,
}

impl Policy {
    /// Reads and validates a policy file.
    pub fn load(path: &Path) -> Result<Policy, PolicyError> {
        Policy::load_for(path, None)
    }

    /// Reads and validates a policy file for a port whose GUID, unless the
    /// file names one, is `port_guid` (needed with `partitions`).
    pub fn load_for(path: &Path, port_guid: Option<u64>) -> Result<Policy, PolicyError> {
        file::parse(&ctx::Source::read(path)?.ctx(), port_guid)
    }

    /// The policy of port `iface`: a host policy file, or the port's part of
    /// a switch policy file (which must list it).
    pub fn load_port(
        path: &Path,
        iface: &str,
        port_guid: Option<u64>,
    ) -> Result<Policy, PolicyError> {
        let source = ctx::Source::read(path)?;
        match SwitchPolicy::from_source(&source)? {
            Some(switch) => switch.port(iface, path),
            None => {
                let policy = file::parse(&source.ctx(), port_guid)?;
                Ok(match policy.tenant_of(iface) {
                    Some(rule) => policy.for_tenant(rule),
                    None => policy,
                })
            }
        }
    }

    /// The devices pkeyfw makes for the tenants of this (host) policy's
    /// rules, each with its rule's index.
    pub fn own_devices(&self) -> impl Iterator<Item = (usize, &OwnDevice)> {
        self.binds
            .iter()
            .enumerate()
            .filter_map(|(i, b)| b.own.as_ref().map(|o| (i, o)))
    }

    /// Whether it gives its tenants devices of their own: then its
    /// interface is their uplink, and carries no filter of its own.
    pub fn gives_devices(&self) -> bool {
        self.owner.is_none() && self.own_devices().next().is_some()
    }

    /// The rule whose own device's interface is `iface`, if any.
    pub fn tenant_of(&self, iface: &str) -> Option<usize> {
        self.own_devices()
            .find(|(_, o)| o.iface == iface)
            .map(|(i, _)| i)
    }

    /// The policy of rule `rule`'s own device: its port's table holds the
    /// default P_Key and the rule's (an HCA port holds the keys of its
    /// host's partitions); every rule stays, for the QP-creation probe to
    /// tell the tenant's QPs from anyone else's, which are quarantined.
    pub fn for_tenant(&self, rule: usize) -> Policy {
        let key = self.binds[rule].pkey;
        let mut pkeys = vec![self.default_pkey()];
        if key != pkeys[0] {
            pkeys.push(key);
        }
        let name = |p: u16| {
            self.pkeys
                .iter()
                .position(|&k| k == p)
                .and_then(|i| self.names.get(i).cloned())
        };
        Policy {
            names: pkeys
                .iter()
                .map(|&p| name(p))
                .collect::<Option<Vec<_>>>()
                .unwrap_or_default(),
            pkeys,
            warnings: Vec::new(),
            owner: Some(rule),
            ..self.clone()
        }
    }

    /// The `[[bind]]` rules as the QP-creation probe reads them: on a
    /// tenant's own device, every one marked so, its tenant's as the owner.
    pub fn specs(&self) -> Vec<BindSpec> {
        self.binds
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let mut s = b.spec();
                if let Some(owner) = self.owner {
                    s.matchers |= matcher::OWNED | if i == owner { matcher::OWNER } else { 0 };
                }
                s
            })
            .collect()
    }

    /// Parses and validates policy text; `path` names it in errors.
    pub fn parse(path: &Path, text: &str) -> Result<Policy, PolicyError> {
        let dir = path.parent().unwrap_or(Path::new(""));
        file::parse(&ctx::Ctx { path, text, dir }, None)
    }

    /// A policy with this P_Key table and nothing else: enforce, the
    /// default unknown-QP rule, no QPs, groups or bind rules.
    pub fn with_table(pkeys: Vec<u16>) -> Policy {
        Policy {
            pkeys,
            names: Vec::new(),
            guid: None,
            warnings: Vec::new(),
            monitor: false,
            unknown_qp: UnknownQp::default(),
            qps: BTreeMap::new(),
            groups: BTreeMap::new(),
            binds: Vec::new(),
            stamp: false,
            foreign_join: OnForeignJoin::default(),
            probe_capacity: None,
            switch: None,
            listed: Vec::new(),
            owner: None,
        }
    }

    /// The port's default P_Key (table index 0).
    pub fn default_pkey(&self) -> u16 {
        self.pkeys[0]
    }

    /// The kernel's view of the global settings.
    pub fn config(&self) -> Config {
        Config {
            default_pkey: self.default_pkey(),
            unknown_qp: self.unknown_qp as u8,
            monitor: self.monitor.into(),
            stamp: self.stamp.into(),
            switch: self.switch.map_or(0, |role| {
                switch_flags::PORT
                    | if role.inbound {
                        switch_flags::INBOUND
                    } else {
                        0
                    }
                    | if role.outbound {
                        switch_flags::OUTBOUND
                    } else {
                        0
                    }
                    | if role.corrupt {
                        switch_flags::CORRUPT
                    } else {
                        0
                    }
            }),
            access_pkey: self.switch.and_then(|role| role.access).unwrap_or(0),
            // The loader's, when it writes the port table.
            port_serial: 0,
        }
    }

    /// What the probes do about a foreign multicast join: a policy in
    /// monitor mode only reports.
    pub fn join_action(&self) -> OnForeignJoin {
        if self.monitor {
            OnForeignJoin::Report
        } else {
            self.foreign_join
        }
    }

    /// Port-table membership flags per partition that has any entry.
    pub fn port_flags(&self) -> BTreeMap<u16, u8> {
        let mut flags = BTreeMap::new();
        for &p in &self.pkeys {
            *flags.entry(pkey::key(p)).or_insert(0) |= pkey::port::flag_of(p);
        }
        flags
    }

    /// QPNs a QP table must cover for this policy's QPs: its highest's
    /// and those below.
    pub fn qpns(&self) -> u32 {
        self.qps.last_key_value().map_or(0, |(&qpn, _)| qpn + 1)
    }

    /// The QP-table entry for a rule.
    pub fn qp_entry(rule: &QpRule) -> QpEntry {
        let unset = rule.qp_type == QpType::Ud && rule.qkey.is_none();
        QpEntry {
            qkey: rule.qkey.unwrap_or(0),
            pkey: rule.pkey,
            qp_type: rule.qp_type as u8,
            flags: rule.flags | if unset { qp_flags::UNSET_QKEY } else { 0 },
        }
    }
}

impl Group {
    /// The key the kernel finds this group by.
    pub fn key_addr(addr: IpAddr) -> [u8; 16] {
        match addr {
            IpAddr::V4(a) => v4_mapped(a.octets()),
            IpAddr::V6(a) => a.octets(),
        }
    }

    pub fn entry(&self) -> GroupEntry {
        GroupEntry {
            qkey: self.qkey,
            pkey: self.pkey,
            _pad: 0,
        }
    }
}

/// The policy as in-memory tables: what the host-side verdict reads, to check
/// the kernel's verdicts against.
impl Tables for Policy {
    fn qp(&self, qpn: u32) -> Option<QpEntry> {
        self.qps.get(&qpn).map(Policy::qp_entry)
    }

    fn group(&self, addr: &[u8; 16]) -> Option<GroupEntry> {
        self.groups.get(addr).map(Group::entry)
    }

    fn port_flags(&self, key: u16) -> u8 {
        Policy::port_flags(self).get(&key).copied().unwrap_or(0)
    }

    /// The quarantine is the QP-creation probe's, in the kernel only.
    fn quarantined(&self, _qpn: u32) -> bool {
        false
    }
}

/// The listeners are the probes' records, in the kernel only: the host's
/// tables have none for its rules to bind.
impl Rules for Policy {
    fn rule(&self, _index: u32) -> Option<&BindSpec> {
        None
    }
}

#[cfg(test)]
mod tests;
