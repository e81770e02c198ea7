//! `attach --trace`: the programs log each judged frame from the kernel
//! (aya-log), and without it the verifier removes the logging code.

use crate::common;

use std::time::Duration;

use aya::programs::loaded_programs;
use pkeyfw::loading::filter::{Filter, Load};
use pkeyfw_common::{Reason, judge};
use pkeyfw_testkit::netns::{VethPair, send};

/// The XDP program's size as the kernel runs it (after the verifier's
/// dead-code removal), in bytes, and the instructions the verifier walked.
fn xlated(filter: &Filter) -> (u32, u32) {
    let id = filter.program_id().unwrap();
    let info = loaded_programs()
        .filter_map(Result::ok)
        .find(|p| p.id() == id)
        .expect("the loaded program");
    (
        info.size_translated().expect("xlated size"),
        info.verified_instruction_count().expect("verified count"),
    )
}

#[test]
fn without_trace_the_verifier_removes_the_logging() {
    common::require_root();
    let off = Filter::load(0).unwrap();
    let on = Filter::load_with(&Load {
        trace: true,
        ..Load::host(0)
    })
    .unwrap();
    let ((off_size, off_walked), (on_size, on_walked)) = (xlated(&off), xlated(&on));
    eprintln!("xlated bytes {off_size} / {on_size}, verified {off_walked} / {on_walked}");
    // The same bytecode, TRACE aside: the kernel must run a program smaller
    // by at least the logging's bulk (argument records, the ring reserve:
    // hundreds of instructions), removed, not just skipped.
    assert!(
        on_size >= off_size + 8 * 200,
        "xlated bytes: {off_size} without trace, {on_size} with"
    );
    assert!(
        on_walked > off_walked,
        "instructions verified: {off_walked} without trace, {on_walked} with"
    );
}

#[test]
fn attach_trace_prints_a_line_per_judged_frame() {
    let _root = common::pins_root();
    common::require_root();
    let pair = VethPair::create(&common::tag("tr")).unwrap();
    // Some cases are longer than any RoCE packet.
    pair.set_mtu(9000).unwrap();
    let (_dir, policy_path) = common::policy_file(common::cases::BASE);
    let policy = common::policy(common::cases::BASE);
    let frames: Vec<Vec<u8>> = common::cases::all()
        .into_iter()
        .filter(|c| c.policy == policy)
        .map(|c| c.frame)
        .collect();
    let fg = common::Foreground::start_with(&pair, &policy_path, "native", &["--trace"]);
    send(&pair.ns_a, &pair.a, &frames).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let out = fg.stop();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    let prefix = format!("pkeyfw: trace {}: in: ", pair.b);
    let traced: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix(&prefix))
        .collect();
    let mut want = Vec::new();
    for f in &frames {
        let o = judge(&f[..], &policy, &policy.config());
        if o.reason == Reason::NotRoce {
            continue;
        }
        let head = format!("{} {}", o.verdict().name(), o.reason.name());
        want.push(match o.roce {
            Some(r) => format!(
                "{head}: P_Key 0x{:x} Q_Key 0x{:x} QP {} -> {}",
                r.pkey(),
                r.qkey(),
                r.src_qp(),
                r.dest_qp()
            ),
            None => head,
        });
    }
    assert!(want.len() > 10, "enough RoCE frames to mean something");
    assert_eq!(
        traced.len(),
        want.len(),
        "a line per judged RoCE frame, none for others:\n{text}"
    );
    for w in &want {
        assert!(
            traced.iter().any(|t| t.starts_with(w.as_str())),
            "no trace line starting {w:?} in:\n{}",
            traced.join("\n")
        );
    }
}
