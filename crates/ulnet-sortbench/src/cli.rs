//! Command-line front ends: `gensort` and `valsort` with the original's flags,
//! messages and exit codes, for the `ulnet` tool to mount as subcommands.
//!
//! ```text
//! ulnet gensort [-a] [-b STARTING_REC] [-s] [-c] NUM_RECORDS FILE
//! ulnet valsort [-o SUMMARY_FILE] [-s] [-q] [-i] FILE
//! ```
//!
//! Both argument structs derive [`clap::Parser`] (and so [`clap::Args`]); the
//! `run_*` functions return the process exit code. Every message goes where
//! the original sends it, to standard error (the `*_to` variants take the
//! writer instead).

use std::fs::File;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Parser;

use crate::gen::{write_records, RecordFormat};
use crate::room::{self, Replaced};
use crate::valsort::{parse_summaries, KeyOrder, Summary, Validator, ValsortError};

/// Arguments of `gensort`: generate Sort Benchmark input records.
#[derive(Debug, Clone, PartialEq, Eq, Parser)]
#[command(name = "gensort", about = "Generate Sort Benchmark input records (gensort 1.5 compatible)")]
pub struct GensortArgs {
    /// Generate ascii records (required for PennySort or JouleSort) instead of
    /// binary records.
    #[arg(short = 'a')]
    pub ascii: bool,
    /// Number of the first record generated (default 0); `-b2000` and
    /// `-b 2000` both work.
    #[arg(
        short = 'b',
        value_name = "STARTING_REC",
        default_value = "0",
        value_parser = parse_u128
    )]
    pub starting_rec: u128,
    /// Generate records with skewed keys (skewed ascii records with `-a`).
    #[arg(short = 's')]
    pub skew: bool,
    /// Print the sum of the CRC32 checksums of the records on standard error.
    #[arg(short = 'c')]
    pub checksum: bool,
    /// Number of sequential records to generate.
    #[arg(value_name = "NUM_RECORDS")]
    pub num_records: u64,
    /// File to write the records to (`/dev/null` skips writing).
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
}

impl GensortArgs {
    /// The record format these flags select.
    pub fn format(&self) -> RecordFormat {
        RecordFormat { ascii: self.ascii, skewed: self.skew }
    }
}

/// Arguments of `valsort`: validate sorted records or partition summaries.
#[derive(Debug, Clone, PartialEq, Eq, Parser)]
#[command(name = "valsort", about = "Validate Sort Benchmark output (valsort 1.5 compatible)")]
pub struct ValsortArgs {
    /// Write the 280-byte summary of the validated records to this file, to be
    /// concatenated with other partitions' summaries and checked with `-s`.
    #[arg(short = 'o', value_name = "SUMMARY_FILE")]
    pub summary_out: Option<PathBuf>,
    /// FILE holds partition summaries (as written by `-o`, concatenated in
    /// partition order) instead of records.
    #[arg(short = 's')]
    pub summaries: bool,
    /// Quiet: print no diagnostic text, only errors; the exit code still tells.
    #[arg(short = 'q')]
    pub quiet: bool,
    /// Compare keys as ascii without regard to case (optional for PennySort).
    #[arg(short = 'i')]
    pub case_insensitive: bool,
    /// The sorted records (or, with `-s`, the summaries) to validate.
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
}

fn parse_u128(s: &str) -> Result<u128, String> {
    s.parse::<u128>().map_err(|e| format!("`{s}` is not a record number (0 to 2^128-1): {e}"))
}

/// `perror`'s line for a file that could not be opened: the name, a colon and
/// the system's description of the error.
fn perror_line(path: &Path, err: &io::Error) -> String {
    let text = err.to_string();
    let text = match text.rfind(" (os error ") {
        Some(at) => &text[..at],
        None => &text,
    };
    format!("{}: {}\n", path.display(), text)
}

/// Runs gensort, writing its messages to standard error; returns the exit code.
pub fn run_gensort(args: &GensortArgs) -> anyhow::Result<i32> {
    run_gensort_to(args, &mut io::stderr().lock())
}

/// Runs gensort, writing its messages (the checksum with `-c`, or an error) to
/// `messages`; returns the exit code: 0, or 1 when the file cannot be created.
/// An error is returned when the records do not fit on the file system (checked
/// before the file is touched, see [`crate::room`]) or writing them fails.
pub fn run_gensort_to(args: &GensortArgs, messages: &mut dyn Write) -> anyhow::Result<i32> {
    // Every format's records are RECORD_SIZE bytes (ascii ones end in "\r\n").
    let needed = u128::from(args.num_records) * crate::RECORD_SIZE as u128;
    room::check(&args.file, needed, Replaced::InPlace)
        .with_context(|| format!("{} records of {} bytes", args.num_records, crate::RECORD_SIZE))?;
    let mut file = match File::create(&args.file) {
        Ok(f) => f,
        Err(e) => {
            messages.write_all(perror_line(&args.file, &e).as_bytes())?;
            return Ok(1);
        }
    };
    let skip_output = args.file.as_os_str() == "/dev/null";
    let sum = if skip_output {
        write_records(&mut io::sink(), args.starting_rec, args.num_records, args.format(), args.checksum)
    } else {
        write_records(&mut file, args.starting_rec, args.num_records, args.format(), args.checksum)
    }
    .with_context(|| format!("writing records to {}", args.file.display()))?;
    if let Some(sum) = sum {
        writeln!(messages, "{sum}")?;
    }
    Ok(0)
}

/// Runs valsort, writing its messages to standard error; returns the exit code.
pub fn run_valsort(args: &ValsortArgs) -> anyhow::Result<i32> {
    run_valsort_to(args, &mut io::stderr().lock())
}

/// Reads until `buf` is full or the end of the input; returns the bytes read.
fn read_full(input: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match input.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// Bytes read per call when validating records (4 MB).
const READ_SIZE: usize = 40_000 * crate::RECORD_SIZE;

/// Runs valsort, writing its messages to `messages`: the same text the
/// original prints on standard error. Returns the exit code: 1 when a record
/// is out of order or the input is unusable, else 0. An error is returned for
/// failures the original does not report (a read error, a failed write).
pub fn run_valsort_to(args: &ValsortArgs, messages: &mut dyn Write) -> anyhow::Result<i32> {
    let order = if args.case_insensitive { KeyOrder::CaseInsensitive } else { KeyOrder::Bytes };
    // The original creates the summary file before reading anything.
    let mut summary_out = match &args.summary_out {
        None => None,
        Some(path) => match File::create(path) {
            Ok(f) => Some((path, f)),
            Err(e) => {
                messages.write_all(perror_line(path, &e).as_bytes())?;
                return Ok(1);
            }
        },
    };
    let mut input = match File::open(&args.file) {
        Ok(f) => f,
        Err(e) => {
            messages.write_all(perror_line(&args.file, &e).as_bytes())?;
            return Ok(1);
        }
    };
    let read_context = || format!("reading {}", args.file.display());

    let result: Result<Summary, ValsortError> = if args.summaries {
        let mut bytes = Vec::new();
        input.read_to_end(&mut bytes).with_context(read_context)?;
        let whole = bytes.len() / crate::SUMMARY_SIZE * crate::SUMMARY_SIZE;
        match parse_summaries(&bytes[..whole]) {
            // Less than one summary: the first read is already partial.
            Err(ValsortError::Empty) if !bytes.is_empty() => Err(ValsortError::PartialSummary),
            Err(e) => Err(e),
            Ok(parts) => {
                let mut acc: Option<Summary> = None;
                for part in &parts {
                    let before = acc.as_ref().and_then(Summary::first_unordered);
                    let next = match acc {
                        None => part.clone(),
                        Some(prev) => prev.then_with(part, order),
                    };
                    if before.is_none() && !args.quiet {
                        if let Some(line) = next.first_unordered_line() {
                            messages.write_all(line.as_bytes())?;
                        }
                    }
                    acc = Some(next);
                }
                match acc {
                    Some(_) if whole != bytes.len() => Err(ValsortError::PartialSummary),
                    Some(sum) => Ok(sum),
                    None => Err(ValsortError::Empty),
                }
            }
        }
    } else {
        let mut validator = Validator::new(order);
        let mut buf = vec![0u8; READ_SIZE];
        let mut announced = false;
        loop {
            let n = read_full(&mut input, &mut buf).with_context(read_context)?;
            if n == 0 {
                break;
            }
            validator.push(&buf[..n]);
            if !announced && !args.quiet {
                if let Some(i) = validator.first_unordered() {
                    writeln!(messages, "First unordered record is record {i}")?;
                    announced = true;
                }
            }
        }
        validator.finish()
    };

    let summary = match result {
        Ok(s) => s,
        Err(e) => {
            writeln!(messages, "{e}")?;
            return Ok(1);
        }
    };
    if let Some((path, file)) = summary_out.as_mut() {
        file.write_all(&summary.to_bytes()).with_context(|| format!("writing summary to {}", path.display()))?;
    }
    if !args.quiet {
        messages.write_all(summary.totals_lines().as_bytes())?;
    }
    Ok(summary.exit_code())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gensort_flags() {
        let a = GensortArgs::parse_from(["gensort", "-b1000000", "500", "out.dat"]);
        assert_eq!(a.starting_rec, 1_000_000);
        assert_eq!(a.num_records, 500);
        assert!(!a.ascii && !a.skew && !a.checksum);
        let a = GensortArgs::parse_from(["gensort", "-c", "-a", "-s", "-b", "7", "3", "f"]);
        assert_eq!(a.starting_rec, 7);
        assert_eq!(a.format(), RecordFormat { ascii: true, skewed: true });
        assert!(a.checksum);
        let big = u128::MAX.to_string();
        let a = GensortArgs::parse_from(["gensort", &format!("-b{big}"), "1", "f"]);
        assert_eq!(a.starting_rec, u128::MAX);
        assert!(GensortArgs::try_parse_from(["gensort", "-bx", "1", "f"]).is_err());
        assert!(GensortArgs::try_parse_from(["gensort", "1"]).is_err());
    }

    #[test]
    fn valsort_flags() {
        let a = ValsortArgs::parse_from(["valsort", "-o", "out.sum", "out.dat"]);
        assert_eq!(a.summary_out, Some(PathBuf::from("out.sum")));
        assert!(!a.summaries && !a.quiet);
        let a = ValsortArgs::parse_from(["valsort", "-s", "all.sum"]);
        assert!(a.summaries);
        assert_eq!(a.file, PathBuf::from("all.sum"));
        let a = ValsortArgs::parse_from(["valsort", "-q", "-i", "x"]);
        assert!(a.quiet && a.case_insensitive);
    }

    #[test]
    fn perror_text() {
        let e = io::Error::from_raw_os_error(2);
        assert_eq!(perror_line(Path::new("nope"), &e), "nope: No such file or directory\n");
    }
}
