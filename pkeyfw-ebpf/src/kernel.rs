//! Reading kernel memory at offsets the loader found in BTF: shared by the
//! egress program (which QP sent a frame) and the RDMA-core probes.

use aya_ebpf::helpers::bpf_probe_read_kernel;

/// A `T` at `base + offset` in kernel memory; None where it cannot be read
/// (a null or stale pointer).
#[inline(always)]
pub fn read<T>(base: *const u8, offset: u32) -> Option<T> {
    // SAFETY: bpf_probe_read_kernel checks the address.
    unsafe { bpf_probe_read_kernel(base.wrapping_add(offset as usize).cast::<T>()) }.ok()
}
