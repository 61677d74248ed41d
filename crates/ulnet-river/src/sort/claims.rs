//! The input shared out a chunk at a time as nodes ask for more, so that a node slowed by
//! anything (a busier core, a slower disk) reads less of it instead of holding the others
//! up at the end of the first pass (River's dynamic balancing of producers).
//!
//! Every node reads the same input. It is cut into [`Chunks`], and each node owns a run
//! of them (its share, as with the input cut in equal parts: each reads its own part in
//! order). Node `i` starts on its first chunk without asking; node 0's [`Dispenser`]
//! hands out the rest, one per claim: the claimant's next own chunk while it has one,
//! then the last chunk of the node with the most left, and [`NO_CHUNK`] once none is
//! left. Each node keeps one claim outstanding while it reads (one chunk ahead), so the
//! answer's round trip hides behind the reading.

use std::ops::Range;

/// Most records in a chunk: 320,000 (32 MB of 100-byte records), a few tens of
/// milliseconds of reading: small enough that the nodes end their reading within that of
/// each other, large enough that a claim per chunk costs nothing measurable.
const CHUNK_RECORDS_MAX: u64 = 320_000;
/// Fewest chunks per node: 4, so that small inputs are balanced too.
const CHUNKS_PER_NODE_MIN: u64 = 4;

/// The answer to a claim when every chunk is handed out.
pub const NO_CHUNK: u64 = u64::MAX;

/// The input's records in chunks of equal size (the last may be shorter), each node
/// owning a run of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chunks {
    total: u64,
    per_chunk: u64,
    nodes: usize,
}

impl Chunks {
    /// Chunks of `total` records for `nodes` nodes.
    pub fn new(total: u64, nodes: usize) -> Self {
        let per_chunk = total.div_ceil(nodes as u64 * CHUNKS_PER_NODE_MIN).clamp(1, CHUNK_RECORDS_MAX);
        Chunks { total, per_chunk, nodes }
    }

    /// Number of chunks.
    pub fn count(&self) -> u64 {
        self.total.div_ceil(self.per_chunk)
    }

    /// The records (indexes in the input) of chunk `c`.
    pub fn records(&self, c: u64) -> Range<u64> {
        assert!(c < self.count(), "chunk {c} of {}", self.count());
        c * self.per_chunk..((c + 1) * self.per_chunk).min(self.total)
    }

    /// The chunks node `rank` owns.
    fn owned(&self, rank: usize) -> Range<u64> {
        let (count, nodes) = (self.count(), self.nodes as u64);
        count * rank as u64 / nodes..count * (rank as u64 + 1) / nodes
    }

    /// The chunk node `rank` starts on without asking (its first own), if it owns any.
    pub fn first_of(&self, rank: usize) -> Option<u64> {
        Some(self.owned(rank)).filter(|r| !r.is_empty()).map(|r| r.start)
    }
}

/// Node 0's record of what it has handed out.
#[derive(Debug)]
pub struct Dispenser {
    /// Each node's own chunks not yet handed out (the first of each taken already).
    left: Vec<Range<u64>>,
    /// Nodes told [`NO_CHUNK`]: they claim no more.
    told_done: Vec<bool>,
}

impl Dispenser {
    /// Hands out `chunks`, the first chunk of each node already taken. A node that owns
    /// no chunk (fewer chunks than nodes) claims none.
    pub fn new(chunks: &Chunks) -> Self {
        let nodes = chunks.nodes;
        let left = (0..nodes).map(|r| chunks.owned(r)).map(|o| o.start.saturating_add(1).min(o.end)..o.end).collect();
        let told_done = (0..nodes).map(|r| chunks.first_of(r).is_none()).collect();
        Dispenser { left, told_done }
    }

    /// The next chunk for `node` (its own next, else the last of the node with the most
    /// left), or [`NO_CHUNK`] (after which `node` is done).
    pub fn claim(&mut self, node: usize) -> u64 {
        assert!(!self.told_done[node], "node {node} claimed after it was told every chunk was out");
        if let Some(c) = self.left[node].next() {
            return c;
        }
        let most = (0..self.left.len()).max_by_key(|&j| self.left[j].end - self.left[j].start);
        match most.and_then(|j| self.left[j].next_back()) {
            Some(c) => c,
            None => {
                self.told_done[node] = true;
                NO_CHUNK
            }
        }
    }

    /// Nodes other than `me` that have not yet been told every chunk is out: each will
    /// claim once more.
    pub fn still_claiming(&self, me: usize) -> Vec<usize> {
        (0..self.told_done.len()).filter(|&j| j != me && !self.told_done[j]).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// However the nodes' claims interleave, every record is handed out exactly once,
        /// and every node ends told that none is left.
        #[test]
        fn every_record_goes_to_exactly_one_node(total in 0u64..3_000_000, nodes in 1usize..9, seed in any::<u64>()) {
            let chunks = Chunks::new(total, nodes);
            let mut d = Dispenser::new(&chunks);
            let mut got: Vec<Range<u64>> = (0..nodes).filter_map(|r| chunks.first_of(r)).map(|c| chunks.records(c)).collect();
            let mut x = seed | 1;
            let mut claiming: Vec<usize> = (0..nodes).filter(|&r| chunks.first_of(r).is_some()).collect();
            while !claiming.is_empty() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let i = (x % claiming.len() as u64) as usize;
                match d.claim(claiming[i]) {
                    NO_CHUNK => { claiming.swap_remove(i); }
                    c => got.push(chunks.records(c)),
                }
            }
            prop_assert!(d.still_claiming(0).is_empty());
            got.sort_by_key(|r| r.start);
            let mut at = 0;
            for r in &got {
                prop_assert_eq!(r.start, at);
                prop_assert!(r.end > r.start);
                at = r.end;
            }
            prop_assert_eq!(at, total);
        }
    }

    #[test]
    fn chunks_are_at_most_32_mb_and_at_least_four_per_node() {
        assert_eq!(Chunks::new(40_000_000, 2).count(), 125);
        assert_eq!(Chunks::new(1_000_000, 2).count(), 8);
        assert_eq!(Chunks::new(3, 4).count(), 3);
        // Fewer chunks than nodes: one node (here node 0) owns none and reads none.
        assert_eq!(
            (0..4).map(|r| Chunks::new(3, 4).first_of(r)).collect::<Vec<_>>(),
            [None, Some(0), Some(1), Some(2)]
        );
    }

    #[test]
    fn a_node_reads_its_own_chunks_in_order_then_takes_from_the_end_of_the_fullest() {
        let chunks = Chunks::new(12, 3); // 12 chunks of 1 record, 4 owned by each node
        let mut d = Dispenser::new(&chunks);
        assert_eq!((0..3).map(|r| chunks.first_of(r)).collect::<Vec<_>>(), [Some(0), Some(4), Some(8)]);
        assert_eq!([d.claim(0), d.claim(0), d.claim(0)], [1, 2, 3]);
        assert_eq!(d.claim(1), 5);
        // Node 0 has none of its own left: node 2 has the most (9..12), its last goes; then
        // nodes 1 and 2 have two each, and the later of them gives its last.
        assert_eq!([d.claim(0), d.claim(0)], [11, 10]);
    }

    #[test]
    fn nodes_without_a_first_chunk_are_not_waited_for() {
        let chunks = Chunks::new(0, 3);
        assert_eq!(chunks.count(), 0);
        assert!(Dispenser::new(&chunks).still_claiming(0).is_empty());
        let chunks = Chunks::new(2, 3);
        assert_eq!(Dispenser::new(&chunks).still_claiming(0), vec![1, 2]);
    }
}
