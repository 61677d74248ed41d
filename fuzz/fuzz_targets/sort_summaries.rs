//! valsort's inputs: summary files (`valsort -s`), and record files fed to the validator
//! in pieces of any size. Never a panic; the pieces give the summary the whole file gives.
#![no_main]
use libfuzzer_sys::fuzz_target;
use ulnet_sortbench::{combine, parse_summaries, Summary, Validator, SUMMARY_SIZE};

fuzz_target!(|data: &[u8]| {
    if let Ok(summaries) = parse_summaries(data) {
        assert_eq!(summaries.len() * SUMMARY_SIZE, data.len(), "summaries fill the file");
        if let Some(all) = combine(&summaries) {
            let _ = all.report();
        }
    }
    let Some((&piece, records)) = data.split_first() else { return };
    let whole = Summary::of_records(records);
    let mut validator = Validator::default();
    for part in records.chunks(usize::from(piece).max(1)) {
        validator.push(part);
    }
    assert_eq!(validator.finish().ok(), whole.ok(), "pieces and the whole file agree");
});
