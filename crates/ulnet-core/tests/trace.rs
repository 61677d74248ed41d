//! Tracing: records match what the endpoints counted, node ids cross the handshakes, and
//! pausing stops recording. Tracing is per process, so these run as one test in sequence.

mod util;

use std::time::Duration;
use ulnet_core::trace::{self, Direction, MessageKind, TraceConfig};
use ulnet_core::{Endpoint, EndpointConfig, Event, NodeId, SendOutcome};

fn endpoint(node: u32) -> Endpoint {
    Endpoint::new(EndpointConfig { node_id: NodeId(node), ..Default::default() })
}

/// Sends `sizes` from `a` to `b` as gather lists of up to three buffers and drains `b`.
fn exchange(a: &mut Endpoint, b: &mut Endpoint, ch: ulnet_core::ChannelId, sizes: &[usize]) {
    let data = vec![7u8; 1 << 16];
    for &size in sizes {
        let cut = [size / 3, 2 * size / 3];
        let gather = [&data[..cut[0]], &data[cut[0]..cut[1]], &data[cut[1]..size]];
        while a.send(ch, &gather).unwrap() != SendOutcome::Done {
            b.poll(64, |_| {});
        }
        b.poll(64, |_| {});
    }
    let want = sizes.len() as u64;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while b.counters().deliveries_received < want {
        assert!(std::time::Instant::now() < deadline, "messages did not arrive");
        b.poll(64, |_| {});
    }
}

#[test]
fn trace_records_match_counters_and_name_both_nodes() {
    let dir = std::env::temp_dir().join(util::unique_name("trace"));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("t.ultrace");

    node_ids_cross_the_tcp_handshake();

    // Node ids cross the shared-memory handshake.
    let (mut server, sch, mut client, ch) = util::shm_pair("trace-shm", 5, 9);
    assert_eq!(client.peer_node(ch), Some(NodeId(5)));
    assert_eq!(server.peer_node(sch), Some(NodeId(9)));

    // Off: nothing recorded.
    exchange(&mut client, &mut server, ch, &[100; 10]);
    assert!(!trace::enabled());

    trace::start(TraceConfig::new(&path, NodeId(9))).unwrap();
    let before = (client.counters(), server.counters());
    let sizes: Vec<usize> = (0..500).map(|i| 68 + (i * 37) % 4000).collect();
    exchange(&mut client, &mut server, ch, &sizes);
    // A reply from inside the handler counts and is traced as well.
    assert_eq!(client.send_as(ch, &[b"ping"], MessageKind::Request, 42).unwrap(), SendOutcome::Done);
    let mut replied = false;
    while !replied {
        server.poll(1, |e| {
            if let Event::Message { mut reply, .. } = e {
                assert_eq!(reply.send_as(&[b"pong!"], MessageKind::Response, 42).unwrap(), SendOutcome::Done);
                replied = true;
            }
        });
    }
    let mut got_reply = false;
    while !got_reply {
        client.poll(1, |e| got_reply |= matches!(e, Event::Message { .. }));
    }
    trace::pause();
    exchange(&mut client, &mut server, ch, &[10; 5]);
    trace::resume();
    let after = (client.counters(), server.counters());
    let summary = trace::stop().unwrap();
    assert!(!trace::enabled());
    assert_eq!(summary.dropped, 0);

    let bytes = std::fs::read(&path).unwrap();
    let file = trace::decode_file(&bytes).unwrap();
    assert_eq!(file.header.node_id, 9);
    assert_eq!(summary.records, file.records.len() as u64);
    assert_eq!(summary.bytes, bytes.len() as u64);
    let sends: Vec<_> = file.records.iter().filter(|r| r.direction() == Direction::Send).collect();
    let recvs: Vec<_> = file.records.iter().filter(|r| r.direction() == Direction::Receive).collect();
    let sent_msgs = (after.0.messages_sent - before.0.messages_sent) + (after.1.messages_sent - before.1.messages_sent);
    let sent_bytes = (after.0.bytes_sent - before.0.bytes_sent) + (after.1.bytes_sent - before.1.bytes_sent);
    let paused = 5;
    // A run record counts identical messages: weigh records by their count.
    let messages = |rs: &[&trace::Record]| rs.iter().map(|r| u64::from(r.count)).sum::<u64>();
    assert_eq!(messages(&sends), sent_msgs - paused, "every counted message is in a send record");
    assert_eq!(sends.iter().map(|r| r.size * u64::from(r.count)).sum::<u64>(), sent_bytes - paused * 10);
    let recv_msgs = (after.0.deliveries_received - before.0.deliveries_received)
        + (after.1.deliveries_received - before.1.deliveries_received);
    assert_eq!(messages(&recvs), recv_msgs - paused, "messages here are single fragments");
    let data_sends: Vec<_> = sends.iter().filter(|r| r.message_kind() == MessageKind::Message).collect();
    assert!(data_sends.iter().all(|r| (r.src_node, r.dst_node) == (9, 5) && r.buffers == 3));
    assert!(data_sends.iter().all(|r| r.buffer_len.iter().map(|&l| u64::from(l)).sum::<u64>() == r.size));
    let request = sends.iter().find(|r| r.message_kind() == MessageKind::Request).unwrap();
    let response = sends.iter().find(|r| r.message_kind() == MessageKind::Response).unwrap();
    assert_eq!((request.request_id, request.src_node, request.dst_node), (42, 9, 5));
    assert_eq!((response.request_id, response.src_node, response.dst_node, response.size), (42, 5, 9, 5));
    let clock = file.clock();
    assert!(recvs.iter().all(|r| clock.mono_ns(r.received) >= file.header.ref_mono_ns));
    assert!(recvs.iter().all(|r| (r.src_node, r.dst_node) == (9, 5) || (r.src_node, r.dst_node) == (5, 9)));

    // A second session writes a new file.
    let path2 = dir.join("t2.ultrace");
    trace::start(TraceConfig::new(&path2, NodeId(9))).unwrap();
    assert!(trace::start(TraceConfig::new(&path2, NodeId(9))).is_err(), "one session at a time");
    exchange(&mut client, &mut server, ch, &[200; 3]);
    // A large posted message is one record per side, not one per fragment.
    let before = server.counters();
    let big = vec![1u8; 1 << 20];
    assert_eq!(client.post_send(ch, big, 7).unwrap(), SendOutcome::InProgress(7));
    let (mut complete, mut whole) = (false, false);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !(complete && whole) {
        assert!(std::time::Instant::now() < deadline, "the large message did not go through");
        client.poll(64, |e| complete |= matches!(e, Event::SendComplete { token: 7, .. }));
        server.poll(64, |e| {
            if let Event::Message { data, message_len, offset, .. } = e {
                whole |= offset + data.len() as u64 == message_len;
            }
        });
    }
    let fragments = server.counters().deliveries_received - before.deliveries_received;
    assert!(fragments > 1, "1 MiB arrives in fragments");
    // One-sided operations are recorded by the RMA layer through this hook.
    trace::record_rma(MessageKind::RmaWrite, (NodeId(9), NodeId(5)), ch.0, 4096, 0, trace::now());
    trace::stop().unwrap();
    let file2 = trace::decode_file(&std::fs::read(&path2).unwrap()).unwrap();
    let sends2: Vec<_> = file2.records.iter().filter(|r| r.direction() == Direction::Send).collect();
    assert_eq!(messages(&sends2), 5, "3 small, 1 posted, 1 RMA");
    let run = sends2.iter().find(|r| r.size == 200).unwrap();
    assert_eq!(run.count, 3, "three identical sends make one run record");
    assert!(run.last_ticks >= run.ticks);
    let posted = sends2.iter().find(|r| r.size == 1 << 20).unwrap();
    assert!(posted.enqueued > 0 && posted.enqueued <= posted.sent, "a posted send has its queueing stage");
    assert_eq!((posted.buffers, posted.buffer_len[0]), (1, 1 << 20));
    let rma = sends2.iter().find(|r| r.message_kind() == MessageKind::RmaWrite).unwrap();
    assert_eq!((rma.size, rma.src_node, rma.dst_node), (4096, 9, 5));
    let recvs2: Vec<_> = file2.records.iter().filter(|r| r.direction() == Direction::Receive).collect();
    assert_eq!(messages(&recvs2), 4, "one receive record for the fragmented message");
    assert_eq!(recvs2.iter().filter(|r| r.size == 1 << 20).count(), 1);
    std::fs::remove_dir_all(&dir).unwrap();
}

fn node_ids_cross_the_tcp_handshake() {
    let mut server = endpoint(11);
    let addr = server.listen_tcp("127.0.0.1:0").unwrap();
    let connector = std::thread::spawn(move || {
        let mut client = endpoint(12);
        let ch = client.connect_tcp(&addr.to_string(), Duration::from_secs(5)).unwrap();
        client.peer_node(ch)
    });
    let sch = server.accept(Duration::from_secs(5)).unwrap();
    assert_eq!(connector.join().unwrap(), Some(NodeId(11)));
    assert_eq!(server.peer_node(sch), Some(NodeId(12)));
}
