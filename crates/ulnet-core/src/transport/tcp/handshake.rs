//! The connection handshake of socket transports: version check and mutual proof of the
//! cluster secret, so a stranger can neither connect nor be connected to.
//!
//! ```text
//!  client                                              server
//!    | -- HELLO  magic, version, client nonce, client tag, client node ---> |
//!    | <-- CHALLENGE magic, version, server nonce, server tag,              |
//!    |        HMAC(secret, "server" | both nonces | both tags | both nodes), |
//!    |        server node                                                   |
//!    | -- PROOF HMAC(secret, "client" | both nonces | tags | nodes) ------> |
//! ```
//!
//! Messages have fixed sizes; any deviation ends the handshake. Version history:
//! 1 — first version; 2 — node ids appended to HELLO and CHALLENGE and covered by the
//! MACs. Wire layout is append-only: new fields go at the end.
//!
//! # The machine
//!
//! [`Handshake`] is a sans-IO state machine (no sockets, no clock, no randomness: the
//! driver passes `now` and the side's nonce), one per connection, for either role. A driver
//! calls, in any order and as often as it likes:
//! - input: [`Handshake::input_wanted`] (how many bytes to read next: never more, so that
//!   the channel's first frames, which may follow the last handshake message at once, stay
//!   in the socket) and [`Handshake::handle_input`]; [`Handshake::handle_closed`] when the
//!   peer closed or reset the connection;
//! - output: [`Handshake::poll_transmit`] and [`Handshake::handle_transmitted`];
//! - time: [`Handshake::poll_timeout`] and [`Handshake::handle_timeout`] (the one timer is
//!   the handshake's deadline);
//! - result: [`Handshake::poll_outcome`], once.
//!
//! A listener runs many of them over non-blocking sockets (see the listener module);
//! [`client`] and [`server`] drive one over a blocking stream.
//!
//! # Replay review (issue #31)
//!
//! Each side proves the secret with an HMAC over *both* sides' nonces, 16 fresh random
//! bytes per connection, and over both tags and node ids, under a role label ("server" or
//! "client"). A recorded CHALLENGE is worthless to a replayer: the client it is replayed to
//! chose a new nonce the old MAC does not cover. A recorded PROOF is worthless: the server
//! chose a new nonce. The role labels keep a side's own proof from being reflected back to
//! it. A replayed HELLO only makes the server answer with a CHALLENGE it cannot complete;
//! it costs the server one HMAC and one handshake slot, bounded by the listener like any
//! other stranger's connection. Nothing can be replayed to open a channel. What the
//! handshake does not do: protect the frames that follow (TCP channels carry no MAC per
//! frame), so an attacker on the path who can inject into a TCP stream could still forge
//! frames of an established channel; run the cluster on a network you trust, or in a
//! tunnel, against that.

use crate::node::NodeId;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::io::{self, Read, Write};
use std::time::Instant;

type HmacSha256 = Hmac<Sha256>;

const MAGIC: u64 = u64::from_le_bytes(*b"ULNETTCP");
/// Protocol version spoken.
pub const VERSION: u32 = 2;
const HELLO_LEN: usize = 8 + 4 + 16 + 4 + 4;
const CHALLENGE_LEN: usize = 8 + 4 + 16 + 4 + 32 + 4;
const PROOF_LEN: usize = 32;
/// The longest handshake message (a machine's input and output buffers).
const MESSAGE_LEN_MAX: usize = CHALLENGE_LEN;
const _: () = assert!(HELLO_LEN <= MESSAGE_LEN_MAX && PROOF_LEN <= MESSAGE_LEN_MAX);

/// Why a handshake failed.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    /// The other side speaks something else.
    #[error("not a ulnet peer")]
    NotUlnet,
    /// The other side speaks another protocol version.
    #[error("peer speaks protocol version {0}, we speak {VERSION}")]
    Version(u32),
    /// The other side does not know the cluster secret.
    #[error("peer failed to prove the cluster secret")]
    BadSecret,
    /// The other side closed or reset the connection before the handshake finished.
    #[error("peer closed the connection during the handshake")]
    Closed,
    /// The handshake did not finish before its deadline.
    #[error("handshake not finished before its deadline")]
    TimedOut,
    /// The connection broke (blocking drivers only; the machine never reports it).
    #[error("handshake I/O: {0}")]
    Io(#[from] io::Error),
}

/// 16 fresh random bytes, for [`OurHello::nonce`].
pub fn nonce() -> [u8; 16] {
    let mut n = [0u8; 16];
    // The nonce only has to be fresh; getrandom cannot fail on Linux ≥ 3.17 in practice,
    // and a zero nonce would still not let a stranger past the HMAC.
    let _ = rustix::rand::getrandom(&mut n, rustix::rand::GetRandomFlags::empty());
    n
}

/// What both sides exchanged and the MACs cover: (client, server) tags and node ids
/// (the UDP handshake's tags are its connection ids).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ids {
    pub(crate) tags: (u32, u32),
    pub(crate) nodes: (u32, u32),
}

fn keyed(secret: &[u8], role: &[u8], cn: &[u8; 16], sn: &[u8; 16], ids: Ids) -> HmacSha256 {
    let mut m = HmacSha256::new_from_slice(secret).expect("HMAC takes keys of any length");
    m.update(role);
    m.update(cn);
    m.update(sn);
    for v in [ids.tags.0, ids.tags.1, ids.nodes.0, ids.nodes.1] {
        m.update(&v.to_le_bytes());
    }
    m
}

/// HMAC-SHA256 of a handshake role, both nonces and the ids (shared with the UDP handshake).
pub(crate) fn mac(secret: &[u8], role: &[u8], cn: &[u8; 16], sn: &[u8; 16], ids: Ids) -> [u8; 32] {
    keyed(secret, role, cn, sn, ids).finalize().into_bytes().into()
}

/// Checks a proof made by [`mac`] in constant time (shared with the UDP handshake).
pub(crate) fn verify(
    secret: &[u8],
    role: &[u8],
    cn: &[u8; 16],
    sn: &[u8; 16],
    ids: Ids,
    proof: &[u8],
) -> Result<(), HandshakeError> {
    keyed(secret, role, cn, sn, ids).verify_slice(proof).map_err(|_| HandshakeError::BadSecret)
}

/// What a handshake learns about the other side.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Peer {
    /// The tag its frames carry.
    pub tag: u32,
    /// Its node id.
    pub node: NodeId,
}

/// What one side says about itself: the tag it wants on the frames it receives, its node
/// id, and its nonce (fresh random bytes for every connection: see [`nonce`]).
#[derive(Clone, Copy, Debug)]
pub struct OurHello {
    /// The tag the peer puts on its frames to us.
    pub tag: u32,
    /// Our node id ([`NodeId::UNKNOWN`] when we have none).
    pub node: NodeId,
    /// Our nonce.
    pub nonce: [u8; 16],
}

fn check_header(buf: &[u8]) -> Result<(), HandshakeError> {
    if u64::from_le_bytes(buf[..8].try_into().expect("8 bytes")) != MAGIC {
        return Err(HandshakeError::NotUlnet);
    }
    let version = u32::from_le_bytes(buf[8..12].try_into().expect("4 bytes"));
    if version != VERSION {
        return Err(HandshakeError::Version(version));
    }
    Ok(())
}

fn u32_at(buf: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(buf[at..at + 4].try_into().expect("4 bytes"))
}

/// Where a handshake is.
#[derive(Clone, Copy, Debug)]
enum Step {
    /// Client: the HELLO goes out; waiting for the CHALLENGE.
    AwaitChallenge,
    /// Client: the PROOF goes out; finished once it is written.
    SendProof(Peer),
    /// Server: waiting for the HELLO.
    AwaitHello,
    /// Server: the CHALLENGE goes out; waiting for the PROOF.
    AwaitProof { client_nonce: [u8; 16], ids: Ids, peer: Peer },
    /// The outcome is known (and perhaps taken).
    Finished,
}

/// One side of one connection's handshake, as a sans-IO state machine (see the module
/// documentation for the method groups).
pub struct Handshake {
    secret: Vec<u8>,
    ours: OurHello,
    step: Step,
    /// The message being received, and how much of it has arrived.
    input: [u8; MESSAGE_LEN_MAX],
    input_len: usize,
    /// The message being sent, and how much of it has been written.
    output: [u8; MESSAGE_LEN_MAX],
    output_len: usize,
    output_sent: usize,
    /// The handshake fails if it has not finished by then (`None`: never; for a blocking
    /// driver whose stream times out by itself).
    deadline: Option<Instant>,
    outcome: Option<Result<Peer, HandshakeError>>,
}

impl std::fmt::Debug for Handshake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handshake").field("step", &self.step).field("deadline", &self.deadline).finish()
    }
}

impl Handshake {
    /// The client's side: its HELLO is ready to be written at once.
    pub fn client(secret: &[u8], ours: OurHello, deadline: Option<Instant>) -> Self {
        let mut hs = Self::new(secret, ours, Step::AwaitChallenge, deadline);
        let mut hello = [0u8; HELLO_LEN];
        hello[..8].copy_from_slice(&MAGIC.to_le_bytes());
        hello[8..12].copy_from_slice(&VERSION.to_le_bytes());
        hello[12..28].copy_from_slice(&ours.nonce);
        hello[28..32].copy_from_slice(&ours.tag.to_le_bytes());
        hello[32..36].copy_from_slice(&ours.node.0.to_le_bytes());
        hs.set_output(&hello);
        hs
    }

    /// The server's side: it waits for the client's HELLO.
    pub fn server(secret: &[u8], ours: OurHello, deadline: Option<Instant>) -> Self {
        Self::new(secret, ours, Step::AwaitHello, deadline)
    }

    fn new(secret: &[u8], ours: OurHello, step: Step, deadline: Option<Instant>) -> Self {
        Self {
            secret: secret.to_vec(),
            ours,
            step,
            input: [0; MESSAGE_LEN_MAX],
            input_len: 0,
            output: [0; MESSAGE_LEN_MAX],
            output_len: 0,
            output_sent: 0,
            deadline,
            outcome: None,
        }
    }

    fn set_output(&mut self, message: &[u8]) {
        assert_eq!(self.output_sent, self.output_len, "a handshake message goes out only after the one before");
        self.output[..message.len()].copy_from_slice(message);
        self.output_len = message.len();
        self.output_sent = 0;
    }

    /// Length of the message the machine waits for now (0: none).
    fn message_len(&self) -> usize {
        match self.step {
            Step::AwaitChallenge => CHALLENGE_LEN,
            Step::AwaitHello => HELLO_LEN,
            Step::AwaitProof { .. } => PROOF_LEN,
            Step::SendProof(_) | Step::Finished => 0,
        }
    }

    /// How many bytes to read from the peer next: the rest of the message awaited (0 when
    /// none is). Read no more than this.
    pub fn input_wanted(&self) -> usize {
        self.message_len() - self.input_len
    }

    /// Takes bytes read from the peer, up to [`Handshake::input_wanted`]; returns how many
    /// it took. A whole message moves the handshake on (or ends it).
    pub fn handle_input(&mut self, bytes: &[u8]) -> usize {
        let take = bytes.len().min(self.input_wanted());
        self.input[self.input_len..self.input_len + take].copy_from_slice(&bytes[..take]);
        self.input_len += take;
        if take > 0 && self.input_len == self.message_len() {
            self.input_len = 0;
            let result = self.on_message();
            if let Err(e) = result {
                self.finish(Err(e));
            }
        }
        take
    }

    /// The peer closed (a read returned 0) or reset the connection.
    pub fn handle_closed(&mut self) {
        if !matches!(self.step, Step::Finished) {
            self.finish(Err(HandshakeError::Closed));
        }
    }

    /// The bytes to write next (empty: nothing to write now).
    pub fn poll_transmit(&self) -> &[u8] {
        &self.output[self.output_sent..self.output_len]
    }

    /// `n` bytes of [`Handshake::poll_transmit`] were written.
    pub fn handle_transmitted(&mut self, n: usize) {
        assert!(n <= self.output_len - self.output_sent, "wrote more than there was to write");
        self.output_sent += n;
        if let (Step::SendProof(peer), true) = (self.step, self.output_sent == self.output_len) {
            self.finish(Ok(peer));
        }
    }

    /// When [`Handshake::handle_timeout`] must run next: the deadline, while the handshake
    /// has not finished.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.deadline.filter(|_| !matches!(self.step, Step::Finished))
    }

    /// Fails the handshake if its deadline has passed; does nothing otherwise.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.poll_timeout().is_some_and(|d| d <= now) {
            self.finish(Err(HandshakeError::TimedOut));
        }
    }

    /// The outcome, once, when the handshake has finished: the peer, or why it failed. On
    /// success the socket carries the channel's frames from here on.
    pub fn poll_outcome(&mut self) -> Option<Result<Peer, HandshakeError>> {
        self.outcome.take()
    }

    /// Whether the handshake has finished (its outcome may have been taken).
    pub fn is_finished(&self) -> bool {
        matches!(self.step, Step::Finished)
    }

    fn finish(&mut self, outcome: Result<Peer, HandshakeError>) {
        self.step = Step::Finished;
        if outcome.is_err() {
            // Nothing more goes out to a peer that failed.
            self.output_len = self.output_sent;
        }
        self.outcome = Some(outcome);
    }

    /// A whole message has arrived in `input`.
    fn on_message(&mut self) -> Result<(), HandshakeError> {
        match self.step {
            Step::AwaitChallenge => self.on_challenge(),
            Step::AwaitHello => self.on_hello(),
            Step::AwaitProof { client_nonce, ids, peer } => {
                verify(&self.secret, b"client", &client_nonce, &self.ours.nonce, ids, &self.input[..PROOF_LEN])?;
                debug_assert!(self.poll_transmit().is_empty(), "a valid proof answers the whole challenge");
                self.finish(Ok(peer));
                Ok(())
            }
            Step::SendProof(_) | Step::Finished => unreachable!("no input is wanted in {:?}", self.step),
        }
    }

    fn on_challenge(&mut self) -> Result<(), HandshakeError> {
        let ch = &self.input[..CHALLENGE_LEN];
        check_header(ch)?;
        let server_nonce: [u8; 16] = ch[12..28].try_into().expect("16 bytes");
        let peer = Peer { tag: u32_at(ch, 28), node: NodeId(u32_at(ch, 64)) };
        let ids = Ids { tags: (self.ours.tag, peer.tag), nodes: (self.ours.node.0, peer.node.0) };
        verify(&self.secret, b"server", &self.ours.nonce, &server_nonce, ids, &ch[32..64])?;
        let proof = mac(&self.secret, b"client", &self.ours.nonce, &server_nonce, ids);
        self.step = Step::SendProof(peer);
        self.set_output(&proof);
        Ok(())
    }

    fn on_hello(&mut self) -> Result<(), HandshakeError> {
        let hello = &self.input[..HELLO_LEN];
        check_header(hello)?;
        let client_nonce: [u8; 16] = hello[12..28].try_into().expect("16 bytes");
        let peer = Peer { tag: u32_at(hello, 28), node: NodeId(u32_at(hello, 32)) };
        let ids = Ids { tags: (peer.tag, self.ours.tag), nodes: (peer.node.0, self.ours.node.0) };
        let mut ch = [0u8; CHALLENGE_LEN];
        ch[..8].copy_from_slice(&MAGIC.to_le_bytes());
        ch[8..12].copy_from_slice(&VERSION.to_le_bytes());
        ch[12..28].copy_from_slice(&self.ours.nonce);
        ch[28..32].copy_from_slice(&self.ours.tag.to_le_bytes());
        ch[32..64].copy_from_slice(&mac(&self.secret, b"server", &client_nonce, &self.ours.nonce, ids));
        ch[64..68].copy_from_slice(&self.ours.node.0.to_le_bytes());
        self.step = Step::AwaitProof { client_nonce, ids, peer };
        self.set_output(&ch);
        Ok(())
    }
}

/// Runs a handshake over a blocking stream to its end. A read that times out (a stream
/// with a read timeout) ends it as [`HandshakeError::TimedOut`].
pub fn drive_blocking<S: Read + Write>(s: &mut S, hs: &mut Handshake) -> Result<Peer, HandshakeError> {
    let mut buf = [0u8; MESSAGE_LEN_MAX];
    loop {
        while !hs.poll_transmit().is_empty() {
            match s.write(hs.poll_transmit()) {
                Ok(0) => hs.handle_closed(),
                Ok(n) => hs.handle_transmitted(n),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if is_reset(&e) => hs.handle_closed(),
                Err(e) => return Err(e.into()),
            }
        }
        if let Some(outcome) = hs.poll_outcome() {
            return outcome;
        }
        let wanted = hs.input_wanted();
        assert!(wanted > 0, "an unfinished handshake with nothing to send waits for input");
        match s.read(&mut buf[..wanted]) {
            Ok(0) => hs.handle_closed(),
            Ok(n) => {
                hs.handle_input(&buf[..n]);
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                return Err(HandshakeError::TimedOut)
            }
            Err(e) if is_reset(&e) => hs.handle_closed(),
            Err(e) => return Err(e.into()),
        }
        hs.handle_timeout(Instant::now());
    }
}

/// The peer closed the connection under a read or write.
pub(crate) fn is_reset(e: &io::Error) -> bool {
    matches!(e.kind(), io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionAborted)
}

/// Runs the client side over a blocking stream; returns the server's tag.
pub fn client<S: Read + Write>(s: &mut S, secret: &[u8], our_tag: u32) -> Result<u32, HandshakeError> {
    client_node(s, secret, our_tag, NodeId::UNKNOWN).map(|p| p.tag)
}

/// Runs the client side over a blocking stream, telling our node id; returns the server's
/// tag and node id.
pub fn client_node<S: Read + Write>(
    s: &mut S,
    secret: &[u8],
    our_tag: u32,
    our_node: NodeId,
) -> Result<Peer, HandshakeError> {
    let ours = OurHello { tag: our_tag, node: our_node, nonce: nonce() };
    drive_blocking(s, &mut Handshake::client(secret, ours, None))
}

/// Runs the server side over a blocking stream; returns the client's tag.
pub fn server<S: Read + Write>(s: &mut S, secret: &[u8], our_tag: u32) -> Result<u32, HandshakeError> {
    server_node(s, secret, our_tag, NodeId::UNKNOWN).map(|p| p.tag)
}

/// Runs the server side over a blocking stream, telling our node id; returns the client's
/// tag and node id.
pub fn server_node<S: Read + Write>(
    s: &mut S,
    secret: &[u8],
    our_tag: u32,
    our_node: NodeId,
) -> Result<Peer, HandshakeError> {
    let ours = OurHello { tag: our_tag, node: our_node, nonce: nonce() };
    drive_blocking(s, &mut Handshake::server(secret, ours, None))
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;
    use std::time::Duration;

    fn run(
        client_secret: &'static [u8],
        server_secret: &'static [u8],
    ) -> (Result<u32, HandshakeError>, Result<u32, HandshakeError>) {
        let (mut a, mut b) = UnixStream::pair().unwrap();
        let t = std::thread::spawn(move || {
            let r = server(&mut b, server_secret, 22);
            drop(b);
            r
        });
        let c = client(&mut a, client_secret, 11);
        drop(a);
        (c, t.join().unwrap())
    }

    #[test]
    fn same_secret_exchanges_tags() {
        let (c, s) = run(b"cluster", b"cluster");
        assert_eq!((c.unwrap(), s.unwrap()), (22, 11));
    }

    #[test]
    fn wrong_secret_is_refused_by_both_sides() {
        let (c, s) = run(b"stranger", b"cluster");
        assert!(matches!(c, Err(HandshakeError::BadSecret)));
        assert!(s.is_err(), "the server must not accept a client that could not verify it");
    }

    #[test]
    fn node_ids_are_exchanged() {
        let (mut a, mut b) = UnixStream::pair().unwrap();
        let t = std::thread::spawn(move || server_node(&mut b, b"k", 22, NodeId(7)).unwrap());
        let c = client_node(&mut a, b"k", 11, NodeId(3)).unwrap();
        assert_eq!(c, Peer { tag: 22, node: NodeId(7) });
        assert_eq!(t.join().unwrap(), Peer { tag: 11, node: NodeId(3) });
    }

    #[test]
    fn garbage_is_not_ulnet() {
        let (mut a, mut b) = UnixStream::pair().unwrap();
        a.write_all(&[0x42; HELLO_LEN]).unwrap();
        assert!(matches!(server(&mut b, b"x", 1), Err(HandshakeError::NotUlnet)));
    }

    // The machine alone, with no stream: both sides fed from each other's output, in
    // pieces of every size.

    const SECRET: &[u8] = b"machine secret";

    fn hello(tag: u32, node: u32, nonce_byte: u8) -> OurHello {
        OurHello { tag, node: NodeId(node), nonce: [nonce_byte; 16] }
    }

    /// Moves what `from` has to send into `to`, `piece` bytes at a time.
    fn pass(from: &mut Handshake, to: &mut Handshake, piece: usize) {
        while !from.poll_transmit().is_empty() {
            let out = from.poll_transmit();
            let n = out.len().min(piece);
            let chunk = out[..n].to_vec();
            from.handle_transmitted(n);
            let mut at = 0;
            while at < chunk.len() && to.input_wanted() > 0 {
                at += to.handle_input(&chunk[at..]);
            }
        }
    }

    #[test]
    fn machines_agree_whatever_the_pieces_the_bytes_come_in() {
        for piece in [1, 2, 3, 7, 31, 36, 68, 1000] {
            let mut c = Handshake::client(SECRET, hello(11, 3, 1), None);
            let mut s = Handshake::server(SECRET, hello(22, 7, 2), None);
            pass(&mut c, &mut s, piece);
            pass(&mut s, &mut c, piece);
            pass(&mut c, &mut s, piece);
            assert_eq!(c.poll_outcome().unwrap().unwrap(), Peer { tag: 22, node: NodeId(7) }, "piece {piece}");
            assert_eq!(s.poll_outcome().unwrap().unwrap(), Peer { tag: 11, node: NodeId(3) }, "piece {piece}");
            assert!(c.poll_outcome().is_none() && c.is_finished() && s.is_finished(), "one outcome each");
            assert_eq!((c.input_wanted(), s.input_wanted()), (0, 0));
        }
    }

    #[test]
    fn never_takes_more_than_the_message_it_waits_for() {
        let mut s = Handshake::server(SECRET, hello(22, 7, 2), None);
        let mut c = Handshake::client(SECRET, hello(11, 3, 1), None);
        let mut bytes = c.poll_transmit().to_vec();
        bytes.extend_from_slice(b"first frame bytes");
        assert_eq!(s.handle_input(&bytes), HELLO_LEN);
        c.handle_transmitted(HELLO_LEN);
        assert_eq!(s.input_wanted(), PROOF_LEN);
    }

    #[test]
    fn garbage_partial_and_closed_peers_fail_with_their_reason() {
        let mut s = Handshake::server(SECRET, hello(22, 7, 2), None);
        s.handle_input(&[0xAB; 64]);
        assert!(matches!(s.poll_outcome(), Some(Err(HandshakeError::NotUlnet))));
        assert_eq!(s.input_wanted(), 0, "a failed machine reads nothing more");

        let c = Handshake::client(SECRET, hello(11, 3, 1), None);
        let mut hello_v1 = c.poll_transmit().to_vec();
        hello_v1[8..12].copy_from_slice(&1u32.to_le_bytes());
        let mut s = Handshake::server(SECRET, hello(22, 7, 2), None);
        s.handle_input(&hello_v1);
        assert!(matches!(s.poll_outcome(), Some(Err(HandshakeError::Version(1)))));

        // Half a HELLO, then the peer goes away: closed, not accepted.
        let mut s = Handshake::server(SECRET, hello(22, 7, 2), None);
        s.handle_input(&c.poll_transmit()[..HELLO_LEN / 2]);
        assert!(s.poll_outcome().is_none());
        s.handle_closed();
        assert!(matches!(s.poll_outcome(), Some(Err(HandshakeError::Closed))));
        assert!(s.poll_transmit().is_empty());
    }

    #[test]
    fn a_forged_or_replayed_proof_is_bad_secret() {
        // A whole exchange recorded...
        let mut c = Handshake::client(SECRET, hello(11, 3, 1), None);
        let mut s = Handshake::server(SECRET, hello(22, 7, 2), None);
        let recorded_hello = c.poll_transmit().to_vec();
        pass(&mut c, &mut s, 1000);
        pass(&mut s, &mut c, 1000);
        let recorded_proof = c.poll_transmit().to_vec();
        pass(&mut c, &mut s, 1000);
        assert!(matches!(s.poll_outcome(), Some(Ok(_))));
        // ... and replayed to a server, which chose a fresh nonce.
        let mut s = Handshake::server(SECRET, hello(22, 7, 3), None);
        s.handle_input(&recorded_hello);
        assert_eq!(s.poll_transmit().len(), CHALLENGE_LEN, "a replayed HELLO only gets a challenge");
        let n = s.poll_transmit().len();
        s.handle_transmitted(n);
        s.handle_input(&recorded_proof);
        assert!(matches!(s.poll_outcome(), Some(Err(HandshakeError::BadSecret))));
        // A client with another secret refuses the server's challenge.
        let mut stranger = Handshake::client(b"other", hello(11, 3, 4), None);
        let mut s = Handshake::server(SECRET, hello(22, 7, 5), None);
        pass(&mut stranger, &mut s, 1000);
        pass(&mut s, &mut stranger, 1000);
        assert!(matches!(stranger.poll_outcome(), Some(Err(HandshakeError::BadSecret))));
        assert!(stranger.poll_transmit().is_empty(), "no proof goes to a server that failed its own");
    }

    #[test]
    fn the_deadline_is_the_only_timer_and_ends_an_idle_handshake() {
        let start = Instant::now();
        let deadline = start + Duration::from_secs(1);
        let mut s = Handshake::server(SECRET, hello(22, 7, 2), Some(deadline));
        assert_eq!(s.poll_timeout(), Some(deadline));
        s.handle_timeout(start + Duration::from_millis(999));
        assert!(s.poll_outcome().is_none(), "an early timer call is harmless");
        s.handle_timeout(deadline);
        assert!(matches!(s.poll_outcome(), Some(Err(HandshakeError::TimedOut))));
        assert_eq!(s.poll_timeout(), None, "a finished handshake has no timer");
        // A finished one is not failed by its old deadline.
        let mut c = Handshake::client(SECRET, hello(11, 3, 1), Some(deadline));
        let mut s = Handshake::server(SECRET, hello(22, 7, 2), Some(deadline));
        pass(&mut c, &mut s, 1000);
        pass(&mut s, &mut c, 1000);
        pass(&mut c, &mut s, 1000);
        s.handle_timeout(deadline + Duration::from_secs(5));
        assert!(matches!(s.poll_outcome(), Some(Ok(_))));
    }
}
