//! Load records: what a node publishes about itself in its own memory, for the other
//! helpers to read without involving it.
//!
//! A record is [`SLOT_WORDS`] 64-bit words, one cache line:
//!
//! ```text
//! word 0  version            odd while the owner writes, even when the record is whole
//! word 1  node(8) layout(8) port(16) incarnation(32)
//! word 2  ipv4(32) connections(32)
//! word 3  serving role code(8) draining(8) applied epoch(16) workers(16) cpu ‰(16)
//! word 4  busy workers ×1000 (32)   queued requests ×1000 (32)      (window averages)
//! word 5  cache-hit ‰(16) back-end share ‰(16) requests/s (32)
//! word 6  requests completed since start
//! word 7  MAC: first 8 bytes of HMAC-SHA256(cluster key, words 0..7)
//! ```
//!
//! The version and the MAC make a record readable by one-sided copy: a copy taken while
//! the owner writes is odd or fails its MAC ("torn", retried); a record that was not
//! written by a holder of the cluster key, or that names another node, fails the MAC or
//! the identity check ("forged", ignored and counted). [`RecordValidator`] adds what one
//! copy cannot tell: a version that goes backwards (a replayed record) or stops moving
//! (a node that stopped publishing) is "stale", ignored and counted.

use crate::role::{NodeIndex, Role};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::{Duration, Instant};

/// Words in one record.
pub const SLOT_WORDS: usize = 8;
/// Layout version written in word 1; a reader rejects other layouts.
pub const LAYOUT_VERSION: u8 = 1;

/// The key load records are authenticated with, shared by the nodes of one data center.
#[derive(Clone)]
pub struct ClusterKey(Vec<u8>);

impl ClusterKey {
    /// A key from secret bytes.
    pub fn new(secret: &[u8]) -> Self {
        assert!(!secret.is_empty(), "an empty key authenticates nothing");
        ClusterKey(secret.to_vec())
    }

    /// A fresh random key.
    pub fn random() -> Self {
        ClusterKey(rand::random::<[u8; 32]>().to_vec())
    }

    /// The key as hex (to hand to child processes through the environment).
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// A key from hex.
    pub fn from_hex(s: &str) -> Option<Self> {
        if s.is_empty() || !s.len().is_multiple_of(2) {
            return None;
        }
        let bytes: Option<Vec<u8>> =
            (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).ok()).collect();
        bytes.map(ClusterKey)
    }

    /// A secret for one purpose, derived from this key (HMAC-SHA256 of `label`), so the
    /// membership and remote-memory handshakes of a center never share a secret with the
    /// load records' MAC.
    pub fn derive(&self, label: &str) -> Vec<u8> {
        let mut m = Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes any key length");
        m.update(label.as_bytes());
        m.finalize().into_bytes().to_vec()
    }

    fn mac(&self, words: &[u64]) -> u64 {
        let mut m = Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes any key length");
        for w in words {
            m.update(&w.to_le_bytes());
        }
        let out = m.finalize().into_bytes();
        u64::from_le_bytes(out[..8].try_into().expect("SHA-256 output is 32 bytes"))
    }
}

impl std::fmt::Debug for ClusterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterKey(..)")
    }
}

/// What a node says about its load (window averages over the last publication window).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct LoadRecord {
    /// The node.
    pub node: u8,
    /// Random number chosen when the node process started (a restart is a new incarnation).
    pub incarnation: u32,
    /// Where the node takes HTTP requests.
    pub addr: Option<SocketAddrV4>,
    /// The role the node serves now (`None` before its first role).
    pub serving: Option<Role>,
    /// The node still finishes requests of its previous role.
    pub draining: bool,
    /// The role-table epoch the node has applied.
    pub applied_epoch: u16,
    /// Workers (requests served at once).
    pub workers: u16,
    /// Busy workers, averaged, × 1000.
    pub busy_milli: u32,
    /// Requests waiting for a worker, averaged, × 1000.
    pub queued_milli: u32,
    /// Open client connections.
    pub connections: u32,
    /// Fraction of cache lookups that hit, ‰ (proxy role).
    pub cache_hit_permille: u16,
    /// Fraction of requests sent on to the back end, ‰ (proxy role).
    pub backend_share_permille: u16,
    /// CPU time the process used per window time, ‰ (above 1000 with several cores busy).
    pub cpu_permille: u16,
    /// Requests completed per second.
    pub requests_per_s: u32,
    /// Requests completed since start.
    pub completed: u64,
}

/// Why one copy of a record is not usable by itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Copied while the owner wrote (odd version, or a MAC that fails on an odd/even race).
    #[error("record copied mid-write")]
    Torn,
    /// Never written (version 0).
    #[error("record never written")]
    Empty,
    /// The MAC does not match: not written by a holder of the cluster key.
    #[error("record fails its MAC")]
    BadMac,
    /// Well-formed and authentic but for another node, another layout, or out of range.
    #[error("record names the wrong node or holds impossible values")]
    Impossible,
}

fn pack(r: &LoadRecord, version: u64) -> [u64; SLOT_WORDS] {
    let (ip, port) = r.addr.map_or((0, 0), |a| (u32::from(*a.ip()), a.port()));
    let mut w = [0u64; SLOT_WORDS];
    w[0] = version;
    w[1] = u64::from(r.node) | u64::from(LAYOUT_VERSION) << 8 | u64::from(port) << 16 | u64::from(r.incarnation) << 32;
    w[2] = u64::from(ip) | u64::from(r.connections) << 32;
    w[3] = u64::from(r.serving.map_or(0, Role::code))
        | u64::from(r.draining) << 8
        | u64::from(r.applied_epoch) << 16
        | u64::from(r.workers) << 32
        | u64::from(r.cpu_permille) << 48;
    w[4] = u64::from(r.busy_milli) | u64::from(r.queued_milli) << 32;
    w[5] =
        u64::from(r.cache_hit_permille) | u64::from(r.backend_share_permille) << 16 | u64::from(r.requests_per_s) << 32;
    w[6] = r.completed;
    w
}

impl LoadRecord {
    /// The words of this record at `version` (even), MAC included.
    pub fn encode(&self, key: &ClusterKey, version: u64) -> [u64; SLOT_WORDS] {
        assert!(version.is_multiple_of(2) && version != 0, "a whole record has an even, non-zero version");
        let mut w = pack(self, version);
        w[SLOT_WORDS - 1] = key.mac(&w[..SLOT_WORDS - 1]);
        w
    }

    /// Reads one copy of the record in `slot`'s place. Never panics on any input.
    pub fn decode(
        words: &[u64; SLOT_WORDS],
        key: &ClusterKey,
        slot: NodeIndex,
    ) -> Result<(u64, LoadRecord), DecodeError> {
        let version = words[0];
        if version == 0 {
            return Err(DecodeError::Empty);
        }
        if !version.is_multiple_of(2) {
            return Err(DecodeError::Torn);
        }
        if key.mac(&words[..SLOT_WORDS - 1]) != words[SLOT_WORDS - 1] {
            return Err(DecodeError::BadMac);
        }
        let w = words;
        let node = w[1] as u8;
        let layout = (w[1] >> 8) as u8;
        let port = (w[1] >> 16) as u16;
        let ip = w[2] as u32;
        let code = w[3] as u8;
        let draining = (w[3] >> 8) as u8;
        let serving = Role::from_code(code);
        let r = LoadRecord {
            node,
            incarnation: (w[1] >> 32) as u32,
            addr: (port != 0).then(|| SocketAddrV4::new(Ipv4Addr::from(ip), port)),
            serving,
            draining: draining == 1,
            applied_epoch: (w[3] >> 16) as u16,
            workers: (w[3] >> 32) as u16,
            cpu_permille: (w[3] >> 48) as u16,
            busy_milli: w[4] as u32,
            queued_milli: (w[4] >> 32) as u32,
            connections: (w[2] >> 32) as u32,
            cache_hit_permille: w[5] as u16,
            backend_share_permille: (w[5] >> 16) as u16,
            requests_per_s: (w[5] >> 32) as u32,
            completed: w[6],
        };
        let impossible = node != slot.0
            || layout != LAYOUT_VERSION
            || (port == 0 && ip != 0)
            || (code != 0 && serving.is_none())
            || draining > 1
            || r.workers == 0
            || u64::from(r.busy_milli) > u64::from(r.workers) * 1000
            || r.cache_hit_permille > 1000
            || r.backend_share_permille > 1000;
        if impossible {
            return Err(DecodeError::Impossible);
        }
        Ok((version, r))
    }
}

/// Why a reader ignored a record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    /// Could not get a whole copy within the retry budget.
    #[error("torn")]
    Torn,
    /// Not written by the owner (bad MAC, wrong node, impossible values).
    #[error("forged")]
    Forged,
    /// Older than one already seen, or not updated for longer than the staleness limit.
    #[error("stale")]
    Stale,
    /// The node has never published.
    #[error("absent")]
    Absent,
}

/// What a reader counted while validating records.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ValidatorCounters {
    /// Records accepted.
    pub accepted: u64,
    /// Copies that stayed torn.
    pub torn: u64,
    /// Records ignored as forged.
    pub forged: u64,
    /// Records ignored as stale.
    pub stale: u64,
}

#[derive(Clone, Copy, Debug)]
struct Seen {
    incarnation: u32,
    version: u64,
    changed_at: Instant,
}

/// Accepts or ignores the records a reader copies, remembering what it saw per node.
///
/// Pure: it is handed the copy and `now`.
#[derive(Debug)]
pub struct RecordValidator {
    key: ClusterKey,
    stale_after: Duration,
    seen: Vec<Option<Seen>>,
    counters: ValidatorCounters,
}

impl RecordValidator {
    /// A validator for `nodes` slots; a record whose version has not moved for
    /// `stale_after` is stale.
    pub fn new(key: ClusterKey, nodes: usize, stale_after: Duration) -> Self {
        RecordValidator { key, stale_after, seen: vec![None; nodes], counters: ValidatorCounters::default() }
    }

    /// Counters so far.
    pub fn counters(&self) -> ValidatorCounters {
        self.counters
    }

    /// Counts a copy that stayed torn after the reader's retries.
    pub fn note_torn(&mut self) {
        self.counters.torn += 1;
    }

    /// How long a record may keep its version and still be accepted.
    pub fn stale_after(&self) -> Duration {
        self.stale_after
    }

    /// Judges one copy of `slot`'s record taken at `now`.
    pub fn accept(
        &mut self,
        now: Instant,
        slot: NodeIndex,
        words: &[u64; SLOT_WORDS],
    ) -> Result<LoadRecord, Rejection> {
        let (version, record) = match LoadRecord::decode(words, &self.key, slot) {
            Ok(v) => v,
            Err(DecodeError::Empty) => return Err(Rejection::Absent),
            Err(DecodeError::Torn) => {
                self.counters.torn += 1;
                return Err(Rejection::Torn);
            }
            Err(DecodeError::BadMac | DecodeError::Impossible) => {
                self.counters.forged += 1;
                tracing::debug!(%slot, "ignored a forged load record");
                return Err(Rejection::Forged);
            }
        };
        let Some(entry) = self.seen.get_mut(slot.get()) else {
            self.counters.forged += 1;
            return Err(Rejection::Forged);
        };
        match entry {
            Some(s) if s.incarnation == record.incarnation && version < s.version => {
                self.counters.stale += 1;
                tracing::debug!(%slot, version, last = s.version, "ignored a replayed load record");
                return Err(Rejection::Stale);
            }
            Some(s) if s.incarnation == record.incarnation && version == s.version => {
                if now.saturating_duration_since(s.changed_at) > self.stale_after {
                    self.counters.stale += 1;
                    return Err(Rejection::Stale);
                }
            }
            _ => *entry = Some(Seen { incarnation: record.incarnation, version, changed_at: now }),
        }
        self.counters.accepted += 1;
        Ok(record)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::role::Tier;

    fn sample() -> LoadRecord {
        LoadRecord {
            node: 3,
            incarnation: 77,
            addr: Some("127.0.0.1:8080".parse().unwrap()),
            serving: Some(Role::new(1, Tier::App)),
            draining: true,
            applied_epoch: 9,
            workers: 4,
            busy_milli: 2500,
            queued_milli: 12_000,
            connections: 40,
            cache_hit_permille: 900,
            backend_share_permille: 100,
            cpu_permille: 300,
            requests_per_s: 1234,
            completed: 1 << 40,
        }
    }

    #[test]
    fn round_trips() {
        let key = ClusterKey::new(b"k");
        let w = sample().encode(&key, 8);
        assert_eq!(LoadRecord::decode(&w, &key, NodeIndex(3)), Ok((8, sample())));
    }

    #[test]
    fn wrong_key_or_slot_is_rejected() {
        let key = ClusterKey::new(b"k");
        let w = sample().encode(&key, 8);
        assert_eq!(LoadRecord::decode(&w, &ClusterKey::new(b"other"), NodeIndex(3)), Err(DecodeError::BadMac));
        assert_eq!(LoadRecord::decode(&w, &key, NodeIndex(2)), Err(DecodeError::Impossible));
    }

    /// An address without a port is not something `encode` writes: such words are refused
    /// rather than read as "no address" (found by `fuzz/fuzz_targets/dc_load_record.rs`:
    /// the words decoded but did not encode back).
    #[test]
    fn an_address_without_a_port_is_impossible() {
        let key = ClusterKey::new(b"k");
        let mut w = sample().encode(&key, 8);
        w[1] &= !(0xffff << 16);
        w[SLOT_WORDS - 1] = key.mac(&w[..SLOT_WORDS - 1]);
        assert_eq!(LoadRecord::decode(&w, &key, NodeIndex(3)), Err(DecodeError::Impossible));
        let none = LoadRecord { addr: None, ..sample() };
        assert_eq!(LoadRecord::decode(&none.encode(&key, 8), &key, NodeIndex(3)), Ok((8, none)));
    }

    #[test]
    fn hex_key_round_trips() {
        let k = ClusterKey::random();
        assert_eq!(ClusterKey::from_hex(&k.to_hex()).unwrap().0, k.0);
        assert!(ClusterKey::from_hex("abc").is_none());
    }
}
