//! Batched map writes and reads (`BPF_MAP_UPDATE_BATCH`,
//! `BPF_MAP_LOOKUP_BATCH`, Linux 5.6+): one system call per chunk of
//! entries where aya makes one per entry, which is most of the time a
//! policy of a million QPs takes to apply.

use std::os::fd::{AsFd as _, AsRawFd as _};

use aya::{Pod, maps::MapData};

/// `enum bpf_cmd`'s BPF_MAP_LOOKUP_BATCH and BPF_MAP_UPDATE_BATCH.
const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;
const BPF_MAP_UPDATE_BATCH: libc::c_long = 26;
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

/// A batch write that stopped: the entry it stopped at, if the kernel got
/// as far as the entries, and why.
#[derive(Debug)]
pub struct Failed {
    pub index: Option<usize>,
    pub error: std::io::Error,
}

/// Writes `entries` into `map` in order (`BPF_ANY`), a chunk per call. On
/// failure the entries before `index` are written, the rest not (with no
/// index, an unknown number of them).
pub fn update<K: Pod, V: Pod>(map: &MapData, entries: &[(K, V)]) -> Result<(), Failed> {
    let fd = map.fd().as_fd().as_raw_fd();
    for (n, chunk) in entries.chunks(CHUNK).enumerate() {
        let (keys, values): (Vec<K>, Vec<V>) = chunk.iter().copied().unzip();
        let mut attr = BatchAttr {
            keys: keys.as_ptr() as u64,
            values: values.as_ptr() as u64,
            count: chunk.len() as u32,
            map_fd: fd as u32,
            ..BatchAttr::default()
        };
        // SAFETY: `attr` points at `keys` and `values`, which outlive the
        // call and hold `count` plain keys and values of the map's sizes
        // (aya checked them when it typed the map).
        if let Err(error) = unsafe { call(BPF_MAP_UPDATE_BATCH, &mut attr) } {
            // The kernel reports how many it wrote, unless it refused the
            // call before the first (then `count` is left as it was).
            let written = attr.count as usize;
            return Err(Failed {
                index: (written < chunk.len()).then_some(n * CHUNK + written),
                error,
            });
        }
    }
    Ok(())
}

/// Zeroes entries `keys` of per-CPU map `map`, on every CPU, a chunk per
/// call: a per-CPU value is one `V`, 8-byte aligned, per possible CPU.
pub fn zero_per_cpu<V>(map: &MapData, keys: &[u32]) -> std::io::Result<()> {
    let cpus = aya::util::nr_cpus().map_err(|(_, e)| e)?.get() as usize;
    let stride = size_of::<V>().next_multiple_of(8) * cpus;
    let fd = map.fd().as_fd().as_raw_fd();
    for chunk in keys.chunks(CHUNK) {
        let values = vec![0u8; stride * chunk.len()];
        let mut attr = BatchAttr {
            keys: chunk.as_ptr() as u64,
            values: values.as_ptr() as u64,
            count: chunk.len() as u32,
            map_fd: fd as u32,
            ..BatchAttr::default()
        };
        // SAFETY: `attr` points at `count` u32 keys and `count` per-CPU
        // values (one `V`, rounded up to 8 bytes, per possible CPU), which
        // outlive the call.
        unsafe { call(BPF_MAP_UPDATE_BATCH, &mut attr) }?;
    }
    Ok(())
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

/// Runs batch command `cmd` with `attr`.
///
/// # Safety
/// `attr`'s pointers must hold `count` keys and values of the map's sizes
/// (and, if given, the batch positions) for the whole call.
unsafe fn call(cmd: libc::c_long, attr: &mut BatchAttr) -> std::io::Result<()> {
    // SAFETY: as the caller vouches.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut BatchAttr,
            size_of::<BatchAttr>(),
        )
    };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
