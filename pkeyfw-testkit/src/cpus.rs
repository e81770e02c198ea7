//! Which CPUs a thread runs on: the bench times programs on one CPU, the
//! live bench pins its generator and receiver, and the kernel tests count
//! frames on each CPU in turn.

use anyhow::{Context as _, Result, bail};

/// The CPUs the calling thread may run on, in order.
pub fn allowed() -> Result<Vec<usize>> {
    let mask = mask()?;
    Ok((0..libc::CPU_SETSIZE as usize)
        // SAFETY: a CPU number within the set's size.
        .filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &mask) })
        .collect())
}

/// Restricts thread `pid` (0: the caller) to `cpu`.
pub fn pin(pid: libc::pid_t, cpu: usize) -> Result<()> {
    // SAFETY: a zeroed cpu_set_t is the empty set; CPU_SET stays within it.
    let one = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        set
    };
    set(pid, &one).with_context(|| format!("to CPU {cpu}"))
}

/// Runs `f` on `cpu` alone, then gives the calling thread back the CPUs it
/// could run on before.
pub fn on<T>(cpu: usize, f: impl FnOnce() -> T) -> Result<T> {
    let before = mask()?;
    pin(0, cpu)?;
    let out = f();
    set(0, &before).context("giving the thread back its CPUs")?;
    Ok(out)
}

/// The calling thread's CPU mask.
fn mask() -> Result<libc::cpu_set_t> {
    // SAFETY: a zeroed cpu_set_t is the empty set, which the kernel fills
    // within its size.
    let mut mask: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: this thread's mask, into a set of the size given.
    if unsafe { libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut mask) } != 0 {
        bail!("sched_getaffinity: {}", std::io::Error::last_os_error());
    }
    Ok(mask)
}

/// Sets thread `pid`'s (0: the caller's) CPU mask.
fn set(pid: libc::pid_t, mask: &libc::cpu_set_t) -> Result<()> {
    // SAFETY: a valid set of the size given.
    if unsafe { libc::sched_setaffinity(pid, size_of::<libc::cpu_set_t>(), mask) } != 0 {
        bail!("sched_setaffinity: {}", std::io::Error::last_os_error());
    }
    Ok(())
}
