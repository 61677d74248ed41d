//! Validation of sorted records, compatible with valsort 1.5.
//!
//! A [`Summary`] describes a run of records: how many there are, their
//! checksum, how many keys equal the previous key, how many records are less
//! than the one before them (and where the first such record is), and the
//! first and last record. Summaries of consecutive partitions combine in order
//! ([`Summary::then`], [`combine`]) into the summary of their concatenation, so a
//! distributed sort can validate each partition where it lies and check the
//! whole from the summaries alone. [`Summary::to_bytes`] and
//! [`Summary::from_bytes`] give valsort's 280-byte summary record (`-o`, `-s`).

use std::cmp::Ordering;

use crate::checksum::Checksum;
use crate::{KEY_SIZE, RECORD_SIZE};

/// Size in bytes of valsort's summary record: five 128-bit counters, then the
/// first and the last record.
pub const SUMMARY_SIZE: usize = 5 * 16 + 2 * RECORD_SIZE;

/// Why records or summaries could not be validated; the messages are the
/// original's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValsortError {
    /// There was no record (or no summary) at all.
    #[error("there must be at least one record to be validated")]
    Empty,
    /// The input's length is not a multiple of 100 bytes.
    #[error("partial record found at end")]
    PartialRecord,
    /// A summary file's length is not a multiple of 280 bytes.
    #[error("partial partition summary found at end")]
    PartialSummary,
}

/// How keys are compared.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum KeyOrder {
    /// Unsigned bytes, as `memcmp` (and `LC_ALL=C sort`): valsort's default.
    #[default]
    Bytes,
    /// Ascii letters compared without regard to case, stopping at a NUL byte
    /// (valsort `-i`, for PennySort). Only the 10-byte key is compared.
    CaseInsensitive,
}

impl KeyOrder {
    /// Compares the keys (first 10 bytes) of two records.
    #[inline]
    pub fn compare(self, a: &[u8], b: &[u8]) -> Ordering {
        let (a, b) = (&a[..KEY_SIZE], &b[..KEY_SIZE]);
        match self {
            KeyOrder::Bytes => a.cmp(b),
            KeyOrder::CaseInsensitive => {
                for (&x, &y) in a.iter().zip(b) {
                    let (x, y) = (x.to_ascii_lowercase(), y.to_ascii_lowercase());
                    if x != y {
                        return x.cmp(&y);
                    }
                    if x == 0 {
                        break;
                    }
                }
                Ordering::Equal
            }
        }
    }
}

/// The summary of a run of records, as valsort keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Summary {
    /// Index (from 0) of the first record whose key is less than the previous
    /// key, or 0 when every record is in order (record 0 is never unordered).
    pub first_unordered: u128,
    /// Number of records whose key is less than the previous key.
    pub unordered_count: u128,
    /// Number of records.
    pub records: u128,
    /// Number of records whose key equals the previous key.
    pub duplicates: u128,
    /// Sum of the CRC32s of the records.
    pub checksum: Checksum,
    /// The first record.
    pub first_record: [u8; RECORD_SIZE],
    /// The last record.
    pub last_record: [u8; RECORD_SIZE],
}

impl Summary {
    /// Summarizes a buffer of whole records with byte-order keys.
    pub fn of_records(records: &[u8]) -> Result<Summary, ValsortError> {
        Summary::of_records_with(records, KeyOrder::Bytes)
    }

    /// Summarizes a buffer of whole records, comparing keys by `order`.
    pub fn of_records_with(records: &[u8], order: KeyOrder) -> Result<Summary, ValsortError> {
        let mut v = Validator::new(order);
        v.push(records);
        v.finish()
    }

    /// True when no record is out of order.
    pub fn is_sorted(&self) -> bool {
        self.unordered_count == 0
    }

    /// The index of the first unordered record, if there is one.
    pub fn first_unordered(&self) -> Option<u128> {
        (self.first_unordered != 0).then_some(self.first_unordered)
    }

    /// The summary of these records followed by those of `next`, with
    /// byte-order keys. The boundary is checked like any pair of neighbours:
    /// `next`'s first key must not be less than this summary's last key.
    pub fn then(&self, next: &Summary) -> Summary {
        self.then_with(next, KeyOrder::Bytes)
    }

    /// [`then`](Summary::then) with keys compared by `order`.
    pub fn then_with(&self, next: &Summary, order: KeyOrder) -> Summary {
        let mut out = self.clone();
        match order.compare(&self.last_record, &next.first_record) {
            Ordering::Equal => out.duplicates = out.duplicates.wrapping_add(1),
            Ordering::Greater => {
                if out.first_unordered == 0 {
                    out.first_unordered = out.records;
                }
                out.unordered_count = out.unordered_count.wrapping_add(1);
            }
            Ordering::Less => {}
        }
        if out.first_unordered == 0 && next.first_unordered != 0 {
            out.first_unordered = out.records.wrapping_add(next.first_unordered);
        }
        out.unordered_count = out.unordered_count.wrapping_add(next.unordered_count);
        out.records = out.records.wrapping_add(next.records);
        out.duplicates = out.duplicates.wrapping_add(next.duplicates);
        out.checksum += next.checksum;
        out.last_record = next.last_record;
        out
    }

    /// The 280-byte summary record valsort writes with `-o`: each counter as
    /// its high 64 bits then its low 64 bits, both little-endian (as on
    /// x86-64), then the first and the last record.
    pub fn to_bytes(&self) -> [u8; SUMMARY_SIZE] {
        let mut out = [0u8; SUMMARY_SIZE];
        let counters = [self.first_unordered, self.unordered_count, self.records, self.duplicates, self.checksum.0];
        for (slot, v) in out.chunks_exact_mut(16).zip(counters) {
            slot[..8].copy_from_slice(&((v >> 64) as u64).to_le_bytes());
            slot[8..].copy_from_slice(&(v as u64).to_le_bytes());
        }
        out[80..180].copy_from_slice(&self.first_record);
        out[180..].copy_from_slice(&self.last_record);
        out
    }

    /// Reads a 280-byte summary record (see [`to_bytes`](Summary::to_bytes)).
    pub fn from_bytes(bytes: &[u8; SUMMARY_SIZE]) -> Summary {
        let counter = |i: usize| {
            let at = |o: usize| {
                let mut b = [0u8; 8];
                b.copy_from_slice(&bytes[o..o + 8]);
                u64::from_le_bytes(b)
            };
            (u128::from(at(16 * i)) << 64) | u128::from(at(16 * i + 8))
        };
        let mut first_record = [0u8; RECORD_SIZE];
        first_record.copy_from_slice(&bytes[80..180]);
        let mut last_record = [0u8; RECORD_SIZE];
        last_record.copy_from_slice(&bytes[180..]);
        Summary {
            first_unordered: counter(0),
            unordered_count: counter(1),
            records: counter(2),
            duplicates: counter(3),
            checksum: Checksum(counter(4)),
            first_record,
            last_record,
        }
    }

    /// The line valsort prints when it finds the first unordered record, if
    /// there is one (with its newline).
    pub fn first_unordered_line(&self) -> Option<String> {
        self.first_unordered().map(|i| format!("First unordered record is record {i}\n"))
    }

    /// The lines valsort prints once it has read everything: the record count,
    /// the checksum, and either the unordered count or the duplicate count and
    /// success.
    pub fn totals_lines(&self) -> String {
        let mut s = format!("Records: {}\nChecksum: {}\n", self.records, self.checksum);
        if self.unordered_count != 0 {
            s += &format!("ERROR - there are {} unordered records\n", self.unordered_count);
        } else {
            s += &format!("Duplicate keys: {}\n", self.duplicates);
            s += "SUCCESS - all records are in order\n";
        }
        s
    }

    /// Everything valsort prints (on standard error) for these records when
    /// not quiet: [`first_unordered_line`](Summary::first_unordered_line) then
    /// [`totals_lines`](Summary::totals_lines).
    pub fn report(&self) -> String {
        self.first_unordered_line().unwrap_or_default() + &self.totals_lines()
    }

    /// valsort's exit status for these records: 1 when some are out of order,
    /// else 0.
    pub fn exit_code(&self) -> i32 {
        i32::from(!self.is_sorted())
    }
}

/// Combines the summaries of consecutive partitions, in order, into the
/// summary of their concatenation (byte-order keys). `None` when there are none.
pub fn combine(summaries: &[Summary]) -> Option<Summary> {
    combine_with(summaries, KeyOrder::Bytes)
}

/// [`combine`] with keys compared by `order`.
pub fn combine_with(summaries: &[Summary], order: KeyOrder) -> Option<Summary> {
    let (first, rest) = summaries.split_first()?;
    Some(rest.iter().fold(first.clone(), |acc, next| acc.then_with(next, order)))
}

/// Splits a concatenation of 280-byte summary records (a `valsort -s` input).
pub fn parse_summaries(bytes: &[u8]) -> Result<Vec<Summary>, ValsortError> {
    if bytes.is_empty() {
        return Err(ValsortError::Empty);
    }
    if !bytes.len().is_multiple_of(SUMMARY_SIZE) {
        return Err(ValsortError::PartialSummary);
    }
    Ok(bytes
        .chunks_exact(SUMMARY_SIZE)
        .map(|c| {
            let mut b = [0u8; SUMMARY_SIZE];
            b.copy_from_slice(c);
            Summary::from_bytes(&b)
        })
        .collect())
}

/// Streaming validator: feed it the bytes of a record file in pieces of any
/// size with [`push`](Validator::push), then [`finish`](Validator::finish) it
/// to get the [`Summary`].
#[derive(Debug, Clone)]
pub struct Validator {
    order: KeyOrder,
    first_unordered: u128,
    unordered_count: u128,
    records: u128,
    duplicates: u128,
    checksum: Checksum,
    first_record: [u8; RECORD_SIZE],
    prev: [u8; RECORD_SIZE],
    /// Bytes of a record split across two pushes.
    pending: Vec<u8>,
}

impl Default for Validator {
    fn default() -> Self {
        Validator::new(KeyOrder::Bytes)
    }
}

impl Validator {
    /// A validator with no records yet.
    pub fn new(order: KeyOrder) -> Self {
        Validator {
            order,
            first_unordered: 0,
            unordered_count: 0,
            records: 0,
            duplicates: 0,
            checksum: Checksum::default(),
            first_record: [0; RECORD_SIZE],
            prev: [0; RECORD_SIZE],
            pending: Vec::with_capacity(RECORD_SIZE),
        }
    }

    /// Records seen so far.
    pub fn records(&self) -> u128 {
        self.records
    }

    /// The index of the first unordered record, once one has been seen.
    pub fn first_unordered(&self) -> Option<u128> {
        (self.first_unordered != 0).then_some(self.first_unordered)
    }

    #[inline]
    fn record(&mut self, rec: &[u8], prev: Option<&[u8]>) {
        self.checksum += Checksum::of_record(rec);
        if self.records == 0 {
            self.first_record.copy_from_slice(rec);
        } else {
            let prev = prev.unwrap_or(&self.prev);
            match self.order.compare(prev, rec) {
                Ordering::Equal => self.duplicates += 1,
                Ordering::Greater => {
                    if self.first_unordered == 0 {
                        self.first_unordered = self.records;
                    }
                    self.unordered_count += 1;
                }
                Ordering::Less => {}
            }
        }
        self.records = self.records.wrapping_add(1);
    }

    /// Adds the next bytes of the record stream.
    pub fn push(&mut self, mut data: &[u8]) {
        if !self.pending.is_empty() {
            let take = (RECORD_SIZE - self.pending.len()).min(data.len());
            self.pending.extend_from_slice(&data[..take]);
            data = &data[take..];
            if self.pending.len() < RECORD_SIZE {
                return;
            }
            let rec = std::mem::take(&mut self.pending);
            self.record(&rec, None);
            self.prev.copy_from_slice(&rec);
            self.pending = rec;
            self.pending.clear();
        }
        let whole = data.len() / RECORD_SIZE * RECORD_SIZE;
        let (records, rest) = data.split_at(whole);
        let mut prev: Option<&[u8]> = None;
        for rec in records.chunks_exact(RECORD_SIZE) {
            self.record(rec, prev);
            prev = Some(rec);
        }
        if let Some(last) = prev {
            self.prev.copy_from_slice(last);
        }
        self.pending.extend_from_slice(rest);
    }

    /// The summary of all the records pushed; an error when there were none
    /// or when the stream ended inside a record.
    pub fn finish(self) -> Result<Summary, ValsortError> {
        if !self.pending.is_empty() {
            return Err(ValsortError::PartialRecord);
        }
        if self.records == 0 {
            return Err(ValsortError::Empty);
        }
        Ok(Summary {
            first_unordered: self.first_unordered,
            unordered_count: self.unordered_count,
            records: self.records,
            duplicates: self.duplicates,
            checksum: self.checksum,
            first_record: self.first_record,
            last_record: self.prev,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(key: &[u8]) -> Vec<u8> {
        let mut r = vec![b'x'; RECORD_SIZE];
        r[..key.len()].copy_from_slice(key);
        r
    }

    fn records(keys: &[&[u8]]) -> Vec<u8> {
        keys.iter().flat_map(|k| rec(k)).collect()
    }

    #[test]
    fn counts() {
        let data = records(&[b"b", b"a", b"a", b"c", b"b"]);
        let s = Summary::of_records(&data).unwrap();
        assert_eq!(s.records, 5);
        assert_eq!(s.first_unordered, 1);
        assert_eq!(s.unordered_count, 2);
        assert_eq!(s.duplicates, 1);
        assert_eq!(s.checksum, Checksum::of_records(&data));
        assert_eq!(s.first_record.to_vec(), rec(b"b"));
        assert_eq!(s.last_record.to_vec(), rec(b"b"));
    }

    #[test]
    fn pieces_of_any_size() {
        let data = records(&[b"d", b"a", b"a", b"c", b"b", b"z", b"y"]);
        let whole = Summary::of_records(&data).unwrap();
        for step in [1, 7, 99, 100, 101, 250] {
            let mut v = Validator::default();
            for piece in data.chunks(step) {
                v.push(piece);
            }
            assert_eq!(v.finish().unwrap(), whole, "step {step}");
        }
    }

    #[test]
    fn errors() {
        assert_eq!(Summary::of_records(&[]), Err(ValsortError::Empty));
        assert_eq!(Summary::of_records(&[0u8; 150]), Err(ValsortError::PartialRecord));
        assert_eq!(parse_summaries(&[]), Err(ValsortError::Empty));
        assert_eq!(parse_summaries(&[0u8; 300]), Err(ValsortError::PartialSummary));
    }

    #[test]
    fn bytes_round_trip() {
        let data = records(&[b"b", b"a", b"a"]);
        let mut s = Summary::of_records(&data).unwrap();
        s.checksum = Checksum((7u128 << 64) | 9);
        assert_eq!(Summary::from_bytes(&s.to_bytes()), s);
    }

    #[test]
    fn case_insensitive() {
        let o = KeyOrder::CaseInsensitive;
        assert_eq!(o.compare(&rec(b"ABC"), &rec(b"abc")), Ordering::Equal);
        assert_eq!(o.compare(&rec(b"abD"), &rec(b"ABc")), Ordering::Greater);
        assert_eq!(KeyOrder::Bytes.compare(&rec(b"ABC"), &rec(b"abc")), Ordering::Less);
    }

    #[test]
    fn report_text() {
        let s = Summary::of_records(&records(&[b"a", b"a"])).unwrap();
        assert_eq!(s.exit_code(), 0);
        assert_eq!(
            s.report(),
            format!("Records: 2\nChecksum: {}\nDuplicate keys: 1\nSUCCESS - all records are in order\n", s.checksum)
        );
    }
}
