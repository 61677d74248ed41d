//! End to end with Debian's nginx: three real nginx processes (one caching proxy, two
//! application servers) driven by sidecar helpers; a node switches from the application
//! tier to the proxy tier and back under load, by compare-and-swap on the role word, and
//! no client request fails. `scripts/test-deps` installs nginx; without it the test says so
//! and skips.

use std::io::ErrorKind;
use std::net::{SocketAddr, SocketAddrV4, TcpListener};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use ulnet_dc::http::{Conn, HttpError};
use ulnet_dc::load::ClusterKey;
use ulnet_dc::nginx::{NginxConfig, NginxNode, NginxRole, Sidecar};
use ulnet_dc::node::document;
use ulnet_dc::role::{initial_table, NodeIndex, Role, Tier};
use ulnet_dc::state::rma::{RmaEndpoint, RmaPath, RmaState, RmaStateConfig};
use ulnet_dc::state::{CasOutcome, SharedState};

fn nginx_binary() -> Option<PathBuf> {
    ["/usr/sbin/nginx", "/usr/bin/nginx"].iter().map(PathBuf::from).find(|p| p.exists())
}

fn free_port() -> SocketAddrV4 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    match l.local_addr().unwrap() {
        SocketAddr::V4(a) => a,
        SocketAddr::V6(_) => unreachable!("bound on IPv4"),
    }
}

/// One request through the proxy, checked. A graceful reload closes idle keep-alive
/// connections; a request that meets such a close before any byte of its response is sent
/// (closed or reset) again on a new connection, as HTTP/1.1 lets a client do for an idempotent request (RFC
/// 9112 9.3.1). Any other outcome counts.
fn check(conn: &mut Option<Conn>, target: SocketAddr, i: u64) -> bool {
    let (path, doc) = if i.is_multiple_of(2) {
        (format!("/0/s/{}", i % 10), Some((i % 10) as u32))
    } else {
        (format!("/0/d/{i}"), None)
    };
    let mut reused = conn.is_some();
    loop {
        if conn.is_none() {
            *conn = Conn::connect(target, Duration::from_secs(2)).ok();
        }
        let Some(c) = conn.as_mut() else { return false };
        let r = c.get(&path, None);
        let closed_under_us = match &r {
            Err(HttpError::Closed) => true,
            Err(HttpError::Io(e)) => matches!(e.kind(), ErrorKind::ConnectionReset | ErrorKind::BrokenPipe),
            _ => false,
        };
        if closed_under_us && reused {
            *conn = None;
            reused = false;
            continue;
        }
        let ok = match &r {
            Ok(r) if r.status == 200 => match doc {
                Some(d) => r.body == *document(0, d),
                None => r.body.starts_with(format!("site 0 transaction {i} ").as_bytes()),
            },
            _ => false,
        };
        if !ok {
            eprintln!(
                "{path} failed: {:?}",
                r.as_ref().map(|r| (r.status, String::from_utf8_lossy(&r.body[..r.body.len().min(80)]).into_owned()))
            );
        }
        if !ok {
            *conn = None;
        }
        return ok;
    }
}

/// Sets the flag when dropped, so a failed assertion stops the load threads too.
struct StopOnDrop<'a>(&'a AtomicBool);
impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// What a node's helper does to move `node` to `tier`: compare-and-swap at the role word's
/// home, then announce to every node.
fn switch(state: &dyn SharedState, node: u8, tier: Tier) {
    let t = state.read_roles().unwrap();
    let next = t.with_role(NodeIndex(node), Some(Role::new(0, tier)));
    assert_eq!(state.cas_roles(t, next).unwrap(), CasOutcome::Swapped);
    for n in 0..3 {
        state.announce(NodeIndex(n), next).unwrap();
    }
}

/// The shared state of a three-node center in remote memory: the front (home of the role
/// word) and one handle per node, mapped on this host.
fn shared_state(key: &ClusterKey) -> (RmaState, Vec<RmaState>) {
    let name = format!("t-dc-nginx-{}-{:x}", std::process::id(), rand::random::<u32>());
    let config = RmaStateConfig::new(&name, 3, RmaPath::Map);
    let front = RmaState::front(config.clone(), initial_table(&[(1, 2)]), key.clone()).unwrap();
    let nodes: Vec<RmaState> = (0..3)
        .map(|i| RmaState::node(config.clone(), NodeIndex(i), front.endpoint().clone(), key.clone()).unwrap())
        .collect();
    let endpoints: Vec<Option<RmaEndpoint>> = nodes.iter().map(|n| Some(n.endpoint().clone())).collect();
    for n in &nodes {
        n.set_endpoints(&endpoints);
    }
    (front, nodes)
}

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn nginx_nodes_switch_tier_under_load_without_failing_a_request() {
    let Some(binary) = nginx_binary() else {
        eprintln!("SKIPPED: nginx is not installed (scripts/test-deps installs it: apt-get install -y nginx-light)");
        return;
    };
    let root = std::env::temp_dir().join(format!("ulnet-dc-nginx-{}", std::process::id()));
    let docroot = root.join("docs");
    std::fs::create_dir_all(docroot.join("0")).unwrap();
    for d in 0..10 {
        std::fs::write(docroot.join("0").join(d.to_string()), &*document(0, d)).unwrap();
    }
    let key = ClusterKey::new(b"nginx-test");
    let (_front, states) = shared_state(&key);
    let addrs: Vec<SocketAddrV4> = (0..3).map(|_| free_port()).collect();
    let addr_of: Vec<Option<SocketAddr>> = addrs.iter().map(|a| Some(SocketAddr::V4(*a))).collect();
    let config = |i: usize| NginxConfig {
        binary: binary.clone(),
        dir: root.join(format!("n{i}")),
        docroot: docroot.clone(),
        listen: addrs[i],
        workers: 1,
    };
    let apps = vec![addr_of[1].unwrap(), addr_of[2].unwrap()];
    let n1 = NginxNode::start(config(1), NginxRole::App).unwrap();
    let n2 = NginxNode::start(config(2), NginxRole::App).unwrap();
    let n0 = NginxNode::start(config(0), NginxRole::Proxy { app_servers: apps }).unwrap();
    let sidecars: Vec<Mutex<(Sidecar, RmaState)>> = [n0, n1, n2]
        .into_iter()
        .zip(states)
        .enumerate()
        .map(|(i, (n, s))| Mutex::new((Sidecar::new(n, NodeIndex(i as u8)), s)))
        .collect();
    // Node 0's helper decides the switches.
    let switch = |node: u8, tier: Tier| switch(&sidecars[0].lock().unwrap().1, node, tier);
    let stop = AtomicBool::new(false);
    let (ok, failed) = (AtomicU64::new(0), AtomicU64::new(0));
    let target = addr_of[0].unwrap();
    std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                for sc in &sidecars {
                    let mut g = sc.lock().unwrap();
                    let (sidecar, state) = &mut *g;
                    sidecar.step(state, &addr_of).unwrap();
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        let next = Arc::new(AtomicU64::new(0));
        for _ in 0..4 {
            let next = next.clone();
            let (stop, ok, failed) = (&stop, &ok, &failed);
            s.spawn(move || {
                let mut conn = None;
                while !stop.load(Ordering::Relaxed) {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if check(&mut conn, target, i) {
                        ok.fetch_add(1, Ordering::Relaxed)
                    } else {
                        failed.fetch_add(1, Ordering::Relaxed)
                    };
                }
            });
        }
        let _stop_on_panic = StopOnDrop(&stop);
        let role_of = |i: usize| sidecars[i].lock().unwrap().0.node().role().clone();
        std::thread::sleep(Duration::from_millis(300));
        // Node 2 joins the proxy tier: it reloads as a caching proxy, node 0 drops it upstream.
        switch(2, Tier::Proxy);
        wait_for("node 2 to become a proxy", || matches!(role_of(2), NginxRole::Proxy { .. }));
        wait_for("node 0 to drop node 2 upstream", || {
            role_of(0) == NginxRole::Proxy { app_servers: vec![addr_of[1].unwrap()] }
        });
        let mut statuses = Vec::new();
        wait_for("node 2 to answer from its cache", || {
            // A new connection each time: one opened before the reload ends with it.
            let mut c = Conn::connect(addr_of[2].unwrap(), Duration::from_secs(2)).unwrap();
            let r = c.get("/0/s/7", None).unwrap();
            assert_eq!((r.status, r.body.as_slice()), (200, &*document(0, 7)));
            statuses.push(r.cache.clone());
            r.cache.as_deref() == Some("HIT")
        });
        // An old worker may still answer the first request as an application server
        // (no X-Cache) while the reload completes; then the proxy misses once, then hits.
        assert!(statuses.contains(&Some("MISS".to_string())), "a new proxy starts cold: {statuses:?}");
        std::thread::sleep(Duration::from_millis(300));
        // And back to the application tier.
        switch(2, Tier::App);
        wait_for("node 2 to serve the application tier", || role_of(2) == NginxRole::App);
        wait_for(
            "node 0 to take node 2 upstream again",
            || matches!(role_of(0), NginxRole::Proxy { app_servers } if app_servers.len() == 2),
        );
        std::thread::sleep(Duration::from_millis(300));
        stop.store(true, Ordering::Relaxed);
    });
    let reloads: Vec<u64> = sidecars.iter().map(|s| s.lock().unwrap().0.node().reloads()).collect();
    for sc in sidecars {
        let (sidecar, _) = sc.into_inner().unwrap();
        sidecar.into_node().stop().unwrap();
    }
    let (ok, failed) = (ok.load(Ordering::Relaxed), failed.load(Ordering::Relaxed));
    eprintln!("{ok} requests answered, {failed} failed, reloads per node {reloads:?}");
    assert!(ok > 100, "load ran ({ok} requests)");
    assert_eq!(failed, 0, "requests failed across the switches");
    assert_eq!(reloads, vec![2, 0, 2], "node 0 reloaded for each upstream change, node 2 for each role change");
    remove(&root);
}

fn remove(root: &Path) {
    std::fs::remove_dir_all(root).ok();
}
