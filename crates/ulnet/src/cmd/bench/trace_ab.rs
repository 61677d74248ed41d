//! `ulnet bench TEST --trace FILE --trace-ab`: what tracing costs, measured inside one run.
//!
//! Both processes switch tracing on and off on the schedule of
//! [`ulnet_core::trace::alternate`] (blocks of about 6 ms, odd ones traced). The active
//! side sums up each block: a latency test by the median and the trimmed mean of the round
//! trips that lie in it, a stream test by the messages it sent per second (a stream runs as
//! fast as the receiver takes it, so the sender's rate is the pair's). Each traced block is
//! set against the untraced block just before it, and the report gives the median of those
//! ratios with their quartiles. A shared host's speed changes from one run to the next by
//! more than tracing costs, and within a few milliseconds hardly at all.

use clap::ValueEnum;
use serde::Serialize;
use std::ops::Range;
use std::time::Instant;
use ulnet_core::trace::{self, alternate};

/// What the traced blocks of the schedule do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum AbMode {
    /// Trace (the measurement).
    Traced,
    /// Stay untraced like the others (the control: its ratios show the comparison's own
    /// bias and spread).
    Control,
}

/// The follower of the schedule for a process of a run with `--trace-ab`.
pub fn switch(mode: Option<AbMode>) -> Option<alternate::Switch> {
    mode.map(|m| alternate::Switch::new(m == AbMode::Control))
}

/// The passive side's follower: checks the schedule every 64 polls (a clock read costs
/// more than an empty poll; 64 polls take microseconds, well inside a block's guard).
pub struct PollSwitch {
    switch: Option<alternate::Switch>,
    polls: u32,
}

impl PollSwitch {
    pub fn new(mode: Option<AbMode>) -> Self {
        Self { switch: switch(mode), polls: 0 }
    }

    /// Called before each poll.
    #[inline]
    pub fn poll(&mut self) {
        if let Some(s) = &mut self.switch {
            self.polls = self.polls.wrapping_add(1);
            if self.polls.is_multiple_of(64) {
                s.follow(trace::now());
            }
        }
    }
}

/// A latency block with fewer round trips than this (its process lost the CPU for most of
/// it) is left out.
const BLOCK_ROUND_TRIPS_MIN: usize = 100;

/// A stream block whose counted window (first to last clock reading in it) is shorter
/// than this many ticks is left out: half a block.
const BLOCK_WINDOW_MIN: u64 = alternate::BLOCK_TICKS / 2;

/// One figure of the comparison.
#[derive(Serialize, Debug, Clone, PartialEq)]
pub struct AbFigure {
    /// What sums up a block: `p50_us`, `trimmed_mean_us` (the mean of the round trips
    /// between the block's 10th and 90th percentiles) or `mean_us` (one-way latency), or
    /// `msgs_per_s`.
    pub metric: &'static str,
    /// The median over the untraced blocks.
    pub untraced: f64,
    /// The median over the traced blocks.
    pub traced: f64,
    /// Traced / untraced of adjacent blocks: the median.
    pub ratio: f64,
    /// The first quartile of those ratios.
    pub ratio_q1: f64,
    /// The third quartile of those ratios.
    pub ratio_q3: f64,
    /// The (untraced, traced) pairs of adjacent blocks.
    pub pairs: usize,
}

/// The trace clock's nanoseconds per tick, from the wall clock over a run.
struct ClockRate {
    wall: Instant,
    first: u64,
}

impl ClockRate {
    fn start() -> Self {
        Self { wall: Instant::now(), first: trace::now() }
    }

    fn ns_per_tick(&self) -> f64 {
        self.wall.elapsed().as_nanos() as f64 / trace::now().saturating_sub(self.first).max(1) as f64
    }
}

/// The round trips of a latency test, by block.
pub struct LatencyBlocks {
    clock: ClockRate,
    /// Every measured round trip, in ticks …
    all: Vec<u64>,
    /// … and those that belong to each block (a block's lie together in `all`: the ones
    /// before them in its guard, the one after them running into the next block).
    blocks: Vec<(u64, Range<usize>)>,
}

impl LatencyBlocks {
    pub fn new() -> Self {
        Self { clock: ClockRate::start(), all: Vec::new(), blocks: Vec::new() }
    }

    /// A round trip from clock reading `t0` to `t1`, begun with the switch following `t0`.
    pub fn add(&mut self, t0: u64, t1: u64) {
        let at = self.all.len();
        self.all.push(t1 - t0);
        let b = alternate::block(t1);
        // Only a round trip wholly inside one block, past the guard in which the peer
        // follows the switch, belongs to the block.
        if alternate::block(t0) != b || !alternate::past_guard(t0) {
            return;
        }
        match self.blocks.last_mut() {
            Some((last, r)) if *last == b => {
                debug_assert_eq!(r.end, at, "a block's round trips follow one another");
                r.end = at + 1;
            }
            _ => self.blocks.push((b, at..at + 1)),
        }
    }

    /// Every measured round trip in nanoseconds, and the comparison: by median, by trimmed
    /// mean and by mean, one-way.
    pub fn finish(self) -> (Vec<u64>, Vec<AbFigure>) {
        let ns_per_tick = self.clock.ns_per_tick();
        let one_way_us = |ticks: f64| ticks * ns_per_tick / 2000.0;
        let mut summed: Vec<(u64, [f64; 3])> = Vec::new();
        let mut v = Vec::new();
        for (b, r) in self.blocks {
            if r.len() < BLOCK_ROUND_TRIPS_MIN {
                continue;
            }
            v.clear();
            v.extend_from_slice(&self.all[r]);
            v.sort_unstable();
            let kept = &v[v.len() / 10..v.len() - v.len() / 10];
            let trimmed = kept.iter().sum::<u64>() as f64 / kept.len() as f64;
            let mean = v.iter().sum::<u64>() as f64 / v.len() as f64;
            summed.push((b, [one_way_us(v[v.len() / 2] as f64), one_way_us(trimmed), one_way_us(mean)]));
        }
        let figures = ["p50_us", "trimmed_mean_us", "mean_us"]
            .into_iter()
            .enumerate()
            .map(|(i, metric)| compare(metric, &summed.iter().map(|(b, s)| (*b, s[i])).collect::<Vec<_>>()))
            .collect();
        let all = self.all.into_iter().map(|t| (t as f64 * ns_per_tick) as u64).collect();
        (all, figures)
    }
}

/// The messages a stream test sent, by block.
pub struct RateBlocks {
    clock: ClockRate,
    /// (block, first and last clock reading counted in it, messages sent between them).
    blocks: Vec<(u64, u64, u64, u64)>,
}

impl RateBlocks {
    pub fn new() -> Self {
        Self { clock: ClockRate::start(), blocks: Vec::new() }
    }

    /// `sent` messages went since the previous call, which read the clock before them;
    /// `now` is read after them.
    pub fn add(&mut self, now: u64, sent: u64) {
        if !alternate::past_guard(now) {
            return;
        }
        let b = alternate::block(now);
        match self.blocks.last_mut() {
            Some((last, _, to, count)) if *last == b => {
                *to = now;
                *count += sent;
            }
            // The first reading in a block opens its window.
            _ => self.blocks.push((b, now, now, 0)),
        }
    }

    /// The comparison, in messages per second.
    pub fn finish(self) -> AbFigure {
        let ns_per_tick = self.clock.ns_per_tick();
        let rates: Vec<(u64, f64)> = self
            .blocks
            .iter()
            .filter(|&&(_, from, to, count)| count > 0 && to - from >= BLOCK_WINDOW_MIN)
            .map(|&(b, from, to, count)| (b, count as f64 * 1e9 / ((to - from) as f64 * ns_per_tick)))
            .collect();
        compare("msgs_per_s", &rates)
    }
}

/// Medians of the blocks on each side and of the ratios of adjacent (untraced, traced)
/// blocks; `blocks` in order. NaN where there is nothing to compare.
fn compare(metric: &'static str, blocks: &[(u64, f64)]) -> AbFigure {
    let side = |traced: bool| {
        quantiles(blocks.iter().filter(|(b, _)| alternate::is_traced(*b) == traced).map(|(_, v)| *v).collect())[1]
    };
    let ratios: Vec<f64> = blocks
        .windows(2)
        .filter(|w| w[1].0 == w[0].0 + 1 && alternate::is_traced(w[1].0))
        .map(|w| w[1].1 / w[0].1)
        .collect();
    let pairs = ratios.len();
    let [ratio_q1, ratio, ratio_q3] = quantiles(ratios);
    AbFigure { metric, untraced: side(false), traced: side(true), ratio, ratio_q1, ratio_q3, pairs }
}

/// The quartiles of `v` (NaN when empty).
fn quantiles(mut v: Vec<f64>) -> [f64; 3] {
    if v.is_empty() {
        return [f64::NAN; 3];
    }
    v.sort_by(f64::total_cmp);
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    [at(0.25), at(0.5), at(0.75)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compares_adjacent_blocks_only() {
        // Blocks 2 (untraced) and 3 (traced) pair; 5 has no untraced block before it; 6 is
        // untraced and last.
        let blocks = [(2, 10.0), (3, 11.0), (5, 40.0), (6, 12.0)];
        let f = compare("x", &blocks);
        assert_eq!(f.pairs, 1);
        assert_eq!(f.ratio, 1.1);
        assert_eq!((f.untraced, f.traced), (12.0, 40.0));
    }

    #[test]
    fn nothing_to_compare_is_nan() {
        let f = compare("x", &[(2, 10.0)]);
        assert_eq!(f.pairs, 0);
        assert!(f.ratio.is_nan() && f.traced.is_nan());
    }

    #[test]
    fn latency_blocks_keep_whole_round_trips_past_the_guard() {
        let mut l = LatencyBlocks::new();
        let start = 9 * alternate::BLOCK_TICKS;
        l.add(start + 10, start + 20); // inside the guard
        l.add(start + alternate::BLOCK_TICKS - 5, start + alternate::BLOCK_TICKS + 5); // spans two
        for i in 0..BLOCK_ROUND_TRIPS_MIN as u64 {
            l.add(start + alternate::GUARD_TICKS + 1 + 100 * i, start + alternate::GUARD_TICKS + 51 + 100 * i);
        }
        assert_eq!(l.all.len(), BLOCK_ROUND_TRIPS_MIN + 2);
        assert_eq!(l.blocks.len(), 1);
        assert_eq!(l.blocks[0].1.len(), BLOCK_ROUND_TRIPS_MIN);
    }

    #[test]
    fn rate_blocks_count_from_the_first_reading_past_the_guard() {
        let mut r = RateBlocks::new();
        let start = 4 * alternate::BLOCK_TICKS;
        r.add(start + 1, 64); // inside the guard: not counted
        r.add(start + alternate::GUARD_TICKS + 1, 64); // opens the window
        r.add(start + alternate::GUARD_TICKS + 1001, 64);
        r.add(start + alternate::GUARD_TICKS + 2001, 64);
        assert_eq!(r.blocks, vec![(4, start + alternate::GUARD_TICKS + 1, start + alternate::GUARD_TICKS + 2001, 128)]);
    }
}
