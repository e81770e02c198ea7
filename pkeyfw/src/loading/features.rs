//! What the running kernel offers the programs, probed as libbpf and
//! bpftool do (a two-instruction program that calls a helper loads or is
//! refused by name), or read where the kernel says it (its version, its
//! modules' BTF). Each answer picks the form of a program the kernel can
//! run (`Setup`) or says in one line what pkeyfw will not do there, rather
//! than letting a load fail with a bare errno.

use std::{path::Path, sync::OnceLock};

use aya::{
    programs::ProgramType,
    sys::{BpfHelper, is_helper_supported},
    util::KernelVersion,
};

/// The kernel's features pkeyfw adapts to.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Features {
    /// Multi-buffer XDP (`xdp.frags`) and its helpers: Linux 5.18.
    pub xdp_frags: bool,
    /// `bpf_ktime_get_coarse_ns`: Linux 5.11.
    pub coarse_clock: bool,
    /// tcx, TC programs attached by BPF links: Linux 6.6.
    pub tcx: bool,
    /// The RDMA-core probes: kprobes whose maps allocate as they go,
    /// which Linux takes from kprobes since 6.1 (its BPF memory allocator).
    pub rdma_probes: bool,
    /// Reading kernel memory from a TC program (`bpf_probe_read_kernel`),
    /// which the stamper does to learn which rdma_rxe QP sent a frame.
    pub tc_reads_kernel: bool,
}

impl Features {
    /// The running kernel's, probed once per process.
    pub fn probe() -> Features {
        static PROBED: OnceLock<Features> = OnceLock::new();
        *PROBED.get_or_init(|| {
            let at_least = |major, minor| {
                KernelVersion::current().is_ok_and(|v| v >= KernelVersion::new(major, minor, 0))
            };
            Features {
                xdp_frags: helper(ProgramType::Xdp, BpfHelper::BPF_FUNC_xdp_get_buff_len),
                coarse_clock: helper(ProgramType::Xdp, BpfHelper::BPF_FUNC_ktime_get_coarse_ns),
                tcx: at_least(6, 6),
                rdma_probes: at_least(6, 1),
                tc_reads_kernel: helper(
                    ProgramType::SchedClassifier,
                    BpfHelper::BPF_FUNC_probe_read_kernel,
                ),
            }
        })
    }

    /// Each feature as a line: what it is, whether the kernel has it, and
    /// what pkeyfw does without it.
    pub fn lines(&self) -> Vec<(&'static str, bool, &'static str)> {
        vec![
            (
                "multi-buffer XDP (Linux 5.18)",
                self.xdp_frags,
                "native XDP only on interfaces whose MTU fits a page; --mode auto falls back to the TC ingress program on the others",
            ),
            (
                "the coarse clock (Linux 5.11)",
                self.coarse_clock,
                "the event budget reads the precise clock",
            ),
            (
                "tcx links (Linux 6.6)",
                self.tcx,
                "the TC programs attach as clsact filters",
            ),
            (
                "RDMA-core probes (Linux 6.1)",
                self.rdma_probes,
                "no QP is bound at its creation, Q_Keys are not captured, joins go unreported: a foreground attach finds new QPs by polling RDMA netlink",
            ),
            (
                "kernel reads from TC programs",
                self.tc_reads_kernel,
                "no frame is known for a QP's: stamping gives every frame the default P_Key",
            ),
            (
                "rdma_rxe's BTF (CONFIG_DEBUG_INFO_BTF_MODULES)",
                rxe_btf(),
                "stamping cannot tell rdma_rxe's QPs apart: every frame leaves with the default P_Key",
            ),
        ]
    }
}

/// Whether the kernel describes rdma_rxe's structures (module BTF, Linux
/// 5.11 with CONFIG_DEBUG_INFO_BTF_MODULES), where the module is loaded.
fn rxe_btf() -> bool {
    Path::new("/sys/kernel/btf/rdma_rxe").exists()
}

/// Whether programs of `kind` may call `helper`; a probe that cannot run
/// (no privilege) counts as no, so that the program loaded is one every
/// kernel takes.
fn helper(kind: ProgramType, helper: BpfHelper) -> bool {
    is_helper_supported(kind, helper).unwrap_or(false)
}
