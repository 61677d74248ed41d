//! Request/response RPC over a ulnet endpoint.
//!
//! One [`Rpc`] owns an [`Endpoint`] and is both client and server on all its channels:
//! [`Rpc::call`] sends a request and the reply arrives as an [`RpcEvent::Reply`] from
//! [`Rpc::poll`]; handlers registered with [`Rpc::register_inline`] run on the polling
//! thread and answer in place (the request is read from the receive queue and the reply
//! written into the channel without an intermediate buffer), handlers registered with
//! [`Rpc::register_pooled`] get a copy of the request on a worker thread.
//!
//! Bounded by construction: outstanding calls live in a slab sized at creation
//! ([`RpcConfig::max_outstanding`]); a call beyond it is refused with
//! [`CallError::TooManyOutstanding`]. The raw-bytes path allocates nothing per call.
//!
//! Channels that go down are closed here: [`Rpc::poll`] fails their calls, reports
//! [`RpcEvent::ChannelDown`], then closes the channel, releasing its socket (a server
//! whose clients come and go keeps no descriptor of theirs). Its id may then be given to
//! a new channel; answers still owed to the old one (deferred replies, results of pooled
//! handlers, replies waiting for room) are dropped rather than sent to the new one, by the
//! channel's incarnation ([`ulnet_core::Endpoint::channel_incarnation`]).

use crate::am::{self, AmMessage, AmReplier, AmReplyHandler, AmRequestHandler, AM_ARGS};
use crate::pool::WorkerPool;
use crate::wire::{Header, Kind, Status, HEADER_LEN};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};
use ulnet_core::trace;
use ulnet_core::{ChannelError, ChannelId, Endpoint, Event, ReplyTo, SendError, SendOutcome};

/// Most buffers of a request or reply payload (one more, the header, makes the gather list).
pub const PAYLOAD_GATHER_MAX: usize = ulnet_core::GATHER_MAX - 1;

/// Settings of an [`Rpc`].
#[derive(Clone, Debug)]
pub struct RpcConfig {
    /// Calls that may be outstanding at once (the slab size). 4,096: enough to keep every
    /// channel of a 32-node cluster 128 calls deep.
    pub max_outstanding: usize,
    /// Largest request payload a server accepts; larger ones get `PayloadTooLarge`.
    /// 16 MiB: bulk data belongs in RMA or streams, not in one call.
    pub max_request_len: u64,
    /// Worker threads for pooled handlers (0: pooled handlers cannot be registered).
    pub workers: usize,
}

impl Default for RpcConfig {
    fn default() -> Self {
        Self { max_outstanding: 4096, max_request_len: 16 << 20, workers: 2 }
    }
}

/// Identifies an outstanding call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CallId(pub u64);

/// Why a call failed. One enum for the call family (STYLE §12).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    /// The server has no handler for the method.
    #[error("unknown method")]
    UnknownMethod,
    /// No reply before the deadline (at the client), or the server saw the deadline pass.
    #[error("deadline exceeded")]
    DeadlineExceeded,
    /// The channel to the server failed before the reply arrived.
    #[error("the channel went down before the answer came: {0}")]
    PeerFailed(ChannelError),
    /// The request was larger than the server or the transport accepts.
    #[error("payload too large")]
    PayloadTooLarge,
    /// The server could not decode the request.
    #[error("malformed request")]
    Malformed,
    /// The server's handler failed.
    #[error("handler failed")]
    HandlerFailed,
    /// More calls are outstanding than the configured maximum.
    #[error("too many outstanding calls")]
    TooManyOutstanding,
    /// The request could not be sent.
    #[error("send failed: {0}")]
    Send(String),
}

impl From<SendError> for CallError {
    fn from(e: SendError) -> Self {
        match e {
            SendError::TooLarge { .. } => CallError::PayloadTooLarge,
            SendError::ChannelDown(e) => CallError::PeerFailed(e),
            e => CallError::Send(e.to_string()),
        }
    }
}

impl From<Status> for CallError {
    fn from(s: Status) -> Self {
        match s {
            Status::UnknownMethod => CallError::UnknownMethod,
            Status::DeadlineExceeded => CallError::DeadlineExceeded,
            Status::PayloadTooLarge => CallError::PayloadTooLarge,
            Status::Malformed => CallError::Malformed,
            Status::HandlerFailed => CallError::HandlerFailed,
        }
    }
}

/// Outcome of [`Rpc::call`] that did not fail: back-pressure is an outcome, not an error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use = "NoResource means the request was not sent"]
pub enum CallOutcome {
    /// The request is on its way.
    Sent(CallId),
    /// The channel has no room now; nothing was sent. Poll and retry.
    NoResource,
}

/// What [`Rpc::poll`] reports.
#[derive(Debug)]
pub enum RpcEvent<'a> {
    /// The reply to a call, in place.
    Reply {
        /// The call.
        call: CallId,
        /// Its channel.
        channel: ChannelId,
        /// The reply payload, valid during the callback.
        data: &'a [u8],
    },
    /// A call failed.
    Failed {
        /// The call.
        call: CallId,
        /// Its channel.
        channel: ChannelId,
        /// Why.
        error: CallError,
    },
    /// A channel went down (its outstanding calls were failed first). The [`Rpc`] closes
    /// it after this event: its id may be reused by the next channel opened or accepted.
    ChannelDown {
        /// The channel.
        channel: ChannelId,
        /// Why.
        error: ChannelError,
    },
}

/// A request as an inline handler sees it.
#[derive(Debug)]
pub struct Request<'a> {
    /// The channel it came on.
    pub channel: ChannelId,
    /// Its method.
    pub method: u16,
    /// The payload, in place.
    pub payload: &'a [u8],
}

/// The way an inline handler answers: once, with a gather list, from inside the handler.
/// One-way requests get a `Replier` that sends nothing.
pub struct Replier<'a, 'b> {
    reply: &'a mut ReplyTo<'b>,
    /// The caller waits for an answer (not a one-way call).
    answer: bool,
    header: Header,
    deferred: &'a mut VecDeque<(ReplyTarget, Vec<u8>)>,
    channel: ChannelId,
    replied: bool,
}

/// Where an answer sent later goes: a channel, and the incarnation of it that asked
/// ([`ulnet_core::Endpoint::channel_incarnation`]), so that it never reaches a new channel
/// that took the id of a closed one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ReplyTarget {
    pub(crate) channel: ChannelId,
    pub(crate) incarnation: u64,
}

impl Replier<'_, '_> {
    /// Sends the reply. If the channel has no room at this instant, the reply is copied and
    /// sent at the next poll (it is never lost).
    pub fn reply(&mut self, payload: &[&[u8]]) {
        assert!(payload.len() <= PAYLOAD_GATHER_MAX, "a reply payload has at most {PAYLOAD_GATHER_MAX} buffers");
        assert!(!self.replied, "a request is answered once");
        self.replied = true;
        if !self.answer {
            return;
        }
        let reply = &mut *self.reply;
        let header = self.header.encode();
        let mut gather: [&[u8]; ulnet_core::GATHER_MAX] = [&[]; ulnet_core::GATHER_MAX];
        gather[0] = &header;
        gather[1..=payload.len()].copy_from_slice(payload);
        let kind = self.header.kind.trace_kind();
        match reply.send_as(&gather[..=payload.len()], kind, self.header.request_id) {
            Ok(SendOutcome::Done) => {}
            Ok(_) => {
                let target = ReplyTarget { channel: self.channel, incarnation: reply.channel_incarnation() };
                self.deferred.push_back((target, gather[..=payload.len()].concat()))
            }
            Err(e) => tracing::debug!("reply not sent: {e}"),
        }
    }

    /// Answers with an error status instead of a payload.
    pub fn fail(&mut self, status: Status) {
        self.header.kind = Kind::ErrorReply;
        self.header.status = Some(status);
        self.reply(&[]);
    }

    /// Answers later, outside the handler (when the work the request started is done):
    /// the request stays open until [`Rpc::reply_later`] answers the returned handle, or
    /// the caller's deadline passes. `None` for one-way requests, which get no answer.
    pub fn defer(&mut self) -> Option<DeferredReply> {
        assert!(!self.replied, "a request is answered once");
        self.replied = true;
        if !self.answer {
            return None;
        }
        let target = ReplyTarget { channel: self.channel, incarnation: self.reply.channel_incarnation() };
        Some(DeferredReply { target, header: self.header })
    }
}

/// A request whose answer was deferred ([`Replier::defer`]); answer it once with
/// [`Rpc::reply_later`]. Dropping it leaves the caller to its deadline.
#[derive(Debug)]
pub struct DeferredReply {
    target: ReplyTarget,
    header: Header,
}

impl DeferredReply {
    /// The channel the request came on.
    pub fn channel(&self) -> ChannelId {
        self.target.channel
    }
}

type InlineHandler = Box<dyn FnMut(&Request<'_>, &mut Replier<'_, '_>) + Send>;
type PooledHandler = Arc<dyn Fn(&[u8]) -> Result<Vec<u8>, Status> + Send + Sync>;

enum Handler {
    Inline(InlineHandler),
    Pooled(PooledHandler),
}

/// A finished pooled request waiting to be answered by the polling thread.
struct PooledDone {
    target: ReplyTarget,
    header: Header,
    result: Result<Vec<u8>, Status>,
    /// Whether the caller waits for an answer (not for one-way calls).
    answer: bool,
    /// The request's trace record, with the handler's times (while tracing).
    trace: Option<trace::PendingReceive>,
}

struct CallSlot {
    /// Generation in the high 32 bits of the request id; a stale reply never matches.
    generation: u32,
    channel: Option<ChannelId>,
}

/// Active-message handler tables, indexed by handler id.
#[derive(Default)]
struct AmHandlers {
    requests: Vec<Option<AmRequestHandler>>,
    replies: Vec<Option<AmReplyHandler>>,
}

fn table_set<T>(table: &mut Vec<Option<T>>, id: u16, value: T) {
    let i = id as usize;
    if table.len() <= i {
        table.resize_with(i + 1, || None);
    }
    table[i] = Some(value);
}

/// Counters of an [`Rpc`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RpcCounters {
    /// Requests sent.
    pub calls: u64,
    /// Replies received for outstanding calls.
    pub replies: u64,
    /// Requests served (answered or one-way).
    pub served: u64,
    /// Messages that could not be decoded (dropped, answered with `Malformed` when possible).
    pub malformed: u64,
    /// Requests refused with an error reply.
    pub refused: u64,
    /// Replies for calls no longer outstanding (timed out, cancelled, forged).
    pub stale_replies: u64,
}

/// Reassembly of one fragmented message per channel.
#[derive(Default)]
struct Partial {
    data: Vec<u8>,
    message_len: u64,
    skip: bool,
}

/// Request/response RPC over an endpoint. See the module documentation.
pub struct Rpc {
    ep: Endpoint,
    config: RpcConfig,
    handlers: Vec<Option<Handler>>,
    am: AmHandlers,
    slots: Vec<CallSlot>,
    free_slots: Vec<u32>,
    deadlines: BinaryHeap<Reverse<(Instant, u64)>>,
    partial: Vec<Partial>,
    deferred: VecDeque<(ReplyTarget, Vec<u8>)>,
    pool: Option<WorkerPool>,
    done_tx: mpsc::Sender<PooledDone>,
    done_rx: mpsc::Receiver<PooledDone>,
    /// Pooled requests handed to workers and not yet collected (skips the queue check).
    pooled_in_flight: usize,
    counters: RpcCounters,
    /// The id of the last active-message request sent (ids stay below 2^32).
    am_last_id: u32,
}

impl Rpc {
    /// Wraps an endpoint (with its channels, present and future).
    pub fn new(ep: Endpoint, config: RpcConfig) -> Self {
        let slots = (0..config.max_outstanding).map(|_| CallSlot { generation: 1, channel: None }).collect();
        let free_slots = (0..config.max_outstanding as u32).rev().collect();
        let (done_tx, done_rx) = mpsc::channel();
        let pool = (config.workers > 0).then(|| WorkerPool::new(config.workers));
        Self {
            ep,
            deadlines: BinaryHeap::with_capacity(config.max_outstanding),
            config,
            handlers: Vec::new(),
            am: AmHandlers::default(),
            slots,
            free_slots,
            partial: Vec::new(),
            deferred: VecDeque::new(),
            pool,
            done_tx,
            done_rx,
            pooled_in_flight: 0,
            counters: RpcCounters::default(),
            am_last_id: 0,
        }
    }

    /// The endpoint, to open channels or poll it directly.
    pub fn endpoint(&mut self) -> &mut Endpoint {
        &mut self.ep
    }

    /// Counters so far.
    pub fn counters(&self) -> RpcCounters {
        self.counters
    }

    /// Calls currently outstanding.
    pub fn outstanding(&self) -> usize {
        self.config.max_outstanding - self.free_slots.len()
    }

    fn set_handler(&mut self, method: u16, handler: Handler) {
        let i = method as usize;
        if self.handlers.len() <= i {
            self.handlers.resize_with(i + 1, || None);
        }
        self.handlers[i] = Some(handler);
    }

    /// Registers a handler that runs on the polling thread and answers in place.
    pub fn register_inline(
        &mut self,
        method: u16,
        handler: impl FnMut(&Request<'_>, &mut Replier<'_, '_>) + Send + 'static,
    ) {
        self.set_handler(method, Handler::Inline(Box::new(handler)));
    }

    /// Registers a handler that runs on the worker pool with a copy of the request; its
    /// result is sent by the polling thread. For handlers that block or take long.
    pub fn register_pooled(
        &mut self,
        method: u16,
        handler: impl Fn(&[u8]) -> Result<Vec<u8>, Status> + Send + Sync + 'static,
    ) {
        assert!(self.pool.is_some(), "pooled handlers need RpcConfig::workers > 0");
        self.set_handler(method, Handler::Pooled(Arc::new(handler)));
    }

    /// Registers an active-message request handler; it may answer once with its
    /// [`AmReplier`], which runs a reply handler at the requester.
    pub fn register_am_request(
        &mut self,
        handler: u16,
        f: impl FnMut(&AmMessage<'_>, &mut AmReplier<'_, '_>) + Send + 'static,
    ) {
        table_set(&mut self.am.requests, handler, Box::new(f));
    }

    /// Registers an active-message reply handler. It is given no way to send: reply
    /// handlers cannot reply (the livelock rule of active messages).
    pub fn register_am_reply(&mut self, handler: u16, f: impl FnMut(&AmMessage<'_>) + Send + 'static) {
        table_set(&mut self.am.replies, handler, Box::new(f));
    }

    /// Runs the active-message reply handler `msg.handler` here, as if its reply had
    /// arrived: a bulk get delivers the data it fetched this way. Returns whether a handler
    /// is registered under that id.
    pub(crate) fn run_am_reply(&mut self, msg: &AmMessage<'_>) -> bool {
        match self.am.replies.get_mut(msg.handler as usize).and_then(Option::as_mut) {
            Some(h) => {
                self.counters.replies += 1;
                h(msg);
                true
            }
            None => false,
        }
    }

    /// Sends an active-message request: runs request handler `handler` at the receiver with
    /// `args` and the payload (up to [`am::AM_PAYLOAD_GATHER_MAX`] buffers, not copied).
    pub fn am_request(
        &mut self,
        channel: ChannelId,
        handler: u16,
        args: [u64; AM_ARGS],
        payload: &[&[u8]],
    ) -> Result<SendOutcome, CallError> {
        let mut header = [0u8; HEADER_LEN];
        let args = am::encode_args(&args);
        let id = u64::from(self.am_last_id.checked_add(1).unwrap_or(1));
        let gather = am::frame(Kind::AmRequest, handler, id, &mut header, &args, payload);
        let outcome = self.ep.send_as(channel, &gather[..2 + payload.len()], Kind::AmRequest.trace_kind(), id)?;
        if outcome == SendOutcome::Done {
            self.am_last_id = id as u32;
        }
        Ok(outcome)
    }

    /// Sends a request; the reply or failure comes from [`Rpc::poll`]. `payload` is a gather
    /// list of up to [`PAYLOAD_GATHER_MAX`] buffers sent behind the header without a copy.
    pub fn call(
        &mut self,
        channel: ChannelId,
        method: u16,
        payload: &[&[u8]],
        timeout: Option<Duration>,
    ) -> Result<CallOutcome, CallError> {
        assert!(payload.len() <= PAYLOAD_GATHER_MAX, "a request payload has at most {PAYLOAD_GATHER_MAX} buffers");
        let Some(&slot) = self.free_slots.last() else { return Err(CallError::TooManyOutstanding) };
        let request_id = (u64::from(self.slots[slot as usize].generation) << 32) | u64::from(slot);
        let deadline_us = timeout.map_or(0, |t| t.as_micros().clamp(1, u32::MAX as u128) as u32);
        let header = Header { kind: Kind::Request, method, status: None, request_id, deadline_us }.encode();
        match self.send_with_header(channel, &header, payload, (trace::MessageKind::Request, request_id))? {
            SendOutcome::Done => {}
            _ => return Ok(CallOutcome::NoResource),
        }
        self.free_slots.pop();
        self.slots[slot as usize].channel = Some(channel);
        if let Some(t) = timeout {
            self.deadlines.push(Reverse((Instant::now() + t, request_id)));
        }
        self.counters.calls += 1;
        Ok(CallOutcome::Sent(CallId(request_id)))
    }

    /// Sends a request that gets no reply.
    pub fn one_way(&mut self, channel: ChannelId, method: u16, payload: &[&[u8]]) -> Result<SendOutcome, CallError> {
        let header = Header { kind: Kind::OneWay, method, status: None, request_id: 0, deadline_us: 0 }.encode();
        self.send_with_header(channel, &header, payload, (trace::MessageKind::OneWay, 0))
    }

    /// Answers a deferred request: `Ok(payload)` (a gather list of at most
    /// [`PAYLOAD_GATHER_MAX`] buffers) or an error status. A reply that finds the channel
    /// full is copied and sent at the next poll; one for a channel that failed is dropped.
    pub fn reply_later(&mut self, deferred: DeferredReply, result: Result<&[&[u8]], Status>) {
        let (header, payload) = match result {
            Ok(payload) => (deferred.header, payload),
            Err(status) => (Header { kind: Kind::ErrorReply, status: Some(status), ..deferred.header }, &[][..]),
        };
        assert!(payload.len() <= PAYLOAD_GATHER_MAX, "a reply payload has at most {PAYLOAD_GATHER_MAX} buffers");
        let header = header.encode();
        let mut gather: [&[u8]; ulnet_core::GATHER_MAX] = [&[]; ulnet_core::GATHER_MAX];
        gather[0] = &header;
        gather[1..=payload.len()].copy_from_slice(payload);
        let target = deferred.target;
        if self.ep.channel_incarnation(target.channel) != Some(target.incarnation) {
            tracing::debug!(channel = target.channel.0, "deferred reply dropped: its channel was closed");
            return;
        }
        if !self.deferred.is_empty() {
            // Keep replies in order behind those already waiting for room.
            self.deferred.push_back((target, gather[..=payload.len()].concat()));
            return;
        }
        match self.ep.send(target.channel, &gather[..=payload.len()]) {
            Ok(SendOutcome::Done) => {}
            Ok(_) => self.deferred.push_back((target, gather[..=payload.len()].concat())),
            Err(e) => tracing::debug!("deferred reply not sent: {e}"),
        }
    }

    /// Gives up on a call: no event follows for it, and a late reply is dropped.
    pub fn cancel(&mut self, call: CallId) {
        if let Some(channel) = self.release(call.0) {
            let header =
                Header { kind: Kind::Cancel, method: 0, status: None, request_id: call.0, deadline_us: 0 }.encode();
            let _ = self.ep.send_as(channel, &[&header], trace::MessageKind::Control, call.0);
        }
    }

    fn send_with_header(
        &mut self,
        channel: ChannelId,
        header: &[u8; HEADER_LEN],
        payload: &[&[u8]],
        (kind, request_id): (trace::MessageKind, u64),
    ) -> Result<SendOutcome, CallError> {
        let mut gather: [&[u8]; ulnet_core::GATHER_MAX] = [&[]; ulnet_core::GATHER_MAX];
        gather[0] = header;
        gather[1..=payload.len()].copy_from_slice(payload);
        self.ep.send_as(channel, &gather[..=payload.len()], kind, request_id).map_err(CallError::from)
    }

    /// Frees the slot of an outstanding call; returns its channel, or `None` if the id does
    /// not name an outstanding call (stale or forged).
    fn release(&mut self, request_id: u64) -> Option<ChannelId> {
        let (generation, index) = ((request_id >> 32) as u32, request_id as u32 as usize);
        let slot = self.slots.get_mut(index)?;
        if slot.generation != generation {
            return None;
        }
        let channel = slot.channel.take()?;
        slot.generation = slot.generation.wrapping_add(1).max(1);
        self.free_slots.push(index as u32);
        Some(channel)
    }

    /// Receives and dispatches: runs handlers for requests, reports replies and failures to
    /// `handle`, fires deadlines, sends pooled results. Returns the number of messages
    /// and events processed. Never blocks.
    pub fn poll(&mut self, max: usize, mut handle: impl FnMut(RpcEvent<'_>)) -> usize {
        let mut work = self.send_deferred() + self.send_pooled_results();
        work += self.fire_deadlines(&mut handle);
        let tracing = trace::enabled();
        let Rpc {
            ep,
            handlers,
            am,
            slots,
            free_slots,
            partial,
            deferred,
            pool,
            done_tx,
            counters,
            config,
            pooled_in_flight,
            ..
        } = self;
        let mut down = Vec::new();
        work += ep.poll(max, |event| match event {
            Event::Message { channel, data, message_len, offset, mut reply } => {
                let i = channel.0 as usize;
                if partial.len() <= i {
                    partial.resize_with(i + 1, Partial::default);
                }
                let whole = offset == 0 && data.len() as u64 == message_len;
                let p = &mut partial[i];
                let msg: &[u8] = if whole {
                    data
                } else {
                    if offset == 0 {
                        p.data.clear();
                        p.message_len = message_len;
                        // Refuse oversize requests from their first fragment, without buffering.
                        let header = Header::decode(data).ok();
                        let is_request = header.is_some_and(|h| matches!(h.kind, Kind::Request | Kind::OneWay));
                        p.skip = is_request && message_len > config.max_request_len + HEADER_LEN as u64;
                        if let (true, Some(h)) = (p.skip, header) {
                            counters.refused += 1;
                            let answer = h.kind == Kind::Request;
                            let mut r = Replier {
                                reply: &mut reply,
                                answer,
                                header: reply_header(&h),
                                deferred,
                                channel,
                                replied: false,
                            };
                            r.fail(Status::PayloadTooLarge);
                        }
                    }
                    if !p.skip {
                        p.data.extend_from_slice(data);
                    }
                    if offset + data.len() as u64 != message_len || p.skip {
                        return;
                    }
                    &p.data
                };
                let ctx = Dispatch {
                    handlers,
                    am,
                    slots,
                    free_slots,
                    deferred,
                    pool,
                    done_tx,
                    counters,
                    config,
                    pooled_in_flight,
                    tracing,
                };
                ctx.dispatch(channel, msg, &mut reply, &mut handle);
            }
            Event::ChannelDown { channel, error } => down.push((channel, error)),
            Event::SendComplete { .. } => {}
        });
        for (channel, error) in down {
            self.fail_channel(channel, error, &mut handle);
        }
        work
    }

    /// A channel went down: fails its calls, reports it, and closes it (releasing its
    /// socket) with what was still owed to it.
    fn fail_channel(&mut self, channel: ChannelId, error: ChannelError, handle: &mut impl FnMut(RpcEvent<'_>)) {
        for index in 0..self.slots.len() {
            if self.slots[index].channel == Some(channel) {
                let id = (u64::from(self.slots[index].generation) << 32) | index as u64;
                self.release(id);
                handle(RpcEvent::Failed { call: CallId(id), channel, error: CallError::PeerFailed(error.clone()) });
            }
        }
        handle(RpcEvent::ChannelDown { channel, error });
        self.deferred.retain(|(target, _)| target.channel != channel);
        if let Some(p) = self.partial.get_mut(channel.0 as usize) {
            *p = Partial::default();
        }
        self.ep.close(channel);
    }

    fn fire_deadlines(&mut self, handle: &mut impl FnMut(RpcEvent<'_>)) -> usize {
        let Some(Reverse((first, _))) = self.deadlines.peek() else { return 0 };
        let now = Instant::now();
        if *first > now {
            return 0;
        }
        let mut fired = 0;
        while let Some(&Reverse((at, id))) = self.deadlines.peek() {
            if at > now {
                break;
            }
            self.deadlines.pop();
            if let Some(channel) = self.release(id) {
                handle(RpcEvent::Failed { call: CallId(id), channel, error: CallError::DeadlineExceeded });
                fired += 1;
            }
        }
        fired
    }

    fn send_deferred(&mut self) -> usize {
        let mut sent = 0;
        while let Some((target, bytes)) = self.deferred.front() {
            if self.ep.channel_incarnation(target.channel) != Some(target.incarnation) {
                // Its channel was closed (and its id perhaps given to another).
                self.deferred.pop_front();
                continue;
            }
            // Deferred messages are copies whose header says what they are.
            let (kind, id) = match trace::enabled().then(|| Header::decode(bytes)) {
                Some(Ok(h)) => (h.kind.trace_kind(), h.request_id),
                _ => (trace::MessageKind::Message, 0),
            };
            match self.ep.send_as(target.channel, &[bytes], kind, id) {
                Ok(SendOutcome::NoResource) => break,
                Ok(_) | Err(_) => {
                    self.deferred.pop_front();
                    sent += 1;
                }
            }
        }
        sent
    }

    fn send_pooled_results(&mut self) -> usize {
        if self.pooled_in_flight == 0 {
            return 0;
        }
        let mut n = 0;
        while let Ok(done) = self.done_rx.try_recv() {
            self.pooled_in_flight -= 1;
            if let Some(record) = done.trace {
                self.ep.trace_put(record);
            }
            if !done.answer {
                continue;
            }
            let (header, body) = match done.result {
                Ok(body) => (Header { kind: Kind::Reply, ..done.header }, body),
                Err(status) => (Header { kind: Kind::ErrorReply, status: Some(status), ..done.header }, Vec::new()),
            };
            let mut bytes = header.encode().to_vec();
            bytes.extend_from_slice(&body);
            self.deferred.push_back((done.target, bytes));
            n += 1;
        }
        if n > 0 {
            self.send_deferred();
        }
        n
    }
}

/// The reply header for a request header (same method and id).
fn reply_header(request: &Header) -> Header {
    Header { kind: Kind::Reply, method: request.method, status: None, request_id: request.request_id, deadline_us: 0 }
}

/// The parts of an [`Rpc`] a delivery needs, borrowed apart from its endpoint.
struct Dispatch<'a> {
    handlers: &'a mut Vec<Option<Handler>>,
    am: &'a mut AmHandlers,
    slots: &'a mut Vec<CallSlot>,
    free_slots: &'a mut Vec<u32>,
    deferred: &'a mut VecDeque<(ReplyTarget, Vec<u8>)>,
    pool: &'a Option<WorkerPool>,
    done_tx: &'a mpsc::Sender<PooledDone>,
    counters: &'a mut RpcCounters,
    config: &'a RpcConfig,
    pooled_in_flight: &'a mut usize,
    /// Tracing was on when the poll started: describe messages and time their handlers.
    tracing: bool,
}

impl Dispatch<'_> {
    fn dispatch(self, channel: ChannelId, msg: &[u8], reply: &mut ReplyTo<'_>, handle: &mut impl FnMut(RpcEvent<'_>)) {
        let header = match Header::decode(msg) {
            Ok(h) => h,
            Err(e) => {
                self.counters.malformed += 1;
                tracing::debug!(?channel, "malformed message: {e}");
                // Answer a request whose id can be read, so its caller does not wait.
                if msg.len() >= HEADER_LEN && msg[0] == Kind::Request as u8 {
                    let request_id = u64::from_le_bytes(msg[8..16].try_into().expect("8 bytes"));
                    let h = Header {
                        kind: Kind::ErrorReply,
                        method: 0,
                        status: Some(Status::Malformed),
                        request_id,
                        deadline_us: 0,
                    };
                    let _ = reply.send_as(&[&h.encode()], trace::MessageKind::Response, request_id);
                }
                return;
            }
        };
        if self.tracing {
            reply.trace_describe(header.kind.trace_kind(), header.request_id);
        }
        let payload = &msg[HEADER_LEN..];
        match header.kind {
            Kind::Reply | Kind::ErrorReply => {
                let (generation, index) = ((header.request_id >> 32) as u32, header.request_id as u32 as usize);
                let matches =
                    self.slots.get(index).is_some_and(|s| s.generation == generation && s.channel == Some(channel));
                if !matches {
                    self.counters.stale_replies += 1;
                    return;
                }
                let slot = &mut self.slots[index];
                slot.channel = None;
                slot.generation = slot.generation.wrapping_add(1).max(1);
                self.free_slots.push(index as u32);
                self.counters.replies += 1;
                let call = CallId(header.request_id);
                let tracing = self.tracing;
                if tracing {
                    reply.trace_handler_start();
                }
                match header.status {
                    None => handle(RpcEvent::Reply { call, channel, data: payload }),
                    Some(status) => handle(RpcEvent::Failed { call, channel, error: status.into() }),
                }
                if tracing {
                    reply.trace_handler_end();
                }
            }
            Kind::Request | Kind::OneWay => self.serve(channel, header, payload, reply),
            Kind::Cancel => {}
            Kind::AmRequest | Kind::AmReply => self.run_am(channel, header, payload, reply),
        }
    }

    fn run_am(self, channel: ChannelId, header: Header, body: &[u8], reply: &mut ReplyTo<'_>) {
        let Some((args, payload)) = am::decode_body(body) else {
            self.counters.malformed += 1;
            return;
        };
        let msg = AmMessage { channel, handler: header.method, args, payload };
        let id = header.method as usize;
        let tracing = self.tracing;
        if tracing {
            reply.trace_handler_start();
        }
        if header.kind == Kind::AmRequest {
            match self.am.requests.get_mut(id).and_then(Option::as_mut) {
                Some(h) => {
                    self.counters.served += 1;
                    let request_id = header.request_id;
                    h(&msg, &mut AmReplier { reply, deferred: self.deferred, channel, request_id, replied: false });
                }
                None => self.counters.refused += 1,
            }
        } else {
            match self.am.replies.get_mut(id).and_then(Option::as_mut) {
                Some(h) => {
                    self.counters.replies += 1;
                    h(&msg);
                }
                None => self.counters.refused += 1,
            }
        }
        if tracing {
            reply.trace_handler_end();
        }
    }

    fn serve(self, channel: ChannelId, header: Header, payload: &[u8], reply: &mut ReplyTo<'_>) {
        let answer = header.kind == Kind::Request;
        // A pooled handler runs after this delivery: its record leaves with the job.
        let pooled = matches!(self.handlers.get(header.method as usize), Some(Some(Handler::Pooled(_))));
        let trace = if self.tracing && pooled { reply.trace_take() } else { None };
        let mut replier = Replier {
            reply,
            answer,
            header: Header { kind: Kind::Reply, deadline_us: 0, ..header },
            deferred: self.deferred,
            channel,
            replied: false,
        };
        if payload.len() as u64 > self.config.max_request_len {
            self.counters.refused += 1;
            return replier.fail(Status::PayloadTooLarge);
        }
        match self.handlers.get_mut(header.method as usize).and_then(Option::as_mut) {
            None => {
                self.counters.refused += 1;
                replier.fail(Status::UnknownMethod);
            }
            Some(Handler::Inline(h)) => {
                self.counters.served += 1;
                if self.tracing {
                    replier.reply.trace_handler_start();
                }
                h(&Request { channel, method: header.method, payload }, &mut replier);
                if self.tracing {
                    replier.reply.trace_handler_end();
                }
                if answer && !replier.replied {
                    replier.fail(Status::HandlerFailed);
                }
            }
            Some(Handler::Pooled(h)) => {
                self.counters.served += 1;
                let (h, owned, done_tx) = (h.clone(), payload.to_vec(), self.done_tx.clone());
                let budget =
                    (header.deadline_us > 0).then(|| Instant::now() + Duration::from_micros(header.deadline_us.into()));
                let reply_header = replier.header;
                let target = ReplyTarget { channel, incarnation: replier.reply.channel_incarnation() };
                // Every job reports back (one-way ones too), so the in-flight count stays exact.
                let job = Box::new(move || {
                    let mut trace = trace;
                    let start = trace.map(|_| trace::now());
                    let late = budget.is_some_and(|b| Instant::now() > b);
                    let result = if late { Err(Status::DeadlineExceeded) } else { h(&owned) };
                    if let (Some(record), Some(start)) = (trace.as_mut(), start) {
                        record.set_handler_times(start, trace::now());
                    }
                    let _ = done_tx.send(PooledDone { target, header: reply_header, result, answer, trace });
                });
                *self.pooled_in_flight += 1;
                self.pool.as_ref().expect("pooled handlers exist only with a pool").submit(job);
            }
        }
    }
}
