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
    /// The self-reconfiguring multi-tier data center.
    Dc(cmd::dc::DcArgs),
    /// Run a cluster member: membership, control plane, counters.
    Node(cmd::node::NodeArgs),
    /// Ask a node about the cluster.
    #[command(subcommand)]
    Cluster(cmd::node::ClusterCommand),
    /// The replicated registry of a running cluster.
    #[command(subcommand)]
    Registry(cmd::registry::RegistryCommand),
    /// Communication tracing: study trace files, test samples for heavy tails.
    Trace(cmd::trace::TraceArgs),
    /// File-system usage study: snapshots, traces through a FUSE pass-through, reports.
    Fsstudy(cmd::fsstudy::FsstudyArgs),
    /// Sort Sort Benchmark records across nodes (River, Millennium Sort).
    Sort(cmd::sort::SortArgs),
    /// One node of `ulnet sort` (started by it).
    #[command(hide = true)]
    SortNode(cmd::sort::SortNodeArgs),
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
        Command::Dc(a) => cmd::dc::run(a),
        Command::DemoNode(a) => cmd::demo::run_node(a),
        Command::Node(a) => cmd::node::run_node(a),
        Command::Cluster(c) => cmd::node::run_cluster(c),
        Command::Registry(c) => cmd::registry::run(c),
        Command::DemoRmaNode(a) => cmd::demo_rma::run_node(a),
        Command::Gensort(a) => ulnet_sortbench::cli::run_gensort(&a),
        Command::Valsort(a) => ulnet_sortbench::cli::run_valsort(&a),
        Command::Trace(a) => cmd::trace::run(a),
        Command::Fsstudy(a) => cmd::fsstudy::run(a),
        Command::Sort(a) => cmd::sort::run(a),
        Command::SortNode(a) => cmd::sort::run_node_command(a),
    };
    // A trace started by ULNET_TRACE is finished before exit (exit runs no destructors).
    if let Some(Err(e)) = ulnet_core::trace::stop_if_running() {
        eprintln!("ulnet: warning: trace not finished: {e}");
    }
    match result {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("ulnet: error: {}", cmd::secret::explain_refused_handshake(one_line(&e)));
            std::process::exit(exit_code(&e));
        }
    }
}

/// The exit code of a failed command: 2 when it had no usable cluster secret (as for a
/// command line clap refuses), else 1.
fn exit_code(e: &anyhow::Error) -> i32 {
    if e.chain().any(|cause| cause.is::<cmd::secret::SecretError>()) {
        cmd::secret::SECRET_EXIT_CODE
    } else {
        1
    }
}

/// The error and its causes on one line, each cause once: errors that print their source
/// in their own message (as "creating X: No such file or directory") would otherwise show
/// it twice.
fn one_line(e: &anyhow::Error) -> String {
    let mut msg = String::new();
    for cause in e.chain() {
        let text = cause.to_string().replace('\n', " ");
        if msg.ends_with(&text) {
            continue;
        }
        if !msg.is_empty() {
            msg.push_str(": ");
        }
        msg.push_str(&text);
    }
    msg
}

#[cfg(test)]
mod tests {
    use super::one_line;

    #[test]
    fn a_cause_its_error_already_prints_is_shown_once() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "no such file");
        let e = anyhow::Error::new(ulnet_river::RiverError::io("creating out", io)).context("node 0");
        assert_eq!(one_line(&e), "node 0: creating out: no such file");
        let e = anyhow::anyhow!("outer\nline").context("top");
        assert_eq!(one_line(&e), "top: outer line");
    }
}
