//! The RDMA-core probes of an attachment (see pkeyfw-ebpf's probes.rs): the
//! QP-creation probes, which bind each new QP by the `[[bind]]` rules as it
//! is created and wake a foreground attachment to reconcile; the modify
//! probes, which capture the Q_Key a QP sets; the destroy probe, which
//! unbinds; and the multicast probes, which report a QP that joins another
//! partition's group. They share the filter's maps through its pins, and
//! their links are pinned beside the filter's (`probe-NAME`), so they go on
//! with no pkeyfw process and go with `pkeyfw detach`. Where the creation
//! probes cannot attach (no ib_core, no kprobes), userspace binding alone
//! remains; where the others cannot (no ib_core BTF), Q_Keys go uncaptured
//! and joins unreported.
//!
//! Also here: where the egress program finds, in rdma_rxe's own state,
//! which QP sent a frame ([`sender_layout`]).

use std::{
    os::fd::{AsRawFd, RawFd},
    path::Path,
    time::Instant,
};

use anyhow::{Context as _, Result, anyhow, bail};
use aya::{
    Ebpf, EbpfLoader,
    maps::{MapData, RingBuf},
    programs::{KProbe, links::FdLink},
    util::KernelVersion,
};
use aya_log::EbpfLogger;
use pkeyfw_common::abi::{
    CmLayout, DEVICES, GENERATIONS, MAPS, MapSize, NO_DEVICE, QpLayout, SenderLayout, cm::cm_state,
    name,
};

use crate::{
    host::rdma,
    loading::{btf::Btf, cost::Cost},
    reporting::kernel_log::KernelLog,
};

/// The probes object built from pkeyfw-ebpf's `pkeyfw-probes`.
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/pkeyfw-probes"));

/// The probe on where every QP becomes visible (user and kernel QPs).
const BINDER: (&str, &str) = ("pkeyfw_resource_added", "rdma_restrack_add");
/// The probe on where a kernel user of rdma_cm makes a QP for a connection:
/// which rdma_cm ports it serves and connects to, for `port` rules.
const CM_PORTS: (&str, &str) = ("pkeyfw_cm_qp", "rdma_create_qp");
/// The probe on where a QP leaves the table once destroyed, and the
/// functions that are that place, newest kernels first: a destroy that
/// succeeds ends in rdma_restrack_finish_del where the kernel deletes in
/// two steps (Debian's 6.1 among them), else in rdma_restrack_del.
const UNBINDER: (&str, [&str; 3]) = (
    "pkeyfw_resource_removed",
    [
        "rdma_restrack_finish_del",
        "rdma_restrack_commit_del",
        "rdma_restrack_del",
    ],
);
/// The probes that read the RDMA structures, and what they probe: the
/// modify every user QP's goes through (uverbs), the multicast attach
/// (uverbs and kernel users alike). Each acts at the entry, which no
/// number of calls at once can make miss; the modify's return probe only
/// undoes a Q_Key a failed call asked for.
const READERS: [(&str, &str); 3] = [
    ("pkeyfw_modify", "ib_modify_qp_with_udata"),
    ("pkeyfw_modified", "ib_modify_qp_with_udata"),
    ("pkeyfw_join", "ib_attach_mcast"),
];
/// The connection probes, and what they probe: where rdma_cm starts a
/// listener (each ID's own, a process's or a kernel user's), where it has
/// ib_cm listen for it once its port is its, and where it destroys an ID;
/// where ib_cm sends a REQ, a REP or a SIDR_REQ (under the sender's
/// ID) and a SIDR_REP (under the requester's). Entry probes all, on
/// exported functions of rdma_cm and ib_cm from Linux 6.1 to 7.x.
const LISTENING: [(&str, &str); 3] = [
    ("pkeyfw_listen", "rdma_listen"),
    ("pkeyfw_listening", "ib_cm_insert_listen"),
    ("pkeyfw_unlisten", "rdma_destroy_id"),
];
const CONNECTING: [(&str, &str); 4] = [
    ("pkeyfw_cm_send", "ib_send_cm_req"),
    ("pkeyfw_cm_send", "ib_send_cm_rep"),
    ("pkeyfw_cm_send", "ib_send_cm_sidr_req"),
    ("pkeyfw_cm_answer", "ib_send_cm_sidr_rep"),
];

/// The probes and the ring buffer the creation probe signals through.
pub struct Probes {
    /// Holds the programs and their attachments.
    _ebpf: Ebpf,
    ring: RingBuf<MapData>,
    /// Why the connection and multicast probes are not attached, if not.
    pub readers: Result<(), String>,
    /// Why the rdma_cm ports of kernel users' QPs are not read at their
    /// creation, if not.
    pub cm_ports: Result<(), String>,
    /// Why connection setup is not partitioned, if not: the connection
    /// probes could not be attached (then the filter judges a CM request
    /// by QP1's rule alone, and CM MADs keep their key).
    pub connections: Result<(), String>,
    /// Their rare failures (a table full, a structure unreadable), for the
    /// attachment to print, or why they cannot be read; taken once.
    pub log: Option<Result<EbpfLogger<KernelLog>>>,
}

impl Probes {
    /// Loads and attaches the probes for the filter pinned under `pins`,
    /// on interface `ifindex`.
    pub fn start(pins: &Path, ifindex: u32, log: KernelLog) -> Result<Probes> {
        // The maps the probes write allocate their entries at run time,
        // which Linux takes from kprobes since 6.1 (its BPF memory
        // allocator) and only warns about before, tainting the kernel.
        let kernel = KernelVersion::current().context("reading the kernel version")?;
        if kernel < KernelVersion::new(6, 1, 0) {
            bail!("the probes need Linux 6.1 or later, this is {kernel}");
        }
        let mut layout = layout(ifindex);
        let cm = cm_offsets();
        if let (Ok(layout), Ok((src, dst))) = (&mut layout, &cm) {
            (layout.cm_src, layout.cm_dst) = (*src, *dst);
        }
        let cm_layout = layout
            .as_ref()
            .map_err(|e| anyhow!("{e:#}"))
            .and_then(|_| cm_layout());
        let mut ebpf = object(pins, layout.as_mut().ok(), cm_layout.as_ref().ok())?;
        let readers = layout.map_err(|e| format!("{e:#}")).and_then(|_| {
            READERS
                .iter()
                .try_for_each(|&(p, f)| attach(&mut ebpf, p, f, pins))
        });
        let cm_ports = cm.map_err(|e| format!("{e:#}")).and_then(|_| {
            let (p, f) = CM_PORTS;
            attach(&mut ebpf, p, f, pins)
        });
        let connections = cm_layout.map_err(|e| format!("{e:#}")).and_then(|_| {
            LISTENING
                .iter()
                .chain(&CONNECTING)
                .try_for_each(|&(p, f)| attach(&mut ebpf, p, f, pins))
        });
        let (p, f) = BINDER;
        attach(&mut ebpf, p, f, pins).map_err(|e| anyhow!("{e} (is ib_core loaded?)"))?;
        let (p, places) = UNBINDER;
        let mut tried = Vec::new();
        if !places.iter().any(|f| match attach(&mut ebpf, p, f, pins) {
            Ok(()) => true,
            Err(e) => {
                tried.push(e);
                false
            }
        }) {
            bail!("no place to see a QP destroyed: {}", tried.join("; "));
        }
        let ring = RingBuf::try_from(
            ebpf.take_map("QP_CREATED")
                .ok_or_else(|| anyhow!("the probes object has no ring buffer"))?,
        )?;
        let log = EbpfLogger::init_with_logger(&mut ebpf, log)
            .context("reading the probes' kernel log (aya-log)");
        Ok(Probes {
            _ebpf: ebpf,
            ring,
            readers,
            cm_ports,
            connections,
            log: Some(log),
        })
    }

    /// Which records of connection setup these probes keep
    /// (`cm_state::RECORDS`): the filter judges CM requests by them, and
    /// stamps CM MADs, only where they do.
    pub fn cm_records(&self) -> u64 {
        match self.connections {
            Ok(()) => cm_state::RECORDS_LISTENERS | cm_state::RECORDS_CONNECTIONS,
            Err(_) => 0,
        }
    }

    /// Empties the ring; whether any QP was created since the last call.
    pub fn drain(&mut self) -> bool {
        let mut any = false;
        while self.ring.next().is_some() {
            any = true;
        }
        any
    }
}

/// The probes object, sharing the maps of the filter pinned under `pins`,
/// reading the kernel's structures as `layout` and `cm` say (where they
/// are known: else they read nothing, and find no QP or listener of the
/// attachment).
fn object(pins: &Path, layout: Option<&mut QpLayout>, cm: Option<&CmLayout>) -> Result<Ebpf> {
    let mut loader = EbpfLoader::new();
    let mut sizes = std::collections::HashMap::new();
    for spec in MAPS {
        let pin = pins.join(spec.name);
        if spec.size != MapSize::Fixed {
            let size = MapData::from_pin(&pin)
                .and_then(|m| Ok(m.info()?.max_entries()))
                .with_context(|| format!("opening {}", pin.display()))?;
            loader.map_max_entries(spec.name, size);
            sizes.insert(spec.name, size);
        }
        loader.map_pin_path(spec.name, pin);
    }
    // Unknown: no device of the attachment's, so no QP is read.
    let mut unknown = QpLayout::NONE;
    let layout = layout.unwrap_or(&mut unknown);
    layout.qpns = sizes[name::QPS] / GENERATIONS;
    loader
        .override_global("LAYOUT", &*layout, true)
        .override_global("CM_LAYOUT", cm.unwrap_or(&CmLayout::default()), true)
        .load(OBJECT)
        .context("loading the RDMA probes")
}

/// Loads (verifies) every probe for the filter pinned under `pins`,
/// attaching none, and returns what each cost.
pub fn costs(pins: &Path) -> Result<Vec<Cost>> {
    // Where the kernel has no ib_core, offsets as plausible as any: a zero
    // one would let the verifier drop the code that reads it.
    let mut layout = Btf::of_module("ib_core")
        .and_then(|btf| layout_of(&btf, [0].into_iter()))
        .unwrap_or(QpLayout {
            qp_device: 8,
            qp_num: 8,
            device_index: 8,
            devices: [0, NO_DEVICE, NO_DEVICE, NO_DEVICE],
            qp_type: 8,
            qp_res: 8,
            res_type: 8,
            res_user: 8,
            res_kern_name: 8,
            attr_qkey: 8,
            task_cred: 8,
            task_nsproxy: 8,
            cred_euid: 8,
            cred_egid: 8,
            nsproxy_net: 8,
            net_cookie: 8,
            qpns: 0,
            cm_src: 8,
            cm_dst: 8,
        });
    let cm = cm_layout_of(
        &Btf::of_module("rdma_cm").and_then(|cm| Btf::of_module("ib_cm").map(|ib| (cm, ib))),
    )
    .unwrap_or(PLAUSIBLE_CM);
    let mut ebpf = object(pins, Some(&mut layout), Some(&cm))?;
    let names: Vec<String> = ebpf.programs().map(|(n, _)| n.to_string()).collect();
    names
        .iter()
        .map(|name| {
            let program: &mut KProbe = ebpf
                .program_mut(name)
                .expect("listed")
                .try_into()
                .with_context(|| format!("{name} is no kprobe"))?;
            let started = Instant::now();
            program
                .load()
                .with_context(|| format!("loading {name} (verifier)"))?;
            Ok(Cost::of(&program.info()?, name, started.elapsed()))
        })
        .collect()
}

/// Where the kernel has no rdma_cm or ib_cm, offsets as plausible as any
/// for [`costs`]: a zero one would let the verifier drop the code that
/// reads it.
const PLAUSIBLE_CM: CmLayout = CmLayout {
    netns: 1,
    id_internal: 8,
    id_afonly: 8,
    id_qp_num: 8,
    id_cm: 8,
    id_res: 8,
    id_device: 8,
    id_src: 8,
    id_net: 8,
    id_ps: 8,
    id_qp_type: 8,
    cm_context: 8,
    cm_local_id: 8,
    cm_remote_id: 8,
    _pad: 0,
};

/// Where the connection probes read rdma_cm's and ib_cm's structures, for
/// an attachment in this thread's network namespace (its interface's),
/// whose listeners the requests it receives are for.
fn cm_layout() -> Result<CmLayout> {
    let btf = Btf::of_module("rdma_cm")
        .and_then(|cm| Btf::of_module("ib_cm").map(|ib| (cm, ib)))
        .map_err(|e| anyhow!("{e:#} (rdma_cm must be loaded when pkeyfw attaches)"));
    let mut layout = cm_layout_of(&btf)?;
    layout.netns = crate::host::netns::current_cookie()?;
    Ok(layout)
}

/// The offsets rdma_cm's and ib_cm's BTF give.
fn cm_layout_of(btf: &Result<(Btf, Btf)>) -> Result<CmLayout> {
    let (cm, ib) = btf.as_ref().map_err(|e| anyhow!("{e:#}"))?;
    let id = |path: &[&str]| cm.offset("rdma_id_private", path);
    let res_at = id(&["res"])?;
    Ok(CmLayout {
        netns: 0,
        id_internal: id(&["internal_id"])?,
        id_afonly: id(&["afonly"])?,
        id_qp_num: id(&["qp_num"])?,
        id_cm: id(&["cm_id"])?,
        id_res: res_at,
        id_device: id(&["id", "device"])?,
        id_src: id(&["id", "route", "addr", "src_addr"])?,
        id_net: id(&["id", "route", "addr", "dev_addr", "net"])?,
        id_ps: id(&["id", "ps"])?,
        id_qp_type: id(&["id", "qp_type"])?,
        cm_context: ib.offset("ib_cm_id", &["context"])?,
        cm_local_id: ib.offset("ib_cm_id", &["local_id"])?,
        cm_remote_id: ib.offset("ib_cm_id", &["remote_id"])?,
        _pad: 0,
    })
}

/// Loads program `name` of the object, attaches it to `function` and pins
/// the link under `pins`.
fn attach(ebpf: &mut Ebpf, name: &str, function: &str, pins: &Path) -> Result<(), String> {
    let program: &mut KProbe = ebpf
        .program_mut(name)
        .ok_or_else(|| format!("the probes object has no {name}"))?
        .try_into()
        .map_err(|e| format!("{e}"))?;
    if program.fd().is_err() {
        program.load().map_err(|e| format!("loading {name}: {e}"))?;
    }
    let id = program
        .attach(function, 0)
        .map_err(|e| format!("probing {function}: {e}"))?;
    let link = program.take_link(id).map_err(|e| format!("{e}"))?;
    let pin = pins.join(format!("probe-{name}-{function}"));
    FdLink::try_from(link)
        .map_err(|e| format!("{name} has no BPF link to pin ({e}); Linux 5.15 or later is needed"))?
        .pin(&pin)
        .map(drop)
        .map_err(|e| format!("pinning {}: {e}", pin.display()))
}

/// Where the probes find what it reads, and the RDMA devices on
/// the interface.
fn layout(ifindex: u32) -> Result<QpLayout> {
    let btf = Btf::of_module("ib_core")?;
    let devices = rdma::devices_on(ifindex)?;
    layout_of(&btf, devices.iter().map(|d| d.index))
}

/// The layout ib_core's BTF gives, for the RDMA devices of these indices.
fn layout_of(btf: &Btf, devices: impl ExactSizeIterator<Item = u32>) -> Result<QpLayout> {
    Ok(QpLayout {
        qp_device: btf.offset("ib_qp", &["device"])?,
        qp_num: btf.offset("ib_qp", &["qp_num"])?,
        device_index: btf.offset("ib_device", &["index"])?,
        devices: device_slots(devices)?,
        qp_type: btf.offset("ib_qp", &["qp_type"])?,
        qp_res: btf.offset("ib_qp", &["res"])?,
        res_type: btf.offset("rdma_restrack_entry", &["type"])?,
        res_user: btf.offset("rdma_restrack_entry", &["user"])?,
        res_kern_name: btf.offset("rdma_restrack_entry", &["kern_name"])?,
        attr_qkey: btf.offset("ib_qp_attr", &["qkey"])?,
        ..task_layout(btf)?
    })
}

/// Where who a task is lies in the kernel's structures (its credentials'
/// effective ids, its network namespace's cookie), from `btf`: the part of
/// a [`QpLayout`] the device guard reads too; nothing else is set.
pub fn task_layout(btf: &Btf) -> Result<QpLayout> {
    Ok(QpLayout {
        task_cred: btf.offset("task_struct", &["cred"])?,
        task_nsproxy: btf.offset("task_struct", &["nsproxy"])?,
        cred_euid: btf.offset("cred", &["euid"])?,
        cred_egid: btf.offset("cred", &["egid"])?,
        nsproxy_net: btf.offset("nsproxy", &["net_ns"])?,
        net_cookie: btf.offset("net", &["net_cookie"])?,
        ..QpLayout::default()
    })
}

/// Where a `struct rdma_cm_id` keeps its own and its peer's address
/// (rdma_cm's BTF), for [`CM_PORTS`]'s probe.
fn cm_offsets() -> Result<(u32, u32)> {
    let btf = Btf::of_module("rdma_cm")?;
    Ok((
        btf.offset("rdma_cm_id", &["route", "addr", "src_addr"])?,
        btf.offset("rdma_cm_id", &["route", "addr", "dst_addr"])?,
    ))
}

/// The layout's device slots for these device indices.
fn device_slots(indices: impl ExactSizeIterator<Item = u32>) -> Result<[u32; DEVICES]> {
    if indices.len() > DEVICES {
        bail!(
            "{} RDMA devices on the interface; pkeyfw follows at most {DEVICES}",
            indices.len()
        );
    }
    let mut slots = [NO_DEVICE; DEVICES];
    for (slot, index) in slots.iter_mut().zip(indices) {
        *slot = index;
    }
    Ok(slots)
}

/// Where the egress program reads which QP sent a frame, for the rdma_rxe
/// devices among an interface's `devices` (see [`SenderLayout`]): none when
/// the interface has none, or their BTF is missing (then every outgoing
/// frame is a process's, and leaves with the default P_Key).
pub fn sender_layout(devices: &[rdma::Device]) -> Result<SenderLayout> {
    let rxe: Vec<u32> = devices
        .iter()
        .filter(|d| d.driver == rdma::Driver::Rxe)
        .map(|d| d.index)
        .collect();
    if rxe.is_empty() {
        return Ok(SenderLayout::NONE);
    }
    // rdma_rxe's BTF has the kernel's types beneath it, and ib_core's that
    // it uses.
    let btf = Btf::of_module("rdma_rxe")?;
    Ok(SenderLayout {
        skb_sk: btf.offset("sk_buff", &["sk"])?,
        sk_user_data: btf.offset("sock", &["sk_user_data"])?,
        rxe_ibqp: btf.offset("rxe_qp", &["ibqp"])?,
        rxe_sk: btf.offset("rxe_qp", &["sk"])?,
        socket_sk: btf.offset("socket", &["sk"])?,
        qp_device: btf.offset("ib_qp", &["device"])?,
        qp_num: btf.offset("ib_qp", &["qp_num"])?,
        device_index: btf.offset("ib_device", &["index"])?,
        devices: device_slots(rxe.into_iter())?,
    })
}

impl AsRawFd for Probes {
    fn as_raw_fd(&self) -> RawFd {
        self.ring.as_raw_fd()
    }
}
