//! Batched map writes and reads (`BPF_MAP_UPDATE_BATCH`,
//! `BPF_MAP_LOOKUP_BATCH`): one system call per chunk of entries where aya
//! makes one per entry, which is most of the time a policy of a million
//! QPs takes to apply. Where the kernel has no batch command for a map
//! (hash maps have them from Linux 5.6, arrays from 5.9, per-CPU arrays
//! later), one call per entry.

use std::os::fd::{AsFd as _, AsRawFd as _};

use aya::{Pod, maps::MapData};

/// `enum bpf_cmd`'s BPF_MAP_LOOKUP_BATCH and BPF_MAP_UPDATE_BATCH.
const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;
const BPF_MAP_UPDATE_BATCH: libc::c_long = 26;
/// `enum bpf_cmd`'s per-entry commands.
const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_MAP_GET_NEXT_KEY: libc::c_long = 4;
/// The kernel's ENOTSUPP (524), which a batch command on a map without
/// one returns, besides EOPNOTSUPP and EINVAL.
const ENOTSUPP: i32 = 524;
/// Entries per system call: bounds the copy the kernel makes of them.
const CHUNK: usize = 1 << 14;

/// `union bpf_attr` as the batch commands read it.
#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

/// Writes `entries` into `map` in order (`BPF_ANY`), a chunk per call. On
/// failure some of them are written.
pub fn update<K: Pod, V: Pod>(map: &MapData, entries: &[(K, V)]) -> std::io::Result<()> {
    let fd = map.fd().as_fd().as_raw_fd() as u32;
    for chunk in entries.chunks(CHUNK) {
        let (keys, values): (Vec<K>, Vec<V>) = chunk.iter().copied().unzip();
        // SAFETY: `keys` and `values` hold `len` plain keys and values of
        // the map's sizes (aya checked them when it typed the map).
        unsafe {
            write(
                fd,
                keys.as_ptr().cast(),
                size_of::<K>(),
                values.as_ptr().cast(),
                size_of::<V>(),
                chunk.len(),
            )
        }?;
    }
    Ok(())
}

/// Writes `count` entries, keys of `key_size` bytes at `keys` and values of
/// `value_size` at `values`: one batch call, or one call per entry where
/// the kernel has no batch command for the map.
///
/// # Safety
/// `keys` and `values` must hold `count` keys and values of those sizes,
/// the map's.
unsafe fn write(
    fd: u32,
    keys: *const u8,
    key_size: usize,
    values: *const u8,
    value_size: usize,
    count: usize,
) -> std::io::Result<()> {
    let mut attr = BatchAttr {
        keys: keys as u64,
        values: values as u64,
        count: count as u32,
        map_fd: fd,
        ..BatchAttr::default()
    };
    // SAFETY: `attr` points at `count` keys and values, as the caller
    // vouches.
    match unsafe { call(BPF_MAP_UPDATE_BATCH, &mut attr) } {
        Ok(()) => Ok(()),
        // No batch command for this map: it refused before the first.
        Err(e) if unsupported(&e) && attr.count as usize == count => {
            for i in 0..count {
                let mut one = ElemAttr {
                    map_fd: fd,
                    // SAFETY: entry `i` of the buffers.
                    key: unsafe { keys.add(i * key_size) } as u64,
                    value: unsafe { values.add(i * value_size) } as u64,
                    ..ElemAttr::default()
                };
                // SAFETY: one key and one value of the map's sizes.
                unsafe { call(BPF_MAP_UPDATE_ELEM, &mut one) }?;
            }
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// Whether a batch command failed for want of one for the map.
fn unsupported(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(ENOTSUPP | libc::EOPNOTSUPP | libc::EINVAL)
    )
}

/// Every value of array `map`, in index order, a chunk per call.
pub fn array_values<V: Pod + Default>(map: &MapData) -> std::io::Result<Vec<V>> {
    Ok(entries::<u32, V>(map)?
        .into_iter()
        .map(|(_, v)| v)
        .collect())
}

/// Every entry of `map` (an array, in index order, or a hash map), a chunk
/// per call: a few system calls for a table of thousands of QPs where an
/// iteration makes two per entry.
pub fn entries<K: Pod + Default, V: Pod + Default>(map: &MapData) -> std::io::Result<Vec<(K, V)>> {
    let fd = map.fd().as_fd().as_raw_fd();
    let mut out = Vec::new();
    // The batch position (an array's next index, a hash map's next bucket)
    // is a u32 for both.
    let (mut at, mut next, mut first) = (0u32, 0u32, true);
    loop {
        let mut keys = vec![K::default(); CHUNK];
        let mut values = vec![V::default(); CHUNK];
        let mut attr = BatchAttr {
            in_batch: if first { 0 } else { &raw mut at as u64 },
            out_batch: &raw mut next as u64,
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count: CHUNK as u32,
            map_fd: fd as u32,
            ..BatchAttr::default()
        };
        // SAFETY: `attr` points at buffers of `count` keys and values of the
        // map's sizes (`K` and `V`, as typed by the caller) and at the batch
        // positions, all live over the call.
        let result = unsafe { call(BPF_MAP_LOOKUP_BATCH, &mut attr) };
        if first && result.as_ref().is_err_and(unsupported) {
            return each(fd as u32);
        }
        let n = attr.count as usize;
        out.extend(keys.into_iter().zip(values).take(n));
        match result {
            // The end: the last entries came with it.
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(out),
            Err(e) => return Err(e),
            Ok(()) => (at, first) = (next, false),
        }
    }
}

/// Every entry of the map `fd`, two calls each (the next key, its value),
/// in the kernel's order: where it has no batch command for the map.
fn each<K: Pod + Default, V: Pod + Default>(fd: u32) -> std::io::Result<Vec<(K, V)>> {
    let mut out = Vec::new();
    let mut key: Option<K> = None;
    loop {
        let mut next = K::default();
        let mut attr = ElemAttr {
            map_fd: fd,
            key: key.as_ref().map_or(0, |k| k as *const K as u64),
            value: &raw mut next as u64,
            ..ElemAttr::default()
        };
        // SAFETY: a key (or none: the first) and room for the next.
        match unsafe { call(BPF_MAP_GET_NEXT_KEY, &mut attr) } {
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(out),
            Err(e) => return Err(e),
            Ok(()) => {}
        }
        let mut value = V::default();
        let mut attr = ElemAttr {
            map_fd: fd,
            key: &raw const next as u64,
            value: &raw mut value as u64,
            ..ElemAttr::default()
        };
        // SAFETY: a key and room for its value, of the map's sizes.
        match unsafe { call(BPF_MAP_LOOKUP_ELEM, &mut attr) } {
            // Deleted meanwhile.
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
            Err(e) => return Err(e),
            Ok(()) => out.push((next, value)),
        }
        key = Some(next);
    }
}

/// `union bpf_attr` as the per-entry commands read it.
#[repr(C)]
#[derive(Default)]
struct ElemAttr {
    map_fd: u32,
    _pad: u32,
    key: u64,
    /// The value, or for BPF_MAP_GET_NEXT_KEY the next key.
    value: u64,
    flags: u64,
}

/// Runs bpf(2) command `cmd` with `attr` (a `BatchAttr` for the batch
/// commands, an `ElemAttr` for the per-entry ones).
///
/// # Safety
/// `attr` must be the command's layout of `union bpf_attr`, its pointers
/// holding keys and values of the map's sizes (for a batch, `count` of
/// each, and the batch positions if given) for the whole call.
unsafe fn call<A>(cmd: libc::c_long, attr: &mut A) -> std::io::Result<()> {
    // SAFETY: as the caller vouches.
    unsafe { super::syscall::bpf(cmd, attr) }.map(drop)
}
