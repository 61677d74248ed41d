//! Every transport declares what one-sided operations get from it: only shared memory
//! lets a peer's segment be mapped, and an RMA request of `request_max` bytes arrives in
//! one piece (no larger than a fragment, taken by one send).

use std::time::Duration;
use ulnet_core::rma::wire::HEADER_LEN;
use ulnet_core::{ChannelId, Endpoint, EndpointConfig, TransportKind};

const T: Duration = Duration::from_secs(20);

/// Opens a channel of `kind` between two endpoints of this process; returns the client's.
fn pair(kind: TransportKind) -> (Endpoint, ChannelId, std::thread::JoinHandle<Endpoint>) {
    let mut server = Endpoint::new(EndpointConfig::default());
    let addr = match kind {
        TransportKind::Shm => {
            let name = format!("rma-caps-{}", std::process::id());
            server.listen_shm(&name).unwrap();
            name
        }
        TransportKind::Tcp => server.listen_tcp("127.0.0.1:0").unwrap().to_string(),
        TransportKind::Udp => server.listen_udp("127.0.0.1:0").unwrap().to_string(),
    };
    let accepting = std::thread::spawn(move || {
        server.accept(T).unwrap();
        server
    });
    let mut client = Endpoint::new(EndpointConfig::default());
    let ch = match kind {
        TransportKind::Shm => client.connect_shm(&addr, T),
        TransportKind::Tcp => client.connect_tcp(&addr, T),
        TransportKind::Udp => client.connect_udp(&addr, T),
    }
    .unwrap();
    (client, ch, accepting)
}

#[test]
fn transports_declare_their_rma_capabilities() {
    for kind in [TransportKind::Shm, TransportKind::Tcp, TransportKind::Udp] {
        let (client, ch, accepting) = pair(kind);
        let caps = client.caps(ch).unwrap();
        assert_eq!(caps.kind, kind);
        assert_eq!(caps.rma.map_segments, kind == TransportKind::Shm, "{kind}: only shm maps segments");
        assert!(caps.rma.request_max <= caps.fragment_max, "{kind}: a request arrives whole");
        assert!(caps.rma.request_max <= caps.send_max, "{kind}: a request is one send");
        assert!(caps.rma.request_max >= HEADER_LEN + 8, "{kind}: a request carries at least a word");
        drop(accepting.join().unwrap());
    }
}
