//! Human-readable summaries of frames and P_Keys for the CLI's output. Display
//! only: verdicts always come from the kernel.

use pkeyfw_common::{
    Reason, Verdict,
    abi::QpType,
    parse::{self, Class, Parsed, Transport},
    pkey,
};
use serde_json::{Map, Value, json};

use crate::{
    loading::maps::ReasonCounts,
    policy::{BindRule, SwitchRole},
};

/// A `VIOLATIONS` partition as the CLI and the metrics name it: `0x0001`,
/// or `other` for keys the port's table does not hold.
pub fn violation_partition(p: u16) -> String {
    if p == pkeyfw_common::abi::OTHER_PARTITION {
        "other".to_string()
    } else {
        format!("{p:#06x}")
    }
}

/// `0x8001 (full, partition 0x0001)`.
pub fn pkey(p: u16) -> String {
    let membership = if pkey::is_full(p) { "full" } else { "limited" };
    format!("{p:#06x} ({membership}, partition {:#06x})", pkey::key(p))
}

/// A switch port's checks, as `policy check` and `stats` show them.
pub fn switch_role(role: &SwitchRole) -> String {
    let checks: Vec<&str> = [(role.inbound, "inbound"), (role.outbound, "outbound")]
        .into_iter()
        .filter_map(|(on, name)| on.then_some(name))
        .collect();
    let mut text = match checks.is_empty() {
        true => "no checks".to_string(),
        false => format!(
            "checks {}, violations {}",
            checks.join(" and "),
            if role.corrupt { "corrupted" } else { "dropped" }
        ),
    };
    if let Some(key) = role.access {
        text.push_str(&format!("; access port: 0xffff in ⟷ {key:#06x}"));
    }
    text
}

/// A name a tenant chose (a command name, up to 15 bytes of anything), safe
/// to print in a line of text: control characters (an escape sequence that
/// clears a terminal or forges a journal line), backslashes and the
/// bidirectional overrides that reorder what a terminal shows are written
/// as Rust escapes (`\u{1b}`). JSON output keeps the name as data.
pub fn name(s: &str) -> std::borrow::Cow<'_, str> {
    let unsafe_char = |c: char| {
        c.is_control()
            || c == '\\'
            || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    };
    if !s.chars().any(unsafe_char) {
        return s.into();
    }
    s.chars()
        .map(|c| match c {
            '\\' => "\\\\".to_string(),
            c if unsafe_char(c) => format!("\\u{{{:x}}}", c as u32),
            c => c.to_string(),
        })
        .collect::<String>()
        .into()
}

/// What a `[[bind]]` rule matches, what it binds to and what it isolates,
/// e.g. `cgroup /tenants/a → P_Key 0x8001, its own Q_Key (isolates: cgroup)`.
pub fn bind_rule(b: &BindRule) -> String {
    let mut matchers = Vec::new();
    if let Some(c) = &b.cgroup {
        matchers.push(format!("cgroup {}", c.name));
    }
    if let Some(u) = b.uid {
        matchers.push(format!("uid {u}"));
    }
    if let Some(g) = b.gid {
        matchers.push(format!("gid {g}"));
    }
    if let Some(n) = &b.netns {
        matchers.push(format!("netns {} (inode {})", n.path.display(), n.inode));
    }
    if b.kernel {
        matchers.push("kernel QPs".to_string());
    }
    if let Some(c) = &b.comm {
        matchers.push(format!("comm {}", name(c)));
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
    match (b.qkey, b.qp_type) {
        (Some(q), _) => s += &format!(", Q_Key {q:#010x}"),
        (None, None | Some(QpType::Ud)) => s += ", UD QPs their own Q_Key",
        (None, _) => {}
    }
    let isolates: Vec<&str> = [
        (b.cgroup.is_some(), "cgroup"),
        (b.uid.is_some(), "user"),
        (b.gid.is_some(), "group"),
        (b.netns.is_some(), "network namespace"),
        (b.kernel, "kernel user (no process can match it)"),
    ]
    .into_iter()
    .filter_map(|(given, what)| given.then_some(what))
    .collect();
    if isolates.is_empty() {
        s += " (isolates nothing: any process can match it)";
    } else {
        s += &format!(" (isolates by {})", isolates.join(", "));
    }
    if let Some(own) = &b.own {
        let addrs: Vec<String> = own.addrs.iter().map(ToString::to_string).collect();
        s += &format!(
            "; its own device {} on {} ({}{})",
            own.name,
            own.iface,
            addrs.join(", "),
            own.gateways
                .iter()
                .map(|g| format!(", gateway {g}"))
                .collect::<String>()
        );
    }
    s
}

/// A one-line summary of what a frame carries, e.g.
/// `RoCE UD SEND_ONLY → QP 0x000011, P_Key 0x8001, Q_Key 0x11111111`.
pub fn frame(data: &[u8]) -> String {
    match parse::classify(data) {
        Parsed {
            class: Class::NotRoce,
            ..
        } => "not RoCE".to_string(),
        Parsed {
            class: Class::Malformed,
            ..
        } => "malformed or cut short".to_string(),
        Parsed { roce: r, .. } => {
            let transport = match r.transport() {
                Transport::Rc => "RC",
                Transport::Uc => "UC",
                Transport::Ud => "UD",
                Transport::Xrc => "XRC",
                Transport::Cnp => "CNP",
            };
            let mut s = format!(
                "RoCE {transport} → QP {:#08x}, P_Key {:#06x}",
                r.dest_qp(),
                r.pkey()
            );
            if r.ud() {
                s += &format!(", Q_Key {:#010x}", r.qkey());
            }
            s
        }
    }
}

/// Counts per reason, in counter order: a header, then per reason its
/// frames and what was done with them.
pub fn reasons_text(counts: &ReasonCounts, out: &mut impl std::io::Write) -> std::io::Result<()> {
    write!(out, "  {:<16} {:>12}", "reason", "frames")?;
    for v in Verdict::ALL {
        write!(out, " {:>12}", v.name())?;
    }
    writeln!(out)?;
    for r in Reason::ALL {
        write!(out, "  {:<16} {:>12}", r.name(), counts.total(r))?;
        for v in Verdict::ALL {
            write!(out, " {:>12}", counts.get(r, v))?;
        }
        writeln!(out)?;
    }
    Ok(())
}

/// Frames per reason as a JSON object with every reason's name, in counter
/// order.
pub fn reasons_json(counts: &ReasonCounts) -> Value {
    let reasons: Map<_, _> = Reason::ALL
        .iter()
        .map(|&r| (r.name().to_string(), json!(counts.total(r))))
        .collect();
    Value::Object(reasons)
}

/// Frames per reason and verdict: `{"pkey_violation": {"pass": 0, "drop": 3,
/// "monitor": 0}, ...}`.
pub fn verdicts_json(counts: &ReasonCounts) -> Value {
    let reasons: Map<_, _> = Reason::ALL
        .iter()
        .map(|&r| {
            let by: Map<_, _> = Verdict::ALL
                .iter()
                .map(|&v| (v.name().to_string(), json!(counts.get(r, v))))
                .collect();
            (r.name().to_string(), Value::Object(by))
        })
        .collect();
    Value::Object(reasons)
}

/// How to name an interface on pkeyfw's command line: `[--netns NS] IFACE`.
pub fn cli_iface(iface: &str, netns: Option<&str>) -> String {
    match netns {
        Some(ns) => format!("--netns {ns} {iface}"),
        None => iface.to_string(),
    }
}

#[cfg(test)]
mod tests {
    /// A process named with an escape sequence (clear the screen, go home)
    /// or a bidirectional override prints as escapes, not as what they do.
    #[test]
    fn a_tenants_name_prints_escaped() {
        assert_eq!(super::name("ibv_rc_pingpong"), "ibv_rc_pingpong");
        assert_eq!(super::name("\x1b[2J\x1b[Hok"), "\\u{1b}[2J\\u{1b}[Hok");
        assert_eq!(super::name("a\nb\\c"), "a\\u{a}b\\\\c");
        assert_eq!(super::name("x\u{202e}y"), "x\\u{202e}y");
    }
}
