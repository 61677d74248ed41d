//! Trace files: any bytes, and the same bytes with their checksums made right (so that
//! the fuzzer reaches the records and the loader), through the strict and the partial
//! decoder and on into the analysis and the samples of `trace tail`.
#![no_main]
use libfuzzer_sys::fuzz_target;
use ulnet_core::trace::format::{BLOCK_HEADER_LEN, FILE_HEADER_LEN, RECORD_LEN, VERSION_FIXED_MAX};
use ulnet_core::trace::{decode_file, decode_prefix};
use ulnet_trace::analyze::{analyze, counted, AnalyzeConfig};
use ulnet_trace::input::{sample_of_trace, TRACE_COLUMNS};
use ulnet_trace::load::assemble;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    let mut bytes = rest.to_vec();
    if mode & 1 == 1 {
        fix_checksums(&mut bytes);
    }
    let strict = decode_file(&bytes);
    let (prefix, error) = decode_prefix(&bytes);
    match &strict {
        Ok(file) => assert!(prefix.as_ref() == Some(file) && error.is_none(), "strict and partial decoders agree"),
        Err(e) => assert_eq!(error.as_ref(), Some(e), "the strict decoder fails where the partial one stops"),
    }
    let Some(file) = prefix else { return };
    let messages = file.messages();
    // One entry per record however many messages a run claims (up to 2^32 - 1 each).
    let trace = assemble(vec![("fuzz".into(), file)]);
    assert_eq!(trace.message_count(), messages, "the loader keeps every message");
    let study = analyze(&trace, &AnalyzeConfig::default());
    let _ = study.render_text();
    let counted: u64 = counted(&trace).iter().map(|m| u64::from(m.count)).sum();
    assert_eq!(study.messages, counted, "every counted message is in the study");
    assert_eq!(study.matrix.iter().map(|c| c.messages).sum::<u64>(), counted, "and in the matrix");
    let binned: u64 = study.rates.nodes.iter().flat_map(|n| &n.per_bin).sum();
    assert_eq!(binned, counted, "and in exactly one rate bin");
    // `trace tail` takes messages one by one (up to 2^27); within the fuzzer's 2 GB, 2^20.
    if counted <= 1 << 20 {
        for column in TRACE_COLUMNS {
            let _ = sample_of_trace(&trace, "fuzz", Some(column));
        }
    }
});

/// Writes the CRC32C of the file header and of every whole block where the format keeps
/// them, walking blocks by their stated lengths.
fn fix_checksums(b: &mut [u8]) {
    if b.len() < FILE_HEADER_LEN {
        return;
    }
    let crc = crc32c::crc32c(&b[..64]);
    b[64..68].copy_from_slice(&crc.to_le_bytes());
    let version = u16::from_le_bytes([b[8], b[9]]);
    let mut at = FILE_HEADER_LEN;
    while at + BLOCK_HEADER_LEN <= b.len() {
        let count = u32::from_le_bytes(b[at + 8..at + 12].try_into().unwrap()) as usize;
        let stated = u32::from_le_bytes(b[at + 44..at + 48].try_into().unwrap()) as usize;
        let body = if version <= VERSION_FIXED_MAX { count.saturating_mul(RECORD_LEN) } else { stated };
        let end = (at + BLOCK_HEADER_LEN).saturating_add(body).min(b.len());
        let crc = crc32c::crc32c_append(crc32c::crc32c(&b[at..at + 40]), &b[at + BLOCK_HEADER_LEN..end]);
        b[at + 40..at + 44].copy_from_slice(&crc.to_le_bytes());
        at = end;
    }
}
