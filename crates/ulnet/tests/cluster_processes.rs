//! Real processes: 32 `ulnet node` processes on loopback form one cluster; killing one
//! (SIGKILL) yields a view without it, agreed by all 31 survivors.

mod common;

use common::free_addrs;
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use ulnet_cluster::runtime::{query_status, StatusReport};

struct Cluster(Vec<Child>);
impl Drop for Cluster {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn statuses(addrs: &[SocketAddr], secret: &[u8]) -> Vec<Option<StatusReport>> {
    addrs.iter().map(|a| query_status(&a.to_string(), secret, Duration::from_secs(2)).ok()).collect()
}

fn agreed(reports: &[Option<StatusReport>], size: usize) -> Option<u64> {
    let first = reports.first()?.as_ref()?;
    let ok = reports.iter().all(|r| {
        r.as_ref().is_some_and(|r| {
            r.quorum && r.view == first.view && r.members.iter().filter(|m| m.state != "dead").count() == size
        })
    });
    ok.then_some(first.view)
}

#[test]
fn thirty_two_nodes_form_a_cluster_and_agree_on_a_view_without_a_killed_one() {
    const N: usize = 32;
    let dir = std::env::temp_dir().join(format!("ulnet-cluster-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let secret_file = dir.join("secret");
    std::fs::write(&secret_file, "processes-test-secret\n").unwrap();
    let addrs = free_addrs(N, 0);
    let mut cluster = Cluster(Vec::new());
    for (i, a) in addrs.iter().enumerate() {
        let mut c = Command::new(env!("CARGO_BIN_EXE_ulnet"));
        c.args(["node", "--name", &format!("p{i}"), "--listen", &a.to_string()]);
        c.args(["--secret-file", secret_file.to_str().unwrap()]);
        c.args(["--data-dir", dir.join(format!("p{i}")).to_str().unwrap()]);
        if i > 0 {
            // Any member can sponsor: seeds are a few earlier nodes, not only the first.
            let seeds: Vec<String> = [0, i / 2, i - 1].iter().map(|&j| addrs[j].to_string()).collect();
            c.args(["--seeds", &seeds.join(",")]);
        }
        cluster.0.push(
            c.env("ULNET_LOG", "error")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        );
    }
    let secret = b"processes-test-secret";
    let deadline = Instant::now() + Duration::from_secs(60);
    let formed = loop {
        let reports = statuses(&addrs, secret);
        if let Some(v) = agreed(&reports, N) {
            break v;
        }
        if Instant::now() > deadline {
            let summary: Vec<String> = reports
                .iter()
                .enumerate()
                .map(|(i, r)| match r {
                    Some(r) => format!("p{i}: view {} {} members {}", r.view, r.status, r.members.len()),
                    None => format!(
                        "p{i} at {}: no answer; exit {:?}; log: {}",
                        addrs[i],
                        cluster.0[i].try_wait(),
                        std::fs::read_to_string(dir.join(format!("p{i}.log"))).unwrap_or_default()
                    ),
                })
                .collect();
            panic!("32 nodes did not form one view in 60 s:\n{}", summary.join("\n"));
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let victim = 17;
    cluster.0[victim].kill().unwrap();
    cluster.0[victim].wait().unwrap();
    let survivors: Vec<SocketAddr> = addrs.iter().enumerate().filter(|(i, _)| *i != victim).map(|(_, a)| *a).collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    let after = loop {
        let reports = statuses(&survivors, secret);
        if let Some(v) = agreed(&reports, N - 1) {
            let names: Vec<String> = reports[0]
                .as_ref()
                .unwrap()
                .members
                .iter()
                .filter(|m| m.state != "dead")
                .map(|m| m.name.clone())
                .collect();
            assert!(!names.contains(&format!("p{victim}")), "the killed node is still in the view");
            break v;
        }
        assert!(Instant::now() < deadline, "the survivors did not agree on a view without the killed node in 30 s");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(after > formed);
    drop(cluster);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_node_with_the_wrong_secret_gets_no_status() {
    let a = free_addrs(1, 60)[0];
    let dir = std::env::temp_dir().join(format!("ulnet-cluster-secret-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("s"), "right").unwrap();
    let mut c = Cluster(vec![Command::new(env!("CARGO_BIN_EXE_ulnet"))
        .args(["node", "--name", "solo", "--listen", &a.to_string(), "--secret-file", dir.join("s").to_str().unwrap()])
        .stdout(Stdio::null())
        .spawn()
        .unwrap()]);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        // The node answers as soon as it listens, before its first view (0, no quorum) is
        // replaced by the view of itself alone.
        let status = query_status(&a.to_string(), b"right", Duration::from_secs(1));
        if let Ok(s) = &status {
            if (s.view, s.quorum) == (1, true) {
                break;
            }
            assert_eq!((s.view, s.quorum), (0, false), "a lone node's views");
        }
        assert!(Instant::now() < deadline, "node did not form its view: {status:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(query_status(&a.to_string(), b"wrong", Duration::from_secs(1)).is_err());
    c.0[0].kill().unwrap();
    drop(c);
    let _ = std::fs::remove_dir_all(&dir);
}
