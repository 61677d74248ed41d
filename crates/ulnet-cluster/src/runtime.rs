//! The thin runtime of `ulnet node`: binds [`Membership`] to a UDP socket and the clock,
//! serves the control plane (ulnet-msg RPC over ulnet's TCP transport, authenticated with
//! the cluster secret) on the same address, exports counters in Prometheus text format
//! over HTTP, keeps durable state in the data directory, and hosts [`Service`]s.
//!
//! Two threads: the membership thread (UDP socket, timers, durable state, events) and the
//! control thread (RPC, services, peer channels). A third, optional, serves metrics.

use crate::control_metrics::{self, ControlCounters};
use crate::events::{MemberState, MembershipEvent};
use crate::freshness::next_incarnation;
use crate::membership::{Counters, Durable, Membership, Status};
use crate::service::{RpcHandler, Service, ServiceContext};
use crate::view::{Member, MemberId, View};
use crate::witness::FileWitness;
use crate::Config;
use serde::Serialize;
use std::collections::HashMap;
use std::io::Write;
use std::net::{SocketAddr, UdpSocket};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use ulnet_core::log_limit::LogLimit;
use ulnet_core::trace::{self, Direction};
use ulnet_core::{ChannelId, Endpoint, EndpointConfig, NodeId};
use ulnet_msg::rpc::{Rpc, RpcConfig};

/// Control-plane method: cluster status as JSON (the `cluster status --json` shape).
/// Method ids are on the wire: append only.
pub const METHOD_STATUS: u16 = 1;
/// Control-plane method: a service message between members (one-way).
pub const METHOD_SERVICE_MESSAGE: u16 = 2;
/// Lowest method id services may register.
pub const METHOD_SERVICE_MIN: u16 = 100;

/// How a node is started.
#[derive(Clone, Debug)]
pub struct NodeConfig {
    /// The node's name.
    pub name: String,
    /// UDP (membership) and TCP (control plane) address.
    pub listen: SocketAddr,
    /// Members or would-be members to join through; none forms a new cluster.
    pub seeds: Vec<SocketAddr>,
    /// Where durable state goes (identity, view, promises); none keeps nothing.
    pub data_dir: Option<PathBuf>,
    /// The cluster secret.
    pub secret: Vec<u8>,
    /// Protocol settings.
    pub protocol: Config,
    /// Append one JSON line per membership event here.
    pub events_json: Option<PathBuf>,
    /// Serve Prometheus counters over HTTP here.
    pub metrics: Option<SocketAddr>,
    /// Directory of the two-node quorum witness (a shared path).
    pub witness_dir: Option<PathBuf>,
}

/// A member as `cluster status` reports it.
#[derive(Clone, Debug, Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct MemberReport {
    /// Its name.
    pub name: String,
    /// Its address.
    pub addr: String,
    /// `alive`, `suspect` or `dead`.
    pub state: String,
}

/// The `cluster status --json` object.
#[derive(Clone, Debug, Serialize, serde::Deserialize, PartialEq, Eq, Default)]
pub struct StatusReport {
    /// The installed view number (0: none).
    pub view: u64,
    /// Members and recently dead members.
    pub members: Vec<MemberReport>,
    /// Whether this node acts as a member of a view with quorum.
    pub quorum: bool,
    /// The reporting node's name.
    pub node: String,
    /// `joining`, `member` or `no_quorum`.
    pub status: String,
}

struct Shared {
    status: Mutex<StatusReport>,
    counters: Mutex<Counters>,
    control: Mutex<ControlCounters>,
    stop: AtomicBool,
}

enum ToControl {
    View(View, bool),
    Event(MembershipEvent),
}

/// A running node.
pub struct Node {
    shared: Arc<Shared>,
    threads: Vec<std::thread::JoinHandle<()>>,
    me: Member,
}

fn ts_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    let _ = getrandom(&mut b);
    u64::from_le_bytes(b)
}

fn getrandom(buf: &mut [u8]) -> std::io::Result<()> {
    use std::io::Read;
    std::fs::File::open("/dev/urandom")?.read_exact(buf)
}

/// Sets aside the node's membership identity kept in `data_dir`, so that its next start
/// joins as a new member (for a node that lost state bound to its identity, such as a
/// service's log). Returns whether there was one.
pub fn forget_identity(data_dir: &std::path::Path) -> std::io::Result<bool> {
    let file = data_dir.join("member.json");
    if !file.exists() {
        return Ok(false);
    }
    let aside = data_dir.join(format!("member.json.forgotten-{}", ts_ms()));
    std::fs::rename(&file, &aside)?;
    std::fs::File::open(data_dir)?.sync_all()?;
    tracing::warn!(file = %aside.display(), "membership identity set aside: this node joins as a new member");
    Ok(true)
}

/// Replaces `member.json` in `dir` with `d`, atomically: a failure (a full disk, say)
/// leaves the previous file whole, and no partial temporary file behind.
fn write_durable(dir: &std::path::Path, d: &Durable) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join("member.json.tmp");
    let written = std::fs::File::create(&tmp).and_then(|mut f| {
        f.write_all(serde_json::to_string(d).map_err(std::io::Error::other)?.as_bytes())?;
        f.sync_all()
    });
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    std::fs::rename(&tmp, dir.join("member.json"))?;
    std::fs::File::open(dir)?.sync_all()
}

/// How long the membership thread waits before it writes its durable state again after
/// the disk refused it: meanwhile nothing leaves (to the others the node has failed), and
/// it takes part again within this long after the disk takes writes.
const DURABLE_RETRY: Duration = Duration::from_secs(1);

impl Node {
    /// Starts the node and its services.
    pub fn start(config: NodeConfig, services: Vec<Box<dyn Service>>) -> std::io::Result<Node> {
        raise_open_file_limit();
        let (socket, ep) = bind_both(config.listen, &config.secret)?;
        let listen = socket.local_addr()?;
        let durable: Option<Durable> = config
            .data_dir
            .as_ref()
            .and_then(|d| std::fs::read_to_string(d.join("member.json")).ok())
            .and_then(|s| serde_json::from_str(&s).ok());
        let seed = random_u64();
        let clock_ns = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
        let incarnation = next_incarnation(durable.as_ref().map(|d| d.incarnation), clock_ns);
        let mut machine = match durable {
            Some(d) if d.me.addr == listen && d.me.name == config.name => {
                let mut seeds = config.seeds.clone();
                if let Some(v) = &d.view {
                    seeds.extend(v.members.iter().map(|m| m.addr).filter(|a| *a != listen));
                }
                Membership::resume(config.protocol.clone(), d, incarnation, &config.secret, seeds, seed)
            }
            _ => {
                let me = Member { id: MemberId(random_u64() | 1), name: config.name.clone(), addr: listen };
                Membership::new(config.protocol.clone(), me, incarnation, &config.secret, config.seeds.clone(), seed)
            }
        };
        if let Some(dir) = &config.witness_dir {
            machine.set_witness(Box::new(FileWitness::new(dir)?));
        }
        let me = machine.me().clone();
        let mut ep = ep;
        let control_waker = ep.waker()?;
        let shared = Arc::new(Shared {
            status: Mutex::new(StatusReport { node: me.name.clone(), status: "joining".into(), ..Default::default() }),
            counters: Mutex::new(Counters::default()),
            control: Mutex::new(ControlCounters::default()),
            stop: AtomicBool::new(false),
        });
        let (to_control, from_membership) = mpsc::channel();
        let mut threads = Vec::new();
        {
            let shared = shared.clone();
            let config = config.clone();
            threads.push(std::thread::Builder::new().name("membership".into()).spawn(move || {
                if let Err(e) = membership_loop(machine, socket, &config, &shared, to_control, control_waker) {
                    tracing::error!("membership thread stopped: {e}");
                }
            })?);
        }
        {
            let shared = shared.clone();
            let me = me.clone();
            let secret = config.secret.clone();
            threads.push(std::thread::Builder::new().name("control".into()).spawn(move || {
                control_loop(ep, me, secret, services, &shared, from_membership);
            })?);
        }
        if let Some(addr) = config.metrics {
            let shared = shared.clone();
            let std_listener = std::net::TcpListener::bind(addr)?;
            // Detached: it waits in accept, and a node that stops need not wait for it.
            std::thread::Builder::new().name("metrics".into()).spawn(move || {
                if let Err(e) = metrics_loop(std_listener, shared) {
                    tracing::warn!("metrics server stopped: {e}");
                }
            })?;
        }
        Ok(Node { shared, threads, me })
    }

    /// This node.
    pub fn me(&self) -> &Member {
        &self.me
    }

    /// The current status report.
    pub fn status(&self) -> StatusReport {
        self.shared.status.lock().expect("status lock").clone()
    }

    /// The membership counters.
    pub fn counters(&self) -> Counters {
        *self.shared.counters.lock().expect("counters lock")
    }

    /// The control plane's counters (connections, handshakes, channels).
    pub fn control_counters(&self) -> ControlCounters {
        *self.shared.control.lock().expect("control counters lock")
    }

    /// Asks the threads to stop.
    pub fn stop(&self) {
        self.shared.stop.store(true, Ordering::Relaxed);
    }

    /// Waits for the threads (after [`Node::stop`], or forever).
    pub fn join(self) {
        for t in self.threads {
            let _ = t.join();
        }
    }
}

/// Raises the soft limit on open files to the hard one, as a daemon that serves many
/// connections should: the control plane keeps up to `TcpConfig::accepted_channels_max`
/// channels (two descriptors each), beyond the common default soft limit of 1,024. A node
/// that still runs out says so in its log and metrics (`ulnet_control_accept_failed_total`).
fn raise_open_file_limit() {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let now = getrlimit(Resource::Nofile);
    if now.current == now.maximum {
        return;
    }
    match setrlimit(Resource::Nofile, Rlimit { current: now.maximum, maximum: now.maximum }) {
        Ok(()) => tracing::debug!("open-file limit raised from {:?} to {:?}", now.current, now.maximum),
        Err(e) => {
            tracing::warn!("open-file limit stays at {:?}: cannot raise it to {:?}: {e}", now.current, now.maximum)
        }
    }
}

/// Binds the membership socket (UDP) and the control plane (TCP) to the same address.
/// With port 0 the kernel picks a UDP port whose TCP twin may be taken (by an outgoing
/// connection, say): then another port is tried.
fn bind_both(listen: SocketAddr, secret: &[u8]) -> std::io::Result<(UdpSocket, Endpoint)> {
    const TRIES: usize = 64;
    let mut last = None;
    for _ in 0..TRIES {
        let socket = UdpSocket::bind(listen)?;
        let addr = socket.local_addr()?;
        let mut endpoint_config = EndpointConfig::default();
        endpoint_config.tcp.secret = secret.to_vec();
        let mut ep = Endpoint::new(endpoint_config);
        match ep.listen_tcp(&addr.to_string()) {
            Ok(_) => return Ok((socket, ep)),
            Err(e) if listen.port() == 0 => last = Some(e),
            Err(e) => return Err(std::io::Error::other(format!("control plane on {addr}: {e}"))),
        }
    }
    Err(std::io::Error::other(format!("no port free for both UDP and TCP after {TRIES} tries: {last:?}")))
}

fn report(machine: &Membership) -> StatusReport {
    let members = machine
        .member_states()
        .into_iter()
        .map(|(m, s)| MemberReport {
            name: m.name,
            addr: m.addr.to_string(),
            state: match s {
                MemberState::Alive => "alive",
                MemberState::Suspect => "suspect",
                MemberState::Dead => "dead",
            }
            .into(),
        })
        .collect();
    StatusReport {
        view: machine.view().map_or(0, |v| v.id),
        members,
        quorum: machine.has_quorum(),
        node: machine.me().name.clone(),
        status: match machine.status() {
            Status::Joining => "joining",
            Status::Member => "member",
            Status::NoQuorum => "no_quorum",
        }
        .into(),
    }
}

fn membership_loop(
    mut machine: Membership,
    socket: UdpSocket,
    config: &NodeConfig,
    shared: &Shared,
    to_control: mpsc::Sender<ToControl>,
    control_waker: ulnet_core::Waker,
) -> std::io::Result<()> {
    let mut events_file = match &config.events_json {
        Some(p) => Some(std::fs::OpenOptions::new().create(true).append(true).open(p)?),
        None => None,
    };
    let mut durable_written = u64::MAX;
    let mut durable_failing = false;
    let mut buf = vec![0u8; crate::wire::PACKET_MAX];
    if let Some(v) = machine.view() {
        // Resuming from the data directory: services get the view the node comes back in
        // (not acting as a member until a regroup confirms it).
        let _ = to_control.send(ToControl::View(v.clone(), false));
        control_waker.wake();
    }
    let own_port = socket.local_addr()?.port();
    machine.start(Instant::now());
    while !shared.stop.load(Ordering::Relaxed) {
        // Durable state first: nothing a promise produced leaves before it is on disk — and
        // while the disk refuses it, nothing leaves at all.
        if let Some(dir) = &config.data_dir {
            if machine.durable_version() != durable_written {
                if let Err(e) = write_durable(dir, &machine.durable()) {
                    if !std::mem::replace(&mut durable_failing, true) {
                        tracing::error!(dir = %dir.display(), "membership stopped: its state cannot be written ({e}); retrying every {} s", DURABLE_RETRY.as_secs());
                    }
                    std::thread::sleep(DURABLE_RETRY);
                    continue;
                }
                if std::mem::take(&mut durable_failing) {
                    tracing::info!(dir = %dir.display(), "membership state written again: the node takes part again");
                }
                durable_written = machine.durable_version();
            }
        }
        while let Some(t) = machine.poll_transmit() {
            match socket.send_to(&t.payload, t.dst) {
                Ok(n) => trace_datagram(Direction::Send, (own_port, t.dst.port()), n),
                Err(e) => tracing::debug!(dst = %t.dst, "send failed: {e}"),
            }
        }
        let mut changed = false;
        while let Some(e) = machine.poll_event() {
            changed = true;
            if let Some(f) = &mut events_file {
                let line = e.to_json_line(ts_ms(), machine.view());
                let _ = writeln!(f, "{line}");
            }
            if let MembershipEvent::ViewInstalled { view } = &e {
                let _ = to_control.send(ToControl::View(view.clone(), true));
            }
            let _ = to_control.send(ToControl::Event(e));
        }
        if changed {
            if let Some(f) = &mut events_file {
                let _ = f.flush();
            }
            control_waker.wake();
        }
        *shared.status.lock().expect("status lock") = report(&machine);
        *shared.counters.lock().expect("counters lock") = machine.counters();
        let now = Instant::now();
        let wait = machine.poll_timeout().map_or(Duration::from_millis(100), |t| t.saturating_duration_since(now));
        socket.set_read_timeout(Some(wait.clamp(Duration::from_micros(200), Duration::from_millis(100))))?;
        match socket.recv_from(&mut buf) {
            Ok((n, from)) => {
                trace_datagram(Direction::Receive, (from.port(), own_port), n);
                machine.handle_datagram(Instant::now(), from, &buf[..n])
            }
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(e) => tracing::debug!("receive failed: {e}"),
        }
        let now = Instant::now();
        if machine.poll_timeout().is_some_and(|t| t <= now) {
            machine.handle_timeout(now);
        }
    }
    Ok(())
}

/// Records a membership datagram in the process's trace (`ULNET_TRACE`), on channel
/// [`TRACE_CHANNEL`]. Nodes are named by their UDP port, the one identity both ends of a
/// datagram know; traces of several nodes join up when each runs with `ULNET_NODE_ID`
/// equal to its port (the node id written in its trace file).
fn trace_datagram(direction: Direction, (src, dst): (u16, u16), len: usize) {
    if trace::enabled() {
        let nodes = (NodeId(u32::from(src)), NodeId(u32::from(dst)));
        trace::record_datagram(direction, nodes, TRACE_CHANNEL, len as u64);
    }
}

/// The channel number of membership datagrams in traces: above any endpoint's channels.
const TRACE_CHANNEL: u32 = u32::MAX;

type Inbox = Arc<Mutex<Vec<(MemberId, u16, Vec<u8>)>>>;
/// Requests for services' `request_methods`: (service, method, payload, answer).
type Requests = Arc<Mutex<Vec<(u16, u16, Vec<u8>, Option<ulnet_msg::rpc::DeferredReply>)>>>;

/// Messages a member that is not connected yet may have waiting, at most; beyond it the
/// oldest are dropped (services tolerate loss: they retransmit what matters).
const PEER_QUEUE_MAX: usize = 4096;
/// First wait before connecting again to a member that could not be reached; doubled up
/// to [`CONNECT_BACKOFF_MAX`].
const CONNECT_BACKOFF_MIN: Duration = Duration::from_millis(50);
/// Longest wait between connection attempts to an unreachable member.
const CONNECT_BACKOFF_MAX: Duration = Duration::from_secs(2);
/// How long one connection attempt (connect and handshake) may take, on the connector
/// thread: a partitioned member costs that thread this long, never the control thread.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How often the control thread looks at its listener while no handshake is in progress
/// (each look is a system call; a peer that connects waits at most this long for its
/// first handshake message to be answered). While handshakes are in progress it looks at
/// every turn, so each finishes as soon as its last message arrives.
const ACCEPT_EVERY: Duration = Duration::from_millis(10);
/// Longest sleep of the control thread (the membership thread wakes it for its news).
const CONTROL_SLEEP_MAX: Duration = Duration::from_millis(200);

/// A member's outgoing channel, or the way to one.
struct Peer {
    channel: Option<ChannelId>,
    connecting: bool,
    retry_at: Instant,
    backoff: Duration,
    waiting: std::collections::VecDeque<(u16, Vec<u8>)>,
}

type Connected = (MemberId, Result<ulnet_core::transport::tcp::TcpChannel, String>);

/// Opens channels to members on its own thread (a connect to a partitioned member blocks
/// until its timeout), handing them to the control thread.
fn connector(
    secret: Vec<u8>,
    requests: mpsc::Receiver<(MemberId, SocketAddr)>,
    done: mpsc::Sender<Connected>,
    waker: ulnet_core::Waker,
) {
    let config = ulnet_core::transport::tcp::TcpConfig { secret, ..Default::default() };
    for (member, addr) in requests {
        let result =
            ulnet_core::transport::tcp::connect(&addr.to_string(), &config, CONNECT_TIMEOUT).map_err(|e| e.to_string());
        if done.send((member, result)).is_err() {
            return;
        }
        waker.wake();
    }
}

fn control_loop(
    mut ep: Endpoint,
    me: Member,
    secret: Vec<u8>,
    mut services: Vec<Box<dyn Service>>,
    shared: &Arc<Shared>,
    from_membership: mpsc::Receiver<ToControl>,
) {
    let waker = match ep.waker() {
        Ok(w) => w,
        Err(e) => {
            tracing::error!("control thread: no waker: {e}");
            return;
        }
    };
    let (connect_tx, connect_rx) = mpsc::channel();
    let (connected_tx, connected_rx) = mpsc::channel::<Connected>();
    {
        let waker = waker.clone();
        let _ = std::thread::Builder::new()
            .name("connector".into())
            .spawn(move || connector(secret, connect_rx, connected_tx, waker));
    }
    let mut rpc = Rpc::new(ep, RpcConfig { workers: 0, ..RpcConfig::default() });
    {
        let shared = shared.clone();
        rpc.register_inline(METHOD_STATUS, move |_req, replier| {
            let json = serde_json::to_vec(&*shared.status.lock().expect("status lock")).unwrap_or_default();
            replier.reply(&[&json]);
        });
    }
    let inbox: Inbox = Arc::new(Mutex::new(Vec::new()));
    {
        let inbox = inbox.clone();
        rpc.register_inline(METHOD_SERVICE_MESSAGE, move |req, _replier| {
            if req.payload.len() >= 10 {
                let service = u16::from_le_bytes([req.payload[0], req.payload[1]]);
                let from = MemberId(u64::from_le_bytes(req.payload[2..10].try_into().expect("8 bytes")));
                inbox.lock().expect("inbox lock").push((from, service, req.payload[10..].to_vec()));
            }
        });
    }
    let requests: Requests = Arc::new(Mutex::new(Vec::new()));
    for s in &mut services {
        for (method, mut handler) in s.rpc_methods() {
            assert!(method >= METHOD_SERVICE_MIN, "service methods start at METHOD_SERVICE_MIN");
            let f: RpcHandler = Box::new(move |p| handler(p));
            let mut f = f;
            rpc.register_inline(method, move |req, replier| match f(req.payload) {
                Ok(body) => replier.reply(&[&body]),
                Err(status) => replier.fail(status),
            });
        }
        let service = s.id();
        for method in s.request_methods() {
            assert!(method >= METHOD_SERVICE_MIN, "service methods start at METHOD_SERVICE_MIN");
            let requests = requests.clone();
            rpc.register_inline(method, move |req, replier| {
                let deferred = replier.defer();
                requests.lock().expect("requests lock").push((service, method, req.payload.to_vec(), deferred));
            });
        }
    }
    let mut view: Option<View> = None;
    let mut quorum = false;
    // This node lost its quorum or was removed since its last view with a quorum: it was cut
    // off from a majority, so its channels to them have most likely sat through the cut.
    let mut cut_off = false;
    let mut peers: HashMap<MemberId, Peer> = HashMap::new();
    let mut outbox = Vec::new();
    let mut replies = Vec::new();
    let mut pending: HashMap<u64, (u16, ulnet_msg::rpc::DeferredReply)> = HashMap::new();
    let mut next_token = 0u64;
    for s in &mut services {
        let mut ctx =
            ServiceContext { me: &me, view: None, quorum, service: s.id(), outbox: &mut outbox, replies: &mut replies };
        s.on_start(waker.clone(), &mut ctx);
    }
    // A service's view of the node for one callback (the borrows end with the callback).
    macro_rules! context {
        ($service:expr) => {
            ServiceContext {
                me: &me,
                view: view.as_ref(),
                quorum,
                service: $service,
                outbox: &mut outbox,
                replies: &mut replies,
            }
        };
    }
    let mut accept_at = Instant::now();
    let mut accept_log = LogLimit::default();
    while !shared.stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        // New channels are rare: look for them now and then, not on every turn, unless
        // handshakes are under way.
        if now >= accept_at || rpc.endpoint().tcp_handshakes_pending() > 0 {
            accept_channels(rpc.endpoint(), &mut accept_log);
        }
        if now >= accept_at {
            *shared.control.lock().expect("control counters lock") = ControlCounters::of(rpc.endpoint());
            accept_at = now + ACCEPT_EVERY;
        }
        let mut down: Vec<ChannelId> = Vec::new();
        rpc.poll(1024, |e| {
            if let ulnet_msg::rpc::RpcEvent::ChannelDown { channel, .. } = e {
                down.push(channel);
            }
        });
        for peer in peers.values_mut() {
            if peer.channel.is_some_and(|c| down.contains(&c)) {
                peer.channel = None;
            }
        }
        for (member, result) in connected_rx.try_iter() {
            let Some(peer) = peers.get_mut(&member) else { continue };
            peer.connecting = false;
            match result {
                Ok(channel) => {
                    let c = rpc.endpoint().add_channel(Box::new(channel));
                    peer.channel = Some(c);
                    peer.backoff = CONNECT_BACKOFF_MIN;
                }
                Err(e) => {
                    tracing::debug!(%member, "no channel: {e}");
                    peer.retry_at = Instant::now() + peer.backoff;
                    peer.backoff = (peer.backoff * 2).min(CONNECT_BACKOFF_MAX);
                    peer.waiting.clear();
                }
            }
        }
        for msg in from_membership.try_iter() {
            for s in &mut services {
                let mut ctx = context!(s.id());
                match &msg {
                    ToControl::View(v, q) => {
                        ctx.view = Some(v);
                        ctx.quorum = *q;
                        s.on_view(v, &mut ctx)
                    }
                    ToControl::Event(e) => s.on_event(e, &mut ctx),
                }
            }
            match msg {
                ToControl::View(v, q) => {
                    let ep = rpc.endpoint();
                    peers.retain(|id, peer| {
                        let keep = v.contains(*id);
                        if let Some(c) = peer.channel.filter(|_| !keep) {
                            ep.abort(c);
                        }
                        keep
                    });
                    if q && cut_off {
                        reconnect_all(ep, &mut peers);
                        cut_off = false;
                    }
                    view = Some(v);
                    quorum = q;
                }
                ToControl::Event(MembershipEvent::QuorumLost { .. } | MembershipEvent::Removed { .. }) => {
                    quorum = false;
                    cut_off = true;
                }
                ToControl::Event(_) => {}
            }
        }
        let arrived = std::mem::take(&mut *inbox.lock().expect("inbox lock"));
        for (from, service, data) in arrived {
            if let Some(s) = services.iter_mut().find(|s| s.id() == service) {
                let mut ctx = context!(service);
                s.on_message(from, &data, &mut ctx);
            }
        }
        let asked = std::mem::take(&mut *requests.lock().expect("requests lock"));
        for (service, method, payload, deferred) in asked {
            let token = next_token;
            next_token += 1;
            if let Some(d) = deferred {
                pending.insert(token, (service, d));
            }
            if let Some(s) = services.iter_mut().find(|s| s.id() == service) {
                let mut ctx = context!(service);
                s.on_request(method, &payload, crate::service::ReplyToken(token), &mut ctx);
            }
        }
        let now = Instant::now();
        for s in &mut services {
            let mut ctx = context!(s.id());
            s.on_tick(now, &mut ctx);
        }
        send_out(&mut rpc, &me, view.as_ref(), &mut peers, &connect_tx, &mut outbox, &mut replies, &mut pending);
        let now = Instant::now();
        for s in &mut services {
            let mut ctx = context!(s.id());
            s.on_sent(now, &mut ctx);
        }
        if !outbox.is_empty() || !replies.is_empty() {
            send_out(&mut rpc, &me, view.as_ref(), &mut peers, &connect_tx, &mut outbox, &mut replies, &mut pending);
        }
        // Pending replies of requests whose answer will never come (a service dropped the
        // token) would grow forever: the caller's deadline ends them; forget the oldest.
        if pending.len() > 1 << 16 {
            let oldest = *pending.keys().min().expect("not empty");
            pending.remove(&oldest);
        }
        let backlog = peers.values().any(|p| p.channel.is_some() && !p.waiting.is_empty());
        let wake_at = services.iter().filter_map(|s| s.poll_timeout()).chain(rpc.endpoint().accept_timeout()).min();
        let now = Instant::now();
        let sleep = match wake_at {
            _ if backlog => Duration::from_millis(1),
            Some(t) => t.saturating_duration_since(now).min(CONTROL_SLEEP_MAX),
            None => Duration::from_millis(20),
        };
        if !sleep.is_zero() && inbox.lock().expect("inbox lock").is_empty() {
            // Sub-millisecond waits round up: waking early costs a turn of the loop.
            let _ = rpc.endpoint().wait(Some(sleep.max(Duration::from_millis(1))));
        }
    }
}

/// Takes the channels whose handshakes finished (the control plane's endpoint never blocks
/// in them: strangers and slow clients are counted and closed by its listener).
fn accept_channels(ep: &mut Endpoint, log: &mut LogLimit) {
    loop {
        match ep.try_accept() {
            Ok(Some(_)) => {}
            Ok(None) => return,
            Err(e) => {
                if let Some(unsaid) = log.allow(Instant::now()) {
                    tracing::error!("control plane: cannot accept: {e} ({unsaid} more since the last line)");
                }
                return;
            }
        }
    }
}

/// The cut that isolated this node has healed (it is in a view with a quorum again): its
/// channels to the others were made before the cut, so a TCP connection whose segments were
/// dropped waits for its retransmission timer, backed off exponentially to seconds during
/// the cut, before it moves again, and then delivers everything queued behind it — messages
/// the services have resent since. New channels instead: the old ones are aborted (their
/// queues dropped) and each peer is connected again at its next message. The stall this
/// prevents: a registry locker elected just after a 2|3 heal could not reach its voters for
/// a second.
fn reconnect_all(ep: &mut Endpoint, peers: &mut HashMap<MemberId, Peer>) {
    let now = Instant::now();
    let mut aborted = 0;
    for peer in peers.values_mut() {
        if let Some(c) = peer.channel.take() {
            ep.abort(c);
            aborted += 1;
        }
        peer.waiting.clear();
        peer.retry_at = now;
        peer.backoff = CONNECT_BACKOFF_MIN;
    }
    tracing::info!(aborted, "back in a view with a quorum: channels made before the cut replaced by new ones");
}

/// Answers the requests the hooks replied to and writes the messages they sent: to members
/// with a channel at once (as far as the channel takes them), the others queued while a
/// channel is opened in the background.
#[allow(clippy::too_many_arguments)]
fn send_out(
    rpc: &mut Rpc,
    me: &Member,
    view: Option<&View>,
    peers: &mut HashMap<MemberId, Peer>,
    connect_tx: &mpsc::Sender<(MemberId, SocketAddr)>,
    outbox: &mut Vec<(MemberId, u16, Vec<u8>)>,
    replies: &mut Vec<(crate::service::ReplyToken, Result<Vec<u8>, ulnet_msg::wire::Status>)>,
    pending: &mut HashMap<u64, (u16, ulnet_msg::rpc::DeferredReply)>,
) {
    let now = Instant::now();
    for (token, result) in replies.drain(..) {
        if let Some((_, deferred)) = pending.remove(&token.0) {
            match &result {
                Ok(body) => rpc.reply_later(deferred, Ok(&[body])),
                Err(status) => rpc.reply_later(deferred, Err(*status)),
            }
        }
    }
    for (to, service, data) in outbox.drain(..) {
        let Some(member) = view.as_ref().and_then(|v| v.member(to)).cloned() else { continue };
        let peer = peers.entry(to).or_insert_with(|| Peer {
            channel: None,
            connecting: false,
            retry_at: now,
            backoff: CONNECT_BACKOFF_MIN,
            waiting: std::collections::VecDeque::new(),
        });
        if peer.channel.is_none() {
            if !peer.connecting && peer.retry_at <= now {
                peer.connecting = true;
                let _ = connect_tx.send((to, member.addr));
            }
            if peer.connecting {
                if peer.waiting.len() >= PEER_QUEUE_MAX {
                    peer.waiting.pop_front();
                }
                peer.waiting.push_back((service, data));
            }
            continue;
        }
        peer.waiting.push_back((service, data));
    }
    for peer in peers.values_mut() {
        let Some(channel) = peer.channel else { continue };
        while let Some((service, data)) = peer.waiting.front() {
            let mut header = [0u8; 10];
            header[..2].copy_from_slice(&service.to_le_bytes());
            header[2..].copy_from_slice(&me.id.0.to_le_bytes());
            match rpc.one_way(channel, METHOD_SERVICE_MESSAGE, &[&header, data]) {
                Ok(ulnet_core::SendOutcome::NoResource) => break,
                Ok(_) => {
                    peer.waiting.pop_front();
                }
                Err(e) => {
                    tracing::debug!("service message not sent: {e}");
                    peer.channel = None;
                    peer.waiting.clear();
                    break;
                }
            }
        }
    }
    rpc.endpoint().flush_sends();
}

/// The counters in Prometheus text exposition format.
pub fn prometheus_text(c: &Counters, status: &StatusReport) -> String {
    let rows: [(&str, &str, u64); 19] = [
        ("packets_sent_total", "Membership datagrams sent.", c.packets_sent),
        ("heartbeats_sent_total", "Heartbeat and gossip datagrams sent.", c.heartbeats_sent),
        ("packets_received_total", "Membership datagrams received and authenticated.", c.packets_received),
        ("dropped_auth_total", "Datagrams dropped: failed authentication.", c.dropped_auth),
        ("dropped_malformed_total", "Datagrams dropped: malformed.", c.dropped_malformed),
        ("dropped_replayed_total", "Datagrams dropped: replayed or duplicated.", c.dropped_replayed),
        (
            "dropped_old_incarnation_total",
            "Datagrams dropped: made by an earlier process of their sender.",
            c.dropped_old_incarnation,
        ),
        ("dropped_unconfirmed_total", "Datagrams dropped: not made for this process.", c.dropped_unconfirmed),
        ("challenges_sent_total", "Challenges sent for datagrams not made for this process.", c.challenges_sent),
        ("incarnations_renewed_total", "Incarnations renewed: the table of senders was full.", c.incarnations_renewed),
        ("ignored_total", "Authenticated datagrams ignored.", c.ignored),
        ("transmit_overflow_total", "Datagrams dropped: transmit queue full.", c.transmit_overflow),
        ("event_overflow_total", "Events dropped: application did not poll.", c.event_overflow),
        ("regroups_started_total", "Regroups proposed by this node.", c.regroups_started),
        ("regroups_false_alarm_total", "Regroups that found every member.", c.regroups_false_alarm),
        ("regroups_failed_total", "Regroups that failed or were overtaken.", c.regroups_failed),
        ("views_installed_total", "Views installed.", c.views_installed),
        ("suspicions_total", "Members this node started to suspect.", c.suspicions),
        ("joins_sponsored_total", "Joins this node sponsored.", c.joins_sponsored),
    ];
    let mut out = String::new();
    for (name, help, value) in rows {
        out += &format!("# HELP ulnet_membership_{name} {help}\n# TYPE ulnet_membership_{name} counter\nulnet_membership_{name} {value}\n");
    }
    out += &format!(
        "# HELP ulnet_membership_view Installed view number.\n# TYPE ulnet_membership_view gauge\nulnet_membership_view {}\n",
        status.view
    );
    out += &format!(
        "# HELP ulnet_membership_quorum Whether this node acts as a member of a view with quorum.\n# TYPE ulnet_membership_quorum gauge\nulnet_membership_quorum {}\n",
        u8::from(status.quorum)
    );
    out
}

fn metrics_loop(listener: std::net::TcpListener, shared: Arc<Shared>) -> std::io::Result<()> {
    use http_body_util::Full;
    use hyper::body::Bytes;
    use hyper::service::service_fn;
    use hyper::{Request, Response};
    use hyper_util::rt::TokioIo;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_io().enable_time().build()?;
    runtime.block_on(async move {
        listener.set_nonblocking(true)?;
        let listener = tokio::net::TcpListener::from_std(listener)?;
        let mut accept_log = LogLimit::default();
        while !shared.stop.load(Ordering::Relaxed) {
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of descriptors, most likely: the scrape waits in the queue until
                    // the node has one again; the server goes on.
                    if let Some(unsaid) = accept_log.allow(Instant::now()) {
                        tracing::warn!("metrics server: cannot accept: {e} ({unsaid} more since the last line)");
                    }
                    tokio::time::sleep(ulnet_core::transport::tcp::ACCEPT_PAUSE).await;
                    continue;
                }
            };
            let shared = shared.clone();
            tokio::task::spawn(async move {
                let service = service_fn(move |_req: Request<hyper::body::Incoming>| {
                    let mut text = prometheus_text(
                        &shared.counters.lock().expect("counters lock"),
                        &shared.status.lock().expect("status lock"),
                    );
                    text += &control_metrics::prometheus_text(&shared.control.lock().expect("control counters lock"));
                    async move {
                        Ok::<_, std::convert::Infallible>(
                            Response::builder()
                                .header("content-type", "text/plain; version=0.0.4")
                                .body(Full::new(Bytes::from(text)))
                                .expect("static response parts"),
                        )
                    }
                });
                let _ =
                    hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
            });
        }
        Ok(())
    })
}

/// Asks the node at `addr` for its status over the control plane.
pub fn query_status(addr: &str, secret: &[u8], timeout: Duration) -> Result<StatusReport, String> {
    let mut endpoint_config = EndpointConfig::default();
    endpoint_config.tcp.secret = secret.to_vec();
    let mut ep = Endpoint::new(endpoint_config);
    let ch = ep.connect_tcp(addr, timeout).map_err(|e| format!("cannot connect to {addr}: {e}"))?;
    let mut rpc = Rpc::new(ep, RpcConfig { workers: 0, ..RpcConfig::default() });
    match rpc.call(ch, METHOD_STATUS, &[], Some(timeout)).map_err(|e| e.to_string())? {
        ulnet_msg::rpc::CallOutcome::Sent(_) => {}
        ulnet_msg::rpc::CallOutcome::NoResource => return Err("no room to send".into()),
    }
    let deadline = Instant::now() + timeout;
    let mut result = None;
    while result.is_none() && Instant::now() < deadline {
        rpc.poll(16, |e| match e {
            ulnet_msg::rpc::RpcEvent::Reply { data, .. } => {
                result = Some(
                    serde_json::from_slice::<StatusReport>(data)
                        .map_err(|e| format!("{addr} answered with a status that does not decode: {e}")),
                )
            }
            ulnet_msg::rpc::RpcEvent::Failed { error, .. } => result = Some(Err(error.to_string())),
            ulnet_msg::rpc::RpcEvent::ChannelDown { error, .. } => result = Some(Err(error.to_string())),
        });
        if result.is_none() {
            let _ = rpc.endpoint().wait(Some(Duration::from_millis(10)));
        }
    }
    result
        .unwrap_or_else(|| Err(format!("no answer from {addr} within {timeout:?}: the node is overloaded or stopped")))
}
