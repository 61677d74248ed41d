//! Membership datagrams: layout, encoding, and authentication with the cluster secret.
//!
//! ```text
//!  0      2         3      4           12                   20            28            36                     44        52
//!  | "UM" | version | kind | sender id | sender incarnation | sender view | receiver id | receiver incarnation | counter | body (per kind) ... | HMAC tag |
//! ```
//!
//! All integers are little-endian. The tag is the first 16 bytes of
//! HMAC-SHA256(secret, every byte before it): a node without the secret can neither join
//! nor disturb a cluster, and its datagrams are dropped and counted before any field is
//! trusted. Every datagram names its sender's view, so a node that missed a view learns
//! of it from the next datagram it gets. The sender's incarnation, the receiver and its
//! incarnation, and the counter are the datagram's [`Stamp`]: they make a recorded
//! datagram worthless later ([`crate::freshness`]).
//!
//! The format is append-only (STYLE §11): kinds keep their numbers forever, and new
//! fields go at the end of a body, where older decoders ignore them. Version history:
//! * 1 — first version. Later, appended within it: `Promise` ends with its row version
//!   (a `Promise` without it reads as row 0).
//! * 2 — the stamp in the header (issue #31: version-1 datagrams carry nothing fresh, so
//!   a recorded join request re-admitted a dead node). The header grows from 20 to 52
//!   bytes, so version-1 datagrams are refused as another version: every node of a
//!   cluster moves to version 2 together. New kinds: `Challenge` (13) and `JoinerAlive`
//!   (14).

use crate::view::{Member, MemberId, View, NAME_MAX};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

type HmacSha256 = Hmac<Sha256>;

const MAGIC: [u8; 2] = *b"UM";
/// Wire version spoken and accepted.
pub const VERSION: u8 = 2;
/// Length of the fixed header.
pub const HEADER_LEN: usize = 52;
/// Length of the authentication tag.
pub const TAG_LEN: usize = 16;
/// Largest datagram sent or accepted.
pub const PACKET_MAX: usize = 60 << 10;
/// Most members in a view, a digest or a list on the wire.
pub const LIST_MAX: usize = 1024;

/// A ballot of the regroup's agreement round: higher rounds win, ties go to the higher id.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ballot {
    /// The round.
    pub round: u32,
    /// The proposing member.
    pub proposer: MemberId,
}

/// What a membership datagram says.
///
/// WARNING: the discriminants in [`Message::kind`] are on the wire; never renumber them,
/// only add new ones.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Message {
    /// Liveness and gossip: the sender's vector of heartbeat versions and the members it
    /// suspects (suspicions spread with the heartbeats).
    Heartbeat {
        /// (member, heartbeat version) for every member the sender knows.
        digest: Vec<(MemberId, u64)>,
        /// Members the sender currently suspects.
        suspects: Vec<MemberId>,
    },
    /// A node asks to join (to a seed, its sponsor) or the sponsor forwards the request to
    /// the coordinator.
    JoinRequest {
        /// The joiner.
        member: Member,
        /// Set when a sponsor forwards it.
        forwarded: bool,
    },
    /// A member suspects another (sent to the coordinator).
    Suspect {
        /// The suspected member.
        target: MemberId,
    },
    /// Regroup stage 1: the proposer asks the members of view `base` to take part.
    Prepare {
        /// The view being changed.
        base: u64,
        /// The proposer's ballot.
        ballot: Ballot,
    },
    /// Regroup stage 1 answer: the member takes part, with its connectivity row.
    Promise {
        /// The view being changed.
        base: u64,
        /// The ballot promised.
        ballot: Ballot,
        /// A next view this member already accepted in an earlier ballot, if any.
        accepted: Option<(Ballot, View)>,
        /// The members this member cannot hear (its row of the connectivity matrix).
        suspects: Vec<MemberId>,
        /// Version of the row, raised whenever the member's row changes: a corrected row
        /// and the one it corrects may arrive in either order, and the proposer keeps the
        /// newest.
        row: u32,
    },
    /// The member refuses a ballot: it promised a higher one, or is in another view.
    Nack {
        /// The view the refused message was about.
        base: u64,
        /// The ballot the member promised.
        promised: Ballot,
    },
    /// Regroup stage 2/3: the proposer asks the members to accept the next view.
    Accept {
        /// The view being changed.
        base: u64,
        /// The proposer's ballot.
        ballot: Ballot,
        /// The proposed next view.
        proposal: View,
    },
    /// The member accepted the proposal of this ballot.
    Accepted {
        /// The view being changed.
        base: u64,
        /// The ballot accepted.
        ballot: Ballot,
    },
    /// A view chosen by a quorum of its predecessor: install it.
    Commit {
        /// The view.
        view: View,
    },
    /// Asks for the sender's installed view (answered with `Commit`).
    ViewRequest,
    /// Regroup connectivity check: are you there?
    Probe,
    /// Answer to `Probe`.
    ProbeAck,
    /// Answer to a datagram that was not made for the receiver's current process (its
    /// stamp names another receiver or incarnation): the answer's stamp tells the sender
    /// the receiver's incarnation ([`crate::freshness`]).
    Challenge,
    /// A joiner answers the `Prepare` of a regroup that may admit it: it is alive now and
    /// still asks to join. Only joiners that answered the ballot enter its proposal.
    JoinerAlive {
        /// The view being changed.
        base: u64,
        /// The ballot answered.
        ballot: Ballot,
    },
}

impl Message {
    /// The wire discriminant.
    pub fn kind(&self) -> u8 {
        match self {
            Message::Heartbeat { .. } => 1,
            Message::JoinRequest { .. } => 2,
            Message::Suspect { .. } => 3,
            Message::Prepare { .. } => 4,
            Message::Promise { .. } => 5,
            Message::Nack { .. } => 6,
            Message::Accept { .. } => 7,
            Message::Accepted { .. } => 8,
            Message::Commit { .. } => 9,
            Message::ViewRequest => 10,
            Message::Probe => 11,
            Message::ProbeAck => 12,
            Message::Challenge => 13,
            Message::JoinerAlive { .. } => 14,
        }
    }

    /// A short name for logs and counters.
    pub fn name(&self) -> &'static str {
        match self {
            Message::Heartbeat { .. } => "heartbeat",
            Message::JoinRequest { .. } => "join_request",
            Message::Suspect { .. } => "suspect",
            Message::Prepare { .. } => "prepare",
            Message::Promise { .. } => "promise",
            Message::Nack { .. } => "nack",
            Message::Accept { .. } => "accept",
            Message::Accepted { .. } => "accepted",
            Message::Commit { .. } => "commit",
            Message::ViewRequest => "view_request",
            Message::Probe => "probe",
            Message::ProbeAck => "probe_ack",
            Message::Challenge => "challenge",
            Message::JoinerAlive { .. } => "joiner_alive",
        }
    }
}

/// What makes a datagram fresh ([`crate::freshness`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stamp {
    /// The sender's incarnation: chosen when its process started, larger after every
    /// restart; never 0.
    pub sender_incarnation: u64,
    /// The member the datagram is for, as the sender knows it (0: not known yet).
    pub receiver: MemberId,
    /// The receiver's incarnation as the sender knows it (0: not known yet).
    pub receiver_incarnation: u64,
    /// The sender's number for this datagram, counted from 1 in each incarnation.
    pub counter: u64,
}

/// A decoded, authenticated datagram.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Packet {
    /// Who sent it.
    pub sender: MemberId,
    /// The sender's installed view (0 before its first).
    pub sender_view: u64,
    /// Its freshness.
    pub stamp: Stamp,
    /// What it says.
    pub message: Message,
}

/// Why a datagram was dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Shorter than a header and a tag, or longer than [`PACKET_MAX`].
    #[error("datagram length {0} out of bounds")]
    Length(usize),
    /// Not a membership datagram.
    #[error("bad magic")]
    Magic,
    /// Another wire version.
    #[error("wire version {0}, we speak {VERSION}")]
    Version(u8),
    /// The tag does not verify: the sender does not know the cluster secret, or the
    /// datagram was altered.
    #[error("authentication failed")]
    Auth,
    /// Unknown message kind.
    #[error("unknown kind {0}")]
    Kind(u8),
    /// A body field runs past the end or breaks a bound.
    #[error("malformed body: {0}")]
    Body(&'static str),
}

/// Computes and checks tags with one secret (the keyed state is prepared once).
#[derive(Clone)]
pub struct Authenticator {
    mac: HmacSha256,
}

impl std::fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Authenticator")
    }
}

impl Authenticator {
    /// Keys with the cluster secret (any length; empty is a valid, weak secret).
    pub fn new(secret: &[u8]) -> Self {
        Self { mac: HmacSha256::new_from_slice(secret).expect("HMAC takes keys of any length") }
    }

    fn tag(&self, data: &[u8]) -> [u8; TAG_LEN] {
        let mut m = self.mac.clone();
        m.update(data);
        let full = m.finalize().into_bytes();
        full[..TAG_LEN].try_into().expect("16 of 32 bytes")
    }

    fn verify(&self, data: &[u8], tag: &[u8]) -> bool {
        let mut m = self.mac.clone();
        m.update(data);
        m.verify_truncated_left(tag).is_ok()
    }

    /// Encodes and signs a datagram.
    pub fn encode(&self, packet: &Packet) -> Vec<u8> {
        let mut w = Vec::with_capacity(128);
        w.extend_from_slice(&MAGIC);
        w.push(VERSION);
        w.push(packet.message.kind());
        let stamp = &packet.stamp;
        debug_assert!(stamp.sender_incarnation != 0 && stamp.counter != 0, "stamps count from 1");
        for field in [
            packet.sender.0,
            stamp.sender_incarnation,
            packet.sender_view,
            stamp.receiver.0,
            stamp.receiver_incarnation,
            stamp.counter,
        ] {
            put_u64(&mut w, field);
        }
        debug_assert_eq!(w.len(), HEADER_LEN, "the header is HEADER_LEN bytes");
        encode_body(&mut w, &packet.message);
        let tag = self.tag(&w);
        w.extend_from_slice(&tag);
        debug_assert!(w.len() <= PACKET_MAX, "a datagram fits PACKET_MAX");
        w
    }

    /// Verifies and decodes a datagram. Nothing in it is trusted before the tag verifies.
    pub fn decode(&self, data: &[u8]) -> Result<Packet, DecodeError> {
        if data.len() < HEADER_LEN + TAG_LEN || data.len() > PACKET_MAX {
            return Err(DecodeError::Length(data.len()));
        }
        if data[..2] != MAGIC {
            return Err(DecodeError::Magic);
        }
        if data[2] != VERSION {
            return Err(DecodeError::Version(data[2]));
        }
        let (signed, tag) = data.split_at(data.len() - TAG_LEN);
        if !self.verify(signed, tag) {
            return Err(DecodeError::Auth);
        }
        let mut r = Reader { data: signed, pos: 4 };
        let sender = MemberId(r.u64()?);
        let sender_incarnation = r.u64()?;
        let sender_view = r.u64()?;
        let stamp = Stamp {
            sender_incarnation,
            receiver: MemberId(r.u64()?),
            receiver_incarnation: r.u64()?,
            counter: r.u64()?,
        };
        if stamp.sender_incarnation == 0 || stamp.counter == 0 {
            return Err(DecodeError::Body("incarnation or counter 0 (both count from 1)"));
        }
        let message = decode_body(signed[3], &mut r)?;
        Ok(Packet { sender, sender_view, stamp, message })
    }
}

fn put_u64(w: &mut Vec<u8>, v: u64) {
    w.extend_from_slice(&v.to_le_bytes());
}

fn put_len(w: &mut Vec<u8>, n: usize) {
    assert!(n <= LIST_MAX, "lists on the wire hold at most LIST_MAX entries");
    w.extend_from_slice(&(n as u16).to_le_bytes());
}

fn put_ballot(w: &mut Vec<u8>, b: Ballot) {
    w.extend_from_slice(&b.round.to_le_bytes());
    put_u64(w, b.proposer.0);
}

fn put_ids(w: &mut Vec<u8>, ids: &[MemberId]) {
    put_len(w, ids.len());
    for id in ids {
        put_u64(w, id.0);
    }
}

fn put_member(w: &mut Vec<u8>, m: &Member) {
    put_u64(w, m.id.0);
    let name = m.name.as_bytes();
    assert!(name.len() <= NAME_MAX, "member names are at most NAME_MAX bytes");
    w.push(name.len() as u8);
    w.extend_from_slice(name);
    match m.addr.ip() {
        IpAddr::V4(ip) => {
            w.push(4);
            w.extend_from_slice(&ip.octets());
        }
        IpAddr::V6(ip) => {
            w.push(6);
            w.extend_from_slice(&ip.octets());
        }
    }
    w.extend_from_slice(&m.addr.port().to_le_bytes());
}

fn put_view(w: &mut Vec<u8>, v: &View) {
    put_u64(w, v.id);
    put_u64(w, v.tiebreaker.0);
    put_len(w, v.members.len());
    for m in &v.members {
        put_member(w, m);
    }
}

fn encode_body(w: &mut Vec<u8>, m: &Message) {
    match m {
        Message::Heartbeat { digest, suspects } => {
            put_len(w, digest.len());
            for (id, version) in digest {
                put_u64(w, id.0);
                put_u64(w, *version);
            }
            put_ids(w, suspects);
        }
        Message::JoinRequest { member, forwarded } => {
            put_member(w, member);
            w.push(u8::from(*forwarded));
        }
        Message::Suspect { target } => put_u64(w, target.0),
        Message::Prepare { base, ballot }
        | Message::Accepted { base, ballot }
        | Message::JoinerAlive { base, ballot } => {
            put_u64(w, *base);
            put_ballot(w, *ballot);
        }
        Message::Promise { base, ballot, accepted, suspects, row } => {
            put_u64(w, *base);
            put_ballot(w, *ballot);
            match accepted {
                None => w.push(0),
                Some((b, v)) => {
                    w.push(1);
                    put_ballot(w, *b);
                    put_view(w, v);
                }
            }
            put_ids(w, suspects);
            w.extend_from_slice(&row.to_le_bytes());
        }
        Message::Nack { base, promised } => {
            put_u64(w, *base);
            put_ballot(w, *promised);
        }
        Message::Accept { base, ballot, proposal } => {
            put_u64(w, *base);
            put_ballot(w, *ballot);
            put_view(w, proposal);
        }
        Message::Commit { view } => put_view(w, view),
        Message::ViewRequest | Message::Probe | Message::ProbeAck | Message::Challenge => {}
    }
}

struct Reader<'a> {
    data: &'a [u8],
    pos: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], DecodeError> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.data.len()).ok_or(DecodeError::Body("truncated"))?;
        let s = &self.data[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().expect("2 bytes")))
    }
    fn at_end(&self) -> bool {
        self.pos == self.data.len()
    }

    fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }
    fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }
    fn len(&mut self) -> Result<usize, DecodeError> {
        let n = self.u16()? as usize;
        if n > LIST_MAX {
            return Err(DecodeError::Body("list longer than LIST_MAX"));
        }
        Ok(n)
    }
    fn ballot(&mut self) -> Result<Ballot, DecodeError> {
        Ok(Ballot { round: self.u32()?, proposer: MemberId(self.u64()?) })
    }
    fn ids(&mut self) -> Result<Vec<MemberId>, DecodeError> {
        let n = self.len()?;
        (0..n).map(|_| self.u64().map(MemberId)).collect()
    }
    fn member(&mut self) -> Result<Member, DecodeError> {
        let id = MemberId(self.u64()?);
        let name_len = self.u8()? as usize;
        if name_len > NAME_MAX {
            return Err(DecodeError::Body("name longer than NAME_MAX"));
        }
        let name =
            std::str::from_utf8(self.take(name_len)?).map_err(|_| DecodeError::Body("name is not UTF-8"))?.to_owned();
        let ip = match self.u8()? {
            4 => IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(self.take(4)?).expect("4 bytes"))),
            6 => IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(self.take(16)?).expect("16 bytes"))),
            _ => return Err(DecodeError::Body("unknown address family")),
        };
        let port = self.u16()?;
        Ok(Member { id, name, addr: SocketAddr::new(ip, port) })
    }
    fn view(&mut self) -> Result<View, DecodeError> {
        let id = self.u64()?;
        let tiebreaker = MemberId(self.u64()?);
        let n = self.len()?;
        if n == 0 {
            return Err(DecodeError::Body("empty view"));
        }
        let members = (0..n).map(|_| self.member()).collect::<Result<Vec<_>, _>>()?;
        if !members.windows(2).all(|w| w[0].id < w[1].id) {
            return Err(DecodeError::Body("view members not in strictly increasing id order"));
        }
        if tiebreaker != members[0].id {
            return Err(DecodeError::Body("tie-breaker is not the lowest member id"));
        }
        Ok(View { id, members, tiebreaker })
    }
}

fn decode_body(kind: u8, r: &mut Reader<'_>) -> Result<Message, DecodeError> {
    // Bytes after the fields of our version are ignored: later versions append there.
    Ok(match kind {
        1 => {
            let n = r.len()?;
            let digest = (0..n).map(|_| Ok((MemberId(r.u64()?), r.u64()?))).collect::<Result<Vec<_>, _>>()?;
            Message::Heartbeat { digest, suspects: r.ids()? }
        }
        2 => Message::JoinRequest { member: r.member()?, forwarded: r.u8()? != 0 },
        3 => Message::Suspect { target: MemberId(r.u64()?) },
        4 => Message::Prepare { base: r.u64()?, ballot: r.ballot()? },
        5 => {
            let base = r.u64()?;
            let ballot = r.ballot()?;
            let accepted = match r.u8()? {
                0 => None,
                1 => Some((r.ballot()?, r.view()?)),
                _ => return Err(DecodeError::Body("bad option flag")),
            };
            let suspects = r.ids()?;
            let row = if r.at_end() { 0 } else { r.u32()? };
            Message::Promise { base, ballot, accepted, suspects, row }
        }
        6 => Message::Nack { base: r.u64()?, promised: r.ballot()? },
        7 => Message::Accept { base: r.u64()?, ballot: r.ballot()?, proposal: r.view()? },
        8 => Message::Accepted { base: r.u64()?, ballot: r.ballot()? },
        9 => Message::Commit { view: r.view()? },
        10 => Message::ViewRequest,
        11 => Message::Probe,
        12 => Message::ProbeAck,
        13 => Message::Challenge,
        14 => Message::JoinerAlive { base: r.u64()?, ballot: r.ballot()? },
        k => return Err(DecodeError::Kind(k)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn member(i: u64) -> Member {
        Member { id: MemberId(i), name: format!("node-{i}"), addr: ([127, 0, 0, 1], 7000 + i as u16).into() }
    }

    fn stamp() -> Stamp {
        Stamp { sender_incarnation: 11, receiver: MemberId(2), receiver_incarnation: 13, counter: 17 }
    }

    fn packet(sender: u64, sender_view: u64, message: Message) -> Packet {
        Packet { sender: MemberId(sender), sender_view, stamp: stamp(), message }
    }

    fn samples() -> Vec<Message> {
        let view = View::new(4, vec![member(3), member(1), member(2)]);
        vec![
            Message::Heartbeat { digest: vec![(MemberId(1), 9), (MemberId(2), 7)], suspects: vec![MemberId(2)] },
            Message::JoinRequest { member: member(5), forwarded: true },
            Message::Suspect { target: MemberId(2) },
            Message::Prepare { base: 4, ballot: Ballot { round: 2, proposer: MemberId(1) } },
            Message::Promise {
                base: 4,
                ballot: Ballot { round: 2, proposer: MemberId(1) },
                accepted: Some((Ballot { round: 1, proposer: MemberId(3) }, view.clone())),
                suspects: vec![],
                row: 7,
            },
            Message::Nack { base: 4, promised: Ballot { round: 3, proposer: MemberId(2) } },
            Message::Accept { base: 4, ballot: Ballot { round: 2, proposer: MemberId(1) }, proposal: view.clone() },
            Message::Accepted { base: 4, ballot: Ballot { round: 2, proposer: MemberId(1) } },
            Message::Commit { view },
            Message::ViewRequest,
            Message::Probe,
            Message::ProbeAck,
            Message::Challenge,
            Message::JoinerAlive { base: 4, ballot: Ballot { round: 2, proposer: MemberId(1) } },
        ]
    }

    #[test]
    fn every_message_round_trips() {
        let auth = Authenticator::new(b"secret");
        for message in samples() {
            let p = packet(77, 4, message);
            let bytes = auth.encode(&p);
            assert_eq!(auth.decode(&bytes), Ok(p));
        }
    }

    /// A `Promise` from a sender that does not append its row version (the body as first
    /// written) still decodes, as row 0.
    #[test]
    fn a_promise_without_its_row_version_reads_as_row_zero() {
        let auth = Authenticator::new(b"secret");
        let message = Message::Promise {
            base: 4,
            ballot: Ballot { round: 2, proposer: MemberId(1) },
            accepted: None,
            suspects: vec![MemberId(3)],
            row: 9,
        };
        let bytes = auth.encode(&packet(5, 4, message.clone()));
        let mut unsigned = bytes[..bytes.len() - TAG_LEN - 4].to_vec();
        let tag = auth.tag(&unsigned);
        unsigned.extend_from_slice(&tag);
        let Message::Promise { row, suspects, .. } = auth.decode(&unsigned).expect("decodes").message else {
            panic!("not a promise")
        };
        assert_eq!((row, suspects), (0, vec![MemberId(3)]));
    }

    #[test]
    fn a_stranger_without_the_secret_is_refused() {
        let ours = Authenticator::new(b"secret");
        let theirs = Authenticator::new(b"guess");
        let bytes = theirs.encode(&packet(1, 9, Message::ViewRequest));
        assert_eq!(ours.decode(&bytes), Err(DecodeError::Auth));
    }

    #[test]
    fn any_flipped_bit_is_refused() {
        let auth = Authenticator::new(b"secret");
        let bytes = auth.encode(&packet(1, 2, samples()[0].clone()));
        for i in 0..bytes.len() {
            for bit in 0..8 {
                let mut b = bytes.clone();
                b[i] ^= 1 << bit;
                assert!(auth.decode(&b).is_err(), "flip of bit {bit} of byte {i} accepted");
            }
        }
    }

    proptest! {
        #[test]
        fn random_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..2048)) {
            let auth = Authenticator::new(b"secret");
            let _ = auth.decode(&data);
        }

        /// Signed but malformed bodies (a member of the cluster gone wrong) are rejected
        /// without panics or out-of-bounds reads.
        #[test]
        fn signed_garbage_bodies_never_panic(kind in 0u8..16, body in proptest::collection::vec(any::<u8>(), 0..512)) {
            let auth = Authenticator::new(b"secret");
            let mut w = Vec::new();
            w.extend_from_slice(&MAGIC);
            w.push(VERSION);
            w.push(kind);
            w.extend_from_slice(&[1; HEADER_LEN - 4]);
            w.extend_from_slice(&body);
            let tag = auth.tag(&w);
            w.extend_from_slice(&tag);
            let _ = auth.decode(&w);
        }

        #[test]
        fn heartbeats_round_trip(entries in proptest::collection::vec((any::<u64>(), any::<u64>()), 0..64),
                                 suspects in proptest::collection::vec(any::<u64>(), 0..8)) {
            let auth = Authenticator::new(b"k");
            let message = Message::Heartbeat {
                digest: entries.into_iter().map(|(a, b)| (MemberId(a), b)).collect(),
                suspects: suspects.into_iter().map(MemberId).collect(),
            };
            let p = packet(3, 1, message);
            prop_assert_eq!(auth.decode(&auth.encode(&p)), Ok(p));
        }

        /// Every stamp survives encoding, whatever the message.
        #[test]
        fn stamps_round_trip(sender_incarnation in 1u64.., receiver in any::<u64>(), receiver_incarnation in any::<u64>(),
                             counter in 1u64.., sender in any::<u64>(), sender_view in any::<u64>(), which in 0usize..14) {
            let auth = Authenticator::new(b"k");
            let stamp = Stamp { sender_incarnation, receiver: MemberId(receiver), receiver_incarnation, counter };
            let p = Packet { sender: MemberId(sender), sender_view, stamp, message: samples()[which].clone() };
            prop_assert_eq!(auth.decode(&auth.encode(&p)), Ok(p));
        }
    }

    /// A stamp whose incarnation or counter is 0 (never sent: both count from 1) is refused.
    #[test]
    fn a_stamp_counting_from_zero_is_refused() {
        let auth = Authenticator::new(b"secret");
        // Offsets of the sender incarnation and of the counter in the header.
        for offset in [12, 44] {
            let mut bytes = auth.encode(&packet(1, 1, Message::Probe));
            bytes.truncate(bytes.len() - TAG_LEN);
            bytes[offset..offset + 8].fill(0);
            let tag = auth.tag(&bytes);
            bytes.extend_from_slice(&tag);
            assert!(matches!(auth.decode(&bytes), Err(DecodeError::Body(_))), "zero at {offset}");
        }
    }

    /// A version-1 datagram (header without a stamp) is refused as another version.
    #[test]
    fn a_version_one_datagram_is_refused() {
        let auth = Authenticator::new(b"secret");
        let mut bytes = auth.encode(&packet(1, 1, Message::Probe));
        bytes[2] = 1;
        assert_eq!(auth.decode(&bytes), Err(DecodeError::Version(1)));
    }
}
