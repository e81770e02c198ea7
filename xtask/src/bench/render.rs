//! The kernel bench's JSON document as tables: the terminal's and the
//! benchmarks page's (docs/benchmarks.md) come from the same rendering, so a
//! committed document and the page cannot disagree.

use anyhow::{Context as _, Result};
use serde_json::Value;

use crate::table::{Table, thousands};

/// The maps the memory table shows one by one; the others are summed.
const BIG_MAPS: &[&str] = &["QPS", "QP_STATS"];
/// Those the probe's room table shows one by one: the ones sized by it.
const PROBE_MAPS: &[&str] = &["QPS", "QP_STATS", "QKEYS", "CREATIONS"];

/// The line that says where and how the figures were measured.
pub fn header(doc: &Value) -> Result<String> {
    let machine = &doc["machine"];
    let per_path = &doc["per_path"];
    Ok(format!(
        "`cargo xtask bench` on Linux {}, {} ({} CPUs); \
         BPF_PROG_TEST_RUN, {} repetitions per run (ns from the thread's CPU time), \
         median of {} interleaved runs",
        text(machine, "kernel")?,
        text(machine, "cpu")?,
        int(machine, "cpus")?,
        thousands(int(per_path, "repeat")?),
        int(per_path, "rounds")?,
    ))
}

/// Every table of the document, in the page's order.
pub fn tables(doc: &Value) -> Result<Vec<Table>> {
    Ok(vec![
        per_path(&doc["per_path"])?,
        sweep(&doc["sweep"])?,
        memory(
            &doc["memory"],
            ("QPs", "qps"),
            BIG_MAPS,
            "Kernel memory of the maps, MiB (fdinfo memlock)",
        )?,
        memory(
            &doc["probe_memory"],
            ("probe's room", "probed"),
            PROBE_MAPS,
            "Kernel memory of the maps as an attachment sizes them, one QP in the policy, \
             none bound, MiB (fdinfo memlock): no RDMA device (the least QP table, 65,536 \
             QPNs; the probe's room, 65,536 QPs), a tenant's own rdma_rxe device (every QPN \
             it hands out, 2^20 + 1; 16,384 QPs, each tenant's port) and an rdma_rxe device \
             (every QPN it hands out; its max_qp, 1,048,560 QPs)",
        )?,
        verifier(&doc["verifier"])?,
        attach(&doc["attach"])?,
        load(&doc["load"])?,
        partitions(&doc["partitions"])?,
        stamping(&doc["stamping"])?,
        switch(&doc["switch"])?,
        binding(&doc["binding"])?,
        live(&doc["live"], "shared")?,
        live(&doc["live"], "isolated")?,
        goals(doc)?,
    ])
}

/// The benchmarks page's figures: the header line and every table.
pub fn markdown(doc: &Value) -> Result<String> {
    let mut out = header(doc)?;
    for table in tables(doc)? {
        out += "\n\n";
        out += &table.markdown();
    }
    Ok(out)
}

/// Every path: pkeyfw's ns, its cost above the empty program beside the
/// minimal check's, their ratio, and the verdict (the minimal check's too
/// where it differs: it checks less).
fn per_path(v: &Value) -> Result<Table> {
    let empty = median(
        list(v, "paths")?
            .iter()
            .map(|p| num(p, "empty_ns"))
            .collect::<Result<_>>()?,
    );
    Ok(Table {
        title: format!(
            "Per-packet cost, {} QPs (unknown_qp = \"{}\"); the empty program: {empty:.1} ns",
            thousands(int(v, "qps")?),
            text(v, "unknown_qp")?
        ),
        columns: columns(&[
            "path",
            "pkeyfw ns",
            "above empty",
            "minimal check above empty",
            "pkeyfw/minimal",
            "verdict",
        ]),
        rows: each(v, "paths", |p| {
            let (above, minimal) = added_costs(p)?;
            let pass = flag(p, "pass")?;
            let minimal_pass = flag(p, "minimal_pass")?;
            let mut verdict = verdict_name(pass).to_string();
            if minimal_pass != pass {
                verdict += &format!(" (minimal: {})", verdict_name(minimal_pass));
            }
            Ok(vec![
                text(p, "path")?.to_string(),
                format!("{:.1}", num(p, "ns")?),
                format!("{above:.1}"),
                format!("{minimal:.1}"),
                ratio(above, minimal),
                verdict,
            ])
        })?,
    })
}

/// A path's cost above the empty program: pkeyfw's and the minimal check's
/// (the medians of each round's difference).
fn added_costs(p: &Value) -> Result<(f64, f64)> {
    Ok((num(p, "added_ns")?, num(p, "minimal_added_ns")?))
}

/// pkeyfw's added cost over the minimal check's; none where the minimal
/// check costs no more than the empty program (a frame it passes at once).
fn ratio(above: f64, minimal: f64) -> String {
    if minimal > 0.0 {
        format!("{:.1}x", above / minimal)
    } else {
        "-".to_string()
    }
}

fn verdict_name(pass: bool) -> &'static str {
    if pass { "pass" } else { "drop" }
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// Filter ns per path at every table size, and the spread across sizes.
fn sweep(v: &Value) -> Result<Table> {
    let mut cols = vec!["path".to_string()];
    for qps in list(v, "qps")? {
        cols.push(thousands(qps.as_u64().context("a QP count")?));
    }
    cols.push("spread".to_string());
    let row = |name: &str, ns: Vec<f64>| {
        let mut row = vec![name.to_string()];
        row.extend(ns.iter().map(|v| format!("{v:.0}")));
        row.push(format!("{:.1}%", spread(&ns)));
        row
    };
    let mut rows = each(v, "paths", |p| Ok(row(text(p, "path")?, nums(p, "ns")?)))?;
    rows.push(row("(empty program)", nums(v, "empty_ns")?));
    Ok(Table {
        title: "Filter ns/packet by QPs in the table (spread: max/min - 1)".to_string(),
        columns: cols,
        rows,
    })
}

/// max/min - 1, in percent.
fn spread(values: &[f64]) -> f64 {
    let max = values.iter().copied().fold(f64::MIN, f64::max);
    let min = values.iter().copied().fold(f64::MAX, f64::min);
    (max / min - 1.0) * 100.0
}

/// The big maps, then the rest together.
/// One row per entry of `v`, named by its `key` field (`column` the
/// table calls it): the bytes of each of `maps`, of the others together,
/// and the total.
fn memory(v: &Value, (column, key): (&str, &str), maps: &[&str], title: &str) -> Result<Table> {
    let mut cols = vec![column];
    cols.extend(maps);
    cols.extend(["other maps", "total"]);
    let rows = v
        .as_array()
        .with_context(|| format!("{title}: not a list"))?
        .iter()
        .map(|size| {
            let bytes = size["bytes"].as_object().context("memory: no bytes")?;
            let of = |map: &str| bytes.get(map).and_then(Value::as_u64);
            let total: u64 = bytes.values().filter_map(Value::as_u64).sum();
            let mut row = vec![thousands(int(size, key)?)];
            let mut shown = 0;
            for &map in maps {
                let b = of(map).with_context(|| format!("no memory figure for map {map}"))?;
                shown += b;
                row.push(mib(b));
            }
            row.push(mib(total - shown));
            row.push(mib(total));
            Ok(row)
        })
        .collect::<Result<_>>()?;
    Ok(Table {
        title: title.to_string(),
        columns: columns(&cols),
        rows,
    })
}

fn load(v: &Value) -> Result<Table> {
    let rows = v
        .as_array()
        .context("load: not a list")?
        .iter()
        .map(|r| {
            let (qps, apply) = (int(r, "qps")?, num(r, "apply_s")?);
            Ok(vec![
                thousands(qps),
                duration(num(r, "load_s")?),
                duration(apply),
                format!("{:.1} µs", apply * 1e6 / qps as f64),
            ])
        })
        .collect::<Result<_>>()?;
    Ok(Table {
        title: "Wall-clock time to load a filter and apply a policy into it".to_string(),
        columns: columns(&["QPs", "load", "apply", "apply per QP"]),
        rows,
    })
}

/// Each program the kernel loads: its instructions, those the verifier
/// processed to accept it (within the budget), the load's wall clock.
fn verifier(v: &Value) -> Result<Table> {
    let rows = v["programs"]
        .as_array()
        .context("verifier: no programs")?
        .iter()
        .map(|p| {
            Ok(vec![
                format!(
                    "{} ({} port)",
                    p["program"].as_str().unwrap_or("?"),
                    p["role"].as_str().unwrap_or("?")
                ),
                thousands(int(p, "insns")?),
                p["verified"].as_u64().map_or("—".to_string(), thousands),
                format!("{:.1} ms", num(p, "load_ms")?),
            ])
        })
        .collect::<Result<_>>()?;
    Ok(Table {
        title: format!(
            "Each program: its instructions, those the verifier processed (the budget: {}), and its load",
            thousands(int(v, "budget")?)
        ),
        columns: columns(&["program", "instructions", "processed", "load"]),
        rows,
    })
}

/// A whole `pkeyfw attach --pin`, as an operator or a service starts one.
fn attach(v: &Value) -> Result<Table> {
    Ok(Table {
        title: format!(
            "`pkeyfw attach --pin` of a stamping host port with a [[bind]] rule on a veth, wall clock (median of {})",
            int(v, "runs")?
        ),
        columns: columns(&["attach", "ms"]),
        rows: vec![vec![
            "every program loaded, the policy applied, the links pinned".to_string(),
            format!("{:.0}", num(v, "median_ms")?),
        ]],
    })
}

fn binding(v: &Value) -> Result<Table> {
    let rows = v["rows"]
        .as_array()
        .context("binding: no rows")?
        .iter()
        .map(|r| {
            Ok(vec![
                thousands(int(r, "bound")?),
                thousands(num(r, "binds_per_s")? as u64),
                thousands(num(r, "releases_per_s")? as u64),
                format!("{:.1} ms", num(r, "reload_ms")?),
            ])
        })
        .collect::<Result<_>>()?;
    Ok(Table {
        title: format!(
            "Binding under churn: {} QPs created and destroyed among those bound, a reload half-way",
            thousands(int(v, "churn")?)
        ),
        columns: columns(&["QPs bound", "binds/s", "releases/s", "reload"]),
        rows,
    })
}

fn partitions(v: &Value) -> Result<Table> {
    Ok(Table {
        title: format!("Parsing partitions.conf (median of {})", int(v, "runs")?),
        columns: columns(&["partitions", "member GUIDs", "size", "parse"]),
        rows: vec![vec![
            thousands(int(v, "partitions")?),
            thousands(int(v, "guids")?),
            format!("{:.1} MiB", int(v, "bytes")? as f64 / f64::from(1 << 20)),
            duration(num(v, "parse_s")?),
        ]],
    })
}

fn stamping(v: &Value) -> Result<Table> {
    let small = int(v, "small_payload")?;
    Ok(Table {
        title: format!(
            "P_Key stamping by payload, ns/frame (median of {} single runs; \
             the large/small ratio must stay within 1.2x)",
            int(v, "runs")?
        ),
        columns: columns(&[
            "path",
            "large payload",
            &format!("{small} B ns"),
            "large ns",
            &format!("large/{small} B"),
        ]),
        rows: each(v, "paths", |p| {
            let (small_ns, large_ns) = (num(p, "small_ns")?, num(p, "large_ns")?);
            Ok(vec![
                text(p, "path")?.to_string(),
                int(p, "large_payload")?.to_string(),
                format!("{small_ns:.0}"),
                format!("{large_ns:.0}"),
                format!("{:.2}x", large_ns / small_ns),
            ])
        })?,
    })
}

fn switch(v: &Value) -> Result<Table> {
    let empty = num(v, "empty_ns")?;
    Ok(Table {
        title: format!(
            "Switch port paths, ns/frame (median of {} single runs, {} B payload; \
             the empty XDP program: {empty:.0} ns)",
            int(v, "runs")?,
            int(v, "payload")?
        ),
        columns: columns(&["path", "ns", "vs empty XDP"]),
        rows: each(v, "paths", |p| {
            let ns = num(p, "ns")?;
            Ok(vec![
                text(p, "path")?.to_string(),
                format!("{ns:.0}"),
                format!("{:.1}x", ns / empty),
            ])
        })?,
    })
}

/// The live rows of one CPU arrangement (`cpus`), beside the empty
/// program's ns per frame, and what limits each.
fn live(v: &Value, cpus: &str) -> Result<Table> {
    let empty = live_row(v, "empty program", cpus)?;
    let empty_ns = num(empty, "ns")?;
    let arrangement = match cpus {
        "shared" => {
            "generator and receiver on one CPU (every figure includes the generator's share)"
        }
        _ => "the receiver on a CPU of its own (threaded NAPI)",
    };
    let rows = list(v, "rows")?
        .iter()
        .filter(|r| r["cpus"] == cpus)
        .map(|r| {
            let ns = num(r, "ns")?;
            Ok(vec![
                text(r, "name")?.to_string(),
                text(r, "attached")?.to_string(),
                format!("{:.2}", num(r, "mpps")?),
                format!("{ns:.0}"),
                format!("{:+.0}", ns - empty_ns),
                text(r, "limited_by")?.to_string(),
            ])
        })
        .collect::<Result<_>>()?;
    Ok(Table {
        title: format!(
            "Live frames, {arrangement}: generated in the kernel into a veth, received \
             on its peer (GRO on); delivered Mpps and wall-clock ns per frame; {} frames \
             per run, median of {}",
            thousands(int(v, "frames")?),
            int(v, "rounds")?
        ),
        columns: columns(&[
            "row",
            "on the receiving veth",
            "Mpps",
            "ns/frame",
            "ns above empty",
            "limited by",
        ]),
        rows,
    })
}

/// The goals of issue 45, and whether this run reached them: pkeyfw's
/// added cost against the minimal check's on the goal's paths, and the
/// live rates against nftables' with the receiver on a CPU of its own.
fn goals(doc: &Value) -> Result<Table> {
    let row = |goal: String, measured: String, reached: bool| {
        vec![
            goal,
            measured,
            if reached { "yes" } else { "no" }.to_string(),
        ]
    };
    let mut rows = Vec::new();
    for p in list(&doc["per_path"], "paths")?
        .iter()
        .filter(|p| p["goal"] == true)
    {
        let (above, minimal) = added_costs(p)?;
        rows.push(row(
            format!(
                "{}: pkeyfw's added cost ≤ 5× the minimal check's",
                text(p, "path")?
            ),
            format!("{above:.1} / {minimal:.1} ns = {:.1}×", above / minimal),
            above <= 5.0 * minimal,
        ));
    }
    let live = &doc["live"];
    let rate = |name: &str| -> Result<(f64, String)> {
        let r = live_row(live, name, "isolated")?;
        Ok((num(r, "mpps")?, text(r, "limited_by")?.to_string()))
    };
    let (drop, drop_limit) = rate("pkeyfw: refused (pkey_violation)")?;
    let (nft, nft_limit) = rate("nftables: refused")?;
    rows.push(row(
        "own CPU: pkeyfw's drop rate ≥ 3× nftables'".to_string(),
        format!(
            "{:.2}× (limited by: {drop_limit}; nftables: {nft_limit})",
            drop / nft
        ),
        drop >= 3.0 * nft,
    ));
    let (pass, pass_limit) = rate("pkeyfw: pass (ok RC)")?;
    let (nft_pass, nft_pass_limit) = rate("nftables: pass")?;
    rows.push(row(
        "own CPU: pkeyfw's pass rate > nftables'".to_string(),
        format!(
            "{pass:.2} / {nft_pass:.2} Mpps = {:.2}× (limited by: {pass_limit}; nftables: {nft_pass_limit})",
            pass / nft_pass
        ),
        pass > nft_pass,
    ));
    Ok(Table {
        title: "Goals".to_string(),
        columns: columns(&["goal", "measured", "reached"]),
        rows,
    })
}

/// The live row `name` in CPU arrangement `cpus`.
fn live_row<'a>(v: &'a Value, name: &str, cpus: &str) -> Result<&'a Value> {
    list(v, "rows")?
        .iter()
        .find(|r| r["name"] == name && r["cpus"] == cpus)
        .with_context(|| format!("no live row {name:?} ({cpus} CPUs)"))
}

fn columns(names: &[&str]) -> Vec<String> {
    names.iter().map(|n| n.to_string()).collect()
}

fn list<'a>(v: &'a Value, key: &str) -> Result<&'a Vec<Value>> {
    v[key].as_array().with_context(|| format!("no list {key}"))
}

/// A row for each element of list `key`.
fn each(
    v: &Value,
    key: &str,
    row: impl Fn(&Value) -> Result<Vec<String>>,
) -> Result<Vec<Vec<String>>> {
    list(v, key)?.iter().map(row).collect()
}

fn num(v: &Value, key: &str) -> Result<f64> {
    v[key].as_f64().with_context(|| format!("no number {key}"))
}

fn nums(v: &Value, key: &str) -> Result<Vec<f64>> {
    list(v, key)?
        .iter()
        .map(|n| n.as_f64().with_context(|| format!("{key}: not a number")))
        .collect()
}

fn flag(v: &Value, key: &str) -> Result<bool> {
    v[key]
        .as_bool()
        .with_context(|| format!("no boolean {key}"))
}

fn int(v: &Value, key: &str) -> Result<u64> {
    v[key].as_u64().with_context(|| format!("no integer {key}"))
}

fn text<'a>(v: &'a Value, key: &str) -> Result<&'a str> {
    v[key].as_str().with_context(|| format!("no string {key}"))
}

fn mib(bytes: u64) -> String {
    format!("{:.1}", bytes as f64 / f64::from(1 << 20))
}

fn duration(seconds: f64) -> String {
    match seconds {
        s if s < 1e-3 => format!("{:.0} µs", s * 1e6),
        s if s < 1.0 => format!("{:.0} ms", s * 1e3),
        s => format!("{s:.2} s"),
    }
}
