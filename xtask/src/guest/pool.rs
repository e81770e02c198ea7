//! Guest boots shared out among the host's CPUs. Under TCG a guest keeps
//! about one host CPU busy, so every lab's boots run two at a time, the
//! longest first, whichever lab each belongs to; each lab is judged once
//! its own boots are done.

use std::{
    cmp::Reverse,
    path::PathBuf,
    sync::{
        Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use anyhow::{Result, anyhow};

use super::{Guest, Init};
use crate::results::Outcome;

/// Guests booted at once: one per host CPU of the machines CI runs on.
pub const WORKERS: usize = 2;

/// One boot of a guest.
pub struct Boot {
    /// What its console lines are prefixed with.
    pub label: String,
    pub guest: Guest,
    pub share: PathBuf,
    pub init: Init,
    pub timeout: Duration,
    /// About how many minutes it takes on a 2-CPU machine beside another
    /// guest: the order boots start in.
    pub minutes: u32,
}

/// A lab: its boots, and what its test lines are once they are done,
/// given each boot's script's exit status (or why it has none).
pub struct Plan {
    pub boots: Vec<Boot>,
    pub judge: Box<dyn FnOnce(Vec<Result<i32>>) -> Outcome>,
}

impl Plan {
    /// A lab that could not be prepared (its guest not built, say): one
    /// failed test, `name`.
    pub fn failed(name: &str, why: anyhow::Error) -> Plan {
        let name = name.to_string();
        Plan {
            boots: Vec::new(),
            judge: Box::new(move |_| Outcome::failed(&name, &why)),
        }
    }
}

/// Runs every plan's boots, [`WORKERS`] at a time, then judges each plan in
/// order; what they came to together.
pub fn run(plans: Vec<Plan>) -> Outcome {
    let boots: Vec<&Boot> = plans.iter().flat_map(|p| &p.boots).collect();
    let mut codes = boot_all(&boots).into_iter();
    let mut total = Outcome::default();
    for plan in plans {
        let mine = codes.by_ref().take(plan.boots.len()).collect();
        total.add((plan.judge)(mine));
    }
    total
}

/// Each boot's exit status, in `boots`' order.
fn boot_all(boots: &[&Boot]) -> Vec<Result<i32>> {
    let mut order: Vec<usize> = (0..boots.len()).collect();
    order.sort_by_key(|&i| Reverse(boots[i].minutes));
    let next = AtomicUsize::new(0);
    let codes: Vec<Mutex<Option<Result<i32>>>> = boots.iter().map(|_| Mutex::new(None)).collect();
    std::thread::scope(|s| {
        for _ in 0..WORKERS.min(boots.len()) {
            s.spawn(|| {
                while let Some(&i) = order.get(next.fetch_add(1, Ordering::Relaxed)) {
                    let b = boots[i];
                    let code = b.guest.run(&b.share, b.timeout, b.init, &b.label);
                    *codes[i].lock().expect("not poisoned") = Some(code);
                }
            });
        }
    });
    codes
        .into_iter()
        .map(|c| {
            c.into_inner()
                .expect("not poisoned")
                .unwrap_or_else(|| Err(anyhow!("the guest was never booted")))
        })
        .collect()
}
