//! Decoders of everything that comes from outside — GUP messages, log records, registry
//! operations and snapshots — round-trip what the encoders make, and reject random or
//! mutated bytes without panicking (the random-bytes fuzz test of the project standard).

use proptest::prelude::*;
use std::sync::Arc;
use ulnet_registry::gup::{BatchId, Entry, Epoch, Msg, NodeId, Part, Record, Snapshot, VotingConfig};
use ulnet_registry::store::{Op, Store};
use ulnet_registry::wal::record::{decode_record, encode_record, frame_record, read_frame};

fn bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(any::<u8>(), 0..max)
}

fn epoch() -> impl Strategy<Value = Epoch> {
    (any::<u64>(), any::<u32>(), any::<u64>()).prop_map(|(view, round, l)| Epoch { view, round, locker: NodeId(l) })
}

fn batch() -> impl Strategy<Value = BatchId> {
    (any::<u32>(), any::<u64>()).prop_map(|(incarnation, counter)| BatchId { incarnation, counter })
}

fn updates() -> impl Strategy<Value = Vec<Arc<[u8]>>> {
    proptest::collection::vec(bytes(40).prop_map(Arc::from), 0..5)
}

fn voters() -> impl Strategy<Value = Vec<NodeId>> {
    proptest::collection::vec(any::<u64>().prop_map(NodeId), 1..6)
}

fn voting_config() -> impl Strategy<Value = VotingConfig> {
    (voters(), proptest::option::of(voters())).prop_map(|(v, p)| match p {
        Some(p) => VotingConfig::joint(&p, v),
        None => VotingConfig::new(v),
    })
}

fn entry() -> impl Strategy<Value = Entry> {
    prop_oneof![
        Just(Entry::Skip),
        voting_config().prop_map(Entry::Config),
        proptest::collection::vec((any::<u64>(), batch(), updates()), 1..4).prop_map(|parts| Entry::Updates {
            parts: parts
                .into_iter()
                .map(|(o, batch, u)| Part { origin: NodeId(o), batch, updates: u.into() })
                .collect()
        }),
    ]
}

fn entries() -> impl Strategy<Value = Vec<(u64, Entry)>> {
    proptest::collection::btree_map(any::<u64>(), entry(), 0..5).prop_map(|m| m.into_iter().collect())
}

fn snapshot() -> impl Strategy<Value = Snapshot> {
    (any::<u64>(), voting_config(), bytes(64)).prop_map(|(seq, config, d)| Snapshot { seq, config, data: d.into() })
}

fn snapshot_part() -> impl Strategy<Value = Option<Snapshot>> {
    proptest::option::of(snapshot())
}

fn msg() -> impl Strategy<Value = Msg> {
    prop_oneof![
        (epoch(), batch(), updates()).prop_map(|(epoch, batch, updates)| Msg::LockRequest { epoch, batch, updates }),
        (epoch(), batch(), any::<u64>()).prop_map(|(epoch, batch, seq)| Msg::Grant { epoch, batch, seq }),
        (epoch(), any::<u64>(), any::<u64>(), entry()).prop_map(|(epoch, seq, commit, entry)| Msg::Batch {
            epoch,
            seq,
            commit,
            entry
        }),
        (epoch(), any::<u64>(), any::<u64>()).prop_map(|(epoch, upto, round)| Msg::Ack { epoch, upto, round }),
        (epoch(), any::<u64>()).prop_map(|(epoch, upto)| Msg::Unlock { epoch, upto }),
        (epoch(), any::<u64>(), any::<u64>(), any::<u64>())
            .prop_map(|(epoch, commit, granted, round)| Msg::Heartbeat { epoch, commit, granted, round }),
        (epoch(), any::<u64>()).prop_map(|(epoch, from)| Msg::SyncRequest { epoch, from }),
        (epoch(), proptest::option::of(epoch()), any::<u64>(), any::<u64>(), snapshot_part(), entries()).prop_map(
            |(epoch, last_normal, applied, commit, snapshot, entries)| {
                Msg::SyncState { epoch, last_normal, applied, commit, snapshot, entries }
            }
        ),
        (epoch(), any::<bool>(), any::<u64>(), any::<u64>(), any::<u64>(), snapshot_part(), entries()).prop_map(
            |(epoch, establish, from, end, commit, snapshot, entries)| Msg::Catchup {
                epoch,
                establish,
                from,
                end,
                commit,
                snapshot,
                entries
            }
        ),
        (epoch(), any::<u64>(), any::<u64>()).prop_map(|(epoch, from, to)| Msg::RepairRequest { epoch, from, to }),
        (epoch(), any::<u64>()).prop_map(|(epoch, id)| Msg::ReadIndexRequest { epoch, id }),
        (epoch(), any::<u64>(), any::<u64>()).prop_map(|(epoch, id, index)| Msg::ReadIndexReply { epoch, id, index }),
        (epoch(), batch(), any::<u64>()).prop_map(|(epoch, batch, seq)| Msg::GrantCombined { epoch, batch, seq }),
        (epoch(), any::<u64>()).prop_map(|(epoch, upto)| Msg::Committed { epoch, upto }),
    ]
}

fn record() -> impl Strategy<Value = Record> {
    prop_oneof![
        (any::<u32>(), any::<u64>()).prop_map(|(incarnation, n)| Record::Boot { incarnation, node: NodeId(n) }),
        (any::<u64>(), entry()).prop_map(|(seq, entry)| Record::Entry { seq, entry }),
        any::<u64>().prop_map(|seq| Record::TruncateAfter { seq }),
        epoch().prop_map(|epoch| Record::Promise { epoch }),
        epoch().prop_map(|epoch| Record::Normal { epoch }),
        any::<u64>().prop_map(|seq| Record::Commit { seq }),
        (snapshot(), any::<u64>(), any::<u32>(), epoch(), proptest::option::of(epoch()), entries()).prop_map(
            |(snapshot, node, incarnation, promised, last_normal, tail)| {
                let tail = tail.into_iter().filter(|(s, _)| *s > snapshot.seq).collect();
                Record::Snapshot { snapshot, node: NodeId(node), incarnation, promised, last_normal, tail }
            }
        ),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (bytes(32), bytes(64)).prop_map(|(key, value)| Op::Set { key, value }),
        bytes(32).prop_map(|key| Op::Delete { key }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn messages_round_trip(m in msg()) {
        let bytes = m.encode();
        prop_assert_eq!(Msg::decode(&bytes), Ok(m));
    }

    #[test]
    fn truncated_messages_are_rejected(m in msg(), cut in any::<prop::sample::Index>()) {
        let bytes = m.encode();
        let at = cut.index(bytes.len());
        prop_assert!(Msg::decode(&bytes[..at]).is_err());
    }

    #[test]
    fn random_bytes_never_panic_any_decoder(b in bytes(300)) {
        let _ = Msg::decode(&b);
        let _ = decode_record(&b);
        let _ = read_frame(&b);
        let _ = Op::decode(&b);
        let _ = Store::from_snapshot(&b);
    }

    #[test]
    fn mutated_messages_never_panic(m in msg(), flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4)) {
        let mut bytes = m.encode();
        for (i, v) in flips {
            let at = i.index(bytes.len());
            bytes[at] ^= v | 1;
        }
        let _ = Msg::decode(&bytes);
    }

    #[test]
    fn records_round_trip_and_frames_catch_every_flip(r in record(), flip in any::<prop::sample::Index>(), bit in 0u8..8) {
        prop_assert_eq!(decode_record(&encode_record(&r)), Ok(r.clone()));
        let mut framed = Vec::new();
        frame_record(&r, &mut framed);
        let (back, used) = read_frame(&framed).unwrap();
        prop_assert_eq!(back, r);
        prop_assert_eq!(used, framed.len());
        let at = flip.index(framed.len());
        framed[at] ^= 1 << bit;
        // A single flipped bit anywhere (length, checksum or payload) is caught.
        prop_assert!(read_frame(&framed).is_err());
    }

    #[test]
    fn torn_frames_are_rejected(r in record(), cut in any::<prop::sample::Index>()) {
        let mut framed = Vec::new();
        frame_record(&r, &mut framed);
        let at = cut.index(framed.len());
        prop_assert!(read_frame(&framed[..at]).is_err());
    }

    #[test]
    fn registry_ops_and_snapshots_round_trip(o in op(), ops in proptest::collection::vec(op(), 0..20)) {
        prop_assert_eq!(Op::decode(&o.encode()), Ok(o));
        let mut store = Store::default();
        for (i, op) in ops.into_iter().enumerate() {
            store.apply(i as u64 + 1, [op], |_, _| {});
        }
        prop_assert_eq!(Store::from_snapshot(&store.snapshot()), Ok(store));
    }
}

#[test]
fn oversize_counts_are_refused_before_allocating() {
    // A LockRequest claiming 4 billion updates in a 20-byte message.
    let mut b = vec![1u8, 1];
    b.extend_from_slice(&[0; 12]);
    b.extend_from_slice(&[0; 12]);
    b.extend_from_slice(&u32::MAX.to_le_bytes());
    assert!(Msg::decode(&b).is_err());
    // A frame announcing a payload beyond the limit.
    let mut f = u32::MAX.to_le_bytes().to_vec();
    f.extend_from_slice(&[0; 4]);
    assert!(read_frame(&f).is_err());
}
