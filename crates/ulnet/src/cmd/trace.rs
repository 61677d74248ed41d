//! `ulnet trace`: studies of trace files (`analyze`) and heavy-tail tests of samples (`tail`).

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use std::path::PathBuf;
use ulnet_trace::{analyze, input, load, report, tail};

/// Arguments of `ulnet trace`.
#[derive(Args, Debug)]
pub struct TraceArgs {
    #[command(subcommand)]
    command: TraceCommand,
}

#[derive(Subcommand, Debug)]
enum TraceCommand {
    /// Traffic matrix, message sizes, rates, buffers per message and request-response
    /// stages of trace files (one per process, written with ULNET_TRACE or --trace).
    Analyze(AnalyzeArgs),
    /// Heavy-tail analysis of a numeric column (trace columns: size, interarrival_ns,
    /// handler_ns, buffers, rtt_ns; or a CSV/whitespace table, or one number per line).
    Tail(TailArgs),
}

#[derive(Args, Debug)]
struct AnalyzeArgs {
    /// Trace files (one per process; all nodes of a run together).
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// Print one JSON object on stdout.
    #[arg(long)]
    json: bool,
    /// Write the figures as SVG and PNG files into this directory.
    #[arg(long)]
    plots: Option<PathBuf>,
    /// Write a self-contained HTML report (tables and inline SVG figures).
    #[arg(long)]
    html: Option<PathBuf>,
    /// Width of the message-rate bins in milliseconds (default: about 50 bins).
    #[arg(long)]
    bin_ms: Option<f64>,
    /// Accept files cut short (a process killed before it stopped tracing): use their
    /// intact blocks and report the damage on stderr.
    #[arg(long)]
    partial: bool,
}

#[derive(Args, Debug)]
struct TailArgs {
    /// A trace file, a CSV or whitespace-separated table, or one number per line.
    file: PathBuf,
    /// The column: a name from the header line or a 1-based number (default: the first
    /// numeric column; `size` for trace files).
    #[arg(long)]
    column: Option<String>,
    /// Print one JSON object on stdout.
    #[arg(long)]
    json: bool,
    /// Write the figures (CCDF, Hill plot, QQ plot, time scales) as SVG and PNG here.
    #[arg(long)]
    plots: Option<PathBuf>,
    /// Write a self-contained HTML report.
    #[arg(long)]
    html: Option<PathBuf>,
    /// Seed of the Poisson process the arrivals are compared with.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Accept a trace file cut short: use its intact blocks (see `analyze --partial`).
    #[arg(long)]
    partial: bool,
}

pub fn run(args: TraceArgs) -> Result<i32> {
    match args.command {
        TraceCommand::Analyze(a) => run_analyze(a),
        TraceCommand::Tail(a) => run_tail(a),
    }
}

fn run_analyze(a: AnalyzeArgs) -> Result<i32> {
    let trace = load::load_with(&a.files, a.partial)?;
    let study = analyze::analyze(&trace, &analyze::AnalyzeConfig { bin_s: a.bin_ms.map(|ms| ms / 1e3) });
    if study.dropped > 0 {
        eprintln!(
            "ulnet trace: warning: {} records were dropped while tracing (full rings); figures miss them",
            study.dropped
        );
    }
    if let Some(dir) = &a.plots {
        let written = report::write_figures(&report::analysis_figures(&study), dir)?;
        eprintln!("ulnet trace: wrote {} figure files into {}", written.len(), dir.display());
    }
    if let Some(path) = &a.html {
        std::fs::write(path, report::analysis_html(&study)?).with_context(|| format!("writing {}", path.display()))?;
        eprintln!("ulnet trace: wrote {}", path.display());
    }
    if a.json {
        println!("{}", serde_json::to_string(&study)?);
    } else {
        print!("{}", study.render_text());
    }
    Ok(0)
}

fn run_tail(a: TailArgs) -> Result<i32> {
    let sample = input::read_sample_with(&a.file, a.column.as_deref(), a.partial)?;
    let r = tail::analyze_tail(&a.file.display().to_string(), &sample.column, &sample.values, sample.arrivals, a.seed);
    if let Some(dir) = &a.plots {
        let written = report::write_figures(&report::tail_figures(&r, &sample.values), dir)?;
        eprintln!("ulnet trace: wrote {} figure files into {}", written.len(), dir.display());
    }
    if let Some(path) = &a.html {
        std::fs::write(path, report::tail_html(&r, &sample.values)?)
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!("ulnet trace: wrote {}", path.display());
    }
    if a.json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        print!("{}", r.render_text());
    }
    Ok(0)
}
