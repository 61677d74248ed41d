//! Remote memory segments: protected one-sided READ, WRITE, compare-and-swap and
//! fetch-and-add on memory other processes export, with data transfer separate from
//! control transfer (Thekkath et al., "Separating data and control transfer in distributed
//! operating systems"; the 64-bit atomics of InfiniBand).
//!
//! ```text
//!   initiator (Rma)                                   target (Rma: exports + engine)
//!   get / put / compare_and_swap / fetch_and_add      ExportTable: slot = state word
//!     |  mapped (same host) ---- loads, stores, -----> segment pages (memfd), checked
//!     |                          lock cmpxchg/xadd     against the control block
//!     |  channel (shm, tcp, udp, any Transport) -wire-> Engine thread: check, apply,
//!     |  <------------------------------------------ respond; notify if asked
//!   poll -> completions, flush, fence                 Notifications: queue + eventfd
//! ```
//!
//! Layers, one file per concern: [`rights`] (who may do what: nodes, segments,
//! generations, rights, notify modes), `segment` (the export table and the owner's
//! [`ExportedSegment`]), [`wire`] (requests and responses), `target` (checks and
//! application), `engine` (the target's progress engine), `accept` (its [`Acceptor`]s, which never block it),
//! `initiator` ([`Rma`]: operations, completions, flush, fence), `mapped` and
//! `control` (the same-host path and its control block), `rendezvous` (same-host
//! import by `SCM_RIGHTS`), `memory` (mappings and atomic access), `notify`
//! ([`Notifications`]), [`names`] (the segment name service).
//!
//! # Protection
//!
//! An owner exports a segment with rights per importer node (read, write, atomic), a
//! notify mode and a fresh generation. Every request carries segment id, generation,
//! offset and length, and is checked before memory is touched (see `target`): a failed
//! check answers a typed [`AccessError`], is counted in [`TargetCounters`], and changes
//! nothing. Revoking a segment ([`ExportedSegment::revoke`]) retires its generation:
//! later requests fail with `Revoked` (and after a re-export, old handles fail with
//! `StaleGeneration`).
//!
//! On the same host an importer maps the segment and accesses it with no involvement of
//! the owner's process; its library makes the target's checks against the owner's control
//! block, and the mapping is read-only unless it may write. Revocation still holds:
//! the owner flips the control block, waits out any store in progress (a Dekker handshake
//! made cheap for the importer with `membarrier`), and migrates the segment to a fresh
//! memory file mapped over its own addresses, so a stale mapping no longer aliases the
//! owner's memory whatever the importer does with it. What same-host protection does not
//! stop is a hostile process of the same user: it can read any of our memory through
//! `/proc` or `ptrace` anyway. The rendezvous refuses processes of other users.
//!
//! # Who is an importer (the trust model)
//!
//! Rights name nodes, so what matters is how a target knows an importer's node id:
//!
//! - **Over tcp and udp** the channel's handshake proves the cluster secret
//!   (`TcpConfig::secret`, `UdpConfig::secret`) both ways, and the importer's node id is
//!   inside the MACs; the importer's Hello must name the same node (a channel whose
//!   handshake named none may introduce itself as any node). A stranger without the secret
//!   gets no channel at all.
//! - **On the same host** both ends first judge each other's credentials (`SO_PEERCRED`:
//!   our own user, and the users and groups of `ShmConfig::allowed`), then prove
//!   `ShmConfig::secret` as over tcp, on shared-memory channels and in the rendezvous
//!   alike, the node id again inside the MACs.
//!
//! So per-node rights are enforced against authenticated holders of the secret (and, on
//! one host, admitted users): they keep each node of a cluster to what it was granted, and
//! keep everyone without the secret out. They do not stop a holder of the secret who lies
//! about its node id: the secret is the boundary of trust, as it is for the cluster's
//! membership and control plane. With the empty secret (the default, for development on
//! one host) anyone who reaches a tcp or udp listener is an importer of any node id; the
//! command-line tools refuse to listen beyond loopback that way.
//!
//! # Ordering and atomicity
//!
//! - **Word atomicity.** Every access moves each 8-byte-aligned word of its range with a
//!   single 64-bit load or store, and `compare_and_swap` / `fetch_and_add` are
//!   `lock cmpxchg` / `lock xadd` on the segment's pages themselves. So an aligned word is
//!   atomic with respect to the owner's local loads, stores and atomics on it
//!   ([`ExportedSegment::load_u64`], `store_u64`, `fetch_add_u64`, `compare_swap_u64`),
//!   whether the remote access came through the engine or a mapping: a reader never sees a
//!   torn word, and remote and local atomics on one word are linearizable together.
//!   Bytes outside aligned words, and a range as a whole, have no atomicity: a get that
//!   races a put may see part of it.
//! - **Per peer, in order.** Operations from one `Rma` to one peer are applied at the
//!   target in the order they were posted (channels are reliable and ordered, the engine
//!   applies each channel's requests in order; mapped operations are performed in program
//!   order, each put fenced after the last). Completions for one peer arrive in order.
//! - **Across peers, no order** unless asked: [`Rma::fence`] makes every later operation
//!   wait for those before it; [`Rma::flush`] reports when everything posted so far has
//!   completed at its targets.
//! - **Completion means applied.** A put's completion (or its `Done` on a mapping) means
//!   the target's memory holds the data; a get's carries the data; an atomic's carries the
//!   previous value.
//! - **Notification is separate.** Data lands silently. An access raises a
//!   [`Notification`] for the owner only when the segment's [`NotifyMode`] is `Always`, or
//!   `Conditional` and the request set the notify bit ([`RemoteSegment::with_notify`]);
//!   the notification follows the data it reports.

mod accept;
mod control;
mod engine;
pub mod error;
mod initiator;
mod mapped;
mod memory;
pub mod names;
mod notify;
mod rendezvous;
pub mod rights;
mod segment;
mod target;
pub mod wire;

pub use accept::{Acceptor, ShmAcceptor, TcpAcceptor, UdpAcceptor, HANDSHAKES_MAX};
pub use error::{AccessError, ExportError, ImportError, RmaError};
pub use initiator::{
    Completed, ImportMode, InitiatorCounters, PeerId, Progress, RemoteSegment, Rma, RmaCompletion, RmaConfig,
    RmaOutcome, PUT_INLINE_MAX,
};
pub use notify::{AccessKind, Notification, Notifications};
pub use rights::{Access, Generation, NodeId, NotifyMode, Rights, SegmentId, GRANTS_MAX};
pub use segment::{ExportedSegment, RevokeReport, SegmentDescriptor};
pub use target::TargetCounters;
pub use wire::NAME_MAX;
