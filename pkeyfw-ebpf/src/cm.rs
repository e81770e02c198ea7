//! The connection probes: who listens (rdma_cm's listeners, for the
//! verdict on the requests that name them), and which QP each CM exchange
//! names (for the MADs egress stamps). They read rdma_cm's and ib_cm's
//! structures at the offsets the loader found in BTF (`CM_LAYOUT`) and
//! leave every decision to `pkeyfw_common` (`cm`, `verdict`, `stamp`).
//!
//! - `pkeyfw_listen` (rdma_listen) and `pkeyfw_listening`
//!   (ib_cm_insert_listen, once the listen is past its port's check)
//!   record who made a listener, by what a request names of it
//!   (`LISTENERS`), in the listening task's context: the process in the
//!   verb, or the kernel user (rdma_cm) by its port and device. Its
//!   partition is what the live rules make of that at each request, so a
//!   reload rebinds it as it does a QP.
//! - `pkeyfw_unlisten` (rdma_destroy_id) forgets it.
//! - `pkeyfw_cm_send` (ib_send_cm_req, ib_send_cm_rep, ib_send_cm_sidr_req)
//!   and `pkeyfw_cm_answer` (ib_send_cm_sidr_rep) record the P_Key of the
//!   QP the exchange names (`CONNECTIONS`), once sure its caller made it:
//!   a process names any QPN it likes in rdma_connect and rdma_accept. The
//!   record outlives the QP and the ID (the REJ, DREQ or DREP ib_cm sends
//!   as it destroys one is the connection's too): ib_cm hands
//!   communication IDs out in a cycle of 2^32, and the table is an LRU.
//!
//! Entry probes, all: none of these verbs can be made to go unseen.

use aya_ebpf::{
    Global,
    bindings::{BPF_F_NO_PREALLOC, BPF_NOEXIST},
    btf_maps::{Array, HashMap, LruHashMap},
    helpers::bpf_get_current_pid_tgid,
    macros::{btf_map, kprobe},
    programs::ProbeContext,
};
use aya_log_ebpf::warn;
use pkeyfw_common::{
    Capture,
    abi::{
        CmLayout, ConnectionKind, Creation, ListenKey, NO_DEVICE, QPN_MASK, QpLayout,
        cm::{CONNECTION_CAPACITY, LISTEN_CAPACITY, cm_state},
        connection_key, family, v4_mapped,
    },
    cm::{listen_key, service_id},
};

use crate::{CREATIONS, LAYOUT, Live, RDMA_CM, SCRATCH, count, fetch_add, kernel::read, record};

#[btf_map]
static LISTENERS: HashMap<ListenKey, Creation, { LISTEN_CAPACITY as usize }, GROWN> =
    HashMap::new();
#[btf_map]
static CONNECTIONS: LruHashMap<u64, u16, { CONNECTION_CAPACITY as usize }> = LruHashMap::new();
#[btf_map]
static CM_STATE: Array<u64, { cm_state::SLOTS as usize }> = Array::new();

const GROWN: usize = BPF_F_NO_PREALLOC as usize;

/// Set by the loader from rdma_cm's and ib_cm's BTF.
#[unsafe(no_mangle)]
static CM_LAYOUT: Global<CmLayout> = Global::new(CmLayout {
    netns: 0,
    id_internal: 0,
    id_afonly: 0,
    id_qp_num: 0,
    id_cm: 0,
    id_res: 0,
    id_device: 0,
    id_src: 0,
    id_net: 0,
    id_ps: 0,
    id_qp_type: 0,
    cm_context: 0,
    cm_local_id: 0,
    cm_remote_id: 0,
    _pad: 0,
});

/// The rdma_cm ID each thread's rdma_listen is starting, until ib_cm
/// inserts its listener (the same thread, within the call).
#[btf_map]
static STARTING: LruHashMap<u64, u64, 4096> = LruHashMap::new();

/// rdma_listen(id, backlog): an rdma_cm ID of a process or a kernel user
/// (not one of the internal IDs a wildcard listener makes on each device)
/// sets out to listen. Noted for `pkeyfw_listening`: the listen may yet
/// fail, its port taken.
#[kprobe]
pub fn pkeyfw_listen(ctx: ProbeContext) -> u32 {
    let cm = CM_LAYOUT.load();
    if let Some(id) = ctx.arg::<*const u8>(0)
        && read::<i32>(id, cm.id_internal) == Some(0)
    {
        let _ = STARTING.insert(&bpf_get_current_pid_tgid(), &(id as u64), 0);
    }
    0
}

/// ib_cm_insert_listen(device, handler, service_id): rdma_listen, past its
/// check of the port, has ib_cm listen for it: the listener is recorded
/// here, by what a request names of it, with who made it — the process in
/// the verb, or a kernel user's by its port and device (rdma_cm's, as the
/// QPs it makes for it). Once: a wildcard listener comes here once per
/// device. A record that a listen failing after this leaves is of an ID
/// that holds its port until it is destroyed: it speaks for no other.
#[kprobe]
pub fn pkeyfw_listening(ctx: ProbeContext) -> u32 {
    let _ = listening(&ctx);
    0
}

fn listening(ctx: &ProbeContext) -> Option<()> {
    let (cm, layout) = (CM_LAYOUT.load(), LAYOUT.load());
    // SAFETY: the value is copied out at once.
    let id = unsafe { STARTING.get(&bpf_get_current_pid_tgid()) }.copied()? as *const u8;
    let (key, port) = listen_key_of(&cm, &layout, id)?;
    // The listen this is for (a thread's earlier one may have failed).
    if u64::from_be(ctx.arg(2)?) != key.service_id {
        return None;
    }
    let user = read::<u8>(id, cm.id_res + layout.res_user)? != 0;
    let device = read::<*const u8>(id, cm.id_device)
        .filter(|d| !d.is_null())
        .and_then(|d| read::<u32>(d, layout.device_index))
        .unwrap_or(NO_DEVICE);
    let ib_qp_type = read::<u32>(id, cm.id_qp_type)?;
    let m = SCRATCH.get_ptr_mut(0)?;
    let kernel: [u64; 2] = if user {
        [0, 0]
    } else {
        // SAFETY: 16 bytes either way.
        unsafe { core::mem::transmute(RDMA_CM) }
    };
    // SAFETY: this CPU's scratch value, which no other probe run on this
    // CPU reaches while this one runs (kprobe programs do not nest).
    let c = unsafe { &mut (*m).creator };
    record(c, &layout, id, ib_qp_type, (device, [port, 0]), kernel);
    match LISTENERS.insert(&key, c, BPF_NOEXIST.into()) {
        Ok(()) => count(Capture::Listener),
        // Recorded at the listen's first device already.
        Err(e) if e == -EEXIST => {}
        Err(_) => {
            count(Capture::ListenerUnrecorded);
            if let Some(n) = CM_STATE.get_ptr_mut(cm_state::UNRECORDED) {
                // SAFETY: the map's element, 8-byte aligned.
                unsafe { fetch_add(n) };
            }
            warn!(
                &(),
                "an rdma_cm listener on port {} found no room to be recorded (LISTENERS full): requests no recorded listener answers are refused",
                port
            );
        }
    }
    Some(())
}

const EEXIST: i32 = 17;

/// rdma_destroy_id(id): a listener's record goes with it: only its own
/// (the key may be another listener's by now), or one userspace made for a
/// listener that was listening before the probes ran, which names no ID
/// (no other ID can hold its key while it listens).
#[kprobe]
pub fn pkeyfw_unlisten(ctx: ProbeContext) -> u32 {
    let (cm, layout) = (CM_LAYOUT.load(), LAYOUT.load());
    if let Some(id) = ctx.arg::<*const u8>(0)
        && let Some((key, _)) = listen_key_of(&cm, &layout, id)
        // SAFETY: only the pointer is compared.
        && unsafe { LISTENERS.get(&key) }.is_some_and(|c| c.qp == id as u64 || c.qp == 0)
    {
        let _ = LISTENERS.remove(&key);
    }
    0
}

/// What a request names of listener `id` (a `struct rdma_id_private`),
/// and its port: None for an internal ID, one of another network namespace
/// than the attachment's (it receives no request of this interface's), one
/// of no IP address, or one with no port yet (a listen that binds it
/// first: its ephemeral port is learnt by no one).
#[inline(always)]
fn listen_key_of(cm: &CmLayout, layout: &QpLayout, id: *const u8) -> Option<(ListenKey, u16)> {
    if cm.id_src == 0 || read::<i32>(id, cm.id_internal)? != 0 {
        return None;
    }
    let net: *const u8 = read(id, cm.id_net)?;
    if read::<u64>(net, layout.net_cookie)? != cm.netns {
        return None;
    }
    // sockaddr_in and sockaddr_in6: family, port, then the address (after
    // sockaddr_in6's flow label).
    let af = u32::from(read::<u16>(id, cm.id_src)?);
    let port = u16::from_be(read(id, cm.id_src + 2)?);
    let addr = match af {
        family::INET => v4_mapped(read(id, cm.id_src + 4)?),
        family::INET6 => read(id, cm.id_src + 8)?,
        _ => return None,
    };
    if port == 0 {
        return None;
    }
    let ps = read::<u32>(id, cm.id_ps)?;
    let afonly = read::<u8>(id, cm.id_afonly)? != 0;
    Some((listen_key(service_id(ps, port), af, addr, afonly), port))
}

/// ib_send_cm_req, ib_send_cm_rep, ib_send_cm_sidr_req (cm_id, param): a
/// REQ, a REP or a SIDR_REQ is about to be sent, under the sender's own
/// communication ID.
#[kprobe]
pub fn pkeyfw_cm_send(ctx: ProbeContext) -> u32 {
    let _ = cm_sent(&ctx, ConnectionKind::Own);
    0
}

/// ib_send_cm_sidr_rep(cm_id, param): a SIDR_REP, under the ID of the
/// request it answers.
#[kprobe]
pub fn pkeyfw_cm_answer(ctx: ProbeContext) -> u32 {
    let _ = cm_sent(&ctx, ConnectionKind::SidrRequest);
    0
}

/// Records the P_Key of the MADs sent under `kind`'s communication ID of
/// `struct ib_cm_id` `ctx.arg(0)`: the binding's of the QP rdma_cm will
/// name (its `qp_num`) where the caller made it — a process's own QP, a
/// kernel user's QP — and nothing (a stale record removed) where it did
/// not or no binding gives it one: those MADs leave with the default key.
fn cm_sent(ctx: &ProbeContext, kind: ConnectionKind) -> Option<()> {
    let (cm, layout) = (CM_LAYOUT.load(), LAYOUT.load());
    let cm_id: *const u8 = ctx.arg(0)?;
    // rdma_cm's ID, whose own pointer back to this ib_cm ID says it is one
    // (ib_cm's other users keep something else in the context).
    let id: *const u8 = read(cm_id, cm.cm_context)?;
    if cm.id_cm == 0 || read::<*const u8>(id, cm.id_cm)? != cm_id {
        return None;
    }
    let device: *const u8 = read(id, cm.id_device)?;
    if !layout.devices.contains(&read(device, layout.device_index)?) {
        return None;
    }
    let comm_id = read::<u32>(
        cm_id,
        match kind {
            ConnectionKind::Own => cm.cm_local_id,
            ConnectionKind::SidrRequest => cm.cm_remote_id,
        },
    )?;
    let key = connection_key(kind, u32::from_be(comm_id));
    let qpn = read::<u32>(id, cm.id_qp_num)? & QPN_MASK;
    // A process's rdma_cm passes on whatever QPN it was given; a kernel
    // user's names the QP rdma_cm made for it.
    let user = read::<u8>(id, cm.id_res + layout.res_user)? != 0;
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    // SAFETY: read in place, while the program runs.
    let made = unsafe { CREATIONS.get(&qpn) }.is_some_and(|c| match user {
        true => c.kernel == 0 && c.pid == tgid,
        false => c.kernel != 0,
    });
    if !made {
        count(Capture::CmForeignQp);
    }
    match Live::now().binding(qpn).filter(|_| made) {
        Some(qp) => {
            CONNECTIONS.insert(&key, &qp.pkey, 0).ok()?;
            count(Capture::CmSend);
        }
        None => {
            let _ = CONNECTIONS.remove(&key);
        }
    }
    Some(())
}
