//! Trace files made in memory for tests.

use ulnet_core::trace::format::{BlockHeader, FileHeader, Record, VERSION};
use ulnet_core::trace::TraceFile;

/// A file of `node` whose clock runs at `ticks_per_sec` from `(ticks, ns)`, with a
/// block reference at each later point of `refs`.
pub fn file(node: u32, boot_id: u64, ticks_per_sec: u64, refs: &[(u64, u64)], records: Vec<Record>) -> TraceFile {
    let header = FileHeader {
        version: VERSION,
        node_id: node,
        pid: node,
        boot_id,
        ref_ticks: refs[0].0,
        ref_mono_ns: refs[0].1,
        ref_real_ns: refs[0].1 + 1_700_000_000_000_000_000 + u64::from(node) * 12_345,
        ticks_per_sec,
    };
    let blocks = (refs[1..].iter().enumerate())
        .map(|(i, &(ref_ticks, ref_mono_ns))| BlockHeader {
            flags: 0,
            record_count: 0,
            sequence: i as u32,
            dropped_total: 0,
            ref_ticks,
            ref_mono_ns,
        })
        .collect();
    TraceFile { header, blocks, records }
}

/// The records with each run written as its messages one by one, each at the ticks
/// the loader used to give it when it expanded runs (with its stage times moved along).
pub fn one_by_one(records: &[Record]) -> Vec<Record> {
    let mut out = Vec::new();
    for r in records {
        let count = u64::from(r.count.max(1));
        let span = r.last_ticks.saturating_sub(r.ticks);
        for i in 0..count {
            let ticks = match count {
                1 => r.ticks,
                _ => r.ticks + (u128::from(span) * u128::from(i) / u128::from(count - 1)) as u64,
            };
            let moved = |stage: u64| if stage == 0 { 0 } else { stage + (ticks - r.ticks) };
            out.push(Record {
                ticks,
                last_ticks: ticks,
                count: 1,
                enqueued: moved(r.enqueued),
                sent: moved(r.sent),
                received: moved(r.received),
                handler_start: moved(r.handler_start),
                handler_end: moved(r.handler_end),
                ..*r
            });
        }
    }
    out
}
