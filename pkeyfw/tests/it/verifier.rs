//! The verifier's budget: every program pkeyfw loads, for a host's port and
//! a switch's, is accepted after at most `VERIFIER_BUDGET` processed
//! instructions on the running kernel (a tenth of its limit), so that the
//! programs have room to grow and an attach takes milliseconds.

use crate::common;

use pkeyfw::{attachment::cost, loading::cost::VERIFIER_BUDGET};

#[test]
fn every_program_is_verified_within_the_budget() {
    common::require_root();
    for switch in [false, true] {
        let costs = cost::measure(switch).expect("load every program");
        // The filter's three programs, a host port's eleven probes (QPs,
        // Q_Keys, joins; listeners and connections) and the device guard.
        assert_eq!(costs.len(), if switch { 3 } else { 15 }, "{costs:?}");
        for c in &costs {
            eprintln!("{c:?}");
            let verified = c
                .verified
                .expect("the kernel says what its verifier processed (Linux 5.16+)");
            assert!(
                verified <= VERIFIER_BUDGET,
                "{} (switch: {switch}) took {verified} processed instructions, over {VERIFIER_BUDGET}",
                c.program
            );
        }
    }
}
