//! `ulnet fsstudy`: the file-system usage study — content snapshots (`snapshot`), traces
//! of every operation on a directory through a FUSE pass-through (`trace`), and the study
//! of them (`report`).

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;
use ulnet_fsstudy::passthrough::{self, MountOptions};

/// Arguments of `ulnet fsstudy`.
#[derive(Args, Debug)]
pub struct FsstudyArgs {
    #[command(subcommand)]
    command: FsstudyCommand,
}

#[derive(Subcommand, Debug)]
enum FsstudyCommand {
    /// Walk a directory tree and record every file's size, type, times and depth.
    Snapshot(SnapshotArgs),
    /// Trace every file-system operation on a directory (a FUSE pass-through mounted
    /// over it) until interrupted, or while COMMAND runs inside it.
    Trace(TraceArgs),
    /// Study traces and snapshots: tables and figures laid out like the thesis's.
    Report(ReportArgs),
}

#[derive(Args, Debug)]
struct SnapshotArgs {
    /// The directory to walk.
    dir: PathBuf,
    /// The snapshot file to write.
    #[arg(long)]
    output: PathBuf,
    /// Print a JSON summary on stdout.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
struct TraceArgs {
    /// The directory to trace: the pass-through is mounted over it.
    #[arg(long)]
    mount: PathBuf,
    /// The trace file to write (outside the traced directory).
    #[arg(long)]
    output: PathBuf,
    /// Threads serving requests (default: the CPUs, at least 2).
    #[arg(long)]
    threads: Option<usize>,
    /// Let the kernel cache names and attributes this long: faster, but repeated lookups
    /// and stats are missing from the trace (default 0: every one is seen).
    #[arg(long, default_value_t = 0)]
    cache_ttl_ms: u64,
    /// Records the in-memory ring holds before it drops (and counts) them.
    #[arg(long)]
    ring: Option<usize>,
    /// Print a JSON summary on stdout.
    #[arg(long)]
    json: bool,
    /// A command to run with its working directory in the traced directory; tracing
    /// stops when it exits, and its exit status is ulnet's.
    #[arg(last = true)]
    command: Vec<OsString>,
}

#[derive(Args, Debug)]
struct ReportArgs {
    /// Trace and snapshot files.
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// Print the study as one JSON object on stdout.
    #[arg(long)]
    json: bool,
    /// Write the Markdown report and its SVG figures into this directory.
    #[arg(long)]
    out: Option<PathBuf>,
}

pub fn run(args: FsstudyArgs) -> Result<i32> {
    match args.command {
        FsstudyCommand::Snapshot(a) => run_snapshot(a),
        FsstudyCommand::Trace(a) => run_trace(a),
        FsstudyCommand::Report(a) => run_report(a),
    }
}

fn run_snapshot(a: SnapshotArgs) -> Result<i32> {
    let summary = ulnet_fsstudy::snapshot::take(&a.dir, &a.output)?;
    if a.json {
        println!("{}", serde_json::to_string(&summary)?);
    } else {
        eprintln!(
            "ulnet fsstudy: {} files and {} directories ({} bytes) of {} in {}; {} unreadable",
            summary.files,
            summary.dirs,
            summary.bytes,
            a.dir.display(),
            a.output.display(),
            summary.unreadable
        );
    }
    Ok(0)
}

fn mount_options(a: &TraceArgs) -> MountOptions {
    let mut options = MountOptions::default();
    if let Some(t) = a.threads {
        options.threads = t;
    }
    if let Some(r) = a.ring {
        options.ring_records = r;
    }
    options.fs.cache_ttl = Duration::from_millis(a.cache_ttl_ms);
    options
}

fn run_trace(a: TraceArgs) -> Result<i32> {
    passthrough::fuse_available().map_err(|why| anyhow::anyhow!("cannot trace: {why}"))?;
    let options = mount_options(&a);
    // Interrupts stop the trace (and reach a traced command too, which then exits).
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(signal, stop.clone()).context("installing the signal handler")?;
    }
    let (code, summary) = if a.command.is_empty() {
        let mounted = passthrough::mount(&a.mount, &a.mount, &a.output, &options)?;
        eprintln!("ulnet fsstudy: tracing {} into {}; interrupt to stop", a.mount.display(), a.output.display());
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(100));
        }
        (0, mounted.finish()?)
    } else {
        let (status, summary) = passthrough::run_command(&a.mount, &a.output, &a.command, &options)?;
        (status.code().unwrap_or(128 + std::os::unix::process::ExitStatusExt::signal(&status).unwrap_or(0)), summary)
    };
    if summary.written.dropped > 0 {
        eprintln!("ulnet fsstudy: warning: {} records dropped (the ring was full)", summary.written.dropped);
    }
    if summary.detached_busy {
        eprintln!(
            "ulnet fsstudy: warning: the mount was still in use and was detached; later operations are not traced"
        );
    }
    if a.json {
        println!("{}", serde_json::to_string(&summary)?);
    } else {
        eprintln!(
            "ulnet fsstudy: {} records ({} bytes) in {}",
            summary.written.records,
            summary.written.bytes,
            summary.output.display()
        );
    }
    Ok(code)
}

fn run_report(a: ReportArgs) -> Result<i32> {
    let inputs = ulnet_fsstudy::analysis::load(&a.files)?;
    for (file, damage) in inputs.damage() {
        eprintln!("ulnet fsstudy: {}: {damage}", file.display());
    }
    let study = ulnet_fsstudy::analysis::study(&inputs);
    if let Some(dir) = &a.out {
        let written = ulnet_fsstudy::report::write(&study, dir)?;
        eprintln!("ulnet fsstudy: wrote {} files into {}", written.len(), dir.display());
    }
    if a.json {
        println!("{}", serde_json::to_string(&study)?);
    } else {
        print!("{}", ulnet_fsstudy::report::text(&study));
    }
    Ok(0)
}
