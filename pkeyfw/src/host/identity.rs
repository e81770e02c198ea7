//! The kernel objects a `[[bind]]` rule names by path — a cgroup v2
//! directory, a network namespace — resolved to what the QP-creation probe
//! compares: a cgroup's id and depth, a namespace's inode number.

use std::{
    ffi::CString,
    os::{fd::AsRawFd as _, unix::fs::MetadataExt as _},
    path::{Path, PathBuf},
};

/// `statfs` magics.
const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;
const NSFS_MAGIC: i64 = 0x6e73_6673;
/// The root cgroup's id (its kernfs inode).
const ROOT_CGROUP_ID: u64 = 1;
/// `ioctl(NS_GET_NSTYPE)`: `_IO(0xb7, 0x3)`.
const NS_GET_NSTYPE: libc::c_ulong = 0xb703;

/// A cgroup v2 directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cgroup {
    /// As the policy gives it.
    pub path: PathBuf,
    /// From the hierarchy's root, as `/proc/PID/cgroup` shows it ("/a/b").
    pub name: String,
    /// Its id (the directory's inode number), what
    /// `bpf_get_current_ancestor_cgroup_id` returns.
    pub id: u64,
    /// Its depth: 0 for the root.
    pub level: u32,
}

/// A network namespace: what a rule matches is its cookie, the inode
/// number only finds candidates fast.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Netns {
    pub path: PathBuf,
    pub inode: u32,
    pub cookie: u64,
}

/// Where the cgroup v2 hierarchy is mounted (/sys/fs/cgroup, or
/// /sys/fs/cgroup/unified on a hybrid host), if it is.
pub fn cgroup2_mount() -> Option<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").ok()?;
    let line = mounts
        .lines()
        .find(|l| l.split_whitespace().nth(2) == Some("cgroup2"))?;
    line.split_whitespace().nth(1).map(PathBuf::from)
}

/// Resolves a cgroup v2 directory; the error says what it is instead.
pub fn cgroup(path: &Path) -> Result<Cgroup, String> {
    let meta = std::fs::metadata(path).map_err(|e| format!("cannot read it: {e}"))?;
    if !meta.is_dir() || fs_magic(path)? != CGROUP2_SUPER_MAGIC {
        return Err(
            "is not a cgroup v2 directory (under the cgroup2 mount, e.g. /sys/fs/cgroup)".into(),
        );
    }
    // Walk up to the hierarchy's root: the depth, and the name the
    // /proc/PID/cgroup of a member shows.
    let mut names = Vec::new();
    let mut dir = std::fs::canonicalize(path).map_err(|e| format!("cannot resolve it: {e}"))?;
    loop {
        let ino = std::fs::metadata(&dir)
            .map_err(|e| format!("cannot read {}: {e}", dir.display()))?
            .ino();
        if ino == ROOT_CGROUP_ID {
            break;
        }
        let parent = dir.parent().map(Path::to_path_buf);
        match parent {
            Some(p) if fs_magic(&p).ok() == Some(CGROUP2_SUPER_MAGIC) => {
                names.push(
                    dir.file_name()
                        .unwrap_or_default()
                        .to_string_lossy()
                        .into_owned(),
                );
                dir = p;
            }
            _ => {
                return Err(
                    "is below a cgroup2 mount whose root is not the hierarchy's (a cgroup namespace); give the path as the host's /sys/fs/cgroup shows it".into(),
                );
            }
        }
    }
    names.reverse();
    Ok(Cgroup {
        path: path.to_path_buf(),
        name: format!("/{}", names.join("/")),
        id: meta.ino(),
        level: names.len() as u32,
    })
}

/// Resolves a network namespace file (`/run/netns/NAME`, `/proc/PID/ns/net`).
pub fn netns(path: &Path) -> Result<Netns, String> {
    let file = std::fs::File::open(path).map_err(|e| format!("cannot open it: {e}"))?;
    if fs_magic(path)? != NSFS_MAGIC {
        return Err("is not a namespace file (nsfs: /run/netns/NAME or /proc/PID/ns/net)".into());
    }
    // SAFETY: an ioctl without an argument on a file we own.
    let kind = unsafe { libc::ioctl(file.as_raw_fd(), NS_GET_NSTYPE) };
    if kind != libc::CLONE_NEWNET {
        return Err("is a namespace, but not a network namespace".into());
    }
    let inode = file
        .metadata()
        .map_err(|e| format!("cannot read it: {e}"))?
        .ino();
    let cookie = crate::host::netns::Netns::at(path)
        .and_then(|ns| ns.cookie())
        .map_err(|e| format!("{e:#}"))?;
    Ok(Netns {
        path: path.to_path_buf(),
        inode: u32::try_from(inode)
            .map_err(|_| "has an inode number beyond 32 bits".to_string())?,
        cookie,
    })
}

fn fs_magic(path: &Path) -> Result<i64, String> {
    let c = CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| "has a NUL byte")?;
    // SAFETY: statfs writes into the zeroed struct it is given.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return Err(format!(
            "cannot read it: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(st.f_type as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_root_cgroup_and_the_current_netns_resolve() {
        let root = cgroup(&cgroup2_mount().expect("cgroup2 is mounted")).expect("the cgroup2 root");
        assert_eq!((root.name.as_str(), root.id, root.level), ("/", 1, 0));
        let ns = netns(Path::new("/proc/self/ns/net")).expect("a netns");
        let ino = std::fs::metadata("/proc/self/ns/net").unwrap().ino();
        assert_eq!(u64::from(ns.inode), ino);
    }

    #[test]
    fn a_cgroup_below_the_root_has_its_depth_and_name() {
        let dir = cgroup2_mount()
            .expect("cgroup2 is mounted")
            .join(format!("pkeyfw-test-{}", std::process::id()));
        std::fs::create_dir(&dir).unwrap();
        std::fs::create_dir(dir.join("a")).unwrap();
        let got = cgroup(&dir.join("a"));
        std::fs::remove_dir(dir.join("a")).unwrap();
        std::fs::remove_dir(&dir).unwrap();
        let got = got.unwrap();
        let name = format!("/pkeyfw-test-{}/a", std::process::id());
        assert_eq!((got.name.as_str(), got.level), (name.as_str(), 2));
        assert_ne!(got.id, 1);
    }

    #[test]
    fn other_files_are_refused_with_what_they_are() {
        assert!(
            cgroup(Path::new("/tmp"))
                .unwrap_err()
                .contains("not a cgroup v2")
        );
        assert!(
            cgroup(Path::new("/nonexistent"))
                .unwrap_err()
                .contains("cannot read")
        );
        assert!(
            netns(Path::new("/etc/hostname"))
                .unwrap_err()
                .contains("not a namespace")
        );
        let uts = netns(Path::new("/proc/self/ns/uts")).unwrap_err();
        assert!(uts.contains("not a network namespace"), "{uts}");
    }
}
