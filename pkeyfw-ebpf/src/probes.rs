//! Probes on the kernel's RDMA core for a foreground `pkeyfw attach`. They
//! read the verbs' arguments and leave every decision to
//! `pkeyfw_common::capture`.
//!
//! - `pkeyfw_qp_created` wakes the attachment the moment a QP is created,
//!   so that `[[bind]]` rules bind it before its peer learns its number
//!   (a return probe on ib_create_qp_user and ib_create_qp_kernel: when they
//!   return, the QP is in the restrack table that RDMA netlink reads).
//! - `pkeyfw_modify` / `pkeyfw_modified` record a bound QP's peer when a
//!   modify that gives it one (ib_modify_qp_with_udata with a destination
//!   QPN) succeeds, so the stamping program knows the QP's first frame: a
//!   program sends right after that call returns, far sooner than userspace
//!   could read the connection from RDMA netlink. The entry probe keeps the
//!   arguments per thread, the return probe acts on the result.
//! - `pkeyfw_qp_created` also tags an rdma_rxe QP's kernel socket with its
//!   QPN (`SOCKETS`), so that stamping knows the sender of every frame of a
//!   QP created while the probes run, whatever the frame names.
//! - `pkeyfw_destroy` forgets a destroyed QP's peer and socket.
//! - `pkeyfw_join` / `pkeyfw_joined` report a QP that joins a multicast
//!   group of another partition (ib_attach_mcast).
#![no_std]
#![no_main]

use aya_ebpf::{
    Global,
    bindings::BPF_RB_FORCE_WAKEUP,
    btf_maps::{Array, HashMap, LruHashMap, PerCpuArray, RingBuf},
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_kernel},
    macros::{btf_map, kprobe, kretprobe},
    programs::{ProbeContext, RetProbeContext},
};
use pkeyfw_common::{
    Capture,
    abi::{
        DEFAULT_QP_CAPACITY, EVENTS_BYTES, Event, EventBudget, EventKind, GENERATIONS,
        GROUP_CAPACITY, GroupEntry, GroupKey, QPN_MASK, QpEntry, QpLayout, qp_key,
    },
    capture::{self, PeerKey, Peers},
};

/// The creating process's PID, per QP created.
#[btf_map]
static QP_CREATED: RingBuf<u32, 4096> = RingBuf::new();

/// A verb's arguments, between its entry and its return, per thread. LRU,
/// so that entries whose return was missed give way.
#[btf_map]
static PENDING: LruHashMap<u64, Pending, 4096> = LruHashMap::new();

/// The filter's maps, shared through their pins (same definitions as in
/// the filter object; the loader sets the real sizes).
#[btf_map]
static ACTIVE: Array<u32, 1> = Array::new();
#[btf_map]
static QPS: HashMap<u32, QpEntry, { (GENERATIONS * DEFAULT_QP_CAPACITY) as usize }> =
    HashMap::new();
#[btf_map]
static GROUPS: HashMap<GroupKey, GroupEntry, { GROUP_CAPACITY as usize }> = HashMap::new();
#[btf_map]
static PEERS: HashMap<PeerKey, u32, { DEFAULT_QP_CAPACITY as usize }> = HashMap::new();
#[btf_map]
static OWNERS: HashMap<u32, PeerKey, { DEFAULT_QP_CAPACITY as usize }> = HashMap::new();
#[btf_map]
static CAPTURES: PerCpuArray<u64, { Capture::COUNT }> = PerCpuArray::new();
#[btf_map]
static SOCKETS: HashMap<u64, u32, { DEFAULT_QP_CAPACITY as usize }> = HashMap::new();
#[btf_map]
static EVENTS: RingBuf<Event, { EVENTS_BYTES as usize }> = RingBuf::new();
#[btf_map]
static EVENT_BUDGET: PerCpuArray<EventBudget, 1> = PerCpuArray::new();

/// Set by the loader from the kernel's BTF.
#[unsafe(no_mangle)]
static LAYOUT: Global<QpLayout> = Global::new(QpLayout {
    qp_device: 0,
    qp_num: 0,
    device_index: 0,
    attr_dest_qp_num: 0,
    attr_dgid: 0,
    devices: [QpLayout::NO_DEVICE; QpLayout::DEVICES],
    rxe_devices: 0,
    rxe_qp_sk: 0,
    socket_sk: 0,
});

/// What a verb's entry probe keeps for its return probe.
#[repr(C)]
#[derive(Copy, Clone)]
struct Pending {
    /// Which verb: [`CONNECT`] or [`JOIN`], so that a return never acts on
    /// another verb's arguments.
    verb: u32,
    qpn: u32,
    /// The peer (connect), or the group's GID in `addr` (join).
    peer: PeerKey,
}

const CONNECT: u32 = 1;
const JOIN: u32 = 2;

/// ib_modify_qp_with_udata(qp, attr, attr_mask, udata): a destination QPN
/// for a QP of ours is kept until the call returns. The GID of a RoCE v2
/// IPv4 peer is its v4-mapped address, the key stamping looks up; without
/// an address vector in the call, the peer's address is unknown (zeros).
#[kprobe]
pub fn pkeyfw_modify(ctx: ProbeContext) -> u32 {
    let _ = modify(&ctx);
    0
}

fn modify(ctx: &ProbeContext) -> Option<()> {
    // Whatever this call is, a return this thread's last call left (its
    // return probe missed) must not be taken for this one's.
    let _ = PENDING.remove(&bpf_get_current_pid_tgid());
    let mask: u32 = ctx.arg(2)?;
    if mask & QpLayout::MASK_DEST_QPN == 0 {
        return None;
    }
    let layout = LAYOUT.load();
    let (qpn, _) = our_qp(&layout, ctx.arg(0)?)?;
    let attr: *const u8 = ctx.arg(1)?;
    let remote: u32 = read(attr, layout.attr_dest_qp_num)?;
    let addr = if mask & QpLayout::MASK_AV != 0 {
        read(attr, layout.attr_dgid)?
    } else {
        [0; 16]
    };
    let peer = PeerKey {
        remote_qpn: remote & QPN_MASK,
        addr,
    };
    keep(CONNECT, qpn, peer)
}

#[kretprobe]
pub fn pkeyfw_modified(ctx: RetProbeContext) -> u32 {
    if let Some(p) = take(CONNECT) {
        let ok = ctx.ret::<i32>() == 0;
        count(capture::connected(&mut Live::now(), p.qpn, &p.peer, ok));
    }
    0
}

/// ib_destroy_qp_user(qp, udata): the QP's peer and its socket's tag go
/// with it (on entry: a failed destroy only leaves the QP's frames
/// unattributed, stamped with the port's default P_Key).
#[kprobe]
pub fn pkeyfw_destroy(ctx: ProbeContext) -> u32 {
    let layout = LAYOUT.load();
    let Some(qp) = ctx.arg::<*const u8>(0) else {
        return 0;
    };
    let Some((qpn, slot)) = our_qp(&layout, qp) else {
        return 0;
    };
    if let Some(sk) = qp_socket(&layout, qp, slot)
        // SAFETY: the value is copied out at once.
        && unsafe { SOCKETS.get(&sk) }.copied() == Some(qpn)
    {
        let _ = SOCKETS.remove(&sk);
    }
    if let Some(outcome) = capture::destroyed(&mut Live::now(), qpn) {
        count(outcome);
    }
    0
}

/// ib_attach_mcast(qp, gid, lid).
#[kprobe]
pub fn pkeyfw_join(ctx: ProbeContext) -> u32 {
    let _ = join(&ctx);
    0
}

fn join(ctx: &ProbeContext) -> Option<()> {
    let _ = PENDING.remove(&bpf_get_current_pid_tgid());
    let layout = LAYOUT.load();
    let (qpn, _) = our_qp(&layout, ctx.arg(0)?)?;
    let addr: [u8; 16] = read(ctx.arg(1)?, 0)?;
    keep(
        JOIN,
        qpn,
        PeerKey {
            remote_qpn: 0,
            addr,
        },
    )
}

#[kretprobe]
pub fn pkeyfw_joined(ctx: RetProbeContext) -> u32 {
    let Some(p) = take(JOIN) else {
        return 0;
    };
    if ctx.ret::<i32>() != 0 {
        return 0;
    }
    let live = Live::now();
    let qp = live.bound(p.qpn);
    let key = GroupKey {
        generation: live.generation,
        addr: p.peer.addr,
    };
    // SAFETY: the value is copied out at once.
    let Some(group) = unsafe { GROUPS.get(&key) }.map(|g| g.pkey) else {
        count(capture::joined(qp, None));
        return 0;
    };
    let outcome = capture::joined(qp, Some(group));
    count(outcome);
    if outcome == Capture::ForeignJoin {
        report_join(p.qpn, qp.map_or(0, |q| q.pkey), &p.peer.addr, group);
    }
    0
}

/// A foreign join as an event, within this CPU's budget (shared with the
/// filter's refused frames).
#[inline(always)]
fn report_join(qpn: u32, pkey: u16, group: &[u8; 16], group_pkey: u16) {
    let Some(budget) = EVENT_BUDGET.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: this CPU's slot, and no preconditions for the clock
    // (the coarse clock is not offered to probes).
    if !unsafe { (*budget).spend(bpf_ktime_get_ns()) } {
        return;
    }
    let event = Event {
        dst: *group,
        dest_qp: qpn,
        pkey,
        qkey: group_pkey.into(),
        kind: EventKind::ForeignJoin as u8,
        ..Event::default()
    };
    let _ = EVENTS.output(&event, 0);
}

/// The QPN of `qp`, and its device's slot in the layout, if it is on one
/// of the attachment's RDMA devices.
#[inline(always)]
fn our_qp(layout: &QpLayout, qp: *const u8) -> Option<(u32, usize)> {
    let device: *const u8 = read(qp, layout.qp_device)?;
    let index: u32 = read(device, layout.device_index)?;
    let slot = layout.devices.iter().position(|&d| d == index)?;
    let qpn = read::<u32>(qp, layout.qp_num)? & QPN_MASK;
    Some((qpn, slot))
}

/// The address of the `struct sock` an rxe QP sends through (`skb->sk` of
/// its frames), if its device is rdma_rxe and the layout knows where.
#[inline(always)]
fn qp_socket(layout: &QpLayout, qp: *const u8, slot: usize) -> Option<u64> {
    if layout.rxe_qp_sk == 0 || layout.rxe_devices & (1 << slot) == 0 {
        return None;
    }
    let socket: *const u8 = read(qp, layout.rxe_qp_sk)?;
    read(socket, layout.socket_sk)
}

fn keep(verb: u32, qpn: u32, peer: PeerKey) -> Option<()> {
    let p = Pending { verb, qpn, peer };
    PENDING.insert(&bpf_get_current_pid_tgid(), &p, 0).ok()
}

fn take(verb: u32) -> Option<Pending> {
    let id = bpf_get_current_pid_tgid();
    // SAFETY: the value is copied out at once.
    let p = unsafe { PENDING.get(&id) }.copied()?;
    let _ = PENDING.remove(&id);
    (p.verb == verb).then_some(p)
}

fn count(outcome: Capture) {
    if let Some(c) = CAPTURES.get_ptr_mut(outcome.index()) {
        // SAFETY: a per-CPU slot, written only by this CPU.
        unsafe { *c += 1 };
    }
}

/// `PEERS`, `OWNERS` and the live generation's QP table.
struct Live {
    generation: u32,
}

impl Live {
    fn now() -> Live {
        Live {
            generation: ACTIVE.get(0).map_or(0, |g| *g & 1),
        }
    }
}

impl Peers for Live {
    fn owner(&self, peer: &PeerKey) -> Option<u32> {
        // SAFETY: the value is copied out at once.
        unsafe { PEERS.get(peer) }.copied()
    }

    fn peer_of(&self, qpn: u32) -> Option<PeerKey> {
        // SAFETY: the value is copied out at once.
        unsafe { OWNERS.get(&qpn) }.copied()
    }

    fn bound(&self, qpn: u32) -> Option<QpEntry> {
        // SAFETY: the value is copied out at once.
        unsafe { QPS.get(&qp_key(self.generation, qpn)) }.copied()
    }

    fn record(&mut self, qpn: u32, peer: &PeerKey) -> bool {
        if OWNERS.insert(&qpn, peer, 0).is_err() {
            return false;
        }
        if PEERS.insert(peer, &qpn, 0).is_err() {
            let _ = OWNERS.remove(&qpn);
            return false;
        }
        true
    }

    fn forget(&mut self, qpn: u32, peer: &PeerKey) {
        let _ = OWNERS.remove(&qpn);
        if self.owner(peer) == Some(qpn) {
            let _ = PEERS.remove(peer);
        }
    }
}

/// A `T` at `base + offset` in kernel memory.
#[inline(always)]
fn read<T>(base: *const u8, offset: u32) -> Option<T> {
    // SAFETY: bpf_probe_read_kernel checks the address.
    unsafe { bpf_probe_read_kernel(base.wrapping_add(offset as usize).cast::<T>()) }.ok()
}

/// ib_create_qp_user / ib_create_qp_kernel returned: an rxe QP's socket is
/// tagged with its QPN before the QP can send, so that the egress program
/// knows which QP sent a frame from the socket alone; then userspace is
/// woken to bind the QP.
#[kretprobe]
pub fn pkeyfw_qp_created(ctx: RetProbeContext) -> u32 {
    let layout = LAYOUT.load();
    let qp: *const u8 = ctx.ret();
    // An error pointer is no QP: reading through it fails.
    if let Some((qpn, slot)) = our_qp(&layout, qp)
        && let Some(sk) = qp_socket(&layout, qp, slot)
    {
        // Full: the QP's frames fall back to attribution by what they name.
        let _ = SOCKETS.insert(&sk, &qpn, 0);
    }
    let pid = (bpf_get_current_pid_tgid() >> 32) as u32;
    // A full ring already holds a wake-up; losing this one changes nothing.
    let _ = QP_CREATED.output(&pid, BPF_RB_FORCE_WAKEUP as u64);
    0
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
