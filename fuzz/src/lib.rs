//! What more than one fuzz target needs.

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The cluster secret the membership targets sign with.
pub const CLUSTER_SECRET: &[u8] = b"fuzz cluster secret";

/// Appends the membership wire's tag to `datagram`: the first 16 bytes of its
/// HMAC-SHA256 under [`CLUSTER_SECRET`], so that the body reaches the decoder.
pub fn sign_cluster_datagram(datagram: &mut Vec<u8>) {
    const TAG_LEN: usize = 16;
    let mut mac = Hmac::<Sha256>::new_from_slice(CLUSTER_SECRET).expect("HMAC takes any key length");
    mac.update(datagram);
    datagram.extend_from_slice(&mac.finalize().into_bytes()[..TAG_LEN]);
}
