//! Errors of River, one enum per operation family.

/// Why a river stage failed.
#[derive(Debug, thiserror::Error)]
pub enum RiverError {
    /// Reading or writing a file failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done, with the file's name.
        what: String,
        /// The system's error.
        source: std::io::Error,
    },
    /// Records must be whole: a length was not a multiple of the record size.
    #[error("{len} bytes is not a whole number of {record_size}-byte records")]
    PartialRecord {
        /// Bytes given.
        len: usize,
        /// Record size.
        record_size: usize,
    },
    /// A peer node failed or left before its end of stream.
    #[error("node {node} failed: {reason}")]
    NodeFailed {
        /// The node's rank.
        node: usize,
        /// What was seen.
        reason: String,
    },
    /// A peer sent something the protocol does not allow (counted and logged; the river
    /// cannot go on without the peer's data, so it stops).
    #[error("node {node} broke the river protocol: {reason}")]
    Protocol {
        /// The node's rank.
        node: usize,
        /// What was wrong.
        reason: String,
    },
    /// A peer reported that the run failed, for the reason it gives.
    #[error("{reason} (reported by node {node})")]
    Aborted {
        /// The node's rank.
        node: usize,
        /// Its reason.
        reason: String,
    },
    /// Nothing arrived in time.
    #[error("timed out after {secs:.1} s waiting for {what}")]
    Timeout {
        /// What was awaited.
        what: String,
        /// How long.
        secs: f64,
    },
    /// Setting up channels failed.
    #[error("connecting the river: {0}")]
    Connect(#[from] ulnet_core::ConnectError),
    /// A send failed (other than back-pressure).
    #[error("sending to node {node}: {source}")]
    Send {
        /// The node's rank.
        node: usize,
        /// The endpoint's error.
        source: ulnet_core::SendError,
    },
    /// The sink was already closed.
    #[error("the sink is closed")]
    Closed,
    /// The settings cannot work (a memory bound too small for the buffers, say).
    #[error("bad settings: {0}")]
    Config(String),
    /// The input is not what it was declared to be.
    #[error("bad input: {0}")]
    Input(String),
    /// The output failed its validation: it must not be used.
    #[error("the output failed validation: {0}")]
    Verification(String),
}

impl RiverError {
    /// An I/O error with what was being done.
    pub fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        RiverError::Io { what: what.into(), source }
    }
}
