//! Accepting never stalls the target's engine: clients that connect to its listeners and
//! then say nothing (a blocking handshake would wait up to 5 s for them) delay neither the
//! operations of importers already connected nor the connection of a new importer.

mod rma_util;

use rma_util::*;
use std::os::linux::net::SocketAddrExt;
use std::time::{Duration, Instant};
use ulnet_core::rma::{Access, NotifyMode, Rights};

/// Far below the 5 s a listener's handshake waits for a silent client, far above an
/// operation's microseconds even on a loaded machine: an operation slower than this was
/// held up behind a handshake.
const STALL: Duration = Duration::from_secs(2);

/// Connects to every listener of `t` and says nothing; the sockets stay open.
fn silent_clients(t: &Target) -> Vec<Box<dyn std::any::Any>> {
    let shm = std::os::unix::net::SocketAddr::from_abstract_name(format!("ulnet-shm/rma/{}", t.shm)).unwrap();
    let mut held: Vec<Box<dyn std::any::Any>> = Vec::new();
    for _ in 0..3 {
        held.push(Box::new(std::net::TcpStream::connect(&t.tcp).unwrap()));
        held.push(Box::new(std::os::unix::net::UnixStream::connect_addr(&shm).unwrap()));
        // A UDP "client" that sends one datagram and never finishes a handshake.
        let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        udp.send_to(b"hello?", &t.udp).unwrap();
        held.push(Box::new(udp));
    }
    held
}

fn silent_clients_delay_no_operation_and_no_new_importer(mode: Mode) {
    let mut t = target(1, "silent");
    let seg = t.rma.export("s", 4096, Access::everyone(Rights::ALL), NotifyMode::Never).unwrap();
    let (mut early, _, r) = importer(2, &t, "s", mode);
    early.fetch_and_add_blocking(&r, 0, 1, T).unwrap();
    let _held = silent_clients(&t);
    // Let the engine see the silent clients (a blocking listener would now be stuck).
    std::thread::sleep(Duration::from_millis(50));
    for i in 0..200u64 {
        let t0 = Instant::now();
        assert_eq!(early.fetch_and_add_blocking(&r, 0, 1, T).unwrap(), i + 1);
        assert!(t0.elapsed() < STALL, "{mode:?}: operation {i} took {:?} behind silent clients", t0.elapsed());
    }
    // Two more silent clients per listener, then a new importer connects and operates.
    let _more = silent_clients(&t);
    let t0 = Instant::now();
    let (mut late, _, r2) = importer(3, &t, "s", mode);
    late.fetch_and_add_blocking(&r2, 0, 1, T).unwrap();
    assert!(t0.elapsed() < STALL, "{mode:?}: a new importer waited {:?} behind silent clients", t0.elapsed());
    assert_eq!(seg.load_u64(0), 202);
}

for_every_transport!(silent_clients_delay_no_operation_and_no_new_importer);

/// More silent TCP clients than the listener keeps in their handshake at once (and than
/// the 64 handshake threads it once had): the oldest are closed for the newest, so the next
/// importer connects at once rather than after a silent one's timeout.
#[test]
fn more_silent_tcp_clients_than_handshake_slots_do_not_delay_the_next_importer() {
    let mut t = target(1, "flood");
    let seg = t.rma.export("s", 4096, Access::everyone(Rights::ALL), NotifyMode::Never).unwrap();
    // 100: beyond both the 64 handshake slots (`TcpConfig::handshakes_pending_max`) and
    // the 64 handshake threads of the acceptor before it.
    let held: Vec<std::net::TcpStream> = (0..100).map(|_| std::net::TcpStream::connect(&t.tcp).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(50));
    let t0 = Instant::now();
    let (mut late, _, r) = importer(3, &t, "s", Mode::Tcp);
    late.fetch_and_add_blocking(&r, 0, 1, T).unwrap();
    assert!(t0.elapsed() < STALL, "a new importer waited {:?} behind {} silent clients", t0.elapsed(), held.len());
    assert_eq!(seg.load_u64(0), 1);
}
