//! The sort core: records are sorted as 16-byte entries — the 10-byte key in the top 80
//! bits of a `u128`, the record's index below it — by one most-significant-digit radix
//! pass, then each small digit group on its own.
//!
//! The digit is taken from the highest bits in which the entries' keys differ (the keys of
//! a bucket share a prefix), with about as many digit values as entries, so the groups
//! hold one or two entries each on uniform keys and an insertion sort finishes them. A
//! group that is still large (skewed keys) is sorted by pattern-defeating quicksort.

use ulnet_sortbench::KEY_SIZE;

/// Bits of an entry below the key, holding the record's index.
pub const INDEX_BITS: u32 = 48;
const INDEX_MASK: u128 = (1 << INDEX_BITS) - 1;

/// Groups of at most this many entries are finished by insertion sort.
const INSERTION_MAX: usize = 24;
/// Widest digit: 65,536 counters (256 KiB), still in the second-level cache.
const DIGIT_BITS_MAX: u32 = 16;

/// The key of a record as the top 80 bits of a `u128`, with `index` in the low 48 bits
/// (equal keys sort by index: stable, and distinct entries for distinct records).
#[inline(always)]
pub fn entry(record: &[u8], index: u64) -> u128 {
    let mut k = [0u8; 16];
    k[..KEY_SIZE].copy_from_slice(&record[..KEY_SIZE]);
    u128::from_be_bytes(k) | (u128::from(index) & INDEX_MASK)
}

/// The key of a record alone (an entry with index 0).
#[inline(always)]
pub fn key(record: &[u8]) -> u128 {
    entry(record, 0)
}

/// The record index of an entry.
#[inline(always)]
pub fn index_of(entry: u128) -> usize {
    (entry & INDEX_MASK) as usize
}

/// Sorts `entries`, using `scratch` (grown as needed) for the radix pass; returns the
/// sorted entries, which are in one of the two.
pub fn sort_entries<'a>(entries: &'a mut [u128], scratch: &'a mut Vec<u128>) -> &'a [u128] {
    let n = entries.len();
    if n <= INSERTION_MAX {
        insertion_sort(entries);
        return entries;
    }
    let (mut lo, mut hi) = (u64::MAX, 0u64);
    for &e in entries.iter() {
        let top = (e >> 64) as u64;
        lo = lo.min(top);
        hi = hi.max(top);
    }
    if lo == hi {
        // The top 64 bits agree: what differs is the last two key bytes and the index.
        entries.sort_unstable();
        return entries;
    }
    let differing = 64 - (lo ^ hi).leading_zeros();
    let bits = (usize::BITS - n.leading_zeros()).clamp(4, DIGIT_BITS_MAX);
    let shift = differing.saturating_sub(bits);
    let base = lo >> shift;
    let groups = ((hi >> shift) - base + 1) as usize;
    let digit = |e: u128| (((e >> 64) as u64 >> shift) - base) as usize;
    let mut starts = vec![0u32; groups + 1];
    for &e in entries.iter() {
        starts[digit(e) + 1] += 1;
    }
    for g in 0..groups {
        starts[g + 1] += starts[g];
    }
    scratch.clear();
    scratch.resize(n, 0);
    let mut fill = starts.clone();
    for &e in entries.iter() {
        let d = digit(e);
        scratch[fill[d] as usize] = e;
        fill[d] += 1;
    }
    for g in 0..groups {
        let group = &mut scratch[starts[g] as usize..starts[g + 1] as usize];
        if group.len() <= INSERTION_MAX {
            insertion_sort(group);
        } else {
            group.sort_unstable();
        }
    }
    scratch
}

fn insertion_sort(v: &mut [u128]) {
    for i in 1..v.len() {
        let x = v[i];
        let mut j = i;
        while j > 0 && v[j - 1] > x {
            v[j] = v[j - 1];
            j -= 1;
        }
        v[j] = x;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn check(keys: Vec<[u8; 10]>) {
        let records: Vec<u8> = keys
            .iter()
            .flat_map(|k| {
                let mut r = [0u8; 100];
                r[..10].copy_from_slice(k);
                r
            })
            .collect();
        let mut entries: Vec<u128> = records.chunks_exact(100).enumerate().map(|(i, r)| entry(r, i as u64)).collect();
        let mut scratch = Vec::new();
        let out = sort_entries(&mut entries, &mut scratch).to_vec();
        assert_eq!(out.len(), keys.len());
        let mut want = keys.clone();
        want.sort();
        let got: Vec<[u8; 10]> = out.iter().map(|&e| keys[index_of(e)]).collect();
        assert_eq!(got, want);
        assert!(out.windows(2).all(|w| w[0] < w[1]), "entries are distinct and ascending");
    }

    #[test]
    fn sorts_large_uniform_and_prefix_sharing_runs() {
        let mut x = 0x1234_5678_9abc_def0u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let uniform: Vec<[u8; 10]> = (0..20_000)
            .map(|_| {
                let mut k = [0u8; 10];
                k[..8].copy_from_slice(&next().to_be_bytes());
                k[8..].copy_from_slice(&next().to_be_bytes()[..2]);
                k
            })
            .collect();
        check(uniform.clone());
        // Every key shares 7 bytes: the digit must come from below the prefix.
        let shared: Vec<[u8; 10]> = uniform
            .iter()
            .map(|k| {
                let mut k = *k;
                k[..7].copy_from_slice(b"SAMEPRE");
                k
            })
            .collect();
        check(shared);
        // Every key shares 8 bytes: only the last two and the index differ.
        let eight: Vec<[u8; 10]> = uniform
            .iter()
            .map(|k| {
                let mut k = *k;
                k[..8].copy_from_slice(b"SAMEPREF");
                k
            })
            .collect();
        check(eight);
        // Few distinct keys: large groups of duplicates.
        let dups: Vec<[u8; 10]> = uniform
            .iter()
            .map(|k| {
                let mut d = [b'a'; 10];
                d[9] = k[0] % 3;
                d[0] = k[1] % 2;
                d
            })
            .collect();
        check(dups);
    }

    proptest! {
        #[test]
        fn sorts_any_keys(keys in proptest::collection::vec(any::<[u8; 10]>(), 0..3000)) {
            check(keys);
        }
    }
}
