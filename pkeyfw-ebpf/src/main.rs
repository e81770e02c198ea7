//! The pkeyfw programs: InfiniBand partition enforcement for RoCE (XDP
//! ingress, or TC ingress in the network stack) and P_Key stamping of
//! outgoing frames (TC egress), on a host's port or a switch's.
//!
//! Thin by design: they read and write packet bytes and BPF maps, and leave
//! every decision to `pkeyfw_common` (`locate`, `judge`, `stamp`,
//! `switch`), the same code the host tests run.
//!
//! Each program is a few calls to stages that are *global* functions
//! (exported, so that their BTF linkage is global): the verifier checks a
//! global function once, on its own, whatever calls it, where a static or
//! inlined one is walked again on every path that reaches it. Their
//! arguments are the context and scalars and they return a scalar, so a
//! stage hands the next what it found packed in a register: where the
//! headers are (`Located`), the verdict (`Outcome::pack`). Choices fixed at
//! load (`SETUP`: the port's role, what the kernel offers; `TRACE`) are
//! read-only data, so the verifier removes the code they turn off.
#![no_std]
#![no_main]
#![feature(asm_experimental_arch)]

mod account;
mod kernel;
mod maps;
mod object;
mod packet;
mod trace;

use core::ptr::NonNull;

use aya_ebpf::{
    EbpfContext as _, Global,
    bindings::{__sk_buff, TC_ACT_SHOT, TC_ACT_UNSPEC, xdp_action, xdp_md},
    macros::{classifier, xdp},
    programs::{TcContext, XdpContext},
};
use maps::{LISTENER_FOUND, REASONS, RulesOf, SENDER, XMIT_REASONS, policy};
use packet::{Packet, Skb, XdpBytes};
use pkeyfw_common::{
    Direction, Frame, Outcome, Stamp,
    abi::{Config, QPN_MASK, Setup, role},
    parse::{self, Located, Parsed, Plain},
    stamp::{self, Action, Origin, Plan},
    switch,
    tenant::Step,
    verdict::{self, Listening, PACKED_ALLOWED, PACKED_PASS, PACKED_REQUEST, PACKED_RESTORE},
};

/// What the loader chose at load (see `Setup`).
#[unsafe(no_mangle)]
pub static SETUP: Global<Setup> = Global::new(Setup {
    role: role::HOST,
    frags: 1,
    coarse_clock: 1,
    _pad: 0,
});

/// One field of [`SETUP`], read alone: `Global::load` reads the whole
/// struct, a load per byte, on every frame.
macro_rules! setup {
    ($field:ident) => {
        // SAFETY: `Global` is `repr(transparent)` over its value, which the
        // loader initialised; a volatile read, as `Global::load` makes.
        unsafe {
            core::ptr::read_volatile(
                &raw const (*(&raw const $crate::SETUP).cast::<pkeyfw_common::abi::Setup>()).$field,
            )
        }
    };
}
pub(crate) use setup;

/// Ingress in the driver (native XDP), multi-buffer aware (`xdp.frags`),
/// so that it attaches to jumbo-MTU devices: the headers are read from the
/// linear part only, bounded by `data_end`.
#[xdp(frags)]
pub fn pkeyfw(ctx: XdpContext) -> u32 {
    xdp(ctx.ctx)
}

/// The same, for kernels without multi-buffer XDP (before Linux 5.18),
/// which the loader loads there instead (with `Setup::frags` 0).
#[xdp]
pub fn pkeyfw_linear(ctx: XdpContext) -> u32 {
    xdp(ctx.ctx)
}

#[inline(always)]
fn xdp(ctx: *mut xdp_md) -> u32 {
    let frame = Packet::of(ctx);
    let inbound = Direction::Inbound;
    let pass = match switch_port(ctx, &frame, inbound) {
        Some((located, outcome)) => {
            if outcome & PACKED_ALLOWED == 0 {
                pkeyfw_refused_xdp(ctx, located, outcome, pack_port(Some(inbound)));
            }
            outcome & PACKED_PASS != 0
        }
        None => {
            // The host's path runs inline, with no call on a frame that
            // passes and needs no restore, nor on one it refuses: calls
            // cost (a return thunk each, on CPUs the kernel guards against
            // return-stack attacks). A CM request QP1 takes, which its
            // listener decides, is judged in stages of its own.
            let (located, parsed) = plain_or(&frame, || pkeyfw_locate_xdp(ctx));
            let judged = host(
                &frame,
                parsed,
                Some(|outcome| {
                    pkeyfw_report_xdp(ctx, located, outcome);
                }),
            );
            // The verdict packed only where a stage takes it: a frame that
            // passes or is refused here needs only whether it passes and
            // is restored.
            let (pass, restore) = match judged {
                Some((outcome, restore)) => (outcome.pass, restore),
                None => {
                    let listening = pkeyfw_listening(pkeyfw_listener_xdp(ctx, located));
                    let outcome = pkeyfw_request_xdp(ctx, located, listening);
                    if outcome & PACKED_ALLOWED == 0 {
                        pkeyfw_refused_xdp(ctx, located, outcome, HOST_PORT);
                    }
                    (outcome & PACKED_PASS != 0, outcome & PACKED_RESTORE != 0)
                }
            };
            if restore {
                account::restored(pkeyfw_restore_xdp(ctx, located));
            }
            pass
        }
    };
    if trace::on() {
        trace::emit(&Packet::of(ctx));
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
    let skb = ctx.as_ptr().cast::<__sk_buff>();
    let frame = Skb(tc(skb));
    let inbound = Direction::Inbound;
    let (located, outcome, port) = match switch_port(skb, &frame, inbound) {
        Some((located, outcome)) => (located, outcome, pack_port(Some(inbound))),
        None => {
            // The verdict a stage of its own: the skb helpers' buffers
            // would take this frame's stack, and its calls', past the 512
            // bytes a chain of calls may have (Linux 5.10 counts every
            // chain).
            let located = match parse::plain(&frame) {
                Plain::Roce(roce) => roce.located_bits(),
                Plain::NotRoce => Located::NotRoce.pack(),
                Plain::Walk => pkeyfw_locate_skb(skb),
            };
            let mut outcome = pkeyfw_host_skb(skb, located);
            if outcome & PACKED_REQUEST != 0 {
                let listening = pkeyfw_listening(pkeyfw_listener_skb(skb, located));
                outcome = pkeyfw_request_skb(skb, located, listening);
            }
            if outcome & PACKED_RESTORE != 0 {
                account::restored(pkeyfw_restore_skb(skb, located));
            }
            (located, outcome, HOST_PORT)
        }
    };
    if trace::on() {
        trace::emit(&Skb(ctx));
    }
    tc_verdict(skb, located, outcome, port)
}

/// Egress: while the active policy stamps, writes the sending QP's bound
/// P_Key into outgoing RoCE v2 frames, the port's default one into frames no
/// bound QP sent, and drops management frames with a key the port does not
/// hold (see `stamp::egress`). On a switch port: the outbound check and an
/// access port's restore (see `switch`).
#[classifier]
pub fn pkeyfw_stamp(ctx: TcContext) -> i32 {
    let skb = ctx.as_ptr().cast::<__sk_buff>();
    let frame = Skb(tc(skb));
    let outbound = Direction::Outbound;
    let action = match switch_port(skb, &frame, outbound) {
        Some((located, outcome)) => tc_verdict(skb, located, outcome, pack_port(Some(outbound))),
        None if stamp::stamping(policy().1) => pkeyfw_stamp_skb(skb, pkeyfw_locate_skb(skb)),
        None => TC_ACT_UNSPEC,
    };
    if trace::on() {
        trace::emit(&Skb(ctx));
    }
    action
}

/// The one branch on the port's role (`SETUP`): None on a host's port,
/// whose path is the program's own; on a switch port, its check of the
/// frame in `direction`, for a frame it reads at all (`switch::reads`: the
/// stages `Stages::locate`, then `Stages::port`; any other goes on,
/// unlocated): where its headers are (`Located::pack`) and the verdict
/// (`Outcome::pack`).
#[inline(always)]
fn switch_port<C: Stages, F: Frame>(ctx: C, frame: &F, direction: Direction) -> Option<(u64, u64)> {
    if setup!(role) != role::SWITCH {
        return None;
    }
    if !switch::reads(frame, policy().1, direction) {
        return Some((Located::NotRoce.pack(), PACKED_ALLOWED | PACKED_PASS));
    }
    let located = ctx.locate();
    Some((located, ctx.port(located, pack_port(Some(direction)))))
}

/// A program's context, and the stages of its kind (XDP or TC) that a
/// switch port's check calls.
trait Stages: Copy {
    /// Where the frame's transport headers are (`pkeyfw_locate_xdp`).
    fn locate(self) -> u64;
    /// A switch port's verdict (`pkeyfw_port_xdp`).
    fn port(self, located: u64, port: PackedPort) -> u64;
}

impl Stages for *mut xdp_md {
    #[inline(always)]
    fn locate(self) -> u64 {
        pkeyfw_locate_xdp(self)
    }

    #[inline(always)]
    fn port(self, located: u64, port: PackedPort) -> u64 {
        pkeyfw_port_xdp(self, located, port)
    }
}

impl Stages for *mut __sk_buff {
    #[inline(always)]
    fn locate(self) -> u64 {
        pkeyfw_locate_skb(self)
    }

    #[inline(always)]
    fn port(self, located: u64, port: PackedPort) -> u64 {
        pkeyfw_port_skb(self, located, port)
    }
}

/// Where a frame is judged, as the stages take it: `Option<Direction>` as
/// a scalar (a global function takes no enum), the `Direction` a switch
/// port judges it in, or [`HOST_PORT`] on a host's port.
type PackedPort = u32;

/// The [`PackedPort`] of a host's port.
const HOST_PORT: PackedPort = u32::MAX;

/// `port` as the stages take it.
#[inline(always)]
const fn pack_port(port: Option<Direction>) -> PackedPort {
    match port {
        Some(direction) => direction as PackedPort,
        None => HOST_PORT,
    }
}

/// The one reading of a [`PackedPort`].
#[inline(always)]
const fn unpack_port(port: PackedPort) -> Option<Direction> {
    match port {
        HOST_PORT => None,
        _ => Some(direction(port)),
    }
}

/// The direction of a switch port's [`PackedPort`].
#[inline(always)]
const fn direction(port: PackedPort) -> Direction {
    match port {
        0 => Direction::Inbound,
        _ => Direction::Outbound,
    }
}

/// Reports a refused frame; then TCX_NEXT for tcx, "continue" for a
/// netlink filter, or drop.
#[inline(always)]
fn tc_verdict(skb: *mut __sk_buff, located: u64, outcome: u64, port: PackedPort) -> i32 {
    if outcome & PACKED_ALLOWED == 0 {
        pkeyfw_refused_skb(skb, located, outcome, port);
    }
    if outcome & PACKED_PASS != 0 {
        TC_ACT_UNSPEC
    } else {
        TC_ACT_SHOT
    }
}

/// The skb of a TC program's context, as aya's programs read it.
#[inline(always)]
fn tc(ctx: *mut __sk_buff) -> TcContext {
    // SAFETY: the verifier passes a global function its program's context,
    // never null.
    TcContext::new(unsafe { NonNull::new_unchecked(ctx) })
}

// The stages. `#[inline(never)]` and exported: global functions.

/// Where the frame's transport headers are (`Located::pack`).
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn pkeyfw_locate_xdp(ctx: *mut xdp_md) -> u64 {
    pkeyfw_common::parse::locate(&Packet::of(ctx)).pack()
}

#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn pkeyfw_locate_skb(ctx: *mut __sk_buff) -> u64 {
    pkeyfw_common::parse::locate(&Skb(tc(ctx))).pack()
}

/// A host port's verdict on a received frame (`Outcome::pack`, with
/// `PACKED_RESTORE` where its stamped P_Key is to be restored), counted.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn pkeyfw_host_skb(ctx: *mut __sk_buff, located: u64) -> u64 {
    let skb = Skb(tc(ctx));
    // The program counts and reports a refused frame, in a stage of its
    // own (`pkeyfw_refused_skb`): the skb helpers' buffers would take this
    // stage past the stack a chain of calls may have.
    match host(&skb, roce(&skb, located), None::<fn(u64)>) {
        Some((outcome, restore)) => outcome.pack() | restore_bit(restore),
        None => PACKED_REQUEST,
    }
}

/// Who made the listener a CM request QP1 took (`PACKED_REQUEST`) names
/// (`verdict::listener`), left in `LISTENER_FOUND` ([`FOUND`]; else why
/// none decides, a packed `Listening`), then what binds it
/// (`pkeyfw_listening`), then the verdict (`pkeyfw_request_xdp`): stages
/// of their own, and the rules walked where nothing of the frame is, so
/// that the verifier walks them once, not once per way the frame was read.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn pkeyfw_listener_xdp(ctx: *mut xdp_md, located: u64) -> u64 {
    listener(&Packet::of(ctx), located)
}

#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn pkeyfw_listener_skb(ctx: *mut __sk_buff, located: u64) -> u64 {
    listener(&Skb(tc(ctx)), located)
}

/// What binds the listener `pkeyfw_listener_xdp` found (`verdict::listening`:
/// the live rules walked against who made it, one `pkeyfw_listener_rule`
/// each), packed; what it said instead, as it is.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn pkeyfw_listening(found: u64) -> u64 {
    if found != FOUND {
        return found;
    }
    let (live, _) = policy();
    let generation = live.generation;
    verdict::listening_by(|index| Step::from_u32(pkeyfw_listener_rule(generation, index))).pack()
}

/// What rule `index` of generation `generation` makes of the listener in
/// `LISTENER_FOUND` (`verdict::listener_rule`, a `Step`): a stage of its
/// own, so that the verifier checks a rule once, not each of the 64 in
/// turn.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn pkeyfw_listener_rule(generation: u32, index: u32) -> u32 {
    match LISTENER_FOUND.get(0) {
        Some(creator) => verdict::listener_rule(&RulesOf(generation), creator, index) as u32,
        None => Step::End as u32,
    }
}

/// What `pkeyfw_listener_xdp` returns when it left the listener's maker in
/// `LISTENER_FOUND`: no packed `Listening`.
const FOUND: u64 = u64::MAX;

/// A host port's verdict on a CM request QP1 took, given what binds its
/// listener (`pkeyfw_listening_xdp`): counted, as `pkeyfw_host_skb`'s.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn pkeyfw_request_xdp(ctx: *mut xdp_md, located: u64, listening: u64) -> u64 {
    request(&Packet::of(ctx), located, listening)
}

#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn pkeyfw_request_skb(ctx: *mut __sk_buff, located: u64, listening: u64) -> u64 {
    request(&Skb(tc(ctx)), located, listening)
}

/// Restores the default P_Key (0xFFFF) of a passed stamped frame, which
/// the local rdma_rxe accepts alone: a `Stamp`, what came of it.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn pkeyfw_restore_xdp(ctx: *mut xdp_md, located: u64) -> u32 {
    restore(&Packet::of(ctx), located, |p| XdpBytes(ctx).rewrite(p)) as u32
}

#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn pkeyfw_restore_skb(ctx: *mut __sk_buff, located: u64) -> u32 {
    let skb = Skb(tc(ctx));
    restore(&skb, located, |p| skb.rewrite(p)) as u32
}

/// A switch port's check of a frame received on it or forwarded out of it
/// (`port`), once rewritten and counted: `Outcome::pack`.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn pkeyfw_port_xdp(ctx: *mut xdp_md, located: u64, port: PackedPort) -> u64 {
    port_check(&Packet::of(ctx), located, port, |p| {
        XdpBytes(ctx).rewrite(p)
    })
}

#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn pkeyfw_port_skb(ctx: *mut __sk_buff, located: u64, port: PackedPort) -> u64 {
    let skb = Skb(tc(ctx));
    port_check(&skb, located, port, |p| skb.rewrite(p))
}

/// A host port's outgoing frame: stamped, left, or dropped (a TC action).
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn pkeyfw_stamp_skb(ctx: *mut __sk_buff, located: u64) -> i32 {
    egress(tc(ctx), located)
}

/// Sends the event of a refused frame a host port judged, whose budget the
/// verdict spent: the verdict (`Outcome::pack`). Returns 0.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn pkeyfw_report_xdp(ctx: *mut xdp_md, located: u64, outcome: u64) -> u32 {
    let frame = Packet::of(ctx);
    let outcome = Outcome::unpack(outcome, None);
    // Refused and passed all the same: monitored.
    let monitor = outcome.pass;
    // Each case its own call: no `Option<Roce>` (see `account::refused`).
    match roce(&frame, located).roce() {
        Some(roce) => account::report(&frame, &outcome, Some(&roce), monitor, None),
        None => account::report(&frame, &outcome, None, monitor, None),
    }
    0
}

/// Counts a refused frame against its partition and reports it: the
/// verdict (`Outcome::pack`, with the P_Key the frame came with: a rewrite
/// may have changed it since), and where it was refused. Called by the
/// program, not the stage that judged: a call within a call would stack
/// their frames. Returns 0.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn pkeyfw_refused_xdp(
    ctx: *mut xdp_md,
    located: u64,
    outcome: u64,
    port: PackedPort,
) -> u32 {
    refused(&Packet::of(ctx), located, outcome, port);
    0
}

#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn pkeyfw_refused_skb(
    ctx: *mut __sk_buff,
    located: u64,
    outcome: u64,
    port: PackedPort,
) -> u32 {
    refused(&Skb(tc(ctx)), located, outcome, port);
    0
}

/// The RoCE headers of a located frame.
#[inline(always)]
fn roce<F: Frame>(frame: &F, located: u64) -> Parsed {
    Located::unpack(located).read(frame)
}

/// A frame classified inline where it is plain (`parse::plain`), else
/// located by a stage (`locate`) and its transport headers read: where its
/// headers are (`Located::pack`), and what they say.
#[inline(always)]
fn plain_or<F: Frame>(frame: &F, locate: impl FnOnce() -> u64) -> (u64, Parsed) {
    match parse::plain(frame) {
        Plain::Roce(roce) => (roce.located_bits(), Parsed::of(roce)),
        Plain::NotRoce => (Located::NotRoce.pack(), Parsed::NOT_ROCE),
        Plain::Walk => {
            let located = locate();
            (located, roce(frame, located))
        }
    }
}

/// Judges a received frame (classified as `parsed`) and counts it; with
/// `report`, a refused one against its partition too, and its event (if
/// this CPU's budget allows one) is sent by `report`, given the packed
/// verdict (without, the program counts and reports it in a stage of its
/// own). Returns the verdict, and whether the frame's stamped P_Key is to
/// be restored: after the verdict, which judged the stamped P_Key, since
/// the local rxe accepts only 0xFFFF. A CM request QP1 takes comes back
/// `None`, uncounted, for its listener to decide (`request`).
#[inline(always)]
fn host<F: Frame>(
    frame: &F,
    parsed: Parsed,
    report: Option<impl FnOnce(u64)>,
) -> Option<(Outcome, bool)> {
    let (live, config) = policy();
    let outcome = match verdict::judge_but_requests(frame, parsed, &live, config) {
        (_, true) => return None,
        (outcome, false) => outcome,
    };
    // With the headers and the policy the verdict read: a flood of
    // refused frames makes no call once the budget is spent.
    if !outcome.allowed
        && let Some(report) = report
        && account::refusal(&live, &outcome, parsed.roce().as_ref(), None)
    {
        report(outcome.pack());
    }
    let restore = counted(&outcome, config);
    Some((outcome, restore))
}

/// Who made the listener a CM request names, left in `LISTENER_FOUND`
/// (see `pkeyfw_listener_xdp`).
#[inline(always)]
fn listener<F: Frame>(frame: &F, located: u64) -> u64 {
    let (live, _) = policy();
    let found = match roce(frame, located).roce() {
        Some(roce) => verdict::listener(frame, &roce, &live),
        None => Err(Listening::Unreadable),
    };
    match (found, LISTENER_FOUND.get_ptr_mut(0)) {
        (Ok(creator), Some(slot)) => {
            // SAFETY: this CPU's slot, which only this program run uses
            // until it ends.
            unsafe { *slot = *creator };
            FOUND
        }
        (Ok(_), None) => Listening::Unreadable.pack(),
        (Err(why), _) => why.pack(),
    }
}

/// The verdict on a CM request QP1 took (see `pkeyfw_request_xdp`), as
/// `host` returns one; the program reports it if refused.
#[inline(always)]
fn request<F: Frame>(frame: &F, located: u64, listening: u64) -> u64 {
    let (live, config) = policy();
    let outcome = match roce(frame, located).roce() {
        Some(roce) => verdict::request(&roce, Listening::unpack(listening), &live, config),
        // Read as RoCE a moment ago, by the same code.
        None => verdict::judge_parsed(frame, Parsed::MALFORMED, &live, config),
    };
    outcome.pack() | restore_bit(counted(&outcome, config))
}

/// Counts a received frame's verdict; whether its P_Key is to be restored.
#[inline(always)]
fn counted(outcome: &Outcome, config: &Config) -> bool {
    account::reason(&REASONS, outcome);
    if trace::on() {
        trace::frame(outcome, None);
    }
    account::qp(outcome);
    stamp::restores(outcome, config)
}

/// `PACKED_RESTORE` where a frame's P_Key is to be restored.
#[inline(always)]
const fn restore_bit(restore: bool) -> u64 {
    if restore { PACKED_RESTORE } else { 0 }
}

/// A switch port's check of a frame in the direction `port` says (see
/// `switch`): rewrites and counts; returns the verdict (`Outcome::pack`).
#[inline(always)]
fn port_check<F: Frame>(
    frame: &F,
    located: u64,
    port: PackedPort,
    rewrite: impl Fn(&Plan) -> Result<(), Stamp>,
) -> u64 {
    let direction = direction(port);
    let (live, config) = policy();
    let parsed = roce(frame, located);
    let Some(action) = switch::judge_parsed(frame, parsed, &live, config, direction) else {
        return PACKED_ALLOWED | PACKED_PASS;
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
        action.settle(direction, made, why, account::stamp)
    } else {
        action.outcome
    };
    account::reason(
        match direction {
            Direction::Inbound => &REASONS,
            Direction::Outbound => &XMIT_REASONS,
        },
        &outcome,
    );
    if trace::on() {
        trace::frame(&outcome, Some(direction));
    }
    outcome.pack()
}

/// The restore of a passed stamped frame (see `pkeyfw_restore_xdp`).
#[inline(always)]
fn restore<F: Frame>(
    frame: &F,
    located: u64,
    rewrite: impl Fn(&Plan) -> Result<(), Stamp>,
) -> Stamp {
    let Some(roce) = roce(frame, located).roce() else {
        return Stamp::NotRoce;
    };
    match stamp::plan(frame, &roce, pkeyfw_common::pkey::DEFAULT).and_then(|plan| rewrite(&plan)) {
        Ok(()) => Stamp::Restored,
        Err(why) => why,
    }
}

/// Counts and reports a refused frame (see `pkeyfw_refused_xdp`).
#[inline(always)]
fn refused<F: Frame>(frame: &F, located: u64, outcome: u64, port: PackedPort) {
    let (live, _) = policy();
    let port = unpack_port(port);
    // The P_Key it came with, which a rewrite may have changed since.
    let pkey = Outcome::packed_pkey(outcome);
    let outcome = Outcome::unpack(outcome, None);
    // Refused and passed all the same: monitored (a corrupted frame is
    // passed to be refused further on).
    let monitor = outcome.pass && !outcome.corrupt;
    // Each case its own call: no `Option<Roce>` (see `account::refused`).
    match roce(frame, located).roce() {
        Some(roce) => {
            let roce = roce.with_pkey(pkey);
            account::refused(frame, &live, &outcome, Some(&roce), monitor, port)
        }
        None => account::refused(frame, &live, &outcome, None, monitor, port),
    }
}

/// A host port's stamping of an outgoing frame; a TC action.
#[inline(always)]
fn egress(ctx: TcContext, located: u64) -> i32 {
    let (live, config) = policy();
    let skb = Skb(ctx);
    let parse = || roce(&skb, located);
    let counted = match stamp::egress_parsed(&skb, parse, &live, config, || origin(&skb.0)) {
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
            account::stamp(outcome);
            TC_ACT_UNSPEC
        }
        Err(why) => {
            account::stamp(why);
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
///
/// Kernels carrying "RDMA/rxe: Let destroy qp succeed with stuck packet"
/// (and not its 2025 follow-up, which put the QP back) keep the QP's pool
/// index in the user data instead, which is its QPN: a number no kernel
/// pointer is, and none a process can set on its socket. BTF cannot tell
/// the two apart (the field is a pointer either way), so each frame's value
/// does; for an index the socket and device cannot be checked.
#[inline(always)]
fn sender(ctx: &TcContext) -> Option<u32> {
    let l = SENDER.load();
    if !l.knows_qps() {
        return None;
    }
    // The context is the kernel's `struct sk_buff`.
    let skb = ctx.as_ptr() as *const u8;
    let sk: *const u8 = kernel::read(skb, l.skb_sk)?;
    let user: u64 = kernel::read(sk, l.sk_user_data)?;
    if user == 0 {
        return None;
    }
    if user <= u64::from(QPN_MASK) {
        return Some(user as u32);
    }
    let qp = user as *const u8;
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
