//! Who may reach a benchmark's processes: the cluster secret every channel proves (shm,
//! tcp, udp), the users whose processes a shared-memory server admits, and the rule that a
//! server others can reach has a secret.
//!
//! - `--secret-file F`: the secret, read as `ulnet node` reads it; both sides need the
//!   same file. Without `--server`/`--connect` the command makes a fresh secret for its
//!   own pair of processes and hands it to the peer it starts through a pipe, so nothing
//!   else on the host can join the run.
//! - A server (or a ping-pong client, which listens too) refuses a tcp or udp address that
//!   is not loopback without a secret, unless `--insecure-no-secret` says this is
//!   development: anyone who reaches it could connect, and an RMA server's segment would
//!   answer them.
//! - `--allow-uid`, `--allow-gid`: shared-memory servers also admit those users' processes
//!   (and clients trust listeners of those users); by default only our own user's.

use super::{BenchArgs, TransportArg};
use anyhow::{bail, Context, Result};
use std::io::Write;
use std::net::ToSocketAddrs;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use ulnet_core::rma::RmaConfig;
use ulnet_core::transport::shm::AllowedPeers;
use ulnet_core::{EndpointConfig, NodeId};

/// Where the secret came from, and so how a peer process this command starts gets it.
enum Source {
    /// No secret: the empty one (a client or server started by hand without a file).
    Empty,
    /// The user's file, which the peer reads too.
    File(PathBuf),
    /// Made for this run; the peer reads it from the pipe on its stdin.
    Fresh,
}

/// The secret and the allowed users of one benchmark process.
pub(super) struct PeerAccess {
    secret: Vec<u8>,
    source: Source,
    allowed: AllowedPeers,
    insecure: bool,
}

/// Bytes of randomness in a secret made for one run (hex-encoded: 64 characters).
const FRESH_SECRET_BYTES: usize = 32;

fn fresh_secret() -> Result<Vec<u8>> {
    let mut raw = [0u8; FRESH_SECRET_BYTES];
    rustix::rand::getrandom(&mut raw, rustix::rand::GetRandomFlags::empty()).context("making a secret for the run")?;
    // Hex: no byte the secret file reader trims.
    Ok(raw.iter().map(|b| format!("{b:02x}")).collect::<String>().into_bytes())
}

impl PeerAccess {
    pub(super) fn of(args: &BenchArgs) -> Result<Self> {
        let (secret, source) = match &args.secret_file {
            Some(file) => {
                let secret = crate::cmd::node::read_secret(&Some(file.clone()))?;
                if secret.is_empty() {
                    bail!("the secret file {} is empty; an empty secret proves nothing", file.display());
                }
                (secret, Source::File(file.clone()))
            }
            None if args.server || args.connect.is_some() => (Vec::new(), Source::Empty),
            None => (fresh_secret()?, Source::Fresh),
        };
        let allowed = AllowedPeers { uids: args.allow_uid.clone(), gids: args.allow_gid.clone() };
        Ok(Self { secret, source, allowed, insecure: args.insecure_no_secret })
    }

    /// An endpoint of node `node` that proves our secret and admits our allowed users.
    pub(super) fn endpoint_config(&self, node: NodeId) -> EndpointConfig {
        let mut c = EndpointConfig { node_id: node, ..EndpointConfig::default() };
        self.apply(&mut c.tcp.secret, &mut c.udp.secret, &mut c.shm);
        c
    }

    /// `config`, proving our secret and admitting our allowed users.
    pub(super) fn rma_config(&self, mut config: RmaConfig) -> RmaConfig {
        self.apply(&mut config.tcp.secret, &mut config.udp.secret, &mut config.shm);
        config
    }

    fn apply(&self, tcp: &mut Vec<u8>, udp: &mut Vec<u8>, shm: &mut ulnet_core::transport::shm::ShmConfig) {
        tcp.clone_from(&self.secret);
        udp.clone_from(&self.secret);
        shm.secret.clone_from(&self.secret);
        shm.allowed = self.allowed.clone();
    }

    /// Refuses to listen where others could reach us without a secret (see the module doc).
    pub(super) fn check_listen(&self, transport: TransportArg, addr: &str) -> Result<()> {
        if transport == TransportArg::Shm || !self.secret.is_empty() || self.insecure {
            return Ok(());
        }
        // An address that does not resolve fails at bind, with the resolver's message.
        let Ok(resolved) = addr.to_socket_addrs() else { return Ok(()) };
        if resolved.into_iter().all(|a| a.ip().is_loopback()) {
            return Ok(());
        }
        bail!(
            "refusing to listen on {addr} without a secret: anyone who reaches it could connect (and use \
             an RMA server's memory). Pass --secret-file FILE on both sides (make one with `head -c 32 \
             /dev/urandom > FILE; chmod 600 FILE`), or --insecure-no-secret for development"
        )
    }

    /// Gives `cmd`, a peer process of this run, our secret and allowed users. Call
    /// [`PeerAccess::hand_over`] once it is spawned.
    pub(super) fn pass_to(&self, cmd: &mut Command) {
        match &self.source {
            Source::Empty => {
                cmd.stdin(Stdio::null());
            }
            Source::File(file) => {
                cmd.arg("--secret-file").arg(file).stdin(Stdio::null());
            }
            Source::Fresh => {
                cmd.args(["--secret-file", "/dev/stdin"]).stdin(Stdio::piped());
            }
        }
        for uid in &self.allowed.uids {
            cmd.args(["--allow-uid", &uid.to_string()]);
        }
        for gid in &self.allowed.gids {
            cmd.args(["--allow-gid", &gid.to_string()]);
        }
        if self.insecure {
            cmd.arg("--insecure-no-secret");
        }
    }

    /// Writes a fresh secret into the pipe of a peer started with [`PeerAccess::pass_to`],
    /// and closes it (the peer reads to the end).
    pub(super) fn hand_over(&self, child: &mut Child) -> Result<()> {
        if let (Source::Fresh, Some(mut pipe)) = (&self.source, child.stdin.take()) {
            pipe.write_all(&self.secret).context("handing the run's secret to the peer process")?;
        }
        Ok(())
    }
}
