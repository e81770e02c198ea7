//! bpf(2) itself, for the commands aya leaves out: batched map writes
//! ([`super::batch`]) and a cgroup link pinned as pkeyfw pins the others
//! (`control::tenancy::guard`).

/// Runs bpf(2) command `cmd` with `attr`; what it returns (a file
/// descriptor, for the commands that make one).
///
/// # Safety
/// `attr` must be the command's layout of `union bpf_attr`, every pointer
/// in it valid for what the command reads and writes through it, for the
/// whole call.
pub unsafe fn bpf<A>(cmd: libc::c_long, attr: &mut A) -> std::io::Result<i64> {
    // SAFETY: as the caller vouches.
    let rc = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr as *mut A, size_of::<A>()) };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(rc)
}
