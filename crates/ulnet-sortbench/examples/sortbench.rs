//! Runs gensort or valsort from the command line, as the `ulnet` tool does:
//! `cargo run --release --example sortbench -- gensort [-a] [-b N] [-s] [-c] NUM FILE`
//! or `... -- valsort [-o SUM] [-s] [-q] [-i] FILE`. Prints the elapsed time
//! and rate to standard output.

use std::time::Instant;

use clap::Parser;
use ulnet_sortbench::cli::{run_gensort, run_valsort, GensortArgs, ValsortArgs};

#[derive(Parser)]
enum Command {
    /// Generate records.
    Gensort(GensortArgs),
    /// Validate records or summaries.
    Valsort(ValsortArgs),
}

fn main() -> anyhow::Result<()> {
    let start = Instant::now();
    let (code, bytes) = match Command::parse() {
        Command::Gensort(a) => (run_gensort(&a)?, a.num_records.saturating_mul(100)),
        Command::Valsort(a) => (run_valsort(&a)?, std::fs::metadata(&a.file).map(|m| m.len()).unwrap_or(0)),
    };
    let secs = start.elapsed().as_secs_f64();
    println!("{:.3} s, {:.0} records/s, {:.0} MB/s", secs, bytes as f64 / 100.0 / secs, bytes as f64 / 1e6 / secs);
    std::process::exit(code);
}
