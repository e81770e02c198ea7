//! Binding a QP the moment it is created, by who created it.
//!
//! The loader compiles a policy's `[[bind]]` rules into `BIND_RULES` (one
//! [`BindSpec`] each, in file order, per generation). The QP-creation probe
//! matches them, first match wins, against the task that made the QP — its
//! cgroup, effective ids and network namespace, which a process cannot
//! choose, as well as its command name and PID, which it can — and writes
//! the QP-table entry before the verb returns. It records what it saw
//! ([`Creation`]), and every later match reads that record; only for QPs
//! that existed before any probe ran does the host read `/proc` instead.
//!
//! A UD rule without a Q_Key binds the QP with the Q_Key its program sets
//! ([`qkey_set`]), as an HCA checks a UD QP's frames against its own Q_Key.
//! Until the program sets one (it must, to move the QP to INIT), every UD
//! frame for the QP is refused as a Q_Key violation: there is no Q_Key yet
//! that a frame could match.

use crate::abi::{
    BindSpec, CGROUP_LEVELS, Creation, MAX_RULES, QpEntry, QpType, counters::Capture, matcher,
    qp_flags,
};

/// A generation's `[[bind]]` rules, in file order, as the kernel keeps
/// them (`BIND_RULES`).
pub trait Rules {
    /// Rule `index`; None past the table (an unused rule, all zero,
    /// matches nothing).
    fn rule(&self, index: u32) -> Option<&BindSpec>;
}

/// What rule `index` of `rules` makes of a QP numbered `qpn` (`u32::MAX`
/// for none: no rule by QPN matches) with transport `transport`, made by
/// `c`. (The QP-creation probe walks the same rules in a loop the kernel
/// runs, `bpf_loop`, which only the probes may call.)
#[inline(always)]
pub fn step<R: Rules + ?Sized, C: Creator>(
    rules: &R,
    c: &C,
    qpn: u32,
    transport: QpType,
    index: u32,
) -> Step {
    match rules.rule(index) {
        // An unused slot ends the list.
        Some(rule) if rule.matchers == 0 => Step::End,
        Some(rule) if rule.matches(c, qpn, transport) => Step::Match,
        Some(_) => Step::Next,
        None => Step::End,
    }
}

/// The index of the first rule `step` says matches; `MAX_RULES` where none
/// does.
#[inline(always)]
pub fn first(mut step: impl FnMut(u32) -> Step) -> u32 {
    let mut i = 0;
    while i < MAX_RULES {
        match step(i) {
            Step::Match => return i,
            Step::Next => i += 1,
            Step::End => return MAX_RULES,
        }
    }
    MAX_RULES
}

/// What one `[[bind]]` rule makes of a QP ([`step`]): a number, which
/// crosses a BPF call as it is.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Step {
    /// It does not match; the next rule may.
    Next = 0,
    Match = 1,
    /// No rule follows.
    End = 2,
}

impl Step {
    /// The inverse of `step as u32`.
    #[inline(always)]
    pub const fn from_u32(n: u32) -> Step {
        match n {
            0 => Step::Next,
            1 => Step::Match,
            _ => Step::End,
        }
    }
}

/// What the match knows of the task that created a QP.
pub trait Creator {
    /// 1 for a QP the kernel made for one of its own users (no task owns
    /// it), else 0 (a number, not a `bool`: the BPF target has no
    /// instruction that makes one without a branch).
    fn kernel(&self) -> u8;
    /// The creating thread's command name, or a kernel QP's module name.
    fn comm(&self) -> [u8; 16];
    fn pid(&self) -> u32;
    fn uid(&self) -> u32;
    fn gid(&self) -> u32;
    /// The network namespace's cookie.
    fn netns(&self) -> u64;
    /// The id of the task's cgroup's ancestor at `level` (itself at its
    /// own level; below `CGROUP_LEVELS`, as rules name them), 0 when it is
    /// not that deep.
    fn cgroup_at(&self, level: u32) -> u64;
    /// The RDMA device's index.
    fn device(&self) -> u32;
    /// A kernel user's rdma_cm ports: served (local) and connected to
    /// (peer); 0 where none.
    fn ports(&self) -> [u16; 2];
}

/// What the QP-creation probe recorded is what every later match reads:
/// the same creator at every reload, whatever `/proc` says by then.
impl Creator for Creation {
    fn kernel(&self) -> u8 {
        self.kernel & 1
    }
    fn comm(&self) -> [u8; 16] {
        self.comm
    }
    fn pid(&self) -> u32 {
        self.pid
    }
    fn uid(&self) -> u32 {
        self.uid
    }
    fn gid(&self) -> u32 {
        self.gid
    }
    fn netns(&self) -> u64 {
        self.netns
    }
    fn cgroup_at(&self, level: u32) -> u64 {
        // Masked, not checked: no branch to walk per rule.
        self.cgroups[level as usize % CGROUP_LEVELS]
    }
    fn device(&self) -> u32 {
        self.device
    }
    fn ports(&self) -> [u16; 2] {
        self.ports
    }
}

impl BindSpec {
    /// Whether the rule matches a QP numbered `qpn` with RoCE transport
    /// `transport`, made by `c`. Computed without a branch (each matcher's
    /// difference masked by whether the rule gives it), so that the
    /// kernel's verifier walks one path per rule, not one per combination.
    #[inline(always)]
    pub fn matches<C: Creator>(&self, c: &C, qpn: u32, transport: QpType) -> bool {
        self.difference(c, qpn, transport, self.matchers) == 0
    }

    /// Whether process `c` is this rule's tenant: who it is (its cgroup,
    /// ids, network namespace: the matchers a process cannot choose) is
    /// what the rule says, and the rule is no kernel rule (whose tenant is
    /// no process). What opens a tenant's own device is asked this (see
    /// `pkeyfw-guard`); a rule that tells no tenant admits no one.
    #[inline(always)]
    pub fn admits<C: Creator>(&self, c: &C) -> bool {
        let boundary = self.matchers & matcher::BOUNDARY;
        boundary != 0
            && self.difference(
                c,
                0,
                QpType::Rc,
                boundary | self.matchers & (matcher::KERNEL | matcher::IN_USE),
            ) == 0
    }

    /// Zero when every matcher of `m` (this rule's, or a part of them)
    /// matches: the difference of each masked by whether it is given.
    #[inline(always)]
    fn difference<C: Creator>(&self, c: &C, qpn: u32, transport: QpType, m: u32) -> u64 {
        // All ones when a bit of `bits` is set in `m`, else zero.
        let given = |bits: u32| (u64::from(m & bits).wrapping_neg() >> 63).wrapping_neg();
        let differs = |a: u32, b: u32| u64::from(a ^ b);
        // Bit 63 set when `a < b` (both below 2^32).
        let below = |a: u32, b: u32| u64::from(a).wrapping_sub(u64::from(b)) >> 63;
        // SAFETY: 16 bytes either way.
        let [r0, r1]: [u64; 2] = unsafe { core::mem::transmute(self.comm) };
        let [c0, c1]: [u64; 2] = unsafe { core::mem::transmute(c.comm()) };
        (differs(self.pid, c.pid()) & given(matcher::PID))
            | (differs(self.uid, c.uid()) & given(matcher::UID))
            | (differs(self.gid, c.gid()) & given(matcher::GID))
            | ((self.netns ^ c.netns()) & given(matcher::NETNS))
            | (differs(self.qp_type.into(), transport as u32) & given(matcher::TYPE))
            | (((r0 ^ c0) | (r1 ^ c1)) & given(matcher::COMM))
            | ((self.cgroup ^ c.cgroup_at(self.cgroup_level)) & given(matcher::CGROUP))
            | ((below(qpn, self.qpn_lo) | below(self.qpn_hi, qpn)) & given(matcher::QPN))
            | (differs(self.device, c.device()) & given(matcher::DEVICE))
            // Either port: zero when one of them is the rule's (0 is no
            // port, and no rule's).
            | ((differs(self.port.into(), c.ports()[0].into())
                & differs(self.port.into(), c.ports()[1].into()))
                & given(matcher::PORT))
            // Kernel QPs for kernel rules, user QPs for the others.
            | (u64::from(c.kernel()) ^ (given(matcher::KERNEL) & 1))
            // (Through memory: LLVM would make a branch of a sign test.)
            | (!core::hint::black_box(given(matcher::IN_USE)) & 1)
    }

    /// Whether a QP this rule matches is bound by it even where a `[[qp]]`
    /// entry names its QPN: QPNs come in sequence (a tenant can create QPs
    /// until it holds one an entry names), who made the QP does not.
    #[inline(always)]
    pub const fn beats_entries(&self) -> bool {
        self.matchers & matcher::BOUNDARY != 0
    }

    /// The QP-table entry it gives a QP of `transport`; `qkey` is the
    /// Q_Key the QP's program set, if known.
    #[inline(always)]
    pub const fn entry(&self, transport: QpType, qkey: Option<u32>) -> QpEntry {
        let mut flags = qp_flags::RULE | qp_flags::PROBE;
        let qkey = match transport {
            QpType::Ud if self.pinned_qkey != 0 => self.qkey,
            QpType::Ud => {
                flags |= qp_flags::OWN_QKEY;
                match qkey {
                    Some(q) => q,
                    None => {
                        flags |= qp_flags::UNSET_QKEY;
                        0
                    }
                }
            }
            _ => 0,
        };
        QpEntry {
            qkey,
            pkey: self.pkey,
            qp_type: transport as u8,
            flags,
        }
    }
}

/// Whether a new QP whose creator's first matching rule is `first` (none:
/// no rule matches it) is foreign to the attachment's device, and so
/// quarantined rather than bound. A device pkeyfw made for one tenant
/// (`own_device`; its attachment's rules carry [`matcher::OWNED`]) is that
/// tenant's HCA: only its rule ([`matcher::OWNER`]) binds there. A QP
/// another creator makes on it — another tenant with a device file it was
/// passed, or opened before it joined its cgroup; a process no rule
/// matches; a kernel user — is refused both ways, its frames carrying no
/// key the device's tenant was given. `owned`: the generation's first rule
/// (a tenant device's list always has its owner) carries `OWNED`.
#[inline(always)]
pub const fn foreign(first: Option<&BindSpec>, owned: bool) -> bool {
    owned
        && match first {
            Some(rule) => rule.matchers & matcher::OWNER == 0,
            None => true,
        }
}

impl BindSpec {
    /// Whether this rule list is a tenant device's (see [`foreign`]): true
    /// of its first rule, the one the probe reads.
    #[inline(always)]
    pub const fn owned(&self) -> bool {
        self.matchers & matcher::OWNED != 0
    }
}

/// A bound QP's program set its Q_Key to `qkey` (a modify with
/// `IB_QP_QKEY` that succeeded): for a UD QP bound with its own Q_Key, the
/// entry to write instead of `entry` (`QkeyCaptured`); for one whose Q_Key
/// the policy pins, `QkeyMismatch` when the program chose another; else
/// nothing to do.
#[inline(always)]
pub const fn qkey_set(entry: QpEntry, qkey: u32) -> Option<(Option<QpEntry>, Capture)> {
    if entry.qp_type != QpType::Ud as u8 {
        return None;
    }
    if entry.flags & qp_flags::OWN_QKEY != 0 {
        let mut e = entry;
        e.qkey = qkey;
        e.flags &= !qp_flags::UNSET_QKEY;
        return Some((Some(e), Capture::QkeyCaptured));
    }
    if entry.qkey == qkey {
        None
    } else {
        Some((None, Capture::QkeyMismatch))
    }
}

/// A bound QP's first Q_Key set failed: for a UD QP bound with its own
/// Q_Key, the entry to write instead of `entry`, with no Q_Key again.
#[inline(always)]
pub const fn qkey_unset(entry: QpEntry) -> Option<QpEntry> {
    if entry.qp_type != QpType::Ud as u8 || entry.flags & qp_flags::OWN_QKEY == 0 {
        return None;
    }
    let mut e = entry;
    e.qkey = 0;
    e.flags |= qp_flags::UNSET_QKEY;
    Some(e)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::comm_bytes;

    #[derive(Default)]
    struct Task {
        kernel: bool,
        comm: [u8; 16],
        pid: u32,
        uid: u32,
        gid: u32,
        netns: u64,
        /// Cgroup ids from the root down.
        cgroups: [u64; 4],
        device: u32,
        ports: [u16; 2],
    }

    impl Creator for Task {
        fn kernel(&self) -> u8 {
            self.kernel.into()
        }
        fn comm(&self) -> [u8; 16] {
            self.comm
        }
        fn pid(&self) -> u32 {
            self.pid
        }
        fn uid(&self) -> u32 {
            self.uid
        }
        fn gid(&self) -> u32 {
            self.gid
        }
        fn netns(&self) -> u64 {
            self.netns
        }
        fn cgroup_at(&self, level: u32) -> u64 {
            self.cgroups.get(level as usize).copied().unwrap_or(0)
        }
        fn device(&self) -> u32 {
            self.device
        }
        fn ports(&self) -> [u16; 2] {
            self.ports
        }
    }

    fn tenant_a() -> Task {
        Task {
            comm: comm_bytes(b"ibv_ud_pingpong"),
            pid: 100,
            uid: 1001,
            gid: 1001,
            netns: 0x1000_0000_0001,
            cgroups: [1, 50, 60, 0],
            ..Task::default()
        }
    }

    fn rule(matchers: u32) -> BindSpec {
        BindSpec {
            matchers: matchers | matcher::IN_USE,
            pkey: 0x8001,
            ..BindSpec::default()
        }
    }

    #[test]
    fn a_netns_rule_matches_the_whole_cookie() {
        let mut r = rule(matcher::NETNS);
        r.netns = tenant_a().netns;
        assert!(r.matches(&tenant_a(), 0x11, QpType::Ud));
        // Equal in the low 32 bits, as two namespaces' inode numbers can be.
        r.netns = 0x2000_0000_0001;
        assert!(!r.matches(&tenant_a(), 0x11, QpType::Ud));
    }

    #[test]
    fn a_cgroup_rule_matches_the_directory_and_below() {
        let mut r = rule(matcher::CGROUP);
        r.cgroup = 50;
        r.cgroup_level = 1;
        assert!(r.matches(&tenant_a(), 0x11, QpType::Ud));
        r.cgroup = 60;
        r.cgroup_level = 2;
        assert!(r.matches(&tenant_a(), 0x11, QpType::Ud));
        // A sibling, and a level the task does not reach.
        r.cgroup = 51;
        r.cgroup_level = 1;
        assert!(!r.matches(&tenant_a(), 0x11, QpType::Ud));
        r.cgroup = 70;
        r.cgroup_level = 3;
        assert!(!r.matches(&tenant_a(), 0x11, QpType::Ud));
    }

    #[test]
    fn every_matcher_given_must_match() {
        let mut r = rule(matcher::UID | matcher::COMM | matcher::TYPE);
        r.uid = 1001;
        r.comm = comm_bytes(b"ibv_ud_pingpong");
        r.qp_type = QpType::Ud as u8;
        assert!(r.matches(&tenant_a(), 0x11, QpType::Ud));
        assert!(!r.matches(&tenant_a(), 0x11, QpType::Rc));
        let renamed = Task {
            comm: comm_bytes(b"other"),
            ..tenant_a()
        };
        assert!(!r.matches(&renamed, 0x11, QpType::Ud));
        let other_user = Task {
            uid: 1002,
            ..tenant_a()
        };
        assert!(!r.matches(&other_user, 0x11, QpType::Ud));
    }

    #[test]
    fn kernel_rules_are_for_kernel_qps_only_and_unused_slots_match_nothing() {
        let kernel = Task {
            kernel: true,
            comm: comm_bytes(b"rdma_cm"),
            ..Task::default()
        };
        let mut ulp = rule(matcher::KERNEL | matcher::COMM);
        ulp.comm = comm_bytes(b"rdma_cm");
        assert!(ulp.matches(&kernel, 0x11, QpType::Rc));
        // A process that takes the module's name is no kernel user.
        let posing = Task {
            comm: comm_bytes(b"rdma_cm"),
            ..tenant_a()
        };
        assert!(!ulp.matches(&posing, 0x11, QpType::Rc));
        // Nor is a user rule one for the kernel's QPs, by name or by uid 0.
        let mut by_name = rule(matcher::COMM);
        by_name.comm = comm_bytes(b"rdma_cm");
        assert!(!by_name.matches(&kernel, 0x11, QpType::Rc));
        assert!(by_name.matches(&posing, 0x11, QpType::Rc));
        assert!(!rule(matcher::UID).matches(&kernel, 0x11, QpType::Rc));
        assert!(!BindSpec::default().matches(&tenant_a(), 0x11, QpType::Rc));
    }

    /// A kernel rule by port binds what serves or connects to it, on the
    /// device it names: NVMe over Fabrics (4420) both ends, not RDS
    /// (18634), which an unprivileged user can make the kernel connect.
    #[test]
    fn a_kernel_rule_by_port_and_device_binds_only_that_service() {
        let mut nvme = rule(matcher::KERNEL | matcher::PORT | matcher::DEVICE);
        (nvme.port, nvme.device) = (4420, 3);
        let kernel = |ports, device| Task {
            kernel: true,
            comm: comm_bytes(b"rdma_cm"),
            ports,
            device,
            ..Task::default()
        };
        assert!(
            nvme.matches(&kernel([4420, 51000], 3), 0x11, QpType::Rc),
            "target"
        );
        assert!(
            nvme.matches(&kernel([51000, 4420], 3), 0x11, QpType::Rc),
            "initiator"
        );
        assert!(
            !nvme.matches(&kernel([18634, 51000], 3), 0x11, QpType::Rc),
            "RDS"
        );
        assert!(
            !nvme.matches(&kernel([0, 0], 3), 0x11, QpType::Rc),
            "no rdma_cm port"
        );
        assert!(
            !nvme.matches(&kernel([4420, 51000], 4), 0x11, QpType::Rc),
            "another device"
        );
    }

    /// A rule's tenant is who it names by cgroup, ids or namespace, not by
    /// name or number; a kernel rule's is no process, nor is an unused
    /// slot's.
    #[test]
    fn a_tenant_is_who_the_rule_names_by_what_a_process_cannot_choose() {
        let a = tenant_a();
        let mut by_cgroup = rule(matcher::CGROUP | matcher::COMM);
        (by_cgroup.cgroup, by_cgroup.cgroup_level) = (50, 1);
        by_cgroup.comm = comm_bytes(b"other");
        assert!(
            by_cgroup.admits(&a),
            "the name is no part of who a tenant is"
        );
        by_cgroup.cgroup = 51;
        assert!(!by_cgroup.admits(&a));
        let mut by_uid = rule(matcher::UID);
        by_uid.uid = 1001;
        assert!(by_uid.admits(&a));
        by_uid.uid = 1002;
        assert!(!by_uid.admits(&a));
        let by_name = rule(matcher::COMM);
        assert!(!by_name.admits(&a), "no boundary: no tenant");
        let kernel = rule(matcher::KERNEL | matcher::COMM);
        assert!(!kernel.admits(&a));
        assert!(!BindSpec::default().admits(&a));
    }

    /// On a tenant's own device only its rule binds: another tenant's QP
    /// there, and one no rule matches, are foreign; elsewhere nothing is.
    #[test]
    fn on_a_tenants_device_only_its_rule_binds() {
        let owner = rule(matcher::CGROUP | matcher::OWNER | matcher::OWNED);
        let other = rule(matcher::CGROUP | matcher::OWNED);
        assert!(owner.owned() && other.owned());
        assert!(!foreign(Some(&owner), true));
        assert!(foreign(Some(&other), true));
        assert!(foreign(None, true));
        let shared = rule(matcher::CGROUP);
        assert!(!shared.owned());
        assert!(!foreign(Some(&shared), false));
        assert!(!foreign(None, false));
    }

    #[test]
    fn a_ud_qp_bound_with_its_own_qkey_refuses_until_it_sets_one() {
        let r = rule(matcher::UID);
        let e = r.entry(QpType::Ud, None);
        assert_eq!(
            e.flags,
            qp_flags::RULE | qp_flags::PROBE | qp_flags::OWN_QKEY | qp_flags::UNSET_QKEY
        );
        let (set, outcome) = qkey_set(e, 0x1111_1111).expect("an outcome");
        let set = set.expect("a captured Q_Key");
        assert_eq!(outcome, Capture::QkeyCaptured);
        assert_eq!(
            (set.qkey, set.flags & qp_flags::UNSET_QKEY),
            (0x1111_1111, 0)
        );
        // The modify failed: no Q_Key again.
        assert_eq!(qkey_unset(set), Some(e));
    }

    #[test]
    fn a_pinned_qkey_stays_and_another_is_reported() {
        let mut r = rule(matcher::UID);
        r.pinned_qkey = 1;
        r.qkey = 0x2222;
        let e = r.entry(QpType::Ud, Some(0x1111));
        assert_eq!(
            (e.qkey, e.flags),
            (0x2222, qp_flags::RULE | qp_flags::PROBE)
        );
        assert_eq!(qkey_set(e, 0x1111), Some((None, Capture::QkeyMismatch)));
        assert_eq!(qkey_set(e, 0x2222), None);
        let rc = r.entry(QpType::Rc, None);
        assert_eq!(qkey_set(rc, 0x1111), None);
    }
}
