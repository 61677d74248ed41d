//! # ulnet-dc: a multi-tier data center that reconfigures itself
//!
//! A proxy tier (document cache; forwards misses and dynamic requests) and an application
//! tier (dynamic content, static documents for the proxies) over real HTTP, whose nodes
//! change tier as the load shifts instead of over-provisioning both (Krishnamoorthy, *Dynamic
//! reconfigurability support to provide soft QoS guarantees in cluster-based multi-tier
//! data-centers over InfiniBand*, 2004).
//!
//! - Each node's helper module publishes its load in its own memory ([`load`]); the others
//!   read it with one-sided READs of ulnet remote memory, without involving it, through
//!   the narrow [`state::SharedState`] interface ([`state::rma::RmaState`]).
//! - Every node's role lives in one role word ([`role::RoleTable`]) at the front; a helper
//!   changes roles with remote compare-and-swap, and a failed CAS hands it the
//!   configuration another helper made.
//! - Each node process is a member of a ulnet cluster ([`membership`]): a node that dies is
//!   taken out of the role word by a surviving helper.
//! - The decision ([`policy::Helper`]) is a pure state machine: history window T,
//!   sensitivity S, donors, and priorities between websites.
//! - [`node`] is the one program every node runs; [`lb`] the front load balancer;
//!   [`loadgen`] the closed-loop clients replaying a [`trace`]; [`run`] puts a center
//!   together and measures it ([`report`], [`plot`]); [`nginx`] drives Debian's nginx in
//!   either role for centers built from servers people already run.
//!
//! (The loom build, which model-checks the load-record protocol, leaves out the parts that
//! run a center: they need the membership runtime, whose tokio has no sockets under loom.)
#![deny(missing_docs)]

mod accept;
pub mod cache;
pub mod capacity;
pub mod http;
pub mod lb;
pub mod load;
pub mod loadgen;
pub mod membership;
pub mod nginx;
pub mod node;
#[cfg(not(loom))]
pub mod plot;
pub mod policy;
pub mod report;
pub mod role;
#[cfg(not(loom))]
pub mod run;
pub mod state;
pub mod trace;
pub mod upstream;
