//! The cluster registry: a replicated key-value store applied in GUP order on every node,
//! with linearizable gets, watches and snapshots. Sans-IO like [`Gup`], which it wraps: the
//! host feeds it the same inputs and serves the same outputs (see [`RegistryEvent`]).
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Instant;
//! use ulnet_registry::gup::{Gup, GupConfig, NodeId, View};
//! use ulnet_registry::{Registry, RegistryEvent};
//!
//! // A one-node cluster: the node is its own majority.
//! let now = Instant::now();
//! let gup = Gup::bootstrap(NodeId(0), vec![NodeId(0)], GupConfig::local(), now);
//! let mut reg = Registry::new(gup, 1000);
//! reg.handle_view(now, View::new(1, vec![NodeId(0)]));
//! let watch = reg.watch(b"svc/".to_vec());
//! let set = reg.set(now, b"svc/web".to_vec(), b"10.0.0.7:80".to_vec()).unwrap();
//! // Drive it: persist what it asks for (here: pretend each record is fsynced at once).
//! let mut done = false;
//! for _ in 0..100 {
//!     while let Some(ev) = reg.poll_event() {
//!         match ev {
//!             RegistryEvent::Persist { lsn, .. } => reg.handle_durable(now, lsn),
//!             RegistryEvent::SetDone { id, .. } => done |= id == set,
//!             _ => {}
//!         }
//!     }
//!     reg.handle_timeout(now);
//! }
//! assert!(done);
//! assert_eq!(reg.get_local(b"svc/web"), Some(&b"10.0.0.7:80"[..]));
//! ```

use crate::gup::{Event, Gup, NodeId, ReadId, Record, SubmitError, UpdateId, View};
use crate::store::{Op, Store, KEY_BYTES_MAX, VALUE_BYTES_MAX};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Instant;

/// A linearizable get, as numbered by [`Registry::get`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GetId(pub u64);

/// A watch, as numbered by [`Registry::watch`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WatchId(pub u64);

/// Why a set or delete was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SetError {
    /// The key is longer than [`KEY_BYTES_MAX`].
    #[error("key of {0} bytes exceeds the limit of {KEY_BYTES_MAX}")]
    KeyTooLarge(usize),
    /// The value is longer than [`VALUE_BYTES_MAX`].
    #[error("value of {0} bytes exceeds the limit of {VALUE_BYTES_MAX}")]
    ValueTooLarge(usize),
    /// GUP refused the update.
    #[error(transparent)]
    Submit(#[from] SubmitError),
}

/// What the registry asks of its host or tells it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RegistryEvent {
    /// Append to the write-ahead log, then call [`Registry::handle_durable`] (as
    /// [`Event::Persist`]).
    Persist {
        /// Log sequence number.
        lsn: u64,
        /// The record.
        record: Record,
    },
    /// The set or delete is committed (fsynced on a majority of the voting members) and
    /// applied here at `seq`.
    SetDone {
        /// The operation.
        id: UpdateId,
        /// Its log position.
        seq: u64,
    },
    /// Not committed within the timeout: it may or may not take effect.
    SetIndeterminate {
        /// The operation.
        id: UpdateId,
    },
    /// A linearizable get's answer.
    GetDone {
        /// The get.
        id: GetId,
        /// The value (None: no such key).
        value: Option<Vec<u8>>,
        /// Log position the answer reflects.
        seq: u64,
    },
    /// The get could not be confirmed in time.
    GetFailed {
        /// The get.
        id: GetId,
    },
    /// A watched key changed (None: deleted).
    Changed {
        /// The watch.
        watch: WatchId,
        /// The key.
        key: Vec<u8>,
        /// The new value.
        value: Option<Vec<u8>>,
        /// The position of the change.
        seq: u64,
    },
    /// The whole state was replaced by a snapshot from a peer: watchers should re-read.
    Reset {
        /// The snapshot's position.
        seq: u64,
    },
}

/// The replicated registry of one node. See the module documentation.
pub struct Registry {
    gup: Gup,
    store: Store,
    snapshot_every: u64,
    watches: Vec<(WatchId, Vec<u8>)>,
    next_watch: u64,
    gets: HashMap<ReadId, (GetId, Vec<u8>)>,
    next_get: u64,
    events: VecDeque<RegistryEvent>,
    /// Updates that did not decode as registry operations (skipped, counted).
    pub malformed_ops: u64,
}

impl Registry {
    /// `config` with the registry's snapshot check (use it for the [`Gup`] under a
    /// registry, so that a bad snapshot from the network is refused before it is installed).
    pub fn config(config: crate::gup::GupConfig) -> crate::gup::GupConfig {
        crate::gup::GupConfig { snapshot_valid: |d| Store::from_snapshot(d).is_ok(), ..config }
    }

    /// A registry over `gup` (fresh, or recovered from its log: the last snapshot record of
    /// the log is the starting state). A snapshot is taken every `snapshot_every` applied
    /// positions, and the log before it dropped.
    pub fn new(gup: Gup, snapshot_every: u64) -> Self {
        Self::with_store(gup, Store::default(), snapshot_every)
    }

    /// A registry recovered from `records` (the same records `gup` was recovered from).
    pub fn recover(gup: Gup, records: &[Record], snapshot_every: u64) -> Self {
        let store = records
            .iter()
            .rev()
            .find_map(|r| match r {
                Record::Snapshot { snapshot, .. } => Store::from_snapshot(&snapshot.data).ok(),
                _ => None,
            })
            .unwrap_or_default();
        Self::with_store(gup, store, snapshot_every)
    }

    fn with_store(gup: Gup, store: Store, snapshot_every: u64) -> Self {
        Self {
            gup,
            store,
            snapshot_every: snapshot_every.max(1),
            watches: Vec::new(),
            next_watch: 0,
            gets: HashMap::new(),
            next_get: 0,
            events: VecDeque::new(),
            malformed_ops: 0,
        }
    }

    /// The GUP participant underneath.
    pub fn gup(&self) -> &Gup {
        &self.gup
    }

    /// The local state (reflects what this node applied; may lag the cluster).
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The local value of `key` (possibly stale; use [`Registry::get`] for a linearizable
    /// read).
    pub fn get_local(&self, key: &[u8]) -> Option<&[u8]> {
        self.store.get(key).map(|v| v.value.as_slice())
    }

    /// Sets `key` to `value` cluster-wide.
    pub fn set(&mut self, now: Instant, key: Vec<u8>, value: Vec<u8>) -> Result<UpdateId, SetError> {
        if key.len() > KEY_BYTES_MAX {
            return Err(SetError::KeyTooLarge(key.len()));
        }
        if value.len() > VALUE_BYTES_MAX {
            return Err(SetError::ValueTooLarge(value.len()));
        }
        self.submit(now, Op::Set { key, value })
    }

    /// Deletes `key` cluster-wide.
    pub fn delete(&mut self, now: Instant, key: Vec<u8>) -> Result<UpdateId, SetError> {
        if key.len() > KEY_BYTES_MAX {
            return Err(SetError::KeyTooLarge(key.len()));
        }
        self.submit(now, Op::Delete { key })
    }

    fn submit(&mut self, now: Instant, op: Op) -> Result<UpdateId, SetError> {
        Ok(self.gup.submit(now, Arc::from(op.encode()))?)
    }

    /// A linearizable get: answered with [`RegistryEvent::GetDone`] once the local state
    /// reflects every update committed before this call.
    pub fn get(&mut self, now: Instant, key: Vec<u8>) -> GetId {
        let id = GetId(self.next_get);
        self.next_get += 1;
        let read = self.gup.read(now);
        self.gets.insert(read, (id, key));
        id
    }

    /// Watches keys starting with `prefix` (empty: all keys).
    pub fn watch(&mut self, prefix: Vec<u8>) -> WatchId {
        let id = WatchId(self.next_watch);
        self.next_watch += 1;
        self.watches.push((id, prefix));
        id
    }

    /// Stops a watch.
    pub fn unwatch(&mut self, id: WatchId) {
        self.watches.retain(|(w, _)| *w != id);
    }

    /// See [`Gup::handle_view`].
    pub fn handle_view(&mut self, now: Instant, view: View) {
        self.gup.handle_view(now, view);
    }

    /// See [`Gup::handle_message`].
    pub fn handle_message(&mut self, now: Instant, from: NodeId, bytes: &[u8]) {
        self.gup.handle_message(now, from, bytes);
    }

    /// See [`Gup::handle_timeout`].
    pub fn handle_timeout(&mut self, now: Instant) {
        self.gup.handle_timeout(now);
    }

    /// See [`Gup::handle_durable`].
    pub fn handle_durable(&mut self, now: Instant, lsn: u64) {
        self.gup.handle_durable(now, lsn);
    }

    /// See [`Gup::poll_timeout`].
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.gup.poll_timeout()
    }

    /// See [`Gup::poll_transmit`].
    pub fn poll_transmit(&mut self) -> Option<(NodeId, Vec<u8>)> {
        self.gup.poll_transmit()
    }

    /// The next event for the host. Poll after handling all the input at hand: the locker
    /// grants the lock requests that arrived meanwhile together here.
    pub fn poll_event(&mut self) -> Option<RegistryEvent> {
        loop {
            if let Some(ev) = self.events.pop_front() {
                return Some(ev);
            }
            let ev = self.gup.poll_event()?;
            self.take(ev);
        }
    }

    /// Turns one GUP event into registry events.
    fn take(&mut self, ev: Event) {
        match ev {
            Event::Persist { lsn, record } => self.events.push_back(RegistryEvent::Persist { lsn, record }),
            Event::Apply { seq, entry } => {
                let mut ops = Vec::new();
                for u in entry.updates() {
                    match Op::decode(u) {
                        Ok(op) => ops.push(op),
                        Err(error) => {
                            self.malformed_ops += 1;
                            tracing::warn!(seq, %error, "skipped an update that is not a registry operation");
                        }
                    }
                }
                let (watches, events) = (&self.watches, &mut self.events);
                self.store.apply(seq, ops, |key, value| {
                    for (watch, prefix) in watches {
                        if key.starts_with(prefix) {
                            let (watch, key, value) = (*watch, key.to_vec(), value.map(<[u8]>::to_vec));
                            events.push_back(RegistryEvent::Changed { watch, key, value, seq });
                        }
                    }
                });
                if seq % self.snapshot_every == 0 {
                    self.gup.compact(seq, Arc::from(self.store.snapshot()));
                }
            }
            Event::InstallSnapshot { seq, data } => match Store::from_snapshot(&data) {
                Ok(store) => {
                    self.store = store;
                    self.events.push_back(RegistryEvent::Reset { seq });
                }
                Err(error) => {
                    // GUP checked it with `snapshot_valid` (set by `Registry::config`),
                    // so only a host that left the check out gets here.
                    tracing::error!(seq, %error, "a snapshot from a peer does not decode; state kept");
                }
            },
            Event::Committed { id, seq } => self.events.push_back(RegistryEvent::SetDone { id, seq }),
            Event::Indeterminate { id } => self.events.push_back(RegistryEvent::SetIndeterminate { id }),
            Event::ReadReady { id, .. } => {
                if let Some((get, key)) = self.gets.remove(&id) {
                    let value = self.store.get(&key).map(|v| v.value.clone());
                    self.events.push_back(RegistryEvent::GetDone { id: get, value, seq: self.store.applied() });
                }
            }
            Event::ReadFailed { id } => {
                if let Some((get, _)) = self.gets.remove(&id) {
                    self.events.push_back(RegistryEvent::GetFailed { id: get });
                }
            }
        }
    }
}
