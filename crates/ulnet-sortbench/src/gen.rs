//! Record generation, compatible byte for byte with gensort 1.5.
//!
//! Record number `r` depends only on `r` and the [`RecordFormat`], so any range
//! of records can be made independently: [`generate_records`] fills a caller's
//! buffer with records `first..first + buf.len() / 100`, which lets a parallel
//! or distributed generator cut the work into pieces and still produce the
//! same bytes as one sequential run.
//!
//! * Binary records: the key is the high ten bytes of `x(r+1)`; the other nine
//!   ten-byte parts are the high ten bytes of `x(r+2)` to `x(r+10)`, each xored
//!   with a constant of its own, so every byte is pseudo-random.
//! * Ascii records (`-a`): a ten-character printable key, two spaces, the record
//!   number as 32 upper-case hex digits, two spaces, 52 hex digits of filler
//!   (each digit four times) and `\r\n`.
//! * Skewed keys (`-s`): the high bits (binary) or bytes (ascii) of the key are
//!   replaced by those of a key chosen by the magnitude of the record number.

use std::io::{self, Write};

use crate::checksum::Checksum;
use crate::rand16;
use crate::RECORD_SIZE;

/// What kind of records to generate: the `-a` and `-s` flags of gensort.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct RecordFormat {
    /// Printable ascii records (`gensort -a`) instead of binary ones.
    pub ascii: bool,
    /// Skewed keys (`gensort -s`).
    pub skewed: bool,
}

impl RecordFormat {
    /// Binary records with uniform keys (gensort's default).
    pub const BINARY: RecordFormat = RecordFormat { ascii: false, skewed: false };
    /// Ascii records with uniform keys (`gensort -a`).
    pub const ASCII: RecordFormat = RecordFormat { ascii: true, skewed: false };
}

/// The constants xored into the random numbers that make bytes 10 to 99 of a
/// binary record; part `k` covers bytes `10k..10k+10` (part 0, the key, is
/// used as it is).
const PART_XOR: [u128; 10] = [
    0,
    0xF0E8_E4E2_E1D8_D4D2_D1CC_0000_0000_0000,
    0xCAC9_C6C5_C3B8_B4B2_B1AC_0000_0000_0000,
    0xAAA9_A6A5_A39C_9A99_9695_0000_0000_0000,
    0x938E_8D8B_8778_7472_716C_0000_0000_0000,
    0x6A69_6665_635C_5A59_5655_0000_0000_0000,
    0x534E_4D4B_473C_3A39_3635_0000_0000_0000,
    0x332E_2D2B_271E_1D1B_170F_0000_0000_0000,
    0xC8C4_C2C1_9894_9291_8CE0_0000_0000_0000,
    0x170F_332E_2D2B_271E_1D1B_0000_0000_0000,
];

/// How many leading key bytes a skew may replace.
const SKEW_BYTES: usize = 6;
/// One skew key per skew index, 0 to 128.
const SKEW_ENTRIES: usize = 129;

/// The ten ascii key characters made from a random number.
const fn ascii_key(x: u128) -> [u8; 10] {
    let mut key = [0u8; 10];
    let mut t = (x >> 64) as u64;
    let mut i = 0;
    while i < 8 {
        key[i] = b' ' + (t % 95) as u8;
        t /= 95;
        i += 1;
    }
    let mut t = x as u64;
    key[8] = b' ' + (t % 95) as u8;
    t /= 95;
    key[9] = b' ' + (t % 95) as u8;
    key
}

/// The skew keys are the leading bytes of the keys of records 0 to 128, in the
/// format they are used for.
const fn skew_table(ascii: bool) -> [[u8; SKEW_BYTES]; SKEW_ENTRIES] {
    let mut table = [[0u8; SKEW_BYTES]; SKEW_ENTRIES];
    let mut x: u128 = 0;
    let mut k = 0;
    while k < SKEW_ENTRIES {
        x = x.wrapping_mul(rand16::MULTIPLIER).wrapping_add(rand16::INCREMENT);
        let key = if ascii {
            ascii_key(x)
        } else {
            let b = x.to_be_bytes();
            [b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9]]
        };
        let mut i = 0;
        while i < SKEW_BYTES {
            table[k][i] = key[i];
            i += 1;
        }
        k += 1;
    }
    table
}

static SKEW_BINARY: [[u8; SKEW_BYTES]; SKEW_ENTRIES] = skew_table(false);
static SKEW_ASCII: [[u8; SKEW_BYTES]; SKEW_ENTRIES] = skew_table(true);

/// The skew index of a record number: roughly its number of significant bits,
/// 0 for record 0, 1 for record 1, 2 for records 2 and 3, and so on. As in the
/// original, a number whose top four bits of a 64-bit half are not all zero
/// counts as the full half (64, or 128 for the high half).
fn skew_index(record: u128) -> usize {
    const TOP4: u64 = 0xF000_0000_0000_0000;
    let hi = (record >> 64) as u64;
    let lo = record as u64;
    if hi == 0 {
        if lo == 0 {
            0
        } else if lo & TOP4 != 0 {
            64
        } else {
            (64 - lo.leading_zeros()) as usize
        }
    } else if hi & TOP4 != 0 {
        128
    } else {
        (128 - hi.leading_zeros()) as usize
    }
}

/// Upper-case hex digit of the low four bits of `v`.
#[inline(always)]
fn hex_digit(v: u64) -> u8 {
    b"0123456789ABCDEF"[(v & 0xF) as usize]
}

/// Builds a binary record from `xs[0..10]`, the ten random numbers that
/// follow the record's number.
#[inline(always)]
fn binary_record(rec: &mut [u8], xs: &[u128]) {
    for (k, (part, x)) in rec.chunks_exact_mut(10).zip(xs).enumerate() {
        part.copy_from_slice(&(x ^ PART_XOR[k]).to_be_bytes()[..10]);
    }
}

/// Builds an ascii record numbered `record` from its random number `x`.
#[inline(always)]
fn ascii_record(rec: &mut [u8], x: u128, record: u128) {
    rec[..10].copy_from_slice(&ascii_key(x));
    rec[10] = b' ';
    rec[11] = b' ';
    for (i, byte) in rec[12..44].iter_mut().enumerate() {
        *byte = hex_digit((record >> (124 - 4 * i)) as u64);
    }
    rec[44] = b' ';
    rec[45] = b' ';
    let lo = x as u64;
    for (i, group) in rec[46..98].chunks_exact_mut(4).enumerate() {
        group.fill(hex_digit(lo >> (48 - 4 * i)));
    }
    rec[98] = b'\r';
    rec[99] = b'\n';
}

/// Replaces the high bits of a binary key by those of the record's skew key.
#[inline(always)]
fn skew_binary(rec: &mut [u8], x: u128, record: u128) {
    let mut bits = ((x >> 32) & 0x3F) as usize;
    if bits > 8 * SKEW_BYTES {
        bits = 0;
    }
    let skew = &SKEW_BINARY[skew_index(record)];
    let whole = bits / 8;
    rec[..whole].copy_from_slice(&skew[..whole]);
    let rest = bits % 8;
    if rest > 0 {
        let keep = 0xFFu8 >> rest;
        rec[whole] = (skew[whole] & !keep) | (rec[whole] & keep);
    }
}

/// Replaces the leading characters of an ascii key by those of the record's
/// skew key.
#[inline(always)]
fn skew_ascii(rec: &mut [u8], x: u128, record: u128) {
    let mut count = ((x >> 32) & 0x7) as usize;
    if count > SKEW_BYTES {
        count = 0;
    }
    rec[..count].copy_from_slice(&SKEW_ASCII[skew_index(record)][..count]);
}

/// Records made per batch of random numbers.
const BATCH: usize = 512;

/// A sequential record generator: makes records one after another from a
/// starting record number, with no limit but the 128-bit record numbers
/// (which wrap around, as in the original).
#[derive(Debug, Clone)]
pub struct RecordGenerator {
    format: RecordFormat,
    next_record: u128,
    /// `x(next_record + 1)`, the first random number of the next record.
    head: u128,
}

impl RecordGenerator {
    /// A generator whose first record is number `first_record`.
    pub fn new(first_record: u128, format: RecordFormat) -> Self {
        RecordGenerator { format, next_record: first_record, head: rand16::next(rand16::skip_ahead(first_record)) }
    }

    /// The number of the record that the next call will make first.
    pub fn next_record(&self) -> u128 {
        self.next_record
    }

    /// The format of the records made.
    pub fn format(&self) -> RecordFormat {
        self.format
    }

    /// Fills `buf` with the next `buf.len() / 100` records.
    ///
    /// # Panics
    ///
    /// If `buf.len()` is not a multiple of 100.
    pub fn fill(&mut self, buf: &mut [u8]) {
        assert!(
            buf.len().is_multiple_of(RECORD_SIZE),
            "buffer length {} is not a multiple of the record size",
            buf.len()
        );
        let mut xs = [0u128; BATCH + 9];
        for batch in buf.chunks_mut(BATCH * RECORD_SIZE) {
            let n = batch.len() / RECORD_SIZE;
            let needed = if self.format.ascii { n } else { n + 9 };
            xs[0] = self.head;
            for i in 1..needed {
                xs[i] = rand16::next(xs[i - 1]);
            }
            let first = self.next_record;
            match (self.format.ascii, self.format.skewed) {
                (false, false) => {
                    for (j, rec) in batch.chunks_exact_mut(RECORD_SIZE).enumerate() {
                        binary_record(rec, &xs[j..j + 10]);
                    }
                }
                (false, true) => {
                    for (j, rec) in batch.chunks_exact_mut(RECORD_SIZE).enumerate() {
                        binary_record(rec, &xs[j..j + 10]);
                        skew_binary(rec, xs[j], first.wrapping_add(j as u128));
                    }
                }
                (true, skewed) => {
                    for (j, rec) in batch.chunks_exact_mut(RECORD_SIZE).enumerate() {
                        let record = first.wrapping_add(j as u128);
                        ascii_record(rec, xs[j], record);
                        if skewed {
                            skew_ascii(rec, xs[j], record);
                        }
                    }
                }
            }
            self.head = rand16::next(xs[n - 1]);
            self.next_record = first.wrapping_add(n as u128);
        }
    }
}

/// Fills `buf` with records `first_record .. first_record + buf.len() / 100`
/// in the given format: exactly the bytes gensort writes for those records.
///
/// # Panics
///
/// If `buf.len()` is not a multiple of 100.
pub fn generate_records(first_record: u128, format: RecordFormat, buf: &mut [u8]) {
    RecordGenerator::new(first_record, format).fill(buf);
}

/// Records generated per write in [`write_records`] (4 MB).
const WRITE_RECORDS: usize = 40_000;

/// Writes `count` records starting at `first_record` to `out` in large
/// writes, and returns the checksum of the records when `checksum` is true
/// (computing it costs a CRC32 per record).
pub fn write_records<W: Write>(
    out: &mut W,
    first_record: u128,
    count: u64,
    format: RecordFormat,
    checksum: bool,
) -> io::Result<Option<Checksum>> {
    generate_with(first_record, count, format, checksum, |chunk| out.write_all(chunk))
}

/// Generates `count` records starting at `first_record` in chunks of at most
/// 4 MB and hands each chunk to `sink`; returns the checksum when asked for.
pub fn generate_with<F>(
    first_record: u128,
    count: u64,
    format: RecordFormat,
    checksum: bool,
    mut sink: F,
) -> io::Result<Option<Checksum>>
where
    F: FnMut(&[u8]) -> io::Result<()>,
{
    let mut gen = RecordGenerator::new(first_record, format);
    let chunk_records = (WRITE_RECORDS as u64).min(count) as usize;
    let mut buf = vec![0u8; chunk_records * RECORD_SIZE];
    let mut sum = Checksum::default();
    let mut left = count;
    while left > 0 {
        let n = (chunk_records as u64).min(left) as usize;
        let chunk = &mut buf[..n * RECORD_SIZE];
        gen.fill(chunk);
        if checksum {
            sum += Checksum::of_records(chunk);
        }
        sink(chunk)?;
        left -= n as u64;
    }
    Ok(checksum.then_some(sum))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_keys() {
        let mut buf = [0u8; 100];
        generate_records(0, RecordFormat::BINARY, &mut buf);
        assert_eq!(&buf[..10], b"JimGrayRIP");
        generate_records(0, RecordFormat::ASCII, &mut buf);
        assert_eq!(&buf[..12], b"AsfAGHM5om  ");
        assert_eq!(&buf[12..44], [b'0'; 32].as_slice());
        assert_eq!(&buf[98..], b"\r\n");
    }

    #[test]
    fn skew_index_examples() {
        let cases: [(u128, usize); 12] = [
            (0, 0),
            (1, 1),
            (2, 2),
            (3, 2),
            (4, 3),
            (7, 3),
            (8, 4),
            (0x10, 5),
            (0x8000_0000_0000_0000, 64),
            (0xFFFF_FFFF_FFFF_FFFF, 64),
            (1 << 64, 65),
            (u128::MAX, 128),
        ];
        for (record, index) in cases {
            assert_eq!(skew_index(record), index, "record {record:#x}");
        }
        // The quirk of the original: any of the top four bits of a half set
        // means the whole half.
        assert_eq!(skew_index(1 << 60), 64);
        assert_eq!(skew_index(1 << 124), 128);
        assert_eq!(skew_index((1 << 64) | 1), 65);
    }

    #[test]
    fn skew_tables_spot_values() {
        // Values of the original's skew key tables.
        assert_eq!(SKEW_BINARY[0], [0x4a, 0x69, 0x6d, 0x47, 0x72, 0x61]);
        assert_eq!(SKEW_BINARY[4], [0x5c, 0x90, 0xab, 0x38, 0xae, 0x52]);
        assert_eq!(SKEW_BINARY[64], [0x33, 0xd5, 0xb5, 0xb1, 0x5c, 0x70]);
        assert_eq!(SKEW_BINARY[128], [0xe1, 0xdc, 0x46, 0xb6, 0x45, 0xc4]);
        assert_eq!(&SKEW_ASCII[0], b"AsfAGH");
        assert_eq!(&SKEW_ASCII[9], b"5HA\\z%");
        assert_eq!(&SKEW_ASCII[112], b"j17a3a");
        assert_eq!(&SKEW_ASCII[128], b"12NSK|");
    }

    #[test]
    fn pieces_equal_whole() {
        for format in [
            RecordFormat::BINARY,
            RecordFormat::ASCII,
            RecordFormat { ascii: false, skewed: true },
            RecordFormat { ascii: true, skewed: true },
        ] {
            let mut whole = vec![0u8; 1500 * RECORD_SIZE];
            generate_records(7, format, &mut whole);
            let mut gen = RecordGenerator::new(7, format);
            let mut pieces = vec![0u8; 1500 * RECORD_SIZE];
            let (a, b) = pieces.split_at_mut(513 * RECORD_SIZE);
            gen.fill(a);
            gen.fill(b);
            assert_eq!(whole, pieces);
            let mut tail = vec![0u8; 100 * RECORD_SIZE];
            generate_records(7 + 1400, format, &mut tail);
            assert_eq!(&whole[1400 * RECORD_SIZE..], &tail[..]);
        }
    }

    #[test]
    fn record_numbers_wrap() {
        let mut a = vec![0u8; 3 * RECORD_SIZE];
        generate_records(u128::MAX - 1, RecordFormat::ASCII, &mut a);
        let mut b = vec![0u8; RECORD_SIZE];
        generate_records(0, RecordFormat::ASCII, &mut b);
        assert_eq!(&a[2 * RECORD_SIZE..], &b[..]);
        assert_eq!(&a[12..44], [b'F'; 31].iter().chain(b"E").copied().collect::<Vec<_>>());
    }
}
