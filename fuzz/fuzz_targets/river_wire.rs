//! River message headers, for any message length and record size: never a panic, and
//! a header that decodes encodes back to its 16 bytes.
#![no_main]
use libfuzzer_sys::fuzz_target;
use ulnet_river::wire::{Header, HEADER_LEN};

fuzz_target!(|data: &[u8]| {
    if data.len() < 10 {
        return;
    }
    let message_len = u64::from_le_bytes(data[..8].try_into().unwrap());
    let record_size = usize::from(u16::from_le_bytes([data[8], data[9]]));
    let first = &data[10..];
    if let Ok(h) = Header::decode(first, message_len, record_size) {
        assert_eq!(&h.encode()[..], &first[..HEADER_LEN], "a header encodes back to its bytes");
    }
});
