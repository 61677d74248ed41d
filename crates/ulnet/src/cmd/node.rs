//! `ulnet node`: a cluster member daemon (membership over UDP, control plane over TCP on
//! the same address, Prometheus counters over HTTP), and `ulnet cluster status`.

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;
use ulnet_cluster::runtime::{query_status, Node, NodeConfig};
use ulnet_cluster::Config;

/// Arguments of `ulnet node`.
#[derive(Args, Debug)]
pub struct NodeArgs {
    /// This node's name.
    #[arg(long)]
    name: String,
    /// Address of the membership socket (UDP) and control plane (TCP).
    #[arg(long)]
    listen: SocketAddr,
    /// Nodes to join through, comma-separated; none forms a new cluster.
    #[arg(long, value_delimiter = ',')]
    seeds: Vec<SocketAddr>,
    /// Directory for durable state (identity, view, promises; the registry's log in
    /// DIR/registry). The registry runs only on nodes with a data directory.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// File holding the cluster secret (every node and client of the cluster uses the same;
    /// make one with `head -c 32 /dev/urandom > F; chmod 600 F`). Default: the file
    /// ULNET_SECRET_FILE names. Required unless --insecure-no-secret.
    #[arg(long)]
    secret_file: Option<PathBuf>,
    /// Run without a cluster secret (even when ULNET_SECRET_FILE is set): anyone who reaches
    /// --listen can join and call every service. For development on one host.
    #[arg(long, conflicts_with = "secret_file")]
    insecure_no_secret: bool,
    /// Append one JSON line per membership event to this file.
    #[arg(long)]
    events_json: Option<PathBuf>,
    /// Protocol profile: local, lan or wan.
    #[arg(long, default_value = "local")]
    profile: String,
    /// Serve Prometheus counters over HTTP at this address.
    #[arg(long)]
    metrics: Option<SocketAddr>,
    /// Shared directory of the two-node quorum witness (lock files).
    #[arg(long)]
    witness_dir: Option<PathBuf>,
    /// Log positions between the registry's snapshots (each truncates the log; a node that
    /// joins or lags behind the truncation gets the snapshot by state transfer).
    #[arg(long, default_value_t = ulnet_registry::service::SNAPSHOT_EVERY)]
    registry_snapshot_every: u64,
}

/// `ulnet cluster` subcommands.
#[derive(Subcommand, Debug)]
pub enum ClusterCommand {
    /// Show a node's view of the cluster.
    Status(StatusArgs),
}

/// Arguments of `ulnet cluster status`.
#[derive(Args, Debug)]
pub struct StatusArgs {
    /// The node to ask.
    #[arg(long)]
    connect: String,
    /// File holding the cluster secret (default: the file ULNET_SECRET_FILE names; none: the
    /// empty secret of an --insecure-no-secret node).
    #[arg(long)]
    secret_file: Option<PathBuf>,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

/// The secret of a client command that talks to a node (see [`super::secret`]).
pub fn read_secret(file: &Option<PathBuf>) -> Result<Vec<u8>> {
    Ok(super::secret::for_client(file.as_deref())?)
}

pub fn run_node(a: NodeArgs) -> Result<i32> {
    let secret = super::secret::for_server(a.secret_file.as_deref(), a.insecure_no_secret)?;
    let Some(protocol) = Config::profile(&a.profile) else { bail!("unknown profile {} (local, lan, wan)", a.profile) };
    if a.name.len() > ulnet_cluster::view::NAME_MAX {
        bail!("--name is longer than {} bytes", ulnet_cluster::view::NAME_MAX);
    }
    let mut services: Vec<Box<dyn ulnet_cluster::service::Service>> = Vec::new();
    if let Some(dir) = &a.data_dir {
        let prepared = ulnet_registry::service::prepare(dir).context("reading the registry's log")?;
        if prepared.new_identity {
            eprintln!(
                "ulnet node: the registry's log was corrupted; joining as a new member to recover it from the peers"
            );
        }
        let gup = if a.profile == "local" {
            ulnet_registry::gup::GupConfig::local()
        } else {
            ulnet_registry::gup::GupConfig::lan()
        };
        if a.registry_snapshot_every == 0 {
            bail!("--registry-snapshot-every must be at least 1");
        }
        services.push(Box::new(
            ulnet_registry::service::RegistryService::new(dir, prepared, gup)
                .with_snapshot_every(a.registry_snapshot_every),
        ));
    }
    let config = NodeConfig {
        name: a.name,
        listen: a.listen,
        seeds: a.seeds,
        data_dir: a.data_dir,
        secret,
        protocol,
        events_json: a.events_json,
        metrics: a.metrics,
        witness_dir: a.witness_dir,
    };
    let node = Node::start(config, services).context("starting the node")?;
    eprintln!("ulnet node {} listening on {}", node.me().name, node.me().addr);
    node.join();
    Ok(0)
}

pub fn run_cluster(c: ClusterCommand) -> Result<i32> {
    match c {
        ClusterCommand::Status(a) => {
            let secret = read_secret(&a.secret_file)?;
            let s = query_status(&a.connect, &secret, Duration::from_secs(3)).map_err(anyhow::Error::msg)?;
            if a.json {
                println!("{}", serde_json::to_string(&s)?);
            } else {
                println!(
                    "node {} ({}), view {}, quorum {}",
                    s.node,
                    s.status,
                    s.view,
                    if s.quorum { "yes" } else { "no" }
                );
                println!("{:<20} {:<22} state", "name", "addr");
                for m in &s.members {
                    println!("{:<20} {:<22} {}", m.name, m.addr, m.state);
                }
            }
            Ok(0)
        }
    }
}
