//! Bulk store and get of active messages on remote memory: a stored block is in the
//! receiver's segment when its handler runs there; a fetched block arrives whole in a reply
//! handler here — mapped on the same host, and through the engine over shared memory, TCP and UDP.

use rand::{Rng, SeedableRng};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use ulnet_core::rma::{Access, ImportMode, NodeId, NotifyMode, Rights, Rma, RmaConfig};
use ulnet_core::{Endpoint, EndpointConfig, SendOutcome};
use ulnet_msg::am::bulk::BulkAm;
use ulnet_msg::rpc::{Rpc, RpcConfig, RpcEvent};

const STORED: u16 = 20;
const STORED_ACK: u16 = 21;
const GOT: u16 = 22;
const SEG: usize = 1 << 20;
const GET_AREA: usize = SEG / 2;
const SLOTS: usize = 32;
const SLOT: usize = GET_AREA / SLOTS;
const T: Duration = Duration::from_secs(20);

fn pattern(i: usize) -> u8 {
    (i * 13 + 5) as u8
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    Mapped,
    ShmChannel,
    Tcp,
    Udp,
}

/// Where the receiver listens: (RMA, RPC) over TCP, then over UDP.
struct Addrs {
    rma_tcp: String,
    rpc_tcp: String,
    rma_udp: String,
    rpc_udp: String,
}

/// The receiving node: exports the segment, checks each stored block from its handler and
/// answers with its checksum.
fn receiver(name: String, ready: std::sync::mpsc::Sender<Addrs>) {
    let mut rma = Rma::new(RmaConfig::new(NodeId(1))).unwrap();
    rma.listen_shm(&name).unwrap();
    let rma_tcp = rma.listen_tcp("127.0.0.1:0").unwrap().to_string();
    let rma_udp = rma.listen_udp("127.0.0.1:0").unwrap().to_string();
    let seg =
        Arc::new(rma.export("bulk", SEG, Access::everyone(Rights::READ | Rights::WRITE), NotifyMode::Never).unwrap());
    let fill: Vec<u8> = (GET_AREA..SEG).map(pattern).collect();
    seg.write(GET_AREA, &fill);
    let mut ep = Endpoint::new(EndpointConfig::default());
    ep.listen_shm(&format!("{name}-rpc")).unwrap();
    let rpc_tcp = ep.listen_tcp("127.0.0.1:0").unwrap().to_string();
    let rpc_udp = ep.listen_udp("127.0.0.1:0").unwrap().to_string();
    ready.send(Addrs { rma_tcp, rpc_tcp, rma_udp, rpc_udp }).unwrap();
    ep.accept(T).unwrap();
    let mut rpc = Rpc::new(ep, RpcConfig { workers: 0, ..Default::default() });
    let s = seg.clone();
    rpc.register_am_request(STORED, move |m, replier| {
        let (off, len) = (m.args[0] as usize, m.args[1] as usize);
        let mut block = vec![0u8; len];
        s.read(off, &mut block);
        replier.reply(STORED_ACK, [m.args[2], u64::from(crc32c::crc32c(&block)), len as u64, 0], &[]);
    });
    let mut down = false;
    while !down {
        rpc.poll(64, |e| down |= matches!(e, RpcEvent::ChannelDown { .. }));
    }
}

fn bulk_store_and_get(mode: Mode) {
    let name = format!("bulk-{}-{:x}", std::process::id(), rand::random::<u32>());
    let (tx, rx) = std::sync::mpsc::channel();
    let n = name.clone();
    let server = std::thread::spawn(move || receiver(n, tx));
    let addrs = rx.recv().unwrap();
    let mut rma = Rma::new(RmaConfig::new(NodeId(2))).unwrap();
    let mut ep = Endpoint::new(EndpointConfig::default());
    let (seg, ch) = match mode {
        Mode::Tcp => {
            let peer = rma.connect_tcp(&addrs.rma_tcp, T).unwrap();
            (rma.import(peer, "bulk").unwrap(), ep.connect_tcp(&addrs.rpc_tcp, T).unwrap())
        }
        Mode::Udp => {
            let peer = rma.connect_udp(&addrs.rma_udp, T).unwrap();
            (rma.import(peer, "bulk").unwrap(), ep.connect_udp(&addrs.rpc_udp, T).unwrap())
        }
        _ => {
            let peer = rma.connect_shm(&name);
            let how = if mode == Mode::Mapped { ImportMode::Map } else { ImportMode::Channel };
            (rma.import_with(peer, "bulk", how).unwrap(), ep.connect_shm(&format!("{name}-rpc"), T).unwrap())
        }
    };
    assert_eq!(seg.is_mapped(), mode == Mode::Mapped);
    let mut rpc = Rpc::new(ep, RpcConfig { workers: 0, ..Default::default() });
    let acks = Arc::new(AtomicU64::new(0));
    let expected: Arc<std::sync::Mutex<Vec<(u32, usize)>>> = Arc::default();
    let (a, e) = (acks.clone(), expected.clone());
    rpc.register_am_reply(STORED_ACK, move |m| {
        let want = e.lock().unwrap()[m.args[0] as usize];
        assert_eq!((m.args[1] as u32, m.args[2] as usize), want, "the handler found store {} in place", m.args[0]);
        a.fetch_add(1, Ordering::Relaxed);
    });
    let gots = Arc::new(AtomicU64::new(0));
    let g = gots.clone();
    rpc.register_am_reply(GOT, move |m| {
        let (off, len) = (m.args[0] as usize, m.args[1] as usize);
        assert_eq!(m.payload.len(), len);
        assert!(m.payload.iter().enumerate().all(|(i, &b)| b == pattern(off + i)), "get of {len} at {off}");
        assert_eq!(m.args[2], 77);
        g.fetch_add(1, Ordering::Relaxed);
    });
    let mut bulk = BulkAm::new();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
    let deadline = Instant::now() + T;
    let drive = |bulk: &mut BulkAm, rpc: &mut Rpc, rma: &mut Rma| {
        bulk.poll(rpc, rma, |e| panic!("{e:?}"));
        rpc.poll(64, |e| assert!(!matches!(e, RpcEvent::Failed { .. } | RpcEvent::ChannelDown { .. }), "{e:?}"));
        assert!(Instant::now() < deadline, "timed out");
    };
    const WAVES: usize = 6;
    let mut gets = 0u64;
    for wave in 0..WAVES {
        for slot in 0..SLOTS {
            let i = wave * SLOTS + slot;
            let len = rng.gen_range(1..=SLOT);
            let block: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
            expected.lock().unwrap().push((crc32c::crc32c(&block), len));
            let off = (slot * SLOT) as u64;
            while bulk.store(&mut rpc, &mut rma, ch, &seg, off, &block, STORED, [i as u64, 0]).unwrap()
                == SendOutcome::NoResource
            {
                drive(&mut bulk, &mut rpc, &mut rma);
            }
            // And a get from the other half.
            let glen = rng.gen_range(1..=64 << 10);
            let goff = rng.gen_range(GET_AREA..=SEG - glen) as u64;
            while bulk.get(&mut rpc, &mut rma, ch, &seg, goff, glen, GOT, [77, 0]).unwrap() == SendOutcome::NoResource {
                drive(&mut bulk, &mut rpc, &mut rma);
            }
            gets += 1;
        }
        // A slot is reused only after its handler has run.
        while acks.load(Ordering::Relaxed) < ((wave + 1) * SLOTS) as u64 {
            drive(&mut bulk, &mut rpc, &mut rma);
        }
    }
    while gots.load(Ordering::Relaxed) < gets || bulk.pending() > 0 {
        drive(&mut bulk, &mut rpc, &mut rma);
    }
    assert_eq!(acks.load(Ordering::Relaxed), (WAVES * SLOTS) as u64);
    rpc.endpoint().close(ch);
    server.join().unwrap();
}

#[test]
fn bulk_store_and_get_mapped() {
    bulk_store_and_get(Mode::Mapped);
}

#[test]
fn bulk_store_and_get_shm_channel() {
    bulk_store_and_get(Mode::ShmChannel);
}

#[test]
fn bulk_store_and_get_tcp() {
    bulk_store_and_get(Mode::Tcp);
}

#[test]
fn bulk_store_and_get_udp() {
    bulk_store_and_get(Mode::Udp);
}
