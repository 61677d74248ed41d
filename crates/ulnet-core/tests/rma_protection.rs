//! Protection: every request is checked before memory is touched. Each refusal comes back
//! as its typed error, is counted, and leaves the target's memory unchanged byte for byte —
//! over every transport, mapped or through the engine. Forged bytes are refused and
//! counted too, and the target keeps serving.

mod rma_util;

use rand::{Rng, SeedableRng};
use rma_util::*;
use std::io::{Read, Write};
use std::os::linux::net::SocketAddrExt;
use std::time::{Duration, Instant};
use ulnet_core::rma::wire::{self, Op, Place, Request, Response};
use ulnet_core::rma::{
    Access, AccessError, ExportedSegment, Generation, ImportError, NodeId, NotifyMode, RemoteSegment, Rights, Rma,
    RmaConfig, RmaError, SegmentId,
};
use ulnet_core::transport::udp::wire as udp_wire;
use ulnet_core::{ChannelId, Endpoint, Event, SendOutcome};

const LEN: usize = 4096;

/// One operation of each family at a given place.
#[derive(Clone, Copy, Debug)]
enum Case {
    Get(u64, usize),
    Put(u64, usize),
    Cas(u64),
    Faa(u64),
}

fn run(me: &mut Rma, seg: &RemoteSegment, case: Case) -> Result<(), RmaError> {
    match case {
        Case::Get(off, len) => me.get_blocking(seg, off, &mut vec![0u8; len], T),
        Case::Put(off, len) => me.put_blocking(seg, off, &vec![0xeeu8; len], T),
        Case::Cas(off) => me.compare_and_swap_blocking(seg, off, 0, 1, T).map(|_| ()),
        Case::Faa(off) => me.fetch_and_add_blocking(seg, off, 1, T).map(|_| ()),
    }
}

fn every_family(off: u64) -> [Case; 4] {
    [Case::Get(off, 8), Case::Put(off, 8), Case::Cas(off), Case::Faa(off)]
}

/// Runs `cases`, each expecting `want`; checks the refusals were counted where they were
/// checked (the target's engine, or the mapped importer) and that memory did not change.
fn expect_refused(
    t: &Target,
    owner_seg: &ExportedSegment,
    me: &mut Rma,
    seg: &RemoteSegment,
    mode: Mode,
    cases: &[Case],
    want: AccessError,
) {
    let before = snapshot(owner_seg);
    let target_before = t.rma.target_counters().refused_for(want);
    let me_before = me.counters().refused;
    for &case in cases {
        assert_eq!(run(me, seg, case), Err(RmaError::Access(want)), "{mode:?} {case:?}");
    }
    assert_eq!(snapshot(owner_seg), before, "{mode:?}: refused accesses changed nothing");
    let n = cases.len() as u64;
    assert_eq!(me.counters().refused - me_before, n, "{mode:?}: counted at the initiator");
    if mode.through_engine() {
        assert_eq!(t.rma.target_counters().refused_for(want) - target_before, n, "{mode:?}: counted at the target");
    }
}

fn setup(what: &str, access: Access) -> (Target, ExportedSegment) {
    let mut t = target(1, what);
    let seg = patterned(&mut t, "s", LEN, access, NotifyMode::Always);
    (t, seg)
}

fn rejects_wrong_segment_id(mode: Mode) {
    let (t, seg) = setup("wrong-seg", Access::everyone(Rights::ALL));
    let mut me = Rma::new(RmaConfig::new(NodeId(2))).unwrap();
    let (peer, import_mode) = connect(&mut me, &t.shm, &t.tcp, &t.udp, mode);
    let before = snapshot(&seg);
    for wrong in [SegmentId(seg.id().0 + 1), SegmentId(4095), SegmentId(u32::MAX)] {
        let forged = ulnet_core::rma::SegmentDescriptor { segment: wrong, ..seg.descriptor() };
        match mode {
            Mode::ShmMapped => {
                let e = me.import_descriptor(peer, forged, import_mode).unwrap_err();
                assert!(matches!(e, ImportError::Access(AccessError::UnknownSegment)), "{e:?}");
            }
            _ => {
                let r = me.import_descriptor(peer, forged, import_mode).unwrap();
                expect_refused(&t, &seg, &mut me, &r, mode, &every_family(0), AccessError::UnknownSegment);
            }
        }
    }
    assert_eq!(snapshot(&seg), before);
    if mode == Mode::ShmMapped {
        assert_eq!(t.rma.target_counters().mapped_refused, 3);
    }
}

fn rejects_stale_generation(mode: Mode) {
    let (t, mut seg) = setup("stale", Access::everyone(Rights::ALL));
    let (mut me, peer, old) = importer(2, &t, "s", mode);
    // A generation that was never this segment's.
    let forged =
        ulnet_core::rma::SegmentDescriptor { generation: Generation(seg.generation().0 + 100), ..seg.descriptor() };
    match mode {
        Mode::ShmMapped => {
            let e = me.import_descriptor(peer, forged, ulnet_core::rma::ImportMode::Map).unwrap_err();
            assert!(matches!(e, ImportError::Access(AccessError::StaleGeneration)), "{e:?}");
        }
        _ => {
            let r = me.import_descriptor(peer, forged, ulnet_core::rma::ImportMode::Channel).unwrap();
            expect_refused(&t, &seg, &mut me, &r, mode, &every_family(0), AccessError::StaleGeneration);
        }
    }
    // Revoked and re-exported: the old handle's generation is stale. (A mapping was cut off
    // at the revocation, so it reports that.)
    seg.revoke();
    seg.reexport();
    let want = if mode == Mode::ShmMapped { AccessError::Revoked } else { AccessError::StaleGeneration };
    expect_refused(&t, &seg, &mut me, &old, mode, &every_family(8), want);
    // The current export works.
    let fresh = me.import_with(peer, "s", connect_mode(mode)).unwrap();
    assert_eq!(me.fetch_and_add_blocking(&fresh, 8, 1, T).map(|_| ()), Ok(()));
}

fn connect_mode(mode: Mode) -> ulnet_core::rma::ImportMode {
    match mode {
        Mode::ShmMapped => ulnet_core::rma::ImportMode::Map,
        _ => ulnet_core::rma::ImportMode::Channel,
    }
}

fn rejects_revoked_segment(mode: Mode) {
    let (t, mut seg) = setup("revoked", Access::everyone(Rights::ALL));
    let (mut me, peer, r) = importer(2, &t, "s", mode);
    assert_eq!(run(&mut me, &r, Case::Put(0, 8)), Ok(()));
    let report = seg.revoke();
    assert_eq!(report.mapped_importers, usize::from(mode == Mode::ShmMapped));
    let mut cases = every_family(16).to_vec();
    cases.push(Case::Get(0, LEN));
    cases.push(Case::Put(100, 1000));
    expect_refused(&t, &seg, &mut me, &r, mode, &cases, AccessError::Revoked);
    // Importing it again is refused too while it stays revoked.
    let e = me.import_with(peer, "s", connect_mode(mode)).unwrap_err();
    assert!(
        matches!(e, ImportError::Access(AccessError::UnknownName) | ImportError::Access(AccessError::Revoked)),
        "{e:?}"
    );
}

fn rejects_missing_rights(mode: Mode) {
    let access = Access::none()
        .grant(NodeId(2), Rights::READ)
        .grant(NodeId(3), Rights::WRITE)
        .grant(NodeId(4), Rights::ATOMIC)
        .grant(NodeId(5), Rights::READ | Rights::WRITE);
    let (t, seg) = setup("rights", access);
    let table: [(u32, &[Case], &[Case]); 4] = [
        (2, &[Case::Get(0, 8)], &[Case::Put(0, 8), Case::Cas(0), Case::Faa(0)]),
        (3, &[Case::Put(0, 8)], &[Case::Get(0, 8), Case::Cas(0), Case::Faa(0)]),
        (4, &[Case::Cas(0), Case::Faa(0)], &[Case::Get(0, 8), Case::Put(0, 8)]),
        (5, &[Case::Get(0, 8), Case::Put(0, 8)], &[Case::Cas(0), Case::Faa(0)]),
    ];
    for (node, allowed, denied) in table {
        let (mut me, _, r) = importer(node, &t, "s", mode);
        expect_refused(&t, &seg, &mut me, &r, mode, denied, AccessError::Denied);
        for &case in allowed {
            assert_eq!(run(&mut me, &r, case), Ok(()), "node {node} {case:?}");
        }
    }
    // A node with no rights at all cannot even map it; through a channel every request is
    // refused.
    let mut me = Rma::new(RmaConfig::new(NodeId(9))).unwrap();
    let (peer, import_mode) = connect(&mut me, &t.shm, &t.tcp, &t.udp, mode);
    match mode {
        Mode::ShmMapped => {
            let e = me.import_with(peer, "s", import_mode).unwrap_err();
            assert!(matches!(e, ImportError::Access(AccessError::Denied)), "{e:?}");
        }
        _ => {
            let r = me.import_with(peer, "s", import_mode).unwrap();
            assert_eq!(r.rights(), Some(Rights::NONE));
            expect_refused(&t, &seg, &mut me, &r, mode, &every_family(0), AccessError::Denied);
        }
    }
}

fn rejects_out_of_bounds_and_overflow(mode: Mode) {
    let (t, seg) = setup("bounds", Access::everyone(Rights::ALL));
    let (mut me, _, r) = importer(2, &t, "s", mode);
    let len = LEN as u64;
    let cases = [
        Case::Get(len - 4, 8),
        Case::Put(len - 4, 8),
        Case::Get(len, 1),
        Case::Put(len, 1),
        Case::Get(0, LEN + 1),
        Case::Put(1, LEN),
        Case::Cas(len),
        Case::Faa(len + 8),
        // offset + length overflows 64 bits
        Case::Get(u64::MAX - 3, 8),
        Case::Put(u64::MAX - 3, 8),
        Case::Get(u64::MAX, 1),
        Case::Cas(u64::MAX - 7),
        Case::Faa(u64::MAX - 7),
    ];
    expect_refused(&t, &seg, &mut me, &r, mode, &cases, AccessError::OutOfBounds);
    // The last word and the whole segment are in bounds.
    assert_eq!(run(&mut me, &r, Case::Faa(len - 8)), Ok(()));
    assert_eq!(run(&mut me, &r, Case::Get(0, LEN)), Ok(()));
}

fn rejects_misaligned_atomics(mode: Mode) {
    let (t, seg) = setup("align", Access::everyone(Rights::ALL));
    let (mut me, _, r) = importer(2, &t, "s", mode);
    let cases: Vec<Case> = (1..8).flat_map(|o| [Case::Cas(o), Case::Faa(o + 64)]).collect();
    expect_refused(&t, &seg, &mut me, &r, mode, &cases, AccessError::Misaligned);
    // Misaligned gets and puts are fine: only atomics need whole words.
    assert_eq!(run(&mut me, &r, Case::Put(3, 8)), Ok(()));
    assert_eq!(run(&mut me, &r, Case::Get(5, 8)), Ok(()));
}

/// Sends raw bytes on a channel and collects the responses by token (also those that
/// arrive while a send waits for room: a UDP channel's window fills long before 2,000
/// requests are out).
struct Raw {
    ep: Endpoint,
    ch: ChannelId,
    got: Vec<(u64, Option<AccessError>)>,
}

impl Raw {
    fn new((ep, ch): (Endpoint, ChannelId)) -> Self {
        Raw { ep, ch, got: Vec::new() }
    }

    fn send(&mut self, msg: &[&[u8]]) {
        let deadline = Instant::now() + T;
        while self.ep.send(self.ch, msg).unwrap() != SendOutcome::Done {
            self.collect();
            assert!(Instant::now() < deadline);
        }
        self.ep.flush_sends();
    }

    fn collect(&mut self) {
        let got = &mut self.got;
        self.ep.poll(64, |e| match e {
            Event::Message { data, .. } => match wire::decode_response(data).expect("the target answers in protocol") {
                Response::Refused { token, error } => got.push((token, Some(error))),
                Response::PutDone { token } | Response::AtomicResult { token, .. } => got.push((token, None)),
                Response::GetData { token, .. } | Response::LookupResult { token, .. } => got.push((token, None)),
                Response::HelloAck { .. } => got.push((0, None)),
            },
            Event::ChannelDown { error, .. } => panic!("target dropped the channel: {error}"),
            Event::SendComplete { .. } => {}
        });
    }

    /// Waits for `n` responses (counting those collected during sends).
    fn responses(&mut self, n: usize) -> Vec<(u64, Option<AccessError>)> {
        let deadline = Instant::now() + T;
        while self.got.len() < n {
            self.collect();
            assert!(Instant::now() < deadline, "only {} of {n} responses", self.got.len());
        }
        assert_eq!(self.got.len(), n, "no more responses than requests with a readable token");
        std::mem::take(&mut self.got)
    }
}

fn encode(r: &Request<'_>) -> Vec<u8> {
    let mut head = [0u8; wire::HEADER_LEN + 16];
    let mut v = r.encode_head(&mut head).to_vec();
    v.extend_from_slice(r.body_tail());
    v
}

fn forged_raw_requests_are_rejected_and_counted(mode: Mode) {
    let (t, seg) = setup("forged", Access::everyone(Rights::ALL));
    let before = snapshot(&seg);
    if mode == Mode::ShmMapped {
        return forged_rendezvous_requests(&t, &seg, &before);
    }
    let mut raw = Raw::new(raw_channel(&t, mode));
    let place = Place { segment: seg.id(), generation: seg.generation(), offset: 0 };
    // A well-formed put before the importer introduced itself.
    raw.send(&[&encode(&Request { token: 11, notify: false, op: Op::Put { place, data: &[1; 8] } })]);
    assert_eq!(raw.responses(1), vec![(11, Some(AccessError::NotIntroduced))]);
    raw.send(&[&encode(&Request {
        token: 0,
        notify: false,
        op: Op::Hello { node: NodeId(7), version: wire::VERSION },
    })]);
    raw.responses(1);
    let c0 = t.rma.target_counters();
    // Random bytes: every request (a message may frame several, back to back) with a
    // readable header is refused by its token; the rest get no answer; all are counted.
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0x5eed);
    let mut expect = Vec::new();
    let (mut undecodable, mut requests) = (0, 0);
    for i in 0..2000 {
        let len = rng.gen_range(0..160);
        let mut m = vec![0u8; len];
        rng.fill(&mut m[..]);
        if i % 4 == 0 && len > 0 {
            // Often enough, a first request that frames (a get's header), so that the rest
            // of the message is read as further requests.
            m[0] = 2;
        }
        for piece in wire::split_requests(&m) {
            requests += 1;
            if wire::decode_request(piece).is_err() {
                undecodable += 1;
            }
            if let Some(token) = wire::peek_token(piece) {
                expect.push(token);
            }
        }
        raw.send(&[&m]);
    }
    assert!(requests > 2100, "some messages carried several requests ({requests})");
    let got = raw.responses(expect.len());
    assert_eq!(got.iter().map(|g| g.0).collect::<Vec<_>>(), expect, "one refusal per readable request, in order");
    assert!(got.iter().all(|(_, e)| e.is_some()), "nothing random was accepted");
    let c1 = t.rma.target_counters();
    assert_eq!(c1.malformed - c0.malformed, undecodable);
    assert_eq!(c1.requests - c0.requests, requests);
    // Structured forgeries: well-formed headers with lies in them.
    let mut lying_len = encode(&Request { token: 21, notify: false, op: Op::Put { place, data: &[2; 16] } });
    lying_len[12..16].copy_from_slice(&1_000_000u32.to_le_bytes());
    let mut bad_flags = encode(&Request { token: 22, notify: false, op: Op::Get { place, len: 8 } });
    bad_flags[1] = 0x80;
    let forged: Vec<(Vec<u8>, AccessError)> = vec![
        (lying_len, AccessError::Malformed),
        (bad_flags, AccessError::Malformed),
        (encode(&Request { token: 23, notify: false, op: Op::Get { place, len: u32::MAX } }), AccessError::TooLarge),
        (
            encode(&Request {
                token: 24,
                notify: false,
                op: Op::Put { place: Place { generation: Generation(0), ..place }, data: &[3; 8] },
            }),
            AccessError::StaleGeneration,
        ),
        (
            encode(&Request {
                token: 25,
                notify: false,
                op: Op::FetchAdd { place: Place { offset: 4, ..place }, addend: 1 },
            }),
            AccessError::Misaligned,
        ),
        (
            encode(&Request {
                token: 26,
                notify: false,
                op: Op::Put { place: Place { offset: u64::MAX - 2, ..place }, data: &[4; 8] },
            }),
            AccessError::OutOfBounds,
        ),
        (
            encode(&Request { token: 27, notify: false, op: Op::Hello { node: NodeId(8), version: wire::VERSION } }),
            AccessError::Malformed,
        ),
        (
            encode(&Request { token: 28, notify: false, op: Op::Lookup { name: b"no-such-name" } }),
            AccessError::UnknownName,
        ),
        (
            encode(&Request {
                token: 29,
                notify: false,
                op: Op::CompareSwap { place: Place { segment: SegmentId(77), ..place }, expected: 0, desired: 1 },
            }),
            AccessError::UnknownSegment,
        ),
    ];
    for (m, _) in &forged {
        raw.send(&[m]);
    }
    let got = raw.responses(forged.len());
    for ((token, e), (m, want)) in got.iter().zip(&forged) {
        assert_eq!((*token, *e), (wire::peek_token(m).unwrap(), Some(*want)));
    }
    // A request bigger than one message arrives in fragments: refused once, by token.
    let huge = vec![0u8; 2 << 20];
    let mut head = [0u8; wire::HEADER_LEN + 16];
    let big = Request { token: 31, notify: false, op: Op::Put { place, data: &huge } };
    let mut msg = big.encode_head(&mut head).to_vec();
    msg.extend_from_slice(&huge);
    assert_eq!(raw.ep.post_send(raw.ch, msg, 1).unwrap(), SendOutcome::InProgress(1));
    let got = raw.responses(1);
    assert_eq!(got, vec![(31, Some(AccessError::TooLarge))]);
    assert_eq!(snapshot(&seg), before, "no forged request changed a byte");
    // Several requests in one message: each checked on its own, the good ones applied,
    // the bad ones refused and counted, a tail that frames nothing dropped and counted.
    let c2 = t.rma.target_counters();
    let mut bad_flags = encode(&Request { token: 42, notify: false, op: Op::Get { place, len: 8 } });
    bad_flags[1] = 0x80;
    let mixed = [
        encode(&Request {
            token: 41,
            notify: false,
            op: Op::FetchAdd { place: Place { offset: 64, ..place }, addend: 5 },
        }),
        bad_flags,
        encode(&Request {
            token: 43,
            notify: false,
            op: Op::FetchAdd { place: Place { offset: 65, ..place }, addend: 1 },
        }),
        encode(&Request {
            token: 44,
            notify: false,
            op: Op::Put { place: Place { offset: 80, ..place }, data: &[6; 8] },
        }),
        vec![0xee; 5],
    ]
    .concat();
    raw.send(&[&mixed]);
    let got = raw.responses(4);
    assert_eq!(
        got,
        vec![(41, None), (42, Some(AccessError::Malformed)), (43, Some(AccessError::Misaligned)), (44, None)]
    );
    let c3 = t.rma.target_counters();
    assert_eq!((c3.requests - c2.requests, c3.malformed - c2.malformed, c3.refused() - c2.refused()), (5, 2, 2));
    let mut expected = before.clone();
    expected[64..72].copy_from_slice(&(u64::from_ne_bytes(before[64..72].try_into().unwrap()) + 5).to_ne_bytes());
    expected[80..88].copy_from_slice(&[6; 8]);
    assert_eq!(snapshot(&seg), expected, "exactly the good requests of the message were applied");
    // The target still serves an honest importer.
    let (mut me, _, r) = importer(2, &t, "s", mode);
    me.put_blocking(&r, 0, &[9; 8], T).unwrap();
    assert_eq!(seg.load_u64(0), u64::from_ne_bytes([9; 8]));
}

/// Random and truncated requests to the same-host rendezvous: refused (counted) or
/// dropped, never a mapping, never a crash.
fn forged_rendezvous_requests(t: &Target, seg: &ExportedSegment, before: &[u8]) {
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(format!("ulnet-rma/{}", t.shm)).unwrap();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0x5eed);
    // The request's fields, nonce and MAC (rendezvous version 2), after the owner's
    // 32-byte challenge; the reply's fields and MAC.
    const CHALLENGE_LEN: usize = 32;
    const REQUEST_LEN: usize = 96 + 16 + 32;
    const REPLY_LEN: usize = 48 + 32;
    let mut refused = 0;
    for i in 0..200 {
        let mut s = std::os::unix::net::UnixStream::connect_addr(&addr).unwrap();
        s.set_read_timeout(Some(T)).unwrap();
        let mut challenge = [0u8; CHALLENGE_LEN];
        s.read_exact(&mut challenge).unwrap();
        assert_eq!(&challenge[..8], b"ULNETRMC", "the owner speaks first");
        let mut m = vec![0u8; REQUEST_LEN];
        rng.fill(&mut m[..]);
        if i % 4 == 0 {
            // Truncated: the rendezvous waits for the rest, then drops it at hang-up.
            s.write_all(&m[..rng.gen_range(0..REQUEST_LEN)]).unwrap();
            continue;
        }
        s.write_all(&m).unwrap();
        let mut reply = [0u8; REPLY_LEN];
        s.read_exact(&mut reply).unwrap();
        assert_ne!(reply[8], 0, "random bytes are never granted");
        refused += 1;
    }
    let deadline = Instant::now() + T;
    while t.rma.target_counters().mapped_refused < refused {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(t.rma.target_counters().mapped_refused, refused);
    assert_eq!(t.rma.target_counters().mapped_imports, 0);
    assert_eq!(snapshot(seg), before);
    let (mut me, _, r) = importer(2, t, "s", Mode::ShmMapped);
    me.put_blocking(&r, 0, &[9; 8], T).unwrap();
    assert_eq!(seg.load_u64(0), u64::from_ne_bytes([9; 8]));
}

/// A channel whose handshake named node 5 may introduce itself as node 5 only: a Hello
/// naming node 7 (whose rights the segment grants) is refused as `Denied` and counted,
/// and the channel then has node 5's rights, none. (A mapping's importer has no Hello: it
/// names itself in the rendezvous request, under that request's MAC.)
#[test]
fn rejects_a_hello_naming_another_node_than_its_handshake() {
    for mode in [Mode::ShmChannel, Mode::Tcp, Mode::Udp] {
        impostor_is_refused(mode);
    }
}

fn impostor_is_refused(mode: Mode) {
    let (t, seg) = setup("impostor", Access::none().grant(NodeId(7), Rights::ALL));
    let before = snapshot(&seg);
    let mut raw = Raw::new(raw_channel_as(&t, mode, NodeId(5)));
    let hello = |node| encode(&Request { token: 0, notify: false, op: Op::Hello { node, version: wire::VERSION } });
    let denied_before = t.rma.target_counters().refused_for(AccessError::Denied);
    raw.send(&[&hello(NodeId(7))]);
    assert_eq!(raw.responses(1), vec![(0, Some(AccessError::Denied))], "{mode:?}");
    assert_eq!(t.rma.target_counters().refused_for(AccessError::Denied), denied_before + 1);
    raw.send(&[&hello(NodeId(5))]);
    assert_eq!(raw.responses(1), vec![(0, None)], "{mode:?}: the node it proved is welcome");
    let place = Place { segment: seg.id(), generation: seg.generation(), offset: 0 };
    raw.send(&[&encode(&Request { token: 3, notify: false, op: Op::Put { place, data: &[1; 8] } })]);
    assert_eq!(raw.responses(1), vec![(3, Some(AccessError::Denied))], "{mode:?}");
    assert_eq!(snapshot(&seg), before);
}

fn withdrawn_export_cuts_off_its_importers(mode: Mode) {
    let (t, seg) = setup("withdrawn", Access::everyone(Rights::ALL));
    let (mut me, peer, r) = importer(2, &t, "s", mode);
    assert_eq!(run(&mut me, &r, Case::Faa(0)), Ok(()));
    drop(seg);
    // Through the engine the slot is gone; a mapping was cut off when the export went.
    let want = if mode == Mode::ShmMapped { AccessError::Revoked } else { AccessError::UnknownSegment };
    for case in every_family(0) {
        assert_eq!(run(&mut me, &r, case), Err(RmaError::Access(want)), "{mode:?} {case:?}");
    }
    let e = me.import_with(peer, "s", connect_mode(mode)).unwrap_err();
    assert!(matches!(e, ImportError::Access(AccessError::UnknownName)), "{e:?}");
}

for_every_transport!(
    withdrawn_export_cuts_off_its_importers,
    rejects_wrong_segment_id,
    rejects_stale_generation,
    rejects_revoked_segment,
    rejects_missing_rights,
    rejects_out_of_bounds_and_overflow,
    rejects_misaligned_atomics,
    forged_raw_requests_are_rejected_and_counted,
);

/// UDP only: datagrams no ulnet peer would send, thrown at the RMA listener's port from a
/// plain socket, are each dropped and counted once (by the listener's checks: length,
/// magic, version, checksum, kind); none opens a channel or changes a byte, and the target
/// keeps serving.
#[test]
fn udp_forged_datagrams_at_the_listener_are_dropped_and_counted() {
    let (t, seg) = setup("udp-raw", Access::everyone(Rights::ALL));
    let before = snapshot(&seg);
    let dropped = |r: &Rma| {
        let c = r.udp_counters();
        c.truncated + c.malformed + c.wrong_version + c.bad_checksum + c.stranger + c.wrong_secret + c.replayed
    };
    let (d0, accepted0) = (dropped(&t.rma), t.rma.target_counters().channels_accepted);
    let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    socket.connect(&t.udp).unwrap();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0xda7a);
    const SENT: u64 = 500;
    for i in 0..SENT {
        let mut m = vec![0u8; rng.gen_range(0..1400)];
        rng.fill(&mut m[..]);
        if i % 2 == 0 && m.len() >= udp_wire::HEADER_LEN + 64 {
            // Half carry a well-formed header (a HELLO or a packet of some connection), so
            // the checksum and connection checks are reached too.
            m[..2].copy_from_slice(&udp_wire::MAGIC);
            m[2] = udp_wire::VERSION;
            m[3] = if i % 4 == 0 { udp_wire::Kind::Hello as u8 } else { udp_wire::Kind::Ack as u8 };
            let body = (m.len() - udp_wire::HEADER_LEN) as u32;
            m[12..16].copy_from_slice(&body.to_le_bytes());
        }
        socket.send(&m).unwrap();
        if i % 64 == 63 {
            std::thread::sleep(Duration::from_millis(2)); // within the socket's buffer
        }
    }
    let deadline = Instant::now() + T;
    while dropped(&t.rma) - d0 < SENT {
        assert!(Instant::now() < deadline, "only {} of {SENT} datagrams counted", dropped(&t.rma) - d0);
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(dropped(&t.rma) - d0, SENT, "each counted once");
    assert_eq!(t.rma.target_counters().channels_accepted, accepted0, "no channel from forged datagrams");
    assert_eq!(snapshot(&seg), before);
    let (mut me, _, r) = importer(2, &t, "s", Mode::Udp);
    me.put_blocking(&r, 0, &[9; 8], T).unwrap();
    assert_eq!(seg.load_u64(0), u64::from_ne_bytes([9; 8]));
}
