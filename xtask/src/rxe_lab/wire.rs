//! What a capture carries, as tshark's InfiniBand dissector reads it: an
//! independent decoder, so the lab's view of the wire is not pkeyfw's own.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

/// The distinct keys of some captures' RoCE frames, sorted.
pub struct Wire {
    pub frames: usize,
    pub pkeys: Vec<u64>,
    pub qkeys: Vec<u64>,
}

pub fn decode(captures: &[PathBuf]) -> Result<Wire> {
    let mut all = Wire {
        frames: 0,
        pkeys: Vec::new(),
        qkeys: Vec::new(),
    };
    for capture in captures {
        let one = decode_one(capture)?;
        all.frames += one.frames;
        all.pkeys.extend(one.pkeys);
        all.qkeys.extend(one.qkeys);
    }
    for keys in [&mut all.pkeys, &mut all.qkeys] {
        keys.sort_unstable();
        keys.dedup();
    }
    Ok(all)
}

fn decode_one(capture: &Path) -> Result<Wire> {
    let out = Command::new("tshark")
        .arg("-r")
        .arg(capture)
        .args([
            "-Y",
            "infiniband.bth",
            "-T",
            "fields",
            "-E",
            "separator=,",
            "-e",
            "infiniband.bth.p_key",
            "-e",
            "infiniband.deth.q_key",
        ])
        .output()
        .context("cannot run tshark")?;
    if !out.status.success() {
        bail!(
            "tshark could not read {}: {}",
            capture.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let (mut pkeys, mut qkeys, mut frames) = (BTreeSet::new(), BTreeSet::new(), 0);
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let mut fields = line.split(',');
        let pkey = fields.next().unwrap_or("");
        frames += 1;
        pkeys.insert(number(pkey).with_context(|| format!("tshark printed P_Key {pkey:?}"))?);
        if let Some(q) = fields.next().filter(|q| !q.is_empty()) {
            qkeys.insert(number(q).with_context(|| format!("tshark printed Q_Key {q:?}"))?);
        }
    }
    Ok(Wire {
        frames,
        pkeys: pkeys.into_iter().collect(),
        qkeys: qkeys.into_iter().collect(),
    })
}

/// tshark prints P_Keys in decimal and Q_Keys in hex.
fn number(s: &str) -> Option<u64> {
    match s.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => s.parse().ok(),
    }
}
