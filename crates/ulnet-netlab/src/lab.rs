//! Namespaces, the bridge and the veth pairs: creation, teardown, and cleanup of labs left
//! behind by crashed runs.

use crate::firewall;
use crate::relay::{Relay, RelayConfig, RelayFaults};
use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::AsFd;
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Once;

/// Prefix of every namespace a lab creates: `ulnl-<pid>-<lab>-<host>`.
const NETNS_PREFIX: &str = "ulnl-";
/// Prefix of bridges (`ulb<pid hex>-<lab hex>`) and root-side veths
/// (`ulv<pid hex>-<lab hex>-<host hex>`); interface names have at most 15 bytes.
const BRIDGE_PREFIX: &str = "ulb";
const VETH_PREFIX: &str = "ulv";
/// Most hosts in one lab: addresses are `10.77.0.1` … `10.77.0.250` of one /24.
pub const HOSTS_MAX: usize = 250;
/// The interface each host sees.
const HOST_IF: &str = "eth0";

/// Why a lab operation failed.
#[derive(Debug, thiserror::Error)]
pub enum LabError {
    /// Not root, or `ip`/`iptables` missing: the lab cannot exist on this machine.
    #[error("network lab unavailable: {0}")]
    Unavailable(String),
    /// A command (`ip`, `iptables`) failed.
    #[error("`{command}` failed: {stderr}")]
    Command {
        /// The command line.
        command: String,
        /// What it printed on stderr.
        stderr: String,
    },
    /// More hosts than `HOSTS_MAX`, or a host index out of range.
    #[error("bad lab request: {0}")]
    Config(&'static str),
    /// The operating system refused.
    #[error("system error: {0}")]
    Io(#[from] std::io::Error),
}

/// One host of a lab: its namespace and address. Cheap to copy into threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Host {
    index: u8,
    pid: u32,
    lab: u32,
}

impl Host {
    /// Index in the lab (0-based).
    pub fn index(&self) -> usize {
        self.index as usize
    }

    /// The host's IPv4 address on the lab network.
    pub fn addr(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 77, 0, self.index + 1)
    }

    /// The name of its network namespace (for `ip netns exec`).
    pub fn netns(&self) -> String {
        format!("{NETNS_PREFIX}{}-{}-{}", self.pid, self.lab, self.index)
    }

    fn root_veth(&self) -> String {
        format!("{VETH_PREFIX}{:x}-{:x}-{:x}", self.pid, self.lab, self.index)
    }
}

/// A set of hosts (network namespaces) joined by a bridge. Dropping it tears it down.
#[derive(Debug)]
pub struct Lab {
    hosts: Vec<Host>,
    bridge: String,
}

fn run(args: &[&str]) -> Result<Output, LabError> {
    let out = Command::new(args[0]).args(&args[1..]).stdin(Stdio::null()).output().map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            LabError::Unavailable(format!("`{}` is not installed (see scripts/test-deps)", args[0]))
        } else {
            LabError::Io(e)
        }
    })?;
    if !out.status.success() {
        return Err(LabError::Command {
            command: args.join(" "),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(out)
}

/// Runs a command inside `host`'s namespace.
pub(crate) fn run_in_netns(host: &Host, args: &[&str]) -> Result<Output, LabError> {
    let ns = host.netns();
    let mut full = vec!["ip", "netns", "exec", &ns];
    full.extend_from_slice(args);
    run(&full)
}

fn process_alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// Removes namespaces and interfaces of labs whose creating process is gone (a crashed
/// run), and — the first time in a process, before any lab of ours exists — those
/// carrying our own pid (left by an earlier process that had the same pid).
fn remove_stale_labs() {
    static OWN_PID_SWEPT: Once = Once::new();
    OWN_PID_SWEPT.call_once(|| sweep(true));
    sweep(false);
}

fn sweep(own_pid_too: bool) {
    let me = std::process::id();
    let stale = |pid: u32| (pid == me && own_pid_too) || (pid != me && !process_alive(pid));
    if let Ok(out) = run(&["ip", "netns", "list"]) {
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let name = line.split_whitespace().next().unwrap_or("");
            let Some(rest) = name.strip_prefix(NETNS_PREFIX) else { continue };
            if rest.split('-').next().and_then(|p| p.parse::<u32>().ok()).is_some_and(stale) {
                tracing::info!("removing stale namespace {name}");
                let _ = run(&["ip", "netns", "del", name]);
            }
        }
    }
    if let Ok(out) = run(&["ip", "-o", "link", "show"]) {
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            // "12: ulb1a2b-0: <...>" or "13: ulv1a2b-0-1@if2: <...>"
            let Some(name) = line.split(": ").nth(1).map(|n| n.split('@').next().unwrap_or(n)) else { continue };
            let Some(rest) = name.strip_prefix(BRIDGE_PREFIX).or_else(|| name.strip_prefix(VETH_PREFIX)) else {
                continue;
            };
            if rest.split('-').next().and_then(|p| u32::from_str_radix(p, 16).ok()).is_some_and(stale) {
                tracing::info!("removing stale interface {name}");
                let _ = run(&["ip", "link", "del", name]);
            }
        }
    }
}

impl Lab {
    /// Whether labs can be made here; `Err` says why not (for a test's skip message).
    pub fn available() -> Result<(), String> {
        if !rustix::process::geteuid().is_root() {
            return Err("needs root (network namespaces, iptables)".into());
        }
        for tool in ["ip", "iptables"] {
            let found = std::env::var_os("PATH")
                .map(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
                .unwrap_or(false);
            if !found {
                return Err(format!("`{tool}` not found; install it with scripts/test-deps"));
            }
        }
        Ok(())
    }

    /// A lab of `n` hosts for a test, or `None` where labs cannot exist here (not root, or
    /// the tools missing), with the reason printed so that the skip shows in the output.
    /// Any other failure to make the lab panics: the test cannot run and must not pass.
    pub fn for_test(n: usize) -> Option<Self> {
        match Self::new(n) {
            Ok(lab) => Some(lab),
            Err(LabError::Unavailable(why)) => {
                eprintln!("skipped: {why}");
                None
            }
            Err(e) => panic!("creating the lab: {e}"),
        }
    }

    /// Creates `n` hosts on one bridge, every link up, no faults.
    pub fn new(n: usize) -> Result<Self, LabError> {
        Self::available().map_err(LabError::Unavailable)?;
        if n == 0 || n > HOSTS_MAX {
            return Err(LabError::Config("a lab has 1 to 250 hosts"));
        }
        remove_stale_labs();
        static NEXT_LAB: AtomicU32 = AtomicU32::new(0);
        let pid = std::process::id();
        let lab_index = NEXT_LAB.fetch_add(1, Ordering::Relaxed);
        let bridge = format!("{BRIDGE_PREFIX}{pid:x}-{lab_index:x}");
        // From here on, Drop cleans up whatever was made, even halfway.
        let mut lab = Lab { hosts: Vec::new(), bridge: bridge.clone() };
        run(&["ip", "link", "add", &bridge, "type", "bridge"])?;
        run(&["ip", "link", "set", &bridge, "up"])?;
        for i in 0..n {
            let host = Host { index: i as u8, pid, lab: lab_index };
            let ns = host.netns();
            let veth = host.root_veth();
            run(&["ip", "netns", "add", &ns])?;
            lab.hosts.push(host);
            run(&["ip", "link", "add", &veth, "type", "veth", "peer", "name", HOST_IF, "netns", &ns])?;
            run(&["ip", "link", "set", &veth, "master", &bridge, "up"])?;
            let cidr = format!("{}/24", host.addr());
            run(&["ip", "-n", &ns, "addr", "add", &cidr, "dev", HOST_IF])?;
            run(&["ip", "-n", &ns, "link", "set", HOST_IF, "up"])?;
            run(&["ip", "-n", &ns, "link", "set", "lo", "up"])?;
            firewall::install_chains(&host)?;
        }
        tracing::info!("lab {bridge}: {n} hosts up");
        Ok(lab)
    }

    /// Host `i` (panics when out of range: a test bug).
    pub fn host(&self, i: usize) -> Host {
        self.hosts[i]
    }

    /// All hosts.
    pub fn hosts(&self) -> &[Host] {
        &self.hosts
    }

    /// A command that runs `program` inside `host` (`ip netns exec`); add arguments, then
    /// spawn it.
    pub fn command(&self, host: Host, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec"]).arg(host.netns()).arg(program);
        c
    }

    /// Spawns `cmd` (program, arguments, environment and directory; standard streams are
    /// inherited — use [`Lab::command`] to redirect them) inside `host`. The caller owns
    /// the child and must kill or wait for it.
    pub fn spawn(&self, host: Host, cmd: &Command) -> Result<Child, LabError> {
        let mut c = self.command(host, cmd.get_program());
        c.args(cmd.get_args());
        for (k, v) in cmd.get_envs() {
            match v {
                Some(v) => c.env(k, v),
                None => c.env_remove(k),
            };
        }
        if let Some(dir) = cmd.get_current_dir() {
            c.current_dir(dir);
        }
        Ok(c.spawn()?)
    }

    /// Runs `f` on a new thread that lives inside `host`'s namespace (sockets it opens
    /// belong to the host).
    pub fn run_in<T: Send + 'static>(
        &self,
        host: Host,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> std::thread::JoinHandle<T> {
        std::thread::spawn(move || {
            enter(host).unwrap_or_else(|e| panic!("cannot enter namespace {}: {e}", host.netns()));
            f()
        })
    }

    /// Drops a random fraction `p` (0 to 1) of the packets `host` receives; 0 removes the
    /// rule.
    pub fn set_loss(&self, host: Host, p: f64) -> Result<(), LabError> {
        firewall::set_loss(&host, p)
    }

    /// Cuts `a` and `b` off from each other, both ways (DROP rules in both namespaces).
    pub fn partition(&self, a: Host, b: Host) -> Result<(), LabError> {
        firewall::block(&a, b.addr())?;
        firewall::block(&b, a.addr())
    }

    /// Cuts traffic from `from` to `to` only (an asymmetric partition).
    pub fn partition_one_way(&self, from: Host, to: Host) -> Result<(), LabError> {
        firewall::block_outgoing(&from, to.addr())
    }

    /// Undoes every partition (loss rules stay) and brings every link up.
    pub fn heal(&self) -> Result<(), LabError> {
        for h in &self.hosts {
            firewall::unblock_all(h)?;
            self.link_up(*h)?;
        }
        Ok(())
    }

    /// Takes `host`'s link down: it is cut off from every other host.
    pub fn link_down(&self, host: Host) -> Result<(), LabError> {
        run(&["ip", "link", "set", &host.root_veth(), "down"]).map(|_| ())
    }

    /// Brings `host`'s link back up, and waits (up to 5 s) until both ends of it carry
    /// traffic again.
    pub fn link_up(&self, host: Host) -> Result<(), LabError> {
        let veth = host.root_veth();
        run(&["ip", "link", "set", &veth, "up"])?;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let up = |out: Result<Output, LabError>| {
            out.map(|o| String::from_utf8_lossy(&o.stdout).contains("state UP")).unwrap_or(false)
        };
        while std::time::Instant::now() < deadline {
            if up(run(&["ip", "link", "show", &veth])) && up(run_in_netns(&host, &["ip", "link", "show", HOST_IF])) {
                return Ok(());
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        Err(LabError::Command {
            command: format!("ip link set {veth} up"),
            stderr: "link did not come up within 5 s".into(),
        })
    }

    /// Starts a seeded fault-injecting relay inside `host`, listening on `listen_port` of
    /// its address and forwarding to `upstream`. Clients send to the relay's address
    /// instead of `upstream`. The seed is logged and printed to stderr.
    pub fn start_relay(
        &self,
        host: Host,
        listen_port: u16,
        upstream: SocketAddr,
        faults: RelayFaults,
        seed: u64,
    ) -> Result<Relay, LabError> {
        let listen = SocketAddr::from((host.addr(), listen_port));
        let config = RelayConfig { listen, upstream, faults, seed };
        let handle = self.run_in(host, move || Relay::start(config));
        handle.join().map_err(|_| LabError::Config("relay thread panicked"))?.map_err(LabError::Io)
    }
}

/// Moves the calling thread into `host`'s network namespace.
pub(crate) fn enter(host: Host) -> std::io::Result<()> {
    let f = std::fs::File::open(format!("/var/run/netns/{}", host.netns()))?;
    rustix::thread::move_into_link_name_space(f.as_fd(), Some(rustix::thread::LinkNameSpaceType::Network))?;
    Ok(())
}

impl Drop for Lab {
    fn drop(&mut self) {
        for h in &self.hosts {
            if let Err(e) = run(&["ip", "netns", "del", &h.netns()]) {
                tracing::warn!("lab teardown: {e}");
            }
        }
        if let Err(e) = run(&["ip", "link", "del", &self.bridge]) {
            tracing::warn!("lab teardown: {e}");
        }
    }
}
