//! `attach --trace`: a kernel log line (aya-log) per judged RoCE frame and
//! per stamping outcome.
//!
//! Without tracing the loader leaves `TRACE` at 0: a read-only global, so
//! the verifier knows every `if TRACE.load() != 0` is never taken and
//! removes what it guards; the packet path is as if tracing were not there.
//!
//! With tracing, the verdict paths only note the frame (`TRACED`, a few
//! stores) and the program logs it once, as it returns ([`emit`]): the
//! logging code is then verified once, from a map value the verifier knows
//! nothing of, rather than once per path through the verdict (which took
//! the verifier past its million instructions). The line carries numbers
//! (where, verdict, reason or stamping outcome), named by the reader
//! (`pkeyfw::reporting::kernel_log`): a name chosen per frame would again
//! be a path per name.

use aya_ebpf::{Global, btf_maps::PerCpuArray, macros::btf_map};
use aya_log_ebpf::trace;
use pkeyfw_common::{Direction, Frame, Outcome, Reason, Stamp, Verdict, parse::Roce};

/// 1 when the programs trace; set at load.
#[unsafe(no_mangle)]
pub static TRACE: Global<u8> = Global::new(0);

/// What the program returning on this CPU is to log.
#[btf_map]
static TRACED: PerCpuArray<Traced, 1> = PerCpuArray::new();

#[derive(Copy, Clone)]
struct Traced {
    kind: u8,
    /// 0 a host port, 1 + `Direction` a switch port's check.
    at: u8,
    allowed: bool,
    pass: bool,
    corrupt: bool,
    /// The `Reason`, or for [`STAMP`] the `Stamp`.
    outcome: u8,
    roce: Option<Roce>,
}

/// `Traced::kind`: nothing to log, a judged frame, a stamping outcome.
const NONE: u8 = 0;
const FRAME: u8 = 1;
const STAMP: u8 = 2;

/// Whether the programs trace.
#[inline(always)]
pub fn on() -> bool {
    TRACE.load() != 0
}

/// Notes a judged frame; `port`: the direction a switch port judged it in.
/// A copy without a branch: a branch would be a path more per path.
#[inline(always)]
pub fn frame(outcome: &Outcome, port: Option<Direction>) {
    if let Some(t) = TRACED.get_ptr_mut(0) {
        // SAFETY: this CPU's slot; nothing else writes it.
        unsafe {
            *t = Traced {
                kind: FRAME,
                at: port.map_or(0, |d| 1 + d as u8),
                allowed: outcome.allowed,
                pass: outcome.pass,
                corrupt: outcome.corrupt,
                outcome: outcome.reason as u8,
                roce: outcome.roce,
            }
        };
    }
}

/// Notes an egress stamping outcome.
#[inline(always)]
pub fn stamp(outcome: Stamp) {
    if let Some(t) = TRACED.get_ptr_mut(0) {
        // SAFETY: this CPU's slot; nothing else writes it.
        let t = unsafe { &mut *t };
        t.kind = STAMP;
        t.outcome = outcome as u8;
    }
}

/// Logs what the program noted about `frame`, if anything; called as it
/// returns. Frames and stamping outcomes that are not RoCE go untraced:
/// they are all the other traffic.
#[inline(never)]
pub fn emit<F: Frame>(frame: &F) {
    let Some(t) = TRACED.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: this CPU's slot; nothing else writes it.
    let t = unsafe { &mut *t };
    let kind = t.kind;
    t.kind = NONE;
    let verdict = Verdict::of(t.allowed, t.pass, t.corrupt) as u8;
    match (kind, t.roce) {
        (FRAME, Some(roce)) => trace!(
            &(),
            "frame {} {} {}: P_Key 0x{:x} Q_Key 0x{:x} QP {} -> {} opcode 0x{:x} {:i} -> {:i}",
            t.at,
            verdict,
            t.outcome,
            roce.pkey(),
            roce.qkey(),
            roce.src_qp(),
            roce.dest_qp(),
            roce.opcode(),
            roce.addrs().read(frame, false).unwrap_or_default(),
            roce.addrs().read(frame, true).unwrap_or_default()
        ),
        (FRAME, None) if t.outcome != Reason::NotRoce as u8 => {
            trace!(&(), "frame {} {} {}", t.at, verdict, t.outcome)
        }
        (STAMP, _) if t.outcome != Stamp::NotRoce as u8 => trace!(&(), "stamp {}", t.outcome),
        _ => {}
    }
}
