//! The registry's library API on one node (its own majority): sets, deletes, linearizable
//! gets, watches by prefix, snapshots and recovery from the records it persisted.

use std::time::Instant;
use ulnet_registry::gup::{Gup, GupConfig, NodeId, Record, Recovered, View};
use ulnet_registry::{GetId, Registry, RegistryEvent, SetError};

/// Runs the registry with every record fsynced at once; returns the events other than
/// persistence, and keeps the records.
fn drive(reg: &mut Registry, disk: &mut Vec<Record>) -> Vec<RegistryEvent> {
    let mut out = Vec::new();
    let now = Instant::now();
    for _ in 0..50 {
        while let Some(ev) = reg.poll_event() {
            match ev {
                RegistryEvent::Persist { lsn, record } => {
                    disk.push(record);
                    reg.handle_durable(now, lsn);
                }
                other => out.push(other),
            }
        }
        reg.handle_timeout(now);
    }
    out
}

fn one_node() -> (Registry, Vec<Record>) {
    let now = Instant::now();
    let gup = Gup::bootstrap(NodeId(0), vec![NodeId(0)], Registry::config(GupConfig::local()), now);
    let mut reg = Registry::new(gup, 10);
    reg.handle_view(now, View::new(1, vec![NodeId(0)]));
    let mut disk = Vec::new();
    drive(&mut reg, &mut disk);
    (reg, disk)
}

#[test]
fn set_get_delete_and_watch() {
    let (mut reg, mut disk) = one_node();
    let now = Instant::now();
    let w = reg.watch(b"svc/".to_vec());
    reg.set(now, b"svc/a".to_vec(), b"1".to_vec()).unwrap();
    reg.set(now, b"other".to_vec(), b"x".to_vec()).unwrap();
    reg.delete(now, b"svc/a".to_vec()).unwrap();
    reg.set(now, b"svc/b".to_vec(), b"2".to_vec()).unwrap();
    let events = drive(&mut reg, &mut disk);
    let changes: Vec<(Vec<u8>, Option<Vec<u8>>)> = events
        .iter()
        .filter_map(|e| match e {
            RegistryEvent::Changed { watch, key, value, .. } if *watch == w => Some((key.clone(), value.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(
        changes,
        vec![
            (b"svc/a".to_vec(), Some(b"1".to_vec())),
            (b"svc/a".to_vec(), None),
            (b"svc/b".to_vec(), Some(b"2".to_vec()))
        ]
    );
    assert_eq!(events.iter().filter(|e| matches!(e, RegistryEvent::SetDone { .. })).count(), 4);
    let g = reg.get(now, b"svc/b".to_vec());
    let missing = reg.get(now, b"svc/a".to_vec());
    let events = drive(&mut reg, &mut disk);
    let answer = |id: GetId| {
        events.iter().find_map(|e| match e {
            RegistryEvent::GetDone { id: got, value, .. } if *got == id => Some(value.clone()),
            _ => None,
        })
    };
    assert_eq!(answer(g), Some(Some(b"2".to_vec())));
    assert_eq!(answer(missing), Some(None));
}

#[test]
fn limits_are_enforced() {
    let (mut reg, _) = one_node();
    let now = Instant::now();
    assert!(matches!(reg.set(now, vec![0; 5000], vec![]), Err(SetError::KeyTooLarge(5000))));
    assert!(matches!(reg.set(now, b"k".to_vec(), vec![0; 2 << 20]), Err(SetError::ValueTooLarge(_))));
}

#[test]
fn state_survives_a_restart_from_its_records_across_snapshots() {
    let (mut reg, mut disk) = one_node();
    let now = Instant::now();
    for i in 0..95 {
        reg.set(now, format!("k{i}").into_bytes(), format!("v{i}").into_bytes()).unwrap();
        drive(&mut reg, &mut disk);
    }
    let before = reg.store().clone();
    assert!(reg.gup().snapshot_seq() >= 90, "snapshots every 10 positions");
    // Restart from what was persisted (the host would drop records before the last snapshot).
    let gup = Gup::recover(
        NodeId(0),
        Registry::config(GupConfig::local()),
        Recovered { records: disk.clone(), lost_tail: false },
        now,
    );
    let mut back = Registry::recover(gup, &disk, 10);
    back.handle_view(now, View::new(2, vec![NodeId(0)]));
    drive(&mut back, &mut disk);
    assert_eq!(back.store(), &before);
    assert_eq!(back.get_local(b"k94"), Some(&b"v94"[..]));
}
