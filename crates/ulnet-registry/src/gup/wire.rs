//! GUP's messages and their wire format.
//!
//! Every message is `version u8 | kind u8 | fields`, little-endian, lengths as u32 before the
//! bytes they count. Decoding checks every length against the bytes left and the limits in
//! [`crate::codec`] before allocating, rejects unknown kinds and trailing bytes, and never
//! panics (property-tested and fuzzed in `tests/wire.rs`).
//!
//! The format is append-only: kinds keep their numbers forever; a new field means a new
//! version. History: version 1 (phase 1, never deployed: 32-bit node ids, fixed voters);
//! version 2 (this one): 64-bit node ids (the membership's ids), epochs with a round,
//! configuration entries, snapshots that carry their voting configuration, and sync states
//! without the recovering flag (a node that lost its log comes back under a new id).

use crate::codec::SnapshotPart;
use crate::codec::{DecodeError, Reader, Writer};
use crate::gup::types::{BatchId, Entry, Epoch};
use std::sync::Arc;

/// The wire version this build speaks.
pub const WIRE_VERSION: u8 = 2;

/// One GUP message. Every message names the epoch it belongs to; messages of other epochs
/// are ignored or answered with what the receiver knows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Msg {
    /// Sender to locker: please grant the lock for this batch (the updates travel with the
    /// request, so the locker applies them first and keeps them for replay).
    LockRequest {
        /// The sender's epoch.
        epoch: Epoch,
        /// The sender's name for the batch.
        batch: BatchId,
        /// The updates.
        updates: Vec<Arc<[u8]>>,
    },
    /// Locker to sender: the batch holds log position `seq`; deliver it.
    Grant {
        /// The locker's epoch.
        epoch: Epoch,
        /// The batch.
        batch: BatchId,
        /// Its position.
        seq: u64,
    },
    /// A transmitter (the sender, or the locker taking over) to a receiver: the entry at
    /// `seq`, and the transmitter's committed position.
    Batch {
        /// Epoch of the grant.
        epoch: Epoch,
        /// Position.
        seq: u64,
        /// Committed position known to the transmitter.
        commit: u64,
        /// The entry.
        entry: Entry,
    },
    /// Receiver to transmitter (and to the locker for heartbeat rounds): everything up to
    /// `upto` is in my log durably, as the log of `epoch`.
    Ack {
        /// The receiver's epoch.
        epoch: Epoch,
        /// Durable contiguous prefix.
        upto: u64,
        /// The heartbeat round answered (0 when none).
        round: u64,
    },
    /// Sender to locker, the last message of a global update: durable on a majority up to
    /// `upto`, so committed; the lock is released.
    Unlock {
        /// Epoch of the grant.
        epoch: Epoch,
        /// Committed position.
        upto: u64,
    },
    /// Locker to all: committed and granted positions; answered by an [`Msg::Ack`] with the
    /// round (which confirms the locker still reigns, for linearizable reads).
    Heartbeat {
        /// The locker's epoch.
        epoch: Epoch,
        /// Committed position.
        commit: u64,
        /// Last granted position.
        granted: u64,
        /// Round number.
        round: u64,
    },
    /// New locker to all: promise to follow me and send me your log from `from` on.
    SyncRequest {
        /// The new epoch.
        epoch: Epoch,
        /// First position the locker wants (its own applied position + 1).
        from: u64,
    },
    /// Answer to a [`Msg::SyncRequest`]: the promise and the state the new locker needs.
    SyncState {
        /// The epoch promised.
        epoch: Epoch,
        /// The last epoch whose authoritative log this node holds.
        last_normal: Option<Epoch>,
        /// Applied (committed and present) position.
        applied: u64,
        /// Committed position known.
        commit: u64,
        /// The node's snapshot, when its log no longer reaches back to `from`.
        snapshot: SnapshotPart,
        /// Log entries from the requested position on.
        entries: Vec<(u64, Entry)>,
    },
    /// Locker to a node: the log from `from` to `end`. With `establish` (end of a sync, or a
    /// node joining the epoch) the receiver drops what it has after `from - 1`, takes this as
    /// the log of `epoch` and becomes normal in it; without (repair) it fills gaps.
    Catchup {
        /// The locker's epoch.
        epoch: Epoch,
        /// Whether the receiver adopts the log from `from` on and becomes normal.
        establish: bool,
        /// First position carried (entries or snapshot start here).
        from: u64,
        /// Last position of the authoritative log covered.
        end: u64,
        /// Committed position.
        commit: u64,
        /// A snapshot, when the receiver is behind the locker's log.
        snapshot: SnapshotPart,
        /// Entries.
        entries: Vec<(u64, Entry)>,
    },
    /// A node that misses positions `from..=to` asks the locker for them.
    RepairRequest {
        /// The node's epoch.
        epoch: Epoch,
        /// First missing position.
        from: u64,
        /// Last wanted position.
        to: u64,
    },
    /// A node asks the locker for a read index (a linearizable read).
    ReadIndexRequest {
        /// The node's epoch.
        epoch: Epoch,
        /// The node's request number.
        id: u64,
    },
    /// The locker's answer after a heartbeat round confirmed its reign: reads may be served
    /// once everything up to `index` is applied.
    ReadIndexReply {
        /// The locker's epoch.
        epoch: Epoch,
        /// The request number.
        id: u64,
        /// The read index.
        index: u64,
    },
    /// Locker to sender: the batch holds position `seq` in an entry that combines several
    /// senders' batches, which the locker delivers itself. The delivery ([`Msg::Batch`])
    /// is the grant; this message answers a sender that asks again.
    GrantCombined {
        /// The locker's epoch.
        epoch: Epoch,
        /// The batch.
        batch: BatchId,
        /// Its position.
        seq: u64,
    },
    /// Locker to the senders of a combined entry: committed up to `upto` (the unlock, sent
    /// the other way because the locker collected the acknowledgements).
    Committed {
        /// The locker's epoch.
        epoch: Epoch,
        /// Committed position.
        upto: u64,
    },
}

// Message kinds: append-only; never reuse a number.
const LOCK_REQUEST: u8 = 1;
const GRANT: u8 = 2;
const BATCH: u8 = 3;
const ACK: u8 = 4;
const UNLOCK: u8 = 5;
const HEARTBEAT: u8 = 6;
const SYNC_REQUEST: u8 = 7;
const SYNC_STATE: u8 = 8;
const CATCHUP: u8 = 9;
const REPAIR_REQUEST: u8 = 10;
const READ_INDEX_REQUEST: u8 = 11;
const READ_INDEX_REPLY: u8 = 12;
const GRANT_COMBINED: u8 = 13;
const COMMITTED: u8 = 14;

impl Msg {
    /// The epoch the message belongs to.
    pub fn epoch(&self) -> Epoch {
        match self {
            Msg::LockRequest { epoch, .. }
            | Msg::Grant { epoch, .. }
            | Msg::Batch { epoch, .. }
            | Msg::Ack { epoch, .. }
            | Msg::Unlock { epoch, .. }
            | Msg::Heartbeat { epoch, .. }
            | Msg::SyncRequest { epoch, .. }
            | Msg::SyncState { epoch, .. }
            | Msg::Catchup { epoch, .. }
            | Msg::RepairRequest { epoch, .. }
            | Msg::ReadIndexRequest { epoch, .. }
            | Msg::ReadIndexReply { epoch, .. }
            | Msg::GrantCombined { epoch, .. }
            | Msg::Committed { epoch, .. } => *epoch,
        }
    }

    /// Encodes the message.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.u8(WIRE_VERSION);
        match self {
            Msg::LockRequest { epoch, batch, updates } => {
                w.u8(LOCK_REQUEST);
                w.epoch(*epoch);
                w.batch(*batch);
                w.updates(updates);
            }
            Msg::Grant { epoch, batch, seq } => {
                w.u8(GRANT);
                w.epoch(*epoch);
                w.batch(*batch);
                w.u64(*seq);
            }
            Msg::Batch { epoch, seq, commit, entry } => {
                w.u8(BATCH);
                w.epoch(*epoch);
                w.u64(*seq);
                w.u64(*commit);
                w.entry(entry);
            }
            Msg::Ack { epoch, upto, round } => {
                w.u8(ACK);
                w.epoch(*epoch);
                w.u64(*upto);
                w.u64(*round);
            }
            Msg::Unlock { epoch, upto } => {
                w.u8(UNLOCK);
                w.epoch(*epoch);
                w.u64(*upto);
            }
            Msg::Heartbeat { epoch, commit, granted, round } => {
                w.u8(HEARTBEAT);
                w.epoch(*epoch);
                w.u64(*commit);
                w.u64(*granted);
                w.u64(*round);
            }
            Msg::SyncRequest { epoch, from } => {
                w.u8(SYNC_REQUEST);
                w.epoch(*epoch);
                w.u64(*from);
            }
            Msg::SyncState { epoch, last_normal, applied, commit, snapshot, entries } => {
                w.u8(SYNC_STATE);
                w.epoch(*epoch);
                w.opt_epoch(*last_normal);
                w.u64(*applied);
                w.u64(*commit);
                w.snapshot_part(snapshot);
                w.entries(entries);
            }
            Msg::Catchup { epoch, establish, from, end, commit, snapshot, entries } => {
                w.u8(CATCHUP);
                w.epoch(*epoch);
                w.bool(*establish);
                w.u64(*from);
                w.u64(*end);
                w.u64(*commit);
                w.snapshot_part(snapshot);
                w.entries(entries);
            }
            Msg::RepairRequest { epoch, from, to } => {
                w.u8(REPAIR_REQUEST);
                w.epoch(*epoch);
                w.u64(*from);
                w.u64(*to);
            }
            Msg::ReadIndexRequest { epoch, id } => {
                w.u8(READ_INDEX_REQUEST);
                w.epoch(*epoch);
                w.u64(*id);
            }
            Msg::ReadIndexReply { epoch, id, index } => {
                w.u8(READ_INDEX_REPLY);
                w.epoch(*epoch);
                w.u64(*id);
                w.u64(*index);
            }
            Msg::GrantCombined { epoch, batch, seq } => {
                w.u8(GRANT_COMBINED);
                w.epoch(*epoch);
                w.batch(*batch);
                w.u64(*seq);
            }
            Msg::Committed { epoch, upto } => {
                w.u8(COMMITTED);
                w.epoch(*epoch);
                w.u64(*upto);
            }
        }
        w.buf
    }

    /// Decodes one message; rejects anything malformed, oversize or with trailing bytes.
    pub fn decode(buf: &[u8]) -> Result<Msg, DecodeError> {
        let mut r = Reader::new(buf);
        let version = r.u8()?;
        if version != WIRE_VERSION {
            return Err(DecodeError::Version(version));
        }
        let msg = match r.u8()? {
            LOCK_REQUEST => Msg::LockRequest { epoch: r.epoch()?, batch: r.batch()?, updates: r.updates()? },
            GRANT => Msg::Grant { epoch: r.epoch()?, batch: r.batch()?, seq: r.u64()? },
            BATCH => Msg::Batch { epoch: r.epoch()?, seq: r.u64()?, commit: r.u64()?, entry: r.entry()? },
            ACK => Msg::Ack { epoch: r.epoch()?, upto: r.u64()?, round: r.u64()? },
            UNLOCK => Msg::Unlock { epoch: r.epoch()?, upto: r.u64()? },
            HEARTBEAT => Msg::Heartbeat { epoch: r.epoch()?, commit: r.u64()?, granted: r.u64()?, round: r.u64()? },
            SYNC_REQUEST => Msg::SyncRequest { epoch: r.epoch()?, from: r.u64()? },
            SYNC_STATE => Msg::SyncState {
                epoch: r.epoch()?,
                last_normal: r.opt_epoch()?,
                applied: r.u64()?,
                commit: r.u64()?,
                snapshot: r.snapshot_part()?,
                entries: r.entries()?,
            },
            CATCHUP => Msg::Catchup {
                epoch: r.epoch()?,
                establish: r.bool()?,
                from: r.u64()?,
                end: r.u64()?,
                commit: r.u64()?,
                snapshot: r.snapshot_part()?,
                entries: r.entries()?,
            },
            REPAIR_REQUEST => Msg::RepairRequest { epoch: r.epoch()?, from: r.u64()?, to: r.u64()? },
            READ_INDEX_REQUEST => Msg::ReadIndexRequest { epoch: r.epoch()?, id: r.u64()? },
            READ_INDEX_REPLY => Msg::ReadIndexReply { epoch: r.epoch()?, id: r.u64()?, index: r.u64()? },
            GRANT_COMBINED => Msg::GrantCombined { epoch: r.epoch()?, batch: r.batch()?, seq: r.u64()? },
            COMMITTED => Msg::Committed { epoch: r.epoch()?, upto: r.u64()? },
            tag => return Err(DecodeError::UnknownTag { what: "message", tag }),
        };
        r.finish()?;
        Ok(msg)
    }
}
