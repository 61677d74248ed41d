//! Reads files of the study's format ([`crate::format`]) as far as they are whole.
//!
//! A file that cannot be read at all (not a study file, a header cut off or corrupt, a
//! format whose `min_reader` is above this build) is a [`ReadError`]. Anything after a
//! good header is read block by block: a block cut off at the end, a block whose checksum
//! or fields are wrong, blocks missing from the sequence, a missing end block, and a
//! newer writer's records are each a [`Damage`] that names the block and the byte offset,
//! and the reader goes on with what is whole — after a corrupt block it looks for the next
//! block whose checksum holds. Nothing a file holds can make it panic or allocate more
//! than the file's size.

use crate::format::{
    decode_record, u16_at, u32_at, u64_at, BlockContext, Decoded, FileHeader, FileKind, Record, BLOCK_BODY_MAX,
    BLOCK_FLAG_END, BLOCK_HEADER_LEN, BLOCK_MAGIC, FILE_HEADER_LEN, FILE_MAGIC, VERSION,
};
use std::path::Path;

/// Why a file could not be read at all.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The file could not be opened or read.
    #[error("reading {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// What the system said.
        #[source]
        source: std::io::Error,
    },
    /// Not a file of this format.
    #[error("not a file-system study trace or snapshot (bad magic at byte 0): give a file written by `ulnet fsstudy trace` or `snapshot`")]
    NotStudyFile,
    /// The header is cut off.
    #[error(
        "file header cut off at byte {len} (it is {FILE_HEADER_LEN} bytes): the writer stopped before its first write"
    )]
    HeaderTruncated {
        /// Bytes there are.
        len: usize,
    },
    /// The header's checksum or fields are wrong.
    #[error("file header corrupt: {0}")]
    HeaderCorrupt(String),
    /// A format this build cannot read.
    #[error("format version {version} needs a reader of version {min_reader} or later (this build reads version {VERSION}): use a newer ulnet")]
    TooNew {
        /// The writer's version.
        version: u16,
        /// The oldest reader that can read it.
        min_reader: u16,
    },
}

/// A part of a file that could not be read; the rest was.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, serde::Serialize)]
pub enum Damage {
    /// The file ends inside a block.
    #[error("block {block} at byte {offset} is cut off ({what}); the blocks before it were read")]
    Truncated {
        /// The block's sequence number (the one expected there).
        block: u32,
        /// Where it starts.
        offset: u64,
        /// What was cut.
        what: &'static str,
    },
    /// A block whose checksum or contents are wrong.
    #[error("block {block} at byte {offset} is corrupt ({what}); {}", match .resumed_at {
        Some(at) => format!("reading resumed at the next intact block, byte {at}"),
        None => "no intact block follows".to_string(),
    })]
    Corrupt {
        /// The block's sequence number (the one expected there).
        block: u32,
        /// Where the bad bytes are (the block, or the record inside it).
        offset: u64,
        /// What is wrong.
        what: String,
        /// Where the next intact block starts.
        resumed_at: Option<u64>,
    },
    /// A record that does not decode inside a block whose checksum holds (a writer's bug
    /// or a forged file).
    #[error(
        "block {block}: the record at byte {offset} is malformed ({what}); the block's records after it were skipped"
    )]
    BadRecord {
        /// The block's sequence number.
        block: u32,
        /// Where the record starts.
        offset: u64,
        /// What is wrong.
        what: String,
    },
    /// Blocks missing from the sequence.
    #[error("blocks {first} to {} missing before byte {offset}", .first + .count - 1)]
    Missing {
        /// The first missing block.
        first: u32,
        /// How many.
        count: u32,
        /// Where the block after them starts.
        offset: u64,
    },
    /// No end block: the writer did not finish.
    #[error("end block missing at byte {offset}: the writer did not finish (killed, or still running)")]
    Unfinished {
        /// Where the file ends.
        offset: u64,
    },
    /// Bytes after the end block.
    #[error("{bytes} bytes after the end block at byte {offset} were ignored")]
    Trailing {
        /// Where they start.
        offset: u64,
        /// How many.
        bytes: u64,
    },
    /// A newer writer's file: what this build does not know was skipped.
    #[error("written by format version {version}, newer than this build's {VERSION}: {skipped} records of kinds it does not know were skipped and fields it does not know ignored")]
    Newer {
        /// The writer's version.
        version: u16,
        /// Records skipped.
        skipped: u64,
    },
}

/// A file as far as it is whole.
#[derive(Clone, Debug)]
pub struct StudyFile {
    /// Its header.
    pub header: FileHeader,
    /// Every record of the intact blocks, in file order.
    pub records: Vec<Record>,
    /// Blocks read whole.
    pub blocks: u32,
    /// Records lost to a full ring while tracing (from the last block read).
    pub dropped: u64,
    /// What could not be read (empty: the whole file was).
    pub damage: Vec<Damage>,
}

impl StudyFile {
    /// Nothing was damaged.
    pub fn is_whole(&self) -> bool {
        self.damage.is_empty()
    }
}

/// Reads the file at `path`.
pub fn read_path(path: &Path) -> Result<StudyFile, ReadError> {
    let bytes = std::fs::read(path).map_err(|source| ReadError::Io { path: path.display().to_string(), source })?;
    read_bytes(&bytes)
}

/// Reads a file's bytes.
pub fn read_bytes(bytes: &[u8]) -> Result<StudyFile, ReadError> {
    let header = decode_header(bytes)?;
    let mut file = StudyFile { header, records: Vec::new(), blocks: 0, dropped: 0, damage: Vec::new() };
    let newer = header.version > VERSION;
    let bhl = usize::from(header.block_header_len);
    let mut skipped = 0u64;
    let (mut at, mut expected) = (usize::from(header.header_len), 0u32);
    let mut ended = false;
    while at < bytes.len() {
        let block = match check_block(bytes, at, bhl) {
            Ok(block) => block,
            Err(BlockFault::Truncated(what)) => match next_intact_block(bytes, at + 1, bhl) {
                Some(next) => {
                    let what = format!("{what} runs past the end of the file, yet an intact block follows");
                    file.damage.push(corrupt(expected, at, what, Some(next)));
                    expected = expected.saturating_add(1);
                    at = next;
                    continue;
                }
                None => {
                    file.damage.push(Damage::Truncated { block: expected, offset: at as u64, what });
                    return Ok(finish(file, skipped, newer, header.version));
                }
            },
            Err(BlockFault::Corrupt(what)) => {
                let next = next_intact_block(bytes, at + 1, bhl);
                file.damage.push(corrupt(expected, at, what, next));
                // The bad bytes were (at least) the expected block: the blocks after it
                // are missing only if the next intact one is not the one after.
                expected = expected.saturating_add(1);
                match next {
                    Some(next) => {
                        at = next;
                        continue;
                    }
                    None => return Ok(finish(file, skipped, newer, header.version)),
                }
            }
        };
        let next = at + bhl + block.body_len as usize;
        if block.sequence < expected {
            let what = format!("block {} again after block {}", block.sequence, expected - 1);
            file.damage.push(corrupt(expected, at, what, Some(next)));
            at = next;
            continue;
        }
        if block.sequence > expected {
            let count = block.sequence - expected;
            file.damage.push(Damage::Missing { first: expected, count, offset: at as u64 });
        }
        let body = &bytes[at + bhl..next];
        skipped += decode_body(&mut file, body, block.record_count, (block.sequence, at, bhl), newer);
        file.blocks += 1;
        file.dropped = file.dropped.max(block.dropped_total);
        expected = block.sequence.saturating_add(1);
        at = next;
        if block.flags & BLOCK_FLAG_END != 0 {
            ended = true;
            if at < bytes.len() {
                file.damage.push(Damage::Trailing { offset: at as u64, bytes: (bytes.len() - at) as u64 });
            }
            break;
        }
    }
    if !ended {
        file.damage.push(Damage::Unfinished { offset: bytes.len() as u64 });
    }
    Ok(finish(file, skipped, newer, header.version))
}

fn corrupt(block: u32, at: usize, what: String, resumed_at: Option<usize>) -> Damage {
    Damage::Corrupt { block, offset: at as u64, what, resumed_at: resumed_at.map(|n| n as u64) }
}

fn finish(mut file: StudyFile, skipped: u64, newer: bool, version: u16) -> StudyFile {
    if newer {
        file.damage.insert(0, Damage::Newer { version, skipped });
    }
    file
}

fn decode_header(bytes: &[u8]) -> Result<FileHeader, ReadError> {
    let magic_len = bytes.len().min(FILE_MAGIC.len());
    if bytes[..magic_len] != FILE_MAGIC[..magic_len] {
        return Err(ReadError::NotStudyFile);
    }
    if bytes.len() < 12 {
        return Err(ReadError::HeaderTruncated { len: bytes.len() });
    }
    let (version, min_reader) = (u16_at(bytes, 8), u16_at(bytes, 10));
    if min_reader > VERSION {
        return Err(ReadError::TooNew { version, min_reader });
    }
    if bytes.len() < FILE_HEADER_LEN {
        return Err(ReadError::HeaderTruncated { len: bytes.len() });
    }
    let (header_len, block_header_len) = (u16_at(bytes, 12), u16_at(bytes, 14));
    let lengths_known = usize::from(header_len) == FILE_HEADER_LEN && usize::from(block_header_len) == BLOCK_HEADER_LEN;
    let lengths_possible =
        usize::from(header_len) >= FILE_HEADER_LEN && usize::from(block_header_len) >= BLOCK_HEADER_LEN;
    if version == 0 || min_reader == 0 || min_reader > version {
        return Err(ReadError::HeaderCorrupt(format!("version {version} with min_reader {min_reader}")));
    }
    if !(lengths_known || (version > VERSION && lengths_possible)) {
        return Err(ReadError::HeaderCorrupt(format!(
            "header lengths {header_len} and {block_header_len} (version {version} has {FILE_HEADER_LEN} and {BLOCK_HEADER_LEN})"
        )));
    }
    if bytes.len() < usize::from(header_len) {
        return Err(ReadError::HeaderTruncated { len: bytes.len() });
    }
    // The checksum covers the fields before it and any a newer version appended.
    let crc = crc32c::crc32c_append(crc32c::crc32c(&bytes[..60]), &bytes[FILE_HEADER_LEN..usize::from(header_len)]);
    if crc != u32_at(bytes, 60) {
        return Err(ReadError::HeaderCorrupt("checksum mismatch".into()));
    }
    let kind = match u16_at(bytes, 16) {
        1 => FileKind::Trace,
        2 => FileKind::Snapshot,
        k => return Err(ReadError::HeaderCorrupt(format!("unknown file kind {k}"))),
    };
    Ok(FileHeader {
        version,
        min_reader,
        header_len,
        block_header_len,
        kind,
        tracer_pid: u32_at(bytes, 20),
        start_real_ns: u64_at(bytes, 24),
        start_mono_ns: u64_at(bytes, 32),
    })
}

/// A block header that checked out.
struct GoodBlock {
    flags: u16,
    sequence: u32,
    record_count: u32,
    body_len: u32,
    dropped_total: u64,
}

enum BlockFault {
    Truncated(&'static str),
    Corrupt(String),
}

/// Checks the block at `at`: its header fits, its magic, its lengths, its checksum.
fn check_block(bytes: &[u8], at: usize, bhl: usize) -> Result<GoodBlock, BlockFault> {
    let rest = &bytes[at..];
    let magic_len = rest.len().min(BLOCK_MAGIC.len());
    if rest[..magic_len] != BLOCK_MAGIC[..magic_len] {
        return Err(BlockFault::Corrupt("bad block magic".into()));
    }
    if rest.len() < bhl {
        return Err(BlockFault::Truncated("block header"));
    }
    let h = &rest[..bhl];
    let body_len = u32_at(h, 16);
    if body_len as usize > BLOCK_BODY_MAX {
        return Err(BlockFault::Corrupt(format!("block claims {body_len} bytes (at most {BLOCK_BODY_MAX})")));
    }
    let Some(body) = rest.get(bhl..bhl + body_len as usize) else {
        return Err(BlockFault::Truncated("block body"));
    };
    let crc = crc32c::crc32c_append(crc32c::crc32c_append(crc32c::crc32c(&h[..28]), &h[BLOCK_HEADER_LEN..]), body);
    if crc != u32_at(h, 28) {
        return Err(BlockFault::Corrupt("block checksum mismatch".into()));
    }
    let flags = u16_at(h, 4);
    if flags & !BLOCK_FLAG_END != 0 || u16_at(h, 6) != 0 {
        return Err(BlockFault::Corrupt(format!("block flags {flags:#x} has unknown bits")));
    }
    Ok(GoodBlock { flags, sequence: u32_at(h, 8), record_count: u32_at(h, 12), body_len, dropped_total: u64_at(h, 20) })
}

/// Where the next block whose checksum holds starts, searching from `from`.
fn next_intact_block(bytes: &[u8], from: usize, bhl: usize) -> Option<usize> {
    let mut at = from;
    while at + BLOCK_MAGIC.len() <= bytes.len() {
        let found = bytes[at..].windows(BLOCK_MAGIC.len()).position(|w| w == BLOCK_MAGIC)?;
        at += found;
        if check_block(bytes, at, bhl).is_ok() {
            return Some(at);
        }
        at += 1;
    }
    None
}

/// Decodes a block's records into `file`; a record that does not decode is damage (the
/// records before it are kept). Returns the records skipped as a newer writer's.
fn decode_body(
    file: &mut StudyFile,
    body: &[u8],
    count: u32,
    (block, at_block, bhl): (u32, usize, usize),
    newer: bool,
) -> u64 {
    let (mut at, mut ctx, mut decoded, mut skipped) = (0usize, BlockContext::default(), 0u32, 0u64);
    while at < body.len() {
        let record_at = at;
        match decode_record(&mut ctx, body, &mut at, newer) {
            Ok(Decoded::Record(r)) => file.records.push(r),
            Ok(Decoded::Skipped(_)) => skipped += 1,
            Err(e) => {
                let offset = (at_block + bhl + record_at) as u64;
                file.damage.push(Damage::BadRecord { block, offset, what: e.to_string() });
                return skipped;
            }
        }
        decoded += 1;
    }
    if decoded != count {
        let what = format!("the block states {count} records and holds {decoded}");
        file.damage.push(Damage::BadRecord { block, offset: at_block as u64, what });
    }
    skipped
}
