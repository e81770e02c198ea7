//! Probes on the kernel's RDMA core for a foreground `pkeyfw attach`. They
//! read the verbs' arguments and leave every decision to
//! `pkeyfw_common::capture`.
//!
//! - `pkeyfw_resource_added` binds a QP the moment it is created, by the
//!   first `[[bind]]` rule (`BIND_RULES`) of the live generation that
//!   matches the task that made it (`pkeyfw_common::tenant`), before the
//!   verb returns and so before any peer can learn its number; then it wakes
//!   a foreground attachment, which reconciles with RDMA netlink (an entry
//!   probe on rdma_restrack_add, where a new QP becomes visible).
//! - `pkeyfw_modify` captures the Q_Key a QP's program sets (`IB_QP_QKEY`,
//!   ib_modify_qp_with_udata) at the verb's entry; `pkeyfw_modified`, its
//!   return probe, undoes it if the call failed.
//! - `pkeyfw_resource_removed` (rdma_restrack_finish_del, or
//!   rdma_restrack_del, reached once a destroy succeeded) unbinds a
//!   destroyed QP if a rule bound it and forgets its Q_Key.
//! - `pkeyfw_join` reports a QP that joins a multicast group of another
//!   partition (ib_attach_mcast), at the verb's entry; under `foreign_join
//!   = "kill"` it SIGKILLs the joining process of a bound QP.
//!
//! Every probe that decides acts at an entry: a return probe's instances
//! are limited, and a tenant can hold them all.
//!
//! A QP-table entry is one u64 the XDP program reads with one load: the
//! probes store a whole new word, or exchange one for another atomically
//! where what they write depends on what they read ([`replace`]), so that
//! no frame sees part of an entry and no entry another writer stored
//! meanwhile is lost.
#![no_std]
#![no_main]
#![feature(asm_experimental_arch)]

mod cm;
mod kernel;
mod object;
mod repeat;
mod task;

use core::ptr;

use aya_ebpf::{
    Global,
    bindings::{BPF_F_MMAPABLE, BPF_F_NO_PREALLOC, BPF_RB_FORCE_WAKEUP},
    btf_maps::{Array, HashMap, LruHashMap, PerCpuArray, RingBuf},
    helpers::{
        bpf_get_current_pid_tgid, bpf_jiffies64, bpf_ktime_get_ns, bpf_probe_read_kernel_str_bytes,
        generated,
    },
    macros::{btf_map, kprobe, kretprobe},
    programs::{ProbeContext, RetProbeContext},
};
use aya_log_ebpf::{error, warn};
use kernel::read;
use pkeyfw_common::{
    Capture,
    abi::{
        BindSpec, Config, Creation, Event, EventBudget, EventKind, GENERATIONS, GROUP_CAPACITY,
        GroupEntry, GroupKey, JoinAction, MAX_RULES, MIN_QPNS, PROBE_ROOM, QPN_MASK,
        QUARANTINE_WORDS, QpEntry, QpLayout, QpStats, QpType, REPORTS_BYTES, qp_flags, qp_index,
        quarantine_bit,
    },
    capture, tenant,
};
use repeat::{Body, repeat};

/// The rdma_cm ports of the QP the thread's rdma_create_qp is making, until
/// its creation is seen (the same thread, within the call).
#[btf_map]
static CM_PORTS: LruHashMap<u64, [u16; 2], 4096> = LruHashMap::new();

/// A wake-up per QP created, for a foreground attachment.
#[btf_map]
static QP_CREATED: RingBuf<u32, 4096> = RingBuf::new();

/// A verb's arguments, between its entry and its return, per thread. LRU,
/// so that entries whose return was missed give way.
#[btf_map]
static PENDING: LruHashMap<u64, Pending, 4096> = LruHashMap::new();

/// As the filter object's hash maps: allocated as entries are made.
const GROWN: usize = BPF_F_NO_PREALLOC as usize;
/// As the filter object's QP table: its memory mapped by the loader.
const MAPPED: usize = BPF_F_MMAPABLE as usize;

/// The filter's maps, shared through their pins (same definitions as in
/// the filter object; the loader sets the real sizes).
#[btf_map]
static ACTIVE: Array<u32, 1> = Array::new();
#[btf_map]
static JOIN_ACTION: Array<JoinAction, { GENERATIONS as usize }> = Array::new();
#[btf_map]
static CONFIG: Array<Config, { GENERATIONS as usize }> = Array::new();
#[btf_map]
static QPS: Array<u64, { (GENERATIONS * MIN_QPNS) as usize }, MAPPED> = Array::new();
#[btf_map]
static GROUPS: HashMap<GroupKey, GroupEntry, { GROUP_CAPACITY as usize }, GROWN> = HashMap::new();
#[btf_map]
static CAPTURES: PerCpuArray<u64, { Capture::COUNT }> = PerCpuArray::new();
#[btf_map]
static QP_STATS: Array<QpStats, { MIN_QPNS as usize }> = Array::new();
#[btf_map]
static BIND_RULES: Array<BindSpec, { (GENERATIONS * MAX_RULES) as usize }> = Array::new();
#[btf_map]
static QKEYS: HashMap<u32, u32, { PROBE_ROOM as usize }, GROWN> = HashMap::new();
#[btf_map]
static QUARANTINE: Array<u64, { QUARANTINE_WORDS as usize }> = Array::new();
#[btf_map]
static CREATIONS: HashMap<u32, Creation, { PROBE_ROOM as usize }, GROWN> = HashMap::new();
/// The probes' own ring: no flood of refused frames (`EVENTS`) leaves a
/// report no room.
#[btf_map]
static REPORTS: RingBuf<Event, { REPORTS_BYTES as usize }> = RingBuf::new();
#[btf_map]
static EVENT_BUDGET: PerCpuArray<EventBudget, { EventKind::COUNT }> = PerCpuArray::new();

/// Set by the loader from the kernel's BTF.
#[unsafe(no_mangle)]
static LAYOUT: Global<QpLayout> = Global::new(QpLayout::NONE);

/// What the modify's entry probe keeps for its return probe: the Q_Key to
/// go back to if the call fails.
#[repr(C)]
#[derive(Copy, Clone)]
struct Pending {
    qpn: u32,
    /// The Q_Key captured before (when `had`).
    qkey: u32,
    had: u32,
}

/// ib_modify_qp_with_udata(qp, attr, attr_mask, udata): a Q_Key set on a
/// QP of ours is taken here, at the entry, which no number of calls at
/// once can make miss (a return probe's instances are limited: threads
/// sleeping in modifies whose address does not resolve would hold them
/// all). The return probe only undoes it if the call failed; one it
/// misses leaves the Q_Key the QP's own program asked for, which concerns
/// its own frames alone (rdma_rxe checks the Q_Key it holds too).
#[kprobe]
pub fn pkeyfw_modify(ctx: ProbeContext) -> u32 {
    let _ = modify(&ctx);
    0
}

fn modify(ctx: &ProbeContext) -> Option<()> {
    // Whatever this call is, a return this thread's last call left (its
    // return probe missed) must not be taken for this one's.
    let id = bpf_get_current_pid_tgid();
    let _ = PENDING.remove(&id);
    let mask: u32 = ctx.arg(2)?;
    let layout = LAYOUT.load();
    if mask & QpLayout::MASK_QKEY == 0 || layout.attr_qkey == 0 {
        return None;
    }
    let qpn = our_qp(&layout, ctx.arg(0)?)?;
    let attr: *const u8 = ctx.arg(1)?;
    let qkey = read(attr, layout.attr_qkey)?;
    // SAFETY: the value is copied out at once.
    let before = unsafe { QKEYS.get(&qpn) }.copied();
    qkey_set(qpn, qkey);
    let pending = Pending {
        qpn,
        qkey: before.unwrap_or(0),
        had: before.is_some().into(),
    };
    PENDING.insert(&id, &pending, 0).ok()
}

#[kretprobe]
pub fn pkeyfw_modified(ctx: RetProbeContext) -> u32 {
    let id = bpf_get_current_pid_tgid();
    // SAFETY: the value is copied out at once.
    let Some(p) = (unsafe { PENDING.get(&id) }).copied() else {
        return 0;
    };
    let _ = PENDING.remove(&id);
    if ctx.ret::<i32>() != 0 {
        if p.had != 0 {
            set_qkey(p.qpn, p.qkey, false);
        } else {
            qkey_unset(p.qpn);
        }
    }
    0
}

/// QP `qpn`'s first Q_Key set failed: it has none again.
fn qkey_unset(qpn: u32) {
    let _ = QKEYS.remove(&qpn);
    for g in 0..GENERATIONS {
        update(g, qpn, |e| tenant::qkey_unset(e).map(Some));
    }
}

/// QP `qpn`'s program set its Q_Key: kept for later bindings (`QKEYS`),
/// and applied to its rule bindings in both generations (counted and
/// reported by the live one).
fn qkey_set(qpn: u32, qkey: u32) {
    set_qkey(qpn, qkey, true);
}

/// QP `qpn`'s Q_Key is `qkey`: kept and applied; counted and reported
/// (`tell`) as the program's move, or not (a failed modify undone).
#[inline(always)]
fn set_qkey(qpn: u32, qkey: u32, tell: bool) {
    let _ = QKEYS.insert(&qpn, &qkey, 0);
    let live = Live::now().generation;
    for g in [live, 1 - live] {
        let Some(entry) = entry(g, qpn) else {
            continue;
        };
        let Some((new, outcome)) = tenant::qkey_set(entry, qkey) else {
            continue;
        };
        if new.is_some() {
            update(g, qpn, |e| {
                tenant::qkey_set(e, qkey).and_then(|(new, _)| new).map(Some)
            });
        }
        if g == live && tell {
            count(outcome);
            if outcome == Capture::QkeyMismatch {
                report(Event {
                    dest_qp: qpn,
                    pkey: entry.pkey,
                    qkey,
                    src_qp: entry.qkey,
                    kind: EventKind::QkeyMismatch as u8,
                    ..Event::default()
                });
            }
        }
    }
}

/// rdma_restrack_finish_del(res) (or rdma_restrack_del on kernels without
/// the two-step delete): a resource leaves the RDMA core's table; for a QP,
/// after its driver destroyed it. An entry probe, so none is missed.
/// The QP's bindings go only if the record of its QPN is still this QP's
/// (or there is none: bound by userspace, if at all): rxe may hand the
/// number to a new QP before the old one's destruction gets here, and the
/// new QP's binding must stay.
#[kprobe]
pub fn pkeyfw_resource_removed(ctx: ProbeContext) -> u32 {
    let layout = LAYOUT.load();
    let Some((_, qp)) = restrack_qp(&ctx, &layout) else {
        return 0;
    };
    let Some(qpn) = our_qp(&layout, qp) else {
        return 0;
    };
    // SAFETY: the value is copied out at once.
    match unsafe { CREATIONS.get(&qpn) }.map(|c| c.qp) {
        Some(made) if made == qp as u64 => {
            let _ = CREATIONS.remove(&qpn);
        }
        // Another QP's now: its bindings stay.
        Some(_) => return 0,
        None => {}
    }
    unbind(qpn);
    0
}

/// A destroyed QP's rule bindings go (a `[[qp]]` entry names a QPN, not a
/// QP, and stays), with its Q_Key and its quarantine.
fn unbind(qpn: u32) {
    unbind_rules(qpn);
    let _ = QKEYS.remove(&qpn);
    quarantine(qpn, false);
}

/// Removes QPN `qpn`'s rule bindings from both generations (a `[[qp]]`
/// entry stays): each a stored zero, where the entry is still the one read.
#[inline(always)]
fn unbind_rules(qpn: u32) {
    for g in 0..GENERATIONS {
        update(g, qpn, |e| (e.flags & qp_flags::RULE != 0).then_some(None));
    }
}

/// ib_attach_mcast(qp, gid, lid).
#[kprobe]
pub fn pkeyfw_join(ctx: ProbeContext) -> u32 {
    let _ = join(&ctx);
    0
}

fn join(ctx: &ProbeContext) -> Option<()> {
    let layout = LAYOUT.load();
    let qp: *const u8 = ctx.arg(0)?;
    let qpn = our_qp(&layout, qp)?;
    let group = read(ctx.arg(1)?, 0)?;
    let live = Live::now();
    // Here, at the entry, which no number of joins at once can make miss:
    // the signal is pending before the verb returns, and the process never
    // runs again to read what the group receives (a process sharing the
    // QP's uverbs file keeps it, joined). Only a process's UD QP (the only
    // kind the verb takes) earns it: a kernel user's join may run in any
    // process's system call.
    let action = JOIN_ACTION.get(live.generation).copied().unwrap_or(0);
    let (pkey, joined) = live.join(qpn, &group);
    let users_ud = read::<u32>(qp, layout.qp_type).and_then(QpType::of_ib) == Some(QpType::Ud)
        && read::<u8>(qp, layout.qp_res + layout.res_user).unwrap_or(0) != 0;
    // (P_Key 0 is no binding's.)
    if users_ud && capture::kills(joined, action, pkey != 0) {
        // SAFETY: no preconditions.
        let refused = unsafe { generated::bpf_send_signal(SIGKILL) };
        // (Each line's text is a constant: the log record copies a string
        // argument, which the verifier cannot bound if chosen.)
        if refused == 0 {
            count(Capture::Killed);
            warn!(
                &(),
                "QP {}: its process joined a multicast group of another partition (foreign_join = \"kill\"): SIGKILL sent",
                qpn
            );
        } else {
            warn!(
                &(),
                "QP {}: its process joined a multicast group of another partition (foreign_join = \"kill\"): SIGKILL refused ({})",
                qpn,
                refused
            );
        }
    }
    // Counted and reported here too, at the entry (a return probe could
    // be starved of instances): a join the verb then refuses was still
    // tried.
    count(joined);
    if let (Capture::ForeignJoin, Some(group_pkey)) = (joined, live.group(&group)) {
        report_join(qpn, pkey, &group, group_pkey);
    }
    Some(())
}

/// The signal a foreign join earns under `foreign_join = "kill"`.
const SIGKILL: u32 = 9;

/// A foreign join as an event.
#[inline(always)]
fn report_join(qpn: u32, pkey: u16, group: &[u8; 16], group_pkey: u16) {
    report(Event {
        dst: *group,
        dest_qp: qpn,
        pkey,
        qkey: group_pkey.into(),
        kind: EventKind::ForeignJoin as u8,
        ..Event::default()
    });
}

/// A report, within this CPU's budget for its kind (refused frames have
/// budgets of their own, and a ring), on the probes' ring; one that finds
/// no room there is counted.
#[inline(always)]
fn report(event: Event) {
    let Some(budget) = EVENT_BUDGET.get_ptr_mut(event.kind.into()) else {
        return;
    };
    // SAFETY: this CPU's slot, and no preconditions for the clock
    // (the coarse clock is not offered to probes).
    let budget = unsafe { &mut *budget };
    // SAFETY: no preconditions.
    if !budget.spend(unsafe { bpf_jiffies64() }, || unsafe { bpf_ktime_get_ns() }) {
        return;
    }
    if REPORTS.output(&event, 0).is_err() {
        budget.lost += 1;
    }
}

/// The QPN of `qp`, if it is on one of the attachment's RDMA devices.
#[inline(always)]
fn our_qp(layout: &QpLayout, qp: *const u8) -> Option<u32> {
    our_device_qp(layout, qp).map(|(_, qpn)| qpn)
}

/// The device index and the QPN of `qp`, if it is on one of the
/// attachment's RDMA devices.
#[inline(always)]
fn our_device_qp(layout: &QpLayout, qp: *const u8) -> Option<(u32, u32)> {
    let device: *const u8 = read(qp, layout.qp_device)?;
    let index: u32 = read(device, layout.device_index)?;
    if !layout.devices.contains(&index) {
        return None;
    }
    Some((index, read::<u32>(qp, layout.qp_num)? & QPN_MASK))
}

fn count(outcome: Capture) {
    if let Some(c) = CAPTURES.get_ptr_mut(outcome.index()) {
        // SAFETY: a per-CPU slot, written only by this CPU.
        unsafe { *c += 1 };
    }
}

/// The live generation's QP table.
pub(crate) struct Live {
    generation: u32,
}

impl Live {
    pub(crate) fn now() -> Live {
        Live {
            generation: ACTIVE.get(0).map_or(0, |g| *g & 1),
        }
    }

    /// Local QP `qpn`'s binding: the live generation's, or for a QP the
    /// creation probe bound while a new generation was being written
    /// (which the switch settles moments later), the other's. (Inlined
    /// into callers that return no `Option<QpEntry>`: a None's unwritten
    /// payload, copied out, is what the verifier refuses.)
    #[inline(always)]
    pub(crate) fn binding(&self, qpn: u32) -> Option<QpEntry> {
        entry(self.generation, qpn)
            .or_else(|| entry(self.generation ^ 1, qpn).filter(|e| e.flags & qp_flags::PROBE != 0))
    }

    /// Local QP `qpn` joining group `addr`: the P_Key of its binding (0
    /// if none) and what the policy makes of the join.
    #[inline(always)]
    fn join(&self, qpn: u32, addr: &[u8; 16]) -> (u16, Capture) {
        let qp = self.binding(qpn);
        let config = CONFIG.get(self.generation).copied().unwrap_or_default();
        let unbound = capture::unbound(&config, quarantined(qpn));
        (
            qp.map_or(0, |q| q.pkey),
            capture::joined(qp, unbound, self.group(addr)),
        )
    }

    /// The P_Key of the live policy's group of GID `addr`, if it lists it.
    #[inline(always)]
    fn group(&self, addr: &[u8; 16]) -> Option<u16> {
        let key = GroupKey {
            generation: self.generation,
            addr: *addr,
        };
        // SAFETY: the value is copied out at once.
        unsafe { GROUPS.get(&key) }.map(|g| g.pkey)
    }
}

/// rdma_restrack_add(res): a resource of the RDMA core becomes visible in
/// the table RDMA netlink reads. For a QP its driver has made it and given
/// it its number, and the verb has not returned: nothing can have learnt
/// the number yet. An entry probe, which no number of creations at once can
/// make miss (a return probe's instances are limited). A user QP is bound
/// by the task that made it, a kernel user's (a ULP's) by its module.
#[kprobe]
pub fn pkeyfw_resource_added(ctx: ProbeContext) -> u32 {
    let layout = LAYOUT.load();
    let Some((res, qp)) = restrack_qp(&ctx, &layout) else {
        return 0;
    };
    let mut comm = [0u8; 16];
    if read::<u8>(res, layout.res_user).unwrap_or(0) == 0
        && let Some(name) = read::<*const u8>(res, layout.res_kern_name)
    {
        // SAFETY: bpf_probe_read_kernel_str checks the address.
        let _ = unsafe { bpf_probe_read_kernel_str_bytes(name, &mut comm) };
    }
    // uverbs makes a process's XRC target QPs as a kernel user would: they
    // are the process's. (Compared as words: one branch.)
    // SAFETY: 16 bytes either way.
    let [c0, c1]: [u64; 2] = unsafe { core::mem::transmute(comm) };
    let [u0, u1]: [u64; 2] = unsafe { core::mem::transmute(UVERBS) };
    let kernel = if ((c0 ^ u0) | (c1 ^ u1)) == 0 {
        [0, 0]
    } else {
        [c0, c1]
    };
    // An rdma_cm QP's ports, taken whatever this QP is: none is left for
    // another of the thread's QPs.
    let id = bpf_get_current_pid_tgid();
    // SAFETY: the value is copied out at once.
    let ports = unsafe { CM_PORTS.get(&id) }.copied();
    if ports.is_some() {
        let _ = CM_PORTS.remove(&id);
    }
    // SAFETY: 16 bytes either way.
    let [r0, r1]: [u64; 2] = unsafe { core::mem::transmute(RDMA_CM) };
    let ports = match ports {
        Some(p) if ((c0 ^ r0) | (c1 ^ r1)) == 0 => p,
        _ => [0; 2],
    };
    created(&layout, qp, kernel, ports);
    0
}

/// The restrack entry a restrack probe was given, and its `struct ib_qp`,
/// when the entry is a QP's (the entry is embedded in the QP).
#[inline(always)]
fn restrack_qp(ctx: &ProbeContext, layout: &QpLayout) -> Option<(*const u8, *const u8)> {
    let res: *const u8 = ctx.arg(0)?;
    if read::<u32>(res, layout.res_type)? != QpLayout::RESTRACK_QP {
        return None;
    }
    Some((res, res.wrapping_sub(layout.qp_res as usize)))
}

/// The module name uverbs gives the QPs it makes for a process.
const UVERBS: [u8; 16] = *b"ib_uverbs\0\0\0\0\0\0\0";

/// rdma_create_qp(id, pd, attr): a kernel user of rdma_cm makes a QP for a
/// connection. What port it serves (its address's) and connects to (its
/// peer's) is kept for the creation probe, which runs within this call.
#[kprobe]
pub fn pkeyfw_cm_qp(ctx: ProbeContext) -> u32 {
    let layout = LAYOUT.load();
    if let Some(id) = ctx.arg::<*const u8>(0)
        && layout.cm_src != 0
    {
        let ports = [cm_port(id, layout.cm_src), cm_port(id, layout.cm_dst)];
        let _ = CM_PORTS.insert(&bpf_get_current_pid_tgid(), &ports, 0);
    }
    0
}

/// The port of the `sockaddr_storage` at `id + at`: an IPv4 or IPv6
/// address's (`sin_port`, `sin6_port`, both at offset 2), else 0.
#[inline(always)]
fn cm_port(id: *const u8, at: u32) -> u16 {
    const AF_INET: u16 = 2;
    const AF_INET6: u16 = 10;
    match read::<u16>(id, at) {
        Some(AF_INET | AF_INET6) => read::<u16>(id, at + 2).map_or(0, u16::from_be),
        _ => 0,
    }
}

/// The rdma_cm module's name, which its kernel QPs carry.
const RDMA_CM: [u8; 16] = *b"rdma_cm\0\0\0\0\0\0\0\0\0";

/// A QP was created: who made it is recorded, and it is bound; userspace
/// is woken to reconcile. `kernel`: the module name of the kernel user that
/// made it, as two words; zero for a process's QP.
#[inline(always)]
fn created(layout: &QpLayout, qp: *const u8, kernel: [u64; 2], ports: [u16; 2]) {
    // An error pointer is no QP: reading through it fails.
    if let Some((device, qpn)) = our_device_qp(layout, qp) {
        match read::<u32>(qp, layout.qp_type) {
            Some(t) => {
                if let Some(transport) = QpType::of_ib(t)
                    && let Some(m) = SCRATCH.get_ptr_mut(0)
                {
                    // SAFETY: this CPU's scratch value, which no other run
                    // of the probe on this CPU can reach while this one
                    // runs (kprobe programs do not nest).
                    let m = unsafe { &mut *m };
                    (m.qpn, m.transport) = (qpn, transport as u32);
                    record(&mut m.creator, layout, qp, t, (device, ports), kernel);
                    // A new QP has set no Q_Key: none an earlier QP of the
                    // number left (its destruction unseen) is its.
                    let _ = QKEYS.remove(&qpn);
                    if CREATIONS.insert(&qpn, &m.creator, 0).is_ok() {
                        bind(transport, m);
                    } else {
                        unrecorded(qpn);
                    }
                }
            }
            None => error!(
                &(),
                "QP {}: cannot read ib_qp.qp_type at offset {}: not bound at creation",
                qpn,
                layout.qp_type
            ),
        }
    }
    // A full ring already holds a wake-up; losing this one changes nothing.
    let _ = QP_CREATED.output(&0u32, BPF_RB_FORCE_WAKEUP as u64);
}

/// A QP whose creation found no room in `CREATIONS` (sized for every QP
/// the devices hold: only destructions unseen can fill it): no later match
/// could tell who made it, so it is quarantined now, not left to whatever
/// `/proc` says then.
#[inline(never)]
fn unrecorded(qpn: u32) {
    // No earlier QP's rule binding of the number is this one's.
    unbind_rules(qpn);
    quarantine(qpn, true);
    count(Capture::Quarantined);
    report(Event {
        dest_qp: qpn,
        kind: EventKind::Quarantined as u8,
        ..Event::default()
    });
    warn!(
        &(),
        "QP {}: no room to record who made it (CREATIONS full): quarantined, its frames refused until it is destroyed",
        qpn
    );
}

/// Binds new QP `m.qpn` in the live generation by its first matching rule.
/// A `[[qp]]` entry for the QPN wins over a rule that matches only what a
/// process chooses, never over a boundary rule (cgroup, ids, network
/// namespace): a QPN comes by chance. A rule binding left from an earlier
/// QP with this number (its destruction unseen) goes. (A reload writes the
/// idle generation from RDMA netlink and binds what it missed once live.)
#[inline(always)]
fn bind(transport: QpType, m: &mut Matching) {
    let (qpn, g) = (m.qpn, Live::now().generation);
    let i = first_match(g, m);
    // The rule where the map keeps it, not a copy: this frame, the rule
    // match's and its loop body's stack together must stay within 512
    // bytes (Linux 6.1 counts every chain of calls).
    let rule = if i < MAX_RULES {
        BIND_RULES.get(g * MAX_RULES + i)
    } else {
        None
    };
    let owned = BIND_RULES.get(g * MAX_RULES).is_some_and(BindSpec::owned);
    if tenant::foreign(rule, owned) {
        refuse_foreign(g, qpn, rule.map_or(0, |r| r.pkey), m.creator.pid);
        return;
    }
    let Some(word) = word(g, qpn) else {
        // Beyond the table: no entry can hold it.
        if let Some(rule) = rule {
            refuse(qpn, rule.pkey);
        }
        return;
    };
    // SAFETY: a live, 8-byte aligned array element.
    let old = QpEntry::from_bits(unsafe { ptr::read_volatile(word) });
    let entry = old.is_some_and(|e| e.flags & qp_flags::RULE == 0);
    let Some(rule) = rule.filter(|r| !entry || r.beats_entries()) else {
        if old.is_some() && !entry {
            unbind_rules(qpn);
        }
        return;
    };
    // SAFETY: the value is copied out at once.
    let qkey = unsafe { QKEYS.get(&qpn) }.copied();
    // A new QP's counters start from zero, before a frame can find it.
    zero_stats(qpn);
    // One store of the whole word: the binding the creator earns stands
    // whatever was there.
    // SAFETY: a live, 8-byte aligned array element.
    unsafe { ptr::write_volatile(word, rule.entry(transport, qkey).to_bits()) };
    quarantine(qpn, false);
    count(Capture::Bound);
}

/// A QP a rule would bind that has no room in the QP table (its QPN beyond
/// it): quarantined, its frames refused until it is bound or destroyed.
#[inline(never)]
fn refuse(qpn: u32, pkey: u16) {
    quarantine(qpn, true);
    count(Capture::Quarantined);
    report(Event {
        dest_qp: qpn,
        pkey,
        kind: EventKind::Quarantined as u8,
        ..Event::default()
    });
    warn!(
        &(),
        "QP {}: its number is beyond the QP table (its device hands out more QPNs than the attachment sized the table for): quarantined, its frames refused until it is destroyed",
        qpn
    );
}

/// QPN `qpn`'s entry word in generation `g`; none beyond the table.
#[inline(always)]
fn word(g: u32, qpn: u32) -> Option<*mut u64> {
    QPS.get_ptr_mut(qp_index(g, qpn))
}

/// QPN `qpn`'s entry in generation `g`, if any.
#[inline(always)]
fn entry(g: u32, qpn: u32) -> Option<QpEntry> {
    // SAFETY: a live, 8-byte aligned array element.
    QpEntry::from_bits(unsafe { ptr::read_volatile(word(g, qpn)?) })
}

/// Rewrites QPN `qpn`'s entry in generation `g` as `change` says (the
/// entry to store, `Some(None)` to store none; `None` leaves it): one
/// atomic exchange of the word read for the new one. Another writer's
/// word stored in between (the loader's, another CPU's probe's) is never
/// overwritten on the strength of what was read before it: the change is
/// made again on that word, a few times at most.
#[inline(always)]
fn update(g: u32, qpn: u32, change: impl Fn(QpEntry) -> Option<Option<QpEntry>>) {
    let Some(word) = word(g, qpn) else {
        return;
    };
    for _ in 0..UPDATE_TRIES {
        // SAFETY: a live, 8-byte aligned array element.
        let old = unsafe { ptr::read_volatile(word) };
        let Some(new) = QpEntry::from_bits(old).and_then(&change) else {
            return;
        };
        // SAFETY: as above.
        if unsafe { replace(word, old, QpEntry::bits(new)) } {
            return;
        }
    }
}

/// How often [`update`] tries to change an entry other writers keep
/// changing.
const UPDATE_TRIES: u32 = 3;

/// `*word = new` if `*word` is still `old`, as one atomic compare and
/// exchange (BPF_CMPXCHG); whether it was.
///
/// # Safety
/// `word` must point to a live, 8-byte aligned u64 in map memory.
#[inline(always)]
unsafe fn replace(word: *mut u64, old: u64, new: u64) -> bool {
    let found: u64;
    unsafe {
        core::arch::asm!(
            "r0 = cmpxchg_64({word} + 0, r0, {new})",
            word = in(reg) word,
            new = in(reg) new,
            inout("r0") old => found,
            options(nostack),
        )
    };
    found == old
}

/// `*counter += 1` as one BPF atomic; the old value. (core's atomics have
/// no read-modify-write on the BPF target, though the instruction set has.)
///
/// # Safety
/// `counter` must point to a live, 8-byte aligned u64 in map memory.
#[inline(always)]
unsafe fn fetch_add(counter: *mut u64) -> u64 {
    let mut value: u64 = 1;
    unsafe {
        core::arch::asm!(
            "{value} = atomic_fetch_add((u64 *)({counter} + 0), {value})",
            counter = in(reg) counter,
            value = inout(reg) value,
            options(nostack),
        )
    };
    value
}

/// QP `qpn`, made on this tenant's device by another creator (its rule
/// giving `pkey`, 0 if none; process `pid`, 0 for a kernel user): no
/// earlier QP's binding of the number in the live generation `g` is its
/// (one store of the whole word, as [`bind`]'s), and it is quarantined,
/// counted and reported.
#[inline(never)]
fn refuse_foreign(g: u32, qpn: u32, pkey: u16, pid: u32) {
    if let Some(word) = word(g, qpn) {
        // SAFETY: a live, 8-byte aligned array element.
        unsafe { ptr::write_volatile(word, QpEntry::bits(None)) };
    }
    quarantine(qpn, true);
    count(Capture::ForeignDevice);
    // Reported, not logged: a tenant can make such QPs at will, and its
    // reports have a budget.
    report(Event {
        dest_qp: qpn,
        pkey,
        src_qp: pid,
        kind: EventKind::ForeignDevice as u8,
        ..Event::default()
    });
}

/// Whether QPN `qpn` is in quarantine.
#[inline(always)]
fn quarantined(qpn: u32) -> bool {
    let (word, bit) = quarantine_bit(qpn);
    QUARANTINE.get(word).is_some_and(|w| w & bit != 0)
}

/// Puts QPN `qpn` in quarantine (`on`) or takes it out: one atomic bit
/// operation, so that CPUs creating QPs at once lose no bit.
#[inline(always)]
fn quarantine(qpn: u32, on: bool) {
    let (word, bit) = quarantine_bit(qpn);
    let Some(w) = QUARANTINE.get_ptr_mut(word) else {
        return;
    };
    // SAFETY: a live, 8-byte aligned array element, shared between CPUs.
    unsafe {
        if on {
            core::arch::asm!(
                "lock *(u64 *)({w} + 0) |= {bit}",
                w = in(reg) w,
                bit = in(reg) bit,
                options(nostack),
            );
        } else if *w & bit != 0 {
            core::arch::asm!(
                "lock *(u64 *)({w} + 0) &= {mask}",
                w = in(reg) w,
                mask = in(reg) !bit,
                options(nostack),
            );
        }
    }
}

/// The index of generation `g`'s first rule that matches the QP `m`
/// describes; `MAX_RULES` when none does. A loop the kernel runs; and
/// what its body writes is a number the verifier knows nothing of, so that
/// the binding that follows is checked once, not once per rule that could
/// have matched.
#[inline(always)]
fn first_match(g: u32, m: &mut Matching) -> u32 {
    m.rules = g * MAX_RULES;
    m.found = MAX_RULES;
    repeat(MAX_RULES, m);
    m.found
}

/// Per CPU, the QP being bound: who made it (recorded as it is, no copy
/// on the stack, where Linux 6.1 allows 512 bytes to a chain of calls),
/// and what `match_rule` compares each rule with.
#[btf_map]
static SCRATCH: PerCpuArray<Matching, 1> = PerCpuArray::new();

/// What `match_rule` compares each rule with, and the first that matched.
#[repr(C)]
struct Matching {
    creator: Creation,
    /// The generation's first `BIND_RULES` index.
    rules: u32,
    qpn: u32,
    /// A `QpType`.
    transport: u32,
    found: u32,
}

impl Body for Matching {
    /// Rule `i` of the generation: stops at the first that matches.
    /// Unused slots match nothing: no branch on them.
    #[inline(always)]
    fn turn(&mut self, i: u32) -> bool {
        let Some(transport) = QpType::from_repr(self.transport as u8) else {
            return true;
        };
        match BIND_RULES.get(self.rules + i) {
            Some(rule) if rule.matches(&self.creator, self.qpn, transport) => {
                self.found = i;
                true
            }
            Some(_) => false,
            None => true,
        }
    }
}

/// Zeroes QPN `qpn`'s counters: a new QP's counts start at zero wherever
/// its number's last QP had frames counted.
#[inline(always)]
fn zero_stats(qpn: u32) {
    if let Some(stats) = QP_STATS.get_ptr_mut(qpn) {
        // SAFETY: a live array element, which only a new binding of the
        // QPN resets (a frame counted meanwhile is the new QP's).
        unsafe { *stats = QpStats::default() };
    }
}

/// Records in `c` who made QP `qp` (of `enum ib_qp_type` `ib_qp_type`, on
/// device index `device`, for rdma_cm `ports`): the current task,
/// or a kernel user of ib_core (a ULP), by its module's name (`kernel`, as
/// two words; zero for the current task), for which every task field reads
/// as matching nothing. Chosen without a branch (by masks), so that the
/// rules are matched in one verifier state. An unreadable field keeps its
/// "matches nothing" value (u32::MAX is no uid or gid).
#[inline(always)]
fn record(
    c: &mut Creation,
    layout: &QpLayout,
    qp: *const u8,
    ib_qp_type: u32,
    (device, ports): (u32, [u16; 2]),
    kernel: [u64; 2],
) {
    task::current_task(c, layout);
    // A kernel user's QP is no task's: its name is the module's, and it
    // has no cgroup, namespace, process or ids.
    let mask = (u64::from((kernel[0] | kernel[1]) != 0)).wrapping_neg();
    // SAFETY: 16 bytes either way.
    let [t0, t1]: [u64; 2] = unsafe { core::mem::transmute(c.comm) };
    let words = [(t0 & !mask) | kernel[0], (t1 & !mask) | kernel[1]];
    // SAFETY: 16 bytes either way.
    c.comm = unsafe { core::mem::transmute::<[u64; 2], [u8; 16]>(words) };
    for id in c.cgroups.iter_mut() {
        *id &= !mask;
    }
    let m32 = mask as u32;
    c.qp = qp as u64;
    c.netns &= !mask;
    c.pid &= !m32;
    c.uid |= m32;
    c.gid |= m32;
    c.device = device;
    c.ports = ports;
    c.kernel = (mask & 1) as u8;
    c.ib_qp_type = ib_qp_type as u8;
    c._pad = [0; 2];
}
