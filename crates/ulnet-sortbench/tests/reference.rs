//! Checks against the files made by the original gensort and valsort 1.5, kept
//! in `shared/sort-vectors/` beside the workspace.

use std::fs;
use std::path::PathBuf;

use clap::Parser;
use ulnet_sortbench::cli::{run_gensort_to, run_valsort_to, GensortArgs, ValsortArgs};
use ulnet_sortbench::{generate_records, parse_summaries, Checksum, RecordFormat, Summary, RECORD_SIZE};

fn vectors() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/sort-vectors");
    assert!(
        dir.join("README.md").is_file(),
        "the reference vectors are missing: expected the folder {} (shared/sort-vectors beside \
         the workspace, made by the original gensort/valsort 1.5)",
        dir.display()
    );
    dir
}

fn read(name: &str) -> Vec<u8> {
    let path = vectors().join(name);
    fs::read(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

fn read_text(name: &str) -> String {
    String::from_utf8(read(name)).expect("reference text is utf-8")
}

/// The reference data files: (name, gensort arguments before the count and
/// file, first record, record count).
const DATA: [(&str, &[&str], u128, u64); 4] = [
    ("bin-0-1000", &[], 0, 1000),
    ("ascii-0-1000", &["-a"], 0, 1000),
    ("skew-0-1000", &["-s"], 0, 1000),
    ("bin-b1000000-500", &["-b1000000"], 1_000_000, 500),
];

fn gensort_args(flags: &[&str], count: u64, file: &std::path::Path) -> GensortArgs {
    let count = count.to_string();
    let file = file.to_str().unwrap();
    let argv = std::iter::once("gensort").chain(flags.iter().copied()).chain([count.as_str(), file]);
    GensortArgs::parse_from(argv)
}

fn format_of(flags: &[&str]) -> RecordFormat {
    RecordFormat { ascii: flags.contains(&"-a"), skewed: flags.contains(&"-s") }
}

#[test]
fn generated_records_match_reference_files() {
    for (name, flags, first, count) in DATA {
        let expected = read(&format!("{name}.dat"));
        let mut buf = vec![0u8; count as usize * RECORD_SIZE];
        generate_records(first, format_of(flags), &mut buf);
        assert!(buf == expected, "{name}.dat differs from generate_records");
    }
}

#[test]
fn gensort_cli_writes_reference_files_and_checksums() {
    let dir = tempfile::tempdir().unwrap();
    for (name, flags, _, count) in DATA {
        let out = dir.path().join(format!("{name}.dat"));
        let mut messages = Vec::new();
        let code = run_gensort_to(&gensort_args(flags, count, &out), &mut messages).unwrap();
        assert_eq!(code, 0);
        assert!(messages.is_empty(), "gensort without -c prints nothing");
        assert!(
            fs::read(&out).unwrap() == read(&format!("{name}.dat")),
            "gensort {flags:?} {count} differs from {name}.dat"
        );

        let mut with_c = vec!["-c"];
        with_c.extend_from_slice(flags);
        let out_c = dir.path().join(format!("{name}.c.dat"));
        let mut messages = Vec::new();
        let code = run_gensort_to(&gensort_args(&with_c, count, &out_c), &mut messages).unwrap();
        assert_eq!(code, 0);
        assert_eq!(
            String::from_utf8(messages).unwrap(),
            read_text(&format!("{name}.gensort-c.txt")),
            "gensort -c {flags:?} {count}"
        );
        assert!(fs::read(&out_c).unwrap() == read(&format!("{name}.dat")));
    }
}

#[test]
fn checksums_match_reference() {
    for (name, ..) in DATA {
        let sum = Checksum::of_records(&read(&format!("{name}.dat")));
        assert_eq!(format!("{sum}\n"), read_text(&format!("{name}.gensort-c.txt")));
    }
}

fn valsort(argv: &[&str]) -> (i32, String) {
    let args = ValsortArgs::parse_from(std::iter::once("valsort").chain(argv.iter().copied()));
    let mut messages = Vec::new();
    let code = run_valsort_to(&args, &mut messages).unwrap();
    (code, String::from_utf8(messages).unwrap())
}

#[test]
fn valsort_messages_match_reference() {
    let dir = vectors();
    for (name, status) in
        [("bin-0-1000", 1), ("bin-0-1000.sorted", 0), ("ascii-0-1000", 1), ("skew-0-1000", 1), ("bin-b1000000-500", 1)]
    {
        let file = dir.join(format!("{name}.dat"));
        let (code, text) = valsort(&[file.to_str().unwrap()]);
        assert_eq!(text, read_text(&format!("{name}.valsort.txt")), "{name}");
        assert_eq!(code, status, "{name}");

        // The library's report is the same text.
        let summary = Summary::of_records(&read(&format!("{name}.dat"))).unwrap();
        assert_eq!(summary.report(), read_text(&format!("{name}.valsort.txt")));
        assert_eq!(summary.exit_code(), status);

        // Quiet: nothing printed, same exit code.
        let (code, text) = valsort(&["-q", file.to_str().unwrap()]);
        assert_eq!((code, text.as_str()), (status, ""), "{name} -q");
    }
}

#[test]
fn summary_file_matches_reference() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("sorted.sum");
    let file = vectors().join("bin-0-1000.sorted.dat");
    let (code, text) = valsort(&["-o", out.to_str().unwrap(), file.to_str().unwrap()]);
    assert_eq!(code, 0);
    assert_eq!(text, read_text("bin-0-1000.sorted.valsort.txt"));
    assert!(fs::read(&out).unwrap() == read("bin-0-1000.sorted.sum"));

    let summary = Summary::of_records(&read("bin-0-1000.sorted.dat")).unwrap();
    assert_eq!(summary.to_bytes().to_vec(), read("bin-0-1000.sorted.sum"));
    assert_eq!(parse_summaries(&read("bin-0-1000.sorted.sum")).unwrap(), vec![summary]);
}

#[test]
fn valsort_of_summary_file_matches_reference() {
    let sum = vectors().join("bin-0-1000.sorted.sum");
    let (code, text) = valsort(&["-s", sum.to_str().unwrap()]);
    assert_eq!(code, 0);
    assert_eq!(text, read_text("bin-0-1000.sorted.valsort.txt"));
}

#[test]
fn partitioned_summaries_equal_the_whole() {
    // Cut the sorted reference file into three partitions, summarize each with
    // `valsort -o`, concatenate and check with `valsort -s`.
    let tmp = tempfile::tempdir().unwrap();
    let data = read("bin-0-1000.sorted.dat");
    let mut all = Vec::new();
    for (i, (from, to)) in [(0, 250), (250, 251), (251, 1000)].into_iter().enumerate() {
        let part = tmp.path().join(format!("part{i}.dat"));
        fs::write(&part, &data[from * RECORD_SIZE..to * RECORD_SIZE]).unwrap();
        let sum = tmp.path().join(format!("part{i}.sum"));
        let (code, _) = valsort(&["-o", sum.to_str().unwrap(), part.to_str().unwrap()]);
        assert_eq!(code, 0);
        all.extend(fs::read(&sum).unwrap());
    }
    let all_path = tmp.path().join("all.sum");
    fs::write(&all_path, &all).unwrap();
    let (code, text) = valsort(&["-s", all_path.to_str().unwrap()]);
    assert_eq!(code, 0);
    assert_eq!(text, read_text("bin-0-1000.sorted.valsort.txt"));

    // -o with -s writes the combined summary, equal to the whole file's.
    let again = tmp.path().join("again.sum");
    let (code, _) = valsort(&["-s", "-o", again.to_str().unwrap(), all_path.to_str().unwrap()]);
    assert_eq!(code, 0);
    assert!(fs::read(&again).unwrap() == read("bin-0-1000.sorted.sum"));

    // Partitions in the wrong order: the first record of the later partition
    // is reported, as the original does.
    let mut swapped = all[2 * 280..].to_vec();
    swapped.extend_from_slice(&all[..2 * 280]);
    let path = tmp.path().join("swapped.sum");
    fs::write(&path, &swapped).unwrap();
    let (code, text) = valsort(&["-s", path.to_str().unwrap()]);
    assert_eq!(code, 1);
    assert_eq!(
        text,
        "First unordered record is record 749\nRecords: 1000\nChecksum: 1ea6370b955\n\
         ERROR - there are 1 unordered records\n"
    );
}

#[test]
fn swapped_pair_is_rejected_at_its_position() {
    let tmp = tempfile::tempdir().unwrap();
    let mut data = read("bin-0-1000.sorted.dat");
    // Swap records 500 and 501.
    let (a, b) = (500 * RECORD_SIZE, 501 * RECORD_SIZE);
    let first: Vec<u8> = data[a..b].to_vec();
    data.copy_within(b..b + RECORD_SIZE, a);
    data[b..b + RECORD_SIZE].copy_from_slice(&first);
    let path = tmp.path().join("swapped.dat");
    fs::write(&path, &data).unwrap();
    let (code, text) = valsort(&[path.to_str().unwrap()]);
    assert_eq!(code, 1);
    assert_eq!(
        text,
        "First unordered record is record 501\nRecords: 1000\nChecksum: 1ea6370b955\n\
         ERROR - there are 1 unordered records\n"
    );
}

#[test]
fn valsort_errors_match_the_original() {
    let tmp = tempfile::tempdir().unwrap();
    let empty = tmp.path().join("empty.dat");
    fs::write(&empty, b"").unwrap();
    let (code, text) = valsort(&[empty.to_str().unwrap()]);
    assert_eq!((code, text.as_str()), (1, "there must be at least one record to be validated\n"));
    let (code, text) = valsort(&["-s", empty.to_str().unwrap()]);
    assert_eq!((code, text.as_str()), (1, "there must be at least one record to be validated\n"));

    // A partial record at the end, after an unordered one.
    let partial = tmp.path().join("partial.dat");
    fs::write(&partial, &read("bin-0-1000.dat")[..350]).unwrap();
    let (code, text) = valsort(&[partial.to_str().unwrap()]);
    assert_eq!(code, 1);
    assert_eq!(text, "First unordered record is record 2\npartial record found at end\n");

    let partial_sum = tmp.path().join("partial.sum");
    fs::write(&partial_sum, &read("bin-0-1000.sorted.sum")[..279]).unwrap();
    let (code, text) = valsort(&["-s", partial_sum.to_str().unwrap()]);
    assert_eq!((code, text.as_str()), (1, "partial partition summary found at end\n"));

    let missing = tmp.path().join("missing.dat");
    let (code, text) = valsort(&[missing.to_str().unwrap()]);
    assert_eq!(code, 1);
    assert_eq!(text, format!("{}: No such file or directory\n", missing.display()));
}
