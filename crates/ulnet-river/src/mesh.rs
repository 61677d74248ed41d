//! Connecting the nodes of a river: a full mesh of ulnet channels, bootstrapped through
//! node 0, whose address is the only one known in advance.
//!
//! ```text
//!  node r > 0                          node 0 (listens at the coordinator address)
//!    listens at its own address
//!    | -- Hello(r, my address) ------->  |   waits for a Hello from every node
//!    | <-- Control(PEERS, addresses) --  |   then sends every node the address table
//!    connects to nodes 1..r (Hello(r)), accepts nodes r+1.. (identified by their Hello)
//! ```
//!
//! Over shared memory an address is a rendezvous name (`JOB-RANK`); over TCP it is
//! `host:port`, with each node other than 0 listening on a port the kernel picks.

use crate::error::RiverError;
use crate::wire::{Header, Kind, HEADER_LEN};
use std::time::{Duration, Instant};
use ulnet_core::{ChannelId, Endpoint, EndpointConfig, Event, SendOutcome};

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
    /// The cluster secret for TCP channels.
    pub secret: Vec<u8>,
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
    let mut ep = Endpoint::new(ep_config);
    let mut peers: Vec<Option<ChannelId>> = vec![None; cfg.size];
    if cfg.size == 1 {
        return Ok((ep, peers));
    }
    let deadline = Instant::now() + cfg.timeout;
    let tcp = matches!(cfg.transport, MeshTransport::Tcp { .. });
    // Listen first, so that no one who learns our address finds nobody there.
    let mut me = my_address(cfg, cfg.rank);
    match &cfg.transport {
        MeshTransport::Shm => ep.listen_shm(&me)?,
        MeshTransport::Tcp { coordinator, bind_host, advertise_host } => {
            if cfg.rank == 0 {
                let port = coordinator.rsplit_once(':').map_or("0", |(_, p)| p);
                ep.listen_tcp(&format!("{bind_host}:{port}"))?;
            } else {
                let bound = ep.listen_tcp(&format!("{bind_host}:0"))?;
                me = format!("{advertise_host}:{}", bound.port());
            }
        }
    }
    let connect = |ep: &mut Endpoint, addr: &str| -> Result<ChannelId, RiverError> {
        let left = deadline.saturating_duration_since(Instant::now());
        Ok(if tcp { ep.connect_tcp(addr, left)? } else { ep.connect_shm(addr, left)? })
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
            let addr = accept_identified(&mut ep, &mut peers)?;
            let rank = (0..cfg.size).find(|&j| peers[j].is_some() && !before[j]).expect("a new peer");
            table[rank] = addr;
        }
        let payload = table.join("\n");
        let mut msg = Header { kind: Kind::Control, aux: PEERS_TAG, value: payload.len() as u64 }.encode().to_vec();
        msg.extend_from_slice(payload.as_bytes());
        for ch in peers.iter().flatten() {
            send_all(&mut ep, *ch, &msg, deadline)?;
        }
    } else {
        let coordinator = my_address(cfg, 0);
        let to0 = connect(&mut ep, &coordinator)?;
        send_all(&mut ep, to0, &hello(cfg.rank, cfg.size, &me), deadline)?;
        peers[0] = Some(to0);
        let msg = recv_one(&mut ep, to0, deadline, "the address table from node 0")?;
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
            let ch = connect(&mut ep, addr)?;
            send_all(&mut ep, ch, &hello(cfg.rank, cfg.size, &me), deadline)?;
            peers[j] = Some(ch);
        }
        for _ in cfg.rank + 1..cfg.size {
            accept_identified(&mut ep, &mut peers)?;
        }
    }
    Ok((ep, peers))
}
