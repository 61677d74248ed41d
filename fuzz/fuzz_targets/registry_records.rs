//! What the registry reads from its log file and from clients: log frames and records (and
//! the judgement of a tail that does not read: torn or corrupt), store operations, client
//! requests and answers. Never a panic; log records and store operations that decode encode
//! back to exactly their bytes.
#![no_main]
use libfuzzer_sys::fuzz_target;
use ulnet_registry::client::{decode_get_answer, decode_key, decode_set, decode_update_answer};
use ulnet_registry::store::Op;
use ulnet_registry::wal::record::{decode_record, encode_record, read_frame};
use ulnet_registry::wal::tail::classify;

fuzz_target!(|data: &[u8]| {
    if let Ok(r) = decode_record(data) {
        assert_eq!(encode_record(&r), data, "a log record encodes back to its bytes");
    }
    let mut rest = data;
    while let Ok((_, used)) = read_frame(rest) {
        assert!(used > 0 && used <= rest.len(), "a frame is a non-empty prefix");
        rest = &rest[used..];
    }
    // What ends the readable frames is judged without a panic, wherever the file starts.
    let offset = data.len() as u64 - rest.len() as u64;
    let _ = classify(rest, offset, true);
    let _ = classify(rest, offset, false);
    if let Ok(op) = Op::decode(data) {
        assert_eq!(op.encode(), data, "an operation encodes back to its bytes");
    }
    let _ = decode_set(data);
    let _ = decode_key(data);
    let _ = decode_update_answer(data);
    let _ = decode_get_answer(data);
});
