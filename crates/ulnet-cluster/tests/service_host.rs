//! The node as a host for services: a service gets views, exchanges messages with its
//! peers on other members, and serves control-plane methods.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use ulnet_cluster::runtime::{query_status, Node, NodeConfig, METHOD_SERVICE_MIN};
use ulnet_cluster::service::{RpcHandler, Service, ServiceContext};
use ulnet_cluster::{Config, MemberId, View};

#[derive(Default)]
struct Seen {
    views: Vec<u64>,
    messages: Vec<(MemberId, Vec<u8>)>,
}

/// The lowest member pings every other member once the view has three members; the
/// others answer "pong".
struct PingPong {
    seen: Arc<Mutex<Seen>>,
    pinged: bool,
}

impl Service for PingPong {
    fn name(&self) -> &'static str {
        "pingpong"
    }
    fn id(&self) -> u16 {
        42
    }
    fn rpc_methods(&mut self) -> Vec<(u16, RpcHandler)> {
        let seen = self.seen.clone();
        vec![(
            METHOD_SERVICE_MIN,
            Box::new(move |_req: &[u8]| Ok(seen.lock().unwrap().messages.len().to_le_bytes().to_vec())) as RpcHandler,
        )]
    }
    fn on_view(&mut self, view: &View, ctx: &mut ServiceContext<'_>) {
        self.seen.lock().unwrap().views.push(view.id);
        if view.len() == 3 && view.members[0].id == ctx.me().id && !self.pinged {
            self.pinged = true;
            for m in &view.members[1..] {
                ctx.send(m.id, b"ping".to_vec());
            }
        }
    }
    fn on_message(&mut self, from: MemberId, data: &[u8], ctx: &mut ServiceContext<'_>) {
        self.seen.lock().unwrap().messages.push((from, data.to_vec()));
        if data == b"ping" {
            ctx.send(from, b"pong".to_vec());
        }
    }
}

fn config(name: &str, seeds: Vec<std::net::SocketAddr>) -> NodeConfig {
    NodeConfig {
        name: name.into(),
        listen: "127.0.0.1:0".parse().unwrap(),
        seeds,
        data_dir: None,
        secret: b"service-test".to_vec(),
        protocol: Config::local(),
        events_json: None,
        metrics: None,
        witness_dir: None,
    }
}

#[test]
fn services_get_views_exchange_messages_and_serve_methods() {
    let seens: Vec<Arc<Mutex<Seen>>> = (0..3).map(|_| Arc::default()).collect();
    let service =
        |i: usize| -> Vec<Box<dyn Service>> { vec![Box::new(PingPong { seen: seens[i].clone(), pinged: false })] };
    let first = Node::start(config("s0", vec![]), service(0)).unwrap();
    let seed = first.me().addr;
    let nodes = vec![
        first,
        Node::start(config("s1", vec![seed]), service(1)).unwrap(),
        Node::start(config("s2", vec![seed]), service(2)).unwrap(),
    ];
    let lowest = (0..3).min_by_key(|&i| nodes[i].me().id).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while seens[lowest].lock().unwrap().messages.iter().filter(|(_, d)| d == b"pong").count() < 2 {
        assert!(Instant::now() < deadline, "the lowest member did not get two pongs");
        std::thread::sleep(Duration::from_millis(20));
    }
    for s in &seens {
        assert!(!s.lock().unwrap().views.is_empty(), "a service got no view");
    }
    // The service's control-plane method answers on the node's address.
    let status = query_status(&nodes[lowest].me().addr.to_string(), b"service-test", Duration::from_secs(2)).unwrap();
    assert_eq!(status.members.len(), 3);
    let mut ep = ulnet_core::Endpoint::new({
        let mut c = ulnet_core::EndpointConfig::default();
        c.tcp.secret = b"service-test".to_vec();
        c
    });
    let ch = ep.connect_tcp(&nodes[lowest].me().addr.to_string(), Duration::from_secs(2)).unwrap();
    let mut rpc = ulnet_msg::rpc::Rpc::new(ep, ulnet_msg::rpc::RpcConfig { workers: 0, ..Default::default() });
    let _ = rpc.call(ch, METHOD_SERVICE_MIN, &[], Some(Duration::from_secs(2))).unwrap();
    let mut answer = None;
    let deadline = Instant::now() + Duration::from_secs(3);
    while answer.is_none() && Instant::now() < deadline {
        rpc.poll(8, |e| {
            if let ulnet_msg::rpc::RpcEvent::Reply { data, .. } = e {
                answer = Some(u64::from_le_bytes(data.try_into().unwrap()));
            }
        });
    }
    assert_eq!(answer, Some(2), "the method reports the two pongs");
    for n in &nodes {
        n.stop();
    }
    for n in nodes {
        n.join();
    }
}
