//! The pkeyfw XDP program: InfiniBand partition enforcement for RoCE.
//!
//! Thin by design: it reads packet memory and BPF maps, and leaves every
//! decision to `pkeyfw_common::judge`, the same code the host tests run.
#![no_std]
#![no_main]
#![feature(asm_experimental_arch)]

use aya_ebpf::{
    bindings::xdp_action,
    btf_maps::{Array, HashMap, PerCpuArray, RingBuf},
    helpers::bpf_ktime_get_coarse_ns,
    macros::{btf_map, xdp},
    programs::XdpContext,
};
use pkeyfw_common::{
    Frame, Outcome, Reason, Tables,
    frame::MAX_OFFSET,
    judge,
    maps::{
        Config, DEFAULT_QP_CAPACITY, EVENT_WINDOW_SHIFT, EVENTS_BYTES, EVENTS_PER_WINDOW, Event,
        EventBudget, GENERATIONS, GROUP_CAPACITY, GroupEntry, GroupKey, PARTITIONS, QpEntry,
        QpStats, port_key_index, qp_key,
    },
};

/// The generation of the policy in force (0 or 1).
#[btf_map]
static ACTIVE: Array<u32, 1> = Array::new();
/// Per generation: default P_Key, unknown-QP rule, monitor flag.
#[btf_map]
static CONFIG: Array<Config, { GENERATIONS as usize }> = Array::new();
/// (generation, QPN) → the receiving QP's type, P_Key, Q_Key, stats slot.
#[btf_map]
static QPS: HashMap<u32, QpEntry, { (GENERATIONS * DEFAULT_QP_CAPACITY) as usize }> =
    HashMap::new();
/// (generation, multicast address) → the group's P_Key and Q_Key.
#[btf_map]
static GROUPS: HashMap<GroupKey, GroupEntry, { GROUP_CAPACITY as usize }> = HashMap::new();
/// (generation, partition) → which memberships the port's P_Key table holds.
/// Only QP1 frames look here; a hash keeps a generation cheap to clear.
#[btf_map]
static PORT_KEYS: HashMap<u32, u8, { (GENERATIONS * PARTITIONS) as usize }> = HashMap::new();
/// Frames per reason, per CPU.
#[btf_map]
static REASONS: PerCpuArray<u64, { Reason::COUNT }> = PerCpuArray::new();
/// Frames passed and dropped per QP-table entry (indexed by its slot).
#[btf_map]
static QP_STATS: Array<QpStats, { DEFAULT_QP_CAPACITY as usize }> = Array::new();

/// Refused frames, for the CLI's violation lines.
#[btf_map]
static EVENTS: RingBuf<Event, { EVENTS_BYTES as usize }> = RingBuf::new();
/// Per CPU: events sent in the current window.
#[btf_map]
static EVENT_BUDGET: PerCpuArray<EventBudget, 1> = PerCpuArray::new();

#[xdp]
pub fn pkeyfw(ctx: XdpContext) -> u32 {
    let generation = match ACTIVE.get(0) {
        Some(g) => *g & 1,
        None => 0,
    };
    let config = match CONFIG.get(generation) {
        Some(c) => *c,
        None => Config::default(),
    };
    let frame = Packet {
        start: ctx.data(),
        end: ctx.data_end(),
    };
    let outcome = judge(&frame, &Maps { generation }, &config);

    if let Some(count) = REASONS.get_ptr_mut(outcome.reason.index()) {
        // SAFETY: a per-CPU slot, written only by this CPU.
        unsafe { *count += 1 };
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
        report(&frame, &outcome, config.monitor != 0);
    }
    if outcome.pass {
        xdp_action::XDP_PASS
    } else {
        xdp_action::XDP_DROP
    }
}

/// An empty XDP_PASS program: the benchmark's baseline.
#[xdp]
pub fn pkeyfw_empty(_ctx: XdpContext) -> u32 {
    xdp_action::XDP_PASS
}

/// Sends an event for a refused frame, within this CPU's budget.
#[inline(always)]
fn report(frame: &Packet, outcome: &Outcome, monitor: bool) {
    let Some(budget) = EVENT_BUDGET.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: this CPU's slot; nothing else writes it.
    let budget = unsafe { &mut *budget };
    // The coarse clock (tick resolution) is plenty for a ~1 s window and
    // costs a fraction of bpf_ktime_get_ns on every refused frame.
    // SAFETY: no preconditions.
    let window = unsafe { bpf_ktime_get_coarse_ns() } >> EVENT_WINDOW_SHIFT;
    if budget.window != window {
        budget.window = window;
        budget.sent = 0;
    }
    if budget.sent >= EVENTS_PER_WINDOW as u64 {
        return;
    }
    budget.sent += 1;
    let mut event = Event {
        reason: outcome.reason as u8,
        monitor: monitor.into(),
        ..Event::default()
    };
    if let Some(roce) = outcome.roce {
        event.src = roce.addrs.read(frame, false).unwrap_or_default();
        event.dst = roce.addrs.read(frame, true).unwrap_or_default();
        event.qkey = roce.qkey;
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

/// Packet memory between `data` and `data_end`.
struct Packet {
    start: usize,
    end: usize,
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
        Some(unsafe { core::ptr::read_unaligned(at as *const T) })
    }
}

/// The maps of one policy generation.
struct Maps {
    generation: u32,
}

impl Tables for Maps {
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
        // SAFETY: the value is copied out at once.
        unsafe { PORT_KEYS.get(&port_key_index(self.generation, key)) }
            .copied()
            .unwrap_or(0)
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
