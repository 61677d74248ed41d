//! The whole chain against a workload with known answers: the generator's planned mix,
//! traced through the mount and studied, gives back every count exactly and every planned
//! time within 2 %. Needs /dev/fuse and root; says so and passes without them.

use std::time::Duration;
use ulnet_fsstudy::analysis::lifetimes::Death;
use ulnet_fsstudy::analysis::opens::{self, Mode};
use ulnet_fsstudy::generator::{self, Plan};
use ulnet_fsstudy::passthrough::{fuse_available, mount, MountOptions};

fn within_2_percent(found: Duration, expected: Duration, what: &str) {
    let (f, e) = (found.as_secs_f64(), expected.as_secs_f64());
    assert!((f - e).abs() <= 0.02 * e, "{what}: found {f:.4} s, expected {e:.4} s");
}

fn sorted(mut v: Vec<Duration>) -> Vec<Duration> {
    v.sort();
    v
}

#[test]
fn the_study_recovers_the_planned_mix() {
    if let Err(why) = fuse_available() {
        eprintln!("skipped: {why}");
        return;
    }
    let (backing, mnt, out) =
        (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let trace = out.path().join("gen.fstrace");
    let mounted = mount(backing.path(), mnt.path(), &trace, &MountOptions::default()).expect("mounts");
    let plan = Plan {
        whole_files: vec![1, 4096, 100_000, 1_500_000],
        partial_reads: vec![300_000, 50_000],
        random_reads: vec![400_000, 200_000, 1000],
        // Planned times of a second or more: a sleep that overshoots by a few milliseconds
        // on a loaded machine stays well inside 2 % of them.
        deleted_after: vec![Duration::from_millis(1000), Duration::from_millis(1700), Duration::from_millis(1250)],
        overwritten_after: vec![Duration::from_millis(1350), Duration::from_millis(1100)],
        held_open: vec![Duration::from_millis(1400), Duration::from_millis(1050)],
        missing_opens: 3,
    };
    let done = generator::run(mnt.path(), &plan).expect("the workload runs");
    let summary = mounted.finish().expect("finishes");
    assert_eq!(summary.written.dropped, 0);

    let inputs = ulnet_fsstudy::analysis::load(&[&trace]).expect("loads");
    assert!(inputs.damage().is_empty(), "{:?}", inputs.damage());
    let study = ulnet_fsstudy::analysis::study(&inputs);
    let counts = |s: &ulnet_fsstudy::analysis::Study| {
        (s.opens, s.bytes_read, s.bytes_written, s.files_created, s.files_deleted, s.whole_file, s.sequential, s.random)
    };
    let expected = (
        done.opens,
        done.bytes_read,
        done.bytes_written,
        done.files_created,
        done.files_deleted,
        done.whole_file,
        done.sequential,
        done.random,
    );
    assert_eq!(
        counts(&study),
        expected,
        "opens, bytes read, written, created, deleted, whole-file, sequential, random"
    );
    assert_eq!(
        (done.whole_file, done.sequential, done.random),
        (4 * 2 + 5 + 3 + 2 * 2 + 2, 2, 3),
        "the plan's patterns"
    );
    assert_eq!(study.lifetimes.created, done.files_created);
    assert_eq!(study.lifetimes.deleted, plan.deleted_after.len() as u64);
    assert_eq!(study.lifetimes.overwritten, plan.overwritten_after.len() as u64);
    assert!(study.operations.errors.iter().any(|e| e.op == "lookup" && e.errno == "ENOENT" && e.count >= 3));

    let lives = |d: Death| {
        sorted(
            study
                .lifetimes
                .lives
                .iter()
                .filter(|l| l.death == d)
                .map(|l| Duration::from_nanos(l.lifetime_ns))
                .collect(),
        )
    };
    for (found, (timed, planned)) in lives(Death::Deleted)
        .into_iter()
        .zip(sorted(done.deleted_lifetimes.clone()).into_iter().zip(sorted(plan.deleted_after.clone())))
    {
        within_2_percent(found, timed, "a deleted file's lifetime, as the workload timed it");
        within_2_percent(found, planned, "a deleted file's lifetime, as planned");
    }
    for (found, (timed, planned)) in lives(Death::Overwritten)
        .into_iter()
        .zip(sorted(done.overwritten_lifetimes.clone()).into_iter().zip(sorted(plan.overwritten_after.clone())))
    {
        within_2_percent(found, timed, "an overwritten file's lifetime, as timed");
        within_2_percent(found, planned, "an overwritten file's lifetime, as planned");
    }
    let sessions = opens::collect(&inputs.traces);
    let held = sorted(
        sessions
            .iter()
            .filter(|s| !s.dir && s.mode() == Mode::NoData)
            .filter_map(|s| s.duration_ns())
            .map(Duration::from_nanos)
            .collect(),
    );
    assert_eq!(held.len(), plan.held_open.len(), "the held opens are the opens without data");
    for (found, (timed, planned)) in
        held.into_iter().zip(sorted(done.held_durations.clone()).into_iter().zip(sorted(plan.held_open.clone())))
    {
        within_2_percent(found, timed, "a held open's duration, as timed");
        within_2_percent(found, planned, "a held open's duration, as planned");
    }
}
