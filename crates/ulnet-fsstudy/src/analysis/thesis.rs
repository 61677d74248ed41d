//! The thesis's findings (Table 9.1 and the text of 9.6–9.9) beside ours. Each finding
//! states the thesis's figure, ours, and — where the finding is a claim a figure can
//! settle — the rule that decides whether it holds here; findings that are only figures
//! (a rate, a share that depends on the workload's mix) are set side by side without a
//! verdict.

use super::Study;
use serde::Serialize;

/// One finding.
#[derive(Clone, Debug, Serialize)]
pub struct Comparison {
    /// The thesis's section.
    pub section: &'static str,
    /// The finding.
    pub finding: &'static str,
    /// The thesis's figure.
    pub thesis: &'static str,
    /// Ours.
    pub ours: String,
    /// The rule that decides whether it holds (empty: figures only).
    pub rule: &'static str,
    /// Whether it holds by that rule (`None`: figures only, or nothing to judge by).
    pub holds: Option<bool>,
}

fn pct(x: f64) -> String {
    format!("{:.0}%", 100.0 * x)
}

fn bytes(x: f64) -> String {
    match x {
        x if x >= 1e9 => format!("{:.1} GB", x / 1e9),
        x if x >= 1e6 => format!("{:.1} MB", x / 1e6),
        x if x >= 1e3 => format!("{:.1} KB", x / 1e3),
        x => format!("{x:.0} B"),
    }
}

fn cmp(
    section: &'static str,
    finding: &'static str,
    thesis: &'static str,
    ours: String,
    rule: &'static str,
    holds: Option<bool>,
) -> Comparison {
    Comparison { section, finding, thesis, ours, rule, holds }
}

/// The findings, judged on `s` (a verdict only where there is data for it).
pub fn compare(s: &Study) -> Vec<Comparison> {
    let ss = &s.sessions;
    let data = ss.whole_file + ss.sequential + ss.random;
    let has_data = data > 0;
    let l = &s.lifetimes;
    let o = &s.operations;
    let ro = ss.patterns.iter().find(|r| r.mode == "read-only");
    let ro_whole = ro.map_or(0.0, |r| super::dist::share(r.whole_file, r.opens));
    let ro_seq_bytes = ro.map_or(0.0, |r| super::dist::share(r.sequential_bytes(), r.bytes()));
    let dead_within = |name: &str| l.dead_within.iter().find(|(n, _)| n == name).map_or(0.0, |d| d.1);
    let tests = &s.tails.tests;
    let heavy = tests.iter().filter(|t| t.heavy_tailed).count();
    let requests = s.tails.arrivals.iter().find(|a| a.name == "requests");
    let when = |ok: bool, v: bool| ok.then_some(v);
    vec![
        cmp(
            "9.6.2",
            "Files opened for data stay open briefly",
            "75% open < 10 ms (Sprite: 250 ms at 75%)",
            format!("{} open <= 10 ms; 75th percentile {:.2} ms", pct(ss.open_within.data_10ms), ss.open_ms_data.p75),
            "75th percentile <= 10 ms",
            when(ss.open_ms_data.n > 0, ss.open_ms_data.p75 <= 10.0),
        ),
        cmp(
            "9.6.2",
            "Most files accessed are small",
            "80% < 26 KB",
            format!("{} < 26 KB", pct(ss.files_under_26k_share)),
            "at least 70% < 26 KB",
            when(has_data, ss.files_under_26k_share >= 0.7),
        ),
        cmp(
            "9.6.2",
            "Most access is sequential",
            "60% of opens with data sequential",
            format!(
                "{} ({} whole-file)",
                pct(super::dist::share(ss.whole_file + ss.sequential, data)),
                pct(super::dist::share(ss.whole_file, data))
            ),
            "at least half of the opens with data sequential",
            when(has_data, ss.whole_file + ss.sequential >= ss.random),
        ),
        cmp(
            "9.6.2",
            "Read-only opens read whole files sequentially",
            "68% (Sprite 78%)",
            pct(ro_whole),
            "at least half",
            when(ro.is_some_and(|r| r.opens > 0), ro_whole >= 0.5),
        ),
        cmp("9.6.2", "Read-only bytes move sequentially", "58% of bytes (Sprite 89%)", pct(ro_seq_bytes), "", None),
        cmp(
            "9.6.2",
            "Sequential runs are short",
            "80% of runs <= 11 KB (Sprite < 10 KB)",
            format!("80% of runs <= {}", bytes(ss.run_bytes.p80)),
            "80th percentile <= 16 KB",
            when(ss.run_bytes.n > 0, ss.run_bytes.p80 <= 16.0 * 1024.0),
        ),
        cmp(
            "9.6.2",
            "Large files are larger",
            "top 20% of files >= 4 MB",
            format!("top 20% >= {}", bytes(ss.file_size_at_close.p80)),
            "80th percentile >= 4 MB",
            when(has_data, ss.file_size_at_close.p80 >= 4e6),
        ),
        cmp(
            "9.6.3",
            "New files die young",
            "81%: 26% overwritten within 4 ms, 55% deleted within 5 s",
            format!(
                "{} dead within 5 s ({} overwritten within 4 ms, {} deleted within 5 s) of {} new files",
                pct(dead_within("5 s")),
                pct(l.overwritten_within_4ms),
                pct(l.deleted_within_5s),
                l.created
            ),
            "at least half dead within 5 s",
            when(l.created > 0, dead_within("5 s") >= 0.5),
        ),
        cmp(
            "9.6.3",
            "New files are deleted within 30 s",
            "Sprite 65-80%",
            pct(dead_within("30 s")),
            "at least 65%",
            when(l.created > 0, dead_within("30 s") >= 0.65),
        ),
        cmp(
            "9.6.3",
            "Deleted new files are small",
            "65% < 100 B, 4% > 40 KB",
            format!("{} < 100 B, {} > 40 KB", pct(l.dead_under_100b_share), pct(l.dead_over_40k_share)),
            "",
            None,
        ),
        cmp(
            "9.7",
            "Heavy tails everywhere",
            "all distributions, Hill alpha 1.2-1.7",
            format!(
                "{heavy} of {} heavy-tailed{}",
                tests.len(),
                s.tails.heavy_hill_range.map_or(String::new(), |(a, b)| format!(", Hill alpha {a:.2}-{b:.2}"))
            ),
            "at least half of the distributions heavy-tailed",
            when(!tests.is_empty(), 2 * heavy >= tests.len()),
        ),
        cmp(
            "9.7",
            "Arrivals are not Poisson at any time scale",
            "variance stays high at coarse scales",
            requests.map_or("-".into(), |a| {
                let worst = a.scales.iter().map(|s| s.vmr).fold(0.0, f64::max);
                format!("{} scales, largest variance/mean {worst:.0}", a.scales.len())
            }),
            "not Poisson-like at every scale",
            requests.filter(|a| !a.scales.is_empty()).map(|a| !a.poisson_like),
        ),
        cmp(
            "9.8.3",
            "Most opens move no data",
            "74% control or directory",
            pct(o.opens_without_data_share),
            "more than half",
            when(ss.opens + ss.dir_opens > 0, o.opens_without_data_share > 0.5),
        ),
        cmp(
            "9.8.1",
            "Opens come in bursts",
            "40% within 1 ms, 90% within 30 ms of the previous",
            format!("{} within 1 ms, {} within 30 ms", pct(o.open_gap_within.0), pct(o.open_gap_within.1)),
            "at least 75% within 30 ms",
            when(o.open_gap_ms.n > 0, o.open_gap_within.1 >= 0.75),
        ),
        cmp("9.8.1", "Few seconds hold opens", "up to 24% of 1-s intervals", pct(o.seconds_with_opens_share), "", None),
        cmp(
            "9.8.1",
            "Files are closed quickly",
            "40% within 1 ms, 90% within 1 s",
            format!("{} within 1 ms, {} within 1 s", pct(ss.open_within.all_1ms), pct(ss.open_within.all_1s)),
            "at least 75% within 1 s",
            when(ss.opens + ss.dir_opens > 0, ss.open_within.all_1s >= 0.75),
        ),
        cmp(
            "9.8.2",
            "Reads and writes come in batches",
            "80% of next reads within 90 us, writes within 30 us",
            format!("{} of reads, {} of writes", pct(o.read_gap_within_90us), pct(o.write_gap_within_30us)),
            "at least 80% of reads within 90 us",
            when(o.read_gap_us.n > 0, o.read_gap_within_90us >= 0.8),
        ),
        cmp(
            "9.8.2",
            "Reads ask for 512 or 4096 bytes",
            "59% of reads",
            pct(o.reads_512_or_4096_share),
            "at least half",
            when(o.read_size.n > 0, o.reads_512_or_4096_share >= 0.5),
        ),
        cmp(
            "9.8.4",
            "Reads hardly fail, writes never",
            "0.2% of reads, no writes",
            format!("{} of reads, {} of writes", pct(o.read_failed_share), pct(o.write_failed_share)),
            "at most 1% of each",
            when(o.read_size.n + o.write_size.n > 0, o.read_failed_share <= 0.01 && o.write_failed_share <= 0.01),
        ),
        cmp(
            "9.8.4",
            "Opens fail, mostly for a missing file",
            "12% of opens fail; 52% of those: no such file",
            format!(
                "{} of lookups and {} of opens fail; {} of those failures: no such file",
                pct(o.lookup_failed_share),
                pct(o.open_failed_share),
                pct(o.open_errors_missing_share)
            ),
            "at least half of the failed lookups and opens are ENOENT",
            when(o.lookup_failed_share + o.open_failed_share > 0.0, o.open_errors_missing_share >= 0.5),
        ),
        cmp(
            "9.9.1",
            "One read often does",
            "31% of read sessions a single read",
            pct(ss.readahead.single_read_share),
            "",
            None,
        ),
        cmp(
            "9.9.1",
            "Read-ahead rarely needs more than one 64 KB fetch",
            "40% of sequential reads < 4 KB, 92% < 64 KB; 8% need more than one",
            format!(
                "{} < 4 KB, {} < 64 KB; {} need more than one",
                pct(ss.readahead.reads_under_4k_share),
                pct(ss.readahead.reads_under_64k_share),
                pct(ss.readahead.beyond_one_64k_share)
            ),
            "",
            None,
        ),
        cmp(
            "9.6.1",
            "Per-user throughput is low",
            "24 KB/s over 10-minute intervals (Sprite 8 KB/s)",
            format!("{:.0} KB/s (peak {:.0} KB/s)", o.per_10_min.mean_kb_per_s, o.per_10_min.peak_kb_per_s),
            "",
            None,
        ),
    ]
}
