//! `cargo xtask package`: target/debian/pkeyfw_VERSION_ARCH.deb.
//!
//! Packed by dpkg-deb from a staged tree rather than by cargo-deb: half of
//! what the package holds is made here, not by cargo (the man pages and
//! completions generated from the CLI, the unit with the package's paths,
//! the gzipped changelog), dpkg-deb and dpkg-shlibdeps come with every
//! Debian system (cargo-deb would be one more tool to build), and the tree is
//! laid out the way debhelper lays out debian/pkeyfw, so lintian judges it
//! as any Debian package. The binary is the production build
//! (`--no-default-features`: no `lab`, no test kit), as in the container
//! image.

pub mod check;

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

use crate::cmd::{self, output};

/// Tools the build uses, and their Debian packages.
const TOOLS: &[(&str, &str)] = &[
    ("dpkg-deb", "dpkg"),
    ("dpkg-shlibdeps", "dpkg-dev"),
    ("strip", "binutils"),
    ("gzip", "gzip"),
];

/// Where the unit reads its policies and the README tells a hand install
/// to put the binary; the package's binary is in /usr/bin.
const HAND_INSTALLED: &str = "/usr/local/bin/pkeyfw";
const PACKAGED: &str = "/usr/bin/pkeyfw";

/// The CNI plugin (`"type": "pkeyfw"`): a link to the binary in the
/// directory of Debian's CNI plugins (containernetworking-plugins), where
/// podman and CRI runtimes configured for Debian look.
pub const CNI_PLUGIN: &str = "usr/lib/cni/pkeyfw";

/// The unit's place: bookworm's systemd and lintian want /lib, not
/// /usr/lib (files may not move between aliased directories until trixie).
pub const UNIT: &str = "lib/systemd/system/pkeyfw@.service";

/// What `package` made.
pub struct Package {
    pub deb: PathBuf,
    pub version: String,
}

/// Builds the package; the release CLI is left built with its default
/// features, as the other tasks expect it.
pub fn run() -> Result<Package> {
    crate::guest::ensure_tools(TOOLS)?;
    let root = cmd::root();
    let out = root.join("target/debian");
    // debian/pkeyfw under a scratch source tree, where dpkg-shlibdeps looks.
    let work = out.join("build");
    let _ = fs::remove_dir_all(&work);
    let stage = work.join("debian/pkeyfw");
    fs::create_dir_all(&stage)?;

    let features = ["--release", "--package", "pkeyfw", "--no-default-features"];
    cmd::cargo(&[&["build"][..], &features].concat())?;
    let bin = stage.join("usr/bin/pkeyfw");
    install(&root.join("target/release/pkeyfw"), &bin, 0o755)?;
    let generated = work.join("generated");
    cmd::cargo(
        &[
            &["run"][..],
            &features,
            &["--example", "package_docs", "--"],
            &[generated.to_str().context("a UTF-8 path")?],
        ]
        .concat(),
    )?;
    // Back to the build the tests, the lab and the guest use.
    crate::build()?;
    // As dh_strip does: the symbols go, the embedded BPF object (data) stays.
    cmd::run(
        Command::new("strip")
            .args([
                "--strip-unneeded",
                "--remove-section=.comment",
                "--remove-section=.note",
            ])
            .arg(&bin),
    )?;
    let version = version(&bin)?;
    // The CNI plugin is the same binary, where Debian's runtimes look.
    let plugin = stage.join(CNI_PLUGIN);
    fs::create_dir_all(plugin.parent().context("a file has a parent")?)?;
    std::os::unix::fs::symlink("../../bin/pkeyfw", &plugin)?;

    man_pages(&generated.join("man"), &stage.join("usr/share/man/man8"))?;
    completions(&generated.join("completions"), &stage)?;
    unit(&root, &stage)?;
    docs(&root, &stage, &version)?;

    let arch = output(Command::new("dpkg").arg("--print-architecture"))
        .context("dpkg --print-architecture")?;
    let arch = arch.trim();
    control(&root, &work, &stage, &version, arch)?;
    let deb = out.join(format!("pkeyfw_{version}_{arch}.deb"));
    cmd::run(
        Command::new("dpkg-deb")
            .args(["--root-owner-group", "-Zxz", "--build"])
            .arg(&stage)
            .arg(&deb),
    )?;
    println!("xtask: built {}", deb.display());
    Ok(Package { deb, version })
}

/// Copies `from` to `to` (parents made 0755) with `mode`.
fn install(from: &Path, to: &Path, mode: u32) -> Result<()> {
    use std::os::unix::fs::{DirBuilderExt as _, PermissionsExt as _};
    let parent = to.parent().context("a file has a parent")?;
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(parent)?;
    fs::copy(from, to).with_context(|| format!("copying {}", from.display()))?;
    fs::set_permissions(to, fs::Permissions::from_mode(mode))?;
    Ok(())
}

/// Writes `text` to `to` (0644).
fn write(to: &Path, text: &[u8]) -> Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    fs::create_dir_all(to.parent().context("a file has a parent")?)?;
    fs::write(to, text)?;
    fs::set_permissions(to, fs::Permissions::from_mode(0o644))?;
    Ok(())
}

/// The version the binary reports (`pkeyfw 0.1.0`).
fn version(bin: &Path) -> Result<String> {
    let said = output(Command::new(bin).arg("--version")).context("pkeyfw --version")?;
    said.split_whitespace()
        .nth(1)
        .map(str::to_string)
        .with_context(|| format!("pkeyfw --version said {said:?}"))
}

/// `gzip -9n`: Debian's compression, with no name or time in the header
/// (reproducible).
fn gzip(from: &Path, to: &Path) -> Result<()> {
    let compressed = Command::new("gzip")
        .args(["-9n", "--stdout"])
        .arg(from)
        .output()
        .context("gzip")?;
    if !compressed.status.success() {
        bail!("gzip {} failed", from.display());
    }
    write(to, &compressed.stdout)
}

fn man_pages(from: &Path, to: &Path) -> Result<()> {
    let mut pages: Vec<PathBuf> = fs::read_dir(from)?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    pages.sort();
    if !pages.iter().any(|p| p.ends_with("pkeyfw.8")) {
        bail!("package_docs wrote no pkeyfw.8 in {}", from.display());
    }
    for page in pages {
        let name = page.file_name().context("a page has a name")?;
        gzip(&page, &to.join(format!("{}.gz", name.to_string_lossy())))?;
    }
    Ok(())
}

/// Each shell's completion where that shell's Debian package looks.
fn completions(from: &Path, stage: &Path) -> Result<()> {
    for (file, place) in [
        (
            "pkeyfw.bash",
            "usr/share/bash-completion/completions/pkeyfw",
        ),
        ("_pkeyfw", "usr/share/zsh/vendor-completions/_pkeyfw"),
        (
            "pkeyfw.fish",
            "usr/share/fish/vendor_completions.d/pkeyfw.fish",
        ),
    ] {
        install(&from.join(file), &stage.join(place), 0o644)?;
    }
    Ok(())
}

/// contrib/systemd's unit, running the package's binary.
fn unit(root: &Path, stage: &Path) -> Result<()> {
    let text = fs::read_to_string(root.join("contrib/systemd/pkeyfw@.service"))?;
    if !text.contains(&format!("ExecStart={HAND_INSTALLED} ")) {
        bail!("contrib/systemd/pkeyfw@.service no longer runs {HAND_INSTALLED}: update package.rs");
    }
    write(
        &stage.join(UNIT),
        text.replace(HAND_INSTALLED, PACKAGED).as_bytes(),
    )
}

/// The README and the docs/ pages the unit's Documentation= names (the
/// README links into them), the example policies, the copyright and the
/// changelog, whose version must be the binary's.
fn docs(root: &Path, stage: &Path, version: &str) -> Result<()> {
    let doc = stage.join("usr/share/doc/pkeyfw");
    install(&root.join("README.md"), &doc.join("README.md"), 0o644)?;
    for page in fs::read_dir(root.join("docs"))? {
        let path = page?.path();
        if path.extension().is_some_and(|e| e == "md") {
            let name = path.file_name().context("a page has a name")?;
            install(&path, &doc.join("docs").join(name), 0o644)?;
        }
    }
    install(
        &root.join("contrib/debian/copyright"),
        &doc.join("copyright"),
        0o644,
    )?;
    let changelog = root.join("contrib/debian/changelog");
    let first = fs::read_to_string(&changelog)?
        .lines()
        .next()
        .unwrap_or_default()
        .to_string();
    if !first.starts_with(&format!("pkeyfw ({version}) ")) {
        bail!("contrib/debian/changelog starts with {first:?}: add an entry for version {version}");
    }
    // A native package's changelog (its version has no Debian revision).
    gzip(&changelog, &doc.join("changelog.gz"))?;
    let examples = root.join("contrib/examples");
    for e in fs::read_dir(&examples)? {
        let path = e?.path();
        let name = path.file_name().context("an example has a name")?;
        install(&path, &doc.join("examples").join(name), 0o644)?;
    }
    Ok(())
}

/// DEBIAN/control (the library dependencies from dpkg-shlibdeps, the size
/// from the tree), DEBIAN/md5sums and the maintainer scripts.
fn control(root: &Path, work: &Path, stage: &Path, version: &str, arch: &str) -> Result<()> {
    // dpkg-shlibdeps wants a source tree's debian/control; it reads none of it.
    write(&work.join("debian/control"), b"")?;
    let said = Command::new("dpkg-shlibdeps")
        .args(["-O", "debian/pkeyfw/usr/bin/pkeyfw"])
        .current_dir(work)
        .output()
        .context("dpkg-shlibdeps")?;
    let said = String::from_utf8_lossy(&said.stdout);
    let depends = said
        .lines()
        .find_map(|l| l.strip_prefix("shlibs:Depends="))
        .with_context(|| format!("dpkg-shlibdeps printed no shlibs:Depends: {said}"))?;
    let (mut files, mut bytes) = (Vec::new(), 0);
    walk(stage, &mut |path| {
        bytes += fs::symlink_metadata(path)?.len();
        files.push(path.to_path_buf());
        Ok(())
    })?;
    files.sort();
    let mut sums = String::new();
    // As dh_md5sums: regular files only (a link has no contents of its own).
    for f in files.iter().filter(|f| !f.is_symlink()) {
        let sum = output(Command::new("md5sum").arg(f)).context("md5sum")?;
        let hash = sum.split_whitespace().next().unwrap_or_default();
        let rel = f.strip_prefix(stage)?;
        sums.push_str(&format!("{hash}  {}\n", rel.display()));
    }
    let template = fs::read_to_string(root.join("contrib/debian/control"))?;
    let text = template
        .replace("@VERSION@", version)
        .replace("@ARCH@", arch)
        .replace("@INSTALLED_SIZE@", &bytes.div_ceil(1024).to_string())
        .replace("@DEPENDS@", depends);
    let debian = stage.join("DEBIAN");
    write(&debian.join("control"), text.as_bytes())?;
    write(&debian.join("md5sums"), sums.as_bytes())?;
    // What systemd must hear of: the unit installed, upgraded or removed.
    for script in ["postinst", "prerm", "postrm"] {
        install(
            &root.join("contrib/debian").join(script),
            &debian.join(script),
            0o755,
        )?;
    }
    // Directories as dpkg-deb wants them, whatever the umask made.
    walk_dirs(stage, &mut |dir| {
        use std::os::unix::fs::PermissionsExt as _;
        fs::set_permissions(dir, fs::Permissions::from_mode(0o755))?;
        Ok(())
    })
}

/// Calls `f` on every file under `dir`.
fn walk(dir: &Path, f: &mut dyn FnMut(&Path) -> Result<()>) -> Result<()> {
    for e in fs::read_dir(dir)? {
        let path = e?.path();
        if path.is_dir() {
            walk(&path, f)?;
        } else {
            f(&path)?;
        }
    }
    Ok(())
}

/// Calls `f` on `dir` and every directory under it.
fn walk_dirs(dir: &Path, f: &mut dyn FnMut(&Path) -> Result<()>) -> Result<()> {
    f(dir)?;
    for e in fs::read_dir(dir)? {
        let path = e?.path();
        if path.is_dir() {
            walk_dirs(&path, f)?;
        }
    }
    Ok(())
}
