//! Descriptors a peer writes into a shared-memory ring: never a panic, and a record header
//! that decodes encodes back to its two words.
#![no_main]
use libfuzzer_sys::fuzz_target;
use ulnet_core::descriptor::{BufferRef, RecordHeader};

fuzz_target!(|words: [u64; 3]| {
    if let Ok(h) = RecordHeader::decode([words[0], words[1]]) {
        assert_eq!(h.encode(), [words[0], words[1]], "a record header encodes back to its words");
    }
    let _ = BufferRef::decode(words);
});
