//! What a device can hold, from the device itself: `ibv_query_device`'s
//! `max_qp`, through libibverbs, opened at run time (RDMA netlink does not
//! report it). pkeyfw builds and runs without libibverbs; then the caller
//! says what it assumed.

use std::ffi::{CStr, c_char, c_int, c_void};

use anyhow::{Context as _, Result, bail};

/// `struct ibv_device_attr`'s `max_qp`: after `fw_ver[64]`, four u64 and
/// three u32 (rdma-core's verbs.h, a stable ABI).
const MAX_QP_AT: usize = 64 + 4 * 8 + 3 * 4;
/// Larger than `struct ibv_device_attr` (232 bytes).
const ATTR_BYTES: usize = 512;

/// `max_qp` of RDMA device `name` (e.g. `rxe0`).
pub fn max_qp(name: &str) -> Result<u32> {
    // SAFETY: dlopen with a constant name; the handle is never closed
    // (libibverbs keeps global state), which costs one mapping.
    let lib = unsafe { libc::dlopen(c"libibverbs.so.1".as_ptr(), libc::RTLD_NOW) };
    if lib.is_null() {
        bail!("libibverbs.so.1 is not installed");
    }
    let sym = |s: &CStr| -> Result<*mut c_void> {
        // SAFETY: a live handle and a NUL-terminated name.
        let f = unsafe { libc::dlsym(lib, s.as_ptr()) };
        if f.is_null() {
            bail!("libibverbs has no {}", s.to_string_lossy());
        }
        Ok(f)
    };
    type List = unsafe extern "C" fn(*mut c_int) -> *mut *mut c_void;
    type Name = unsafe extern "C" fn(*mut c_void) -> *const c_char;
    type Open = unsafe extern "C" fn(*mut c_void) -> *mut c_void;
    type Query = unsafe extern "C" fn(*mut c_void, *mut u8) -> c_int;
    type Close = unsafe extern "C" fn(*mut c_void) -> c_int;
    type Free = unsafe extern "C" fn(*mut *mut c_void);
    // SAFETY: the symbols have these C signatures (verbs.h).
    let (list, dev_name, open, query, close, free) = unsafe {
        (
            std::mem::transmute::<*mut c_void, List>(sym(c"ibv_get_device_list")?),
            std::mem::transmute::<*mut c_void, Name>(sym(c"ibv_get_device_name")?),
            std::mem::transmute::<*mut c_void, Open>(sym(c"ibv_open_device")?),
            std::mem::transmute::<*mut c_void, Query>(sym(c"ibv_query_device")?),
            std::mem::transmute::<*mut c_void, Close>(sym(c"ibv_close_device")?),
            std::mem::transmute::<*mut c_void, Free>(sym(c"ibv_free_device_list")?),
        )
    };
    let mut n: c_int = 0;
    // SAFETY: as verbs.h documents; the list is freed below.
    let devices = unsafe { list(&mut n) };
    if devices.is_null() {
        bail!("libibverbs lists no devices");
    }
    let result = (0..n.max(0) as usize)
        // SAFETY: `n` entries.
        .map(|i| unsafe { *devices.add(i) })
        // SAFETY: a device of the list; its name is NUL-terminated.
        .find(|&d| unsafe { CStr::from_ptr(dev_name(d)) }.to_bytes() == name.as_bytes())
        .with_context(|| format!("libibverbs does not list {name}"))
        .and_then(|device| {
            // SAFETY: a device of the live list.
            let ctx = unsafe { open(device) };
            if ctx.is_null() {
                bail!("ibv_open_device({name}) failed");
            }
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
        });
    // SAFETY: the list from ibv_get_device_list, freed once.
    unsafe { free(devices) };
    result
}

/// The bytes of a u64 buffer.
fn as_bytes(words: &[u64]) -> &[u8] {
    // SAFETY: u64 has no padding and any u8 is valid.
    unsafe { std::slice::from_raw_parts(words.as_ptr().cast(), size_of_val(words)) }
}
