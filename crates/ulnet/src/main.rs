//! `ulnet`: user-level networking and cluster services for commodity clusters.

mod cmd;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "ulnet", version, about = "User-level networking and cluster services for commodity clusters")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start a few local processes, exchange messages between them and summarise.
    Demo(cmd::demo::DemoArgs),
    /// Micro-benchmarks between two processes (mirrors ucx_perftest).
    Bench(cmd::bench::BenchArgs),
    /// Generate Sort Benchmark records (compatible with gensort 1.5).
    Gensort(ulnet_sortbench::cli::GensortArgs),
    /// Validate sorted Sort Benchmark records (compatible with valsort 1.5).
    Valsort(ulnet_sortbench::cli::ValsortArgs),
    /// One process of `ulnet demo` (started by it).
    #[command(hide = true)]
    DemoNode(cmd::demo::DemoNodeArgs),
    /// One process of the remote-memory step of `ulnet demo` (started by it).
    #[command(hide = true)]
    DemoRmaNode(cmd::demo_rma::DemoRmaNodeArgs),
}

fn main() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("ULNET_LOG").unwrap_or_else(|_| "warn".into());
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Demo(a) => cmd::demo::run(a),
        Command::Bench(a) => cmd::bench::run(a),
        Command::DemoNode(a) => cmd::demo::run_node(a),
        Command::DemoRmaNode(a) => cmd::demo_rma::run_node(a),
        Command::Gensort(a) => ulnet_sortbench::cli::run_gensort(&a),
        Command::Valsort(a) => ulnet_sortbench::cli::run_valsort(&a),
    };
    match result {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            let msg = format!("{e:#}").replace('\n', " ");
            eprintln!("ulnet: error: {msg}");
            std::process::exit(1);
        }
    }
}
