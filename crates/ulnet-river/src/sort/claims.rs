//! The input shared out a chunk at a time as nodes ask for more, so that a node slowed by
//! anything (a busier core, a slower disk) reads less of it instead of holding the others
//! up at the end of the first pass (River's dynamic balancing of producers).
//!
//! Every node reads the same input. It is cut into [`Chunks`]; node `i` starts on chunk
//! `i` without asking, node 0's [`Dispenser`] hands out the rest in order, one per claim,
//! and answers [`NO_CHUNK`] once none is left. Each node keeps one claim outstanding while
//! it reads (one chunk ahead), so the answer's round trip hides behind the reading.

use std::ops::Range;

/// Most records in a chunk: 320,000 (32 MB of 100-byte records), a few tens of
/// milliseconds of reading: small enough that the nodes end their reading within that of
/// each other, large enough that a claim per chunk costs nothing measurable.
const CHUNK_RECORDS_MAX: u64 = 320_000;
/// Fewest chunks per node: 4, so that small inputs are balanced too.
const CHUNKS_PER_NODE_MIN: u64 = 4;

/// The answer to a claim when every chunk is handed out.
pub const NO_CHUNK: u64 = u64::MAX;

/// The input's records in chunks of equal size (the last may be shorter).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chunks {
    total: u64,
    per_chunk: u64,
}

impl Chunks {
    /// Chunks of `total` records for `nodes` nodes.
    pub fn new(total: u64, nodes: usize) -> Self {
        let per_chunk = total.div_ceil(nodes as u64 * CHUNKS_PER_NODE_MIN).clamp(1, CHUNK_RECORDS_MAX);
        Chunks { total, per_chunk }
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

    /// The chunk node `rank` starts on without asking, if there is one.
    pub fn first_of(&self, rank: usize) -> Option<u64> {
        ((rank as u64) < self.count()).then_some(rank as u64)
    }
}

/// Node 0's record of what it has handed out.
#[derive(Debug)]
pub struct Dispenser {
    next: u64,
    count: u64,
    /// Nodes told [`NO_CHUNK`]: they claim no more.
    told_done: Vec<bool>,
}

impl Dispenser {
    /// Hands out `chunks` to `nodes` nodes, the first chunk of each already taken. A node
    /// with no first chunk (fewer chunks than nodes) claims none.
    pub fn new(chunks: &Chunks, nodes: usize) -> Self {
        let count = chunks.count();
        let told_done = (0..nodes).map(|r| chunks.first_of(r).is_none()).collect();
        Dispenser { next: (nodes as u64).min(count), count, told_done }
    }

    /// The next chunk for `node`, or [`NO_CHUNK`] (after which `node` is done).
    pub fn claim(&mut self, node: usize) -> u64 {
        assert!(!self.told_done[node], "node {node} claimed after it was told every chunk was out");
        if self.next < self.count {
            self.next += 1;
            self.next - 1
        } else {
            self.told_done[node] = true;
            NO_CHUNK
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
            let mut d = Dispenser::new(&chunks, nodes);
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
        assert_eq!(Chunks::new(3, 4).first_of(3), None);
    }

    #[test]
    fn nodes_without_a_first_chunk_are_not_waited_for() {
        let chunks = Chunks::new(0, 3);
        assert_eq!(chunks.count(), 0);
        assert!(Dispenser::new(&chunks, 3).still_claiming(0).is_empty());
        let chunks = Chunks::new(2, 3);
        assert_eq!(Dispenser::new(&chunks, 3).still_claiming(0), vec![1]);
    }
}
