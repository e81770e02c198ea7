//! The QP table (`QPS`) as the loader reads and writes it: the map's own
//! memory, mapped into this process (the map is `BPF_F_MMAPABLE`), where
//! each entry is one aligned u64 loaded and stored atomically. An update
//! through bpf(2) copies the value with `memcpy`, which a frame's load
//! could find half-done; an aligned 8-byte store cannot be seen so on the
//! CPUs the XDP program runs on (x86-64, arm64), nor the program's one
//! 8-byte load of it. Where what is written depends on what was read, the
//! store is a compare-and-exchange, as the probes' are, so that an entry
//! another writer (a probe on another CPU) stored meanwhile is never
//! overwritten unseen.

use std::{
    os::fd::{AsFd as _, AsRawFd as _},
    ptr::NonNull,
    sync::atomic::{AtomicU64, Ordering},
};

use anyhow::{Context as _, Result, bail, ensure};
use aya::maps::MapData;
use pkeyfw_common::abi::{GENERATIONS, QpEntry, qp_index};

/// `QPS`, mapped.
pub struct QpTable {
    words: NonNull<AtomicU64>,
    /// Entries: `qpns` per generation.
    len: usize,
    qpns: u32,
    /// The map, held open as long as the mapping.
    _map: MapData,
}

// SAFETY: the mapping is shared memory that is only ever accessed through
// atomics; it lives as long as the value.
unsafe impl Send for QpTable {}
unsafe impl Sync for QpTable {}

impl QpTable {
    /// Maps `map`'s memory, read and write.
    pub fn map(map: MapData) -> Result<QpTable> {
        let info = map.info().context("reading the QPS map's information")?;
        ensure!(
            info.value_size() == size_of::<u64>() as u32,
            "QPS has values of {} bytes, not 8",
            info.value_size()
        );
        let len = info.max_entries() as usize;
        let bytes = len * size_of::<u64>();
        // SAFETY: a fresh shared mapping of the map's fd, which the kernel
        // refuses for a map not made mappable; nothing else aliases it here.
        let at = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                map.fd().as_fd().as_raw_fd(),
                0,
            )
        };
        if at == libc::MAP_FAILED {
            let e = std::io::Error::last_os_error();
            bail!("mapping the QP table's memory (a QPS map made without BPF_F_MMAPABLE?): {e}");
        }
        Ok(QpTable {
            words: NonNull::new(at.cast()).context("mmap gave a null address")?,
            len,
            qpns: (len / GENERATIONS as usize) as u32,
            _map: map,
        })
    }

    /// QPNs the table covers: 0 to `qpns() - 1`.
    pub fn qpns(&self) -> u32 {
        self.qpns
    }

    /// QPN `qpn`'s word in generation `g`; none beyond the table.
    fn word(&self, g: u32, qpn: u32) -> Option<&AtomicU64> {
        if qpn >= self.qpns {
            return None;
        }
        let i = qp_index(g, qpn) as usize;
        // SAFETY: `i < len`, within the mapping, which lives as long as
        // `self`; the kernel keeps the values 8-byte aligned.
        (i < self.len).then(|| unsafe { self.words.add(i).as_ref() })
    }

    /// QPN `qpn`'s entry in generation `g`, if any.
    pub fn get(&self, g: u32, qpn: u32) -> Option<QpEntry> {
        QpEntry::from_bits(self.word(g, qpn)?.load(Ordering::Acquire))
    }

    /// Stores `entry` (none: a zero) as QPN `qpn`'s in generation `g`, in
    /// one store.
    pub fn set(&self, g: u32, qpn: u32, entry: Option<QpEntry>) -> Result<()> {
        self.word(g, qpn)
            .with_context(|| self.beyond(qpn))?
            .store(QpEntry::bits(entry), Ordering::Release);
        Ok(())
    }

    /// Stores `new` as QPN `qpn`'s entry in generation `g` if the entry is
    /// still `old`, in one compare-and-exchange; whether it was.
    pub fn replace(&self, g: u32, qpn: u32, old: Option<QpEntry>, new: Option<QpEntry>) -> bool {
        self.word(g, qpn).is_some_and(|w| {
            w.compare_exchange(
                QpEntry::bits(old),
                QpEntry::bits(new),
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok()
        })
    }

    /// Generation `g`'s entries, by QPN.
    pub fn entries(&self, g: u32) -> impl Iterator<Item = (u32, QpEntry)> + '_ {
        (0..self.qpns).filter_map(move |qpn| Some((qpn, self.get(g, qpn)?)))
    }

    /// What a QPN beyond the table is told.
    pub fn beyond(&self, qpn: u32) -> String {
        format!(
            "QP {qpn:#x} is beyond the QP table, which holds QPNs up to {:#x}",
            self.qpns - 1
        )
    }
}

impl Drop for QpTable {
    fn drop(&mut self) {
        // SAFETY: the mapping `map` made, unused from here on.
        unsafe { libc::munmap(self.words.as_ptr().cast(), self.len * size_of::<u64>()) };
    }
}
