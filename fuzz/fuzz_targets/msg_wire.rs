//! Message-layer headers: any bytes never panic, and a header that decodes encodes back
//! to the same 24 bytes.
#![no_main]
use libfuzzer_sys::fuzz_target;
use ulnet_msg::wire::{Header, HEADER_LEN};

fuzz_target!(|data: &[u8]| {
    if let Ok(h) = Header::decode(data) {
        assert_eq!(&h.encode()[..], &data[..HEADER_LEN], "a header encodes back to its bytes");
    }
});
