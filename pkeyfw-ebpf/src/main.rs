//! The pkeyfw programs: InfiniBand partition enforcement for RoCE (XDP
//! ingress, or TC ingress in the network stack) and P_Key stamping of
//! outgoing frames (TC egress), on a host's port or a switch's.
//!
//! Thin by design: they read and write packet bytes and BPF maps, and leave
//! every decision to `pkeyfw_common` (`judge`, `stamp`), the same code the
//! host tests run.
#![no_std]
#![no_main]
#![feature(asm_experimental_arch)]

mod kernel;
mod trace;

use aya_ebpf::{
    EbpfContext as _, Global,
    bindings::{
        __sk_buff, BPF_F_MARK_MANGLED_0, BPF_F_NO_PREALLOC, BPF_NOEXIST, TC_ACT_SHOT,
        TC_ACT_UNSPEC, xdp_action, xdp_md,
    },
    btf_maps::{Array, HashMap, PerCpuArray, RingBuf, Stack},
    helpers::{
        bpf_ktime_get_coarse_ns, bpf_xdp_get_buff_len, bpf_xdp_load_bytes, bpf_xdp_store_bytes,
    },
    macros::{btf_map, classifier, xdp},
    programs::{TcContext, XdpContext},
};
use pkeyfw_common::{
    Capture, Direction, Frame, Outcome, Stamp, Tables,
    abi::{
        BindSpec, Config, DEFAULT_QP_CAPACITY, EVENTS_BYTES, Event, EventBudget, EventKind,
        GENERATIONS, GROUP_CAPACITY, GroupEntry, GroupKey, JoinAction, KERNEL_SLOTS, KernelSlot,
        MAX_RULES, PARTITIONS, QPN_MASK, QUARANTINE_WORDS, QpEntry, QpStats, SWITCH_PORTS,
        SenderLayout, VIOLATION_SLOTS,
        counters::{REASON_SLOTS, reason_slot},
        listed_key, port_entry_flags, port_key_index, qp_key, quarantine_bit, violation_key,
    },
    frame::MAX_OFFSET,
    judge, pkey,
    stamp::{self, Action, Origin, Plan, UDP_CHECK},
    switch,
};

/// The hash maps' flags: entries are allocated as they are made, so that
/// memory follows what is bound rather than the capacity.
const GROWN: usize = BPF_F_NO_PREALLOC as usize;

/// `LAYOUT_VERSION`, written by the loader: what a later pkeyfw checks
/// before it reads these maps through their pins.
#[btf_map]
static ABI: Array<u32, 1> = Array::new();
/// The generation of the policy in force (0 or 1).
#[btf_map]
static ACTIVE: Array<u32, 1> = Array::new();
/// Per generation: default P_Key, unknown-QP rule, monitor flag.
#[btf_map]
static CONFIG: Array<Config, { GENERATIONS as usize }> = Array::new();
/// (generation, QPN) → the receiving QP's type, P_Key, Q_Key, stats slot.
#[btf_map]
static QPS: HashMap<u32, QpEntry, { (GENERATIONS * DEFAULT_QP_CAPACITY) as usize }, GROWN> =
    HashMap::new();
/// (generation, multicast address) → the group's P_Key and Q_Key.
#[btf_map]
static GROUPS: HashMap<GroupKey, GroupEntry, { GROUP_CAPACITY as usize }, GROWN> = HashMap::new();
/// (generation, partition) → which memberships the port's P_Key table
/// holds, under the generation's serial (`port_entry`): QP1 frames and the
/// violation counters look here.
#[btf_map]
static PORT_KEYS: Array<u32, { (GENERATIONS * PARTITIONS) as usize }> = Array::new();
/// Frames per (reason, verdict), per CPU: received (a host port, or a
/// switch port's inbound check) and forwarded out (a switch port's outbound
/// check).
#[btf_map]
static REASONS: PerCpuArray<u64, REASON_SLOTS> = PerCpuArray::new();
#[btf_map]
static XMIT_REASONS: PerCpuArray<u64, REASON_SLOTS> = PerCpuArray::new();
/// Frames passed and dropped per QP-table entry (indexed by its slot).
#[btf_map]
static QP_STATS: Array<QpStats, { (DEFAULT_QP_CAPACITY + KERNEL_SLOTS) as usize }> = Array::new();

/// Frames per stamping outcome, per CPU.
#[btf_map]
static STAMPS: PerCpuArray<u64, { Stamp::COUNT }> = PerCpuArray::new();
/// The probes' counters: written by the probes only, declared here so that
/// they are pinned with the filter.
#[btf_map]
static CAPTURES: PerCpuArray<u64, { Capture::COUNT }> = PerCpuArray::new();
/// Where rdma_rxe keeps a frame's sending QP: set by the loader from BTF.
#[unsafe(no_mangle)]
static SENDER: Global<SenderLayout> = Global::new(SenderLayout::NONE);

/// The `[[bind]]` rules, per generation, that the QP-creation probe
/// matches; the probe's stats slots (QPN → slot, the freed ones, the
/// number ever handed out); the
/// Q_Key each QP's program set: written by the probes and the loader,
/// declared here so that they are pinned with the filter.
#[btf_map]
static BIND_RULES: Array<BindSpec, { (GENERATIONS * MAX_RULES) as usize }> = Array::new();
#[btf_map]
static KSLOTS: HashMap<u32, KernelSlot, { KERNEL_SLOTS as usize }, GROWN> = HashMap::new();
#[btf_map]
static FREE_SLOTS: Stack<u32, { KERNEL_SLOTS as usize }> = Stack::new();
#[btf_map]
static NEXT_SLOT: Array<u64, 1> = Array::new();
#[btf_map]
static QKEYS: HashMap<u32, u32, { KERNEL_SLOTS as usize }, GROWN> = HashMap::new();
/// One bit per QPN: a QP a `[[bind]]` rule would bind that the QP-creation
/// probe had no room for. Always has room (2 MiB for every QPN); a frame
/// to or from such a QP is refused until it is bound or destroyed.
#[btf_map]
static QUARANTINE: Array<u64, { QUARANTINE_WORDS as usize }> = Array::new();

/// (generation, ifindex) of every port a switch port's policy lists: RoCE
/// that entered the switch through any other interface leaves through none
/// of them.
#[btf_map]
static LISTED: HashMap<u64, u8, { (GENERATIONS * SWITCH_PORTS) as usize }, GROWN> = HashMap::new();

/// What the probes do about a foreign multicast join, per generation:
/// theirs, declared here as every map of the filter is (the loader pins
/// them all).
#[btf_map]
static JOIN_ACTION: Array<JoinAction, { GENERATIONS as usize }> = Array::new();

/// P_Key and Q_Key violations per partition (`violation_key`), as an IB
/// port counts them; entries made on first use, updated atomically.
#[btf_map]
static VIOLATIONS: HashMap<u32, u64, { VIOLATION_SLOTS as usize }, GROWN> = HashMap::new();
/// Refused frames, for the CLI's violation lines.
#[btf_map]
static EVENTS: RingBuf<Event, { EVENTS_BYTES as usize }> = RingBuf::new();
/// Per CPU and event kind: events sent in the current window, and those
/// held back.
#[btf_map]
static EVENT_BUDGET: PerCpuArray<EventBudget, { EventKind::COUNT }> = PerCpuArray::new();

/// The policy in force: its generation's maps and settings.
#[inline(always)]
fn policy() -> (Generation, Config) {
    let generation = match ACTIVE.get(0) {
        Some(g) => *g & 1,
        None => 0,
    };
    let config = match CONFIG.get(generation) {
        Some(c) => *c,
        None => Config::default(),
    };
    (
        Generation {
            generation,
            port_serial: config.port_serial,
        },
        config,
    )
}

/// Ingress in the driver (native XDP). Multi-buffer aware (`xdp.frags`), so
/// that it attaches to jumbo-MTU devices: the headers are read from the
/// linear part only, bounded by `data_end`.
#[xdp(frags)]
pub fn pkeyfw(ctx: XdpContext) -> u32 {
    let frame = Packet {
        start: ctx.data(),
        end: ctx.data_end(),
        ctx: ctx.ctx,
    };
    let bytes = XdpBytes(ctx.ctx);
    let pass = enforce(&frame, |plan| bytes.rewrite(plan));
    if trace::on() {
        trace::emit(&frame);
    }
    if pass {
        xdp_action::XDP_PASS
    } else {
        xdp_action::XDP_DROP
    }
}

/// Ingress in the network stack (`--mode skb`): a TC ingress program rather
/// than generic XDP, because it sees a GSO/GRO super-packet as one
/// (`gso_size`), which `judge` refuses: generic XDP would judge only its
/// first segment's BTH and let the UDP stack deliver the others.
#[classifier]
pub fn pkeyfw_ingress(ctx: TcContext) -> i32 {
    let skb = Skb(&ctx);
    let pass = enforce(&skb, |plan| skb.rewrite(plan));
    if trace::on() {
        trace::emit(&skb);
    }
    if pass {
        // TCX_NEXT for tcx, "continue" for a netlink filter.
        TC_ACT_UNSPEC
    } else {
        TC_ACT_SHOT
    }
}

/// Judges an incoming frame, restores a stamped P_Key, counts and reports;
/// returns whether the frame passes.
#[inline(always)]
fn enforce<F: Frame>(frame: &F, rewrite: impl Fn(&Plan) -> Result<(), Stamp>) -> bool {
    let (live, config) = policy();
    if config.switch != 0 {
        return switch_port(frame, &live, &config, Direction::Inbound, rewrite);
    }
    let outcome = judge(frame, &live, &config);
    // After the verdict, which judged the stamped P_Key: the local rxe
    // accepts only 0xFFFF.
    if let Some(restore) = stamp::ingress(frame, &outcome, &config) {
        count_stamp(match restore.and_then(|plan| rewrite(&plan)) {
            Ok(()) => Stamp::Restored,
            Err(why) => why,
        });
    }

    count_reason(&REASONS, &outcome);
    if trace::on() {
        trace::frame(&outcome, None);
    }
    if let Some(slot) = outcome.qp_slot
        && let Some(stats) = QP_STATS.get_ptr_mut(slot)
    {
        // SAFETY: a live array element, shared between CPUs.
        unsafe {
            atomic_inc(if outcome.pass {
                &raw mut (*stats).passed
            } else {
                &raw mut (*stats).dropped
            })
        };
    }
    if !outcome.allowed {
        refused(frame, &live, &outcome, config.monitor != 0, None);
    }
    outcome.pass
}

/// A switch port's check of a frame received on it or forwarded out of it
/// (see `switch`): rewrites, counts and reports; returns whether the frame
/// goes on.
#[inline(always)]
fn switch_port<F: Frame>(
    frame: &F,
    live: &Generation,
    config: &Config,
    direction: Direction,
    rewrite: impl Fn(&Plan) -> Result<(), Stamp>,
) -> bool {
    let Some(action) = switch::judge(frame, live, config, direction) else {
        return true;
    };
    let todo = action.rewrite;
    let outcome = if todo.wanted {
        let (made, why) = match todo.failed {
            true => (false, todo.why),
            false => match rewrite(&todo.plan) {
                Ok(()) => (true, todo.why),
                Err(why) => (false, why),
            },
        };
        action.settle(direction, made, why, count_stamp)
    } else {
        action.outcome
    };
    count_reason(
        match direction {
            Direction::Inbound => &REASONS,
            Direction::Outbound => &XMIT_REASONS,
        },
        &outcome,
    );
    if trace::on() {
        trace::frame(&outcome, Some(direction));
    }
    if !outcome.allowed {
        refused(frame, live, &outcome, config.monitor != 0, Some(direction));
    }
    outcome.pass
}

/// Counts a frame's reason and verdict.
#[inline(always)]
fn count_reason(counters: &PerCpuArray<u64, REASON_SLOTS>, outcome: &Outcome) {
    if let Some(count) = counters.get_ptr_mut(reason_slot(outcome.reason, outcome.verdict())) {
        // SAFETY: a per-CPU slot, written only by this CPU.
        unsafe { *count += 1 };
    }
}

/// Counts a refused frame against its partition and reports it; `port`: the
/// direction a switch port refused it in.
#[inline(always)]
fn refused<F: Frame>(
    frame: &F,
    live: &Generation,
    outcome: &Outcome,
    monitor: bool,
    port: Option<Direction>,
) {
    if let Some(roce) = outcome.roce
        && let Some(key) = violation_key(
            outcome.reason,
            roce.pkey,
            live.port_flags(pkey::key(roce.pkey)) != 0,
        )
    {
        count_violation(key);
    }
    report(frame, outcome, monitor, port);
}

/// Counts a violation of one partition, making its counter on first use.
#[inline(always)]
fn count_violation(key: u32) {
    let count = match VIOLATIONS.get_ptr_mut(&key) {
        Some(count) => Some(count),
        None => {
            // Another CPU may make it first: then this insert fails, harmlessly.
            let _ = VIOLATIONS.insert(&key, &0, BPF_NOEXIST as u64);
            VIOLATIONS.get_ptr_mut(&key)
        }
    };
    if let Some(count) = count {
        // SAFETY: a live map value, shared between CPUs.
        unsafe { atomic_inc(count) };
    }
}

/// Egress: while the active policy stamps, writes the sending QP's bound
/// P_Key into outgoing RoCE v2 frames, the port's default one into frames no
/// bound QP sent, and drops management frames with a key the port does not
/// hold (see `stamp::egress`). On a switch port: the outbound check and an
/// access port's restore (see `switch`).
#[classifier]
pub fn pkeyfw_stamp(ctx: TcContext) -> i32 {
    let action = egress(&ctx);
    if trace::on() {
        trace::emit(&Skb(&ctx));
    }
    action
}

#[inline(always)]
fn egress(ctx: &TcContext) -> i32 {
    let (live, config) = policy();
    let skb = Skb(ctx);
    if config.switch != 0 {
        return if switch_port(&skb, &live, &config, Direction::Outbound, |plan| {
            skb.rewrite(plan)
        }) {
            TC_ACT_UNSPEC
        } else {
            TC_ACT_SHOT
        };
    }
    let counted = match stamp::egress(&skb, &live, &config, || origin(ctx)) {
        None => return TC_ACT_UNSPEC,
        Some(Action::Leave(outcome)) => Ok(outcome),
        Some(Action::Drop(why)) => Err(why),
        Some(Action::Rewrite(plan, done)) => skb.rewrite(&plan).map(|()| done),
    };
    if trace::on() {
        trace::stamp(match counted {
            Ok(outcome) | Err(outcome) => outcome,
        });
    }
    match counted {
        Ok(outcome) => {
            count_stamp(outcome);
            // TCX_NEXT for tcx, "continue" for a netlink filter.
            TC_ACT_UNSPEC
        }
        Err(why) => {
            count_stamp(why);
            TC_ACT_SHOT
        }
    }
}

/// Who sent an outgoing frame: an rdma_rxe QP of this interface only when
/// rxe's own state says so (see `SenderLayout`), never by what the frame
/// names.
#[inline(always)]
fn origin(ctx: &TcContext) -> Origin {
    sender(ctx).map_or(Origin::Other, Origin::Qp)
}

/// The skb's socket, its user data (rxe's QP, for rxe's sockets), that QP's
/// socket, which must be this one, and the QP's device, which must be one
/// of this interface's rxe devices: then the QP's number. Kernel reads, each
/// of which may fail (a null or stale pointer): then no QP sent the frame.
#[inline(always)]
fn sender(ctx: &TcContext) -> Option<u32> {
    let l = SENDER.load();
    if !l.knows_qps() {
        return None;
    }
    // The context is the kernel's `struct sk_buff`.
    let skb = ctx.as_ptr() as *const u8;
    let sk: *const u8 = kernel::read(skb, l.skb_sk)?;
    let qp: *const u8 = kernel::read(sk, l.sk_user_data)?;
    let socket: *const u8 = kernel::read(qp, l.rxe_sk)?;
    if kernel::read::<*const u8>(socket, l.socket_sk)? != sk {
        return None;
    }
    let ibqp = qp.wrapping_add(l.rxe_ibqp as usize);
    let device: *const u8 = kernel::read(ibqp, l.qp_device)?;
    let index: u32 = kernel::read(device, l.device_index)?;
    if !l.devices.contains(&index) {
        return None;
    }
    Some(kernel::read::<u32>(ibqp, l.qp_num)? & QPN_MASK)
}

/// Counts a stamping outcome.
#[inline(always)]
fn count_stamp(outcome: Stamp) {
    if let Some(count) = STAMPS.get_ptr_mut(outcome.index()) {
        // SAFETY: a per-CPU slot, written only by this CPU.
        unsafe { *count += 1 };
    }
}

/// Sends an event for a refused frame, within this CPU's budget.
#[inline(always)]
fn report<F: Frame>(frame: &F, outcome: &Outcome, monitor: bool, port: Option<Direction>) {
    let kind = match port {
        Some(_) => EventKind::SwitchPort,
        None => EventKind::Frame,
    };
    let Some(budget) = EVENT_BUDGET.get_ptr_mut(kind.index()) else {
        return;
    };
    // SAFETY: this CPU's slot; nothing else writes it.
    let budget = unsafe { &mut *budget };
    // The coarse clock (tick resolution) is plenty for a ~1 s window and
    // costs a fraction of bpf_ktime_get_ns on every refused frame.
    // SAFETY: no preconditions.
    if !budget.spend(unsafe { bpf_ktime_get_coarse_ns() }) {
        return;
    }
    let mut event = Event {
        reason: outcome.reason as u8,
        monitor: monitor.into(),
        verdict: outcome.verdict() as u8,
        kind: kind as u8,
        ..Event::default()
    };
    if let Some(direction) = port {
        event.direction = direction as u8;
    }
    if let Some(roce) = outcome.roce {
        event.src = roce.addrs.read(frame, false).unwrap_or_default();
        event.dst = roce.addrs.read(frame, true).unwrap_or_default();
        event.qkey = roce.qkey;
        event.src_qp = roce.src_qp;
        event.dest_qp = roce.dest_qp;
        event.pkey = roce.pkey;
        event.opcode = roce.opcode;
    }
    // A full ring only loses the line; the counters still have the frame.
    let _ = EVENTS.output(&event, 0);
}

/// `lock *(u64 *)counter += 1`: a BPF atomic add. core's `AtomicU64` has no
/// read-modify-write on the BPF target, though the instruction set does.
///
/// # Safety
/// `counter` must point to a live, 8-byte aligned u64 in map memory.
#[inline(always)]
unsafe fn atomic_inc(counter: *mut u64) {
    unsafe {
        core::arch::asm!(
            "lock *(u64 *)({counter} + 0) += {one}",
            counter = in(reg) counter,
            one = in(reg) 1u64,
            options(nostack),
        )
    };
}

/// Packet memory between `data` and `data_end`: the linear part of the
/// frame, which holds the headers.
struct Packet {
    start: usize,
    end: usize,
    ctx: *mut xdp_md,
}

impl Frame for Packet {
    #[inline(always)]
    fn header<T: Copy>(&self, off: usize) -> Option<T> {
        // The explicit bound on `off` is what the verifier needs to accept a
        // variable-offset packet pointer.
        if off > MAX_OFFSET {
            return None;
        }
        let at = self.start + off;
        if at + size_of::<T>() > self.end {
            return None;
        }
        // SAFETY: within [data, data_end); header types are plain bytes.
        Some(unsafe { load_packet(at) })
    }

    /// The linear part and any fragments (a multi-buffer frame).
    #[inline(always)]
    fn wire_len(&self) -> usize {
        // SAFETY: a live XDP context.
        unsafe { bpf_xdp_get_buff_len(self.ctx) as usize }
    }
}

/// Copies a `T` out of packet memory at `at` in the widest loads that fit
/// (8, 4, 2, then 1 bytes). Header types are byte arrays, so a plain read
/// is compiled byte by byte, a load and a shift or two per byte: these
/// loads are written out because the verifier takes a misaligned packet
/// read where the CPU does it efficiently (x86-64, arm64), while LLVM's
/// misaligned-access mode would also misalign stack slots, which it
/// refuses. The copy lands in an 8-aligned buffer, so that the fields are
/// then read from it whole.
///
/// # Safety
/// `[at, at + size_of::<T>())` must be packet memory the verifier has seen
/// bounded, and `T` valid for any bytes.
#[inline(always)]
unsafe fn load_packet<T: Copy>(at: usize) -> T {
    #[repr(C, align(8))]
    struct Aligned<T>(core::mem::MaybeUninit<T>);
    let mut buf = Aligned(core::mem::MaybeUninit::<T>::uninit());
    let dst = buf.0.as_mut_ptr().cast::<u8>();
    let mut done = 0;
    macro_rules! chunk {
        ($ty:ty, $insn:literal) => {
            let v: $ty;
            // SAFETY: within the bounded range (the caller's promise); the
            // store is aligned: `done` is a multiple of the chunk's size.
            unsafe {
                core::arch::asm!(
                    $insn,
                    v = out(reg) v,
                    p = in(reg) at + done,
                    options(pure, readonly, nostack),
                );
                dst.add(done).cast::<$ty>().write(v);
            }
            done += size_of::<$ty>();
        };
    }
    while done + 8 <= size_of::<T>() {
        chunk!(u64, "{v} = *(u64 *)({p} + 0)");
    }
    if done + 4 <= size_of::<T>() {
        chunk!(u32, "{v} = *(u32 *)({p} + 0)");
    }
    if done + 2 <= size_of::<T>() {
        chunk!(u16, "{v} = *(u16 *)({p} + 0)");
    }
    if done < size_of::<T>() {
        chunk!(u8, "{v} = *(u8 *)({p} + 0)");
    }
    let _ = done;
    // SAFETY: every byte written above; T is valid for any bytes.
    unsafe { buf.0.assume_init() }
}

/// Rewrites XDP packet bytes through the helpers (Linux 5.18+), whose
/// offsets need no verifier-visible bound.
struct XdpBytes(*mut xdp_md);

impl XdpBytes {
    #[inline(always)]
    fn load<const N: usize>(&self, off: usize) -> Result<[u8; N], Stamp> {
        let mut bytes = [0u8; N];
        // SAFETY: a live XDP context and a buffer of N bytes.
        let rc =
            unsafe { bpf_xdp_load_bytes(self.0, off as u32, bytes.as_mut_ptr().cast(), N as u32) };
        if rc == 0 {
            Ok(bytes)
        } else {
            Err(Stamp::HelperFailed)
        }
    }

    #[inline(always)]
    fn store<const N: usize>(&self, off: usize, mut bytes: [u8; N]) -> Result<(), Stamp> {
        // SAFETY: a live XDP context and a buffer of N bytes.
        let rc =
            unsafe { bpf_xdp_store_bytes(self.0, off as u32, bytes.as_mut_ptr().cast(), N as u32) };
        if rc == 0 {
            Ok(())
        } else {
            Err(Stamp::HelperFailed)
        }
    }

    /// Applies `plan`: P_Key, ICRC, UDP checksum.
    #[inline(always)]
    fn rewrite(&self, plan: &Plan) -> Result<(), Stamp> {
        let check_at = plan.udp_at + UDP_CHECK;
        let patch = plan
            .patch(self.load(plan.icrc_at)?, self.load(check_at)?)
            .ok_or(Stamp::TooLong)?;
        self.store(plan.pkey_at, patch.pkey)?;
        self.store(plan.icrc_at, patch.icrc)?;
        self.store(check_at, patch.check)
    }
}

/// A socket buffer, read and written through the skb helpers, which also
/// reach the paged part of a non-linear skb.
struct Skb<'a>(&'a TcContext);

impl Frame for Skb<'_> {
    #[inline(always)]
    fn header<T: Copy>(&self, off: usize) -> Option<T> {
        if off > MAX_OFFSET {
            return None;
        }
        self.0.load::<T>(off).ok()
    }

    #[inline(always)]
    fn wire_len(&self) -> usize {
        self.0.len() as usize
    }

    #[inline(always)]
    fn gso_size(&self) -> u32 {
        // SAFETY: a live __sk_buff; gso_size is readable by TC programs.
        unsafe { (*self.0.as_ptr().cast::<__sk_buff>()).gso_size }
    }

    #[inline(always)]
    fn stripped_vlan_tags(&self) -> usize {
        // SAFETY: a live __sk_buff; vlan_present is readable by TC programs.
        unsafe { (*self.0.as_ptr().cast::<__sk_buff>()).vlan_present as usize }
    }

    #[inline(always)]
    fn ingress_ifindex(&self) -> u32 {
        // SAFETY: a live __sk_buff; ingress_ifindex is readable by TC programs.
        unsafe { (*self.0.as_ptr().cast::<__sk_buff>()).ingress_ifindex }
    }
}

impl Skb<'_> {
    /// Applies `plan`: P_Key and ICRC stored, the UDP checksum updated by the
    /// kernel, which leaves a CHECKSUM_PARTIAL one (still to be computed) and
    /// a zero one (none) alone.
    #[inline(always)]
    fn rewrite(&self, plan: &Plan) -> Result<(), Stamp> {
        let ctx = self.0;
        let icrc = ctx
            .load::<[u8; 4]>(plan.icrc_at)
            .map_err(|_| Stamp::HelperFailed)?;
        let check = ctx
            .load::<[u8; 2]>(plan.udp_at + UDP_CHECK)
            .map_err(|_| Stamp::HelperFailed)?;
        let patch = plan.patch(icrc, check).ok_or(Stamp::TooLong)?;
        // Size 0: `to` is a difference of sums, in the kernel's (memory-order)
        // view of the checksum words.
        let diff = u16::from_ne_bytes(patch.check_diff.to_be_bytes());
        ctx.store(plan.pkey_at, &patch.pkey, 0)
            .and_then(|()| ctx.store(plan.icrc_at, &patch.icrc, 0))
            .and_then(|()| {
                ctx.l4_csum_replace(
                    plan.udp_at + UDP_CHECK,
                    0,
                    u64::from(diff),
                    BPF_F_MARK_MANGLED_0 as u64,
                )
            })
            .map_err(|_| Stamp::HelperFailed)
    }
}

/// The maps of one policy generation: what the verdict reads.
struct Generation {
    generation: u32,
    /// Its `PORT_KEYS` entries' serial.
    port_serial: u32,
}

impl Tables for Generation {
    #[inline(always)]
    fn qp(&self, qpn: u32) -> Option<QpEntry> {
        // SAFETY: the value is copied out at once.
        unsafe { QPS.get(&qp_key(self.generation, qpn)).copied() }
    }

    #[inline(always)]
    fn group(&self, addr: &[u8; 16]) -> Option<GroupEntry> {
        let key = GroupKey {
            generation: self.generation,
            addr: *addr,
        };
        // SAFETY: the value is copied out at once.
        unsafe { GROUPS.get(&key).copied() }
    }

    #[inline(always)]
    fn port_flags(&self, key: u16) -> u8 {
        PORT_KEYS
            .get(port_key_index(self.generation, key))
            .map_or(0, |&entry| port_entry_flags(entry, self.port_serial))
    }

    #[inline(always)]
    fn quarantined(&self, qpn: u32) -> bool {
        let (word, bit) = quarantine_bit(qpn);
        QUARANTINE.get(word).is_some_and(|w| w & bit != 0)
    }

    #[inline(always)]
    fn listed(&self, ifindex: u32) -> bool {
        // SAFETY: only whether the entry exists is read.
        unsafe { LISTED.get(&listed_key(self.generation, ifindex)).is_some() }
    }
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
