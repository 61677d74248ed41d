//! The registry inside `ulnet node`: a [`Service`] of the node runtime that runs one
//! [`Registry`] over the membership's views, with its write-ahead log in the node's data
//! directory (`DIR/registry`), GUP messages to the same service on the other members, and
//! the client methods of [`crate::client`] on the node's address.
//!
//! The node's membership id is the GUP node id. The first view decides how the registry
//! starts: a node whose log is empty and whose first view holds only itself (view 1: it
//! formed the cluster) creates the registry's first configuration; any other node with an
//! empty log joins, is brought up to date by state transfer and then voted in; a node with
//! a log recovers from it. A torn tail (a write whose fsync never returned) is cut and the
//! node goes on as itself; a node whose log was corrupted must come back under a new
//! membership id: [`prepare`] sees to it before the node starts.
//!
//! When the disk fails under a running registry (no space, a quota, an I/O error), the
//! registry stops, its clients are told why and that it retries, and it starts again in
//! place from its log once the disk takes writes again ([`disk`]); `registry status` shows
//! the cause and counts the stops and restarts.
//!
//! Everything runs on the node's control thread. Input (GUP messages, client requests) is
//! handed to the machine as it comes; its output is collected once per batch in `on_tick`,
//! so that the lock requests that arrived together are granted together; and the log is
//! written and fsynced once per batch in `on_sent`, after the batch's messages went out
//! (group commit without a writer thread: two thread switches fewer per batch, which
//! counts when 32 nodes share two cores).

pub mod disk;

use crate::client::{self, GetAnswer, Outcome, RegistryStatus, UpdateAnswer};
use crate::gup::{GupConfig, NodeId, Recovered, UpdateId, View};
use crate::wal::{self, InlineWal, WalError};
use crate::{GetId, Registry, RegistryEvent, SetError};
use disk::Stopped;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;
use ulnet_cluster::service::{ReplyToken, Service, ServiceContext, Status};
use ulnet_cluster::view::MemberId;

/// The registry's service id on the wire.
pub const SERVICE_ID: u16 = 20;

/// Default positions between snapshots (and log truncations). A snapshot costs a copy of
/// the state; 10,000 updates of a registry of a few thousand keys cost far more in log.
pub const SNAPSHOT_EVERY: u64 = 10_000;

/// The registry's directory inside a node's data directory.
pub fn registry_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("registry")
}

/// What [`prepare`] found.
pub struct Prepared {
    /// The log's records, and the tail cut or refused.
    pub recovery: wal::Recovery,
    /// The node must take a new membership identity (its log lost what it promised).
    pub new_identity: bool,
}

/// Reads the registry's log in `data_dir` before the node starts. A torn tail (a write
/// whose fsync never returned) is cut and the node goes on as itself. A corrupted tail is
/// reported, and the node's membership identity is set aside
/// (`ulnet_cluster::runtime::forget_identity`) so that it comes back as a new member: the
/// old identity may have promised and acknowledged what the lost tail held. The identity
/// is set aside before the log is cut, so that a crash in between finds the corruption
/// again rather than a clean log under the old identity.
pub fn prepare(data_dir: &Path) -> std::io::Result<Prepared> {
    let scan = wal::scan(&registry_dir(data_dir))?;
    let new_identity = scan.refused().is_some_and(|r| r.kind == wal::TailKind::Corrupt);
    if let Some(r) = scan.refused().filter(|_| new_identity) {
        tracing::warn!(
            file = %r.file.display(), offset = r.offset, bytes = r.bytes, reason = %r.reason,
            "registry log: refused a corrupted tail; this node rejoins as a new member and recovers the rest from its peers"
        );
        ulnet_cluster::runtime::forget_identity(data_dir)?;
    }
    Ok(Prepared { recovery: scan.cut()?, new_identity })
}

struct Running {
    reg: Registry,
    wal: InlineWal,
}

/// Where the registry of a node is in its life.
enum State {
    /// Waiting for the first view, with the log [`prepare`] read.
    Waiting(Recovered),
    /// Boxed: the machine is large, and a registry spends its life in this state.
    Running(Box<Running>),
    /// Stopped by its disk (see [`disk`]).
    Stopped(Stopped),
}

/// The registry service. See the module documentation.
pub struct RegistryService {
    dir: PathBuf,
    config: GupConfig,
    snapshot_every: u64,
    state: State,
    /// The latest view: a registry that starts again in place starts from it.
    view: Option<View>,
    sets: HashMap<UpdateId, ReplyToken>,
    gets: HashMap<GetId, ReplyToken>,
    /// Times a disk failure stopped the registry.
    disk_failures: u64,
    /// Times it started again in place from its log.
    restarts: u64,
}

impl RegistryService {
    /// A service over the log [`prepare`] read in `data_dir`.
    pub fn new(data_dir: &Path, prepared: Prepared, config: GupConfig) -> Self {
        Self {
            dir: registry_dir(data_dir),
            config: Registry::config(config),
            snapshot_every: SNAPSHOT_EVERY,
            state: State::Waiting(prepared.recovery.recovered),
            view: None,
            sets: HashMap::new(),
            gets: HashMap::new(),
            disk_failures: 0,
            restarts: 0,
        }
    }

    /// Takes a snapshot every `n` applied positions instead of [`SNAPSHOT_EVERY`].
    pub fn with_snapshot_every(mut self, n: u64) -> Self {
        self.snapshot_every = n;
        self
    }

    /// Starts the registry from `recovered` (the log's records) in `view`: the machine, the
    /// store, and a new log segment to append to.
    fn open(&self, me: NodeId, view: &View, recovered: Recovered, now: Instant) -> Result<Running, WalError> {
        let records = recovered.records.clone();
        let first_node = records.is_empty() && view.id == 1 && view.members == [me];
        let gup = if first_node {
            tracing::info!(node = %me, "registry: forming the cluster's first configuration");
            crate::gup::Gup::bootstrap(me, vec![me], self.config.clone(), now)
        } else {
            crate::gup::Gup::recover(me, self.config.clone(), recovered, now)
        };
        let reg = Registry::recover(gup, &records, self.snapshot_every);
        let wal = InlineWal::open(&self.dir).map_err(|e| WalError::from_io(&self.dir, &e))?;
        Ok(Running { reg, wal })
    }

    /// Starts the registry from `recovered` at `now` (its first start, or again in place),
    /// in the latest view — or stops it when the log cannot be opened.
    fn start(&mut self, me: NodeId, recovered: Recovered, now: Instant) {
        let Some(view) = self.view.clone() else {
            self.state = State::Waiting(recovered);
            return;
        };
        let mark = match &self.state {
            State::Stopped(s) => s.mark(),
            _ => None,
        };
        match self.open(me, &view, recovered, now) {
            Ok(mut run) => {
                run.reg.handle_view(now, view);
                self.state = State::Running(Box::new(run));
            }
            Err(e) => {
                self.disk_failures += 1;
                self.state = State::Stopped(Stopped::new(&self.dir, e, mark, now));
            }
        }
    }

    /// The disk failed: the node can no longer make promises durable, so its registry stops
    /// taking part (the others go on without it), everyone waiting is told why (a set it
    /// took may still take effect: its messages may have left), and the disk is tried again
    /// every [`disk::DISK_RETRY_INTERVAL`].
    fn stop(&mut self, error: WalError, now: Instant, ctx: &mut ServiceContext<'_>) {
        let mark = match std::mem::replace(&mut self.state, State::Waiting(Recovered::default())) {
            State::Running(run) => Some(run.wal.durable_mark()),
            State::Stopped(s) => s.mark(),
            State::Waiting(_) => None,
        };
        self.disk_failures += 1;
        let stopped = Stopped::new(&self.dir, error, mark, now);
        let why = stopped.cause().to_string();
        self.state = State::Stopped(stopped);
        for (_, token) in self.sets.drain() {
            // Its lock request or its entry may have left already: not refused, undecided.
            let message = format!("{why}; the update may still take effect");
            let answer = UpdateAnswer { outcome: Outcome::Indeterminate, seq: 0, message };
            ctx.reply(token, Ok(client::encode_update_answer(&answer)));
        }
        for (_, token) in self.gets.drain() {
            ctx.reply(token, Ok(refused_get(why.clone())));
        }
    }

    /// A stopped registry whose disk takes writes again starts in place from its log.
    fn try_restart(&mut self, now: Instant, ctx: &mut ServiceContext<'_>) {
        let State::Stopped(stopped) = &mut self.state else { return };
        let Some(recovered) = stopped.try_reopen(&self.dir, now) else { return };
        self.restarts += 1;
        self.start(NodeId(ctx.me().id.0), recovered, now);
    }

    fn status(&self, me: &MemberId) -> RegistryStatus {
        let mut status = RegistryStatus {
            node: me.to_string(),
            disk_failures: self.disk_failures,
            restarts: self.restarts,
            ..RegistryStatus::default()
        };
        let run = match &self.state {
            State::Running(run) => run,
            State::Stopped(s) => return RegistryStatus { stopped: s.cause().to_string(), ..status },
            State::Waiting(_) => return status,
        };
        let g = run.reg.gup();
        let e = g.epoch();
        status.running = true;
        status.epoch = format!("e{}.{}/{}", e.view, e.round, MemberId(e.locker.0));
        status.normal = g.is_normal();
        status.locker = g.is_locker();
        status.applied = g.applied();
        status.committed = g.committed();
        status.voters = g
            .applied_config()
            .map(|c| c.voters.iter().map(|n| MemberId(n.0).to_string()).collect())
            .unwrap_or_default();
        status.keys = run.reg.store().len() as u64;
        status
    }

    /// Hands the machine's output to the node: records to the log, answers to the clients
    /// waiting, messages to the other members.
    fn drain(&mut self, now: Instant, ctx: &mut ServiceContext<'_>) {
        let State::Running(run) = &mut self.state else { return };
        let mut failure = None;
        while let Some(ev) = run.reg.poll_event() {
            match ev {
                RegistryEvent::Persist { lsn, record } => {
                    if let Err(e) = run.wal.append(lsn, &record) {
                        failure = Some(e);
                        break;
                    }
                }
                RegistryEvent::SetDone { id, seq } => {
                    if let Some(token) = self.sets.remove(&id) {
                        let answer = UpdateAnswer { outcome: Outcome::Done, seq, message: String::new() };
                        ctx.reply(token, Ok(client::encode_update_answer(&answer)));
                    }
                }
                RegistryEvent::SetIndeterminate { id } => {
                    if let Some(token) = self.sets.remove(&id) {
                        let message = "not committed in time; it may still take effect".to_string();
                        let answer = UpdateAnswer { outcome: Outcome::Indeterminate, seq: 0, message };
                        ctx.reply(token, Ok(client::encode_update_answer(&answer)));
                    }
                }
                RegistryEvent::GetDone { id, value, seq } => {
                    if let Some(token) = self.gets.remove(&id) {
                        let answer = GetAnswer { outcome: Outcome::Done, seq, value, message: String::new() };
                        ctx.reply(token, Ok(client::encode_get_answer(&answer)));
                    }
                }
                RegistryEvent::GetFailed { id } => {
                    if let Some(token) = self.gets.remove(&id) {
                        let message = "could not confirm the read in time".to_string();
                        let answer = GetAnswer { outcome: Outcome::Indeterminate, seq: 0, value: None, message };
                        ctx.reply(token, Ok(client::encode_get_answer(&answer)));
                    }
                }
                RegistryEvent::Reset { seq } => {
                    tracing::info!(seq, "registry: state transferred from a peer (snapshot at position {seq})");
                }
                RegistryEvent::Changed { .. } => {}
            }
        }
        if let Some(error) = failure {
            self.stop(error, now, ctx);
            return;
        }
        while let Some((to, bytes)) = run.reg.poll_transmit() {
            ctx.send(MemberId(to.0), bytes);
        }
    }

    fn not_running(&self) -> String {
        match &self.state {
            State::Stopped(s) => s.cause().to_string(),
            _ => "this node's registry has not started (no view yet)".into(),
        }
    }
}

fn refused(message: String) -> Vec<u8> {
    client::encode_update_answer(&UpdateAnswer { outcome: Outcome::Refused, seq: 0, message })
}

fn refused_get(message: String) -> Vec<u8> {
    client::encode_get_answer(&GetAnswer { outcome: Outcome::Refused, seq: 0, value: None, message })
}

impl Service for RegistryService {
    fn name(&self) -> &'static str {
        "registry"
    }

    fn id(&self) -> u16 {
        SERVICE_ID
    }

    fn request_methods(&self) -> Vec<u16> {
        vec![client::METHOD_SET, client::METHOD_GET, client::METHOD_DELETE, client::METHOD_STATUS]
    }

    fn on_view(&mut self, view: &ulnet_cluster::View, ctx: &mut ServiceContext<'_>) {
        let now = Instant::now();
        let view = View::new(view.id, view.members.iter().map(|m| NodeId(m.id.0)).collect());
        self.view = Some(view.clone());
        match &mut self.state {
            State::Waiting(recovered) => {
                let recovered = std::mem::take(recovered);
                self.start(NodeId(ctx.me().id.0), recovered, now);
            }
            State::Running(run) => run.reg.handle_view(now, view),
            State::Stopped(_) => {}
        }
    }

    fn on_message(&mut self, from: MemberId, data: &[u8], _ctx: &mut ServiceContext<'_>) {
        if let State::Running(run) = &mut self.state {
            run.reg.handle_message(Instant::now(), NodeId(from.0), data);
        }
    }

    fn on_request(&mut self, method: u16, payload: &[u8], reply: ReplyToken, ctx: &mut ServiceContext<'_>) {
        let now = Instant::now();
        if method == client::METHOD_STATUS {
            let json = serde_json::to_vec(&self.status(&ctx.me().id)).unwrap_or_default();
            ctx.reply(reply, Ok(json));
            return;
        }
        let State::Running(run) = &mut self.state else {
            let not_running = self.not_running();
            let answer = if method == client::METHOD_GET { refused_get(not_running) } else { refused(not_running) };
            ctx.reply(reply, Ok(answer));
            return;
        };
        match method {
            client::METHOD_SET | client::METHOD_DELETE => {
                let result = if method == client::METHOD_SET {
                    client::decode_set(payload).map(|(k, v)| run.reg.set(now, k, v))
                } else {
                    client::decode_key(payload).map(|k| run.reg.delete(now, k))
                };
                match result {
                    Ok(Ok(id)) => {
                        self.sets.insert(id, reply);
                    }
                    Ok(Err(e @ (SetError::KeyTooLarge(_) | SetError::ValueTooLarge(_) | SetError::Submit(_)))) => {
                        ctx.reply(reply, Ok(refused(e.to_string())))
                    }
                    Err(_) => ctx.reply(reply, Err(Status::Malformed)),
                }
            }
            client::METHOD_GET => match client::decode_key(payload) {
                Ok(key) => {
                    let id = run.reg.get(now, key);
                    self.gets.insert(id, reply);
                }
                Err(_) => ctx.reply(reply, Err(Status::Malformed)),
            },
            _ => ctx.reply(reply, Err(Status::UnknownMethod)),
        }
    }

    fn on_tick(&mut self, now: Instant, ctx: &mut ServiceContext<'_>) {
        self.try_restart(now, ctx);
        if let State::Running(run) = &mut self.state {
            if run.reg.poll_timeout().is_some_and(|t| t <= now) {
                run.reg.handle_timeout(now);
            }
        }
        self.drain(now, ctx);
    }

    fn on_sent(&mut self, now: Instant, ctx: &mut ServiceContext<'_>) {
        // The batch's records: one write and one fsync for all, after its messages left.
        let State::Running(run) = &mut self.state else { return };
        if !run.wal.pending() {
            return;
        }
        match run.wal.sync() {
            Ok(Some(lsn)) => {
                run.reg.handle_durable(now, lsn);
                self.drain(now, ctx);
            }
            Ok(None) => {}
            Err(e) => self.stop(e, now, ctx),
        }
    }

    fn poll_timeout(&self) -> Option<Instant> {
        match &self.state {
            State::Running(run) => run.reg.poll_timeout(),
            State::Stopped(s) => s.next_try(),
            State::Waiting(_) => None,
        }
    }
}
