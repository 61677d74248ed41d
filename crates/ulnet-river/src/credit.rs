//! The river's flow control and end-of-stream accounting as a sans-IO state machine: no
//! channels, no clock, no threads. The runtime ([`crate::River`]) tells it what was sent
//! and what arrived, and asks it whether it may send, which credits to return, and whether
//! the queue has run dry. The same machine runs under `ulnet-sim` over thousands of seeded
//! schedules with crashes (`tests/flow_sim.rs`).
//!
//! Method groups, in the order a node uses them:
//!
//! * sending: [`FlowControl::may_send`], [`FlowControl::on_data_sent`],
//!   [`FlowControl::on_credit`], [`FlowControl::end_of_stream`];
//! * receiving: [`FlowControl::on_data`], [`FlowControl::on_end_of_stream`],
//!   [`FlowControl::poll_credit`];
//! * failures: [`FlowControl::on_channel_down`], [`FlowControl::finish`];
//! * the end: [`FlowControl::is_dry`].
//!
//! ```
//! use ulnet_river::credit::FlowControl;
//!
//! // Two nodes, one credit: node 0 sends one chunk of 5 records to node 1.
//! let (mut a, mut b) = (FlowControl::new(0, 2, 1), FlowControl::new(1, 2, 1));
//! assert!(a.may_send(1));
//! a.on_data_sent(1, 5);
//! assert!(!a.may_send(1)); // no credit left
//! b.on_data(0, 5).unwrap();
//! assert_eq!(b.poll_credit(true), Some((0, 1))); // consumed: one credit back
//! a.on_credit(1, 1).unwrap();
//! let declared = a.end_of_stream(1);
//! b.on_end_of_stream(0, declared).unwrap();
//! let _ = b.end_of_stream(0);
//! assert!(b.is_dry());
//! ```

/// Why the accounting refuses what a peer did.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FlowError {
    /// The peer broke the protocol.
    #[error("node {node} broke the river protocol: {reason}")]
    Protocol {
        /// The peer.
        node: usize,
        /// What it did.
        reason: String,
    },
    /// The peer was lost before its end of stream.
    #[error("node {node} failed: {reason}")]
    Lost {
        /// The peer.
        node: usize,
        /// How it was lost.
        reason: String,
    },
}

#[derive(Clone, Debug, Default)]
struct PeerFlow {
    // Sending to the peer.
    credits: u32,
    sent_records: u64,
    end_sent: bool,
    // Receiving from the peer.
    received_records: u64,
    end_declared: Option<u64>,
    owed_credits: u32,
    down: bool,
}

/// Credits and ends of stream of one node toward every other.
#[derive(Clone, Debug)]
pub struct FlowControl {
    rank: usize,
    credits: u32,
    peers: Vec<PeerFlow>,
    finished: bool,
}

impl FlowControl {
    /// Node `rank` of `size`, allowed `credits` chunks outstanding to each peer.
    pub fn new(rank: usize, size: usize, credits: u32) -> Self {
        assert!(rank < size && credits > 0, "rank {rank} of {size}, {credits} credits");
        let mut peers = vec![PeerFlow { credits, ..Default::default() }; size];
        // Our own part needs no messages: its stream is ended and accounted from the start.
        peers[rank].end_sent = true;
        peers[rank].end_declared = Some(0);
        FlowControl { rank, credits, peers, finished: false }
    }

    /// Number of nodes.
    pub fn size(&self) -> usize {
        self.peers.len()
    }

    /// Whether a data message may go to `peer` now.
    pub fn may_send(&self, peer: usize) -> bool {
        let p = &self.peers[peer];
        p.credits > 0 && !p.end_sent && !p.down
    }

    /// A data message of `records` went to `peer` (it used one credit).
    pub fn on_data_sent(&mut self, peer: usize, records: u64) {
        let p = &mut self.peers[peer];
        assert!(p.credits > 0 && !p.end_sent, "flow invariant: data only with credit, before the end");
        p.credits -= 1;
        p.sent_records += records;
    }

    /// `peer` granted `n` credits back.
    pub fn on_credit(&mut self, peer: usize, n: u32) -> Result<(), FlowError> {
        let max = self.credits;
        let p = &mut self.peers[peer];
        match p.credits.checked_add(n) {
            Some(c) if c <= max && n > 0 => {
                p.credits = c;
                Ok(())
            }
            _ => Err(FlowError::Protocol {
                node: peer,
                reason: format!("granted {n} credits, {} were in use", max - p.credits),
            }),
        }
    }

    /// Ends the stream to `peer`; returns the number of records to declare.
    pub fn end_of_stream(&mut self, peer: usize) -> u64 {
        let p = &mut self.peers[peer];
        p.end_sent = true;
        p.sent_records
    }

    /// Whether the stream to `peer` has been ended.
    pub fn end_sent(&self, peer: usize) -> bool {
        self.peers[peer].end_sent
    }

    /// Records sent to `peer` so far.
    pub fn sent_records(&self, peer: usize) -> u64 {
        self.peers[peer].sent_records
    }

    /// Credits left toward `peer`.
    pub fn credits(&self, peer: usize) -> u32 {
        self.peers[peer].credits
    }

    /// A whole data message of `records` from `peer` was consumed into the store.
    pub fn on_data(&mut self, peer: usize, records: u64) -> Result<(), FlowError> {
        let p = &mut self.peers[peer];
        if p.end_declared.is_some() {
            return Err(FlowError::Protocol { node: peer, reason: "data after its end of stream".into() });
        }
        p.received_records += records;
        p.owed_credits += 1;
        Ok(())
    }

    /// Whether data from `peer` would be refused (it ended its stream).
    pub fn has_ended(&self, peer: usize) -> bool {
        self.peers[peer].end_declared.is_some()
    }

    /// `peer` ended its stream, declaring `declared` records.
    pub fn on_end_of_stream(&mut self, peer: usize, declared: u64) -> Result<(), FlowError> {
        let p = &mut self.peers[peer];
        if p.end_declared.is_some() {
            return Err(FlowError::Protocol { node: peer, reason: "a second end of stream".into() });
        }
        if declared != p.received_records {
            return Err(FlowError::Protocol {
                node: peer,
                reason: format!("end of stream declares {declared} records, {} arrived", p.received_records),
            });
        }
        p.end_declared = Some(declared);
        Ok(())
    }

    /// Records received from `peer`.
    pub fn received_records(&self, peer: usize) -> u64 {
        self.peers[peer].received_records
    }

    /// A credit message to send: to the first peer owed at least `credits / 4` (or any,
    /// with `all`), and how many. Batching keeps credit traffic at a quarter of the data
    /// messages' count while the sender never runs below three quarters of its window.
    pub fn poll_credit(&mut self, all: bool) -> Option<(usize, u32)> {
        let batch = (self.credits / 4).max(1);
        let (j, p) = self
            .peers
            .iter_mut()
            .enumerate()
            .find(|(_, p)| !p.down && p.owed_credits > 0 && (all || p.owed_credits >= batch))?;
        let n = std::mem::take(&mut p.owed_credits);
        Some((j, n))
    }

    /// Puts back credits that [`FlowControl::poll_credit`] gave but could not be sent.
    pub fn unsent_credit(&mut self, peer: usize, n: u32) {
        self.peers[peer].owed_credits += n;
    }

    /// The channel to `peer` went down. A failure unless the peer's stream had ended (all
    /// it sent has arrived) or the run is over.
    pub fn on_channel_down(&mut self, peer: usize, why: &str) -> Result<(), FlowError> {
        let p = &mut self.peers[peer];
        p.down = true;
        if self.finished || p.end_declared.is_some() {
            return Ok(());
        }
        Err(FlowError::Lost { node: peer, reason: format!("lost before its end of stream ({why})") })
    }

    /// Whether the channel to `peer` is down.
    pub fn is_down(&self, peer: usize) -> bool {
        self.peers[peer].down
    }

    /// The run is over: peers may leave without it being a failure.
    pub fn finish(&mut self) {
        self.finished = true;
    }

    /// The queue has run dry: every stream to a peer ended, every peer's stream ended with
    /// the count that arrived.
    pub fn is_dry(&self) -> bool {
        self.peers.iter().all(|p| p.end_sent && p.end_declared == Some(p.received_records))
    }

    /// This node's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_what_the_protocol_forbids() {
        let mut f = FlowControl::new(0, 2, 2);
        assert!(f.on_credit(1, 1).is_err(), "no credit is in use yet");
        f.on_data_sent(1, 3);
        assert!(f.on_credit(1, 2).is_err(), "only one is in use");
        f.on_credit(1, 1).unwrap();
        f.on_data(1, 4).unwrap();
        assert!(f.on_end_of_stream(1, 5).is_err());
        f.on_end_of_stream(1, 4).unwrap();
        assert!(f.on_end_of_stream(1, 4).is_err());
        assert!(f.on_data(1, 1).is_err());
        assert!(!f.is_dry(), "our own end has not gone out");
        f.end_of_stream(1);
        assert!(f.is_dry());
        assert!(f.on_channel_down(1, "closed").is_ok(), "its stream had ended");
    }

    #[test]
    fn a_peer_lost_early_is_a_failure_until_the_run_is_over() {
        let mut f = FlowControl::new(1, 3, 4);
        assert_eq!(
            f.on_channel_down(0, "reset"),
            Err(FlowError::Lost { node: 0, reason: "lost before its end of stream (reset)".into() })
        );
        f.finish();
        assert!(f.on_channel_down(2, "reset").is_ok());
    }

    #[test]
    fn credits_come_back_in_batches() {
        let mut f = FlowControl::new(0, 2, 8);
        f.on_data(1, 1).unwrap();
        assert_eq!(f.poll_credit(false), None);
        f.on_data(1, 1).unwrap();
        assert_eq!(f.poll_credit(false), Some((1, 2)));
        f.on_data(1, 1).unwrap();
        assert_eq!(f.poll_credit(true), Some((1, 1)));
    }
}
