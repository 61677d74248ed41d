//! Global Update Protocol messages: never a panic, and a message that decodes encodes back
//! to exactly its bytes.
#![no_main]
use libfuzzer_sys::fuzz_target;
use ulnet_registry::gup::Msg;

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = Msg::decode(data) {
        assert_eq!(m.encode(), data, "a message encodes back to its bytes");
    }
});
