//! The UDP protocol machine in the deterministic simulator: endpoints exchange encoded
//! datagrams under loss, duplication, reordering, delay and partitions over thousands of
//! seeds. Checked at every step: every message arrives complete, in order, exactly once;
//! a receiver never buffers more than its credit. Checked at the end: everything arrived
//! (after partitions heal), or a vanished peer was reported within a bounded time.
//! Reproduce a failure with `ULNET_SIM_SEED=N cargo test --release -p ulnet-core --test udp_sim NAME`.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::VecDeque;
use std::time::{Duration, Instant};
use ulnet_core::transport::udp::wire;
use ulnet_core::transport::udp::{Connection, UdpConfig};
use ulnet_core::{ChannelError, SendOutcome};
use ulnet_sim::{for_each_seed, FaultPlan, FaultPlanConfig, Faults, Node, NodeId, Sim};

/// The bytes of message `k` from `src` to `dst` of a run: a seeded length (mostly small,
/// some spanning many packets, a few streamed with `send_fragments`) and seeded contents.
fn message(seed: u64, src: u32, dst: u32, k: u64) -> Vec<u8> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ (u64::from(src) << 48) ^ (u64::from(dst) << 32) ^ k);
    let len = match rng.gen_range(0..100) {
        0..=69 => rng.gen_range(0..=256),
        70..=96 => rng.gen_range(257..=20_000),
        _ => rng.gen_range(20_001..=150_000),
    };
    let mut m = vec![0u8; len];
    rng.fill(&mut m[..]);
    m
}

/// One direction of traffic seen from the receiver: what has arrived so far.
#[derive(Default)]
struct Inbound {
    next: u64,
    partial: Vec<u8>,
}

/// One connection of a node and its application: a sender of `count` messages and a
/// checking receiver.
struct Link {
    conn: Connection,
    peer: NodeId,
    count: u64,
    sent: u64,
    /// Offset of the message being streamed with `send_fragments`.
    streaming: Option<(Vec<u8>, usize)>,
    /// The next message, made once and kept while the send slots are full.
    pending: Option<Vec<u8>>,
    inbound: Inbound,
    down: Option<(Duration, ChannelError)>,
}

struct Peer {
    me: u32,
    seed: u64,
    config: UdpConfig,
    /// One slot per node: our connection to it.
    links: Vec<Option<Link>>,
    /// Receivers that consume at most this many deliveries per `consume_every` (a slow
    /// application); `None` consumes everything at once.
    consume_every: Option<Duration>,
    next_consume: Option<Instant>,
    out: VecDeque<(NodeId, Vec<u8>)>,
    buf: Vec<u8>,
    start: Instant,
    nonce_rng: ChaCha8Rng,
    violation: Option<String>,
    /// Most bytes a receiver buffered, and the bound it was allowed.
    max_buffered: (u64, u64),
}

impl Peer {
    fn new(me: u32, seed: u64, config: UdpConfig, nodes: u32, start: Instant) -> Self {
        Self {
            me,
            seed,
            buf: vec![0; config.datagram_max],
            config,
            links: (0..nodes).map(|_| None).collect(),
            consume_every: None,
            next_consume: None,
            out: VecDeque::new(),
            start,
            nonce_rng: ChaCha8Rng::seed_from_u64(seed ^ u64::from(me) ^ 0x6e6f6e6365),
            violation: None,
            max_buffered: (0, 0),
        }
    }

    /// Opens a client connection to `peer` that will send `count` messages.
    fn connect(&mut self, now: Instant, peer: NodeId, count: u64) {
        let id = (self.me + 1) * 1000 + peer.0 + 1;
        let conn = Connection::client(self.config.clone(), now, id, self.nonce_rng.gen(), ulnet_core::NodeId::UNKNOWN);
        self.links[peer.0 as usize] = Some(Link::new(conn, peer, count));
        self.step(now);
    }

    /// Messages each accepted connection sends back.
    fn server_count(&self) -> u64 {
        40
    }

    fn all_done(&self, expected_from: &dyn Fn(u32) -> u64) -> bool {
        self.links.iter().flatten().all(|l| l.sent == l.count && l.inbound.next == expected_from(l.peer.0))
    }

    fn check_delivery(&mut self, peer: u32, offset: u64, data: &[u8], message_len: u64) -> Result<(), String> {
        let seed = self.seed;
        let me = self.me;
        let link = self.links[peer as usize].as_mut().expect("link exists");
        let inbound = &mut link.inbound;
        if offset != inbound.partial.len() as u64 {
            return Err(format!("n{me} from n{peer}: fragment at {offset}, expected {}", inbound.partial.len()));
        }
        inbound.partial.extend_from_slice(data);
        if inbound.partial.len() as u64 == message_len {
            let want = message(seed, peer, me, inbound.next);
            if inbound.partial != want {
                return Err(format!(
                    "n{me} from n{peer}: message {} wrong ({} bytes, want {}): lost, duplicated, reordered or corrupted",
                    inbound.next,
                    inbound.partial.len(),
                    want.len()
                ));
            }
            inbound.next += 1;
            inbound.partial.clear();
        }
        Ok(())
    }

    /// The application's turn: send what fits, receive what is allowed, then collect the
    /// datagrams to send.
    fn step(&mut self, now: Instant) {
        let consume_now = match (self.consume_every, self.next_consume) {
            (None, _) => usize::MAX,
            (Some(_), Some(t)) if t > now => 0,
            (Some(every), _) => {
                self.next_consume = Some(now + every);
                1
            }
        };
        for i in 0..self.links.len() {
            let Some(link) = self.links[i].as_mut() else { continue };
            if link.down.is_some() {
                continue;
            }
            link.send_what_fits(self.seed, self.me);
            let peer = link.peer.0;
            let mut deliveries = Vec::new();
            let result = link.conn.poll_recv(consume_now, &mut |d, _reply| {
                deliveries.push((d.offset, d.data.to_vec(), d.message_len));
            });
            for (offset, data, len) in deliveries {
                if let Err(e) = self.check_delivery(peer, offset, &data, len) {
                    self.violation.get_or_insert(e);
                }
            }
            let link = self.links[i].as_mut().expect("still there");
            if let Err(e) = result {
                link.down = Some((now - self.start, e));
            }
            let (buffered, bound) = (link.conn.receive_buffered(), link.conn.receive_capacity());
            if buffered > self.max_buffered.0 {
                self.max_buffered = (buffered, bound);
            }
            link.conn.flush();
            while let Some(n) = link.conn.poll_transmit(now, &mut self.buf) {
                self.out.push_back((link.peer, self.buf[..n].to_vec()));
            }
        }
    }
}

impl Link {
    fn new(conn: Connection, peer: NodeId, count: u64) -> Self {
        Self { conn, peer, count, sent: 0, streaming: None, pending: None, inbound: Inbound::default(), down: None }
    }

    fn send_what_fits(&mut self, seed: u64, me: u32) {
        if !self.conn.is_established() {
            return;
        }
        while self.sent < self.count {
            if let Some((m, at)) = self.streaming.as_mut() {
                let n = self.conn.send_fragments(m.len() as u64, *at as u64, &m[*at..]).expect("send_fragments");
                *at += n;
                if *at < m.len() {
                    return;
                }
                self.streaming = None;
                self.sent += 1;
                continue;
            }
            let m = self.pending.take().unwrap_or_else(|| message(seed, me, self.peer.0, self.sent));
            if m.len() > self.conn.send_max() {
                self.streaming = Some((m, 0));
                continue;
            }
            // A gather of up to three pieces.
            let (a, rest) = m.split_at(m.len() / 3);
            let (b, c) = rest.split_at(rest.len() / 2);
            match self.conn.send(&[a, b, c]).expect("send") {
                SendOutcome::Done => self.sent += 1,
                SendOutcome::NoResource => {
                    self.pending = Some(m);
                    return;
                }
                SendOutcome::InProgress(_) => unreachable!("the machine completes or refuses"),
            }
        }
    }
}

impl Node for Peer {
    type Msg = Vec<u8>;

    fn handle_message(&mut self, now: Instant, from: NodeId, msg: Vec<u8>) {
        let slot = from.0 as usize;
        if self.links[slot].is_none() {
            // A server: only a valid HELLO opens a connection.
            if let Ok(h) = wire::parse_header(&msg) {
                if h.kind == wire::Kind::Hello {
                    let id = (self.me + 1) * 1000 + from.0 + 1;
                    if let Ok(conn) = Connection::server(
                        self.config.clone(),
                        now,
                        id,
                        self.nonce_rng.gen(),
                        ulnet_core::NodeId::UNKNOWN,
                        &msg,
                    ) {
                        let count = self.server_count();
                        self.links[slot] = Some(Link::new(conn, from, count));
                    }
                }
            }
        } else if let Some(link) = self.links[slot].as_mut() {
            link.conn.handle_datagram(now, &msg);
        }
        self.step(now);
    }

    fn handle_timeout(&mut self, now: Instant) {
        for link in self.links.iter_mut().flatten() {
            if link.conn.poll_timeout().is_some_and(|t| t <= now) {
                link.conn.handle_timeout(now);
            }
        }
        self.step(now);
    }

    fn poll_transmit(&mut self) -> Option<(NodeId, Vec<u8>)> {
        self.out.pop_front()
    }

    fn poll_timeout(&self) -> Option<Instant> {
        let conns = self.links.iter().flatten().filter(|l| l.down.is_none()).filter_map(|l| l.conn.poll_timeout());
        let consume = self.consume_every.and(self.next_consume);
        conns.chain(consume).min()
    }
}

fn check(sim: &Sim<Peer>) -> Result<(), String> {
    for (_, p) in sim.live_nodes() {
        if let Some(v) = &p.violation {
            return Err(v.clone());
        }
        if p.max_buffered.0 > p.max_buffered.1 {
            return Err(format!(
                "n{} buffered {} bytes over its credit of {}",
                p.me, p.max_buffered.0, p.max_buffered.1
            ));
        }
    }
    Ok(())
}

/// A client (n0) sending `count` messages to a server (n1), which sends 40 back.
fn pair(seed: u64, faults: Faults, count: u64) -> Sim<Peer> {
    let mut sim = Sim::new(seed, faults);
    let start = sim.now();
    sim.add_node(Peer::new(0, seed, UdpConfig::sim(), 2, start));
    sim.add_node(Peer::new(1, seed, UdpConfig::sim(), 2, start));
    let now = sim.now();
    sim.node_mut(NodeId(0)).unwrap().connect(now, NodeId(1), count);
    sim.flush(NodeId(0));
    sim
}

fn expect_complete(sim: &Sim<Peer>, counts: &dyn Fn(u32, u32) -> u64) -> Result<(), String> {
    for (id, p) in sim.live_nodes() {
        for link in p.links.iter().flatten() {
            if let Some((at, e)) = &link.down {
                return Err(format!("n{} link to {} went down at {at:?}: {e}", id.0, link.peer));
            }
            let want = counts(link.peer.0, id.0);
            if link.inbound.next != want {
                return Err(format!("n{} got {} of {want} messages from {}", id.0, link.inbound.next, link.peer));
            }
        }
    }
    Ok(())
}

fn seeds(n: u64) -> std::ops::Range<u64> {
    0..n
}

#[test]
fn pair_delivers_everything_in_order_exactly_once_under_faults() {
    for_each_seed("pair_delivers_everything_in_order_exactly_once_under_faults", seeds(1000), |seed| {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let faults = Faults {
            loss: rng.gen_range(0.0..0.2),
            duplicate: rng.gen_range(0.0..0.1),
            reorder: rng.gen_range(0.0..0.2),
            reorder_delay_max: Duration::from_millis(rng.gen_range(0..5)),
            ..Faults::default()
        };
        let mut sim = pair(seed, faults, 60);
        sim.run_for(Duration::from_secs(30), check)?;
        expect_complete(&sim, &|from, _| if from == 0 { 60 } else { 40 }).map_err(|e| sim.violation(e))
    });
}

#[test]
fn partitions_stall_the_channel_and_it_resumes_without_loss() {
    for_each_seed("partitions_stall_the_channel_and_it_resumes_without_loss", seeds(300), |seed| {
        let mut sim = pair(seed, Faults::lossy(0.05), 200);
        sim.run_for(Duration::from_millis(20), check)?;
        sim.partition(&[NodeId(0)], &[NodeId(1)]);
        let received = |sim: &Sim<Peer>| sim.node(NodeId(1)).unwrap().links[0].as_ref().map_or(0, |l| l.inbound.next);
        let before = received(&sim);
        let blocked_before = sim.network_counters().blocked;
        // Shorter than the sim profile's peer timeout (5 s): the channel must stall, not fail.
        // (The simulated network drops what is in flight across a cut link.)
        sim.run_for(Duration::from_secs(3), check)?;
        if received(&sim) != before {
            return Err(sim.violation("messages arrived across a partition"));
        }
        let sender = sim.node(NodeId(0)).unwrap().links[1].as_ref().unwrap();
        let retried = sim.network_counters().blocked > blocked_before;
        if sender.down.is_some() || !retried {
            return Err(sim.violation("the sender must be stalled and retrying (or probing), not failed"));
        }
        sim.heal();
        sim.run_for(Duration::from_secs(30), check)?;
        expect_complete(&sim, &|from, _| if from == 0 { 200 } else { 40 }).map_err(|e| sim.violation(e))
    });
}

#[test]
fn a_vanished_peer_becomes_a_channel_error_within_the_peer_timeout() {
    for_each_seed("a_vanished_peer_becomes_a_channel_error_within_the_peer_timeout", seeds(100), |seed| {
        let mut sim = pair(seed, Faults::lossy(0.05), 1_000_000);
        let crash_at = Duration::from_millis(sim.random_below(200) + 10);
        sim.run_for(crash_at, check)?;
        sim.crash(NodeId(1));
        let config = UdpConfig::sim();
        // Bound: silence for the peer timeout, plus one backed-off RTO to notice it.
        let bound = config.peer_timeout + config.rto_max + Duration::from_millis(1);
        sim.run_for(bound + Duration::from_secs(1), check)?;
        let link = sim.node(NodeId(0)).unwrap().links[1].as_ref().unwrap();
        match &link.down {
            Some((at, ChannelError::PeerFailed(_))) if *at <= crash_at + bound => Ok(()),
            other => Err(sim.violation(format!("expected PeerFailed within {bound:?} of the crash, got {other:?}"))),
        }
    });
}

#[test]
fn a_slow_receiver_throttles_only_its_own_sender_within_its_credit() {
    for_each_seed("a_slow_receiver_throttles_only_its_own_sender_within_its_credit", seeds(200), |seed| {
        // n0 sends to n1 (slow: one delivery per 200 µs) and to n2 (fast), same volume.
        let mut sim = Sim::new(seed, Faults::lossy(0.02));
        let start = sim.now();
        for me in 0..3 {
            sim.add_node(Peer::new(me, seed, UdpConfig::sim(), 3, start));
        }
        sim.node_mut(NodeId(1)).unwrap().consume_every = Some(Duration::from_micros(200));
        let now = sim.now();
        sim.node_mut(NodeId(0)).unwrap().connect(now, NodeId(1), 300);
        sim.node_mut(NodeId(0)).unwrap().connect(now, NodeId(2), 300);
        sim.flush(NodeId(0));
        let mut fast_done = None;
        let deadline = start + Duration::from_secs(60);
        while sim.step(deadline)? {
            check(&sim).map_err(|e| sim.violation(e))?;
            let got = |n: u32| sim.node(NodeId(n)).unwrap().links[0].as_ref().map_or(0, |l| l.inbound.next);
            if fast_done.is_none() && got(2) == 300 {
                fast_done = Some((sim.elapsed(), got(1)));
            }
            if got(1) == 300 && got(2) == 300 {
                break;
            }
        }
        let (at, slow_then) = fast_done.ok_or_else(|| sim.violation("the fast receiver never finished"))?;
        if slow_then >= 300 {
            return Err(sim.violation(format!("the slow receiver was not slower (fast done at {at:?})")));
        }
        let slow = sim.node(NodeId(1)).unwrap();
        if slow.max_buffered.0 == 0 || slow.max_buffered.0 > slow.max_buffered.1 {
            return Err(sim.violation(format!("slow receiver buffered {:?}", slow.max_buffered)));
        }
        expect_complete(&sim, &|from, to| if from == 0 && to != 0 { 300 } else { 40 }).map_err(|e| sim.violation(e))
    });
}

#[test]
fn a_mesh_of_endpoints_survives_a_seeded_fault_plan() {
    for_each_seed("a_mesh_of_endpoints_survives_a_seeded_fault_plan", seeds(100), |seed| {
        let n = 4u32;
        let mut sim = Sim::new(seed, Faults::lossy(0.05));
        let start = sim.now();
        for me in 0..n {
            sim.add_node(Peer::new(me, seed, UdpConfig::sim(), n, start));
        }
        let now = sim.now();
        for a in 0..n {
            for b in a + 1..n {
                sim.node_mut(NodeId(a)).unwrap().connect(now, NodeId(b), 50);
            }
            sim.flush(NodeId(a));
        }
        // Partitions and loss changes (no crashes), each shorter than the peer timeout.
        let plan_config = FaultPlanConfig {
            crash_weight: 0,
            restart_weight: 0,
            mean_gap: Duration::from_millis(400),
            ..FaultPlanConfig::standard(n, Duration::from_secs(3))
        };
        let plan = FaultPlan::random(seed, &plan_config, Faults::lossy(0.05));
        sim.run_plan(&plan, |_, _, _| unreachable!("no restarts"), check)?;
        sim.run_for(Duration::from_secs(20), check)?;
        for (_, p) in sim.live_nodes() {
            if !p.all_done(&|peer| if peer < p.me { 50 } else { 40 }) {
                return Err(sim.violation(format!("n{} did not finish", p.me)));
            }
        }
        expect_complete(&sim, &|from, to| if from < to { 50 } else { 40 }).map_err(|e| sim.violation(e))
    });
}

#[test]
fn clean_close_delivers_everything_then_closed() {
    for_each_seed("clean_close_delivers_everything_then_closed", seeds(300), |seed| {
        let mut sim = pair(seed, Faults::lossy(0.1), 30);
        sim.run_for(Duration::from_millis(5), check)?;
        // The client closes as soon as it has queued everything.
        let deadline = sim.now() + Duration::from_secs(20);
        let mut closed = false;
        while sim.step(deadline)? {
            check(&sim).map_err(|e| sim.violation(e))?;
            let c = sim.node_mut(NodeId(0)).unwrap();
            let link = c.links[1].as_mut().unwrap();
            if !closed && link.sent == 30 {
                link.conn.close();
                closed = true;
                let now = sim.now();
                sim.node_mut(NodeId(0)).unwrap().step(now);
                sim.flush(NodeId(0));
            }
            let server = sim.node(NodeId(1)).unwrap().links[0].as_ref();
            if server.is_some_and(|l| l.down.is_some()) {
                break;
            }
        }
        let server = sim.node(NodeId(1)).unwrap().links[0].as_ref().unwrap();
        match &server.down {
            Some((_, ChannelError::Closed)) if server.inbound.next == 30 => Ok(()),
            other => Err(sim.violation(format!("server saw {other:?} after {} messages", server.inbound.next))),
        }
    });
}

/// Random bytes, truncations and bit flips of real packets, fed to an established
/// connection between real packets: all dropped and counted, the stream still completes.
#[test]
fn garbage_on_the_receive_path_is_dropped_and_counted() {
    for_each_seed("garbage_on_the_receive_path_is_dropped_and_counted", seeds(200), |seed| {
        let mut sim = pair(seed, Faults::default(), 100);
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0xbad);
        let deadline = sim.now() + Duration::from_secs(20);
        let mut injected = 0u64;
        let mut last_real: Vec<u8> = Vec::new();
        while sim.step(deadline)? {
            check(&sim).map_err(|e| sim.violation(e))?;
            let now = sim.now();
            let server = sim.node_mut(NodeId(1)).unwrap();
            let Some(link) = server.links[0].as_mut() else { continue };
            if !link.conn.is_established() || injected >= 500 {
                continue;
            }
            // A real packet to corrupt: build one by asking the client side for nothing;
            // the server's own last datagram out serves (its structure is right).
            if let Some((_, d)) = server.out.back() {
                last_real = d.clone();
            }
            let garbage: Vec<u8> = match rng.gen_range(0..4) {
                0 => (0..rng.gen_range(0..200)).map(|_| rng.gen()).collect(),
                1 if !last_real.is_empty() => last_real[..rng.gen_range(0..last_real.len())].to_vec(),
                2 if !last_real.is_empty() => {
                    let mut c = last_real.clone();
                    let bit = rng.gen_range(0..c.len() * 8);
                    c[bit / 8] ^= 1 << (bit % 8);
                    c
                }
                _ => {
                    let mut g = vec![0u8; rng.gen_range(wire::HEADER_LEN..300)];
                    rng.fill(&mut g[..]);
                    g[..2].copy_from_slice(&wire::MAGIC);
                    g[2] = wire::VERSION;
                    g[3] = rng.gen_range(1..=6);
                    g
                }
            };
            let before = link.conn.counters().dropped();
            link.conn.handle_datagram(now, &garbage);
            injected += 1;
            if link.conn.counters().dropped() != before + 1 {
                return Err(sim.violation(format!("garbage {garbage:?} was not dropped and counted")));
            }
        }
        expect_complete(&sim, &|from, _| if from == 0 { 100 } else { 40 }).map_err(|e| sim.violation(e))
    });
}

#[test]
fn wrong_secret_never_establishes() {
    let mut sim = Sim::new(1, Faults::default());
    let start = sim.now();
    let stranger = UdpConfig { secret: b"wrong".to_vec(), ..UdpConfig::sim() };
    let cluster = UdpConfig { secret: b"right".to_vec(), ..UdpConfig::sim() };
    sim.add_node(Peer::new(0, 1, stranger, 2, start));
    sim.add_node(Peer::new(1, 1, cluster, 2, start));
    let now = sim.now();
    sim.node_mut(NodeId(0)).unwrap().connect(now, NodeId(1), 5);
    sim.flush(NodeId(0));
    sim.run_for(Duration::from_secs(10), check).unwrap();
    let client = sim.node(NodeId(0)).unwrap().links[1].as_ref().unwrap();
    assert!(!client.conn.is_established());
    assert_eq!(client.conn.counters().wrong_secret, 1, "the client refuses the server's proof");
    assert!(matches!(client.down, Some((_, ChannelError::Protocol(_)))), "{:?}", client.down);
    let server = sim.node(NodeId(1)).unwrap().links[0].as_ref().unwrap();
    assert!(!server.conn.is_established());
    assert!(matches!(server.down, Some((_, ChannelError::PeerFailed(_)))), "the half-open server gives up");
}
