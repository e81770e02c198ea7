//! Who the current task is, as a `[[bind]]` rule sees it: read the same way
//! by the QP-creation probe (who made a QP) and the device guard (who opens
//! a tenant's device), from the kernel's structures at offsets the loader
//! found in BTF.

use core::ptr;

use aya_ebpf::helpers::{
    bpf_get_current_ancestor_cgroup_id, bpf_get_current_pid_tgid, bpf_get_current_task, generated,
};
use pkeyfw_common::abi::{Creation, QpLayout, comm_padded};

/// Who the current task is, as a `[[bind]]` rule sees it, into `c`: its
/// command name (padded as rules keep names), cgroup and its ancestors,
/// network namespace's cookie, process and effective ids. An unreadable
/// field reads as matching nothing (u32::MAX is no uid or gid).
#[inline(always)]
pub fn current_task(c: &mut Creation, layout: &QpLayout) {
    // SAFETY: no preconditions.
    let task = unsafe { bpf_get_current_task() } as *const u8;
    let cred: *const u8 = read_or(task, layout.task_cred, ptr::null());
    let nsproxy: *const u8 = read_or(task, layout.task_nsproxy, ptr::null());
    let net: *const u8 = read_or(nsproxy, layout.nsproxy_net, ptr::null());
    // SAFETY: a buffer of the size given.
    unsafe {
        generated::bpf_get_current_comm(c.comm.as_mut_ptr().cast(), c.comm.len() as u32);
    }
    // The helper may leave the tail of the last name this buffer held.
    c.comm = comm_padded(c.comm);
    for (level, id) in c.cgroups.iter_mut().enumerate() {
        // SAFETY: no preconditions; 0 when the task is not that deep.
        *id = unsafe { bpf_get_current_ancestor_cgroup_id(level as i32) };
    }
    c.netns = read_or(net, layout.net_cookie, 0);
    c.pid = (bpf_get_current_pid_tgid() >> 32) as u32;
    c.uid = read_id(cred, layout.cred_euid);
    c.gid = read_id(cred, layout.cred_egid);
}

/// A uid or gid at `base + offset` in kernel memory; u32::MAX (no id,
/// which no rule names) if unreadable, where a failed read would leave 0,
/// root's.
#[inline(always)]
pub fn read_id(base: *const u8, offset: u32) -> u32 {
    let mut v = 0u32;
    // SAFETY: bpf_probe_read_kernel checks the address.
    let failed = unsafe {
        generated::bpf_probe_read_kernel(
            (&mut v as *mut u32).cast(),
            size_of::<u32>() as u32,
            base.wrapping_add(offset as usize).cast(),
        )
    } != 0;
    v | u32::from(failed).wrapping_neg()
}

/// A `T` at `base + offset` in kernel memory, `or` if unreadable, with no
/// branch on which.
#[inline(always)]
pub fn read_or<T: Copy>(base: *const u8, offset: u32, or: T) -> T {
    let mut v = or;
    // SAFETY: bpf_probe_read_kernel checks the address and leaves `v` as it
    // was (zeroed, in fact: so `or` only names the intent) on failure.
    unsafe {
        generated::bpf_probe_read_kernel(
            (&mut v as *mut T).cast(),
            size_of::<T>() as u32,
            base.wrapping_add(offset as usize).cast(),
        );
    }
    v
}
