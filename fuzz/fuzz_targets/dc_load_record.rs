//! Load records read from a peer's remote memory: any eight words, and the same words
//! with the MAC made right for the key (so that the fuzzer reaches the fields' checks).
//! Never a panic; a record that decodes encodes back to exactly its words.
#![no_main]
use hmac::{Hmac, Mac};
use libfuzzer_sys::fuzz_target;
use sha2::Sha256;
use ulnet_dc::load::{ClusterKey, LoadRecord, SLOT_WORDS};
use ulnet_dc::role::NodeIndex;

const SECRET: &[u8] = b"fuzz load key";

fuzz_target!(|input: (bool, u8, [u64; SLOT_WORDS])| {
    let (sign, slot, mut words) = input;
    if sign {
        let mut mac = Hmac::<Sha256>::new_from_slice(SECRET).unwrap();
        for w in &words[..SLOT_WORDS - 1] {
            mac.update(&w.to_le_bytes());
        }
        words[SLOT_WORDS - 1] = u64::from_le_bytes(mac.finalize().into_bytes()[..8].try_into().unwrap());
    }
    let key = ClusterKey::new(SECRET);
    if let Ok((version, record)) = LoadRecord::decode(&words, &key, NodeIndex(slot)) {
        assert_eq!(record.encode(&key, version), words, "a record encodes back to its words");
    }
});
