//! Human-readable summaries of frames and P_Keys for the CLI's output. Display
//! only: verdicts always come from the kernel.

use pkeyfw_common::{
    Reason,
    parse::{self, Parsed, Transport},
    pkey,
};
use serde_json::{Map, Value, json};

use crate::policy::BindRule;

/// `0x8001 (full, partition 0x0001)`.
pub fn pkey(p: u16) -> String {
    let membership = if pkey::is_full(p) { "full" } else { "limited" };
    format!("{p:#06x} ({membership}, partition {:#06x})", pkey::key(p))
}

/// What a `[[bind]]` rule matches and what it binds to, e.g.
/// `comm ibv_ud_pingpong, type ud → P_Key 0x8001, Q_Key 0x11111111`.
pub fn bind_rule(b: &BindRule) -> String {
    let mut matchers = Vec::new();
    if let Some(c) = &b.comm {
        matchers.push(format!("comm {c}"));
    }
    if let Some(p) = b.pid {
        matchers.push(format!("pid {p}"));
    }
    if let Some(r) = &b.qpns {
        matchers.push(if r.start() == r.end() {
            format!("QPN {:#x}", r.start())
        } else {
            format!("QPNs {:#x}..={:#x}", r.start(), r.end())
        });
    }
    if let Some(t) = b.qp_type {
        matchers.push(format!("type {}", t.name()));
    }
    let mut s = format!("{} → P_Key {:#06x}", matchers.join(", "), b.pkey);
    if let Some(q) = b.qkey {
        s += &format!(", Q_Key {q:#010x}");
    }
    s
}

/// A one-line summary of what a frame carries, e.g.
/// `RoCE UD SEND_ONLY → QP 0x000011, P_Key 0x8001, Q_Key 0x11111111`.
pub fn frame(data: &[u8]) -> String {
    match parse::classify(data) {
        Parsed::NotRoce => "not RoCE".to_string(),
        Parsed::Malformed => "malformed or cut short".to_string(),
        Parsed::Roce(r) => {
            let transport = match r.transport {
                Transport::Rc => "RC",
                Transport::Uc => "UC",
                Transport::Ud => "UD",
                Transport::Xrc => "XRC",
                Transport::Cnp => "CNP",
            };
            let mut s = format!(
                "RoCE {transport} → QP {:#08x}, P_Key {:#06x}",
                r.dest_qp, r.pkey
            );
            if r.transport == Transport::Ud {
                s += &format!(", Q_Key {:#010x}", r.qkey);
            }
            s
        }
    }
}

/// Counts per reason, one `  name  count` line each, in counter order.
pub fn reasons_text(
    counts: &[u64; Reason::COUNT],
    out: &mut impl std::io::Write,
) -> std::io::Result<()> {
    for r in Reason::ALL {
        writeln!(out, "  {:<16} {:>12}", r.name(), counts[r.index() as usize])?;
    }
    Ok(())
}

/// Counts per reason as a JSON object with all eight names, in counter order.
pub fn reasons_json(counts: &[u64; Reason::COUNT]) -> Value {
    let reasons: Map<_, _> = Reason::ALL
        .iter()
        .map(|r| (r.name().to_string(), json!(counts[r.index() as usize])))
        .collect();
    Value::Object(reasons)
}
