//! The registry's state: keys and values applied in GUP order, its operations' encoding and
//! its snapshot format.

use crate::codec::{DecodeError, Reader, Writer, UPDATE_BYTES_MAX};
use std::collections::BTreeMap;

/// Largest key.
pub const KEY_BYTES_MAX: usize = 4096;
/// Largest value (key, value and framing stay under one GUP update).
pub const VALUE_BYTES_MAX: usize = UPDATE_BYTES_MAX - KEY_BYTES_MAX - 16;

/// One registry operation, as carried in a GUP update.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// Set `key` to `value`.
    Set {
        /// Key.
        key: Vec<u8>,
        /// Value.
        value: Vec<u8>,
    },
    /// Remove `key`.
    Delete {
        /// Key.
        key: Vec<u8>,
    },
}

// Operation kinds: append-only; never reuse a number.
const SET: u8 = 1;
const DELETE: u8 = 2;

impl Op {
    /// Encodes the operation.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        match self {
            Op::Set { key, value } => {
                w.u8(SET);
                w.blob(key);
                w.blob(value);
            }
            Op::Delete { key } => {
                w.u8(DELETE);
                w.blob(key);
            }
        }
        w.buf
    }

    /// Decodes an operation.
    pub fn decode(buf: &[u8]) -> Result<Op, DecodeError> {
        let mut r = Reader::new(buf);
        let op = match r.u8()? {
            SET => Op::Set {
                key: r.blob("key", KEY_BYTES_MAX)?.to_vec(),
                value: r.blob("value", VALUE_BYTES_MAX)?.to_vec(),
            },
            DELETE => Op::Delete { key: r.blob("key", KEY_BYTES_MAX)?.to_vec() },
            tag => return Err(DecodeError::UnknownTag { what: "registry operation", tag }),
        };
        r.finish()?;
        Ok(op)
    }

    /// The key the operation changes.
    pub fn key(&self) -> &[u8] {
        match self {
            Op::Set { key, .. } | Op::Delete { key } => key,
        }
    }
}

/// A value and the log position that last set it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Versioned {
    /// The value.
    pub value: Vec<u8>,
    /// Position of the update that set it.
    pub seq: u64,
}

/// The registry's keys and values after applying the log up to [`Store::applied`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Store {
    map: BTreeMap<Vec<u8>, Versioned>,
    applied: u64,
}

impl Store {
    /// Position applied.
    pub fn applied(&self) -> u64 {
        self.applied
    }

    /// The value of `key`.
    pub fn get(&self, key: &[u8]) -> Option<&Versioned> {
        self.map.get(key)
    }

    /// Keys stored.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether no key is stored.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Keys starting with `prefix`, in order.
    pub fn range_prefix<'a>(&'a self, prefix: &'a [u8]) -> impl Iterator<Item = (&'a [u8], &'a Versioned)> + 'a {
        self.map
            .range(prefix.to_vec()..)
            .take_while(move |(k, _)| k.starts_with(prefix))
            .map(|(k, v)| (k.as_slice(), v))
    }

    /// Applies the operations of position `seq` (undecodable ones are counted out by the
    /// caller and skipped), telling `changed` each key that changed and its new value (None:
    /// deleted). Every node applies every update, so this is per-update work times the
    /// cluster's size: a key that exists keeps its allocation and takes the decoded value's.
    pub fn apply(
        &mut self,
        seq: u64,
        ops: impl IntoIterator<Item = Op>,
        mut changed: impl FnMut(&[u8], Option<&[u8]>),
    ) {
        assert_eq!(seq, self.applied + 1, "registry positions applied in order");
        self.applied = seq;
        for op in ops {
            match op {
                Op::Set { key, value } => {
                    changed(&key, Some(&value));
                    match self.map.get_mut(&key) {
                        Some(v) => *v = Versioned { value, seq },
                        None => {
                            self.map.insert(key, Versioned { value, seq });
                        }
                    }
                }
                Op::Delete { key } => {
                    if self.map.remove(&key).is_some() {
                        changed(&key, None);
                    }
                }
            }
        }
    }

    /// The snapshot: `applied u64 | count u64 | (key blob | value blob | seq u64)*`.
    pub fn snapshot(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.u64(self.applied);
        w.u64(self.map.len() as u64);
        for (k, v) in &self.map {
            w.blob(k);
            w.blob(&v.value);
            w.u64(v.seq);
        }
        w.buf
    }

    /// Reads a snapshot.
    pub fn from_snapshot(buf: &[u8]) -> Result<Store, DecodeError> {
        let mut r = Reader::new(buf);
        let applied = r.u64()?;
        let n = r.u64()?;
        if n > buf.len() as u64 / 16 {
            return Err(DecodeError::TooLarge { what: "snapshot keys", got: n, limit: buf.len() as u64 / 16 });
        }
        let mut map = BTreeMap::new();
        for _ in 0..n {
            let key = r.blob("key", KEY_BYTES_MAX)?.to_vec();
            let value = r.blob("value", VALUE_BYTES_MAX)?.to_vec();
            let seq = r.u64()?;
            if seq > applied {
                return Err(DecodeError::Invalid("a key set after the snapshot's position"));
            }
            if map.insert(key, Versioned { value, seq }).is_some() {
                return Err(DecodeError::Invalid("a key twice in a snapshot"));
            }
        }
        r.finish()?;
        Ok(Store { map, applied })
    }
}
