//! The membership step of `ulnet demo`: five local `ulnet node` processes form a cluster,
//! one is killed, and the survivors agree on a new view without it. The cluster's secret is
//! made for the step, in a directory of its own that it removes.

use anyhow::{bail, Result};
use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use ulnet_cluster::runtime::{query_status, StatusReport};

const NODES: usize = 5;

/// Ports free for both UDP and TCP, below the usual ephemeral range (32768 and up), so
/// no outgoing connection takes one before its node binds it.
fn free_ports(n: usize) -> Result<Vec<u16>> {
    let mut port = 24_000 + (std::process::id() % 1000) as u16 * 8;
    let mut out = Vec::new();
    while out.len() < n {
        port += 1;
        if port >= 32_768 {
            bail!("no free ports for the demo cluster");
        }
        let a = SocketAddr::from(([127, 0, 0, 1], port));
        if UdpSocket::bind(a).is_ok() && TcpListener::bind(a).is_ok() {
            out.push(port);
        }
    }
    Ok(out)
}

fn wait_for(
    addrs: &[SocketAddr],
    secret: &[u8],
    timeout: Duration,
    ok: impl Fn(&[StatusReport]) -> bool,
) -> Result<Vec<StatusReport>> {
    let deadline = Instant::now() + timeout;
    loop {
        let reports: Vec<StatusReport> = addrs
            .iter()
            .filter_map(|a| query_status(&a.to_string(), secret, Duration::from_millis(500)).ok())
            .collect();
        if reports.len() == addrs.len() && ok(&reports) {
            return Ok(reports);
        }
        if Instant::now() > deadline {
            bail!("the cluster did not settle within {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn agreed(r: &[StatusReport], size: usize) -> bool {
    r.iter().all(|s| s.quorum && s.view == r[0].view && s.members.iter().filter(|m| m.state != "dead").count() == size)
}

/// Runs the step; returns whether it showed what it should.
pub fn run() -> Result<bool> {
    let dir = std::env::temp_dir().join(format!("ulnet-demo-cluster-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let result = run_in(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// The step, with its secret file in `dir`.
fn run_in(dir: &Path) -> Result<bool> {
    let secret_file = dir.join("secret");
    let secret = super::secret::write_new_file(&secret_file)?;
    let exe = std::env::current_exe()?;
    let addrs: Vec<SocketAddr> =
        free_ports(NODES)?.into_iter().map(|p| SocketAddr::from(([127, 0, 0, 1], p))).collect();
    eprintln!("\nulnet demo: membership — {NODES} `ulnet node` processes form a cluster");
    let mut children: Vec<Child> = Vec::new();
    for (i, a) in addrs.iter().enumerate() {
        let mut c = Command::new(&exe);
        c.args(["node", "--name", &format!("demo-{i}"), "--listen", &a.to_string()]);
        c.arg("--secret-file").arg(&secret_file);
        if i > 0 {
            c.args(["--seeds", &addrs[0].to_string()]);
        }
        children.push(
            c.env("ULNET_LOG", "error").stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null()).spawn()?,
        );
    }
    let result = (|| -> Result<bool> {
        let r = wait_for(&addrs, &secret, Duration::from_secs(10), |r| agreed(r, NODES))?;
        println!("view {}: {}", r[0].view, r[0].members.iter().map(|m| m.name.as_str()).collect::<Vec<_>>().join(", "));
        let victim = NODES - 1;
        eprintln!("killing demo-{victim} (SIGKILL)");
        let killed_at = Instant::now();
        children[victim].kill()?;
        let _ = children[victim].wait();
        let survivors = &addrs[..victim];
        let r = wait_for(survivors, &secret, Duration::from_secs(10), |r| agreed(r, NODES - 1))?;
        let alive: Vec<&str> = r[0].members.iter().filter(|m| m.state != "dead").map(|m| m.name.as_str()).collect();
        println!(
            "view {} (agreed by all {} survivors {:.2} s after the kill): {}",
            r[0].view,
            survivors.len(),
            killed_at.elapsed().as_secs_f64(),
            alive.join(", ")
        );
        Ok(!alive.contains(&format!("demo-{victim}").as_str()))
    })();
    for c in &mut children {
        let _ = c.kill();
        let _ = c.wait();
    }
    result
}
