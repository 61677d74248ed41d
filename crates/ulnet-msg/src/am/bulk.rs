//! Bulk transfers of active messages on remote memory (the block store and get of Generic
//! Active Messages), built on the one-sided operations of `ulnet_core::rma`.
//!
//! - **store**: writes a block into a segment the receiver exports, then runs a request
//!   handler at the receiver once the data is in place, with arguments
//!   `[offset, length, a0, a1]` (the handler reads the block in its own segment).
//! - **get**: reads a block from a segment the other side exports, then runs a *reply*
//!   handler here with the data as its payload and the same four arguments. Being a reply
//!   handler, it cannot send a reply (the livelock rule holds for bulk transfers too).
//!
//! The data moves by RMA (mapped on the same host: plain stores and loads), the control by
//! active message: the request is sent only when the put has completed at the target, so
//! the handler always finds the block. Both calls return at once (`Done`, `InProgress` or
//! `NoResource`); [`BulkAm::poll`] moves transfers along.
//!
//! ```no_run
//! use ulnet_msg::am::bulk::{BulkAm, BulkEvent};
//! # fn f(rpc: &mut ulnet_msg::rpc::Rpc, rma: &mut ulnet_core::rma::Rma, ch: ulnet_core::ChannelId,
//! #      seg: &ulnet_core::rma::RemoteSegment) -> Result<(), ulnet_msg::am::bulk::BulkError> {
//! const STORED: u16 = 20; // a request handler registered at the receiver
//! let mut bulk = BulkAm::new();
//! let block = vec![7u8; 64 << 10];
//! while bulk.store(rpc, rma, ch, seg, 0, &block, STORED, [1, 2])? == ulnet_core::SendOutcome::NoResource {
//!     bulk.poll(rpc, rma, |_| {});
//! }
//! while bulk.pending() > 0 {
//!     bulk.poll(rpc, rma, |e| if let BulkEvent::Failed { error, .. } = e { eprintln!("{error}") });
//!     rpc.poll(64, |_| {});
//! }
//! # Ok(()) }
//! ```

use super::{AmMessage, AM_ARGS};
use crate::rpc::{CallError, Rpc};
use std::collections::{HashMap, VecDeque};
use ulnet_core::rma::{Completed, RemoteSegment, Rma, RmaCompletion, RmaError, RmaOutcome};
use ulnet_core::{ChannelId, SendOutcome};

/// Tokens of bulk transfers have this bit set; RMA completions without it are the caller's
/// and are handed back by [`BulkAm::poll`].
pub const BULK_TOKEN_BIT: u64 = 1 << 63;

/// Why a bulk transfer could not start.
#[derive(Debug, thiserror::Error)]
pub enum BulkError {
    /// The one-sided operation was refused or its channel failed.
    #[error("remote memory: {0}")]
    Rma(#[from] RmaError),
    /// The active message could not be sent.
    #[error("active message: {0}")]
    Call(#[from] CallError),
}

/// What [`BulkAm::poll`] reports besides the handlers it runs.
#[derive(Debug)]
pub enum BulkEvent<'a> {
    /// A bulk transfer failed (the target refused the access, or the channel failed): its
    /// handler does not run.
    Failed {
        /// The token `store` or `get` returned in `InProgress`.
        token: u64,
        /// Why.
        error: RmaError,
    },
    /// A completion of the caller's own RMA operation (a token without [`BULK_TOKEN_BIT`]).
    Rma(RmaCompletion<'a>),
    /// A get's data arrived but no reply handler is registered under its id.
    NoHandler {
        /// The handler id.
        handler: u16,
    },
}

struct Pending {
    channel: ChannelId,
    handler: u16,
    args: [u64; AM_ARGS],
}

/// Bulk store and get in flight. See the module documentation.
#[derive(Default)]
pub struct BulkAm {
    stores: HashMap<u64, Pending>,
    gets: HashMap<u64, Pending>,
    /// Requests of completed stores that found the channel full.
    unsent: VecDeque<Pending>,
    next_token: u64,
    /// Gets that complete at once (mapped) land here before their handler runs.
    scratch: Vec<u8>,
}

impl BulkAm {
    /// No transfers in flight.
    pub fn new() -> Self {
        Self::default()
    }

    /// Transfers not yet finished (including store requests waiting for room).
    pub fn pending(&self) -> usize {
        self.stores.len() + self.gets.len() + self.unsent.len()
    }

    fn token(&mut self) -> u64 {
        self.next_token = self.next_token.wrapping_add(1);
        BULK_TOKEN_BIT | (self.next_token & !BULK_TOKEN_BIT)
    }

    fn request(rpc: &mut Rpc, unsent: &mut VecDeque<Pending>, p: Pending) -> Result<(), CallError> {
        if unsent.is_empty() && rpc.am_request(p.channel, p.handler, p.args, &[])? != SendOutcome::NoResource {
            return Ok(());
        }
        unsent.push_back(p);
        Ok(())
    }

    /// Stores `data` at `offset` of `segment` (exported by the node at the other end of
    /// `channel`), then runs request handler `handler` there with arguments
    /// `[offset, data.len(), args[0], args[1]]`. `Done` when the data is stored and the
    /// request sent (mapped segments), `InProgress(token)` while the put is under way.
    #[allow(clippy::too_many_arguments)]
    pub fn store(
        &mut self,
        rpc: &mut Rpc,
        rma: &mut Rma,
        channel: ChannelId,
        segment: &RemoteSegment,
        offset: u64,
        data: &[u8],
        handler: u16,
        args: [u64; 2],
    ) -> Result<SendOutcome, BulkError> {
        let token = self.token();
        let pending = Pending { channel, handler, args: [offset, data.len() as u64, args[0], args[1]] };
        match rma.put(segment, offset, data, token)? {
            RmaOutcome::NoResource => Ok(SendOutcome::NoResource),
            RmaOutcome::Done(()) => {
                Self::request(rpc, &mut self.unsent, pending)?;
                Ok(SendOutcome::Done)
            }
            RmaOutcome::InProgress(t) => {
                self.stores.insert(t, pending);
                Ok(SendOutcome::InProgress(t))
            }
        }
    }

    /// Gets `len` bytes at `offset` of `segment`, then runs reply handler `handler` here with
    /// the data as payload and arguments `[offset, len, args[0], args[1]]` (its `channel`
    /// is `channel`). `Done` when the handler already ran (mapped segments).
    #[allow(clippy::too_many_arguments)]
    pub fn get(
        &mut self,
        rpc: &mut Rpc,
        rma: &mut Rma,
        channel: ChannelId,
        segment: &RemoteSegment,
        offset: u64,
        len: usize,
        handler: u16,
        args: [u64; 2],
    ) -> Result<SendOutcome, BulkError> {
        let token = self.token();
        let pending = Pending { channel, handler, args: [offset, len as u64, args[0], args[1]] };
        self.scratch.resize(len, 0);
        match rma.get(segment, offset, &mut self.scratch[..len], token)? {
            RmaOutcome::NoResource => Ok(SendOutcome::NoResource),
            RmaOutcome::Done(()) => {
                let msg = AmMessage { channel, handler, args: pending.args, payload: &self.scratch[..len] };
                if !rpc.run_am_reply(&msg) {
                    tracing::debug!(handler, "bulk get: no reply handler registered");
                }
                Ok(SendOutcome::Done)
            }
            RmaOutcome::InProgress(t) => {
                self.gets.insert(t, pending);
                Ok(SendOutcome::InProgress(t))
            }
        }
    }

    /// Collects RMA completions: a finished store sends its request, a finished get runs its
    /// reply handler; failures and the caller's own completions go to `events`. Also sends
    /// store requests that waited for room. Returns the transfers finished.
    pub fn poll(&mut self, rpc: &mut Rpc, rma: &mut Rma, mut events: impl FnMut(BulkEvent<'_>)) -> usize {
        let mut done = 0;
        while let Some(p) = self.unsent.pop_front() {
            match rpc.am_request(p.channel, p.handler, p.args, &[]) {
                Ok(SendOutcome::NoResource) => {
                    self.unsent.push_front(p);
                    break;
                }
                Ok(_) => done += 1,
                Err(e) => tracing::debug!("bulk store request not sent: {e}"),
            }
        }
        let BulkAm { stores, gets, unsent, .. } = self;
        let mut ready = Vec::new();
        rma.poll(64, |c| {
            if c.token & BULK_TOKEN_BIT == 0 {
                return events(BulkEvent::Rma(c));
            }
            if let Some(p) = stores.remove(&c.token) {
                match c.result {
                    Ok(_) => ready.push(p),
                    Err(error) => events(BulkEvent::Failed { token: c.token, error }),
                }
            } else if let Some(p) = gets.remove(&c.token) {
                done += 1;
                match c.result {
                    Ok(Completed::Get(data)) => {
                        let msg = AmMessage { channel: p.channel, handler: p.handler, args: p.args, payload: data };
                        if !rpc.run_am_reply(&msg) {
                            events(BulkEvent::NoHandler { handler: p.handler });
                        }
                    }
                    Ok(_) => events(BulkEvent::Failed { token: c.token, error: RmaError::InvalidHandle }),
                    Err(error) => events(BulkEvent::Failed { token: c.token, error }),
                }
            }
        });
        for p in ready {
            done += 1;
            if let Err(e) = Self::request(rpc, unsent, p) {
                tracing::debug!("bulk store request not sent: {e}");
            }
        }
        done
    }
}
