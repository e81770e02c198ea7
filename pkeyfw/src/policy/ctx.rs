//! Reading a policy file: where it is (one snapshot of its directory, for
//! the files it names), and the typed checks of its fields, whose every
//! refusal names the file, line, column and field. Beneath the file's and
//! the `[[bind]]` rules' parsers, which both use it.

use std::{ops::Range, path::Path};

use toml::Spanned;

use super::PolicyError;
use pkeyfw_common::pkey;

/// Smallest QPN a policy can bind: QP0 and QP1 have fixed rules.
pub(super) const MIN_QPN: u32 = 2;

/// Validation context: the file, for error positions.
pub(super) struct Ctx<'a> {
    /// The file as given, for errors.
    pub(super) path: &'a Path,
    pub(super) text: &'a str,
    /// Where the files it names are read from (see [`Source`]).
    pub(super) dir: &'a Path,
}

/// A policy file read from one snapshot of its directory. A Kubernetes
/// ConfigMap volume changes every file at once by re-pointing its `..data`
/// symlink: the policy and the partitions.conf it names must come from the
/// same version, so the directory is resolved once, and both are read from
/// what it resolved to.
pub(super) struct Source {
    pub(super) path: std::path::PathBuf,
    pub(super) text: String,
    pub(super) dir: std::path::PathBuf,
}

impl Source {
    pub(super) fn read(path: &Path) -> Result<Source, PolicyError> {
        let real = std::fs::canonicalize(path).map_err(|e| PolicyError::io(path, &e))?;
        let text = std::fs::read_to_string(&real).map_err(|e| PolicyError::io(path, &e))?;
        Ok(Source {
            path: path.to_path_buf(),
            text,
            dir: real.parent().unwrap_or(Path::new("/")).to_path_buf(),
        })
    }

    pub(super) fn ctx(&self) -> Ctx<'_> {
        Ctx {
            path: &self.path,
            text: &self.text,
            dir: &self.dir,
        }
    }
}

impl Ctx<'_> {
    /// A file the policy names, in the policy's snapshot: relative to its
    /// directory; an absolute path into the directory the policy was given
    /// in is read from the snapshot too.
    pub(super) fn named(&self, name: &str) -> std::path::PathBuf {
        let name = Path::new(name);
        let given = self.path.parent().filter(|d| !d.as_os_str().is_empty());
        match given.and_then(|d| name.strip_prefix(d).ok()) {
            Some(rest) if name.is_absolute() => self.dir.join(rest),
            _ => self.dir.join(name),
        }
    }

    /// Parses the file's TOML into `T`, or an error at its position.
    pub(super) fn toml<T: serde::de::DeserializeOwned>(&self) -> Result<T, PolicyError> {
        toml::from_str(self.text).map_err(|e| {
            let at = e.span().map_or(0, |s| s.start);
            PolicyError::at(
                self.path,
                self.text,
                at,
                "",
                e.message().trim_end().to_string(),
            )
        })
    }

    pub(super) fn err(
        &self,
        span: Range<usize>,
        field: &str,
        message: impl Into<String>,
    ) -> PolicyError {
        PolicyError::at(self.path, self.text, span.start, field, message.into())
    }

    /// A required field, or an error at the enclosing table.
    pub(super) fn need<'v, T>(
        &self,
        value: &'v Option<Spanned<T>>,
        table: Range<usize>,
        field: &str,
        expected: &str,
    ) -> Result<&'v Spanned<T>, PolicyError> {
        value
            .as_ref()
            .ok_or_else(|| self.err(table, field, format!("missing; expected {expected}")))
    }

    /// An integer field that must lie in `range`.
    pub(super) fn int(
        &self,
        v: &Spanned<i64>,
        field: &str,
        max: u64,
        what: &str,
    ) -> Result<u64, PolicyError> {
        u64::try_from(*v.get_ref())
            .ok()
            .filter(|&n| n <= max)
            .ok_or_else(|| {
                self.err(
                    v.span(),
                    field,
                    format!("{} is out of range; expected {what}", v.get_ref()),
                )
            })
    }

    pub(super) fn pkey(&self, v: &Spanned<i64>, field: &str) -> Result<u16, PolicyError> {
        let p = self.int(v, field, 0xffff, "a 16-bit P_Key such as 0x8001")? as u16;
        if !pkey::is_valid(p) {
            return Err(self.err(
                v.span(),
                field,
                format!("{p:#06x} has key portion 0 (the invalid P_Key); expected a partition in 0x0001..=0x7fff"),
            ));
        }
        Ok(p)
    }

    pub(super) fn qkey(&self, v: &Spanned<i64>, field: &str) -> Result<u32, PolicyError> {
        Ok(self.int(
            v,
            field,
            u32::MAX.into(),
            "a 32-bit Q_Key such as 0x11111111",
        )? as u32)
    }

    /// `pkey` or `pkey_index`, either way an entry of the port's table.
    pub(super) fn binding(
        &self,
        pkeys: &[u16],
        pkey: &Option<Spanned<i64>>,
        index: &Option<Spanned<i64>>,
        table: Range<usize>,
        field: &str,
    ) -> Result<u16, PolicyError> {
        match (pkey, index) {
            (Some(_), Some(i)) => Err(self.err(
                i.span(),
                &format!("{field}.pkey_index"),
                "given together with `pkey`; expected one of the two",
            )),
            (None, None) => Err(self.err(
                table,
                &format!("{field}.pkey"),
                "missing; expected `pkey` (a value of [port].pkeys) or `pkey_index`",
            )),
            (Some(p), None) => {
                let name = format!("{field}.pkey");
                let value = self.pkey(p, &name)?;
                if pkeys.contains(&value) {
                    Ok(value)
                } else {
                    Err(self.err(
                        p.span(),
                        &name,
                        format!("{value:#06x} is not in [port].pkeys {}", hex_list(pkeys)),
                    ))
                }
            }
            (None, Some(i)) => {
                let name = format!("{field}.pkey_index");
                let last = pkeys.len() - 1;
                let at = self.int(i, &name, last as u64, &format!("an index in 0..={last}"))?;
                Ok(pkeys[at as usize])
            }
        }
    }
}

pub(super) fn hex_list(pkeys: &[u16]) -> String {
    let items: Vec<String> = pkeys.iter().map(|p| format!("{p:#06x}")).collect();
    format!("[{}]", items.join(", "))
}
