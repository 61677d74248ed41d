//! `ulnet bench --trace FILE`: tracing both benchmark processes.

use anyhow::{Context, Result};
use std::path::Path;
use ulnet_core::trace::{self, TraceConfig};
use ulnet_core::NodeId;

/// The node id of a benchmark process: `ULNET_NODE_ID` if set, else 0 for the active
/// side and 1 for the passive side, so traces of a run read as a two-node cluster.
pub fn node_id(server: bool) -> NodeId {
    match std::env::var(ulnet_core::node::NODE_ID_ENV) {
        Ok(_) => NodeId::from_env_or_pid(),
        Err(_) => NodeId(u32::from(server)),
    }
}

/// Starts tracing into `path`.
pub fn start(path: &Path, node: NodeId) -> Result<()> {
    trace::start(TraceConfig::new(path, node).with_env())
        .with_context(|| format!("starting the trace into {}", path.display()))
}

/// Finishes the trace (if one runs) and says what it wrote on stderr.
pub fn finish(path: Option<&Path>) -> Result<()> {
    if path.is_none() {
        return Ok(());
    }
    if let Some(summary) = trace::stop_if_running() {
        let s = summary?;
        eprintln!(
            "ulnet bench: traced {} records ({} dropped, full rings) into {}",
            s.records,
            s.dropped,
            s.path.display()
        );
    }
    Ok(())
}

/// The options that make the peer process trace into `FILE.peer`.
pub fn peer_args(path: Option<&Path>) -> Vec<String> {
    match path {
        Some(p) => vec!["--trace".into(), format!("{}.peer", p.display())],
        None => Vec::new(),
    }
}
