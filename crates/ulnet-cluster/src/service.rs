//! The plug-in point of `ulnet node`: services hosted by the node (the replicated
//! registry, say) that need views, failure events, messages to their peers on other
//! members, and control-plane methods.
//!
//! A service is handed to [`crate::runtime::Node::start`]. It runs on the node's control
//! thread: [`Service::on_start`] once (with a [`Waker`] for threads of its own),
//! [`Service::on_view`] for every installed view (id and ordered members with addresses;
//! a node that resumes from its data directory gets its last view first),
//! [`Service::on_event`] for every membership event, [`Service::on_message`] for every
//! message from the same service on another member, [`Service::on_request`] for every
//! request of its [`Service::request_methods`], and [`Service::on_tick`] after every batch
//! of those and at its [`Service::poll_timeout`] (at least every 20 ms) — so a service that
//! does its work in `on_tick` sees all the input that arrived together first. It sends with
//! [`ServiceContext::send`]: messages to one member are ordered and reliable while the
//! channel lasts (a ulnet TCP channel per pair, authenticated with the cluster secret,
//! opened in the background; messages to a member that cannot be reached are dropped
//! after a bounded queue). Control-plane methods are served on the node's address, so
//! `ulnet registry set --connect ADDR` can call them: [`Service::rpc_methods`] answer at
//! once, [`Service::request_methods`] whenever the service calls
//! [`ServiceContext::reply`].
//!
//! Ids are on the wire and append-only: [`SERVICE_ID_MIN`] and up for services,
//! [`crate::runtime::METHOD_SERVICE_MIN`] and up for their methods.

use crate::events::MembershipEvent;
use crate::view::{Member, MemberId, View};
use std::time::Instant;
pub use ulnet_core::Waker;
pub use ulnet_msg::wire::Status;

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
    /// Control-plane methods answered by [`Service::on_request`] (ids at least
    /// [`crate::runtime::METHOD_SERVICE_MIN`]). Called once at start.
    fn request_methods(&self) -> Vec<u16> {
        Vec::new()
    }
    /// Called once before any other hook: `waker` wakes the control thread (for the
    /// service's own threads, whose results it collects in `on_tick`).
    fn on_start(&mut self, _waker: Waker, _ctx: &mut ServiceContext<'_>) {}
    /// A request for one of [`Service::request_methods`]: answer it once with
    /// [`ServiceContext::reply`], now or from a later hook.
    fn on_request(&mut self, _method: u16, _payload: &[u8], _reply: ReplyToken, _ctx: &mut ServiceContext<'_>) {}
    /// When [`Service::on_tick`] is next wanted (None: within 20 ms is soon enough).
    fn poll_timeout(&self) -> Option<Instant> {
        None
    }
    /// A view was installed.
    fn on_view(&mut self, _view: &View, _ctx: &mut ServiceContext<'_>) {}
    /// A membership event (suspicions, deaths, joins, loss of quorum).
    fn on_event(&mut self, _event: &MembershipEvent, _ctx: &mut ServiceContext<'_>) {}
    /// A message from this service on member `from`.
    fn on_message(&mut self, _from: MemberId, _data: &[u8], _ctx: &mut ServiceContext<'_>) {}
    /// Called after every batch of input, at [`Service::poll_timeout`], and at least every
    /// 20 ms.
    fn on_tick(&mut self, _now: Instant, _ctx: &mut ServiceContext<'_>) {}
    /// Called after what the hooks of this turn sent has gone out on the channels: the place
    /// for slow work whose results can wait a moment (an fsync), so that it does not delay
    /// the messages (what it sends goes out at once).
    fn on_sent(&mut self, _now: Instant, _ctx: &mut ServiceContext<'_>) {}
}

/// A request waiting for its answer ([`Service::on_request`], [`ServiceContext::reply`]).
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct ReplyToken(pub(crate) u64);

/// What a service can see and do from its hooks.
pub struct ServiceContext<'a> {
    pub(crate) me: &'a Member,
    pub(crate) view: Option<&'a View>,
    pub(crate) quorum: bool,
    pub(crate) service: u16,
    pub(crate) outbox: &'a mut Vec<(MemberId, u16, Vec<u8>)>,
    pub(crate) replies: &'a mut Vec<(ReplyToken, Result<Vec<u8>, Status>)>,
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
    /// Answers a request (sent when the hook returns).
    pub fn reply(&mut self, token: ReplyToken, result: Result<Vec<u8>, Status>) {
        self.replies.push((token, result));
    }
}
