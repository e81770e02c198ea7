//! What the running kernel offers the programs, probed as libbpf and
//! bpftool do: a two-instruction program that calls a helper loads or is
//! refused by name. Each answer picks the form of a program the kernel can
//! run (`Setup`) or says in one line what pkeyfw will not do there, rather
//! than letting a load fail with a bare errno.

use std::sync::OnceLock;

use aya::{
    programs::ProgramType,
    sys::{BpfHelper, is_helper_supported},
};

/// The kernel's BPF features pkeyfw adapts to.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Features {
    /// Multi-buffer XDP (`xdp.frags`) and its helpers: Linux 5.18.
    pub xdp_frags: bool,
    /// `bpf_ktime_get_coarse_ns`: Linux 5.11.
    pub coarse_clock: bool,
}

impl Features {
    /// The running kernel's, probed once per process (a few loads of a
    /// two-instruction program).
    pub fn probe() -> Features {
        static PROBED: OnceLock<Features> = OnceLock::new();
        *PROBED.get_or_init(|| Features {
            xdp_frags: helper(ProgramType::Xdp, BpfHelper::BPF_FUNC_xdp_get_buff_len),
            coarse_clock: helper(ProgramType::Xdp, BpfHelper::BPF_FUNC_ktime_get_coarse_ns),
        })
    }
}

impl Features {
    /// Each feature as a line: what it is, whether the kernel has it, and
    /// what pkeyfw does without it.
    pub fn lines(&self) -> Vec<(&'static str, bool, &'static str)> {
        vec![
            (
                "multi-buffer XDP (Linux 5.18)",
                self.xdp_frags,
                "XDP judges frames up to the page-sized MTU native XDP allows without fragments; larger MTUs need --mode skb",
            ),
            (
                "the coarse clock (Linux 5.11)",
                self.coarse_clock,
                "the event budget reads the precise clock, a few ns more per refused frame",
            ),
        ]
    }
}

/// Whether programs of `kind` may call `helper`; a probe that cannot run
/// (no privilege) counts as no, so that the program loaded is one every
/// kernel takes.
fn helper(kind: ProgramType, helper: BpfHelper) -> bool {
    is_helper_supported(kind, helper).unwrap_or(false)
}
