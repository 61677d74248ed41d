//! The heavy-tail tests on file sizes: snapshots of synthetic Pareto sizes give back α
//! within 0.1 and are called heavy-tailed; exponential sizes are not.

use rand::SeedableRng;
use rand_distr::{Distribution, Exp, Pareto};
use std::path::Path;
use ulnet_fsstudy::format::{Entry, FileKind, NodeKind, Record};
use ulnet_fsstudy::writer::TraceWriter;

/// A snapshot file holding one regular file of each size.
fn snapshot_of(sizes: &[u64], path: &Path) {
    let mut w = TraceWriter::create(path, FileKind::Snapshot, 0).expect("creates");
    for (i, &size) in sizes.iter().enumerate() {
        let e = Entry { kind: NodeKind::File as u8, depth: 2, size, path: format!("d/f{i}.bin"), ..Entry::default() };
        w.push(&Record::Entry(e), 0).expect("push");
    }
    w.finish(0).expect("finish");
}

fn study_of(sizes: &[u64]) -> ulnet_fsstudy::analysis::Study {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("s.fssnap");
    snapshot_of(sizes, &path);
    ulnet_fsstudy::analysis::study(&ulnet_fsstudy::analysis::load(&[&path]).expect("loads"))
}

#[test]
fn pareto_file_sizes_give_back_their_alpha() {
    for (seed, alpha) in [(1u64, 1.1), (2, 1.3), (3, 1.5), (4, 1.7)] {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let pareto = Pareto::new(1000.0, alpha).expect("a Pareto distribution");
        let sizes: Vec<u64> = (0..20_000).map(|_| pareto.sample(&mut rng) as u64).collect();
        let study = study_of(&sizes);
        let found = study.size_hill_alpha.expect("an estimate");
        assert!((found - alpha).abs() <= 0.1, "alpha {alpha}: Hill gives {found}");
        let test = &study.tails.tests[0];
        assert!(test.name.contains("snapshot") && test.heavy_tailed, "alpha {alpha}: {test:?}");
    }
}

#[test]
fn exponential_file_sizes_are_not_heavy_tailed() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(9);
    let exp = Exp::new(1.0 / 50_000.0).expect("an exponential distribution");
    let sizes: Vec<u64> = (0..20_000).map(|_| exp.sample(&mut rng) as u64 + 1).collect();
    let study = study_of(&sizes);
    assert!(!study.tails.tests[0].heavy_tailed, "{:?}", study.tails.tests[0]);
}
