//! Membership datagrams: any bytes, and the same bytes signed with the cluster key (so
//! that the fuzzer reaches the body's decoder). Never a panic; a packet that decodes
//! encodes to bytes that decode to it again (not always to the same bytes: the format
//! ignores bytes after a body, where later versions append fields).
#![no_main]
use libfuzzer_sys::fuzz_target;
use ulnet_cluster::wire::Authenticator;
use ulnet_fuzz::{sign_cluster_datagram, CLUSTER_SECRET};

fuzz_target!(|data: &[u8]| {
    let auth = Authenticator::new(CLUSTER_SECRET);
    let Some((&mode, body)) = data.split_first() else { return };
    let mut bytes = body.to_vec();
    if mode & 1 == 1 {
        sign_cluster_datagram(&mut bytes);
    }
    if let Ok(packet) = auth.decode(&bytes) {
        assert_eq!(auth.decode(&auth.encode(&packet)), Ok(packet), "a packet survives encoding");
    }
});
