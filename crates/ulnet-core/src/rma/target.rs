//! The target side of a request: decode, check, apply, answer.
//!
//! Every request is checked before memory is touched, in this order: the channel's
//! importer introduced itself; the segment id names a slot; the slot is live at the
//! request's generation (else `UnknownSegment`, `Revoked` or `StaleGeneration`); the
//! importer holds the right the operation needs; `offset + length` does not overflow and
//! lies within the segment; an atomic's offset is 8-aligned. A refusal is answered with the
//! request's token and the reason, counted by reason, logged at debug level, and changes
//! nothing. Bytes that do not decode are counted as malformed and refused by token when a
//! header can be read.

use super::error::AccessError;
use super::notify::{AccessKind, Notification};
use super::rights::{NodeId, Rights};
use super::segment::{Entered, ExportTable};
use super::wire::{self, LookupAnswer, Op, Place, Response, HEADER_LEN, VERSION};
use crate::transport::shm::admission::{AdmissionCells, AdmissionCounters};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Counters of a node's target side, as [`crate::rma::Rma::target_counters`] reports them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TargetCounters {
    /// Requests received on RMA channels (several may share a message).
    pub requests: u64,
    /// Gets applied.
    pub gets: u64,
    /// Puts applied.
    pub puts: u64,
    /// Compare-and-swaps and fetch-and-adds applied.
    pub atomics: u64,
    /// Name lookups answered.
    pub lookups: u64,
    /// Bytes read by gets.
    pub bytes_read: u64,
    /// Bytes written by puts.
    pub bytes_written: u64,
    /// Requests refused, by reason (indexed like [`AccessError::ALL`]).
    pub refused_by: [u64; AccessError::ALL.len()],
    /// Messages that did not decode (also refused as `Malformed` when a token was readable).
    pub malformed: u64,
    /// Notifications raised by accesses through the engine.
    pub notifications: u64,
    /// Channels accepted from importers.
    pub channels_accepted: u64,
    /// Channels that failed (not counting clean closes).
    pub channels_failed: u64,
    /// Same-host imports mapped.
    pub mapped_imports: u64,
    /// Same-host imports refused.
    pub mapped_refused: u64,
    /// Segments revoked.
    pub revocations: u64,
    /// Revocations that migrated a segment to a fresh memory file.
    pub migrations: u64,
    /// Mapped importers still inside a store when a revocation's grace period ran out.
    pub importers_stuck: u64,
    /// Same-host peers of the shared-memory listener and the rendezvous: admitted, refused
    /// for their credentials or the secret, failed.
    pub admission: AdmissionCounters,
}

impl TargetCounters {
    /// Requests refused for `reason`.
    pub fn refused_for(&self, reason: AccessError) -> u64 {
        self.refused_by[reason.index()]
    }

    /// Requests refused for any reason.
    pub fn refused(&self) -> u64 {
        self.refused_by.iter().sum()
    }
}

/// Counter cells written by the engine thread only, read by anyone.
#[derive(Default)]
pub(crate) struct TargetCells {
    requests: AtomicU64,
    gets: AtomicU64,
    puts: AtomicU64,
    atomics: AtomicU64,
    lookups: AtomicU64,
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
    refused_by: [AtomicU64; AccessError::ALL.len()],
    malformed: AtomicU64,
    notifications: AtomicU64,
    pub(crate) channels_accepted: AtomicU64,
    pub(crate) channels_failed: AtomicU64,
    pub(crate) mapped_imports: AtomicU64,
    pub(crate) mapped_refused: AtomicU64,
    /// Shared by the node's shared-memory listener and rendezvous (their own threads write it).
    pub(crate) admission: Arc<AdmissionCells>,
}

/// Adds to a counter that only one thread writes: a load and a store, no locked
/// instruction on the request path.
#[inline(always)]
pub(crate) fn bump(cell: &AtomicU64, by: u64) {
    cell.store(cell.load(Ordering::Relaxed) + by, Ordering::Relaxed);
}

impl TargetCells {
    pub(crate) fn snapshot(&self, table: &ExportTable) -> TargetCounters {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let (revocations, migrations, importers_stuck) = table.revoke_counts();
        TargetCounters {
            requests: get(&self.requests),
            gets: get(&self.gets),
            puts: get(&self.puts),
            atomics: get(&self.atomics),
            lookups: get(&self.lookups),
            bytes_read: get(&self.bytes_read),
            bytes_written: get(&self.bytes_written),
            refused_by: std::array::from_fn(|i| get(&self.refused_by[i])),
            malformed: get(&self.malformed),
            notifications: get(&self.notifications),
            channels_accepted: get(&self.channels_accepted),
            channels_failed: get(&self.channels_failed),
            mapped_imports: get(&self.mapped_imports),
            mapped_refused: get(&self.mapped_refused),
            revocations,
            migrations,
            importers_stuck,
            admission: self.admission.snapshot(),
        }
    }

    pub(crate) fn refuse(&self, e: AccessError) {
        bump(&self.refused_by[e.index()], 1);
    }
}

/// Who is at the other end of one channel, as far as its target knows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Importer {
    /// The node id the channel's handshake proved with the cluster secret, if it named one:
    /// the importer may introduce itself as this node only.
    pub(crate) proven: Option<NodeId>,
    /// The node it introduced itself as (Hello), whose rights its requests have.
    pub(crate) node: Option<NodeId>,
}

/// What to send back for one request.
pub(crate) enum Reply<'s> {
    /// Nothing (the message had no readable token).
    Nothing,
    /// A response header.
    Header([u8; HEADER_LEN]),
    /// A `GetData` header and its data.
    WithData([u8; HEADER_LEN], &'s [u8]),
}

/// The request handler of one engine.
pub(crate) struct Target {
    table: Arc<ExportTable>,
    cells: Arc<TargetCells>,
    /// Gets are copied here word by word, then sent.
    scratch: Vec<u8>,
}

/// Checks an access and enters the segment for it (the engine stays marked busy on it
/// until the returned guard drops).
fn check<'t>(
    table: &'t ExportTable,
    importer: NodeId,
    place: Place,
    len: u64,
    need: Rights,
    atomic: bool,
) -> Result<Entered<'t>, AccessError> {
    let entered = table.enter(place.segment, place.generation)?;
    let shared = entered.shared;
    if !shared.grants.rights_of(importer).contains(need) {
        return Err(AccessError::Denied);
    }
    let end = place.offset.checked_add(len).ok_or(AccessError::OutOfBounds)?;
    if end > shared.region.len() as u64 {
        return Err(AccessError::OutOfBounds);
    }
    if atomic && !place.offset.is_multiple_of(8) {
        return Err(AccessError::Misaligned);
    }
    Ok(entered)
}

fn refused(token: u64, error: AccessError) -> Reply<'static> {
    Reply::Header(wire::encode_response(&Response::Refused { token, error }))
}

impl Target {
    pub(crate) fn new(table: Arc<ExportTable>, cells: Arc<TargetCells>) -> Self {
        Self { table, cells, scratch: Vec::new() }
    }

    /// Counts and logs a refusal.
    pub(crate) fn count_refusal(&self, error: AccessError, importer: Option<NodeId>) {
        self.cells.refuse(error);
        tracing::debug!(importer = importer.map(|n| n.0), ?error, "request refused");
    }

    fn refuse(&self, token: u64, importer: Option<NodeId>, error: AccessError) -> Reply<'static> {
        self.count_refusal(error, importer);
        refused(token, error)
    }

    /// Refuses the first fragment of a message too large to be one request (an honest
    /// initiator never sends one); the rest of its fragments are ignored by the caller.
    pub(crate) fn refuse_fragmented(&mut self, first: &[u8], importer: Option<NodeId>) -> Reply<'static> {
        bump(&self.cells.requests, 1);
        match wire::peek_token(first) {
            Some(token) => self.refuse(token, importer, AccessError::TooLarge),
            None => {
                self.count_refusal(AccessError::TooLarge, importer);
                Reply::Nothing
            }
        }
    }

    /// Handles every request of one whole message, in order, giving `answer` the reply to
    /// each: each is checked on its own, so a bad one is refused and counted while the good
    /// ones around it are applied (see [`wire::split_requests`]).
    pub(crate) fn handle_message(
        &mut self,
        msg: &[u8],
        importer: &mut Importer,
        data_max: usize,
        answer: &mut dyn FnMut(Reply<'_>),
    ) {
        for request in wire::split_requests(msg) {
            answer(self.handle(request, importer, data_max));
        }
    }

    /// Handles one request, alone in `msg`, from a channel whose importer is `importer`
    /// (its node is `None` until it says Hello; this sets it). `data_max` is the most data
    /// one response may carry.
    pub(crate) fn handle(&mut self, msg: &[u8], importer: &mut Importer, data_max: usize) -> Reply<'_> {
        bump(&self.cells.requests, 1);
        let req = match wire::decode_request(msg) {
            Ok(r) => r,
            Err(e) => {
                bump(&self.cells.malformed, 1);
                tracing::debug!(importer = importer.node.map(|n| n.0), "malformed request: {e}");
                return match wire::peek_token(msg) {
                    Some(token) => self.refuse(token, importer.node, AccessError::Malformed),
                    None => Reply::Nothing,
                };
            }
        };
        let token = req.token;
        if let Op::Hello { node, version } = req.op {
            return self.hello(token, node, version, importer);
        }
        let Some(node) = importer.node else {
            return self.refuse(token, None, AccessError::NotIntroduced);
        };
        let notify = req.notify;
        let (table, cells) = (&*self.table, &*self.cells);
        let result = match req.op {
            Op::Hello { .. } => unreachable!("handled above"),
            Op::Lookup { name } => {
                bump(&cells.lookups, 1);
                match table.find(name) {
                    Some((shared, generation)) => {
                        let answer = LookupAnswer {
                            segment: shared.id,
                            generation,
                            len: shared.region.len() as u64,
                            rights: shared.grants.rights_of(node),
                            notify: shared.notify_mode(),
                        };
                        return Reply::Header(wire::encode_response(&Response::LookupResult { token, answer }));
                    }
                    None => Err(AccessError::UnknownName),
                }
            }
            Op::Get { place, len } => {
                if len as usize > data_max {
                    Err(AccessError::TooLarge)
                } else {
                    match check(table, node, place, u64::from(len), Rights::READ, false) {
                        Ok(entered) => {
                            let len = len as usize;
                            if self.scratch.len() < len {
                                self.scratch.resize(len, 0);
                            }
                            entered.shared.region.copy_out(place.offset as usize, &mut self.scratch[..len]);
                            bump(&cells.gets, 1);
                            bump(&cells.bytes_read, len as u64);
                            notice(table, cells, &entered, node, notify, AccessKind::Get, place.offset, len);
                            drop(entered);
                            let data = &self.scratch[..len];
                            let header = wire::encode_response(&Response::GetData { token, data });
                            return Reply::WithData(header, data);
                        }
                        Err(e) => Err(e),
                    }
                }
            }
            Op::Put { place, data } => {
                check(table, node, place, data.len() as u64, Rights::WRITE, false).map(|entered| {
                    entered.shared.region.copy_in(place.offset as usize, data);
                    bump(&cells.puts, 1);
                    bump(&cells.bytes_written, data.len() as u64);
                    notice(table, cells, &entered, node, notify, AccessKind::Put, place.offset, data.len());
                    Response::PutDone { token }
                })
            }
            Op::CompareSwap { place, expected, desired } => {
                check(table, node, place, 8, Rights::ATOMIC, true).map(|entered| {
                    let old = entered.shared.region.compare_swap_u64(place.offset as usize, expected, desired);
                    bump(&cells.atomics, 1);
                    notice(table, cells, &entered, node, notify, AccessKind::CompareSwap, place.offset, 8);
                    Response::AtomicResult { token, old }
                })
            }
            Op::FetchAdd { place, addend } => check(table, node, place, 8, Rights::ATOMIC, true).map(|entered| {
                let old = entered.shared.region.fetch_add_u64(place.offset as usize, addend);
                bump(&cells.atomics, 1);
                notice(table, cells, &entered, node, notify, AccessKind::FetchAdd, place.offset, 8);
                Response::AtomicResult { token, old }
            }),
        };
        match result {
            Ok(response) => Reply::Header(wire::encode_response(&response)),
            Err(e) => self.refuse(token, Some(node), e),
        }
    }

    /// A Hello: the importer introduces itself, once, as the node its channel's handshake
    /// proved (when it proved one); it is then known by that node's rights.
    fn hello(&mut self, token: u64, node: NodeId, version: u32, importer: &mut Importer) -> Reply<'_> {
        match *importer {
            _ if !(1..=VERSION).contains(&version) => self.refuse(token, importer.node, AccessError::Malformed),
            Importer { node: Some(n), .. } if n != node => self.refuse(token, importer.node, AccessError::Malformed),
            Importer { proven: Some(p), .. } if p != node => {
                tracing::debug!(claimed = node.0, proven = p.0, "hello names another node than the channel proved");
                self.refuse(token, None, AccessError::Denied)
            }
            _ => {
                importer.node = Some(node);
                let ack = Response::HelloAck { node: self.table.node, version: version.min(VERSION) };
                Reply::Header(wire::encode_response(&ack))
            }
        }
    }
}

/// Raises a notification if the segment's mode and the request's bit ask for one.
#[allow(clippy::too_many_arguments)]
#[inline]
fn notice(
    table: &ExportTable,
    cells: &TargetCells,
    entered: &Entered<'_>,
    importer: NodeId,
    requested: bool,
    kind: AccessKind,
    offset: u64,
    len: usize,
) {
    if entered.shared.notify_mode().notifies(requested) {
        bump(&cells.notifications, 1);
        table.notifications.push(Notification { segment: entered.shared.id, importer, kind, offset, len: len as u32 });
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::rma::notify::Notifications;
    use crate::rma::rights::{Access, Generation, NotifyMode, SegmentId};
    use crate::rma::wire::{decode_response, Request};
    use proptest::prelude::*;
    use std::time::Duration;

    const LEN: usize = 256;

    /// A request drawn to reach every check: real or wrong segment and generation, offsets
    /// near the end and beyond, aligned or not.
    fn request() -> impl Strategy<Value = (u8, bool, bool, u64, u32, u64, Vec<u8>, u64)> {
        (
            0u8..6,
            any::<bool>(),
            any::<bool>(),
            prop_oneof![0u64..300, Just(u64::MAX - 3), any::<u64>()],
            0u32..40,
            any::<u64>(),
            proptest::collection::vec(any::<u8>(), 0..40),
            any::<u64>(),
        )
    }

    /// Does to the model of the segment's memory what an accepted request does.
    fn apply(op: Op<'_>, offset: u64, model: &mut [u8]) {
        let at = offset as usize;
        match op {
            Op::Put { data, .. } => model[at..at + data.len()].copy_from_slice(data),
            Op::CompareSwap { expected, desired, .. } => {
                let w = u64::from_ne_bytes(model[at..at + 8].try_into().unwrap());
                if w == expected {
                    model[at..at + 8].copy_from_slice(&desired.to_ne_bytes());
                }
            }
            Op::FetchAdd { addend, .. } => {
                let w = u64::from_ne_bytes(model[at..at + 8].try_into().unwrap());
                model[at..at + 8].copy_from_slice(&w.wrapping_add(addend).to_ne_bytes());
            }
            _ => {}
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        /// Whatever arrives, the target answers in protocol, and memory changes exactly as
        /// the accepted puts and atomics say: refusals change nothing. Requests go several
        /// to a message (cut where `cuts` says); spoiled ones (a reserved byte set) and a
        /// stray tail are refused and counted while the good ones beside them are applied.
        #[test]
        fn target_applies_exactly_what_it_accepts(
            reqs in proptest::collection::vec(request(), 1..24),
            cuts in proptest::collection::vec(any::<bool>(), 24),
            spoil in proptest::collection::vec(0u8..8, 24),
            tails in proptest::collection::vec(any::<bool>(), 24),
            noise in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..64), 0..8),
            rights in 0u8..8,
        ) {
            let notes = Notifications::new(16).unwrap();
            let table = Arc::new(ExportTable::new(NodeId(1), 4, notes, Duration::from_millis(10)));
            let grant = Rights::from_bits_truncate(rights);
            let seg = table.export("s", LEN, &Access::none().grant(NodeId(2), grant), NotifyMode::Never, None).unwrap();
            let mut model = vec![0u8; LEN];
            let cells = Arc::new(TargetCells::default());
            let mut target = Target::new(table.clone(), cells.clone());
            let mut importer = Importer::default();
            for junk in &noise {
                target.handle_message(junk, &mut importer, 1024, &mut |_| {});
            }
            prop_assert_eq!(importer.node, None, "noise never introduces anyone");
            let malformed_before = cells.malformed.load(Ordering::Relaxed);
            let hello = [Request { token: 0, notify: false, op: Op::Hello { node: NodeId(2), version: VERSION } }];
            let mut head = [0u8; wire::HEADER_LEN + 16];
            let msg = hello[0].encode_head(&mut head).to_vec();
            prop_assert!(matches!(target.handle(&msg, &mut importer, 1024), Reply::Header(_)));
            let (mut message, mut expected) = (Vec::new(), Vec::new());
            let mut spoiled = 0u64;
            for (i, (kind, right_seg, right_gen, offset, len, operand, data, token)) in reqs.iter().enumerate() {
                let (kind, right_seg, right_gen, offset, len, operand, token) = (*kind, *right_seg, *right_gen, *offset, *len, *operand, *token);
                let place = Place {
                    segment: if right_seg { seg.id() } else { SegmentId(seg.id().0 + 1) },
                    generation: if right_gen { seg.generation() } else { Generation(seg.generation().0 + 1) },
                    offset,
                };
                let op = match kind {
                    0 => Op::Get { place, len },
                    1 => Op::Put { place, data },
                    2 => Op::CompareSwap { place, expected: operand & 1, desired: operand },
                    3 => Op::FetchAdd { place, addend: operand },
                    4 => Op::Lookup { name: b"s" },
                    _ => Op::Hello { node: NodeId(3), version: VERSION },
                };
                let req = Request { token, notify: false, op };
                let at = message.len();
                message.extend_from_slice(req.encode_head(&mut head));
                message.extend_from_slice(req.body_tail());
                // The model: the checks in the target's order.
                let (need, n, atomic) = match op {
                    Op::Get { len, .. } => (Rights::READ, u64::from(len), false),
                    Op::Put { data, .. } => (Rights::WRITE, data.len() as u64, false),
                    Op::CompareSwap { .. } | Op::FetchAdd { .. } => (Rights::ATOMIC, 8, true),
                    _ => (Rights::NONE, 0, false),
                };
                let expect = if spoil[i] == 0 {
                    message[at + 3] = 1; // a reserved byte: framing holds, the request does not
                    spoiled += 1;
                    Err(AccessError::Malformed)
                } else if matches!(op, Op::Hello { .. }) {
                    Err(AccessError::Malformed)
                } else if matches!(op, Op::Lookup { .. }) {
                    Ok(())
                } else if !right_seg {
                    Err(AccessError::UnknownSegment)
                } else if !right_gen {
                    Err(AccessError::StaleGeneration)
                } else if !grant.contains(need) {
                    Err(AccessError::Denied)
                } else if offset.checked_add(n).is_none_or(|end| end > LEN as u64) {
                    Err(AccessError::OutOfBounds)
                } else if atomic && offset % 8 != 0 {
                    Err(AccessError::Misaligned)
                } else {
                    Ok(())
                };
                expected.push((op, expect, offset));
                if !cuts[i] && i + 1 < reqs.len() {
                    continue;
                }
                if tails[i] {
                    // Bytes that frame no request: the rest of the message is one malformed request.
                    message.extend_from_slice(&[0xee; 5]);
                    spoiled += 1;
                }
                let mut replies = Vec::new();
                target.handle_message(&message, &mut importer, 1024, &mut |reply| {
                    replies.push(match reply {
                        Reply::Header(h) => decode_response(&h).map(|r| format!("{r:?}")).map_err(|e| e.to_string()),
                        Reply::WithData(h, d) => {
                            let mut all = h.to_vec();
                            all.extend_from_slice(d);
                            decode_response(&all).map(|r| format!("{r:?}")).map_err(|e| e.to_string())
                        }
                        Reply::Nothing => Err("no reply".into()),
                    })
                });
                if tails[i] {
                    prop_assert_eq!(replies.pop(), Some(Err("no reply".to_string())), "a 5-byte tail has no token");
                }
                prop_assert_eq!(replies.len(), expected.len(), "one reply per request");
                for (reply, (op, expect, offset)) in replies.into_iter().zip(expected.drain(..)) {
                    let reply = reply.map_err(TestCaseError::fail)?;
                    match expect {
                        Err(e) => prop_assert!(reply.contains(&format!("{e:?}")), "{:?} -> {} (wanted {:?})", op, reply, e),
                        Ok(()) => {
                            prop_assert!(!reply.contains("Refused"), "{:?} -> {}", op, reply);
                            apply(op, offset, &mut model);
                        }
                    }
                }
                let mut now = vec![0u8; LEN];
                seg.read(0, &mut now);
                prop_assert_eq!(&now, &model, "memory after a message ending with {:?}", op);
                message.clear();
            }
            prop_assert_eq!(cells.malformed.load(Ordering::Relaxed) - malformed_before, spoiled);
        }
    }
}
