//! Tracing of one-sided operations: every completed get, put, compare-and-swap and
//! fetch-and-add is one record of its kind, size and nodes, on a mapping and through the
//! target's engine alike, and the records match the initiator's own counters. Tracing is
//! per process, so the transports run in sequence in one test.

mod rma_util;

use rma_util::*;
use ulnet_core::rma::{Access, NodeId, NotifyMode, Rights};
use ulnet_core::trace::{self, Direction, MessageKind, TraceConfig};

fn traced_operations(mode: Mode, dir: &std::path::Path) {
    let mut t = target(1, "trace-rma");
    let seg = patterned(&mut t, "s", 1 << 16, Access::everyone(Rights::ALL), NotifyMode::Never);
    seg.store_u64(8192, 0);
    let (mut me, _, r) = importer(2, &t, "s", mode);
    // Before the session: not recorded.
    me.put_blocking(&r, 0, &[1; 64], T).unwrap();

    let path = dir.join(format!("{}.ultrace", mode.name()));
    trace::start(TraceConfig::new(&path, NodeId(2))).unwrap();
    let before = me.counters();
    me.put_blocking(&r, 128, &[7; 5000], T).unwrap();
    let mut back = [0u8; 3000];
    me.get_blocking(&r, 128, &mut back, T).unwrap();
    assert_eq!(back, [7; 3000]);
    assert_eq!(me.compare_and_swap_blocking(&r, 8192, 0, 5, T), Ok(0));
    assert_eq!(me.fetch_and_add_blocking(&r, 8192, 2, T), Ok(5));
    assert_eq!(me.fetch_and_add_blocking(&r, 8192, 2, T), Ok(7));
    // A refused operation (out of bounds) moved nothing: not recorded.
    assert!(me.get_blocking(&r, 1 << 20, &mut back, T).is_err());
    let after = me.counters();
    trace::stop().unwrap();
    assert_eq!(seg.load_u64(8192), 9);

    let file = trace::decode_file(&std::fs::read(&path).unwrap()).unwrap();
    let rma: Vec<_> = file
        .records
        .iter()
        .filter(|r| {
            matches!(
                r.message_kind(),
                MessageKind::RmaRead | MessageKind::RmaWrite | MessageKind::RmaCas | MessageKind::RmaFaa
            )
        })
        .collect();
    let completed = after.completed - before.completed;
    assert_eq!(completed, 5, "{}", mode.name());
    assert_eq!(rma.len() as u64, completed, "{}: one record per completed operation", mode.name());
    let of = |k: MessageKind| rma.iter().filter(|r| r.message_kind() == k).map(|r| r.size).collect::<Vec<_>>();
    assert_eq!(of(MessageKind::RmaWrite), [5000]);
    assert_eq!(of(MessageKind::RmaRead), [3000]);
    assert_eq!(of(MessageKind::RmaCas), [8]);
    assert_eq!(of(MessageKind::RmaFaa), [8, 8]);
    for r in &rma {
        assert_eq!((r.src_node, r.dst_node, r.direction()), (2, 1, Direction::Send), "{}", mode.name());
        assert_eq!((r.buffers, u64::from(r.buffer_len[0])), (1, r.size));
        if mode.through_engine() {
            // Posted, then answered: the queueing stage is the round trip to the engine.
            assert!(r.exact && r.enqueued > 0 && r.enqueued <= r.sent, "{}: {r:?}", mode.name());
        } else {
            assert_eq!(r.enqueued, 0, "a mapped operation is not timed on its own");
        }
    }
}

#[test]
fn one_sided_operations_are_traced_on_every_transport() {
    let dir = std::env::temp_dir().join(unique("trace-rma"));
    std::fs::create_dir_all(&dir).unwrap();
    for mode in [Mode::ShmMapped, Mode::ShmChannel, Mode::Tcp] {
        traced_operations(mode, &dir);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
