//! The Sort Benchmark's `gensort` and `valsort` (version 1.5, by Chris Nyberg),
//! reimplemented in Rust and compatible byte for byte: the same records, the
//! same checksums, the same summary records and the same messages and exit
//! codes.
//!
//! * [`gen`]: records from the 128-bit generator ([`rand16`]): binary, ascii
//!   and skewed, from any starting record number, into a caller's buffer
//!   ([`generate_records`]) so that parallel or distributed generators can
//!   split the work, or to a writer ([`write_records`]).
//! * [`checksum`]: the sum of the records' CRC32s ([`Checksum`]).
//! * [`valsort`]: validation of sorted records ([`Summary`], [`Validator`]),
//!   combining per-partition summaries ([`combine`]), the 280-byte summary
//!   record.
//! * [`cli`]: the two programs' arguments and entry points for the `ulnet`
//!   command; gensort checks first that its file fits ([`room`]).
//!
//! A record is 100 bytes; its key is the first 10 bytes, compared as unsigned
//! bytes.
//!
//! ```
//! use ulnet_sortbench::{generate_records, RecordFormat, Summary};
//!
//! let mut buf = vec![0u8; 1000 * 100];
//! generate_records(0, RecordFormat::BINARY, &mut buf);
//! assert_eq!(&buf[..10], b"JimGrayRIP");
//! let summary = Summary::of_records(&buf).unwrap();
//! assert_eq!(summary.checksum.to_string(), "1ea6370b955");
//! assert!(!summary.is_sorted());
//! ```

#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod checksum;
pub mod cli;
pub mod gen;
pub mod rand16;
pub mod room;
pub mod valsort;

pub use checksum::Checksum;
pub use gen::{generate_records, generate_with, write_records, RecordFormat, RecordGenerator};
pub use valsort::{combine, combine_with, parse_summaries, KeyOrder, Summary, Validator, ValsortError, SUMMARY_SIZE};

/// Size of a record in bytes.
pub const RECORD_SIZE: usize = 100;

/// Size of a record's key in bytes: the first bytes of the record.
pub const KEY_SIZE: usize = 10;
