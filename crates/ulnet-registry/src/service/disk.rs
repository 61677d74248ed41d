//! What a node's registry does when its disk fails (no space, a quota, an I/O error on a
//! write or an fsync): it stops taking part — it can no longer make what it promises
//! durable — and tells its clients why; it cuts its log back to what its last successful
//! fsync covered; and every [`DISK_RETRY_INTERVAL`] it probes the disk, and once the disk
//! takes writes again reads its log back, as a restart of the node would, so that the
//! service can start the registry again in place under the same identity.
//!
//! ```text
//!  running --write/fsync error--> stopped(disk) --probe ok, log read--> running (restarts+1)
//!                                   |   ^ probe or read fails
//!                                   |   +---+
//!                                   +--log corrupted--> stopped(corrupt): restart the node
//! ```

use crate::gup::Recovered;
use crate::wal::{self, DurableMark, TailKind, WalError};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How often a registry stopped by its disk tries it again. A try costs one write and fsync
/// of a megabyte while the disk is still full — nothing to it — and clients wait at most
/// this long after the disk has room again.
pub const DISK_RETRY_INTERVAL: Duration = Duration::from_secs(1);

/// Bytes the probe writes and fsyncs before the registry restarts: room for the restart's
/// own records and over a thousand typical updates, so that a disk with a few bytes free
/// does not restart the registry only to stop it again at once.
const PROBE_BYTES: usize = 1 << 20;

/// The probe's file, beside the log's segments (removed after each probe).
const PROBE_FILE: &str = "disk-probe.tmp";

/// How often the node's log repeats that its registry is still stopped.
const STILL_STOPPED_LOG_EVERY: Duration = Duration::from_secs(60);

/// Why a node's registry is stopped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StopCause {
    /// The disk refused a write or an fsync; tried again every [`DISK_RETRY_INTERVAL`].
    Disk(WalError),
    /// Once the disk took writes again, the log read back had a corrupted tail: only a
    /// restart of the node helps (it comes back under a new identity).
    Corrupt {
        /// The log's directory.
        dir: PathBuf,
        /// What was wrong.
        reason: String,
    },
}

impl std::fmt::Display for StopCause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StopCause::Disk(e) => {
                write!(f, "registry stopped: {e}; retrying every {} s", DISK_RETRY_INTERVAL.as_secs())
            }
            StopCause::Corrupt { dir, reason } => write!(
                f,
                "registry stopped: its log in {} is corrupted ({reason}); restart the node: it rejoins under a \
                 new identity and recovers the log from its peers",
                dir.display()
            ),
        }
    }
}

/// A registry stopped by its disk: why, and when it tries again.
pub struct Stopped {
    cause: StopCause,
    /// Where the log's fsynced bytes end (None: the failure came before the log was open).
    mark: Option<DurableMark>,
    since: Instant,
    next_try: Instant,
    next_log: Instant,
}

impl Stopped {
    /// Stops on `error`, with the log in `dir` whose fsynced bytes end at `mark`: cuts off
    /// what lies beyond (a failed write's remains, which nobody was told about), or leaves
    /// that to the first try when the cut fails too.
    pub fn new(dir: &Path, error: WalError, mark: Option<DurableMark>, now: Instant) -> Self {
        let cause = StopCause::Disk(error);
        tracing::error!("{cause}");
        if let Some(mark) = mark {
            if let Err(e) = wal::cut_to_durable(dir, mark) {
                tracing::warn!("registry log: not cut back to its last fsync yet ({e}); cut before it is read again");
            }
        }
        Self { cause, mark, since: now, next_try: now + DISK_RETRY_INTERVAL, next_log: now + STILL_STOPPED_LOG_EVERY }
    }

    /// Why it is stopped.
    pub fn cause(&self) -> &StopCause {
        &self.cause
    }

    /// Where the log's fsynced bytes end, as the writer that failed left them.
    pub fn mark(&self) -> Option<DurableMark> {
        self.mark
    }

    /// When to try the disk again (None: never, the log is corrupted).
    pub fn next_try(&self) -> Option<Instant> {
        matches!(self.cause, StopCause::Disk(_)).then_some(self.next_try)
    }

    /// Tries the disk in `dir` at `now`, if due: when it takes a probe's writes, cuts the
    /// log back to its last fsync and reads it as a restart of the node would (a torn tail
    /// cut, the records fsynced). Returns the log's records to start again from, or None
    /// (and tries again later, or never once the log is found corrupted).
    pub fn try_reopen(&mut self, dir: &Path, now: Instant) -> Option<Recovered> {
        if self.next_try().is_none_or(|t| now < t) {
            return None;
        }
        match self.reopen(dir) {
            Ok(recovered) => {
                tracing::info!(
                    stopped_s = now.saturating_duration_since(self.since).as_secs(),
                    "registry: the disk takes writes again; restarting in place from the log"
                );
                Some(recovered)
            }
            Err(cause) => {
                let changed = cause != self.cause;
                self.cause = cause;
                self.next_try = now + DISK_RETRY_INTERVAL;
                if changed || now >= self.next_log {
                    self.next_log = now + STILL_STOPPED_LOG_EVERY;
                    tracing::warn!("{}", self.cause);
                }
                None
            }
        }
    }

    fn reopen(&self, dir: &Path) -> Result<Recovered, StopCause> {
        let disk = |e: std::io::Error| StopCause::Disk(WalError::from_io(dir, &e));
        probe(dir).map_err(disk)?;
        if let Some(mark) = self.mark {
            wal::cut_to_durable(dir, mark).map_err(disk)?;
        }
        let scan = wal::scan(dir).map_err(disk)?;
        if let Some(r) = scan.refused().filter(|r| r.kind == TailKind::Corrupt) {
            let reason = format!("{} at offset {} of {}", r.reason, r.offset, r.file.display());
            return Err(StopCause::Corrupt { dir: dir.to_path_buf(), reason });
        }
        Ok(scan.cut().map_err(disk)?.recovered)
    }
}

/// Whether the disk under `dir` takes writes: [`PROBE_BYTES`] written and fsynced in a file
/// that is removed again.
fn probe(dir: &Path) -> std::io::Result<()> {
    let path = dir.join(PROBE_FILE);
    let written = std::fs::File::create(&path).and_then(|mut f| {
        f.write_all(&vec![0u8; PROBE_BYTES])?;
        f.sync_all()
    });
    let removed = std::fs::remove_file(&path);
    written.and(removed)
}
