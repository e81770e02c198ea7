//! Field offsets of kernel structures, from the kernel's own BTF
//! (/sys/kernel/btf): the connection probe reads `struct ib_qp` and
//! `struct ib_qp_attr`, which live in the ib_core module and change between
//! kernels. Module BTF is split BTF: its type IDs continue the kernel's and
//! its names may point into the kernel's string section, so both are read.

use std::path::Path;

use anyhow::{Context as _, Result, bail};

const MAGIC: u16 = 0xeb9f;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_TYPEDEF: u32 = 8;
const KIND_VOLATILE: u32 = 9;
const KIND_CONST: u32 = 10;
const KIND_RESTRICT: u32 = 11;
const KIND_TYPE_TAG: u32 = 18;

/// One type: its kind, name and, for structs and unions, members as
/// (name, type ID, bit offset).
struct Type {
    kind: u32,
    name: String,
    /// The referenced type of typedefs and qualifiers.
    target: u32,
    members: Vec<(String, u32, u32)>,
}

/// The kernel's types and a module's, indexed by type ID.
pub struct Btf {
    types: Vec<Type>,
}

impl Btf {
    /// The types of `module` (e.g. `ib_core`) on top of the kernel's.
    pub fn of_module(module: &str) -> Result<Btf> {
        Btf::load(&["vmlinux", module])
    }

    /// The kernel's own types.
    pub fn kernel() -> Result<Btf> {
        Btf::load(&["vmlinux"])
    }

    /// The kernel's BTF, then split BTF on top of it. A missing module's is
    /// said before the kernel's (some MiB) is parsed.
    fn load(files: &[&str]) -> Result<Btf> {
        for name in files.iter().filter(|n| **n != "vmlinux") {
            if !Path::new("/sys/module").join(name).exists() {
                bail!("no module {name} is loaded");
            }
        }
        let mut types = vec![Type {
            kind: 0,
            name: String::new(),
            target: 0,
            members: Vec::new(),
        }];
        let mut base = Vec::new();
        for name in files {
            let path = Path::new("/sys/kernel/btf").join(name);
            if *name != "vmlinux" && !path.exists() && Path::new("/sys/module").join(name).exists()
            {
                bail!(
                    "the kernel has no BTF for module {name} (module BTF needs Linux 5.11 built with CONFIG_DEBUG_INFO_BTF_MODULES)"
                );
            }
            let data =
                std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
            let strings = parse(&data, &base, &mut types)
                .with_context(|| format!("{}", path.display()))?
                .to_vec();
            base.extend(strings);
        }
        Ok(Btf { types })
    }

    /// Byte offset of `path` (member names, nested through structs) in
    /// `struct name`, e.g. `("ib_qp_attr", &["ah_attr", "grh", "dgid"])`.
    pub fn offset(&self, name: &str, path: &[&str]) -> Result<u32> {
        let mut id = self
            .types
            .iter()
            .position(|t| t.kind == KIND_STRUCT && t.name == name && !t.members.is_empty())
            .with_context(|| format!("no struct {name} in the kernel's BTF"))?
            as u32;
        let mut bits = 0;
        for member in path {
            let (at, ty) = self
                .member(id, member)
                .with_context(|| format!("struct {name} has no member {}", path.join(".")))?;
            bits += at;
            id = ty;
        }
        if bits % 8 != 0 {
            bail!("{name}.{} is a bit field", path.join("."));
        }
        Ok(bits / 8)
    }

    /// (bit offset, type) of `member` in the struct or union `id`, looking
    /// into anonymous members.
    fn member(&self, id: u32, member: &str) -> Option<(u32, u32)> {
        let t = &self.types[self.resolve(id) as usize];
        for (name, ty, at) in &t.members {
            if name == member {
                return Some((*at, *ty));
            }
            if name.is_empty()
                && let Some((inner, ty)) = self.member(*ty, member)
            {
                return Some((at + inner, ty));
            }
        }
        None
    }

    /// `id` with typedefs and qualifiers peeled off.
    fn resolve(&self, mut id: u32) -> u32 {
        for _ in 0..32 {
            match self.types.get(id as usize) {
                Some(t)
                    if matches!(
                        t.kind,
                        KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG
                    ) =>
                {
                    id = t.target
                }
                _ => break,
            }
        }
        id
    }
}

/// Appends the types of one BTF blob; its string section.
fn parse<'a>(data: &'a [u8], base_strings: &[u8], types: &mut Vec<Type>) -> Result<&'a [u8]> {
    let u32_at = |at: usize| -> Result<u32> {
        let b = data.get(at..at + 4).context("truncated")?;
        Ok(u32::from_le_bytes(b.try_into().expect("four bytes")))
    };
    if data.get(..2) != Some(&MAGIC.to_le_bytes()) {
        bail!("not little-endian BTF");
    }
    let hdr = u32_at(4)? as usize;
    let (type_off, type_len) = (u32_at(8)? as usize, u32_at(12)? as usize);
    let (str_off, str_len) = (u32_at(16)? as usize, u32_at(20)? as usize);
    let strings = data
        .get(hdr + str_off..hdr + str_off + str_len)
        .context("string section out of bounds")?;
    let name = |off: u32| -> String {
        let off = off as usize;
        let (table, at) = if off < base_strings.len() {
            (base_strings, off)
        } else {
            (strings, off - base_strings.len())
        };
        let s = table.get(at..).unwrap_or_default();
        let end = s.iter().position(|&b| b == 0).unwrap_or(s.len());
        String::from_utf8_lossy(&s[..end]).into_owned()
    };
    let (mut at, end) = (hdr + type_off, hdr + type_off + type_len);
    while at < end {
        let info = u32_at(at + 4)?;
        let (kind, vlen, kind_flag) = ((info >> 24) & 0x1f, (info & 0xffff) as usize, info >> 31);
        let mut t = Type {
            kind,
            name: name(u32_at(at)?),
            target: u32_at(at + 8)?,
            members: Vec::new(),
        };
        at += 12;
        let extra = match kind {
            1 | 14 | 17 => 4,     // int, var, decl tag
            3 => 12,              // array
            6 | 13 => 8 * vlen,   // enum, function prototype
            15 | 19 => 12 * vlen, // data section, enum64
            KIND_STRUCT | KIND_UNION => {
                for m in 0..vlen {
                    let m = at + 12 * m;
                    let offset = u32_at(m + 8)?;
                    let bits = if kind_flag == 1 {
                        offset & 0xff_ffff
                    } else {
                        offset
                    };
                    t.members.push((name(u32_at(m)?), u32_at(m + 4)?, bits));
                }
                12 * vlen
            }
            2 | 7..=12 | 16 | 18 => 0,
            other => bail!("unknown BTF kind {other}"),
        };
        at += extra;
        types.push(t);
    }
    Ok(strings)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Offsets in the running kernel's types (the RDMA ones, in ib_core's
    /// split BTF, are read the same way in the soft-RoCE lab).
    #[test]
    fn finds_member_offsets_in_kernel_btf() {
        let btf = Btf::kernel().unwrap();
        // struct list_head { next; prev; }, on every 64-bit kernel.
        assert_eq!(btf.offset("list_head", &["prev"]).unwrap(), 8);
        // Through a nested struct: sk_buff's members are in anonymous unions.
        let len = btf.offset("sk_buff", &["len"]).unwrap();
        assert!(len > 0 && len < 256, "{len}");
        assert!(btf.offset("list_head", &["nope"]).is_err());
        assert!(btf.offset("no_such_struct", &["x"]).is_err());
    }
}
