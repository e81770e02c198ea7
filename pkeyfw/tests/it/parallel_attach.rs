//! Two attaches started at the same moment, as systemd starts two
//! `pkeyfw@IFACE` instances at boot, both succeed: each may find the other
//! making /sys/fs/bpf/pkeyfw first. Every round starts with that directory
//! absent, which no other attachment of the tests may hold meanwhile: the
//! test holds it alone (`common::pins_root_alone`).
//!
//! Process start-up alone spreads two attaches over milliseconds, wider
//! than the race, so each reads its policy from a FIFO that the test fills
//! for both at once: from there on both run the same steps side by side.
//! Without the tolerance (`trusted_dir` failing on AlreadyExists), attaches
//! fail with "creating /sys/fs/bpf/pkeyfw: File exists".

use crate::common;

use std::{
    ffi::CString,
    fs::File,
    io::Write as _,
    os::unix::{ffi::OsStrExt as _, fs::OpenOptionsExt as _},
    path::{Path, PathBuf},
    process::{Child, Stdio},
    thread,
    time::{Duration, Instant},
};

use pkeyfw::loading::pins::BPFFS;
use pkeyfw_testkit::netns::VethPair;

const ROUNDS: usize = 20;

#[test]
fn twenty_parallel_attach_pairs_all_succeed() {
    common::require_root();
    let _root = common::pins_root_alone();
    let pair = VethPair::create(&common::tag("pp")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ends = [(&pair.ns_a, &pair.a), (&pair.ns_b, &pair.b)];
    let _cleanup = ends.map(|(ns, iface)| common::Unpin(common::pins(ns, iface)));
    let root = Path::new(BPFFS).join("pkeyfw");
    let mut failures = Vec::new();
    for round in 0..ROUNDS {
        absent(&root);
        let fifos = ends.map(|(_, iface)| fifo(&dir.path().join(format!("{iface}-{round}.toml"))));
        let children: Vec<Child> = ends
            .iter()
            .zip(&fifos)
            .map(|(&(ns, iface), policy)| {
                common::pkeyfw_in(ns)
                    .args(["attach", iface, "--pin", "--policy"])
                    .arg(policy)
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        let mut writers: Vec<File> = fifos
            .iter()
            .zip(&children)
            .filter_map(|(f, c)| writer(f, c))
            .collect();
        // Both policies at once, then both ends of file.
        for w in &mut writers {
            w.write_all(common::cases::BASE.as_bytes()).unwrap();
        }
        drop(writers);
        for ((ns, iface), child) in ends.iter().zip(children) {
            let out = child.wait_with_output().unwrap();
            if out.status.success() {
                common::succeed(common::pkeyfw_in(ns).args(["detach", iface]));
            } else {
                // What it left (its notes), so that the next round starts
                // with nothing.
                let _ = common::pins(ns, iface).remove();
                failures.push(format!(
                    "round {round}, {iface}: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} attaches failed:\n{}",
        failures.len(),
        2 * ROUNDS,
        failures.join("\n")
    );
}

/// A FIFO at `path`.
fn fifo(path: &Path) -> PathBuf {
    let c = CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
    path.to_path_buf()
}

/// The FIFO's writing end, once `child` opened it to read its policy;
/// `None` if it exited first (its output says why).
fn writer(fifo: &Path, child: &Child) -> Option<File> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        // Without a reader a non-blocking open fails (ENXIO).
        match File::options()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(fifo)
        {
            Ok(f) => return Some(f),
            Err(_) if Instant::now() < deadline => {
                if child_exited(child) {
                    return None;
                }
                thread::sleep(Duration::from_millis(1));
            }
            Err(e) => panic!("pkeyfw never opened {}: {e}", fifo.display()),
        }
    }
}

fn child_exited(child: &Child) -> bool {
    // SAFETY: waitid with WNOWAIT only looks; the child stays waitable.
    unsafe {
        let mut info: libc::siginfo_t = std::mem::zeroed();
        libc::waitid(
            libc::P_PID,
            child.id(),
            &mut info,
            libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
        ) == 0
            && info.si_pid() != 0
    }
}

/// Removes `root` once empty: another attachment (on a machine shared with
/// other test runs) may hold it for a while, though not for minutes.
fn absent(root: &Path) {
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        match std::fs::remove_dir(root) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                if Instant::now() > deadline {
                    panic!(
                        "{} must be absent at each round's start ({e}); it holds {:?}",
                        root.display(),
                        tree(root)
                    );
                }
                thread::sleep(Duration::from_millis(200));
            }
            _ => return,
        }
    }
}

/// Every path under `dir`.
fn tree(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .flat_map(|e| {
            let mut below = tree(&e.path());
            below.insert(0, e.path());
            below
        })
        .collect()
}
