//! `pkeyfw lab` (what `cargo xtask lab` runs) shows every case as expected
//! and leaves nothing behind.

use crate::common;

use std::process::Command;

/// Runs `pkeyfw ARGS`, which must succeed; its standard output.
fn lab(args: &[&str]) -> String {
    common::require_root();
    let out = Command::new(env!("CARGO_BIN_EXE_pkeyfw"))
        .args(args)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

#[test]
fn the_lab_shows_every_case_as_expected() {
    let _root = common::pins_root();
    let text = lab(&["lab"]);
    let cases = pkeyfw::lab::scenario::cases().len();
    assert!(
        text.contains(&format!(
            "{cases} of {cases} cases as the partition rules say"
        )),
        "{text}"
    );
    assert!(!text.contains('✗'), "{text}");
    let netns = Command::new("ip").args(["netns", "list"]).output().unwrap();
    assert!(
        !String::from_utf8_lossy(&netns.stdout).contains("pkeyfw-lab"),
        "namespaces left behind"
    );
    assert!(
        !pkeyfw::loading::pins::Pins::of("pkeyfw-labb").exists(),
        "pins left behind"
    );
}

/// `pkeyfw lab switch`: the seeds' four hosts on a bridge, every frame as
/// the rules say at the switch ports, in all three rounds; `switch attach`
/// refuses the bridge while it has a port the policy does not list, naming
/// it, and nothing of a tenant on that port, once it joined again after the
/// attach, reaches anyone; nothing left.
#[test]
fn the_switch_lab_shows_every_frame_as_expected() {
    let _root = common::pins_root();
    let text = lab(&["lab", "switch"]);
    assert!(
        text.contains(": bridge br0 has ports the policy does not list: swe; expected every port"),
        "{text}"
    );
    // 12 ordered pairs × 3 networks + 2 forgeries, and E's 4 hosts × 5
    // networks, in 3 rounds, and 3 more forgeries at the access ports.
    assert!(
        text.contains("177 of 177 frames as the partition rules say"),
        "{text}"
    );
    for to in ['A', 'B', 'C', 'D'] {
        assert!(text.contains(&format!(" E → {to}    qinq ")), "{text}");
    }
    for round in ["round drop", "round corrupt", "round access"] {
        assert!(text.contains(round), "{text}");
    }
    assert!(!text.contains('✗'), "{text}");
    let netns = Command::new("ip").args(["netns", "list"]).output().unwrap();
    assert!(
        !String::from_utf8_lossy(&netns.stdout).contains("pkfw-sw"),
        "namespaces left behind"
    );
}
