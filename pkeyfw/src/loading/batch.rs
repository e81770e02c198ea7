//! Batched map writes (`BPF_MAP_UPDATE_BATCH`, Linux 5.6+): one system call
//! per chunk of entries where aya makes one per entry, which is most of the
//! time a policy of a million QPs takes to apply.

use std::os::fd::{AsFd as _, AsRawFd as _};

use aya::{Pod, maps::MapData};

/// `enum bpf_cmd`'s BPF_MAP_UPDATE_BATCH.
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
        let rc = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_MAP_UPDATE_BATCH,
                &raw mut attr,
                size_of::<BatchAttr>(),
            )
        };
        if rc < 0 {
            let error = std::io::Error::last_os_error();
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
