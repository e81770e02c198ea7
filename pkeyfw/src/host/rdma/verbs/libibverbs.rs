//! libibverbs, opened at run time: pkeyfw builds and runs without it. Only
//! std, libc and anyhow, as the test kit's soft-RoCE attacker includes this
//! file too (pkeyfw-lab-verbs): one opener for both, and the product keeps
//! no test code.

use std::ffi::{CStr, c_char, c_int, c_void};

use anyhow::{Context as _, Result, bail};

/// A libibverbs object: a device, a context, a PD, a CQ.
pub type Ptr = *mut c_void;

/// The loaded library. Never closed (libibverbs keeps global state), which
/// costs one mapping.
#[derive(Clone, Copy)]
pub struct Libibverbs(Ptr);

impl Libibverbs {
    pub fn open() -> Result<Libibverbs> {
        // SAFETY: dlopen with a constant name.
        let handle = unsafe { libc::dlopen(c"libibverbs.so.1".as_ptr(), libc::RTLD_NOW) };
        if handle.is_null() {
            bail!("libibverbs.so.1 is not installed");
        }
        Ok(Libibverbs(handle))
    }

    /// Function `name` of the library, as a `T`.
    ///
    /// # Safety
    /// `T` must be a function pointer type of the symbol's C signature
    /// (rdma-core's verbs.h).
    pub unsafe fn sym<T: Copy>(self, name: &CStr) -> Result<T> {
        const { assert!(size_of::<T>() == size_of::<Ptr>()) };
        // SAFETY: a loaded library and a NUL-terminated name.
        let p = unsafe { libc::dlsym(self.0, name.as_ptr()) };
        if p.is_null() {
            bail!("libibverbs has no {}", name.to_string_lossy());
        }
        // SAFETY: the caller's promise; the sizes are equal.
        Ok(unsafe { std::mem::transmute_copy::<Ptr, T>(&p) })
    }

    /// Opens RDMA device `name` (e.g. `rxe0`): its context, for
    /// `ibv_close_device` (or the process's exit) to close.
    pub fn open_device(self, name: &str) -> Result<Ptr> {
        type List = unsafe extern "C" fn(*mut c_int) -> *mut Ptr;
        type Name = unsafe extern "C" fn(Ptr) -> *const c_char;
        type Open = unsafe extern "C" fn(Ptr) -> Ptr;
        type Free = unsafe extern "C" fn(*mut Ptr);
        // SAFETY: the symbols have these C signatures (verbs.h).
        let (list, dev_name, open, free) = unsafe {
            (
                self.sym::<List>(c"ibv_get_device_list")?,
                self.sym::<Name>(c"ibv_get_device_name")?,
                self.sym::<Open>(c"ibv_open_device")?,
                self.sym::<Free>(c"ibv_free_device_list")?,
            )
        };
        let mut n: c_int = 0;
        // SAFETY: `n` is a valid out-parameter; the list is freed below.
        let devices = unsafe { list(&mut n) };
        if devices.is_null() {
            bail!("ibv_get_device_list: {}", std::io::Error::last_os_error());
        }
        let ctx = (0..n.max(0) as usize)
            // SAFETY: `n` entries.
            .map(|i| unsafe { *devices.add(i) })
            // SAFETY: a device of the list; its name is NUL-terminated.
            .find(|&d| unsafe { CStr::from_ptr(dev_name(d)) }.to_bytes() == name.as_bytes())
            .with_context(|| format!("libibverbs does not list {name}"))
            .and_then(|device| {
                // SAFETY: a device of the live list.
                let ctx = unsafe { open(device) };
                if ctx.is_null() {
                    bail!(
                        "ibv_open_device({name}): {}",
                        std::io::Error::last_os_error()
                    );
                }
                Ok(ctx)
            });
        // SAFETY: the list from ibv_get_device_list, freed once; a context
        // opened from it stays valid (verbs.h).
        unsafe { free(devices) };
        ctx
    }
}
