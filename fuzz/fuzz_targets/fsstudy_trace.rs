//! File-system study traces and snapshots: any bytes, and the same bytes with their
//! checksums made right (so that the fuzzer reaches the records), through the reader and
//! on into the whole study and its Markdown report.
#![no_main]
use libfuzzer_sys::fuzz_target;
use ulnet_fsstudy::analysis::{self, Inputs};
use ulnet_fsstudy::format::{FileKind, Record, BLOCK_HEADER_LEN, FILE_HEADER_LEN};
use ulnet_fsstudy::reader::read_bytes;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    let mut bytes = rest.to_vec();
    if mode & 1 == 1 {
        fix_checksums(&mut bytes);
    }
    let Ok(file) = read_bytes(&bytes) else { return };
    assert!(file.records.len() <= bytes.len() / 2, "every record takes at least two bytes");
    let ops = file.records.iter().filter(|r| matches!(r, Record::Op(_))).count();
    let mut inputs = Inputs::default();
    match file.header.kind {
        FileKind::Trace => inputs.traces.push(analysis::trace_of(std::path::Path::new("fuzz"), file)),
        FileKind::Snapshot => return,
    }
    let study = analysis::study(&inputs);
    assert_eq!(study.inputs.operations as usize, ops, "every op is studied");
    assert!(study.opens + study.sessions.dir_opens <= ops as u64, "a session per open at most");
    assert!(study.whole_file + study.sequential + study.random <= study.opens, "patterns only of opens");
    let _ = ulnet_fsstudy::report::markdown(&study, "figures");
    let _ = serde_json::to_string(&study).expect("the study encodes");
});

/// Writes the CRC32C of the file header and of every block where the format keeps them,
/// walking blocks by their stated lengths.
fn fix_checksums(b: &mut [u8]) {
    if b.len() < FILE_HEADER_LEN {
        return;
    }
    let header_len = usize::from(u16::from_le_bytes([b[12], b[13]])).clamp(FILE_HEADER_LEN, b.len());
    let crc = crc32c::crc32c_append(crc32c::crc32c(&b[..60]), &b[FILE_HEADER_LEN..header_len]);
    b[60..64].copy_from_slice(&crc.to_le_bytes());
    let mut at = header_len;
    while at + BLOCK_HEADER_LEN <= b.len() {
        let body = u32::from_le_bytes(b[at + 16..at + 20].try_into().unwrap()) as usize;
        let end = (at + BLOCK_HEADER_LEN).saturating_add(body).min(b.len());
        let crc = crc32c::crc32c_append(crc32c::crc32c(&b[at..at + 28]), &b[at + BLOCK_HEADER_LEN..end]);
        b[at + 28..at + 32].copy_from_slice(&crc.to_le_bytes());
        at = end;
    }
}
