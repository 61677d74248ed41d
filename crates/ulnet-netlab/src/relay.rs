//! A seeded fault-injecting UDP relay: delay, duplication, reordering and loss, for the
//! faults the kernel here cannot make (no `netem`).
//!
//! Clients send to the relay's listening address; for each client the relay opens an
//! upstream socket of its own and forwards to the fixed upstream address, and what comes
//! back on that socket goes to the client from the listening address. Both directions pass
//! through the same faults. Every random choice comes from one ChaCha RNG seeded with
//! [`RelayConfig::seed`], which the relay prints when it starts, so a failing run can be
//! replayed with the same seed (the schedule of packets still depends on the peers' timing,
//! so a replay reproduces the fault rates and draw order, not the exact interleaving).

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Packets held (delayed) at once; beyond this the relay drops and counts them. 65,536:
/// a few seconds of a fast stream at the delays tests use, and at most 4 GiB of 64 KiB
/// datagrams in the worst case (in practice datagrams are MTU-sized).
const HELD_MAX: usize = 65_536;
/// Largest datagram relayed.
const DATAGRAM_MAX: usize = 65_535;
/// Below this wait the relay naps in short sleeps instead of `poll`'s millisecond ticks.
const NAP: Duration = Duration::from_micros(50);
/// Socket buffers of the relay's sockets: 8 MiB holds about 10,000 small datagrams, tens
/// of milliseconds of a fast stream, so a relay thread descheduled on a busy host does
/// not add loss of its own.
const SOCKET_BUFFER: usize = 8 << 20;

/// Enlarges a socket's buffers (beyond `rmem_max` when root; best effort).
fn enlarge_buffers(socket: &UdpSocket) {
    use rustix::net::sockopt;
    if sockopt::set_socket_recv_buffer_size_force(socket, SOCKET_BUFFER).is_err() {
        let _ = sockopt::set_socket_recv_buffer_size(socket, SOCKET_BUFFER);
    }
    let _ = sockopt::set_socket_send_buffer_size(socket, SOCKET_BUFFER);
}

/// What the relay does to each packet (both directions).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RelayFaults {
    /// Probability that a packet is dropped.
    pub loss: f64,
    /// Probability that a packet is sent twice (the copy with its own delay).
    pub duplicate: f64,
    /// Shortest delay added.
    pub delay_min: Duration,
    /// Longest delay added (uniform between the two).
    pub delay_max: Duration,
    /// Probability that a packet is held back by up to `reorder_delay_max` more, so later
    /// packets overtake it.
    pub reorder: f64,
    /// Longest extra hold of a reordered packet.
    pub reorder_delay_max: Duration,
}

impl Default for RelayFaults {
    /// A clean relay: forwards everything at once.
    fn default() -> Self {
        Self {
            loss: 0.0,
            duplicate: 0.0,
            delay_min: Duration::ZERO,
            delay_max: Duration::ZERO,
            reorder: 0.0,
            reorder_delay_max: Duration::ZERO,
        }
    }
}

impl RelayFaults {
    /// The faults issue 3 asks of the relay tests: 5% duplicated, 5% reordered (held up to
    /// 2 ms), every packet delayed 50–300 µs, nothing lost (the kernel makes the loss).
    pub fn dup_reorder_delay() -> Self {
        Self {
            loss: 0.0,
            duplicate: 0.05,
            delay_min: Duration::from_micros(50),
            delay_max: Duration::from_micros(300),
            reorder: 0.05,
            reorder_delay_max: Duration::from_millis(2),
        }
    }
}

/// Where the relay listens and forwards, and its faults.
#[derive(Clone, Debug)]
pub struct RelayConfig {
    /// Address clients send to.
    pub listen: SocketAddr,
    /// Address everything is forwarded to.
    pub upstream: SocketAddr,
    /// Faults applied to every packet.
    pub faults: RelayFaults,
    /// Seed of every random choice.
    pub seed: u64,
}

/// What the relay did so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RelayCounters {
    /// Packets received from either side.
    pub received: u64,
    /// Packets sent on (duplicates count again).
    pub forwarded: u64,
    /// Dropped at random.
    pub lost: u64,
    /// Extra copies made.
    pub duplicated: u64,
    /// Held back to be overtaken.
    pub reordered: u64,
    /// Dropped because too many packets were held.
    pub overflow: u64,
}

#[derive(Default)]
struct SharedCounters {
    received: AtomicU64,
    forwarded: AtomicU64,
    lost: AtomicU64,
    duplicated: AtomicU64,
    reordered: AtomicU64,
    overflow: AtomicU64,
}

/// A running relay; dropping it stops the relay thread.
pub struct Relay {
    addr: SocketAddr,
    seed: u64,
    stop: Arc<AtomicBool>,
    counters: Arc<SharedCounters>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for Relay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relay").field("addr", &self.addr).field("seed", &self.seed).finish()
    }
}

/// Where a held packet goes.
#[derive(Clone, Copy)]
enum Direction {
    /// From a client to upstream, through the client's upstream socket (index).
    Up(usize),
    /// From upstream back to a client, through the listening socket.
    Down(SocketAddr),
}

struct Held {
    due: Instant,
    order: u64,
    direction: Direction,
    data: Vec<u8>,
}

impl PartialEq for Held {
    fn eq(&self, other: &Self) -> bool {
        (self.due, self.order) == (other.due, other.order)
    }
}
impl Eq for Held {}
impl PartialOrd for Held {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Held {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.due, self.order).cmp(&(other.due, other.order))
    }
}

struct Worker {
    front: UdpSocket,
    upstream: SocketAddr,
    /// Per client: its address and its upstream socket.
    clients: Vec<(SocketAddr, UdpSocket)>,
    by_client: HashMap<SocketAddr, usize>,
    faults: RelayFaults,
    rng: ChaCha8Rng,
    held: BinaryHeap<Reverse<Held>>,
    order: u64,
    counters: Arc<SharedCounters>,
}

impl Relay {
    /// Binds the listening address and starts the relay thread. Prints the seed to stderr.
    pub fn start(config: RelayConfig) -> std::io::Result<Self> {
        let front = UdpSocket::bind(config.listen)?;
        front.set_nonblocking(true)?;
        enlarge_buffers(&front);
        let addr = front.local_addr()?;
        eprintln!(
            "ulnet-relay {addr} -> {}: seed={} faults={:?} (replay with seed {})",
            config.upstream, config.seed, config.faults, config.seed
        );
        tracing::info!(seed = config.seed, "relay {addr} -> {} started", config.upstream);
        let stop = Arc::new(AtomicBool::new(false));
        let counters = Arc::new(SharedCounters::default());
        let mut worker = Worker {
            front,
            upstream: config.upstream,
            clients: Vec::new(),
            by_client: HashMap::new(),
            faults: config.faults,
            rng: ChaCha8Rng::seed_from_u64(config.seed),
            held: BinaryHeap::new(),
            order: 0,
            counters: counters.clone(),
        };
        let s = stop.clone();
        let thread = std::thread::Builder::new().name("ulnet-relay".into()).spawn(move || worker.run(&s))?;
        Ok(Relay { addr, seed: config.seed, stop, counters, thread: Some(thread) })
    }

    /// The address clients send to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The seed this relay draws its faults from.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// What the relay did so far.
    pub fn counters(&self) -> RelayCounters {
        let c = &self.counters;
        RelayCounters {
            received: c.received.load(Ordering::Relaxed),
            forwarded: c.forwarded.load(Ordering::Relaxed),
            lost: c.lost.load(Ordering::Relaxed),
            duplicated: c.duplicated.load(Ordering::Relaxed),
            reordered: c.reordered.load(Ordering::Relaxed),
            overflow: c.overflow.load(Ordering::Relaxed),
        }
    }

    /// Stops the relay thread and waits for it.
    pub fn stop(mut self) -> RelayCounters {
        self.shutdown();
        self.counters()
    }

    fn shutdown(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn uniform(rng: &mut ChaCha8Rng, lo: Duration, hi: Duration) -> Duration {
    if hi <= lo {
        return lo;
    }
    lo + Duration::from_nanos(rng.gen_range(0..=(hi - lo).as_nanos() as u64))
}

impl Worker {
    fn run(&mut self, stop: &AtomicBool) {
        let mut buf = vec![0u8; DATAGRAM_MAX];
        while !stop.load(Ordering::Relaxed) {
            let mut moved = self.receive_all(&mut buf);
            moved += self.release_due(Instant::now());
            if moved > 0 {
                continue;
            }
            let wait = self.held.peek().map(|Reverse(h)| h.due.saturating_duration_since(Instant::now()));
            match wait {
                Some(w) if w < Duration::from_millis(1) => std::thread::sleep(w.min(NAP)),
                other => {
                    let ms = other.map_or(20, |w| w.as_millis().min(20) as i32);
                    let mut fds = Vec::with_capacity(1 + self.clients.len());
                    fds.push(rustix::event::PollFd::new(&self.front, rustix::event::PollFlags::IN));
                    for (_, s) in &self.clients {
                        fds.push(rustix::event::PollFd::from_borrowed_fd(s.as_fd(), rustix::event::PollFlags::IN));
                    }
                    let _ = rustix::event::poll(&mut fds, ms);
                }
            }
        }
    }

    /// Reads everything waiting on every socket into the held queue.
    fn receive_all(&mut self, buf: &mut [u8]) -> usize {
        let mut n = 0;
        while let Ok((len, from)) = self.front.recv_from(buf) {
            let index = match self.by_client.get(&from) {
                Some(&i) => i,
                None => match self.new_client(from) {
                    Ok(i) => i,
                    Err(e) => {
                        tracing::warn!("relay: cannot open an upstream socket for {from}: {e}");
                        continue;
                    }
                },
            };
            self.admit(Direction::Up(index), &buf[..len]);
            n += 1;
        }
        for i in 0..self.clients.len() {
            while let Ok(len) = self.clients[i].1.recv(buf) {
                let to = self.clients[i].0;
                self.admit(Direction::Down(to), &buf[..len]);
                n += 1;
            }
        }
        n
    }

    fn new_client(&mut self, from: SocketAddr) -> std::io::Result<usize> {
        let local: SocketAddr = if self.upstream.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" }.parse().expect("valid");
        let s = UdpSocket::bind(local)?;
        s.connect(self.upstream)?;
        s.set_nonblocking(true)?;
        enlarge_buffers(&s);
        self.clients.push((from, s));
        self.by_client.insert(from, self.clients.len() - 1);
        Ok(self.clients.len() - 1)
    }

    /// Applies the faults to one packet and queues its copies.
    fn admit(&mut self, direction: Direction, data: &[u8]) {
        let c = &self.counters;
        c.received.fetch_add(1, Ordering::Relaxed);
        let f = self.faults;
        if f.loss > 0.0 && self.rng.gen_bool(f.loss) {
            c.lost.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let copies = if f.duplicate > 0.0 && self.rng.gen_bool(f.duplicate) { 2 } else { 1 };
        if copies == 2 {
            c.duplicated.fetch_add(1, Ordering::Relaxed);
        }
        let now = Instant::now();
        for _ in 0..copies {
            if self.held.len() >= HELD_MAX {
                c.overflow.fetch_add(1, Ordering::Relaxed);
                return;
            }
            let mut delay = uniform(&mut self.rng, f.delay_min, f.delay_max);
            if f.reorder > 0.0 && self.rng.gen_bool(f.reorder) {
                delay += uniform(&mut self.rng, Duration::ZERO, f.reorder_delay_max);
                c.reordered.fetch_add(1, Ordering::Relaxed);
            }
            self.order += 1;
            self.held.push(Reverse(Held { due: now + delay, order: self.order, direction, data: data.to_vec() }));
        }
    }

    /// Sends every held packet that is due.
    fn release_due(&mut self, now: Instant) -> usize {
        let mut n = 0;
        while self.held.peek().is_some_and(|Reverse(h)| h.due <= now) {
            let Reverse(h) = self.held.pop().expect("peeked");
            let sent = match h.direction {
                Direction::Up(i) => self.clients[i].1.send(&h.data),
                Direction::Down(to) => self.front.send_to(&h.data, to),
            };
            match sent {
                Ok(_) => {
                    self.counters.forwarded.fetch_add(1, Ordering::Relaxed);
                }
                // A full socket buffer or an unreachable peer is loss, as on a real link.
                Err(e) => tracing::debug!("relay: send failed: {e}"),
            }
            n += 1;
        }
        n
    }
}
