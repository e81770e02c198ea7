//! What a device can hold, from the device itself: `ibv_query_device`'s
//! `max_qp`, through libibverbs, opened at run time (RDMA netlink does not
//! report it). pkeyfw builds and runs without libibverbs; then the caller
//! says what it assumed.

mod libibverbs;

use std::ffi::c_int;

use anyhow::{Context as _, Result, bail};

use libibverbs::{Libibverbs, Ptr};

/// `struct ibv_device_attr`'s `max_qp`: after `fw_ver[64]`, four u64 and
/// three u32 (rdma-core's verbs.h, a stable ABI).
const MAX_QP_AT: usize = 64 + 4 * 8 + 3 * 4;
/// Larger than `struct ibv_device_attr` (232 bytes).
const ATTR_BYTES: usize = 512;

/// `max_qp` of RDMA device `name` (e.g. `rxe0`).
pub fn max_qp(name: &str) -> Result<u32> {
    let lib = Libibverbs::open()?;
    type Query = unsafe extern "C" fn(Ptr, *mut u8) -> c_int;
    type Close = unsafe extern "C" fn(Ptr) -> c_int;
    // SAFETY: the symbols have these C signatures (verbs.h).
    let (query, close) = unsafe {
        (
            lib.sym::<Query>(c"ibv_query_device")?,
            lib.sym::<Close>(c"ibv_close_device")?,
        )
    };
    let ctx = lib.open_device(name)?;
    let mut attr = [0u64; ATTR_BYTES / 8];
    // SAFETY: an open context and a buffer larger than the struct.
    let rc = unsafe { query(ctx, attr.as_mut_ptr().cast()) };
    // SAFETY: opened above.
    unsafe { close(ctx) };
    if rc != 0 {
        bail!("ibv_query_device({name}) failed ({rc})");
    }
    let bytes: &[u8] = as_bytes(&attr);
    let max = i32::from_ne_bytes(bytes[MAX_QP_AT..MAX_QP_AT + 4].try_into()?);
    u32::try_from(max).with_context(|| format!("{name} reports max_qp {max}"))
}

/// The bytes of a u64 buffer.
fn as_bytes(words: &[u64]) -> &[u8] {
    // SAFETY: u64 has no padding and any u8 is valid.
    unsafe { std::slice::from_raw_parts(words.as_ptr().cast(), size_of_val(words)) }
}
