//! GUP's settings, each with what it does, what it costs and why its default is what it is,
//! and named profiles.

use std::time::Duration;

/// Settings of one GUP participant. Use a profile ([`GupConfig::local`], [`GupConfig::lan`],
/// [`GupConfig::sim`]) and change what you need.
#[derive(Clone, Debug)]
pub struct GupConfig {
    /// Period of the housekeeping tick: retransmissions, takeovers, repairs and deadlines are
    /// checked this often. Shorter reacts faster to loss at the cost of wake-ups. Default: a
    /// quarter of `retransmit_after`, so a lost message is resent at most 25% late.
    pub tick: Duration,
    /// How long a sender waits for a grant or for acknowledgements before sending again.
    /// Should exceed a round trip plus an fsync; 2 ms on loopback with fast disks, 20 ms on a
    /// LAN. Too short only costs duplicates (every message is idempotent).
    pub retransmit_after: Duration,
    /// How long the locker leaves a granted, uncommitted update to its sender before it takes
    /// the transmission over (case 1: the sender failed). A few retransmission periods, so a
    /// live sender normally finishes first.
    pub takeover_after: Duration,
    /// How long a receiver tolerates a hole in its log before asking the locker for the
    /// missing positions. A few retransmission periods: the sender's own resend usually fills
    /// it first.
    pub repair_after: Duration,
    /// Period of the locker's heartbeat, which carries the committed position to everyone
    /// and brings members that missed the locker's sync into its epoch. Heartbeats cost one
    /// message per member per period and an acknowledgement back (at 32 nodes and 50 ms:
    /// 1,240 messages a second), so they are not fast; reads start a round of their own,
    /// and the commit of an update reaches the members that hold it with the next update
    /// or at most this late.
    pub heartbeat_interval: Duration,
    /// How often a new locker repeats its sync request to members that have not answered.
    pub sync_retry: Duration,
    /// A client's update that is not committed within this time is reported
    /// [`crate::gup::Event::Indeterminate`] (it may still be applied later). Bounds every
    /// client's wait; a slow member is the failure detector's business.
    pub update_timeout: Duration,
    /// Same bound for a linearizable read.
    pub read_timeout: Duration,
    /// Lock requests a sender keeps outstanding (pipelining). More hides more latency;
    /// each costs one batch of memory. 8 keeps a loopback cluster busy.
    pub window: usize,
    /// Most updates carried under one lock grant (batching). Larger batches amortise the
    /// protocol's messages; the wire limit is [`crate::codec::BATCH_UPDATES_MAX`].
    pub batch_updates_max: usize,
    /// Most bytes of updates under one lock grant.
    pub batch_bytes_max: usize,
    /// Most client updates queued at a sender before [`crate::gup::SubmitError::QueueFull`]
    /// (back-pressure instead of unbounded memory).
    pub queue_max: usize,
    /// Most log entries sent in one catch-up message (bigger gaps take several).
    pub catchup_entries_max: usize,
    /// Positions the locker lets be granted and not yet committed before it holds new lock
    /// requests back until a commit: the requests that arrive meanwhile are then granted
    /// together, as one combined entry. This is what batches when many senders each have
    /// one update at a time (16 clients spread over 32 nodes): each position costs every
    /// member a message, a log write and an acknowledgement, whatever it carries. Fewer
    /// means bigger batches and less work per update, more means more pipelining. It also
    /// bounds the uncommitted tail of the log when a quorum is missing (and with it every
    /// sync state and snapshot record). Default 1 on loopback: with the grant hold below,
    /// every sender's next updates join one position while the previous one commits (2
    /// split the senders into two groups that alternate, half as much per position).
    pub grants_in_flight_max: u64,
    /// How long the locker holds the first queued lock request for others to join it under
    /// one grant. Zero: requests are granted when the host next polls, after the burst of
    /// input it processed — which already gathers concurrent requests without adding
    /// latency. The simulator polls after every message, so its profile waits a little to
    /// exercise combined grants.
    pub grant_delay: Duration,
    /// How long the locker holds grantable lock requests for a recently active sender that
    /// has nothing queued and nothing in flight — its clients were just answered and their
    /// next updates are on the way — so that they share the next position instead of
    /// taking one of their own. With many senders of one update each (16 clients over 32
    /// nodes) every position costs every member a wake-up, a log write, an fsync and an
    /// acknowledgement, and the locker a message from and to each of them, whatever it
    /// carries: gathering them is what makes the work per update small. Bounded, so a
    /// sender that stops costs the others at most this much once. Zero: no holding. Default
    /// 2 ms on loopback: a client's round trip through its node on a loaded machine.
    pub grant_hold_max: Duration,
    /// A sender that has not asked for the lock for this long is no longer waited for by
    /// the grant hold. A few holds: a closed-loop client asks again well within it.
    pub sender_idle_after: Duration,
    /// Voters beyond a bare quorum to which the locker delivers a combined entry at once
    /// (its senders always get it at once: it is their grant, and they answer their
    /// clients from it). The other members get the entries later, several at a time
    /// (`lazy_delivery_max`): a position then wakes, fsyncs and is acknowledged by a quorum
    /// and the spares, not by every member — at 32 nodes about half the work per position.
    /// The commit needs a quorum of acknowledgements either way, so spares absorb slow
    /// members; a missing one costs at most `lazy_delivery_max`, after which the others
    /// get the entry (and acknowledge it) too. Default 2 on loopback: two of the 32
    /// processes may be descheduled without delaying the commit. `usize::MAX`: every
    /// member at once (no lazy delivery).
    pub eager_spare: usize,
    /// How long a member outside the eager set may wait for a position: the locker
    /// delivers its owed positions together when the oldest has waited this long (or many
    /// have piled up, or with a heartbeat, or before confirming its read). Longer gathers
    /// more positions per wake-up of those members; it is also how late they apply. Default
    /// 10 ms on loopback: a few positions per delivery at 32 nodes, below `repair_after`.
    pub lazy_delivery_max: Duration,
    /// Checks a snapshot received from a peer before it replaces the local state; one that
    /// fails is dropped with the message and counted as malformed. The registry sets its
    /// decoder here; the default accepts any bytes.
    pub snapshot_valid: fn(&[u8]) -> bool,
}

impl GupConfig {
    /// Processes on one machine (loopback, local disk): millisecond timers.
    pub fn local() -> Self {
        let retransmit_after = Duration::from_millis(4);
        Self {
            tick: retransmit_after / 4,
            retransmit_after,
            takeover_after: retransmit_after * 4,
            repair_after: retransmit_after * 3,
            heartbeat_interval: Duration::from_millis(50),
            sync_retry: Duration::from_millis(10),
            update_timeout: Duration::from_secs(5),
            read_timeout: Duration::from_secs(5),
            window: 8,
            batch_updates_max: 1024,
            batch_bytes_max: 1 << 20,
            queue_max: 1 << 16,
            catchup_entries_max: 4096,
            grants_in_flight_max: 1,
            grant_delay: Duration::ZERO,
            grant_hold_max: Duration::from_millis(2),
            sender_idle_after: Duration::from_millis(20),
            eager_spare: 2,
            lazy_delivery_max: Duration::from_millis(10),
            snapshot_valid: |_| true,
        }
    }

    /// A LAN: tens of milliseconds, tolerant of scheduling delays on loaded machines.
    pub fn lan() -> Self {
        let retransmit_after = Duration::from_millis(20);
        Self {
            tick: retransmit_after / 4,
            retransmit_after,
            takeover_after: retransmit_after * 4,
            repair_after: retransmit_after * 3,
            heartbeat_interval: Duration::from_millis(50),
            sync_retry: Duration::from_millis(50),
            ..Self::local()
        }
    }

    /// The simulator's network (50–150 µs one way, simulated fsync of about 1 ms): like
    /// `local`, with small batches and catch-ups so that the fault paths are exercised, and
    /// quick heartbeats so that short runs settle.
    pub fn sim() -> Self {
        Self {
            heartbeat_interval: Duration::from_millis(10),
            batch_updates_max: 8,
            catchup_entries_max: 16,
            grants_in_flight_max: 4,
            window: 4,
            grant_delay: Duration::from_micros(300),
            grant_hold_max: Duration::from_micros(500),
            sender_idle_after: Duration::from_millis(5),
            // No spare, so that the lazy delivery paths run in every schedule.
            eager_spare: 0,
            lazy_delivery_max: Duration::from_millis(3),
            ..Self::local()
        }
    }
}

impl Default for GupConfig {
    fn default() -> Self {
        Self::local()
    }
}
