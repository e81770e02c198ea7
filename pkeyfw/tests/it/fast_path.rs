//! The goal paths make no call (issue 45 §3). Read from the XDP program a
//! host port loads, as the kernel runs it (its instructions after the
//! verifier's fixups, which inline what they can), every call its own body
//! makes: the map lookups, the per-CPU counters, the CPU's number and the
//! jiffy count are all inline; what is left is the multicast groups' hash
//! lookup, the clock an event budget reads once its ticks have moved on,
//! and the stages: locate (a frame that is not plain), restore (a stamped
//! frame that passes), report (a refused frame within its CPU's event
//! budget), and a CM request's to QP1 (REQ, SIDR_REQ), which its listener
//! decides: listener, listening, request, and its refusal's count and
//! report. So a plain frame that passes unstamped or is refused past the
//! budget — ok RC, ok UD and pkey_violation, as the bench times them —
//! calls nothing. (On Linux 6.10 and later, which inline a per-CPU
//! array's lookup and the CPU's number; before, those are calls too.)

use crate::common;

use std::{
    collections::{BTreeMap, BTreeSet},
    os::fd::{AsFd as _, AsRawFd as _},
};

use aya::{maps::MapInfo, programs::ProgramInfo};
use aya_obj::generated::{bpf_cmd, bpf_func_info, bpf_prog_info};
use pkeyfw::loading::filter::Filter;
use pkeyfw_common::abi::MIN_QPNS;

#[test]
fn the_host_programs_body_calls_only_off_the_goal_paths() {
    common::require_root();
    let filter = Filter::load(MIN_QPNS).unwrap();
    let id = filter.program_id().unwrap();
    let program = aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .find(|p| p.id() == id)
        .expect("the filter's program among the loaded ones");
    let symbols = kallsyms();
    let (insns, funcs) = translated(&program, &symbols);
    // The program's own body: up to its first subprogram.
    let body = funcs.get(1).map_or(insns.len(), |f| f.first as usize);
    let mut kernel = BTreeSet::new();
    let mut stages = BTreeSet::new();
    for (i, insn) in insns[..body].iter().enumerate() {
        let Some(call) = Call::of(insn) else {
            continue;
        };
        match call {
            Call::Subprogram(n) => {
                let name = funcs
                    .get(n as usize)
                    .map_or(format!("function {n}"), |f| f.name.clone());
                stages.insert(name);
            }
            Call::Kernel(imm) => {
                let name = symbols
                    .name(imm)
                    .unwrap_or_else(|| format!("unknown function (imm {imm})"));
                // A lookup's map is the one loaded into r1 last.
                let map = map_in_r1(&insns[..i])
                    .filter(|_| name.contains("lookup"))
                    .and_then(|id| MapInfo::from_id(id).ok())
                    .and_then(|m| m.name_as_str().map(str::to_string));
                kernel.insert(match map {
                    Some(map) => format!("{name} ({map})"),
                    None => name,
                });
            }
        }
    }
    eprintln!("the body calls {kernel:?} and the stages {stages:?}");
    let mut expected: BTreeSet<String> =
        ["__htab_map_lookup_elem (GROUPS)", "bpf_ktime_get_coarse_ns"]
            .map(String::from)
            .into();
    if kernel_below(6, 10) {
        expected.extend(
            [
                "bpf_get_smp_processor_id",
                "percpu_array_map_lookup_elem (REASONS)",
                "percpu_array_map_lookup_elem (EVENT_BUDGET)",
            ]
            .map(String::from),
        );
    }
    assert_eq!(kernel, expected, "the kernel functions the body calls");
    assert_eq!(
        stages,
        [
            "pkeyfw_locate_xdp",
            "pkeyfw_report_xdp",
            "pkeyfw_restore_xdp",
            // A CM request QP1 takes only.
            "pkeyfw_listener_xdp",
            "pkeyfw_listening",
            "pkeyfw_request_xdp",
            "pkeyfw_refused_xdp",
        ]
        .map(String::from)
        .into(),
        "the stages the body calls"
    );
}

/// A function of a program: its first instruction and its name.
struct Function {
    first: u32,
    name: String,
}

/// Whether the running kernel is older than `major.minor`.
fn kernel_below(major: u32, minor: u32) -> bool {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let mut numbers = release
        .split(['.', '-'])
        .map(|n| n.trim().parse::<u32>().unwrap_or(0));
    let (a, b) = (numbers.next().unwrap_or(0), numbers.next().unwrap_or(0));
    (a, b) < (major, minor)
}

/// The program's translated instructions and its functions, as
/// `BPF_OBJ_GET_INFO_BY_FD` gives them (each function's name from the
/// kernel's symbol for its JIT image, `bpf_prog_TAG_NAME`).
fn translated(program: &ProgramInfo, symbols: &Symbols) -> (Vec<[u8; 8]>, Vec<Function>) {
    let fd = program.fd().unwrap();
    // SAFETY: a zeroed info, filled in by the kernel.
    let mut info: bpf_prog_info = unsafe { std::mem::zeroed() };
    info_by_fd(fd.as_fd().as_raw_fd(), &mut info);
    let mut insns = vec![[0u8; 8]; info.xlated_prog_len as usize / 8];
    let empty = bpf_func_info {
        insn_off: 0,
        type_id: 0,
    };
    let mut funcs = vec![empty; info.nr_func_info as usize];
    let mut ksyms = vec![0u64; info.nr_jited_ksyms as usize];
    assert_eq!(info.func_info_rec_size as usize, size_of::<bpf_func_info>());
    assert_eq!(funcs.len(), ksyms.len(), "a JIT image per function");
    // SAFETY: as above.
    let mut asked: bpf_prog_info = unsafe { std::mem::zeroed() };
    asked.xlated_prog_len = info.xlated_prog_len;
    asked.xlated_prog_insns = insns.as_mut_ptr() as u64;
    asked.nr_func_info = info.nr_func_info;
    asked.func_info_rec_size = info.func_info_rec_size;
    asked.func_info = funcs.as_mut_ptr() as u64;
    asked.nr_jited_ksyms = info.nr_jited_ksyms;
    asked.jited_ksyms = ksyms.as_mut_ptr() as u64;
    info_by_fd(fd.as_fd().as_raw_fd(), &mut asked);
    assert!(
        insns.iter().any(|i| i != &[0; 8]),
        "the kernel gave no instructions"
    );
    let functions = funcs
        .iter()
        .zip(&ksyms)
        .map(|(f, &at)| Function {
            first: f.insn_off,
            // bpf_prog_, a 16-digit tag, _, the name.
            name: symbols
                .by_address
                .get(&at)
                .and_then(|s| s.get("bpf_prog_".len() + 17..))
                .unwrap_or("?")
                .to_string(),
        })
        .collect();
    (insns, functions)
}

fn info_by_fd(fd: i32, info: &mut bpf_prog_info) {
    #[repr(C)]
    struct Attr {
        fd: u32,
        len: u32,
        info: u64,
    }
    let attr = Attr {
        fd: fd as u32,
        len: size_of::<bpf_prog_info>() as u32,
        info: info as *mut bpf_prog_info as u64,
    };
    // SAFETY: `attr` as BPF_OBJ_GET_INFO_BY_FD reads it, pointing at `info`
    // and the buffers it names, all live over the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            bpf_cmd::BPF_OBJ_GET_INFO_BY_FD as i64,
            &attr as *const Attr,
            size_of::<Attr>(),
        )
    };
    assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
}

/// A call instruction (`BPF_JMP | BPF_CALL`).
enum Call {
    /// To a function of the program (`BPF_PSEUDO_CALL`): its index, as
    /// the JIT leaves it.
    Subprogram(i32),
    /// To a kernel function: its address less `__bpf_call_base`.
    Kernel(i32),
}

impl Call {
    fn of(insn: &[u8; 8]) -> Option<Call> {
        const BPF_JMP_CALL: u8 = 0x85;
        const PSEUDO_CALL: u8 = 1;
        if insn[0] != BPF_JMP_CALL {
            return None;
        }
        let imm = i32::from_le_bytes([insn[4], insn[5], insn[6], insn[7]]);
        Some(match insn[1] >> 4 {
            PSEUDO_CALL => Call::Subprogram(imm),
            _ => Call::Kernel(imm),
        })
    }
}

/// The id of the map last loaded into r1 (`r1 = map[id:N]`, a 16-byte
/// load of a map that the dump gives by id) before the end of `insns`.
fn map_in_r1(insns: &[[u8; 8]]) -> Option<u32> {
    const LD_IMM64: u8 = 0x18;
    const PSEUDO_MAP_FD: u8 = 1;
    insns.windows(2).rev().find_map(|pair| {
        let insn = pair[0];
        (insn[0] == LD_IMM64 && insn[1] & 0x0f == 1 && insn[1] >> 4 == PSEUDO_MAP_FD)
            .then(|| u32::from_le_bytes([insn[4], insn[5], insn[6], insn[7]]))
    })
}

/// The kernel's symbols by address.
struct Symbols {
    base: u64,
    by_address: BTreeMap<u64, String>,
}

impl Symbols {
    /// The function a call's immediate names.
    fn name(&self, imm: i32) -> Option<String> {
        let at = self.base.wrapping_add(imm as i64 as u64);
        self.by_address.get(&at).cloned()
    }
}

fn kallsyms() -> Symbols {
    let text = std::fs::read_to_string("/proc/kallsyms").unwrap();
    let mut by_address = BTreeMap::new();
    let mut base = None;
    for line in text.lines() {
        let mut words = line.split_whitespace();
        let (Some(addr), Some(_), Some(name)) = (words.next(), words.next(), words.next()) else {
            continue;
        };
        let addr = u64::from_str_radix(addr, 16).unwrap_or(0);
        if name == "__bpf_call_base" {
            base = Some(addr);
        }
        by_address.entry(addr).or_insert_with(|| name.to_string());
    }
    let base = base.expect("__bpf_call_base in /proc/kallsyms");
    assert_ne!(base, 0, "/proc/kallsyms hides addresses (kptr_restrict)");
    Symbols { base, by_address }
}
