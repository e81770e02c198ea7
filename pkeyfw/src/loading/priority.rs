//! Whoever holds a filter's maps reads and writes them ahead of the
//! tenants' tasks on its CPU.
//!
//! A map syscall (lookup, update, delete, and the batched forms) runs with
//! the CPU's `bpf_prog_active` raised; a kprobe's program does not run while
//! it is (the kernel counts the run in the program's `recursion_misses`
//! and skips it). On a kernel that preempts there (Linux 7.x: lazy
//! preemption, PREEMPT_RT), a tenant's task that takes the CPU from pkeyfw
//! in that window makes its QP unseen by the creation probe (its frames
//! leave with the default key, refused) or its destruction unseen (its
//! binding is left for the next QP with its number). A real-time task is
//! not preempted by ordinary ones: pkeyfw runs at the lowest real-time
//! priority while it keeps the maps in step with the QPs as tenants run
//! (an attachment once its programs are loaded: the binder's reads and
//! writes), and what it starts runs as usual (`SCHED_RESET_ON_FORK`). Not
//! the loading of programs, whose verification may take seconds, nor the
//! readers of pinned maps (`stats`, `metrics`): a read of every QPN's
//! counters at real-time priority would hold tenants' tasks off its CPU.

use std::cell::Cell;

/// Raises the calling thread (and the threads it starts) to `SCHED_FIFO`
/// priority 1, once per thread. Where it may not (no `CAP_SYS_NICE`, a
/// cgroup without real-time runtime), it says so in one line and goes on:
/// the probes then miss what tenants do in those windows, as before.
pub fn ahead_of_tenants() {
    thread_local!(static RAISED: Cell<bool> = const { Cell::new(false) });
    if RAISED.replace(true) {
        return;
    }
    // A service manager may have set it already (the packaged unit's
    // CPUSchedulingPolicy=fifo), and forbid changing it.
    // SAFETY: reads this thread's policy.
    let now = unsafe { libc::sched_getscheduler(0) } & !libc::SCHED_RESET_ON_FORK;
    if now == libc::SCHED_FIFO || now == libc::SCHED_RR {
        return;
    }
    let param = libc::sched_param { sched_priority: 1 };
    // SAFETY: a plain syscall on this thread, with a valid parameter.
    let rc = unsafe {
        libc::sched_setscheduler(0, libc::SCHED_FIFO | libc::SCHED_RESET_ON_FORK, &param)
    };
    if rc != 0 {
        eprintln!(
            "pkeyfw: runs at its usual priority ({}): on a kernel that preempts map syscalls (7.x), a QP created or destroyed while pkeyfw reads its maps may go unseen by the probes",
            std::io::Error::last_os_error()
        );
    }
}
