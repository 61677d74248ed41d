//! The plug-in point of `ulnet node`: services hosted by the node (the replicated
//! registry, say) that need views, failure events, messages to their peers on other
//! members, and control-plane methods.
//!
//! A service is handed to [`crate::runtime::Node::start`]. It runs on the node's control
//! thread: [`Service::on_view`] for every installed view (id and ordered members with
//! addresses), [`Service::on_event`] for every membership event, [`Service::on_message`]
//! for every message from the same service on another member, [`Service::on_tick`]
//! periodically. It sends with [`ServiceContext::send`]: messages to one member are
//! reliable and ordered (a ulnet TCP channel per pair, authenticated with the cluster
//! secret). Control-plane methods ([`Service::rpc_methods`]) are served on the node's
//! address, so `ulnet registry set --connect ADDR` can call them.
//!
//! Ids are on the wire and append-only: [`SERVICE_ID_MIN`] and up for services,
//! [`crate::runtime::METHOD_SERVICE_MIN`] and up for their methods.

use crate::events::MembershipEvent;
use crate::view::{Member, MemberId, View};
use std::time::Instant;

/// Lowest id a service may use (ids below are reserved for the node itself).
pub const SERVICE_ID_MIN: u16 = 16;

/// A control-plane method: request payload in, reply payload or a status out.
pub type RpcHandler = Box<dyn FnMut(&[u8]) -> Result<Vec<u8>, ulnet_msg::wire::Status> + Send>;

/// A service hosted by a node. Every hook has a default that does nothing.
pub trait Service: Send {
    /// Its name (logs).
    fn name(&self) -> &'static str;
    /// Its id on the wire (at least [`SERVICE_ID_MIN`], unique per node).
    fn id(&self) -> u16;
    /// Control-plane methods to serve: (method id, handler). Called once at start.
    fn rpc_methods(&mut self) -> Vec<(u16, RpcHandler)> {
        Vec::new()
    }
    /// A view was installed.
    fn on_view(&mut self, _view: &View, _ctx: &mut ServiceContext<'_>) {}
    /// A membership event (suspicions, deaths, joins, loss of quorum).
    fn on_event(&mut self, _event: &MembershipEvent, _ctx: &mut ServiceContext<'_>) {}
    /// A message from this service on member `from`.
    fn on_message(&mut self, _from: MemberId, _data: &[u8], _ctx: &mut ServiceContext<'_>) {}
    /// Called at least every 20 ms.
    fn on_tick(&mut self, _now: Instant, _ctx: &mut ServiceContext<'_>) {}
}

/// What a service can see and do from its hooks.
pub struct ServiceContext<'a> {
    pub(crate) me: &'a Member,
    pub(crate) view: Option<&'a View>,
    pub(crate) quorum: bool,
    pub(crate) service: u16,
    pub(crate) outbox: &'a mut Vec<(MemberId, u16, Vec<u8>)>,
}

impl ServiceContext<'_> {
    /// This node.
    pub fn me(&self) -> &Member {
        self.me
    }
    /// The installed view, if any.
    pub fn view(&self) -> Option<&View> {
        self.view
    }
    /// Whether this node acts as a member of a view with quorum.
    pub fn has_quorum(&self) -> bool {
        self.quorum
    }
    /// Sends `data` to this service on member `to` (reliable, in order per member; sent
    /// when the hook returns). Messages to members not in the view are dropped.
    pub fn send(&mut self, to: MemberId, data: Vec<u8>) {
        self.outbox.push((to, self.service, data));
    }
}
