//! Revocation of same-host mappings, seen from inside: the importer's own mapping after a
//! revoke, and stores racing a revoke.

use super::*;
use std::sync::atomic::AtomicBool;

fn pair(tag: &str) -> (Rma, Rma, String) {
    let name = format!("unit-{tag}-{}-{:x}", std::process::id(), rand::random::<u32>());
    let mut owner = Rma::new(RmaConfig::new(NodeId(1))).unwrap();
    owner.listen_shm(&name).unwrap();
    let importer = Rma::new(RmaConfig::new(NodeId(2))).unwrap();
    (owner, importer, name)
}

const T: Duration = Duration::from_secs(5);

#[test]
fn a_revoked_mapping_no_longer_aliases_the_owner() {
    let (mut owner, mut me, name) = pair("alias");
    let mut seg = owner.export("s", 4096, Access::everyone(Rights::ALL), NotifyMode::Never).unwrap();
    let peer = me.connect_shm(&name);
    let r = me.import_with(peer, "s", ImportMode::Map).unwrap();
    me.put_blocking(&r, 0, &7u64.to_ne_bytes(), T).unwrap();
    assert_eq!(seg.load_u64(0), 7, "the mapping is the owner's memory");
    let report = seg.revoke();
    assert_eq!((report.mapped_importers, report.importers_stuck, report.migrated), (1, 0, true));
    assert_eq!(me.put_blocking(&r, 0, &9u64.to_ne_bytes(), T), Err(RmaError::Access(AccessError::Revoked)));
    assert_eq!(seg.load_u64(0), 7, "contents survive migration; the refused put changed nothing");
    // An importer that ignores the library and stores through its old mapping reaches only
    // orphaned pages, and no longer sees the owner's stores.
    let Path::Mapped(i) = r.path else { panic!("mapped") };
    let raw = me.mapped[i as usize].as_ref().unwrap().raw_region();
    raw.store_u64(0, 0xdead, Ordering::Relaxed);
    seg.store_u64(8, 5);
    assert_eq!(seg.load_u64(0), 7);
    assert_eq!(raw.load_u64(8, Ordering::Relaxed), 0);
    // A re-export can be mapped again and holds the data.
    seg.reexport();
    let r2 = me.import_with(peer, "s", ImportMode::Map).unwrap();
    let mut b = [0u8; 16];
    me.get_blocking(&r2, 0, &mut b, T).unwrap();
    assert_eq!(b[..8], 7u64.to_ne_bytes());
    assert_eq!(b[8..], 5u64.to_ne_bytes());
    assert_eq!(me.get_blocking(&r, 0, &mut b, T), Err(RmaError::Access(AccessError::Revoked)));
    assert_eq!(owner.target_counters().migrations, 1);
}

/// Several importers store increasing values into their own words while the owner revokes
/// at an arbitrary moment: every store reported done is in the owner's memory afterwards
/// (none lands in the pages the migration left behind), and every later store is refused.
#[test]
fn stores_racing_a_revocation_are_never_lost() {
    for round in 0..20 {
        let (mut owner, _, name) = pair("race");
        let mut seg = owner.export("s", 4096, Access::everyone(Rights::ALL), NotifyMode::Never).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let writers: Vec<_> = (0..2u32)
            .map(|w| {
                let (name, stop) = (name.clone(), stop.clone());
                std::thread::spawn(move || {
                    let mut me = Rma::new(RmaConfig::new(NodeId(10 + w))).unwrap();
                    let peer = me.connect_shm(&name);
                    let r = me.import_with(peer, "s", ImportMode::Map).unwrap();
                    let mut last_done = 0u64;
                    for v in 1u64.. {
                        match me.put(&r, u64::from(w) * 8, &v.to_ne_bytes(), 0) {
                            Ok(RmaOutcome::Done(())) => last_done = v,
                            Err(RmaError::Access(AccessError::Revoked)) => break,
                            other => panic!("unexpected {other:?}"),
                        }
                        if stop.load(Ordering::Relaxed) && v > last_done + 1_000_000 {
                            break;
                        }
                    }
                    last_done
                })
            })
            .collect();
        while owner.target_counters().mapped_imports < 2 {
            std::thread::yield_now();
        }
        std::thread::sleep(Duration::from_micros(200 + round * 50));
        let report = seg.revoke();
        stop.store(true, Ordering::Relaxed);
        assert!(report.migrated);
        for (w, h) in writers.into_iter().enumerate() {
            let last_done = h.join().unwrap();
            assert_eq!(seg.load_u64(w * 8), last_done, "round {round}: writer {w}'s last acknowledged store");
        }
    }
}
