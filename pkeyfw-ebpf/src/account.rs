//! What the programs count and report: frames per reason and verdict,
//! stamping outcomes, per-QP frames, violations per partition, and events
//! for refused frames within each CPU's budget.

use aya_ebpf::{
    btf_maps::PerCpuArray,
    helpers::{bpf_jiffies64, bpf_ktime_get_coarse_ns, bpf_ktime_get_ns},
};
use pkeyfw_common::{
    Direction, Frame, Outcome, Stamp,
    abi::{
        Event, EventKind,
        counters::{REASON_SLOTS, reason_slot},
        violation_key,
    },
    parse::Roce,
    pkey,
};

use crate::{
    maps::{EVENT_BUDGET, EVENTS, Generation, QP_STATS, STAMPS, VIOLATIONS},
    setup,
};
use pkeyfw_common::Tables as _;

/// Counts a frame's reason and verdict.
#[inline(always)]
pub fn reason(counters: &PerCpuArray<u64, REASON_SLOTS>, outcome: &Outcome) {
    if let Some(count) = counters.get_ptr_mut(reason_slot(outcome.reason, outcome.verdict())) {
        // SAFETY: a per-CPU slot, written only by this CPU.
        unsafe { *count += 1 };
    }
}

/// Counts a frame against the QP-table entry that judged it (its QPN's
/// counters, which every CPU adds to atomically).
#[inline(always)]
pub fn qp(outcome: &Outcome) {
    // NO_QP is beyond every table: then no entry judged it.
    if let Some(stats) = QP_STATS.get_ptr_mut(outcome.qp) {
        // SAFETY: live, 8-byte aligned array elements.
        unsafe {
            atomic_inc(if outcome.pass {
                &raw mut (*stats).passed
            } else {
                &raw mut (*stats).dropped
            })
        };
    }
}

/// Counts a stamping outcome.
#[inline(always)]
pub fn stamp(outcome: Stamp) {
    if let Some(count) = STAMPS.get_ptr_mut(outcome.index()) {
        // SAFETY: a per-CPU slot, written only by this CPU.
        unsafe { *count += 1 };
    }
}

/// Counts what came of a restore (a `Stamp`, as a restore stage returns it).
#[inline(always)]
pub fn restored(outcome: u32) {
    stamp(Stamp::from_repr(outcome).unwrap_or(Stamp::HelperFailed));
}

/// Counts a refused frame against its partition and reports it; `roce`:
/// its RoCE headers, if it has them (passed apart from the outcome, whose
/// `roce` this leaves alone: an `Option<Roce>` that is `None` on some
/// paths leaves stack the compiler never wrote, which kernels before 6.4
/// refuse to read); `port`: the direction a switch port refused it in.
#[inline(always)]
pub fn refused<F: Frame>(
    frame: &F,
    live: &Generation,
    outcome: &Outcome,
    roce: Option<&Roce>,
    monitor: bool,
    port: Option<Direction>,
) {
    if refusal(live, outcome, roce, port) {
        report(frame, outcome, roce, monitor, port);
    }
}

/// Counts a refused frame against its partition and spends its event on
/// this CPU's budget: whether its event is to be sent ([`report`]). All a
/// flood of refused frames costs, once the budget is spent.
#[inline(always)]
pub fn refusal(
    live: &Generation,
    outcome: &Outcome,
    roce: Option<&Roce>,
    port: Option<Direction>,
) -> bool {
    if let Some(roce) = roce
        && let Some(key) = violation_key(
            outcome.reason,
            roce.pkey(),
            live.port_flags(pkey::key(roce.pkey())) != 0,
        )
    {
        violation(key);
    }
    let Some(budget) = EVENT_BUDGET.get_ptr_mut(event_kind(port).index()) else {
        return false;
    };
    // SAFETY: this CPU's slot; nothing else writes it.
    let budget = unsafe { &mut *budget };
    // The coarse clock (tick resolution) is plenty for a ~1 s window and
    // costs a fraction of bpf_ktime_get_ns; kernels before 5.11 have only
    // the precise one. The jiffy count, inlined by the kernel, says when to
    // read it.
    let clock = || {
        // SAFETY (both): no preconditions.
        if setup!(coarse_clock) != 0 {
            unsafe { bpf_ktime_get_coarse_ns() }
        } else {
            unsafe { bpf_ktime_get_ns() }
        }
    };
    // SAFETY: no preconditions.
    budget.spend(unsafe { bpf_jiffies64() }, clock)
}

/// The kind of event a refused frame makes.
#[inline(always)]
fn event_kind(port: Option<Direction>) -> EventKind {
    match port {
        Some(_) => EventKind::SwitchPort,
        None => EventKind::Frame,
    }
}

/// Counts a violation of one partition.
#[inline(always)]
fn violation(key: u32) {
    if let Some(count) = VIOLATIONS.get_ptr_mut(key) {
        // SAFETY: a live array element, shared between CPUs.
        unsafe { atomic_inc(count) };
    }
}

/// Sends the event of a refused frame that [`refusal`] counted.
#[inline(always)]
pub fn report<F: Frame>(
    frame: &F,
    outcome: &Outcome,
    roce: Option<&Roce>,
    monitor: bool,
    port: Option<Direction>,
) {
    let kind = event_kind(port);
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
    if let Some(roce) = roce {
        event.src = roce.addrs().read(frame, false).unwrap_or_default();
        event.dst = roce.addrs().read(frame, true).unwrap_or_default();
        event.qkey = roce.qkey();
        event.src_qp = roce.src_qp();
        event.dest_qp = roce.dest_qp();
        event.pkey = roce.pkey();
        event.opcode = roce.opcode();
    }
    // A full ring only loses the line (counted); the counters still have
    // the frame.
    if EVENTS.output(&event, 0).is_err()
        && let Some(budget) = EVENT_BUDGET.get_ptr_mut(kind.index())
    {
        // SAFETY: this CPU's slot; nothing else writes it.
        unsafe { (*budget).lost += 1 };
    }
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
