//! Which nodes of the center are alive: every node process hosts a member of a ulnet
//! cluster (`ulnet_cluster::runtime::Node`, as a library) named `dc-n{index}`, and a small
//! service on it turns membership events into a [`Watch`] the helper reads.
//!
//! Why a member inside each node process rather than a `ulnet node` daemon beside it: what
//! must be detected is the death of the node *process* (a crash, a kill, its host going
//! down). A member in the same process dies with it, so the cluster's failure detectors
//! watch exactly that; a daemon beside it would outlive a crashed node and need a second
//! liveness check of its own. It also adds no process per node.
//!
//! When a member dies, the surviving helpers see it in their [`Watch`] at their next look
//! and take it out of the role word ([`crate::policy::Helper::handle_departures`]); the
//! balancer and proxies route by the role word, so they stop sending to it. A node that
//! loses quorum or is removed from the view stops deciding ([`Watch::acting`]).

//!
//! (The cluster runtime is left out of the loom build, whose tokio has no sockets; the
//! [`Watch`] the helper reads is plain atomics either way.)

use crate::role::{NodeIndex, NODES_MAX};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

#[cfg(not(loom))]
pub use cluster::{JoinError, Member, JOIN_TIMEOUT, SERVICE_ID};

/// The member name of node `i`.
pub fn member_name(i: NodeIndex) -> String {
    format!("dc-n{}", i.0)
}

/// The node a member name names, if it is one of ours.
pub fn node_of(name: &str) -> Option<NodeIndex> {
    let i: u8 = name.strip_prefix("dc-n")?.parse().ok()?;
    (usize::from(i) < NODES_MAX).then_some(NodeIndex(i))
}

/// What membership told this node, read by its helper without locks.
#[derive(Debug, Default)]
pub struct Watch {
    dead: AtomicU32,
    acting: AtomicBool,
}

impl Watch {
    /// Nodes that died since this node joined (and did not come back).
    pub fn dead(&self) -> Vec<NodeIndex> {
        let bits = self.dead.load(Ordering::Acquire);
        (0..NODES_MAX as u8).filter(|i| bits & (1 << i) != 0).map(NodeIndex).collect()
    }

    /// Whether this node is a member of a view with quorum: only then does its helper
    /// decide. A node cut off from the others must not reconfigure the center.
    pub fn acting(&self) -> bool {
        self.acting.load(Ordering::Acquire)
    }

    #[cfg_attr(loom, allow(dead_code))]
    fn set_acting(&self, acting: bool) {
        self.acting.store(acting, Ordering::Release);
    }

    #[cfg_attr(loom, allow(dead_code))]
    fn set_dead(&self, node: NodeIndex, dead: bool) {
        if dead {
            self.dead.fetch_or(1 << node.0, Ordering::AcqRel);
        } else {
            self.dead.fetch_and(!(1 << node.0), Ordering::AcqRel);
        }
    }
}

#[cfg(not(loom))]
mod cluster {
    use super::{member_name, node_of, Watch};
    use crate::load::ClusterKey;
    use crate::role::NodeIndex;
    use std::net::SocketAddr;
    use std::sync::Arc;
    use std::time::{Duration, Instant};
    use ulnet_cluster::runtime::{Node, NodeConfig};
    use ulnet_cluster::service::{Service, ServiceContext, SERVICE_ID_MIN};
    use ulnet_cluster::{Config, MembershipEvent, View};

    /// The service id of the data-center watch on a member.
    pub const SERVICE_ID: u16 = SERVICE_ID_MIN + 9;
    /// How long a node waits to become a member before it gives up starting. 10 s: a join
    /// takes a few round trips through the sponsor, retried every 100 ms (`Config::local`).
    pub const JOIN_TIMEOUT: Duration = Duration::from_secs(10);

    struct WatchService(Arc<Watch>);

    impl Service for WatchService {
        fn name(&self) -> &'static str {
            "dc-watch"
        }

        fn id(&self) -> u16 {
            SERVICE_ID
        }

        fn on_view(&mut self, view: &View, ctx: &mut ServiceContext<'_>) {
            self.0.set_acting(ctx.has_quorum() && view.contains(ctx.me().id));
        }

        fn on_event(&mut self, event: &MembershipEvent, _ctx: &mut ServiceContext<'_>) {
            match event {
                MembershipEvent::Dead { member, view } => {
                    if let Some(i) = node_of(&member.name) {
                        self.0.set_dead(i, true);
                        tracing::info!(node = %i, view, "membership: node died");
                    }
                }
                MembershipEvent::Joined { member, .. } => {
                    if let Some(i) = node_of(&member.name) {
                        self.0.set_dead(i, false);
                    }
                }
                MembershipEvent::QuorumLost { .. } | MembershipEvent::Removed { .. } => self.0.set_acting(false),
                MembershipEvent::Suspected { .. } | MembershipEvent::ViewInstalled { .. } => {}
            }
        }
    }

    /// Why a node could not join the center's cluster.
    #[derive(Debug, thiserror::Error)]
    pub enum JoinError {
        /// The member could not start (sockets, threads).
        #[error("membership: {0}")]
        Io(#[from] std::io::Error),
        /// No view took this node in time.
        #[error("not a member after {0:?}")]
        Timeout(Duration),
    }

    /// A node's member of the center's cluster.
    pub struct Member {
        node: Node,
        watch: Arc<Watch>,
    }

    impl Member {
        /// Starts node `index`'s member on `listen` (UDP and TCP), joining through `seeds` (none:
        /// it forms the cluster), and waits until a view takes it in. The cluster secret is
        /// derived from the center's key. Profile `Config::local`: a crashed node is out of the
        /// view within [`Config::exclusion_bound`] (about 3 s; typically under 1 s).
        pub fn join(
            index: NodeIndex,
            listen: SocketAddr,
            seeds: Vec<SocketAddr>,
            key: &ClusterKey,
        ) -> Result<Member, JoinError> {
            let watch = Arc::new(Watch::default());
            let config = NodeConfig {
                name: member_name(index),
                listen,
                seeds,
                data_dir: None,
                secret: key.derive("ulnet-dc membership"),
                protocol: Config::local(),
                events_json: None,
                metrics: None,
                witness_dir: None,
            };
            let node = Node::start(config, vec![Box::new(WatchService(watch.clone()))])?;
            let deadline = Instant::now() + JOIN_TIMEOUT;
            while !(node.status().status == "member" && watch.acting()) {
                if Instant::now() > deadline {
                    node.stop();
                    node.join();
                    return Err(JoinError::Timeout(JOIN_TIMEOUT));
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            Ok(Member { node, watch })
        }

        /// The member's address (seed for the others).
        pub fn addr(&self) -> SocketAddr {
            self.node.me().addr
        }

        /// What membership says.
        pub fn watch(&self) -> Arc<Watch> {
            self.watch.clone()
        }

        /// Leaves (stops the member's threads).
        pub fn stop(self) {
            self.node.stop();
            self.node.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn member_names_round_trip() {
        for i in [0u8, 7, 15] {
            assert_eq!(node_of(&member_name(NodeIndex(i))), Some(NodeIndex(i)));
        }
        assert_eq!(node_of("dc-n16"), None);
        assert_eq!(node_of("registry-1"), None);
        assert_eq!(node_of("dc-nx"), None);
    }
}
