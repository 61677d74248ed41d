//! The sort core: records are sorted as 16-byte entries — the 10-byte key in the top 80
//! bits of a `u128`, the record's index below it — by one most-significant-digit radix
//! pass into up to 65,536 buckets, each then sorted on its own. Buckets come out in key
//! order, so the caller can write the first while later ones are still being sorted.
//!
//! The digit is the 16 bits below the prefix that all keys of the run share (after range
//! partitioning a node's keys share a prefix), so buckets stay small on any node. A
//! bucket that is still large (skewed keys) is sorted by pattern-defeating quicksort.

use ulnet_sortbench::KEY_SIZE;

/// Bits of an entry below the key, holding the record's index.
pub const INDEX_BITS: u32 = 48;
const INDEX_MASK: u128 = (1 << INDEX_BITS) - 1;

/// The key of a record as the top 80 bits of a `u128`, with `index` in the low 48 bits
/// (equal keys sort by index: stable, and distinct entries for distinct records).
#[inline(always)]
pub fn entry(record: &[u8], index: u64) -> u128 {
    let mut k = [0u8; 16];
    k[..KEY_SIZE].copy_from_slice(&record[..KEY_SIZE]);
    u128::from_be_bytes(k) | (u128::from(index) & INDEX_MASK)
}

/// The record index of an entry.
#[inline(always)]
pub fn index_of(entry: u128) -> usize {
    (entry & INDEX_MASK) as usize
}

/// The entries of a run of records, one per record, indexes from 0.
pub fn entries_of(records: &[u8], record_size: usize) -> Vec<u128> {
    records.chunks_exact(record_size).enumerate().map(|(i, r)| entry(r, i as u64)).collect()
}

/// Sorts `entries` and hands each sorted bucket to `emit`, in order. Uses a scratch
/// array of the same size.
pub fn sort_emitting(entries: Vec<u128>, mut emit: impl FnMut(&[u128])) {
    let n = entries.len();
    if n <= 1024 {
        let mut e = entries;
        e.sort_unstable();
        emit(&e);
        return;
    }
    let (mut lo, mut hi) = (u64::MAX, 0u64);
    for &e in &entries {
        let top = (e >> 64) as u64;
        lo = lo.min(top);
        hi = hi.max(top);
    }
    let differing = 64 - (lo ^ hi).leading_zeros();
    let shift = differing.saturating_sub(16);
    let base = lo >> shift;
    let buckets = ((hi >> shift) - base + 1) as usize;
    debug_assert!(buckets <= 1 << 16);
    let digit = |e: u128| (((e >> 64) as u64 >> shift) - base) as usize;
    let mut starts = vec![0usize; buckets + 1];
    for &e in &entries {
        starts[digit(e) + 1] += 1;
    }
    for b in 0..buckets {
        starts[b + 1] += starts[b];
    }
    let mut fill = starts.clone();
    let mut scattered = vec![0u128; n];
    for &e in &entries {
        let d = digit(e);
        scattered[fill[d]] = e;
        fill[d] += 1;
    }
    drop(entries);
    // Emit in batches of at least a few thousand entries, to keep the caller's per-call
    // cost low.
    let mut from = 0;
    for b in 0..buckets {
        let bucket = &mut scattered[starts[b]..starts[b + 1]];
        if bucket.len() > 1 {
            if shift == 0 && bucket.len() < 32 {
                insertion_sort(bucket);
            } else {
                bucket.sort_unstable();
            }
        }
        if starts[b + 1] - from >= 4096 || b + 1 == buckets {
            emit(&scattered[from..starts[b + 1]]);
            from = starts[b + 1];
        }
    }
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
        let mut out = Vec::new();
        sort_emitting(entries_of(&records, 100), |b| out.extend_from_slice(b));
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
        // Few distinct keys: large buckets of duplicates.
        let dups: Vec<[u8; 10]> = uniform
            .iter()
            .map(|k| {
                let mut d = [b'a'; 10];
                d[9] = k[0] % 3;
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
