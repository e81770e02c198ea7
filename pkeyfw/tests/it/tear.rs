//! No frame is judged by part of one QP-table entry and part of another
//! (issue 45 §2). A writer on one CPU flips a QP's entry between two valid
//! states as fast as it can, through the table's mapped memory as the
//! loader writes it (`QpTable`), while BPF_PROG_TEST_RUN judges frames
//! against it with the real XDP program on another CPU: over ten million
//! frames, every verdict is one of the two states' verdicts. The same
//! check catches a writer that stores the entry in two halves, so it can
//! fail. Run on the host's kernel by `cargo test`, and on the guest's 6.1
//! by the kernel matrix (`cargo xtask kernels`).

use crate::common;

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::atomic::{AtomicBool, AtomicU32, Ordering},
};

use aya::maps::MapData;
use pkeyfw::loading::{filter::Filter, pins, qp_table::QpTable};
use pkeyfw_common::{
    Reason,
    abi::{QpEntry, QpType, name, qp_index},
};
use pkeyfw_testkit::wire::Packet;

/// The QP whose entry flips.
const QPN: u32 = 0x33;
/// Its two states: a UD QP in partition 0x0001 with one Q_Key, and in
/// 0x0002 with another. Every byte of the Q_Keys differs, so that a
/// verdict on any mix of the two words is neither state's.
const A: QpEntry = QpEntry {
    qkey: 0x1111_1111,
    pkey: 0x8001,
    qp_type: QpType::Ud as u8,
    flags: 0,
};
const B: QpEntry = QpEntry {
    qkey: 0x2222_2222,
    pkey: 0x8002,
    qp_type: QpType::Ud as u8,
    flags: 0,
};
/// Frames judged in all, half to each state's keys.
const FRAMES: u64 = 10_000_000;
/// Repetitions per test run: the counters are read between runs.
const REPEAT: u32 = 100_000;

#[test]
fn no_frame_is_judged_by_a_torn_entry() {
    common::require_root();
    let _cpus = common::cpus_alone();
    let table = Table::load();
    let mapped = table.mapped();
    let (writer, reader) = cpus();
    let stop = AtomicBool::new(false);
    let seen = std::thread::scope(|s| {
        s.spawn(|| {
            pin_to(writer);
            let (a, b) = (Some(A), Some(B));
            while !stop.load(Ordering::Relaxed) {
                mapped.set(table.live, QPN, a).unwrap();
                mapped.set(table.live, QPN, b).unwrap();
            }
        });
        let _stop = Stop(&stop);
        pin_to(reader);
        table.judge(FRAMES, |_| false)
    });
    for (frame, reasons) in &seen {
        let torn: Vec<_> = reasons
            .iter()
            .filter(|(r, _)| !matches!(r, Reason::Ok | Reason::PkeyViolation))
            .collect();
        assert!(
            torn.is_empty(),
            "frames {frame} were judged by neither state: {torn:?} (all: {reasons:?})"
        );
        // Both states were seen, for each frame: the writer flipped the
        // entry while the frames were judged.
        for state in [Reason::Ok, Reason::PkeyViolation] {
            assert!(
                reasons.get(&state).is_some_and(|&n| n > 0),
                "frames {frame} never met the state that gives {state:?}: {reasons:?}"
            );
        }
    }
    let judged: u64 = seen.values().flat_map(|r| r.values()).sum();
    assert!(judged >= FRAMES, "{judged} frames judged");
    eprintln!("{judged} frames judged while the entry flipped, each by one state: {seen:?}");
}

/// The check can fail: a writer that stores the low half of the word and
/// then the high half (as a copy that is not one 8-byte store may) is seen
/// by some frame half-written.
#[test]
fn a_writer_in_halves_is_caught() {
    common::require_root();
    let _cpus = common::cpus_alone();
    let table = Table::load();
    let halves = Halves::map(&table);
    let (writer, reader) = cpus();
    let stop = AtomicBool::new(false);
    let caught = std::thread::scope(|s| {
        s.spawn(|| {
            pin_to(writer);
            while !stop.load(Ordering::Relaxed) {
                halves.store(A.to_bits());
                halves.store(B.to_bits());
            }
        });
        let _stop = Stop(&stop);
        pin_to(reader);
        table.judge(FRAMES, |reasons| {
            reasons
                .keys()
                .any(|r| !matches!(r, Reason::Ok | Reason::PkeyViolation))
        })
    });
    assert!(
        caught
            .values()
            .flat_map(|r| r.keys())
            .any(|r| !matches!(r, Reason::Ok | Reason::PkeyViolation)),
        "no frame saw the entry half-written: {caught:?}"
    );
    eprintln!("a writer in halves is caught: {caught:?}");
}

/// Stops the writer when the judging ends, however it ends: a panic while
/// judging would otherwise leave the scope waiting for the writer forever.
struct Stop<'a>(&'a AtomicBool);

impl Drop for Stop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// A filter pinned in a scratch directory of bpffs (the writer maps the
/// table through the pin, as another pkeyfw process does), with the QP in
/// state A.
struct Table {
    filter: Filter,
    dir: PathBuf,
    live: u32,
}

impl Table {
    fn load() -> Table {
        static N: AtomicU32 = AtomicU32::new(0);
        pins::ensure_bpffs().unwrap();
        let dir = Path::new(pins::BPFFS).join(format!(
            "pkeyfw-tear-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let policy = common::policy(&format!(
            "[port]\npkeys = [0xffff, {:#06x}, {:#06x}]\n\
             [enforcement]\nunknown_qp = \"drop\"\n\
             [[qp]]\nqpn = {QPN}\ntype = \"ud\"\npkey = {:#06x}\nqkey = {:#010x}\n",
            A.pkey, B.pkey, A.pkey, A.qkey
        ));
        let mut filter = Filter::load_pinned(policy.qpns(), &dir).unwrap();
        filter.apply(&policy).unwrap();
        let live = filter.maps().active_generation().unwrap();
        Table { filter, dir, live }
    }

    /// The table, mapped again through its pin.
    fn mapped(&self) -> QpTable {
        QpTable::map(MapData::from_pin(self.dir.join(name::QPS)).unwrap()).unwrap()
    }

    /// Judges `frames` frames, alternately to state A's keys and to B's,
    /// in runs of [`REPEAT`]; each frame's reasons as the kernel counted
    /// them. Stops early once `enough` says so of a run's.
    fn judge(
        &self,
        frames: u64,
        enough: impl Fn(&BTreeMap<Reason, u64>) -> bool,
    ) -> BTreeMap<&'static str, BTreeMap<Reason, u64>> {
        let to = [
            ("to A's keys", Packet::ud(A.pkey, QPN, A.qkey).bytes()),
            ("to B's keys", Packet::ud(B.pkey, QPN, B.qkey).bytes()),
        ];
        let mut seen: BTreeMap<&str, BTreeMap<Reason, u64>> = BTreeMap::new();
        for run in 0..frames / u64::from(REPEAT) {
            let (label, frame) = &to[run as usize % 2];
            let before = self.filter.maps().reasons().unwrap();
            self.filter.time(frame, REPEAT).unwrap();
            let after = self.filter.maps().reasons().unwrap();
            let this: BTreeMap<Reason, u64> = Reason::ALL
                .into_iter()
                .map(|r| (r, after.total(r) - before.total(r)))
                .filter(|&(_, n)| n > 0)
                .collect();
            let stop = enough(&this);
            let counts = seen.entry(label).or_default();
            for (r, n) in this {
                *counts.entry(r).or_default() += n;
            }
            if stop {
                break;
            }
        }
        seen
    }
}

impl Drop for Table {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The QP's word in the live generation, mapped as two u32 halves.
struct Halves {
    base: *mut libc::c_void,
    len: usize,
    at: *mut u32,
}

// SAFETY: shared memory, written with volatile stores only.
unsafe impl Sync for Halves {}

impl Halves {
    fn map(table: &Table) -> Halves {
        use std::os::fd::{AsFd as _, AsRawFd as _};
        let map = MapData::from_pin(table.dir.join(name::QPS)).unwrap();
        let len = map.info().unwrap().max_entries() as usize * size_of::<u64>();
        // SAFETY: a fresh shared mapping of the mappable map.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                map.fd().as_fd().as_raw_fd(),
                0,
            )
        };
        assert_ne!(base, libc::MAP_FAILED);
        let word = qp_index(table.live, QPN) as usize;
        Halves {
            base,
            len,
            // SAFETY: within the mapping.
            at: unsafe { base.cast::<u64>().add(word).cast::<u32>() },
        }
    }

    /// Stores `bits` as two 4-byte stores, the low half first.
    fn store(&self, bits: u64) {
        // SAFETY: the word's two halves, within the mapping.
        unsafe {
            std::ptr::write_volatile(self.at, bits as u32);
            std::ptr::write_volatile(self.at.add(1), (bits >> 32) as u32);
        }
    }
}

impl Drop for Halves {
    fn drop(&mut self) {
        // SAFETY: the mapping `map` made, unused from here on.
        unsafe { libc::munmap(self.base, self.len) };
    }
}

/// Two CPUs, the writer's and the reader's.
fn cpus() -> (usize, usize) {
    let n = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert!(
        n >= 2,
        "the check needs two CPUs, one to write and one to judge; this machine has {n}"
    );
    (1, 0)
}

/// Pins the calling thread to CPU `cpu`: the test's own thread (cargo runs
/// each test on one, which ends with it) or its writer.
fn pin_to(cpu: usize) {
    // SAFETY: a zeroed set with one CPU in it, for this thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        assert_eq!(
            libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set),
            0,
            "pinning to CPU {cpu}"
        );
    }
}
