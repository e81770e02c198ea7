//! Project tasks: `cargo xtask setup | build | package | lab | rxe-lab |
//! cni-lab | test | bench | bench-readme`.
//!
//! xtask must build with whatever stable toolchain the machine has: it is what
//! installs the pinned ones.

mod bench;
mod cmd;
mod cni_lab;
mod guest;
mod kernels;
mod package;
mod results;
mod rxe_lab;
mod setup;
mod table;
mod test;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(about = "pkeyfw project tasks")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install the pinned toolchains and bpf-linker if missing (idempotent).
    Setup,
    /// Set up, then build target/release/pkeyfw with the XDP object embedded.
    Build,
    /// Set up, then build the Debian package target/debian/pkeyfw_VERSION_ARCH.deb
    /// (the production build, its unit, man pages, completions, example
    /// policies).
    Package {
        /// Then check it as `cargo xtask test` does: lintian, its contents,
        /// `dpkg -i` into a throwaway root (needs root).
        #[arg(long)]
        check: bool,
    },
    /// Set up, build, then run the RoCE partition lab (`pkeyfw lab`, root).
    Lab,
    /// Set up, build, then run real ibverbs programs over soft-RoCE (rdma_rxe)
    /// in a qemu guest with pkeyfw enforcing (root; builds the guest once).
    RxeLab {
        /// Passed on to `pkeyfw lab rxe`, e.g. `--only udaddy`; `--only
        /// systemd` runs the scenario of the package's unit under systemd
        /// alone (run after the lab's otherwise).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Set up, build, then run pkeyfw as a CNI plugin in the guest: pods as
    /// namespaces and as podman containers on Linux 7.3, refusals on 6.12
    /// (root; builds its guest once).
    CniLab,
    /// Boot the soft-RoCE guest to run one shell script, with the release
    /// `pkeyfw` beside it in /share (for exploring; root).
    #[command(hide = true)]
    Guest {
        script: std::path::PathBuf,
        /// The guest's Linux: 5.10, 6.1, 6.12 or 7.3.
        #[arg(long, default_value = "6.1")]
        kernel: String,
        /// The CNI lab's guest (CNI plugins, podman).
        #[arg(long)]
        containers: bool,
    },
    /// Set up, then run every test of the project (needs root).
    Test,
    /// Set up, then benchmark the XDP program in the kernel (needs root).
    Bench {
        /// Also write every figure of the kernel bench to FILE, as JSON.
        #[arg(long, value_name = "FILE")]
        json: Option<std::path::PathBuf>,
    },
    /// Rewrite the figures in docs/benchmarks.md from docs/bench.json.
    BenchReadme,
    /// Set up, build, then run the kernel matrix in the guest: on each
    /// kernel (5.10, 6.1, 6.12, 7.3, or those named) what it offers and
    /// what each program costs it, the README's lab and the soft-RoCE
    /// scenarios that define the product (root).
    Kernels {
        /// Only these kernels.
        names: Vec<String>,
        /// Also write what each kernel offered and cost to FILE, as JSON
        /// (docs/kernels.json, which docs/kernels.md renders).
        #[arg(long, value_name = "FILE")]
        json: Option<std::path::PathBuf>,
    },
}

fn main() -> std::process::ExitCode {
    let result = match Cli::parse().task {
        Task::Setup => setup::run(),
        Task::Build => setup::run().and_then(|()| build()),
        Task::Package { check } => setup::run()
            .and_then(|()| package::run())
            .and_then(|p| {
                if check {
                    package::check::run(&p)
                } else {
                    Ok((0, 0))
                }
            })
            .and_then(|(_, failed)| match failed {
                0 => Ok(()),
                n => anyhow::bail!("{n} package checks failed"),
            }),
        Task::Lab => setup::run().and_then(|()| build()).and_then(|()| lab()),
        Task::RxeLab { args } => setup::run()
            .and_then(|()| build())
            .and_then(|()| rxe_lab::run(&args))
            .and_then(results::Outcome::ok),
        Task::CniLab => setup::run()
            .and_then(|()| build())
            .and_then(|()| cni_lab::run())
            .and_then(results::Outcome::ok),
        Task::Guest {
            script,
            kernel,
            containers,
        } => setup::run().and_then(|()| build()).and_then(|()| {
            let kernel = guest::Kernel::named(&kernel)?;
            let guest = match containers {
                true => cni_lab::guest(kernel)?,
                false => guest::Guest::ensure(kernel)?,
            };
            rxe_lab::explore(&script, &guest)
        }),
        Task::Test => setup::run().and_then(|()| test::run()),
        Task::Bench { json } => setup::run().and_then(|()| bench::run(json.as_deref())),
        Task::BenchReadme => bench::page(),
        Task::Kernels { names, json } => setup::run().and_then(|()| kernels::task(&names, json)),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Runs the lab with the release CLI.
fn lab() -> Result<()> {
    let pkeyfw = cmd::root().join("target/release/pkeyfw");
    cmd::run(std::process::Command::new(pkeyfw).arg("lab"))
}

/// Builds the release CLI.
fn build() -> Result<()> {
    cmd::cargo(&["build", "--release", "--package", "pkeyfw"])
}
