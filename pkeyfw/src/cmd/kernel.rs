//! `pkeyfw kernel`: what the running kernel lets pkeyfw do, and with
//! `--programs`, what loading each program costs it.

use anyhow::{Result, bail};

use crate::{
    attachment::cost,
    loading::{
        cost::{Cost, VERIFIER_BUDGET},
        features::Features,
    },
};

/// Show what this kernel lets pkeyfw do: the features each program form
/// needs, and with --programs, what loading every program costs the
/// kernel (its verifier's work, the time).
#[derive(clap::Args)]
pub struct KernelArgs {
    /// Also load (verify) every program, attaching none, and show its
    /// size, the instructions the verifier processed and the time it took
    /// (needs root).
    #[arg(long)]
    pub programs: bool,
    /// As JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: &KernelArgs) -> Result<()> {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|r| r.trim().to_string())
        .unwrap_or_default();
    let features = Features::probe();
    let costs = if args.programs {
        let mut costs = Vec::new();
        for (role, switch) in [("host", false), ("switch", true)] {
            costs.extend(cost::measure(switch)?.into_iter().map(|c| (role, c)));
        }
        costs
    } else {
        Vec::new()
    };
    if args.json {
        let programs: Vec<serde_json::Value> = costs
            .iter()
            .map(|(role, c)| {
                serde_json::json!({
                    "program": c.program,
                    "role": role,
                    "insns": c.insns,
                    "verified": c.verified,
                    "load_ms": c.load.as_secs_f64() * 1e3,
                })
            })
            .collect();
        let doc = serde_json::json!({
            "kernel": release,
            "features": features
                .lines()
                .iter()
                .map(|(what, ok, _)| (what.to_string(), serde_json::Value::from(*ok)))
                .collect::<serde_json::Map<_, _>>(),
            "programs": programs,
        });
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        println!("Linux {release}");
        for (what, ok, otherwise) in features.lines() {
            match ok {
                true => println!("  {what}: yes"),
                false => println!("  {what}: no ({otherwise})"),
            }
        }
        if !costs.is_empty() {
            println!();
            println!(
                "{:<24} {:<7} {:>12} {:>10} {:>9}",
                "program", "role", "instructions", "verified", "load"
            );
            for (role, c) in &costs {
                println!(
                    "{:<24} {:<7} {:>12} {:>10} {:>6.1} ms",
                    c.program,
                    role,
                    c.insns,
                    c.verified.map_or("-".to_string(), |v| v.to_string()),
                    c.load.as_secs_f64() * 1e3
                );
            }
        }
    }
    let over: Vec<&Cost> = costs
        .iter()
        .map(|(_, c)| c)
        .filter(|c| c.over_budget())
        .collect();
    if let Some(c) = over.first() {
        bail!(
            "{} made the verifier process {} instructions, over pkeyfw's budget of {VERIFIER_BUDGET}",
            c.program,
            c.verified.unwrap_or(0)
        );
    }
    Ok(())
}
