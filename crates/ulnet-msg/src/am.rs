//! Active messages: a handler table, requests that run a handler at the receiver, and
//! replies that run a handler back at the requester (U-Net Active Messages).
//!
//! The livelock rule — a reply handler may not send a reply — holds by construction: a
//! request handler is given an [`AmReplier`], a reply handler is not, and nothing else in
//! a handler's reach can send.
//!
//! ```text
//!  | message header (24 B, kind AmRequest/AmReply, method = handler) | 4 x u64 args | payload |
//! ```
//!
//! The header's request id numbers a requester's active messages (ids below 2^32, which
//! RPC calls, numbered from generation 1 up in the high half, never use) and a reply
//! carries its request's id back: traces pair them as they pair calls. Handlers do not
//! see it.
//!
//! A reply handler that tries to answer does not compile:
//!
//! ```compile_fail
//! # let mut rpc = ulnet_msg::rpc::Rpc::new(ulnet_core::Endpoint::new(Default::default()), Default::default());
//! rpc.register_am_reply(1, |msg, replier: &mut ulnet_msg::am::AmReplier| replier.reply(2, msg.args, &[]));
//! ```

pub mod bulk;

use crate::wire::{Header, Kind, HEADER_LEN};
use std::collections::VecDeque;
use ulnet_core::{ChannelId, ReplyTo, SendOutcome};

/// Arguments every active message carries.
pub const AM_ARGS: usize = 4;
/// Bytes of the arguments.
pub const AM_ARGS_LEN: usize = AM_ARGS * 8;
/// Most payload buffers of an active message (header and arguments take the other two).
pub const AM_PAYLOAD_GATHER_MAX: usize = ulnet_core::GATHER_MAX - 2;

/// An active message as a handler sees it; the payload is in place.
#[derive(Debug)]
pub struct AmMessage<'a> {
    /// The channel it came on.
    pub channel: ChannelId,
    /// The handler it names.
    pub handler: u16,
    /// Its arguments.
    pub args: [u64; AM_ARGS],
    /// Its payload.
    pub payload: &'a [u8],
}

/// Encodes arguments.
pub(crate) fn encode_args(args: &[u64; AM_ARGS]) -> [u8; AM_ARGS_LEN] {
    let mut b = [0u8; AM_ARGS_LEN];
    for (i, a) in args.iter().enumerate() {
        b[i * 8..i * 8 + 8].copy_from_slice(&a.to_le_bytes());
    }
    b
}

/// Splits arguments and payload off a message body; `None` when it is too short.
pub(crate) fn decode_body(body: &[u8]) -> Option<([u64; AM_ARGS], &[u8])> {
    if body.len() < AM_ARGS_LEN {
        return None;
    }
    let mut args = [0u64; AM_ARGS];
    for (i, a) in args.iter_mut().enumerate() {
        *a = u64::from_le_bytes(body[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
    }
    Some((args, &body[AM_ARGS_LEN..]))
}

/// The gather list of an active message: header, arguments, payload. `request_id` pairs a
/// reply with its request in traces (0: none).
pub(crate) fn frame<'a>(
    kind: Kind,
    handler: u16,
    request_id: u64,
    header: &'a mut [u8; HEADER_LEN],
    args: &'a [u8; AM_ARGS_LEN],
    payload: &[&'a [u8]],
) -> [&'a [u8]; ulnet_core::GATHER_MAX] {
    assert!(
        payload.len() <= AM_PAYLOAD_GATHER_MAX,
        "an active message has at most {AM_PAYLOAD_GATHER_MAX} payload buffers"
    );
    *header = Header { kind, method: handler, status: None, request_id, deadline_us: 0 }.encode();
    let mut gather: [&[u8]; ulnet_core::GATHER_MAX] = [&[]; ulnet_core::GATHER_MAX];
    gather[0] = header;
    gather[1] = args;
    gather[2..2 + payload.len()].copy_from_slice(payload);
    gather
}

/// Given to request handlers only: sends the reply, which runs a reply handler at the
/// requester. At most one reply per request.
pub struct AmReplier<'a, 'b> {
    pub(crate) reply: &'a mut ReplyTo<'b>,
    pub(crate) deferred: &'a mut VecDeque<(crate::rpc::ReplyTarget, Vec<u8>)>,
    pub(crate) channel: ChannelId,
    /// The request's id, echoed by the reply.
    pub(crate) request_id: u64,
    pub(crate) replied: bool,
}

impl AmReplier<'_, '_> {
    /// Replies with `handler` (a reply handler at the requester), arguments and up to
    /// [`AM_PAYLOAD_GATHER_MAX`] payload buffers. Sent now, or at the next poll if the
    /// channel is full at this instant.
    pub fn reply(&mut self, handler: u16, args: [u64; AM_ARGS], payload: &[&[u8]]) {
        assert!(!self.replied, "a request handler replies at most once");
        self.replied = true;
        let mut header = [0u8; HEADER_LEN];
        let args = encode_args(&args);
        let gather = frame(Kind::AmReply, handler, self.request_id, &mut header, &args, payload);
        let gather = &gather[..2 + payload.len()];
        match self.reply.send_as(gather, Kind::AmReply.trace_kind(), self.request_id) {
            Ok(SendOutcome::Done) => {}
            Ok(_) => {
                let target =
                    crate::rpc::ReplyTarget { channel: self.channel, incarnation: self.reply.channel_incarnation() };
                self.deferred.push_back((target, gather.concat()))
            }
            Err(e) => tracing::debug!("active-message reply not sent: {e}"),
        }
    }
}

/// A request handler: may reply once.
pub(crate) type AmRequestHandler = Box<dyn FnMut(&AmMessage<'_>, &mut AmReplier<'_, '_>) + Send>;
/// A reply handler: cannot reply.
pub(crate) type AmReplyHandler = Box<dyn FnMut(&AmMessage<'_>) + Send>;

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn args_round_trip(args: [u64; AM_ARGS], payload in proptest::collection::vec(any::<u8>(), 0..64)) {
            let body = [&encode_args(&args)[..], &payload].concat();
            prop_assert_eq!(decode_body(&body), Some((args, &payload[..])));
        }
    }

    #[test]
    fn short_bodies_are_refused() {
        assert_eq!(decode_body(&[0; AM_ARGS_LEN - 1]), None);
    }
}
