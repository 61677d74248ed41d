//! Bounds-checked little-endian reading and writing shared by the wire format and the log
//! record format. Every length read from outside is checked against what is left before
//! anything is allocated.

use crate::gup::types::{BatchId, Entry, Epoch, NodeId, Part, Snapshot, VotingConfig};
use std::sync::Arc;

/// Why bytes could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The input ended inside a field.
    #[error("truncated: needed {needed} more bytes")]
    Truncated {
        /// Bytes missing.
        needed: usize,
    },
    /// A discriminant that this version does not know.
    #[error("unknown {what} tag {tag}")]
    UnknownTag {
        /// Which field.
        what: &'static str,
        /// The value found.
        tag: u8,
    },
    /// A wire version outside the supported range.
    #[error("unsupported version {0}")]
    Version(u8),
    /// A count or length above its limit.
    #[error("{what} of {got} exceeds the limit {limit}")]
    TooLarge {
        /// Which field.
        what: &'static str,
        /// The value found.
        got: u64,
        /// The limit.
        limit: u64,
    },
    /// Bytes left over after the message.
    #[error("{0} trailing bytes")]
    Trailing(usize),
    /// A value that violates the format's rules (for example positions out of order).
    #[error("invalid: {0}")]
    Invalid(&'static str),
}

/// Largest single update (the registry's key and value together stay far below it).
pub const UPDATE_BYTES_MAX: usize = 1 << 20;
/// Most updates in one batch (one lock grant).
pub const BATCH_UPDATES_MAX: usize = 4096;
/// Most senders' batches combined in one log entry.
pub const PARTS_PER_ENTRY_MAX: usize = 1024;
/// Most log entries in one message or sync state.
pub const ENTRIES_PER_MESSAGE_MAX: usize = 1 << 16;
/// Largest snapshot carried in one message or record.
pub const SNAPSHOT_BYTES_MAX: usize = 1 << 30;
/// Most voters in one set of a voting configuration (a view holds at most this many).
pub const VOTERS_MAX: usize = 1024;

/// A snapshot on the wire, when one is carried.
pub type SnapshotPart = Option<Snapshot>;

pub(crate) struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Self { buf }
    }

    pub(crate) fn finish(self) -> Result<(), DecodeError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(DecodeError::Trailing(self.buf.len()))
        }
    }

    pub(crate) fn bytes(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.buf.len() < n {
            return Err(DecodeError::Truncated { needed: n - self.buf.len() });
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }

    pub(crate) fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.bytes(1)?[0])
    }

    pub(crate) fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.bytes(4)?.try_into().expect("4 bytes")))
    }

    pub(crate) fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.bytes(8)?.try_into().expect("8 bytes")))
    }

    pub(crate) fn bool(&mut self) -> Result<bool, DecodeError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            tag => Err(DecodeError::UnknownTag { what: "bool", tag }),
        }
    }

    /// A count, checked against `limit` and against the bytes left assuming each item takes
    /// at least `item_bytes_min`.
    pub(crate) fn count(
        &mut self,
        what: &'static str,
        limit: usize,
        item_bytes_min: usize,
    ) -> Result<usize, DecodeError> {
        let n = self.u32()? as usize;
        if n > limit {
            return Err(DecodeError::TooLarge { what, got: n as u64, limit: limit as u64 });
        }
        if n.saturating_mul(item_bytes_min) > self.buf.len() {
            return Err(DecodeError::Truncated { needed: n * item_bytes_min - self.buf.len() });
        }
        Ok(n)
    }

    pub(crate) fn blob(&mut self, what: &'static str, limit: usize) -> Result<Arc<[u8]>, DecodeError> {
        let n = self.count(what, limit, 1)?;
        Ok(Arc::from(self.bytes(n)?))
    }

    pub(crate) fn node(&mut self) -> Result<NodeId, DecodeError> {
        Ok(NodeId(self.u64()?))
    }

    pub(crate) fn epoch(&mut self) -> Result<Epoch, DecodeError> {
        Ok(Epoch { view: self.u64()?, round: self.u32()?, locker: self.node()? })
    }

    /// A sorted, duplicate-free, non-empty list of voters.
    fn voters(&mut self) -> Result<Arc<[NodeId]>, DecodeError> {
        let n = self.count("voters", VOTERS_MAX, 8)?;
        if n == 0 {
            return Err(DecodeError::Invalid("a voting configuration without voters"));
        }
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            let node = self.node()?;
            if v.last().is_some_and(|&last| last >= node) {
                return Err(DecodeError::Invalid("voters not in increasing order"));
            }
            v.push(node);
        }
        Ok(v.into())
    }

    pub(crate) fn voting_config(&mut self) -> Result<VotingConfig, DecodeError> {
        let voters = self.voters()?;
        let previous = if self.bool()? { Some(self.voters()?) } else { None };
        Ok(VotingConfig { voters, previous })
    }

    pub(crate) fn opt_epoch(&mut self) -> Result<Option<Epoch>, DecodeError> {
        Ok(if self.bool()? { Some(self.epoch()?) } else { None })
    }

    pub(crate) fn batch(&mut self) -> Result<BatchId, DecodeError> {
        Ok(BatchId { incarnation: self.u32()?, counter: self.u64()? })
    }

    pub(crate) fn updates(&mut self) -> Result<Vec<Arc<[u8]>>, DecodeError> {
        let n = self.count("updates", BATCH_UPDATES_MAX, 4)?;
        (0..n).map(|_| self.blob("update", UPDATE_BYTES_MAX)).collect()
    }

    pub(crate) fn entry(&mut self) -> Result<Entry, DecodeError> {
        match self.u8()? {
            ENTRY_UPDATES => {
                let n = self.count("parts", PARTS_PER_ENTRY_MAX, 24)?;
                let mut parts = Vec::with_capacity(n);
                for _ in 0..n {
                    let origin = self.node()?;
                    let batch = self.batch()?;
                    let updates = self.updates()?;
                    parts.push(Part { origin, batch, updates: updates.into() });
                }
                Ok(Entry::Updates { parts: parts.into() })
            }
            ENTRY_SKIP => Ok(Entry::Skip),
            ENTRY_CONFIG => Ok(Entry::Config(self.voting_config()?)),
            tag => Err(DecodeError::UnknownTag { what: "entry", tag }),
        }
    }

    /// Entries at strictly increasing positions.
    pub(crate) fn entries(&mut self) -> Result<Vec<(u64, Entry)>, DecodeError> {
        let n = self.count("entries", ENTRIES_PER_MESSAGE_MAX, 9)?;
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let seq = self.u64()?;
            if out.last().is_some_and(|&(last, _)| last >= seq) {
                return Err(DecodeError::Invalid("entry positions not increasing"));
            }
            out.push((seq, self.entry()?));
        }
        Ok(out)
    }

    pub(crate) fn snapshot(&mut self) -> Result<Snapshot, DecodeError> {
        Ok(Snapshot {
            seq: self.u64()?,
            config: self.voting_config()?,
            data: self.blob("snapshot", SNAPSHOT_BYTES_MAX)?,
        })
    }

    pub(crate) fn snapshot_part(&mut self) -> Result<SnapshotPart, DecodeError> {
        Ok(if self.bool()? { Some(self.snapshot()?) } else { None })
    }
}

// Entry discriminants: append-only; never reuse a number.
const ENTRY_UPDATES: u8 = 1;
const ENTRY_SKIP: u8 = 2;
const ENTRY_CONFIG: u8 = 3;

pub(crate) struct Writer {
    pub(crate) buf: Vec<u8>,
}

impl Writer {
    pub(crate) fn new() -> Self {
        Self { buf: Vec::with_capacity(64) }
    }
    pub(crate) fn u8(&mut self, v: u8) {
        self.buf.push(v);
    }
    pub(crate) fn u32(&mut self, v: u32) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub(crate) fn u64(&mut self, v: u64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub(crate) fn bool(&mut self, v: bool) {
        self.u8(v as u8);
    }
    pub(crate) fn blob(&mut self, v: &[u8]) {
        self.u32(u32::try_from(v.len()).expect("blob length fits u32 (checked by the limits)"));
        self.buf.extend_from_slice(v);
    }
    pub(crate) fn node(&mut self, v: NodeId) {
        self.u64(v.0);
    }
    pub(crate) fn epoch(&mut self, e: Epoch) {
        self.u64(e.view);
        self.u32(e.round);
        self.node(e.locker);
    }
    fn voters(&mut self, v: &[NodeId]) {
        self.u32(v.len() as u32);
        for n in v {
            self.node(*n);
        }
    }
    pub(crate) fn voting_config(&mut self, c: &VotingConfig) {
        self.voters(&c.voters);
        self.bool(c.previous.is_some());
        if let Some(p) = &c.previous {
            self.voters(p);
        }
    }
    pub(crate) fn opt_epoch(&mut self, e: Option<Epoch>) {
        self.bool(e.is_some());
        if let Some(e) = e {
            self.epoch(e);
        }
    }
    pub(crate) fn batch(&mut self, b: BatchId) {
        self.u32(b.incarnation);
        self.u64(b.counter);
    }
    pub(crate) fn updates(&mut self, updates: &[Arc<[u8]>]) {
        self.u32(updates.len() as u32);
        for u in updates {
            self.blob(u);
        }
    }
    pub(crate) fn entry(&mut self, e: &Entry) {
        match e {
            Entry::Updates { parts } => {
                self.u8(ENTRY_UPDATES);
                self.u32(parts.len() as u32);
                for p in parts.iter() {
                    self.node(p.origin);
                    self.batch(p.batch);
                    self.updates(&p.updates);
                }
            }
            Entry::Skip => self.u8(ENTRY_SKIP),
            Entry::Config(c) => {
                self.u8(ENTRY_CONFIG);
                self.voting_config(c);
            }
        }
    }
    pub(crate) fn entries(&mut self, entries: &[(u64, Entry)]) {
        self.u32(entries.len() as u32);
        for (seq, e) in entries {
            self.u64(*seq);
            self.entry(e);
        }
    }
    pub(crate) fn snapshot(&mut self, s: &Snapshot) {
        self.u64(s.seq);
        self.voting_config(&s.config);
        self.blob(&s.data);
    }
    pub(crate) fn snapshot_part(&mut self, s: &SnapshotPart) {
        self.bool(s.is_some());
        if let Some(s) = s {
            self.snapshot(s);
        }
    }
}
