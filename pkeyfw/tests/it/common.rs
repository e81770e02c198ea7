//! Shared by the integration tests: policies, the case table (the test kit's,
//! its policies parsed), root checks.

use std::{
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    sync::{
        Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard,
        atomic::{AtomicU32, Ordering},
    },
};

use pkeyfw::{host::netns::NetnsId, loading::filter::Filter, loading::pins::Pins, policy::Policy};
use pkeyfw_testkit::netns::VethPair;

/// Parses a policy given inline.
pub fn policy(toml: &str) -> Policy {
    Policy::parse(Path::new("test.toml"), toml).unwrap_or_else(|e| panic!("{e}"))
}

/// Kernel tests need root: fail loudly, never skip.
pub fn require_root() {
    // SAFETY: no preconditions.
    let uid = unsafe { libc::geteuid() };
    assert_eq!(
        uid, 0,
        "this test loads the XDP program with BPF_PROG_TEST_RUN and needs root; run `sudo -E cargo xtask test`"
    );
}

/// A loaded filter with `policy` applied.
pub fn filter(policy: &Policy) -> Filter {
    require_root();
    let mut f = Filter::load_for(policy).expect("load the XDP program");
    f.apply(policy).expect("apply the policy");
    f
}

/// `pkeyfw` run in network namespace `ns` (the network only: bpffs stays
/// shared, so pins are seen from everywhere).
pub fn pkeyfw_in(ns: &str) -> Command {
    let mut cmd = Command::new("nsenter");
    cmd.arg(format!("--net={}", VethPair::netns_path(ns)))
        .arg(env!("CARGO_BIN_EXE_pkeyfw"));
    cmd
}

/// The pins of interface `iface` of network namespace `ns` (pins are keyed
/// by namespace).
pub fn pins(ns: &str, iface: &str) -> Pins {
    let id = NetnsId::of_path(Path::new(&VethPair::netns_path(ns))).expect("the namespace");
    Pins::at(iface, id)
}

/// `pkeyfw attach IFACE --pin --policy POLICY` in namespace `ns`, which
/// must succeed.
pub fn attach_pinned(ns: &str, iface: &str, policy: &Path) -> Output {
    succeed(pkeyfw_in(ns).args([
        "attach",
        iface,
        "--pin",
        "--policy",
        policy.to_str().unwrap(),
    ]))
}

/// Runs `cmd`, which must succeed.
pub fn succeed(cmd: &mut Command) -> Output {
    let out = cmd.output().expect("run");
    assert!(
        out.status.success(),
        "{:?}: {}",
        cmd,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// /sys/fs/bpf/pkeyfw, where every attachment pins. The tests run on the
/// threads of one process: each test that pins there, or reads every
/// attachment there (`pkeyfw metrics`), holds the root shared
/// ([`pins_root`]) while it runs; `parallel_attach`, whose every round
/// starts with the directory absent, holds it alone ([`pins_root_alone`]).
static PINS_ROOT: RwLock<()> = RwLock::new(());

/// The pins' root, shared: held for the whole of a test that uses it.
pub fn pins_root() -> RwLockReadGuard<'static, ()> {
    // A test that failed holding it poisoned nothing the others rely on.
    PINS_ROOT.read().unwrap_or_else(PoisonError::into_inner)
}

/// The pins' root, no other test pinning meanwhile.
pub fn pins_root_alone() -> RwLockWriteGuard<'static, ()> {
    PINS_ROOT.write().unwrap_or_else(PoisonError::into_inner)
}

/// The machine's CPUs, for the tests that must not run together on the
/// threads of one process: the tear test keeps a writer spinning on one
/// CPU while it judges frames on the other, and the metrics flood needs
/// every scrape answered within its deadline.
static CPUS: Mutex<()> = Mutex::new(());

/// The CPUs, to this test alone of those that take them.
pub fn cpus_alone() -> MutexGuard<'static, ()> {
    CPUS.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Removes an interface's pins when dropped, whatever the test did.
pub struct Unpin(pub Pins);

impl Drop for Unpin {
    fn drop(&mut self) {
        let _ = self.0.remove();
    }
}

/// The test kit's verdict case table, each case's policy parsed.
pub mod cases {
    use std::collections::HashMap;

    use pkeyfw::policy::Policy;
    use pkeyfw_common::Reason;
    pub use pkeyfw_testkit::cases::{BASE, QPA, QPB, QPD, UD, UD_LIMITED, UNKNOWN, valid_frames};

    use super::policy;

    /// One frame under one policy, and what must happen to it.
    pub struct Case {
        pub name: String,
        pub policy: Policy,
        pub frame: Vec<u8>,
        pub reason: Reason,
        pub pass: bool,
    }

    /// Every case; each distinct policy text is parsed once.
    pub fn all() -> Vec<Case> {
        let mut parsed: HashMap<String, Policy> = HashMap::new();
        pkeyfw_testkit::cases::all()
            .into_iter()
            .map(|c| Case {
                policy: parsed
                    .entry(c.policy)
                    .or_insert_with_key(|text| policy(text))
                    .clone(),
                name: c.name,
                frame: c.frame,
                reason: c.reason,
                pass: c.pass,
            })
            .collect()
    }
}

/// The test kit's stamping fixtures, and their policy parsed.
pub mod stamping {
    use pkeyfw::policy::Policy;
    pub use pkeyfw_testkit::stamping::*;

    use super::{cases, policy};

    /// The case table's base policy, stamping.
    pub fn stamping_policy() -> Policy {
        let mut p = policy(cases::BASE);
        p.stamp = true;
        p
    }
}

/// A short unique tag per test: `prefix` names the test file (interface
/// names are at most 15 bytes).
pub fn tag(prefix: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!(
        "{prefix}{}{}",
        std::process::id() % 10000,
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// A policy file, removed with the returned directory.
pub fn policy_file(text: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("policy.toml");
    std::fs::write(&path, text).unwrap();
    (dir, path)
}

/// A foreground `pkeyfw attach` on `pair.b`, stopped (and its pins removed)
/// on drop.
pub struct Foreground {
    child: Child,
    /// Removed on drop, unless the process was killed (its pins outlive it).
    pins: Option<Pins>,
    /// The line it printed on attaching.
    pub first: String,
}

impl Foreground {
    pub fn start(pair: &VethPair, policy: &Path, mode: &str) -> Foreground {
        Foreground::start_with(pair, policy, mode, &[])
    }

    /// [`start`](Self::start) with more arguments.
    pub fn start_with(pair: &VethPair, policy: &Path, mode: &str, more: &[&str]) -> Foreground {
        let mut child = pkeyfw_in(&pair.ns_b)
            .args([
                "attach",
                &pair.b,
                "--policy",
                policy.to_str().unwrap(),
                "--mode",
                mode,
            ])
            .args(more)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut first = String::new();
        BufReader::new(child.stdout.as_mut().unwrap())
            .read_line(&mut first)
            .unwrap();
        assert!(first.contains("attached to"), "attach said {first:?}");
        Foreground {
            child,
            pins: Some(pins(&pair.ns_b, &pair.b)),
            first,
        }
    }

    /// SIGTERM, then everything the process printed after its first line.
    pub fn stop(mut self) -> Output {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let child = std::mem::replace(&mut self.child, Command::new("true").spawn().unwrap());
        child.wait_with_output().unwrap()
    }
}

impl Foreground {
    /// SIGKILL, as a crash or the OOM killer would: its pins stay. Its PID.
    pub fn kill(self) -> u32 {
        self.signal(libc::SIGKILL).0
    }

    /// Sends `sig` and waits for the process to end; its pins are left
    /// (to the test). Its PID and how it ended.
    pub fn signal(mut self, sig: libc::c_int) -> (u32, std::process::ExitStatus) {
        let pid = self.child.id();
        // SAFETY: signalling our own child.
        unsafe { libc::kill(pid as i32, sig) };
        let status = self.child.wait().unwrap();
        self.pins = None;
        (pid, status)
    }
}

impl Drop for Foreground {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(pins) = &self.pins {
            let _ = pins.remove();
        }
    }
}

/// Starts `cmd` (a pkeyfw that runs until stopped: `events`, …) and
/// hands its output's lines over as they come; it is killed when the
/// returned process is dropped.
pub fn lines_of(cmd: &mut Command) -> (Killed, std::sync::mpsc::Receiver<String>) {
    let mut child = Killed(cmd.stdout(Stdio::piped()).spawn().expect("start"));
    let out = child.0.stdout.take().expect("piped");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    (child, rx)
}

/// A process killed when the test ends, however it ends.
pub struct Killed(pub std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Cgroups a test makes under a directory of its own in this host's cgroup
/// v2 hierarchy (wherever it is mounted); removed on drop, deepest first.
/// A cgroup goes with rmdir alone: a TempDir's cleanup, which first
/// deletes the files in it, would leave it behind.
pub struct Cgroups {
    made: Vec<PathBuf>,
}

impl Cgroups {
    /// The test's own directory, `pkeyfw-test-TAG` under the root.
    pub fn new(prefix: &str) -> Cgroups {
        let root = pkeyfw::host::identity::cgroup2_mount().expect("cgroup v2 mounted");
        let mut cgroups = Cgroups { made: Vec::new() };
        cgroups.mkdir(&root.join(format!("pkeyfw-test-{}", tag(prefix))));
        cgroups
    }

    /// The test's own directory.
    pub fn base(&self) -> &Path {
        &self.made[0]
    }

    /// Makes `below` ("a/b") under the base, each level this set has not
    /// made yet; its path.
    pub fn make(&mut self, below: &str) -> PathBuf {
        let mut dir = self.base().to_path_buf();
        for part in below.split('/') {
            dir.push(part);
            self.mkdir(&dir);
        }
        dir
    }

    fn mkdir(&mut self, dir: &Path) {
        if !self.made.iter().any(|d| d == dir) {
            std::fs::create_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
            self.made.push(dir.to_path_buf());
        }
    }
}

impl Drop for Cgroups {
    fn drop(&mut self) {
        for dir in self.made.iter().rev() {
            let _ = std::fs::remove_dir(dir);
        }
    }
}
