//! Records leave the traced operation's thread through a bounded in-memory ring and are
//! encoded and written by one writer thread, so a traced operation never waits for the
//! trace file.
//!
//! **When the ring is full** the record is dropped, never waited for: the operation it
//! describes goes on unchanged, the drop is counted, the count is carried in every block
//! header written after it (`dropped_total`) and the report says how many records are
//! missing. A record made after [`Recorder::finish`] began is counted the same way.
//!
//! **Sizing.** [`RING_RECORDS_DEFAULT`] records of about 100 bytes in memory (16 MiB at
//! most): the pass-through serves a request in 5 µs at the fastest, so the ring covers
//! more than a second of the writer thread getting no CPU (both cores busy, the disk
//! stalled) before anything is dropped; the writer encodes a record in about 100 ns, so
//! it catches up quickly.

use crate::format::{FileKind, Record};
use crate::writer::{TraceWriter, WriteError, WriteSummary};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// Records the ring holds by default (see the module documentation).
pub const RING_RECORDS_DEFAULT: usize = 1 << 17;
/// The writer thread writes what it has at least this often, so a trace of a run that
/// is killed loses at most this much of it.
pub const FLUSH_INTERVAL: Duration = Duration::from_millis(500);

/// The recording side: cheap to clone, one per thread that records.
#[derive(Clone)]
pub struct RecordSink {
    tx: SyncSender<Message>,
    shared: Arc<Shared>,
    start_mono_ns: u64,
}

/// What goes through the ring.
enum Message {
    Record(Record),
    /// Everything recorded before `finish` is ahead of this.
    End,
}

struct Shared {
    dropped: AtomicU64,
    stopping: AtomicBool,
}

impl RecordSink {
    /// Hands a record to the writer thread, or drops and counts it when the ring is full.
    pub fn record(&self, record: Record) {
        if self.shared.stopping.load(Ordering::Relaxed) {
            self.shared.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        match self.tx.try_send(Message::Record(record)) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.shared.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Nanoseconds since the trace's start (the time base of every record).
    pub fn now_ns(&self) -> u64 {
        crate::clock::mono_ns().saturating_sub(self.start_mono_ns)
    }

    /// Records dropped so far.
    pub fn dropped(&self) -> u64 {
        self.shared.dropped.load(Ordering::Relaxed)
    }
}

/// A trace being recorded into a file.
pub struct Recorder {
    sink: RecordSink,
    writer: JoinHandle<Result<WriteSummary, WriteError>>,
}

impl Recorder {
    /// Creates the trace file and starts its writer thread with a ring of `ring_records`.
    pub fn start(path: &Path, ring_records: usize) -> Result<Recorder, WriteError> {
        let start_mono_ns = crate::clock::mono_ns();
        let file = TraceWriter::create(path, FileKind::Trace, start_mono_ns)?;
        let (tx, rx) = sync_channel(ring_records.max(1));
        let shared = Arc::new(Shared { dropped: AtomicU64::new(0), stopping: AtomicBool::new(false) });
        let thread_shared = shared.clone();
        let io = |source| WriteError::Io { path: path.into(), source };
        let writer = std::thread::Builder::new()
            .name("fsstudy-writer".into())
            .spawn(move || drain(file, rx, &thread_shared))
            .map_err(io)?;
        Ok(Recorder { sink: RecordSink { tx, shared, start_mono_ns }, writer })
    }

    /// A sink to record with.
    pub fn sink(&self) -> RecordSink {
        self.sink.clone()
    }

    /// Stops recording: records made from now on are counted as dropped; the writer thread
    /// writes what the ring holds and the end block. Sinks may outlive this.
    pub fn finish(self) -> Result<WriteSummary, WriteError> {
        self.sink.shared.stopping.store(true, Ordering::Relaxed);
        // Queued behind every record made before `stopping` was set: none is left behind.
        // (It waits for room: the writer thread is draining.)
        let _ = self.sink.tx.send(Message::End);
        drop(self.sink);
        self.writer.join().unwrap_or_else(|_| panic!("the trace writer thread panicked"))
    }
}

/// The writer thread: encodes records as they come, writes a block when one fills or the
/// flush interval passes, and the end block at the end marker.
fn drain(
    mut file: TraceWriter<std::io::BufWriter<std::fs::File>>,
    rx: Receiver<Message>,
    shared: &Shared,
) -> Result<WriteSummary, WriteError> {
    let dropped = || shared.dropped.load(Ordering::Relaxed);
    loop {
        match rx.recv_timeout(FLUSH_INTERVAL) {
            Ok(Message::End) => break,
            Ok(Message::Record(record)) => file.push(&record, dropped())?,
            Err(RecvTimeoutError::Timeout) => file.flush(dropped())?,
            Err(RecvTimeoutError::Disconnected) => break,
        }
    }
    file.finish(dropped())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::Op;

    #[test]
    fn a_full_ring_drops_and_counts_and_never_blocks() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("t.fstrace");
        let recorder = Recorder::start(&path, 4).expect("starts");
        let sink = recorder.sink();
        // The writer may take some as they come: at least `n - 4 - taken` are dropped, and
        // every record is either written or counted.
        let n = 200_000u64;
        for i in 0..n {
            sink.record(Record::Op(Op { kind: 12, start_ns: i, ..Default::default() }));
        }
        let summary = recorder.finish().expect("finishes");
        assert_eq!(summary.records + summary.dropped, n, "every record is written or counted as dropped");
        let file = crate::reader::read_path(&path).expect("reads");
        assert!(file.is_whole(), "{:?}", file.damage);
        assert_eq!(file.records.len() as u64, summary.records);
        assert_eq!(file.dropped, summary.dropped, "the last block carries the count");
    }

    #[test]
    fn records_after_finish_are_counted_as_dropped() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("t.fstrace");
        let recorder = Recorder::start(&path, 64).expect("starts");
        let sink = recorder.sink();
        sink.record(Record::Op(Op::default()));
        recorder.finish().expect("finishes");
        sink.record(Record::Op(Op::default()));
        assert_eq!(sink.dropped(), 1);
        assert_eq!(crate::reader::read_path(&path).expect("reads").records.len(), 1);
    }
}
