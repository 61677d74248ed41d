//! Connecting the nodes of a river: a full mesh of ulnet channels.
//!
//! Over TCP it is bootstrapped through node 0, whose address is the only one known in
//! advance (each node other than 0 listens on a port the kernel picks):
//!
//! ```text
//!  node r > 0                          node 0 (listens at the coordinator address)
//!    listens at its own address
//!    | -- Hello(r, my address) ------->  |   waits for a Hello from every node
//!    | <-- Control(PEERS, addresses) --  |   then sends every node the address table
//!    connects to nodes 1..r (Hello(r)), accepts nodes r+1.. (identified by their Hello)
//! ```
//!
//! Over shared memory every address is a rendezvous name derived from the job
//! (`ulnet-river-JOB-RANK`), so there is no table: each node listens, connects to every
//! lower rank at once and accepts every higher one, in one round of handshakes.

use crate::error::RiverError;
use crate::river::RiverConfig;
use crate::wire::{Header, Kind, HEADER_LEN};
use std::time::{Duration, Instant};
use ulnet_core::transport::shm::connect::connect_retry_as;
use ulnet_core::transport::shm::{ShmChannel, ShmConfig, ShmGeometry};
use ulnet_core::{ChannelId, Endpoint, EndpointConfig, Event, NodeId, SendOutcome, Transport};

/// Control tag of the address table.
const PEERS_TAG: u32 = 0x7065_6572;

/// Which transport the mesh uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MeshTransport {
    /// Shared memory (all nodes on this host): rendezvous names derived from the job.
    Shm,
    /// TCP: node 0 listens at the coordinator address; the others listen on `bind_host`
    /// (port chosen by the kernel) and advertise `advertise_host`.
    Tcp {
        /// `host:port` of node 0.
        coordinator: String,
        /// Address to listen on (for nodes other than 0).
        bind_host: String,
        /// Host name or address the others use to reach this node.
        advertise_host: String,
    },
}

/// How to connect a node into the mesh.
#[derive(Clone, Debug)]
pub struct MeshConfig {
    /// A name unique to this run (shared-memory rendezvous names derive from it).
    pub job: String,
    /// This node's rank.
    pub rank: usize,
    /// Number of nodes.
    pub size: usize,
    /// The transport.
    pub transport: MeshTransport,
    /// Longest to wait for the other nodes to show up. 60 s: remote launchers (ssh,
    /// srun) can take seconds per host.
    pub timeout: Duration,
    /// The cluster secret for TCP and shared-memory channels.
    pub secret: Vec<u8>,
    /// Sizes of each shared-memory channel's receive mapping (see [`shm_geometry_for`]).
    pub shm_geometry: ShmGeometry,
}

/// A shared-memory geometry just large enough for a river's traffic: the receive buffers
/// for every chunk a sender may have outstanding, plus eight for control messages. Every
/// buffer of a mapping is touched (and its pages made and zeroed) in the first rounds of
/// use, so a channel larger than the credit window only costs memory and page faults.
pub fn shm_geometry_for(river: &RiverConfig) -> ShmGeometry {
    let buffer_size = ShmGeometry::default().buffer_size;
    let per_chunk = river.chunk_bytes().div_ceil(buffer_size);
    ShmGeometry { buffer_count: river.credits as usize * per_chunk + 8, ..ShmGeometry::default() }
}

impl MeshConfig {
    /// A shared-memory mesh on this host.
    pub fn shm(job: &str, rank: usize, size: usize) -> Self {
        MeshConfig {
            job: job.into(),
            rank,
            size,
            transport: MeshTransport::Shm,
            timeout: Duration::from_secs(60),
            secret: Vec::new(),
            shm_geometry: shm_geometry_for(&RiverConfig::default()),
        }
    }
}

fn hello(rank: usize, size: usize, addr: &str) -> Vec<u8> {
    let mut m = Header { kind: Kind::Hello, aux: rank as u32, value: size as u64 }.encode().to_vec();
    m.extend_from_slice(addr.as_bytes());
    m
}

fn send_all(ep: &mut Endpoint, ch: ChannelId, msg: &[u8], deadline: Instant) -> Result<(), RiverError> {
    loop {
        match ep.send(ch, &[msg]) {
            Ok(SendOutcome::NoResource) if Instant::now() < deadline => {
                ep.poll(0, |_| {});
                std::thread::sleep(Duration::from_millis(1));
            }
            Ok(SendOutcome::NoResource) => {
                return Err(RiverError::Timeout { what: "room to send a hello".into(), secs: 0.0 })
            }
            Ok(_) => return Ok(()),
            Err(e) => return Err(RiverError::Send { node: usize::MAX, source: e }),
        }
    }
}

/// Receives exactly one whole message on `ch` (no more: what follows stays queued).
fn recv_one(ep: &mut Endpoint, ch: ChannelId, deadline: Instant, what: &str) -> Result<Vec<u8>, RiverError> {
    let mut buf = Vec::new();
    loop {
        let mut done = false;
        let mut down = None;
        ep.poll_channel(ch, 1, |e| match e {
            Event::Message { data, message_len, offset, .. } => {
                if offset == 0 {
                    buf.clear();
                }
                buf.extend_from_slice(data);
                done = offset + data.len() as u64 == message_len;
            }
            Event::ChannelDown { error, .. } => down = Some(error),
            Event::SendComplete { .. } => {}
        });
        if done {
            return Ok(buf);
        }
        if let Some(e) = down {
            return Err(RiverError::NodeFailed { node: usize::MAX, reason: format!("{what}: {e}") });
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(RiverError::Timeout { what: what.into(), secs: 0.0 });
        }
        ep.wait(Some(left.min(Duration::from_millis(50)))).map_err(|e| RiverError::io("waiting", e))?;
    }
}

fn parse_hello(msg: &[u8], size: usize) -> Result<(usize, String), RiverError> {
    let h = Header::decode(msg, msg.len() as u64, 1)
        .map_err(|e| RiverError::Protocol { node: usize::MAX, reason: e.to_string() })?;
    if h.kind != Kind::Hello || h.value != size as u64 || h.aux as usize >= size {
        return Err(RiverError::Protocol {
            node: h.aux as usize,
            reason: format!("bad hello (kind {:?}, rank {}, size {} where we have {size})", h.kind, h.aux, h.value),
        });
    }
    Ok((h.aux as usize, String::from_utf8_lossy(&msg[HEADER_LEN..]).into()))
}

fn my_address(cfg: &MeshConfig, rank: usize) -> String {
    match &cfg.transport {
        MeshTransport::Shm => format!("ulnet-river-{}-{rank}", cfg.job),
        MeshTransport::Tcp { coordinator, .. } if rank == 0 => coordinator.clone(),
        MeshTransport::Tcp { .. } => String::new(),
    }
}

/// Connects this node to every other; returns the endpoint and the channel to each node
/// (`None` at this node's own rank).
pub fn connect(cfg: &MeshConfig) -> Result<(Endpoint, Vec<Option<ChannelId>>), RiverError> {
    assert!(cfg.rank < cfg.size, "rank {} of {} nodes", cfg.rank, cfg.size);
    let mut ep_config = EndpointConfig::default();
    ep_config.tcp.secret = cfg.secret.clone();
    ep_config.shm.secret = cfg.secret.clone();
    ep_config.shm.geometry = cfg.shm_geometry;
    let (shm, node) = (ep_config.shm.clone(), ep_config.node_id);
    let mut ep = Endpoint::new(ep_config);
    let peers: Vec<Option<ChannelId>> = vec![None; cfg.size];
    if cfg.size == 1 {
        return Ok((ep, peers));
    }
    match cfg.transport {
        MeshTransport::Shm => connect_shm(cfg, ep, peers, &shm, node),
        MeshTransport::Tcp { .. } => {
            let peers = connect_tcp(cfg, &mut ep, peers)?;
            Ok((ep, peers))
        }
    }
}

/// The shared-memory mesh: every address is known from the job, so each node connects to
/// every lower rank at once (a thread per connection, since a connection completes only
/// when the other side accepts it, and each side accepts in the order connections come)
/// while it accepts every higher rank; each connection starts with a hello naming the
/// connecting rank. One round of handshakes, whatever the number of nodes.
fn connect_shm(
    cfg: &MeshConfig,
    mut ep: Endpoint,
    mut peers: Vec<Option<ChannelId>>,
    shm: &ShmConfig,
    node: NodeId,
) -> Result<(Endpoint, Vec<Option<ChannelId>>), RiverError> {
    let deadline = Instant::now() + cfg.timeout;
    ep.listen_shm(&my_address(cfg, cfg.rank))?;
    let hello_msg = hello(cfg.rank, cfg.size, "");
    let connects: Vec<_> = (0..cfg.rank)
        .map(|j| {
            let (name, shm, hello_msg, timeout) = (my_address(cfg, j), shm.clone(), hello_msg.clone(), cfg.timeout);
            std::thread::Builder::new()
                .name("river-connect".into())
                .spawn(move || -> Result<ShmChannel, RiverError> {
                    let lost = |e: &dyn std::fmt::Display| RiverError::NodeFailed {
                        node: j,
                        reason: format!("connecting to it: {e}"),
                    };
                    let mut ch = connect_retry_as(&name, &shm, node, timeout).map_err(|e| lost(&e))?;
                    match ch.send(&[&hello_msg]) {
                        Ok(SendOutcome::Done | SendOutcome::InProgress(_)) => Ok(ch),
                        Ok(SendOutcome::NoResource) => Err(lost(&"no room for a hello on a new channel")),
                        Err(e) => Err(lost(&e)),
                    }
                })
                .map_err(|e| RiverError::io("starting a connecting thread", e))
        })
        .collect::<Result<_, _>>()?;
    let mut accepted = Vec::with_capacity(cfg.size - cfg.rank - 1);
    for _ in cfg.rank + 1..cfg.size {
        let left = deadline.saturating_duration_since(Instant::now());
        accepted.push(ep.accept(left).map_err(|e| match e {
            ulnet_core::ConnectError::Timeout => RiverError::Timeout {
                what: format!("nodes {}..{} to connect", cfg.rank + 1, cfg.size),
                secs: cfg.timeout.as_secs_f64(),
            },
            e => e.into(),
        })?);
    }
    for (j, thread) in connects.into_iter().enumerate() {
        let ch = thread.join().map_err(|_| RiverError::io("connecting", std::io::Error::other("panicked")))??;
        peers[j] = Some(ep.add_channel(Box::new(ch)));
    }
    for ch in accepted {
        let (rank, _) = parse_hello(&recv_one(&mut ep, ch, deadline, "a hello")?, cfg.size)?;
        if rank <= cfg.rank || peers[rank].is_some() {
            return Err(RiverError::Protocol { node: rank, reason: "a hello from an unexpected rank".into() });
        }
        peers[rank] = Some(ch);
    }
    Ok((ep, peers))
}

/// The TCP mesh, bootstrapped through node 0 (the only address known in advance).
fn connect_tcp(
    cfg: &MeshConfig,
    ep: &mut Endpoint,
    mut peers: Vec<Option<ChannelId>>,
) -> Result<Vec<Option<ChannelId>>, RiverError> {
    let deadline = Instant::now() + cfg.timeout;
    // Listen first, so that no one who learns our address finds nobody there.
    let mut me = my_address(cfg, cfg.rank);
    if let MeshTransport::Tcp { coordinator, bind_host, advertise_host } = &cfg.transport {
        if cfg.rank == 0 {
            let port = coordinator.rsplit_once(':').map_or("0", |(_, p)| p);
            ep.listen_tcp(&format!("{bind_host}:{port}"))?;
        } else {
            let bound = ep.listen_tcp(&format!("{bind_host}:0"))?;
            me = format!("{advertise_host}:{}", bound.port());
        }
    }
    // The nodes of a river start together: the one connected to may not listen yet.
    let connect = |ep: &mut Endpoint, addr: &str| -> Result<ChannelId, RiverError> {
        let left = deadline.saturating_duration_since(Instant::now());
        Ok(ep.connect_tcp_retry(addr, left)?)
    };
    let accept_identified = |ep: &mut Endpoint, peers: &mut Vec<Option<ChannelId>>| -> Result<String, RiverError> {
        let left = deadline.saturating_duration_since(Instant::now());
        let ch = ep.accept(left).map_err(|e| match e {
            ulnet_core::ConnectError::Timeout => {
                let missing: Vec<usize> = (0..cfg.size).filter(|&j| j != cfg.rank && peers[j].is_none()).collect();
                RiverError::Timeout { what: format!("nodes {missing:?} to connect"), secs: cfg.timeout.as_secs_f64() }
            }
            e => e.into(),
        })?;
        let (rank, addr) = parse_hello(&recv_one(ep, ch, deadline, "a hello")?, cfg.size)?;
        if rank == cfg.rank || peers[rank].is_some() {
            return Err(RiverError::Protocol { node: rank, reason: "a second hello from the same rank".into() });
        }
        peers[rank] = Some(ch);
        Ok(addr)
    };
    if cfg.rank == 0 {
        let mut table = vec![String::new(); cfg.size];
        table[0] = me.clone();
        for _ in 1..cfg.size {
            let before: Vec<bool> = peers.iter().map(Option::is_some).collect();
            let addr = accept_identified(ep, &mut peers)?;
            let rank = (0..cfg.size).find(|&j| peers[j].is_some() && !before[j]).expect("a new peer");
            table[rank] = addr;
        }
        let payload = table.join("\n");
        let mut msg = Header { kind: Kind::Control, aux: PEERS_TAG, value: payload.len() as u64 }.encode().to_vec();
        msg.extend_from_slice(payload.as_bytes());
        for ch in peers.iter().flatten() {
            send_all(ep, *ch, &msg, deadline)?;
        }
    } else {
        let coordinator = my_address(cfg, 0);
        let to0 = connect(ep, &coordinator)?;
        send_all(ep, to0, &hello(cfg.rank, cfg.size, &me), deadline)?;
        peers[0] = Some(to0);
        let msg = recv_one(ep, to0, deadline, "the address table from node 0")?;
        let h = Header::decode(&msg, msg.len() as u64, 1)
            .map_err(|e| RiverError::Protocol { node: 0, reason: e.to_string() })?;
        if h.kind != Kind::Control || h.aux != PEERS_TAG {
            return Err(RiverError::Protocol { node: 0, reason: "expected the address table".into() });
        }
        let table: Vec<String> = String::from_utf8_lossy(&msg[HEADER_LEN..]).split('\n').map(String::from).collect();
        if table.len() != cfg.size {
            return Err(RiverError::Protocol { node: 0, reason: "address table of the wrong size".into() });
        }
        for (j, addr) in table.iter().enumerate().take(cfg.rank).skip(1) {
            let ch = connect(ep, addr)?;
            send_all(ep, ch, &hello(cfg.rank, cfg.size, &me), deadline)?;
            peers[j] = Some(ch);
        }
        for _ in cfg.rank + 1..cfg.size {
            accept_identified(ep, &mut peers)?;
        }
    }
    Ok(peers)
}
