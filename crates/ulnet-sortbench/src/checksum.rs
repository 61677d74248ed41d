//! The record checksum of gensort and valsort: the 128-bit sum (modulo 2^128)
//! of the CRC32 of every 100-byte record. Being a sum, it does not change when
//! the records are permuted, so a sort's output must have the checksum of its
//! input.

use std::fmt;
use std::ops::{Add, AddAssign};

use crate::RECORD_SIZE;

/// A sum of record CRC32s. Its [`Display`](fmt::Display) form is the one the
/// original tools print: lower-case hex with no leading zeros and no `0x`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Checksum(pub u128);

impl Checksum {
    /// The checksum of one record (any byte slice; records are 100 bytes).
    #[inline]
    pub fn of_record(record: &[u8]) -> Checksum {
        Checksum(u128::from(crc32fast::hash(record)))
    }

    /// The checksum of a run of whole 100-byte records; a trailing partial
    /// record, if any, is left out.
    pub fn of_records(records: &[u8]) -> Checksum {
        records.chunks_exact(RECORD_SIZE).fold(Checksum::default(), |sum, rec| sum + Checksum::of_record(rec))
    }

    /// The 128-bit value.
    pub fn value(self) -> u128 {
        self.0
    }
}

impl Add for Checksum {
    type Output = Checksum;
    fn add(self, other: Checksum) -> Checksum {
        Checksum(self.0.wrapping_add(other.0))
    }
}

impl AddAssign for Checksum {
    fn add_assign(&mut self, other: Checksum) {
        *self = *self + other;
    }
}

impl std::iter::Sum for Checksum {
    fn sum<I: Iterator<Item = Checksum>>(iter: I) -> Checksum {
        iter.fold(Checksum::default(), Add::add)
    }
}

impl fmt::Display for Checksum {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:x}", self.0)
    }
}

impl fmt::LowerHex for Checksum {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::LowerHex::fmt(&self.0, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display() {
        assert_eq!(Checksum(0).to_string(), "0");
        assert_eq!(Checksum(0x1ea6370b955).to_string(), "1ea6370b955");
        assert_eq!(Checksum((1u128 << 64) | 0xab).to_string(), "100000000000000ab");
    }

    #[test]
    fn wraps() {
        assert_eq!(Checksum(u128::MAX) + Checksum(2), Checksum(1));
    }
}
