//! Properties of generation and validation.

use proptest::prelude::*;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use ulnet_sortbench::{combine, generate_records, Checksum, RecordFormat, Summary, RECORD_SIZE};

fn format_strategy() -> impl Strategy<Value = RecordFormat> {
    (any::<bool>(), any::<bool>()).prop_map(|(ascii, skewed)| RecordFormat { ascii, skewed })
}

fn records(first: u128, count: usize, format: RecordFormat) -> Vec<u8> {
    let mut buf = vec![0u8; count * RECORD_SIZE];
    generate_records(first, format, &mut buf);
    buf
}

fn sorted(data: &[u8]) -> Vec<u8> {
    let mut recs: Vec<&[u8]> = data.chunks_exact(RECORD_SIZE).collect();
    recs.sort_by(|a, b| a[..10].cmp(&b[..10]));
    recs.concat()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn sorting_generated_records_validates(
        first in any::<u128>(),
        count in 1usize..600,
        format in format_strategy(),
    ) {
        let data = records(first, count, format);
        let sorted = sorted(&data);
        let summary = Summary::of_records(&sorted).unwrap();
        prop_assert!(summary.is_sorted());
        prop_assert_eq!(summary.first_unordered(), None);
        prop_assert_eq!(summary.records, count as u128);
        prop_assert_eq!(summary.exit_code(), 0);
        prop_assert!(summary.report().ends_with("SUCCESS - all records are in order\n"));
        prop_assert_eq!(summary.checksum, Checksum::of_records(&data));
    }

    #[test]
    fn checksum_is_invariant_under_permutation(
        first in any::<u128>(),
        count in 1usize..400,
        format in format_strategy(),
        seed in any::<u64>(),
    ) {
        let data = records(first, count, format);
        let mut recs: Vec<&[u8]> = data.chunks_exact(RECORD_SIZE).collect();
        recs.shuffle(&mut rand::rngs::StdRng::seed_from_u64(seed));
        let shuffled = recs.concat();
        prop_assert_eq!(Checksum::of_records(&shuffled), Checksum::of_records(&data));
        let a = Summary::of_records(&shuffled).unwrap();
        let b = Summary::of_records(&data).unwrap();
        prop_assert_eq!(a.checksum, b.checksum);
        prop_assert_eq!(a.records, b.records);
    }

    #[test]
    fn combined_partition_summaries_equal_summary_of_concatenation(
        first in any::<u128>(),
        count in 1usize..500,
        format in format_strategy(),
        cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..6),
        sort_first in any::<bool>(),
    ) {
        let mut data = records(first, count, format);
        if sort_first {
            data = sorted(&data);
        }
        // Cut points between records; every partition holds at least one.
        let mut points: Vec<usize> = cuts.iter().map(|i| i.index(count)).filter(|&p| p > 0).collect();
        points.push(0);
        points.push(count);
        points.sort_unstable();
        points.dedup();
        let parts: Vec<Summary> = points
            .windows(2)
            .map(|w| Summary::of_records(&data[w[0] * RECORD_SIZE..w[1] * RECORD_SIZE]).unwrap())
            .collect();
        let whole = Summary::of_records(&data).unwrap();
        prop_assert_eq!(combine(&parts).unwrap(), whole.clone());
        // Through the 280-byte records too.
        let bytes: Vec<u8> = parts.iter().flat_map(|p| p.to_bytes()).collect();
        let reparsed = ulnet_sortbench::parse_summaries(&bytes).unwrap();
        prop_assert_eq!(combine(&reparsed).unwrap(), whole);
    }

    #[test]
    fn ranges_generate_independently(
        first in any::<u128>(),
        count in 1usize..300,
        split in any::<prop::sample::Index>(),
        format in format_strategy(),
    ) {
        let whole = records(first, count, format);
        let k = split.index(count);
        let head = records(first, k, format);
        let tail = records(first.wrapping_add(k as u128), count - k, format);
        prop_assert_eq!([head, tail].concat(), whole);
    }
}

#[test]
fn combine_of_nothing_is_none() {
    assert_eq!(combine(&[]), None);
}
