//! # ulnet-cluster: membership for commodity clusters
//!
//! Which nodes are up, agreed by all of them, with bounded failure handling — the part of
//! cluster software users care about most (thesis Ch. 5). The mechanisms are those of the
//! Microsoft Cluster Service (Ch. 7: sponsor-based join, 5-stage regroup with quorum
//! rules, tie-breaker, pruning by a connectivity matrix, hearsay) and of Galaxy (Ch. 8:
//! gossip failure detection, buddy fast detection, epidemic dissemination), with the
//! fixes the thesis asked for: a join takes a constant number of round trips through its
//! sponsor (not a train of RPCs to every node), and heartbeats and regroup messages are
//! not unicasts to every node.
//!
//! Every membership datagram is authenticated with the cluster secret ([`wire`]) and
//! stamped for the process it is meant for ([`freshness`]): strangers cannot take part,
//! and a datagram recorded on the wire is worthless later.
//!
//! The protocol is a sans-IO state machine, [`Membership`]: no sockets, no clock, no
//! threads (see its module for the call order). It runs inside the deterministic
//! simulator in tests and inside [`runtime::Node`], which binds it to a UDP socket,
//! serves the control plane (RPC over ulnet's TCP transport) on the same address, exports
//! Prometheus counters, and hosts [`service::Service`]s such as the replicated registry.
//!
//! ```
//! use std::time::Instant;
//! use ulnet_cluster::{Config, Member, MemberId, Membership};
//!
//! let me = Member { id: MemberId(1), name: "a".into(), addr: "127.0.0.1:7000".parse().unwrap() };
//! let incarnation = 1; // ulnet_cluster::freshness::next_incarnation: above every earlier run's
//! let mut m = Membership::new(Config::local(), me, incarnation, b"secret", vec![], 42);
//! m.start(Instant::now()); // no seeds: forms a one-member cluster
//! assert_eq!(m.view().unwrap().id, 1);
//! ```
#![deny(missing_docs)]

pub mod buddy;
pub mod config;
pub mod control_metrics;
pub mod events;
pub mod freshness;
pub mod gossip;
pub mod membership;
mod rate_limit;
mod regroup;
mod rejoin;
pub mod runtime;
pub mod service;
pub mod view;
pub mod wire;
pub mod witness;

pub use buddy::{BuddyDetector, FastDetector};
pub use config::Config;
pub use events::{MemberState, MembershipEvent};
pub use membership::{Counters, Durable, Membership, Status, Transmit};
pub use view::{Member, MemberId, View};
pub use witness::{FileWitness, NoWitness, Witness};
