//! What a run measured: throughput, response-time percentiles, snapshots and the soft QoS
//! figure (the percentage of snapshots in which a site's throughput guarantee was met).
//!
//! Only a site's *active* snapshots count for its figures: those in which it had requests
//! answered in both the first and the last [`ACTIVE_EDGE_SHARE`] of the snapshot. In a
//! two-website trace a site is idle while the other bursts; a guarantee is about the
//! throughput a site gets while it asks for it.

use crate::loadgen::Sample;
use serde::{Deserialize, Serialize};

/// A snapshot is *static* (or *dynamic*) when at least this share of its requests is.
pub const SNAPSHOT_CLASS_SHARE: f64 = 0.9;
/// A snapshot is active for a site if the site's requests completed within this share of
/// its start and of its end.
pub const ACTIVE_EDGE_SHARE: f64 = 0.1;

/// The kind of traffic a snapshot saw.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SnapshotKind {
    /// Mostly static requests.
    Static,
    /// Mostly dynamic requests.
    Dynamic,
    /// Both.
    Mixed,
    /// No request completed.
    Idle,
}

/// One snapshot of one site.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct Snapshot {
    /// Start, seconds since the run started.
    pub t_s: f64,
    /// Requests answered per second.
    pub tps: f64,
    /// Traffic kind.
    pub kind: SnapshotKind,
    /// The site asked for service during the whole snapshot.
    pub active: bool,
}

/// The figures of one website.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SiteReport {
    /// Website.
    pub site: u8,
    /// Requests answered correctly.
    pub ok: u64,
    /// Requests that failed (error or wrong content).
    pub failed: u64,
    /// Answered requests per second over the run.
    pub tps: f64,
    /// Median response time, ms.
    pub p50_ms: f64,
    /// 99th-percentile response time, ms.
    pub p99_ms: f64,
    /// Mean TPS over static snapshots (`None`: there were none).
    pub tps_static_bursts: Option<f64>,
    /// Mean TPS over dynamic snapshots.
    pub tps_dynamic_bursts: Option<f64>,
    /// The throughput guarantee, TPS.
    pub guarantee_tps: Option<f64>,
    /// Percentage of snapshots meeting the guarantee.
    pub qos_met_pct: Option<f64>,
    /// Active snapshots (those the figures above count).
    pub active_snapshots: usize,
    /// Every snapshot.
    pub snapshots: Vec<Snapshot>,
}

fn percentile(sorted: &[u32], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    f64::from(sorted[i]) / 1000.0
}

/// Figures of `site` from the samples of a run that lasted `elapsed_s`, in snapshots of
/// `snapshot_s` (a last partial snapshot is left out).
pub fn site_report(
    samples: &[Sample],
    site: u8,
    elapsed_s: f64,
    snapshot_s: f64,
    guarantee_tps: Option<f64>,
) -> SiteReport {
    let mine: Vec<&Sample> = samples.iter().filter(|s| s.site == site).collect();
    let ok = mine.iter().filter(|s| s.ok).count() as u64;
    let failed = mine.len() as u64 - ok;
    let mut lat: Vec<u32> = mine.iter().filter(|s| s.ok).map(|s| s.latency_us).collect();
    lat.sort_unstable();
    let bins = (elapsed_s / snapshot_s).floor().max(0.0) as usize;
    let mut counts = vec![(0u64, 0u64); bins];
    let mut edges = vec![(false, false); bins];
    for s in mine.iter().filter(|s| s.ok) {
        let at = s.done_us as f64 / 1e6 / snapshot_s;
        let b = at as usize;
        if let Some(c) = counts.get_mut(b) {
            if s.dynamic {
                c.1 += 1
            } else {
                c.0 += 1
            }
            let within = at - b as f64;
            edges[b].0 |= within < ACTIVE_EDGE_SHARE;
            edges[b].1 |= within >= 1.0 - ACTIVE_EDGE_SHARE;
        }
    }
    let snapshots: Vec<Snapshot> = counts
        .iter()
        .enumerate()
        .map(|(i, &(st, dy))| {
            let total = st + dy;
            let kind = if total == 0 {
                SnapshotKind::Idle
            } else if st as f64 >= SNAPSHOT_CLASS_SHARE * total as f64 {
                SnapshotKind::Static
            } else if dy as f64 >= SNAPSHOT_CLASS_SHARE * total as f64 {
                SnapshotKind::Dynamic
            } else {
                SnapshotKind::Mixed
            };
            Snapshot {
                t_s: i as f64 * snapshot_s,
                tps: total as f64 / snapshot_s,
                kind,
                active: edges[i] == (true, true),
            }
        })
        .collect();
    let mean_of = |k: SnapshotKind| {
        let v: Vec<f64> = snapshots.iter().filter(|s| s.active && s.kind == k).map(|s| s.tps).collect();
        (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
    };
    let active = snapshots.iter().filter(|s| s.active).count();
    let qos_met_pct = guarantee_tps
        .filter(|_| active > 0)
        .map(|g| 100.0 * snapshots.iter().filter(|s| s.active && s.tps >= g).count() as f64 / active as f64);
    SiteReport {
        site,
        ok,
        failed,
        tps: if elapsed_s > 0.0 { ok as f64 / elapsed_s } else { 0.0 },
        p50_ms: percentile(&lat, 0.5),
        p99_ms: percentile(&lat, 0.99),
        tps_static_bursts: mean_of(SnapshotKind::Static),
        tps_dynamic_bursts: mean_of(SnapshotKind::Dynamic),
        guarantee_tps,
        qos_met_pct,
        active_snapshots: active,
        snapshots,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(done_ms: u64, dynamic: bool) -> Sample {
        Sample { done_us: done_ms * 1000, latency_us: 1000 + done_ms as u32, site: 0, dynamic, ok: true }
    }

    #[test]
    fn snapshots_classify_and_meet_guarantees() {
        let mut v = Vec::new();
        v.extend((0..100).map(|i| s(i * 10, false))); // 100 static in second 0
        v.extend((0..50).map(|i| s(1000 + i * 20, true))); // 50 dynamic in second 1
        let r = site_report(&v, 0, 2.0, 1.0, Some(60.0));
        assert_eq!(r.snapshots.len(), 2);
        assert_eq!(r.snapshots[0].kind, SnapshotKind::Static);
        assert_eq!(r.snapshots[1].kind, SnapshotKind::Dynamic);
        assert_eq!(r.tps_static_bursts, Some(100.0));
        assert_eq!(r.tps_dynamic_bursts, Some(50.0));
        assert_eq!(r.qos_met_pct, Some(50.0));
        assert_eq!(r.tps, 75.0);
        assert_eq!(r.active_snapshots, 2);
        let idle_second = site_report(&v[..100], 0, 2.0, 1.0, Some(60.0));
        assert_eq!(idle_second.active_snapshots, 1, "a second without requests is not active");
        assert_eq!(idle_second.qos_met_pct, Some(100.0));
    }
}
