//! Tracing a stream: the receives a poll counts straight into the open run
//! (`Recorder::receive_run`) add up exactly, across full runs, a size that changes, and
//! handlers that send in the middle of a batch, and polls of any size (runs end at 1,024
//! messages all the same); sends packed in place are counted as
//! sends of their size. Tracing is per process: one test.

mod util;

use std::time::Duration;
use ulnet_core::trace::{self, Direction, TraceConfig};
use ulnet_core::{Endpoint, Event, NodeId, SendOutcome};

#[test]
fn a_traced_stream_counts_every_message_once() {
    let dir = std::env::temp_dir().join(util::unique_name("trace-stream"));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("t.ultrace");
    let (mut server, sch, mut client, ch) = util::shm_pair("trace-stream-shm", 5, 9);

    trace::start(TraceConfig::new(&path, NodeId(9))).unwrap();
    // 8-byte messages; every 3,001st is 16 bytes; every 5,003rd asks the server's handler
    // to answer from inside its delivery (a send in the middle of a batch); every 7th
    // 8-byte one is packed in place.
    let total = 30_000u32;
    let (mut sent_16, mut asks, mut packed) = (0u64, 0u64, 0u64);
    let (mut received, mut answered, mut sent) = (0u64, 0u64, 0u32);
    // Polls of 256 messages, and unbounded ones every other time (their runs must still
    // end at 1,024 messages).
    let (mut polls, mut most_in_one_poll) = (0u64, 0usize);
    let mut poll_server = |server: &mut Endpoint, received: &mut u64, answered: &mut u64| {
        polls += 1;
        let got = server.poll(if polls % 2 == 0 { usize::MAX } else { 256 }, |e| {
            if let Event::Message { data, mut reply, .. } = e {
                *received += 1;
                if data[0] == 0xee {
                    while reply.send(&[b"answer"]).unwrap() != SendOutcome::Done {}
                    *answered += 1;
                }
            }
        });
        most_in_one_poll = most_in_one_poll.max(got);
    };
    while sent < total {
        let mut msg = [0u8; 16];
        let len = if sent % 3001 == 3000 {
            sent_16 += 1;
            16
        } else {
            8
        };
        if sent % 5003 == 5002 {
            msg[0] = 0xee;
            asks += 1;
        }
        let pack = len == 8 && sent % 7 == 0;
        let outcome = if pack {
            client.send_packed(ch, len, &mut |dst| dst.copy_from_slice(&msg[..len])).unwrap()
        } else {
            client.send(ch, &[&msg[..len]]).unwrap()
        };
        if outcome == SendOutcome::Done {
            packed += u64::from(pack);
            sent += 1;
        } else {
            poll_server(&mut server, &mut received, &mut answered);
        }
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while received < u64::from(total) {
        assert!(std::time::Instant::now() < deadline, "messages did not arrive");
        poll_server(&mut server, &mut received, &mut answered);
    }
    assert_eq!(answered, asks);
    // Traced, a poll still delivers all it may at once (in batches of a run's worth inside).
    assert!(most_in_one_poll > 1024, "at most {most_in_one_poll} messages in one poll");
    let mut answers = 0;
    while answers < asks {
        client.poll(64, |e| answers += u64::from(matches!(e, Event::Message { .. })));
    }
    // What an endpoint does when it closes: write its open run.
    server.close(sch);
    client.close(ch);
    trace::stop().unwrap();

    let file = trace::decode_file(&std::fs::read(&path).unwrap()).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    let received_of = |size: u64| -> u64 {
        file.records
            .iter()
            .filter(|r| r.direction() == Direction::Receive && r.src_node == 9 && r.dst_node == 5 && r.size == size)
            .map(|r| u64::from(r.count))
            .sum()
    };
    assert_eq!(received_of(16), sent_16);
    assert_eq!(received_of(8), u64::from(total) - sent_16);
    let answers_sent: u64 = file
        .records
        .iter()
        .filter(|r| r.direction() == Direction::Send && r.src_node == 5 && r.size == 6)
        .map(|r| u64::from(r.count))
        .sum();
    assert_eq!(answers_sent, asks);
    let sent_of = |size: u64| -> u64 {
        file.records
            .iter()
            .filter(|r| r.direction() == Direction::Send && r.src_node == 9 && r.size == size)
            .map(|r| u64::from(r.count))
            .sum()
    };
    assert!(packed > 4000, "{packed} packed sends");
    assert_eq!(sent_of(8), u64::from(total) - sent_16, "packed and copied sends alike");
    assert_eq!(sent_of(16), sent_16);
    assert_eq!(file.dropped(), 0);
    // Runs stay within their bound.
    assert!(file.records.iter().all(|r| r.count <= 1024), "a run of more than 1,024 messages");
}
