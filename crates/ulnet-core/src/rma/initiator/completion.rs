//! Operation slots and the dispatch of responses to them: every response is matched to its
//! slot by the token it echoes (slot index, chunk, and a generation so a late response for
//! a reused slot is dropped), parts of split operations are gathered, and a finished
//! operation is handed on once.

use super::*;
use crate::trace::{self, MessageKind};

/// Where finished operations go: `(internal, token, result)`; `internal` marks operations
/// a blocking helper of ours waits for.
pub(super) type Sink<'s> = dyn FnMut(bool, u64, Result<Value<'_>, RmaError>) + 's;

impl Slot {
    pub(super) fn empty() -> Self {
        Slot {
            generation: 1,
            live: false,
            token: 0,
            peer: 0,
            kind: Kind::Put,
            chunks: 0,
            chunks_left: 0,
            assembled: Vec::new(),
            chunk_len: 0,
            error: None,
            internal: false,
            abandoned: false,
            trace: None,
        }
    }
}

/// What a trace records of an operation posted while tracing was on: one record when it
/// completes, its post time as the queueing stage.
#[derive(Clone, Copy, Debug)]
pub(super) struct TracedOp {
    pub(super) kind: MessageKind,
    /// (initiator, target).
    pub(super) nodes: (NodeId, NodeId),
    pub(super) len: u64,
    /// [`trace::now`] when it was posted.
    pub(super) posted: u64,
}

/// What an operation slot holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    Put,
    Get,
    Atomic,
    Lookup,
}

/// One operation in flight.
pub(super) struct Slot {
    pub(super) generation: u16,
    pub(super) live: bool,
    pub(super) token: u64,
    pub(super) peer: u32,
    pub(super) kind: Kind,
    pub(super) chunks: u32,
    pub(super) chunks_left: u32,
    /// Gets of more than one chunk are assembled here.
    pub(super) assembled: Vec<u8>,
    pub(super) chunk_len: usize,
    pub(super) error: Option<RmaError>,
    /// A blocking helper of ours waits for it (its completion is not the user's).
    pub(super) internal: bool,
    /// The blocking helper gave up; drop the completion.
    pub(super) abandoned: bool,
    /// Posted while tracing was on.
    pub(super) trace: Option<TracedOp>,
}

/// What one finished slot produced, as the dispatcher hands it on.
pub(super) enum Value<'a> {
    Put,
    Get(&'a [u8]),
    Atomic(u64),
    Lookup(LookupAnswer),
}

/// A completion kept for the user while a blocking helper polled.
pub(super) enum Owned {
    Put,
    Get(Vec<u8>),
    Atomic(u64),
    Flush,
}

impl Owned {
    /// Keeps a completion's value past the poll that delivered it.
    pub(super) fn of(value: Value<'_>) -> Self {
        match value {
            Value::Put | Value::Lookup(_) => Owned::Put,
            Value::Get(d) => Owned::Get(d.to_vec()),
            Value::Atomic(v) => Owned::Atomic(v),
        }
    }
}

/// Matches one response to its slot; when that finishes the operation, hands the result to
/// `sink` (unless abandoned) and frees the slot. Returns whether an operation finished.
pub(super) fn finish(
    slots: &mut [Slot],
    free_slots: &mut Vec<u32>,
    counters: &mut InitiatorCounters,
    msg: &[u8],
    sink: &mut Sink<'_>,
) -> bool {
    let response = match wire::decode_response(msg) {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!("undecodable RMA response dropped: {e}");
            return false;
        }
    };
    let token = match response {
        Response::HelloAck { .. } => {
            tracing::warn!("unexpected hello answer dropped");
            return false;
        }
        Response::GetData { token, .. }
        | Response::PutDone { token }
        | Response::AtomicResult { token, .. }
        | Response::LookupResult { token, .. }
        | Response::Refused { token, .. } => token,
    };
    let (index, chunk, generation) = (token as u32 as usize, ((token >> 32) & 0xffff) as usize, (token >> 48) as u16);
    let Some(slot) = slots.get_mut(index).filter(|s| s.live && s.generation == generation) else {
        tracing::warn!(token, "RMA response for no operation in flight; dropped");
        return false;
    };
    let mut single: Option<Value<'_>> = None;
    match (response, slot.kind) {
        (Response::Refused { error, .. }, _) => {
            slot.error.get_or_insert(RmaError::Access(error));
        }
        (Response::GetData { data, .. }, Kind::Get) if slot.chunks > 1 => {
            let at = chunk.saturating_mul(slot.chunk_len);
            match slot.assembled.get_mut(at..at.saturating_add(data.len())) {
                Some(place) if data.len() <= slot.chunk_len => place.copy_from_slice(data),
                _ => {
                    slot.error.get_or_insert(RmaError::Access(AccessError::Malformed));
                }
            }
        }
        (Response::GetData { data, .. }, Kind::Get) => single = Some(Value::Get(data)),
        (Response::PutDone { .. }, Kind::Put) => single = Some(Value::Put),
        (Response::AtomicResult { old, .. }, Kind::Atomic) => single = Some(Value::Atomic(old)),
        (Response::LookupResult { answer, .. }, Kind::Lookup) => single = Some(Value::Lookup(answer)),
        _ => {
            slot.error.get_or_insert(RmaError::Access(AccessError::Malformed));
        }
    }
    slot.chunks_left -= 1;
    if slot.chunks_left > 0 {
        return false;
    }
    let (internal, user_token, abandoned) = (slot.internal, slot.token, slot.abandoned);
    let result = match slot.error.take() {
        Some(e) => {
            counters.refused += 1;
            Err(e)
        }
        None => {
            counters.completed += 1;
            if let Some(t) = slot.trace.take() {
                trace::record_rma(t.kind, t.nodes, slot.peer, t.len, user_token, t.posted);
            }
            Ok(match (slot.kind, single) {
                (Kind::Get, None) => Value::Get(&slot.assembled),
                (_, Some(v)) => v,
                (_, None) => Value::Put,
            })
        }
    };
    if !abandoned {
        sink(internal, user_token, result);
    }
    slot.live = false;
    slot.generation = slot.generation.wrapping_add(1).max(1);
    free_slots.push(index as u32);
    true
}

/// Fails every operation in flight to peer `peer`.
pub(super) fn fail_peer(
    slots: &mut [Slot],
    free_slots: &mut Vec<u32>,
    counters: &mut InitiatorCounters,
    peer: u32,
    error: &ChannelError,
    sink: &mut Sink<'_>,
) -> usize {
    let mut n = 0;
    for (i, slot) in slots.iter_mut().enumerate() {
        if slot.live && slot.peer == peer {
            slot.live = false;
            slot.generation = slot.generation.wrapping_add(1).max(1);
            free_slots.push(i as u32);
            counters.failed += 1;
            if !slot.abandoned {
                sink(slot.internal, slot.token, Err(RmaError::PeerFailed(error.clone())));
            }
            n += 1;
        }
    }
    n
}
