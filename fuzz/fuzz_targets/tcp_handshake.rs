//! The TCP connection handshake machine (`ulnet_core::transport::tcp::handshake`) under any
//! bytes, cut in any pieces: a server fed them as a client's messages, a client fed them as
//! a server's, and an honest pair whose messages travel in pieces the input chooses.
//! Nothing may panic; a machine never takes more than it asked for; a stranger's bytes
//! never open a channel (neither side finishes `Ok` without the secret); the honest pair
//! always does.
#![no_main]
use libfuzzer_sys::fuzz_target;
use std::time::{Duration, Instant};
use ulnet_core::transport::tcp::handshake::{Handshake, OurHello};
use ulnet_core::NodeId;

const SECRET: &[u8] = b"fuzz";

fn ours(tag: u32, nonce: u8) -> OurHello {
    OurHello { tag, node: NodeId(tag), nonce: [nonce; 16] }
}

/// Feeds `input` to `hs` as its peer's bytes: each chunk's length comes from the byte
/// before it; between chunks, what `hs` has to send is written, and now and then its peer
/// closes or time passes. Returns whether it finished `Ok`.
fn feed(hs: &mut Handshake, mut input: &[u8], start: Instant) -> bool {
    let mut now = start;
    while let Some((&op, rest)) = input.split_first() {
        input = rest;
        match op % 16 {
            0 => hs.handle_closed(),
            1 => {
                now += Duration::from_millis(u64::from(op));
                hs.handle_timeout(now);
            }
            _ => {
                let len = usize::from(op / 16 + 1).min(input.len());
                let (chunk, rest) = input.split_at(len);
                input = rest;
                let wanted = hs.input_wanted();
                let taken = hs.handle_input(chunk);
                assert!(taken <= wanted && taken <= chunk.len(), "took {taken} of {} for {wanted}", chunk.len());
            }
        }
        let n = hs.poll_transmit().len();
        hs.handle_transmitted(n);
        if let Some(outcome) = hs.poll_outcome() {
            return outcome.is_ok();
        }
        if hs.is_finished() {
            return false;
        }
    }
    false
}

/// Moves what `from` has to send into `to`, `piece` bytes at a time.
fn pass(from: &mut Handshake, to: &mut Handshake, piece: usize) {
    while !from.poll_transmit().is_empty() {
        let chunk = from.poll_transmit()[..from.poll_transmit().len().min(piece)].to_vec();
        from.handle_transmitted(chunk.len());
        let mut at = 0;
        while at < chunk.len() && to.input_wanted() > 0 {
            at += to.handle_input(&chunk[at..]);
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let start = Instant::now();
    let deadline = Some(start + Duration::from_secs(1));
    let mut server = Handshake::server(SECRET, ours(22, 2), deadline);
    assert!(!feed(&mut server, data, start), "a stranger's bytes opened a channel at the server");
    let mut client = Handshake::client(SECRET, ours(11, 1), deadline);
    let hello = client.poll_transmit().len();
    client.handle_transmitted(hello);
    assert!(!feed(&mut client, data, start), "a stranger's bytes passed for the server's proof");
    let piece = usize::from(data.first().copied().unwrap_or(1)).max(1);
    let (mut c, mut s) = (Handshake::client(SECRET, ours(11, 1), None), Handshake::server(SECRET, ours(22, 2), None));
    pass(&mut c, &mut s, piece);
    pass(&mut s, &mut c, piece);
    pass(&mut c, &mut s, piece);
    assert!(matches!(c.poll_outcome(), Some(Ok(_))) && matches!(s.poll_outcome(), Some(Ok(_))));
});
