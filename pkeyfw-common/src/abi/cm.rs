//! The maps of connection setup: the rdma_cm listeners the probes record
//! (`LISTENERS`), the QP each CM exchange's communication ID names
//! (`CONNECTIONS`: the QPN the probe on the sending verb saw its caller
//! name), and what the probes keep up (`CM_STATE`); and where the probes
//! read rdma_cm's and ib_cm's structures ([`CmLayout`]).

/// `LISTENERS` key: what a CM request names of the listener it is for, as
/// rdma_cm matches listeners to it: the ServiceID (rdma_cm's port space and
/// port) and the address, which a listener may leave a wildcard.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ListenKey {
    pub service_id: u64,
    /// [`family`]: the one a listener takes (bound to an address, or the
    /// wildcard of one family only, `afonly`), or [`family::ANY`].
    pub family: u32,
    pub _pad: u32,
    /// The address, IPv4 as v4-mapped IPv6; zero for a wildcard.
    pub addr: [u8; 16],
}

/// [`ListenKey::family`] values: the kernel's `AF_INET` and `AF_INET6`.
pub mod family {
    /// A wildcard listener that takes requests of both families.
    pub const ANY: u32 = 0;
    pub const INET: u32 = 2;
    pub const INET6: u32 = 10;
}

/// Listeners the probe records, at most: `LISTENERS` entries are made as
/// listeners appear (about 200 bytes each), and one that finds no room
/// refuses what no recorded listener answers (see [`cm_state`]).
pub const LISTEN_CAPACITY: u32 = 1 << 16;

/// `CONNECTIONS` key of a CM MAD's sender side (its value: the
/// connection's P_Key, its QP's when the REQ, REP or SIDR exchange was
/// sent, which every later MAD of it keeps, as an HCA's CM does by its
/// path): its own communication ID
/// (`Own`: a REQ's, a REP's, a SIDR_REQ's, and every later MAD's Local
/// Communication ID) or the requester's that a SIDR_REP answers.
#[inline(always)]
pub const fn connection_key(kind: ConnectionKind, comm_id: u32) -> u64 {
    (kind as u64) << 32 | comm_id as u64
}

/// Which communication ID a [`connection_key`] holds.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum ConnectionKind {
    Own = 0,
    SidrRequest = 1,
}

/// Connections recorded at once, at most: an LRU map, so that a tenant
/// that opens connections without end pushes out the oldest (whose later
/// MADs then leave with the default P_Key), never a new one.
pub const CONNECTION_CAPACITY: u32 = 1 << 14;

/// `CM_STATE` slots.
pub mod cm_state {
    /// Which records the probes keep ([`RECORDS_LISTENERS`],
    /// [`RECORDS_CONNECTIONS`]): the loader sets it once they are
    /// attached. Without the listeners, a CM request meets QP1's rule
    /// alone (connection setup is not partitioned); without the
    /// connections, CM MADs keep the key they carry.
    pub const RECORDS: u32 = 0;
    /// Listeners the probe found no room to record: while any is, a request
    /// no recorded listener answers is refused, whatever the unknown-QP
    /// rule (the QPs' quarantine, for listeners).
    pub const UNRECORDED: u32 = 1;
    pub const SLOTS: u32 = 2;

    pub const RECORDS_LISTENERS: u64 = 1 << 0;
    pub const RECORDS_CONNECTIONS: u64 = 1 << 1;
}

/// Where the connection probes read rdma_cm's and ib_cm's structures: byte
/// offsets from the kernel's BTF (rdma_cm's, ib_cm's), and the network
/// namespace whose listeners the attachment's interface receives requests
/// for. The probes object's global `CM_LAYOUT`; all zero where unknown (no
/// connection probe is attached then).
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct CmLayout {
    /// The attached interface's network namespace cookie.
    pub netns: u64,
    /// `struct rdma_id_private` (whose `struct rdma_cm_id` comes first):
    /// `internal_id`, `afonly`, `qp_num`, `cm_id` (its `struct ib_cm_id`),
    /// `res` (its restrack entry).
    pub id_internal: u32,
    pub id_afonly: u32,
    pub id_qp_num: u32,
    pub id_cm: u32,
    pub id_res: u32,
    /// `struct rdma_cm_id`: `device`, `route.addr.src_addr`,
    /// `route.addr.dev_addr.net`, `ps`, `qp_type`.
    pub id_device: u32,
    pub id_src: u32,
    pub id_net: u32,
    pub id_ps: u32,
    pub id_qp_type: u32,
    /// `struct ib_cm_id`: `context`, `local_id`, `remote_id`.
    pub cm_context: u32,
    pub cm_local_id: u32,
    pub cm_remote_id: u32,
    pub _pad: u32,
}
