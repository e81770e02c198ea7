//! Human-readable summaries of frames and P_Keys for the CLI's output. Display
//! only: verdicts always come from the kernel.

use pkeyfw_common::{
    Reason,
    parse::{self, Parsed, Transport},
    pkey,
};
use serde_json::{Map, Value, json};

/// `0x8001 (full, partition 0x0001)`.
pub fn pkey(p: u16) -> String {
    let membership = if pkey::is_full(p) { "full" } else { "limited" };
    format!("{p:#06x} ({membership}, partition {:#06x})", pkey::key(p))
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
