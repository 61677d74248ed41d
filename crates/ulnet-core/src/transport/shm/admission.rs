//! Who may meet whom over a shared-memory rendezvous, and what happens to those refused.
//!
//! The rendezvous sockets live in the abstract Unix socket namespace, which has no file
//! permissions: any process of the host (of the network namespace) can connect to any
//! name, and any process can bind a name first. So both ends judge the other by the
//! credentials the kernel recorded for the connection (`SO_PEERCRED`, `SO_PEERGROUPS`),
//! before anything is handed over, as D-Bus and systemd's socket units do:
//!
//! - A **listener** admits processes of its own effective user, and of the users and
//!   groups its [`AllowedPeers`] lists (a group matches the peer's effective group or any
//!   of its supplementary groups). Anyone else is refused, told so, counted and logged.
//! - A **connector** hands its mapping only to a listener of its own user, of root (which
//!   can read our memory anyway, so trusting it costs nothing), or of a user or group its
//!   own [`AllowedPeers`] lists: a process of another user squatting on the name gets
//!   nothing.
//!
//! Refusals are logged at most once per [`LOG_INTERVAL`] per listener, with the number
//! left unlogged since the last line; every refusal is counted.

use crate::error::Refusal;
use crate::sys::credentials::{peer_groups, PeerCredentials};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Users and groups, besides our own user, whose processes may reach us over shared memory
/// (see the module documentation for how listeners and connectors use it).
///
/// ```
/// use ulnet_core::transport::shm::AllowedPeers;
/// let allowed = AllowedPeers::own_user().uid(65534).gid(100);
/// assert_eq!((allowed.uids.as_slice(), allowed.gids.as_slice()), (&[65534][..], &[100][..]));
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AllowedPeers {
    /// Effective user ids admitted besides our own.
    pub uids: Vec<u32>,
    /// Group ids admitted: a peer whose effective or any supplementary group is listed.
    pub gids: Vec<u32>,
}

impl AllowedPeers {
    /// Only processes of our own effective user (the default).
    pub fn own_user() -> Self {
        Self::default()
    }

    /// Admits the processes of user `uid` as well.
    pub fn uid(mut self, uid: u32) -> Self {
        self.uids.push(uid);
        self
    }

    /// Admits the processes of group `gid` as well.
    pub fn gid(mut self, gid: u32) -> Self {
        self.gids.push(gid);
        self
    }

    /// Whether the peer's user or one of its groups is listed.
    fn lists(&self, peer: &PeerCredentials, socket: impl AsFd) -> bool {
        if self.uids.contains(&peer.uid) || self.gids.contains(&peer.gid) {
            return true;
        }
        // Supplementary groups cost a system call: only asked when a group could match.
        !self.gids.is_empty() && peer_groups(socket).is_ok_and(|groups| groups.iter().any(|g| self.gids.contains(g)))
    }

    /// A listener's judgement of `peer`, the process that connected on `socket`.
    pub(crate) fn admit_connector(&self, peer: &PeerCredentials, socket: impl AsFd) -> Result<(), Refusal> {
        if peer.is_our_user() || self.lists(peer, socket) {
            Ok(())
        } else {
            Err(Refusal::PeerNotAllowed { uid: peer.uid, gid: peer.gid })
        }
    }

    /// A connector's judgement of `peer`, the process listening at the other end of
    /// `socket`.
    pub(crate) fn admit_listener(&self, peer: &PeerCredentials, socket: impl AsFd) -> Result<(), Refusal> {
        if peer.is_our_user() || peer.uid == 0 || self.lists(peer, socket) {
            Ok(())
        } else {
            Err(Refusal::ListenerNotAllowed { uid: peer.uid, gid: peer.gid })
        }
    }
}

/// Bytes of a refusal on the wire: reason, uid, gid (little-endian u32s).
pub(crate) const REFUSAL_LEN: usize = 12;

/// A refusal as a listener tells it (a connector's refusal of a listener is never sent; it
/// would go as "unidentified"). Codes: 1 — peer not allowed, 2 — secret, 3 — unidentified.
pub(crate) fn encode_refusal(r: &Refusal) -> [u8; REFUSAL_LEN] {
    let (reason, uid, gid) = match *r {
        Refusal::PeerNotAllowed { uid, gid } => (1u32, uid, gid),
        Refusal::Secret => (2, 0, 0),
        Refusal::Unidentified | Refusal::ListenerNotAllowed { .. } => (3, 0, 0),
    };
    let mut b = [0u8; REFUSAL_LEN];
    for (i, v) in [reason, uid, gid].into_iter().enumerate() {
        b[4 * i..4 * i + 4].copy_from_slice(&v.to_le_bytes());
    }
    b
}

/// The refusal a listener told, if its code names one.
pub(crate) fn decode_refusal(b: &[u8; REFUSAL_LEN]) -> Option<Refusal> {
    let word = |i: usize| u32::from_le_bytes(b[4 * i..4 * i + 4].try_into().expect("4 bytes"));
    match word(0) {
        1 => Some(Refusal::PeerNotAllowed { uid: word(1), gid: word(2) }),
        2 => Some(Refusal::Secret),
        3 => Some(Refusal::Unidentified),
        _ => None,
    }
}

/// What a listener's rendezvous did with the processes that connected to it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AdmissionCounters {
    /// Peers that passed the checks (credentials and, where asked, the secret).
    pub admitted: u64,
    /// Peers refused for their credentials (a user or group not allowed).
    pub refused_credentials: u64,
    /// Peers refused for failing to prove the cluster secret.
    pub refused_secret: u64,
    /// Rendezvous that failed otherwise: garbage, silence past the deadline, another
    /// protocol version, a mapping that does not validate.
    pub failed: u64,
}

/// Lines logged about refusals at most once per this interval per listener. 1 s: a flood
/// of refused connections costs one log line a second, and an operator still sees the
/// first refusal at once.
pub(crate) const LOG_INTERVAL: Duration = Duration::from_secs(1);

/// The counters of one listener (or of all of a node's listeners) and its log's limiter.
/// Written by whichever thread ran the rendezvous.
#[derive(Debug)]
pub(crate) struct AdmissionCells {
    admitted: AtomicU64,
    refused_credentials: AtomicU64,
    refused_secret: AtomicU64,
    failed: AtomicU64,
    log: RateLimit,
}

impl Default for AdmissionCells {
    fn default() -> Self {
        Self {
            admitted: AtomicU64::new(0),
            refused_credentials: AtomicU64::new(0),
            refused_secret: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            log: RateLimit::new(LOG_INTERVAL),
        }
    }
}

impl AdmissionCells {
    pub(crate) fn snapshot(&self) -> AdmissionCounters {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        AdmissionCounters {
            admitted: get(&self.admitted),
            refused_credentials: get(&self.refused_credentials),
            refused_secret: get(&self.refused_secret),
            failed: get(&self.failed),
        }
    }

    pub(crate) fn admitted(&self) {
        self.admitted.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts and logs (rate-limited) a refused peer of the rendezvous `what`.
    pub(crate) fn refused(&self, what: &str, refusal: &Refusal, peer_pid: Option<i32>) {
        let cell = match refusal {
            Refusal::Secret => &self.refused_secret,
            _ => &self.refused_credentials,
        };
        cell.fetch_add(1, Ordering::Relaxed);
        if let Some(unlogged) = self.log.pass() {
            tracing::warn!(pid = peer_pid, unlogged_since_last_line = unlogged, "{what}: {refusal}");
        }
    }

    /// Counts and logs (rate-limited, at debug level) a rendezvous that failed otherwise.
    pub(crate) fn failed(&self, what: &str, error: &dyn std::fmt::Display) {
        self.failed.fetch_add(1, Ordering::Relaxed);
        if let Some(unlogged) = self.log.pass() {
            tracing::debug!(unlogged_since_last_line = unlogged, "{what}: rendezvous failed: {error}");
        }
    }
}

/// Lets one event in per interval through, and counts those held back.
#[derive(Debug)]
struct RateLimit {
    epoch: Instant,
    interval_ms: u64,
    /// Milliseconds after `epoch` from which the next event passes.
    next_ms: AtomicU64,
    held: AtomicU64,
}

impl RateLimit {
    fn new(interval: Duration) -> Self {
        Self {
            epoch: Instant::now(),
            interval_ms: interval.as_millis() as u64,
            next_ms: AtomicU64::new(0),
            held: AtomicU64::new(0),
        }
    }

    /// `Some(events held back since the last that passed)` if this one passes.
    fn pass(&self) -> Option<u64> {
        let now = self.epoch.elapsed().as_millis() as u64;
        let next = self.next_ms.load(Ordering::Relaxed);
        if now >= next
            && self.next_ms.compare_exchange(next, now + self.interval_ms, Ordering::Relaxed, Ordering::Relaxed).is_ok()
        {
            return Some(self.held.swap(0, Ordering::Relaxed));
        }
        self.held.fetch_add(1, Ordering::Relaxed);
        None
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;

    #[test]
    fn our_own_user_is_admitted_both_ways() {
        let (a, _b) = UnixStream::pair().unwrap();
        let peer = PeerCredentials::of(&a).unwrap();
        assert!(AllowedPeers::own_user().admit_connector(&peer, &a).is_ok());
        assert!(AllowedPeers::own_user().admit_listener(&peer, &a).is_ok());
    }

    #[test]
    fn refusals_round_trip() {
        for r in [Refusal::PeerNotAllowed { uid: 65534, gid: 100 }, Refusal::Secret, Refusal::Unidentified] {
            assert_eq!(decode_refusal(&encode_refusal(&r)), Some(r));
        }
        assert_eq!(decode_refusal(&[9; REFUSAL_LEN]), None);
    }

    #[test]
    fn one_event_per_interval_passes_and_the_rest_are_counted() {
        let limit = RateLimit::new(Duration::from_secs(3600));
        assert_eq!(limit.pass(), Some(0));
        for _ in 0..5 {
            assert_eq!(limit.pass(), None);
        }
        // The next interval begins: the line that passes says how many were held back.
        limit.next_ms.store(0, Ordering::Relaxed);
        assert_eq!(limit.pass(), Some(5));
    }
}
