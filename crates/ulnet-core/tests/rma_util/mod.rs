//! Helpers shared by the RMA integration tests: targets listening on every transport,
//! importers reaching them each way, child processes, and the macro that instantiates a
//! test over every transport.
#![allow(dead_code)]

use std::process::{Child, Command, Stdio};
use std::time::Duration;
use ulnet_core::rma::{Access, ExportedSegment, ImportMode, NodeId, NotifyMode, PeerId, RemoteSegment, Rma, RmaConfig};
use ulnet_core::{ChannelId, Endpoint, EndpointConfig};

/// How an importer reaches a target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Same host, segment mapped: loads, stores and atomics on the owner's pages.
    ShmMapped,
    /// Same host, every operation through the target's engine over a shared-memory channel.
    ShmChannel,
    /// Through the target's engine over TCP.
    Tcp,
    /// Through the target's engine over UDP.
    Udp,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::ShmMapped => "shm-mapped",
            Mode::ShmChannel => "shm-channel",
            Mode::Tcp => "tcp",
            Mode::Udp => "udp",
        }
    }

    pub fn parse(s: &str) -> Mode {
        match s {
            "shm-mapped" => Mode::ShmMapped,
            "shm-channel" => Mode::ShmChannel,
            "tcp" => Mode::Tcp,
            "udp" => Mode::Udp,
            other => panic!("unknown mode {other}"),
        }
    }

    /// The module `for_every_transport!` puts this mode's tests in.
    pub fn module(self) -> &'static str {
        match self {
            Mode::ShmMapped => "shm_mapped",
            Mode::ShmChannel => "shm_channel",
            Mode::Tcp => "tcp",
            Mode::Udp => "udp",
        }
    }

    /// Operations go through the target's engine (not a mapping).
    pub fn through_engine(self) -> bool {
        self != Mode::ShmMapped
    }
}

/// Instantiates each named test function `fn name(mode: Mode)` once per transport, in a
/// module per transport.
#[macro_export]
macro_rules! for_every_transport {
    ($($name:ident),* $(,)?) => {
        mod shm_mapped { $( #[test] fn $name() { super::$name($crate::rma_util::Mode::ShmMapped) } )* }
        mod shm_channel { $( #[test] fn $name() { super::$name($crate::rma_util::Mode::ShmChannel) } )* }
        mod tcp { $( #[test] fn $name() { super::$name($crate::rma_util::Mode::Tcp) } )* }
        mod udp { $( #[test] fn $name() { super::$name($crate::rma_util::Mode::Udp) } )* }
    };
}

pub const T: Duration = Duration::from_secs(10);

/// A node that exports and listens on shared memory, TCP and UDP.
pub struct Target {
    pub rma: Rma,
    pub shm: String,
    pub tcp: String,
    pub udp: String,
}

/// A name unique to this test run.
pub fn unique(what: &str) -> String {
    format!("t-{what}-{}-{:x}", std::process::id(), rand::random::<u32>())
}

pub fn target(node: u32, what: &str) -> Target {
    let mut rma = Rma::new(RmaConfig::new(NodeId(node))).unwrap();
    let shm = unique(what);
    rma.listen_shm(&shm).unwrap();
    let tcp = rma.listen_tcp("127.0.0.1:0").unwrap().to_string();
    let udp = rma.listen_udp("127.0.0.1:0").unwrap().to_string();
    Target { rma, shm, tcp, udp }
}

/// Reaches a target at (`shm`, `tcp`, `udp`) the way `mode` says.
pub fn connect(me: &mut Rma, shm: &str, tcp: &str, udp: &str, mode: Mode) -> (PeerId, ImportMode) {
    match mode {
        Mode::ShmMapped => (me.connect_shm(shm), ImportMode::Map),
        Mode::ShmChannel => (me.connect_shm(shm), ImportMode::Channel),
        Mode::Tcp => (me.connect_tcp(tcp, T).unwrap(), ImportMode::Channel),
        Mode::Udp => (me.connect_udp(udp, T).unwrap(), ImportMode::Channel),
    }
}

/// An importer of node `node` with the target's segment `name` imported.
pub fn importer(node: u32, t: &Target, name: &str, mode: Mode) -> (Rma, PeerId, RemoteSegment) {
    let mut me = Rma::new(RmaConfig::new(NodeId(node))).unwrap();
    let (peer, import_mode) = connect(&mut me, &t.shm, &t.tcp, &t.udp, mode);
    let seg = me.import_with(peer, name, import_mode).unwrap();
    assert_eq!(seg.is_mapped(), mode == Mode::ShmMapped);
    (me, peer, seg)
}

/// Exports `len` bytes of a recognisable pattern.
pub fn patterned(t: &mut Target, name: &str, len: usize, access: Access, notify: NotifyMode) -> ExportedSegment {
    let seg = t.rma.export(name, len, access, notify).unwrap();
    let pattern: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
    seg.write(0, &pattern);
    seg
}

/// Every byte of a segment.
pub fn snapshot(seg: &ExportedSegment) -> Vec<u8> {
    let mut b = vec![0u8; seg.len()];
    seg.read(0, &mut b);
    b
}

/// A raw channel to a target's engine, for sending bytes no honest initiator would. Its
/// handshake names no node, so the engine takes the node its Hello names.
pub fn raw_channel(t: &Target, mode: Mode) -> (Endpoint, ChannelId) {
    raw_channel_as(t, mode, NodeId::UNKNOWN)
}

/// [`raw_channel`], its handshake naming `node`.
pub fn raw_channel_as(t: &Target, mode: Mode, node: NodeId) -> (Endpoint, ChannelId) {
    let mut ep = Endpoint::new(EndpointConfig { node_id: node, ..EndpointConfig::default() });
    let ch = match mode {
        Mode::Tcp => ep.connect_tcp(&t.tcp, T).unwrap(),
        Mode::Udp => ep.connect_udp(&t.udp, T).unwrap(),
        _ => ep.connect_shm(&format!("rma/{}", t.shm), T).unwrap(),
    };
    (ep, ch)
}

/// Environment variable that makes a test binary run as a child role.
pub const CHILD_ENV: &str = "ULNET_RMA_TEST_CHILD";

/// Runs `test_name` of this test binary in a child process with `CHILD_ENV=role`.
pub fn spawn_child(test_name: &str, role: &str, env: &[(&str, String)]) -> Child {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", test_name, "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, role)
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.spawn().unwrap()
}

/// The role this process was started with, if it is a child.
pub fn child_role() -> Option<String> {
    std::env::var(CHILD_ENV).ok()
}
