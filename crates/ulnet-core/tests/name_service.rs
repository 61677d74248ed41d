//! The segment name service across four node processes: 10,000 names exported (2,500 per
//! node) are all found from every node — locally, or with one or a few remote reads of the
//! hinted node's table — and deleted names stop resolving once the caches are refreshed.

mod rma_util;

use rma_util::*;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use ulnet_core::rma::names::{ClerkConfig, NameClerk, NameError};
use ulnet_core::rma::{Access, NodeId, NotifyMode, Rights, Rma, RmaConfig};

const NODES: usize = 4;
const PER_NODE: usize = 2500;

fn name_of(node: usize, k: usize) -> String {
    format!("n{node}/segment-{k}")
}

fn len_of(k: usize) -> usize {
    8 * (1 + k % 100)
}

/// Waits until `prefix-0` .. `prefix-{NODES-1}` exist in `dir`.
fn barrier(dir: &Path, prefix: &str) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while (0..NODES).any(|i| !dir.join(format!("{prefix}-{i}")).exists()) {
        assert!(Instant::now() < deadline, "timed out waiting for every node to reach {prefix}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn mark(dir: &Path, prefix: &str, i: usize, contents: &str) {
    let tmp = dir.join(format!(".{prefix}-{i}"));
    std::fs::write(&tmp, contents).unwrap();
    std::fs::rename(tmp, dir.join(format!("{prefix}-{i}"))).unwrap();
}

/// Every segment holds a memory file: make room for a few thousand descriptors.
fn raise_descriptor_limit(want: u64) {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let now = getrlimit(Resource::Nofile);
    if now.current.is_some_and(|c| c >= want) {
        return;
    }
    let hard = now.maximum.map_or(want, |m| m.max(want));
    setrlimit(Resource::Nofile, Rlimit { current: Some(want), maximum: Some(hard) })
        .or_else(|_| setrlimit(Resource::Nofile, Rlimit { current: now.maximum, maximum: now.maximum }))
        .expect("raising the descriptor limit");
}

/// One node: exports and registers its names, looks up everyone's, deletes a tenth of its
/// own, refreshes, and checks that exactly the deleted ones stopped resolving.
fn node_main() {
    let env = |k: &str| std::env::var(k).unwrap();
    let dir = PathBuf::from(env("NS_DIR"));
    let i: usize = env("NS_INDEX").parse().unwrap();
    let mode = Mode::parse(&env("NS_MODE"));
    let base = env("NS_BASE");
    raise_descriptor_limit(2 * PER_NODE as u64 + 512);
    let me_node = NodeId(i as u32 + 1);
    let mut rma = Rma::new(RmaConfig::new(me_node)).unwrap();
    rma.listen_shm(&format!("{base}-{i}")).unwrap();
    let tcp = rma.listen_tcp("127.0.0.1:0").unwrap();
    let udp = rma.listen_udp("127.0.0.1:0").unwrap();
    let mut clerk = NameClerk::new(&mut rma, ClerkConfig::default()).unwrap();
    let mut segments = Vec::with_capacity(PER_NODE);
    for k in 0..PER_NODE {
        let seg = rma.export(&name_of(i, k), len_of(k), Access::everyone(Rights::READ), NotifyMode::Never).unwrap();
        clerk.add_name(&name_of(i, k), seg.descriptor()).unwrap();
        segments.push(seg);
    }
    assert!(matches!(clerk.add_name(&name_of(i, 0), segments[0].descriptor()), Err(NameError::Taken)));
    mark(&dir, "ready", i, &format!("{tcp} {udp}"));
    barrier(&dir, "ready");
    for j in (0..NODES).filter(|&j| j != i) {
        let addrs = std::fs::read_to_string(dir.join(format!("ready-{j}"))).unwrap();
        let (tcp_j, udp_j) = addrs.split_once(' ').unwrap();
        let (peer, _) = connect(&mut rma, &format!("{base}-{j}"), tcp_j, udp_j, mode);
        clerk.add_peer(&mut rma, NodeId(j as u32 + 1), peer).unwrap();
    }
    let t0 = Instant::now();
    let mut found = 0;
    for owner in 0..NODES {
        for k in 0..PER_NODE {
            let d = clerk.lookup(&mut rma, &name_of(owner, k), Some(NodeId(owner as u32 + 1))).unwrap();
            assert_eq!((d.node, d.len), (NodeId(owner as u32 + 1), len_of(k) as u64), "{}", name_of(owner, k));
            found += 1;
        }
    }
    let c = clerk.counters();
    eprintln!(
        "node {i} ({mode:?}): found {found} names in {:?}; local {} remote {} with {} slot reads",
        t0.elapsed(),
        c.local_hits,
        c.remote_hits,
        c.remote_slot_reads
    );
    assert_eq!(found, NODES * PER_NODE);
    assert_eq!((c.local_hits, c.remote_hits), (PER_NODE as u64, ((NODES - 1) * PER_NODE) as u64));
    mark(&dir, "found", i, "");
    barrier(&dir, "found");
    for k in (0..PER_NODE).step_by(10) {
        clerk.delete_name(&name_of(i, k)).unwrap();
    }
    mark(&dir, "deleted", i, "");
    barrier(&dir, "deleted");
    // Before a refresh the cache may still answer for deleted names; after it, not.
    let report = clerk.refresh(&mut rma).unwrap();
    assert_eq!(report.tables_read, NODES - 1);
    assert_eq!(report.purged, (NODES - 1) * PER_NODE / 10);
    let mut resolved = 0;
    for owner in 0..NODES {
        for k in 0..PER_NODE {
            let r = clerk.lookup(&mut rma, &name_of(owner, k), Some(NodeId(owner as u32 + 1)));
            if k % 10 == 0 {
                assert!(matches!(r, Err(NameError::NotFound)), "deleted {} still resolves: {r:?}", name_of(owner, k));
            } else {
                assert_eq!(r.unwrap().node, NodeId(owner as u32 + 1));
                resolved += 1;
            }
        }
    }
    assert_eq!(resolved, NODES * PER_NODE * 9 / 10);
    mark(&dir, "done", i, "");
    // Keep serving our table until every node is done reading it.
    barrier(&dir, "done");
}

fn ten_thousand_names_across_four_nodes(mode: Mode) {
    if child_role().as_deref() == Some("node") {
        return node_main();
    }
    let dir = std::env::temp_dir().join(unique("names"));
    std::fs::create_dir_all(&dir).unwrap();
    let base = unique("ns");
    let test = format!("{}::ten_thousand_names_across_four_nodes", mode.module());
    let mut children: Vec<_> = (0..NODES)
        .map(|i| {
            spawn_child(
                &test,
                "node",
                &[
                    ("NS_DIR", dir.to_string_lossy().into_owned()),
                    ("NS_INDEX", i.to_string()),
                    ("NS_MODE", mode.name().to_string()),
                    ("NS_BASE", base.clone()),
                ],
            )
        })
        .collect();
    let statuses: Vec<_> = children.iter_mut().map(|c| c.wait().unwrap()).collect();
    let _ = std::fs::remove_dir_all(&dir);
    for (i, s) in statuses.iter().enumerate() {
        assert!(s.success(), "{mode:?}: node {i} failed ({s})");
    }
}

for_every_transport!(ten_thousand_names_across_four_nodes);
