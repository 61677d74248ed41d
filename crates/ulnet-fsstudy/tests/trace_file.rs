//! The trace file: written and read back whole; cut off, corrupted, from a newer writer —
//! the reader says which block and where, reads what is whole, and never panics.

use proptest::prelude::*;
use std::path::Path;
use ulnet_fsstudy::format::{
    FileKind, Name, NodeKind, Op, Record, BLOCK_HEADER_LEN, FILE_HEADER_LEN, FILE_MAGIC, VERSION,
};
use ulnet_fsstudy::reader::{read_bytes, Damage, ReadError};
use ulnet_fsstudy::writer::TraceWriter;

fn op(i: u64) -> Record {
    Record::Op(Op {
        kind: (i % 30) as u8,
        start_ns: 1_000 * i,
        duration_ns: 7 + i % 13,
        pid: 100 + (i % 5) as u32,
        file: 2 + i % 40,
        handle: i / 3,
        offset: 4096 * (i % 9),
        size: 4096,
        result: if i.is_multiple_of(17) { -2 } else { 4096 },
        file_size: 1 << 20,
        flags: 0o100,
        other: 0,
    })
}

/// A file of `n` records in blocks of `per_block`, and where each block starts.
fn file_of(n: u64, per_block: u64) -> (Vec<u8>, Vec<Record>, Vec<usize>) {
    let mut out = Vec::new();
    let mut w = TraceWriter::new(&mut out, Path::new("mem"), FileKind::Trace, 0).expect("header");
    let mut records = Vec::new();
    for i in 0..n {
        let r = if i.is_multiple_of(10) {
            Record::Name(Name { file: i, parent: 1, kind: NodeKind::File, path: format!("dir/file-{i}.c") })
        } else {
            op(i)
        };
        w.push(&r, 0).expect("push");
        records.push(r);
        if (i + 1).is_multiple_of(per_block) {
            w.flush(0).expect("flush");
        }
    }
    w.finish(3).expect("finish");
    let starts = block_starts(&out);
    (out, records, starts)
}

/// Walks the blocks by their stated lengths.
fn block_starts(b: &[u8]) -> Vec<usize> {
    let mut at = FILE_HEADER_LEN;
    let mut starts = Vec::new();
    while at + BLOCK_HEADER_LEN <= b.len() {
        starts.push(at);
        let len = u32::from_le_bytes(b[at + 16..at + 20].try_into().unwrap()) as usize;
        at += BLOCK_HEADER_LEN + len;
    }
    starts
}

#[test]
fn a_whole_file_reads_back_every_record() {
    let (bytes, records, starts) = file_of(1000, 100);
    let file = read_bytes(&bytes).expect("reads");
    assert!(file.is_whole(), "{:?}", file.damage);
    assert_eq!(file.records, records);
    assert_eq!(file.blocks as usize, starts.len());
    assert_eq!(file.dropped, 3, "the end block carries the dropped count");
    assert_eq!(file.header.kind, FileKind::Trace);
    assert_eq!(file.header.version, VERSION);
}

#[test]
fn a_file_cut_inside_a_block_names_the_block_and_keeps_the_ones_before() {
    let (bytes, records, starts) = file_of(300, 100);
    // Cut in the middle of the third block's body.
    let cut = starts[2] + BLOCK_HEADER_LEN + 10;
    let file = read_bytes(&bytes[..cut]).expect("reads the header");
    assert_eq!(file.damage, vec![Damage::Truncated { block: 2, offset: starts[2] as u64, what: "block body" }]);
    assert_eq!(file.records, records[..200]);
    let text = file.damage[0].to_string();
    assert!(text.contains("block 2") && text.contains(&format!("byte {}", starts[2])), "{text}");
}

#[test]
fn a_file_cut_between_blocks_is_unfinished() {
    let (bytes, records, starts) = file_of(300, 100);
    let file = read_bytes(&bytes[..starts[2]]).expect("reads");
    assert_eq!(file.damage, vec![Damage::Unfinished { offset: starts[2] as u64 }]);
    assert_eq!(file.records, records[..200]);
}

#[test]
fn a_corrupt_block_is_skipped_and_reading_resumes_at_the_next() {
    let (mut bytes, records, starts) = file_of(300, 100);
    bytes[starts[1] + BLOCK_HEADER_LEN + 30] ^= 0x40;
    let file = read_bytes(&bytes).expect("reads");
    assert_eq!(file.damage.len(), 1, "{:?}", file.damage);
    match &file.damage[0] {
        Damage::Corrupt { block, offset, resumed_at, .. } => {
            assert_eq!((*block, *offset, *resumed_at), (1, starts[1] as u64, Some(starts[2] as u64)));
        }
        d => panic!("expected a corrupt block, got {d:?}"),
    }
    let mut expected = records[..100].to_vec();
    expected.extend_from_slice(&records[200..]);
    assert_eq!(file.records, expected);
}

#[test]
fn a_corrupt_length_is_told_from_a_cut_off_file() {
    let (mut bytes, _, starts) = file_of(300, 100);
    // Block 0 claims more bytes than the file has: the intact blocks after it show the
    // file was not cut there.
    bytes[starts[0] + 18] = 0x3f;
    let file = read_bytes(&bytes).expect("reads");
    assert!(matches!(file.damage[0], Damage::Corrupt { block: 0, resumed_at: Some(_), .. }), "{:?}", file.damage);
    assert_eq!(file.blocks, 3);
}

#[test]
fn a_missing_block_is_reported() {
    let (bytes, records, starts) = file_of(300, 100);
    let mut cut = bytes[..starts[1]].to_vec();
    cut.extend_from_slice(&bytes[starts[2]..]);
    let file = read_bytes(&cut).expect("reads");
    assert_eq!(file.damage, vec![Damage::Missing { first: 1, count: 1, offset: starts[1] as u64 }]);
    assert_eq!(file.records.len(), records.len() - 100);
}

/// A file as a later version might write it: a longer header, a record of a new tag and a
/// field appended to an op.
fn newer_file(min_reader: u16) -> Vec<u8> {
    let mut header = vec![0u8; FILE_HEADER_LEN + 8];
    header[..8].copy_from_slice(&FILE_MAGIC);
    header[8..10].copy_from_slice(&(VERSION + 1).to_le_bytes());
    header[10..12].copy_from_slice(&min_reader.to_le_bytes());
    header[12..14].copy_from_slice(&((FILE_HEADER_LEN + 8) as u16).to_le_bytes());
    header[14..16].copy_from_slice(&(BLOCK_HEADER_LEN as u16).to_le_bytes());
    header[16..18].copy_from_slice(&1u16.to_le_bytes());
    header[FILE_HEADER_LEN..].copy_from_slice(b"newfield");
    let crc = crc32c::crc32c_append(crc32c::crc32c(&header[..60]), &header[FILE_HEADER_LEN..]);
    header[60..64].copy_from_slice(&crc.to_le_bytes());
    // The body: an unknown record (tag 77, 3 bytes), then an op with one byte appended.
    let mut body = vec![77, 3, 1, 2, 3];
    let mut op_body = Vec::new();
    let mut w = TraceWriter::new(&mut op_body, Path::new("mem"), FileKind::Trace, 0).expect("header");
    w.push(&op(5), 0).expect("push");
    w.finish(0).expect("finish");
    let op_bytes = &op_body[FILE_HEADER_LEN + BLOCK_HEADER_LEN..];
    body.push(op_bytes[0]);
    body.push(op_bytes[1] + 1);
    body.extend_from_slice(&op_bytes[2..]);
    body.push(9);
    let block = ulnet_fsstudy::format::BlockHeader {
        flags: 1,
        sequence: 0,
        record_count: 2,
        body_len: body.len() as u32,
        dropped_total: 0,
    };
    let mut out = header;
    block.encode_with(&body, &mut out);
    out
}

#[test]
fn a_newer_version_is_read_as_far_as_this_build_knows_it() {
    let file = read_bytes(&newer_file(1)).expect("a newer file that old readers may read");
    assert_eq!(file.records, vec![op(5)]);
    assert_eq!(file.damage, vec![Damage::Newer { version: VERSION + 1, skipped: 1 }]);
    assert!(file.damage[0].to_string().contains("newer"));
}

#[test]
fn a_version_that_needs_a_newer_reader_is_refused_with_the_versions() {
    let err = read_bytes(&newer_file(VERSION + 1)).expect_err("refused");
    assert!(
        matches!(err, ReadError::TooNew { version, min_reader } if version == VERSION + 1 && min_reader == VERSION + 1)
    );
    assert!(err.to_string().contains("newer ulnet"), "{err}");
}

#[test]
fn other_files_and_cut_headers_are_told_apart() {
    assert!(matches!(read_bytes(b"hello world, not a trace"), Err(ReadError::NotStudyFile)));
    assert!(matches!(read_bytes(b""), Err(ReadError::HeaderTruncated { len: 0 })));
    assert!(matches!(read_bytes(&FILE_MAGIC[..5]), Err(ReadError::HeaderTruncated { len: 5 })));
    let (mut bytes, _, _) = file_of(10, 10);
    assert!(matches!(read_bytes(&bytes[..40]), Err(ReadError::HeaderTruncated { len: 40 })));
    bytes[30] ^= 1;
    assert!(matches!(read_bytes(&bytes), Err(ReadError::HeaderCorrupt(_))));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Any cut and any flipped bytes: no panic, and what is read is records that were
    /// written, in order.
    #[test]
    fn damaged_files_never_panic_and_yield_only_written_records(
        cut in 0usize..20_000,
        flips in proptest::collection::vec((0usize..20_000, 1u8..=255), 0..4),
    ) {
        let (mut bytes, records, _) = file_of(400, 37);
        for (at, x) in flips {
            let at = at % bytes.len();
            if at >= FILE_HEADER_LEN {
                bytes[at] ^= x;
            }
        }
        bytes.truncate(cut.min(bytes.len()));
        if let Ok(file) = read_bytes(&bytes) {
            let mut it = records.iter();
            for r in &file.records {
                prop_assert!(it.any(|w| w == r), "a record read that was not written, or out of order: {:?}", r);
            }
        }
    }

    #[test]
    fn any_bytes_after_a_good_header_never_panic(tail in proptest::collection::vec(any::<u8>(), 0..3000)) {
        let (bytes, _, _) = file_of(0, 1);
        let mut b = bytes[..FILE_HEADER_LEN].to_vec();
        b.extend_from_slice(&tail);
        let _ = read_bytes(&b);
    }
}
