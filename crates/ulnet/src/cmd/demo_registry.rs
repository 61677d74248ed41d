//! The registry step of `ulnet demo`: five `ulnet node` processes with data directories
//! run the replicated registry; updates are acknowledged, the locker is killed (SIGKILL),
//! updates go on through the survivors, the killed node restarts and catches up, and every
//! key is read back on every node. The cluster's secret is made for the step, in its
//! directory.

use anyhow::{bail, Context, Result};
use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use ulnet_registry::client::{RegistryClient, RegistryStatus};

const NODES: usize = 5;
/// Updates written before the kill, and as many after it.
const UPDATES: usize = 100;

fn free_addrs(n: usize) -> Result<Vec<SocketAddr>> {
    // Another range than the membership step's, so both can run back to back.
    let mut port = 28_000 + (std::process::id() % 500) as u16 * 8;
    let mut out = Vec::new();
    while out.len() < n {
        port += 1;
        if port >= 32_768 {
            bail!("no free ports for the demo registry");
        }
        let a = SocketAddr::from(([127, 0, 0, 1], port));
        if UdpSocket::bind(a).is_ok() && TcpListener::bind(a).is_ok() {
            out.push(a);
        }
    }
    Ok(out)
}

struct Nodes {
    dir: std::path::PathBuf,
    secret_file: std::path::PathBuf,
    secret: Vec<u8>,
    addrs: Vec<SocketAddr>,
    procs: Vec<Option<Child>>,
}

impl Nodes {
    fn spawn(&mut self, i: usize, restart: bool) -> Result<()> {
        let mut c = Command::new(std::env::current_exe()?);
        c.args(["node", "--name", &format!("reg-{i}"), "--listen", &self.addrs[i].to_string()]);
        c.args(["--data-dir", self.dir.join(format!("reg-{i}")).to_str().context("path")?]);
        c.arg("--secret-file").arg(&self.secret_file);
        let seeds: Vec<String> =
            (0..NODES).filter(|&j| j != i && (j < i || restart)).map(|j| self.addrs[j].to_string()).collect();
        if !seeds.is_empty() {
            c.args(["--seeds", &seeds.join(",")]);
        }
        self.procs[i] =
            Some(c.env("ULNET_LOG", "error").stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null()).spawn()?);
        Ok(())
    }

    fn client(&self, i: usize) -> Option<RegistryClient> {
        RegistryClient::connect(&self.addrs[i].to_string(), &self.secret, Duration::from_secs(3)).ok()
    }

    fn status(&self, i: usize) -> Option<RegistryStatus> {
        self.client(i)?.status().ok()
    }

    /// Waits until the running nodes' registries agree: one epoch, one applied position,
    /// `NODES` voters.
    fn settle(&self, within: Duration) -> Result<()> {
        let deadline = Instant::now() + within;
        loop {
            let s: Vec<Option<RegistryStatus>> =
                (0..NODES).filter(|&i| self.procs[i].is_some()).map(|i| self.status(i)).collect();
            let first = s.first().cloned().flatten();
            let ok = s.iter().all(|s| {
                s.as_ref().zip(first.as_ref()).is_some_and(|(s, f)| {
                    s.running && s.normal && s.voters.len() == NODES && s.epoch == f.epoch && s.applied == f.applied
                })
            });
            if ok {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("the registry did not settle within {within:?}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Sets through node `i`, retrying across a failover; returns when acknowledged.
    fn set(&self, i: usize, key: &str, value: &str) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Some(Ok(_)) = self.client(i).map(|mut c| c.set(key.as_bytes(), value.as_bytes())) {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("set {key} through reg-{i} not acknowledged within 15 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Nodes {
    fn drop(&mut self) {
        for p in self.procs.iter_mut().flatten() {
            let _ = p.kill();
            let _ = p.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Runs the step; returns whether it showed what it should.
pub fn run() -> Result<bool> {
    let dir = std::env::temp_dir().join(format!("ulnet-demo-registry-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let secret_file = dir.join("secret");
    let procs = (0..NODES).map(|_| None).collect();
    let mut n = Nodes { dir, secret_file, secret: Vec::new(), addrs: free_addrs(NODES)?, procs };
    n.secret = super::secret::write_new_file(&n.secret_file)?;
    eprintln!("\nulnet demo: registry — {NODES} `ulnet node` processes replicate a registry (durable logs)");
    for i in 0..NODES {
        n.spawn(i, false)?;
    }
    n.settle(Duration::from_secs(20))?;
    let locker = (0..NODES).find(|&i| n.status(i).is_some_and(|s| s.locker)).context("no locker")?;
    let writer = (locker + 1) % NODES;
    let start = Instant::now();
    for k in 0..UPDATES {
        n.set(writer, &format!("key-{k}"), &format!("before-{k}"))?;
    }
    let before_s = start.elapsed().as_secs_f64();
    eprintln!("killing reg-{locker}, the locker (SIGKILL)");
    let killed_at = Instant::now();
    let mut p = n.procs[locker].take().context("locker running")?;
    p.kill()?;
    p.wait()?;
    n.set(writer, "key-0", "after-0")?;
    let first_ack = killed_at.elapsed().as_secs_f64();
    for k in 1..UPDATES {
        n.set(writer, &format!("key-{k}"), &format!("after-{k}"))?;
    }
    let new_locker = (0..NODES).find(|&i| n.procs[i].is_some() && n.status(i).is_some_and(|s| s.locker));
    n.spawn(locker, true)?;
    n.settle(Duration::from_secs(30))?;
    let (mut matched, mut read) = (0, 0);
    for i in 0..NODES {
        let mut c = n.client(i).with_context(|| format!("connecting to reg-{i}"))?;
        for k in 0..UPDATES {
            read += 1;
            let got = c.get(format!("key-{k}").as_bytes())?;
            if got.value.as_deref() == Some(format!("after-{k}").as_bytes()) {
                matched += 1;
            }
        }
    }
    // The contract's command line, once, on the restarted node.
    let cli = Command::new(std::env::current_exe()?)
        .args(["registry", "get", "key-7", "--connect", &n.addrs[locker].to_string()])
        .arg("--secret-file")
        .arg(&n.secret_file)
        .env("ULNET_LOG", "error")
        .stderr(Stdio::null())
        .output()?;
    let cli_value = String::from_utf8_lossy(&cli.stdout).trim().to_string();
    println!(
        "registry: {UPDATES} updates acknowledged in {before_s:.2} s; locker reg-{locker} killed, new locker {}, \
         first update after the kill acknowledged {first_ack:.2} s later, {} more after it; reg-{locker} restarted \
         and caught up; read back {matched}/{read} latest values on {NODES} nodes (`ulnet registry get key-7` on \
         reg-{locker}: {cli_value})",
        new_locker.map_or("none".into(), |l| format!("reg-{l}")),
        UPDATES - 1
    );
    Ok(matched == read && cli_value == "after-7" && new_locker.is_some_and(|l| l != locker))
}
