//! The device guard: a cgroup device program (what systemd's `DeviceAllow=`
//! compiles to) on the cgroup v2 root, attached with `BPF_F_ALLOW_MULTI`,
//! so that it runs for every process beside the programs of systemd and
//! container runtimes below it, each of which must allow an open.
//!
//! It rules only the device nodes of the RDMA devices pkeyfw made for one
//! tenant each (`own_device`: their uverbs, umad and issm nodes, `NODES`):
//! such a node opens for the tenant whose `[[bind]]` rule is the first to
//! match the opening task — the rule that would bind the QPs it makes — and
//! for root outside every tenant (the host's own tools, pkeyfw); for anyone
//! else the open fails with EPERM. Every other device is left to the other
//! programs. While a device is being made (`SEALED`), a node of the RDMA
//! core's majors (`MAJORS`) that the guard does not know yet is refused
//! too: the new device's nodes exist before the loader can name them.
//!
//! The rules and each node's owner come in two generations; one write of
//! `ACTIVE` switches from one to the other. A node's owner is a rule's
//! index: written apart, a reload that moves rules would for a moment give
//! a device to the tenant of the rule now at its old index, and an fd
//! opened then outlives the reload.
#![no_std]
#![no_main]

mod object;
mod repeat;
mod task;

use aya_ebpf::{
    Global,
    bindings::{BPF_DEVCG_ACC_READ, BPF_DEVCG_ACC_WRITE, BPF_DEVCG_DEV_CHAR},
    btf_maps::{Array, HashMap, PerCpuArray},
    macros::{btf_map, cgroup_device},
    programs::DeviceContext,
};
use pkeyfw_common::abi::{
    BindSpec, Creation, DEVICE_MAJORS, DEVICE_NODES, MAX_RULES, NO_TENANT, QpLayout, node_key,
};
use repeat::{Body, repeat};

/// A tenant device's nodes, by [`node_key`], per generation: the index of
/// its tenant's rule in that generation's `TENANTS`; [`NO_TENANT`] for a
/// node of any other RDMA device (known, so that it opens while the guard
/// is sealed); `CLOSED` for one of a device no tenant may open (going,
/// or not made yet in that generation).
#[btf_map]
static NODES: HashMap<u32, [u32; 2], { DEVICE_NODES as usize }> = HashMap::new();

/// The host policy's `[[bind]]` rules, in file order, as the probes read
/// them: generation 0's, then generation 1's.
#[btf_map]
static TENANTS: Array<BindSpec, { 2 * MAX_RULES as usize }> = Array::new();

/// The generation in force (0 or 1).
#[btf_map]
static ACTIVE: Array<u32, 1> = Array::new();

/// The character device majors of the RDMA core (uverbs, umad), as keys.
#[btf_map]
static MAJORS: HashMap<u32, u32, { DEVICE_MAJORS as usize }> = HashMap::new();

/// Non-zero while the loader makes a tenant's device: nodes of the RDMA
/// majors not in `NODES` are refused.
#[btf_map]
static SEALED: Array<u32, 1> = Array::new();

/// Set by the loader from the kernel's BTF (the task offsets only).
#[unsafe(no_mangle)]
static LAYOUT: Global<QpLayout> = Global::new(QpLayout::NONE);

/// 1: the open may go on (as far as this program is concerned); 0: EPERM.
#[cgroup_device]
pub fn pkeyfw_guard(ctx: DeviceContext) -> i32 {
    // SAFETY: the kernel's context, valid for the call. (Copied: a map
    // key must be on the stack, not in the context.)
    let (access, major, minor) = unsafe {
        let dev = &*ctx.device;
        (dev.access_type, dev.major, dev.minor)
    };
    // Opens only: making a node (devtmpfs does, as a device appears) lets
    // no one use it.
    let opens = (access >> 16) & (BPF_DEVCG_ACC_READ | BPF_DEVCG_ACC_WRITE) != 0;
    if access & 0xffff != BPF_DEVCG_DEV_CHAR || !opens {
        return 1;
    }
    let generation = ACTIVE.get(0).map_or(0, |g| *g & 1);
    // SAFETY: the values are copied out at once.
    let owner = match unsafe { NODES.get(&node_key(major, minor)) } {
        Some(owners) => {
            if generation == 0 {
                owners[0]
            } else {
                owners[1]
            }
        }
        None => {
            let rdma = unsafe { MAJORS.get(&major) }.is_some();
            let sealed = SEALED.get(0).is_some_and(|s| *s != 0);
            return i32::from(!(rdma && sealed));
        }
    };
    if owner == NO_TENANT {
        return 1;
    }
    let Some(m) = SCRATCH.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: this CPU's scratch value; a device program does not nest.
    let m = unsafe { &mut *m };
    task::current_task(&mut m.me, &LAYOUT.load());
    m.base = generation * MAX_RULES;
    match first_tenant(m) {
        MAX_RULES => i32::from(m.me.uid == 0),
        rule => i32::from(rule == owner),
    }
}

/// Who opens, and the first rule whose tenant they are: per CPU, off the
/// stack.
#[repr(C)]
struct Matching {
    me: Creation,
    found: u32,
    /// Where the generation's rules start in `TENANTS`.
    base: u32,
}

#[btf_map]
static SCRATCH: PerCpuArray<Matching, 1> = PerCpuArray::new();

/// The index of the first rule whose tenant `m.me` is (`MAX_RULES`: none,
/// root outside every tenant opens as the host's), in a loop the kernel
/// runs.
#[inline(always)]
fn first_tenant(m: &mut Matching) -> u32 {
    m.found = MAX_RULES;
    repeat(MAX_RULES, m);
    m.found
}

impl Body for Matching {
    /// Rule `i`: stops if it admits the opener or ends the list.
    #[inline(always)]
    fn turn(&mut self, i: u32) -> bool {
        match TENANTS.get(self.base + i) {
            Some(rule) if rule.admits(&self.me) => {
                self.found = i;
                true
            }
            Some(_) => false,
            None => true,
        }
    }
}
