//! # ulnet-netlab: many hosts on one machine, for tests that need a real network
//!
//! A [`Lab`] is a set of Linux network namespaces ("hosts"), each with one veth interface
//! plugged into a bridge of its own, so the hosts reach each other over the kernel's real
//! IP stack at addresses `10.77.0.1`, `10.77.0.2`, …. The kernel here has no `netem`, so
//! faults come from three places:
//!
//! - **Loss** — [`Lab::set_loss`]: an `iptables -m statistic --mode random` DROP rule on a
//!   host's incoming packets.
//! - **Partitions** — [`Lab::partition`] (DROP rules between two hosts, both ways),
//!   [`Lab::link_down`] / [`Lab::link_up`], and [`Lab::heal`] to undo every partition.
//! - **Delay, duplication and reordering** — a seeded user-space UDP [`relay::Relay`] that
//!   a test puts between two hosts ([`Lab::start_relay`]) or runs anywhere as a library or
//!   as the `ulnet-relay` binary. It prints its seed; the same seed replays the same faults.
//!
//! Work runs inside a host either as a process ([`Lab::command`], [`Lab::spawn`]: `ip netns
//! exec`) or as a thread of the test ([`Lab::run_in`]: the thread moves into the namespace
//! with `setns`, so sockets it opens live there).
//!
//! Everything is torn down when the [`Lab`] is dropped (namespaces, and with them the veth
//! pairs, then the bridge). Names carry the creating process id, so a lab left behind by a
//! crashed run is found and removed by the next [`Lab::new`].
//!
//! Needs root and `ip` (iproute2) and `iptables`; tests call [`Lab::available`] first and
//! skip with the printed reason when it says no.
//!
//! ```no_run
//! use ulnet_netlab::Lab;
//! use std::net::UdpSocket;
//!
//! let lab = Lab::new(2)?;
//! let (a, b) = (lab.host(0), lab.host(1));
//! lab.set_loss(b, 0.1)?; // 10% of what b receives is dropped by the kernel
//! let server = lab.run_in(b, move || {
//!     let s = UdpSocket::bind((b.addr(), 9000)).unwrap();
//!     let mut buf = [0u8; 64];
//!     s.recv(&mut buf).unwrap()
//! });
//! lab.run_in(a, move || UdpSocket::bind("0.0.0.0:0").unwrap().send_to(b"hi", (b.addr(), 9000))).join().unwrap()?;
//! lab.partition(a, b)?; // nothing passes between a and b ...
//! lab.heal()?; // ... until healed
//! # let _ = server;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(missing_docs)]

mod firewall;
mod lab;
pub mod relay;

pub use lab::{Host, Lab, LabError};
pub use relay::{Relay, RelayConfig, RelayCounters, RelayFaults};
