//! The pod's RDMA device: a soft-RoCE (rdma_rxe) device on the pod's own
//! interface, confined to the pod's network namespace, which the RDMA
//! subsystem in exclusive mode lets no other namespace see or open. Its
//! QPs then reach other pods only as frames through the pod's bridge port,
//! where the partition is judged: never inside rdma_rxe, as QPs of one
//! shared device do.
//!
//! rdma_rxe registers a device in the initial namespace whatever the
//! namespace of its network device (or of the runtime, which may run in a
//! namespace of its own, as a node of kind does); it is then moved from
//! there (`rdma dev set … netns`). rdma_rxe in Linux 6.12 and older
//! refuses the move (EOPNOTSUPP); such a node cannot isolate pods this
//! way, and ADD says so. In 7.3 the move works, but the device's
//! management QP (QP1) is not made again in the new namespace (rdma_rxe
//! keeps the first one's index, `qp_gsi_index`, after ib_mad destroys it,
//! and refuses a second), so rdma_cm, whose connection management runs
//! over QP1, does not work on a pod's device; verbs programs that exchange
//! their QP numbers otherwise (`ibv_*_pingpong`, MPI and NCCL bootstraps,
//! perftest without `-R`) do.

use std::path::Path;

use anyhow::Result;
use aya::util::KernelVersion;

use super::protocol::{CniError, code};
use crate::host::{
    netlink,
    netns::{self, Netns},
    rdma::{self, link},
};

/// What the node needs before any pod gets a device: exclusive mode.
pub fn require_exclusive() -> Result<(), CniError> {
    let mode = initial().and_then(|initial| initial.run(link::netns_exclusive)?);
    match mode {
        Ok(true) => Ok(()),
        Ok(false) => Err(CniError::new(
            code::NODE,
            "the RDMA subsystem shares every device with every network namespace (`rdma system show netns`: shared)",
            "pkeyfw gives each pod a device that only its namespace sees and opens, which needs exclusive mode: set it at boot, before any container starts (`options ib_core netns_mode=0` in /etc/modprobe.d, or `rdma system set netns exclusive` while no namespace but the host's exists)",
        )),
        Err(e) => Err(CniError::new(
            code::NODE,
            "cannot read the RDMA subsystem's mode",
            format!("{e:#}; the node needs RDMA support (ib_core, rdma_rxe)"),
        )),
    }
}

/// Why a node whose rdma_rxe does not move cannot isolate pods.
const CANNOT_CONFINE: &str =
    "this kernel's rdma_rxe cannot be confined to a pod's network namespace";
const MOVES_FROM_LINUX_7: &str = "rdma_rxe can be moved from Linux 7.x (Debian 13 trixie-backports' 7.3), not in 6.12 or older: run RDMA pods on a node pool with such a kernel, or isolate pods by node pool (deploy/kubernetes-node-pools)";

/// What the node needs to confine a pod's device: a kernel whose rdma_rxe
/// moves into a network namespace, by its version. (ADD tries the move
/// itself, and says the same where the kernel refuses it.)
pub fn require_movable(kernel: KernelVersion) -> Result<(), CniError> {
    if kernel >= KernelVersion::new(7, 0, 0) {
        return Ok(());
    }
    Err(CniError::new(
        code::NODE,
        CANNOT_CONFINE,
        format!("this is Linux {kernel}; {MOVES_FROM_LINUX_7}"),
    ))
}

/// The initial network namespace, where rdma_rxe registers devices (that
/// of PID 1, the host's).
fn initial() -> Result<Netns> {
    Netns::at(Path::new(&format!("/proc/{}/ns/net", netns::host_pid())))
}

/// Makes device `name` on the pod's `ifname` and moves it into the pod's
/// namespace. On a failure nothing is left of it.
pub fn make(name: &str, ifname: &str, netns: &Netns) -> Result<(), CniError> {
    // What an ADD that died half-way left.
    remove(name, Some(netns)).map_err(|e| CniError::setup(e, "removing a leftover device"))?;
    netns
        .run(|| link::add_rxe(name, ifname))
        .and_then(|made| made)
        .map_err(|e| {
            CniError::setup(
                e,
                &format!("making soft-RoCE device {name} on the pod's {ifname}"),
            )
        })?;
    if let Err(e) = confine(name, netns) {
        let _ = remove(name, Some(netns));
        return Err(e);
    }
    Ok(())
}

/// Moves `name` from the initial namespace into the pod's and checks that
/// only the pod's sees it.
fn confine(name: &str, netns: &Netns) -> Result<(), CniError> {
    let initial = initial().map_err(|e| CniError::setup(e, "opening the initial namespace"))?;
    let in_initial = || initial.run(|| link::index_of(name)).and_then(|found| found);
    let made = in_initial().map_err(|e| CniError::setup(e, "finding the new device"))?;
    if let Some(index) = made
        && let Err(e) = initial
            .run(|| link::move_to(index, netns))
            .and_then(|moved| moved)
    {
        if link::errno(&e) == Some(libc::EOPNOTSUPP) {
            return Err(CniError::new(
                code::NODE,
                CANNOT_CONFINE,
                format!(
                    "moving soft-RoCE device {name} into the pod's namespace failed ({e:#}); {MOVES_FROM_LINUX_7}; the device was removed, nothing was changed"
                ),
            ));
        }
        return Err(CniError::setup(
            e,
            &format!("moving soft-RoCE device {name} into the pod's namespace"),
        ));
    }
    let in_pod = netns
        .run(|| link::index_of(name))
        .and_then(|found| found)
        .map_err(|e| CniError::setup(e, "looking for the device in the pod's namespace"))?;
    let on_host =
        in_initial().map_err(|e| CniError::setup(e, "looking for the device on the host"))?;
    if in_pod.is_none() || on_host.is_some() {
        return Err(CniError::new(
            code::SETUP,
            format!("soft-RoCE device {name} is not the pod's alone"),
            format!(
                "after the move the pod's namespace {} it and the initial one {} it",
                if in_pod.is_some() {
                    "sees"
                } else {
                    "does not see"
                },
                if on_host.is_some() {
                    "sees"
                } else {
                    "does not see"
                },
            ),
        ));
    }
    Ok(())
}

/// Removes device `name` wherever it is seen: in the pod's namespace (if
/// it is still there) and in the initial one (where a failed move, or a
/// namespace's end, leaves it). None is not an error.
pub fn remove(name: &str, netns: Option<&Netns>) -> Result<()> {
    let initial = initial()?;
    for ns in netns.into_iter().chain([&initial]) {
        if let Some(index) = ns.run(|| link::index_of(name))?? {
            ns.run(|| link::delete(index))??;
        }
    }
    Ok(())
}

/// Whether device `name` is bound to the pod's `ifname`, seen in the pod's
/// namespace and not in the initial one.
pub fn check(name: &str, ifname: &str, netns: &Netns) -> Result<(), CniError> {
    let bound = netns
        .run(|| -> Result<bool> {
            let index = netlink::if_index(ifname)?;
            Ok(rdma::devices_on(index)?.iter().any(|d| d.name == name))
        })
        .and_then(|b| b)
        .map_err(|e| checked(format!("reading the pod's RDMA devices: {e:#}")))?;
    if !bound {
        return Err(checked(format!(
            "the pod's namespace has no device {name} on {ifname}"
        )));
    }
    let on_host = initial()
        .and_then(|initial| initial.run(|| link::index_of(name))?)
        .map_err(|e| checked(format!("reading the host's RDMA devices: {e:#}")))?;
    if on_host.is_some() {
        return Err(checked(format!("the host's namespace sees device {name}")));
    }
    Ok(())
}

fn checked(what: String) -> CniError {
    CniError::new(
        code::CHECK,
        what,
        "the pod's RDMA device is not as ADD left it",
    )
}
