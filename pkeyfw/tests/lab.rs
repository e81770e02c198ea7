//! `pkeyfw lab` (what `cargo xtask lab` runs) shows every case as expected
//! and leaves nothing behind.

mod common;

use std::process::Command;

#[test]
fn the_lab_shows_every_case_as_expected() {
    common::require_root();
    let out = Command::new(env!("CARGO_BIN_EXE_pkeyfw"))
        .arg("lab")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cases = pkeyfw::cmd::lab::scenario::cases().len();
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
