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

use crate::node::NodeId;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::io::{self, Read, Write};

type HmacSha256 = Hmac<Sha256>;

const MAGIC: u64 = u64::from_le_bytes(*b"ULNETTCP");
/// Protocol version spoken.
pub const VERSION: u32 = 2;
const HELLO_LEN: usize = 8 + 4 + 16 + 4 + 4;
const CHALLENGE_LEN: usize = 8 + 4 + 16 + 4 + 32 + 4;
const PROOF_LEN: usize = 32;

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
    /// The connection broke.
    #[error("handshake I/O: {0}")]
    Io(#[from] io::Error),
}

pub(crate) fn nonce() -> [u8; 16] {
    let mut n = [0u8; 16];
    // The nonce only has to be fresh; getrandom cannot fail on Linux ≥ 3.17 in practice,
    // and a zero nonce would still not let a stranger past the HMAC.
    let _ = rustix::rand::getrandom(&mut n, rustix::rand::GetRandomFlags::empty());
    n
}

/// What both sides exchanged and the MACs cover: (client, server) tags and node ids
/// (the UDP handshake's tags are its connection ids).
#[derive(Clone, Copy)]
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

/// Runs the client side; returns the server's tag.
pub fn client<S: Read + Write>(s: &mut S, secret: &[u8], our_tag: u32) -> Result<u32, HandshakeError> {
    client_node(s, secret, our_tag, NodeId::UNKNOWN).map(|p| p.tag)
}

/// Runs the client side, telling our node id; returns the server's tag and node id.
pub fn client_node<S: Read + Write>(
    s: &mut S,
    secret: &[u8],
    our_tag: u32,
    our_node: NodeId,
) -> Result<Peer, HandshakeError> {
    let cn = nonce();
    let mut hello = [0u8; HELLO_LEN];
    hello[..8].copy_from_slice(&MAGIC.to_le_bytes());
    hello[8..12].copy_from_slice(&VERSION.to_le_bytes());
    hello[12..28].copy_from_slice(&cn);
    hello[28..32].copy_from_slice(&our_tag.to_le_bytes());
    hello[32..36].copy_from_slice(&our_node.0.to_le_bytes());
    s.write_all(&hello)?;
    let mut ch = [0u8; CHALLENGE_LEN];
    s.read_exact(&mut ch)?;
    check_header(&ch)?;
    let sn: [u8; 16] = ch[12..28].try_into().expect("16 bytes");
    let server_tag = u32::from_le_bytes(ch[28..32].try_into().expect("4 bytes"));
    let server_node = u32::from_le_bytes(ch[64..68].try_into().expect("4 bytes"));
    let ids = Ids { tags: (our_tag, server_tag), nodes: (our_node.0, server_node) };
    verify(secret, b"server", &cn, &sn, ids, &ch[32..64])?;
    s.write_all(&mac(secret, b"client", &cn, &sn, ids))?;
    Ok(Peer { tag: server_tag, node: NodeId(server_node) })
}

/// Runs the server side; returns the client's tag.
pub fn server<S: Read + Write>(s: &mut S, secret: &[u8], our_tag: u32) -> Result<u32, HandshakeError> {
    server_node(s, secret, our_tag, NodeId::UNKNOWN).map(|p| p.tag)
}

/// Runs the server side, telling our node id; returns the client's tag and node id.
pub fn server_node<S: Read + Write>(
    s: &mut S,
    secret: &[u8],
    our_tag: u32,
    our_node: NodeId,
) -> Result<Peer, HandshakeError> {
    let mut hello = [0u8; HELLO_LEN];
    s.read_exact(&mut hello)?;
    check_header(&hello)?;
    let cn: [u8; 16] = hello[12..28].try_into().expect("16 bytes");
    let client_tag = u32::from_le_bytes(hello[28..32].try_into().expect("4 bytes"));
    let client_node = u32::from_le_bytes(hello[32..36].try_into().expect("4 bytes"));
    let sn = nonce();
    let ids = Ids { tags: (client_tag, our_tag), nodes: (client_node, our_node.0) };
    let mut ch = [0u8; CHALLENGE_LEN];
    ch[..8].copy_from_slice(&MAGIC.to_le_bytes());
    ch[8..12].copy_from_slice(&VERSION.to_le_bytes());
    ch[12..28].copy_from_slice(&sn);
    ch[28..32].copy_from_slice(&our_tag.to_le_bytes());
    ch[32..64].copy_from_slice(&mac(secret, b"server", &cn, &sn, ids));
    ch[64..68].copy_from_slice(&our_node.0.to_le_bytes());
    s.write_all(&ch)?;
    let mut proof = [0u8; PROOF_LEN];
    s.read_exact(&mut proof)?;
    verify(secret, b"client", &cn, &sn, ids, &proof)?;
    Ok(Peer { tag: client_tag, node: NodeId(client_node) })
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;

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
}
