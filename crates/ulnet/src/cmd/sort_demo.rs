//! The sort step of `ulnet demo`: a small distributed sort across local processes,
//! validated with valsort's rules.

use anyhow::{bail, Context, Result};
use std::process::{Command, Stdio};
use ulnet_sortbench::{write_records, RecordFormat, Summary};

/// Records the demo sorts: 200,000 (20 MB), skewed keys, so the sampled partitioning has
/// something to balance; a second or so on a laptop.
const DEMO_RECORDS: u64 = 200_000;

/// Generates skewed records, sorts them on `nodes` local processes and validates the
/// output (order, count, checksum equal to the input's). Fails when anything is wrong.
pub fn run(nodes: usize) -> Result<()> {
    let dir = std::env::temp_dir().join(format!("ulnet-demo-sort-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let result = sort_in(&dir, nodes);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn sort_in(dir: &std::path::Path, nodes: usize) -> Result<()> {
    let input = dir.join("input.dat");
    let output = dir.join("sorted.dat");
    let format = RecordFormat { ascii: false, skewed: true };
    let mut f = std::io::BufWriter::new(std::fs::File::create(&input)?);
    let input_sum = write_records(&mut f, 0, DEMO_RECORDS, format, true)?.context("a checksum was asked for")?;
    std::io::Write::flush(&mut f)?;
    drop(f);
    eprintln!("ulnet demo: sorting {DEMO_RECORDS} skewed gensort records on {nodes} local processes (River over shared memory)");
    let out = Command::new(std::env::current_exe()?)
        .args(["sort", "--input"])
        .arg(&input)
        .arg("--output")
        .arg(&output)
        .args(["--nodes", &nodes.to_string(), "--verify", "--json"])
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()?;
    if !out.status.success() {
        bail!("the demo sort failed ({})", out.status);
    }
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).context("the sort's JSON report")?;
    let summary = Summary::of_records(&std::fs::read(&output)?).map_err(|e| anyhow::anyhow!("valsort: {e}"))?;
    let ok = summary.is_sorted() && summary.records == u128::from(DEMO_RECORDS) && summary.checksum == input_sum;
    println!(
        "sort: {} records on {} nodes in {:.3} s (startup {:.3}, read+distribute {:.3}, sort {:.3}, write {:.3}); largest partition {:.2} x mean",
        report["records"],
        report["nodes"],
        report["total_s"].as_f64().unwrap_or(0.0),
        report["startup_s"].as_f64().unwrap_or(0.0),
        report["read_distribute_s"].as_f64().unwrap_or(0.0),
        report["sort_s"].as_f64().unwrap_or(0.0),
        report["write_s"].as_f64().unwrap_or(0.0),
        report["imbalance"].as_f64().unwrap_or(0.0),
    );
    println!(
        "valsort: {} records, checksum {} (input {}), {}",
        summary.records,
        summary.checksum,
        input_sum,
        if ok { "SUCCESS - all records are in order" } else { "FAILED" }
    );
    if !ok {
        bail!("the demo sort's output does not validate");
    }
    Ok(())
}
