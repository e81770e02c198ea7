//! Loops the kernel runs (`bpf_loop`), whose body the verifier checks once
//! rather than once per turn: the probes' match of the `[[bind]]` rules and
//! their zeroing of a QP's counters on every CPU, the device guard's match
//! of its tenants.

use core::ffi::c_void;

use aya_ebpf::helpers::generated;

/// A loop's body, and what it carries from one turn to the next.
pub trait Body {
    /// Turn `i`: whether the loop stops there.
    fn turn(&mut self, i: u32) -> bool;
}

/// Runs `body`'s turns 0, 1, … below `turns`, until one stops.
#[inline(always)]
pub fn repeat<B: Body>(turns: u32, body: &mut B) {
    // bpf_loop's context is on the stack: a pointer to `body`, which may
    // be map memory (a per-CPU scratch value).
    let mut at: *mut B = body;
    // SAFETY: the callback takes the pointer this passes, to a live `B`,
    // for the call's length.
    unsafe {
        generated::bpf_loop(turns, turn::<B> as *mut c_void, (&raw mut at).cast(), 0);
    }
}

/// `bpf_loop`'s callback: turn `i` of the body `ctx` points to; 1 stops,
/// 0 goes on.
#[inline(never)]
extern "C" fn turn<B: Body>(i: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: `ctx` is the pointer `repeat` passes.
    let body = unsafe { &mut **ctx.cast::<*mut B>() };
    i64::from(body.turn(i as u32))
}
