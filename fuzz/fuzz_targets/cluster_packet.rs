//! Membership datagrams: any bytes, and the same bytes signed with the cluster key (so
//! that the fuzzer reaches the body's decoder). Never a panic; a packet that decodes
//! encodes to bytes that decode to it again (not always to the same bytes: the format
//! ignores bytes after a body, where later versions append fields).
#![no_main]
use hmac::{Hmac, Mac};
use libfuzzer_sys::fuzz_target;
use sha2::Sha256;
use ulnet_cluster::wire::Authenticator;

const SECRET: &[u8] = b"fuzz cluster secret";
/// Bytes of HMAC-SHA256 the wire keeps (the format's tag).
const TAG_LEN: usize = 16;

fuzz_target!(|data: &[u8]| {
    let auth = Authenticator::new(SECRET);
    let Some((&mode, body)) = data.split_first() else { return };
    let mut bytes = body.to_vec();
    if mode & 1 == 1 {
        let mut mac = Hmac::<Sha256>::new_from_slice(SECRET).unwrap();
        mac.update(&bytes);
        bytes.extend_from_slice(&mac.finalize().into_bytes()[..TAG_LEN]);
    }
    if let Ok(packet) = auth.decode(&bytes) {
        assert_eq!(auth.decode(&auth.encode(&packet)), Ok(packet), "a packet survives encoding");
    }
});
