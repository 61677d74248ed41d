//! Node identity: which cluster node an endpoint (and so each end of a channel) belongs to.
//!
//! Channels learn their peer's node id in the connection handshake, so traces and counters
//! can name both ends of every message.

/// The environment variable that gives this process's node id (a decimal `u32`).
pub const NODE_ID_ENV: &str = "ULNET_NODE_ID";

/// A cluster node's id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(pub u32);

impl NodeId {
    /// The id a peer is known by before (or without) the handshake telling it.
    pub const UNKNOWN: NodeId = NodeId(u32::MAX);

    /// The node id from `ULNET_NODE_ID`, else the process id: unique among the processes
    /// of one host, which is what a local cluster of processes needs, and stable for the
    /// life of the process. A value that does not parse is reported and ignored.
    pub fn from_env_or_pid() -> NodeId {
        match std::env::var(NODE_ID_ENV) {
            Ok(v) => match v.trim().parse::<u32>() {
                Ok(id) if id != u32::MAX => NodeId(id),
                _ => {
                    tracing::warn!(value = %v, "{NODE_ID_ENV} is not a node id (0..2^32-2); using the process id");
                    NodeId(std::process::id())
                }
            },
            Err(_) => NodeId(std::process::id()),
        }
    }
}

impl Default for NodeId {
    fn default() -> Self {
        NodeId::from_env_or_pid()
    }
}

impl std::fmt::Display for NodeId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if *self == NodeId::UNKNOWN {
            f.write_str("?")
        } else {
            write!(f, "{}", self.0)
        }
    }
}
