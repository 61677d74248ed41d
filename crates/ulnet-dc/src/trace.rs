//! Request traces the load generator replays, generated from documented parameters and a
//! seed (the same seed gives the same trace).
//!
//! - **burst** (thesis 5.1): alternating bursts of `burst` static requests for one document
//!   and `burst` dynamic requests for one transaction. Burst lengths 512 to 65,536.
//! - **zipf** (thesis figure 5.10): the same alternation, but each static request names a
//!   document drawn from Zipf(α = [`ZIPF_ALPHA`]) over [`ZIPF_DOCUMENTS`] documents and each
//!   dynamic request a transaction drawn from Zipf(α) over [`ZIPF_TRANSACTIONS`] scripts.
//! - **worldcup** (thesis figure 5.11; the 1998 World Cup logs are not shipped, so this is a
//!   generated stand-in with their character): a two-state process. In a *match* period
//!   [`WORLDCUP_DYNAMIC_IN_MATCH`] of requests are dynamic (score pages); in a *quiet*
//!   period [`WORLDCUP_DYNAMIC_IN_QUIET`]. Period lengths are Pareto(α =
//!   [`WORLDCUP_PARETO_ALPHA`]) with means [`WORLDCUP_MATCH_MEAN`] and
//!   [`WORLDCUP_QUIET_MEAN`] requests at `burst` = [`WORLDCUP_REFERENCE_BURST`] (the means
//!   scale with `burst`), so about two thirds of the requests are dynamic, in bursts, with
//!   static requests (Zipf over [`ZIPF_DOCUMENTS`] documents) spread out.
//! - **two websites** ([`Trace::two_sites`], thesis figure 6.4): bursts of the two sites
//!   alternate (high, low, high, ...), each site's bursts alternating static and dynamic as
//!   in the trace kind, so each site is idle while the other bursts.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

/// Zipf exponent of document and transaction popularity (web traces: 0.6–0.9; Breslau et
/// al., thesis reference 14).
pub const ZIPF_ALPHA: f64 = 0.8;
/// Distinct static documents of the zipf and worldcup traces.
pub const ZIPF_DOCUMENTS: u32 = 10_000;
/// Distinct dynamic scripts of the zipf trace.
pub const ZIPF_TRANSACTIONS: u32 = 1_000;
/// Fraction of dynamic requests during a match period of the worldcup trace.
pub const WORLDCUP_DYNAMIC_IN_MATCH: f64 = 0.95;
/// Fraction of dynamic requests during a quiet period.
pub const WORLDCUP_DYNAMIC_IN_QUIET: f64 = 0.10;
/// Mean match-period length, requests. With the quiet mean below the dynamic share is
/// (0.95·12,288 + 0.10·6,144) / 18,432 ≈ 0.67 (checked by a test on 2 million requests).
pub const WORLDCUP_MATCH_MEAN: f64 = 12_288.0;
/// Mean quiet-period length, requests.
pub const WORLDCUP_QUIET_MEAN: f64 = 6_144.0;
/// The `burst` at which the worldcup period means are the ones above.
pub const WORLDCUP_REFERENCE_BURST: usize = 65_536;
/// Tail of period lengths: Pareto with α = 2.5 (heavy-tailed bursts with a finite
/// variance, so a trace of a few dozen periods keeps the two-thirds mix).
pub const WORLDCUP_PARETO_ALPHA: f64 = 2.5;

/// Which trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TraceKind {
    /// Single-file bursts.
    Burst,
    /// Zipf-popular documents and scripts in bursts.
    Zipf,
    /// World-Cup-like: two thirds dynamic, bursty.
    Worldcup,
}

impl std::fmt::Display for TraceKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TraceKind::Burst => "burst",
            TraceKind::Zipf => "zipf",
            TraceKind::Worldcup => "worldcup",
        })
    }
}

/// One request of a trace (its website is [`Trace::site`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Request {
    /// A static document.
    Static(u32),
    /// A dynamic transaction.
    Dynamic(u32),
}

impl Request {
    /// The request's path on a site: `/{site}/s/{doc}` or `/{site}/d/{txn}`.
    pub fn path(self, site: u8) -> String {
        match self {
            Request::Static(d) => format!("/{site}/s/{d}"),
            Request::Dynamic(t) => format!("/{site}/d/{t}"),
        }
    }

    /// Whether it is dynamic.
    pub fn is_dynamic(self) -> bool {
        matches!(self, Request::Dynamic(_))
    }
}

const DYNAMIC_BIT: u32 = 1 << 31;
const SITE_SHIFT: u32 = 28;
const SITE_MASK: u32 = 0b111 << SITE_SHIFT;
/// Largest document or transaction id a trace holds.
pub const ID_MAX: u32 = (1 << SITE_SHIFT) - 1;

/// A generated trace: requests in replay order.
#[derive(Clone, Debug)]
pub struct Trace {
    kind: TraceKind,
    requests: Vec<u32>,
}

/// Samples Zipf(α) ranks over `n` items by inverting the cumulative weights.
struct Zipf {
    cumulative: Vec<f64>,
}

impl Zipf {
    fn new(n: u32, alpha: f64) -> Self {
        let mut total = 0.0;
        let cumulative = (1..=n)
            .map(|k| {
                total += 1.0 / f64::from(k).powf(alpha);
                total
            })
            .collect();
        Zipf { cumulative }
    }

    fn sample(&self, rng: &mut impl Rng) -> u32 {
        let total = *self.cumulative.last().expect("at least one item");
        let x = rng.gen::<f64>() * total;
        self.cumulative.partition_point(|c| *c < x) as u32
    }
}

fn pareto(rng: &mut impl Rng, mean: f64, alpha: f64) -> usize {
    let scale = mean * (alpha - 1.0) / alpha;
    let u: f64 = rng.gen_range(f64::EPSILON..1.0);
    (scale / u.powf(1.0 / alpha)).round().max(1.0) as usize
}

impl Trace {
    /// A trace of `kind` with `len` requests; `burst` is the burst length of the burst and
    /// zipf traces.
    pub fn generate(kind: TraceKind, burst: usize, len: usize, seed: u64) -> Trace {
        assert!(burst > 0, "bursts have at least one request");
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut requests = Vec::with_capacity(len);
        match kind {
            TraceKind::Burst => {
                for i in 0..len {
                    let dynamic = (i / burst) % 2 == 1;
                    let id = (i / (2 * burst)) as u32;
                    requests.push(if dynamic { DYNAMIC_BIT | id } else { id });
                }
            }
            TraceKind::Zipf => {
                let docs = Zipf::new(ZIPF_DOCUMENTS, ZIPF_ALPHA);
                let txns = Zipf::new(ZIPF_TRANSACTIONS, ZIPF_ALPHA);
                for i in 0..len {
                    let dynamic = (i / burst) % 2 == 1;
                    requests.push(if dynamic { DYNAMIC_BIT | txns.sample(&mut rng) } else { docs.sample(&mut rng) });
                }
            }
            TraceKind::Worldcup => {
                let docs = Zipf::new(ZIPF_DOCUMENTS, ZIPF_ALPHA);
                let scale = burst as f64 / WORLDCUP_REFERENCE_BURST as f64;
                let mut in_match = true;
                while requests.len() < len {
                    let (mean, p) = if in_match {
                        (WORLDCUP_MATCH_MEAN * scale, WORLDCUP_DYNAMIC_IN_MATCH)
                    } else {
                        (WORLDCUP_QUIET_MEAN * scale, WORLDCUP_DYNAMIC_IN_QUIET)
                    };
                    let period = pareto(&mut rng, mean, WORLDCUP_PARETO_ALPHA).min(len - requests.len());
                    for _ in 0..period {
                        let r = if rng.gen_bool(p) {
                            DYNAMIC_BIT | rng.gen_range(0..ZIPF_TRANSACTIONS)
                        } else {
                            docs.sample(&mut rng)
                        };
                        requests.push(r);
                    }
                    in_match = !in_match;
                }
            }
        }
        debug_assert!(requests.iter().all(|r| r & SITE_MASK == 0), "ids stay below ID_MAX");
        Trace { kind, requests }
    }

    /// The kind.
    pub fn kind(&self) -> TraceKind {
        self.kind
    }

    /// Number of requests.
    pub fn len(&self) -> usize {
        self.requests.len()
    }

    /// Whether it has no request.
    pub fn is_empty(&self) -> bool {
        self.requests.is_empty()
    }

    /// Request `i`.
    pub fn get(&self, i: usize) -> Request {
        let r = self.requests[i];
        let id = r & ID_MAX;
        if r & DYNAMIC_BIT != 0 {
            Request::Dynamic(id)
        } else {
            Request::Static(id)
        }
    }

    /// The website of request `i`.
    pub fn site(&self, i: usize) -> u8 {
        ((self.requests[i] & SITE_MASK) >> SITE_SHIFT) as u8
    }

    /// A trace for two websites: bursts of `burst` requests, taken in turn from a trace of
    /// `kind` for site 0 and another (seeded differently) for site 1.
    pub fn two_sites(kind: TraceKind, burst: usize, len: usize, seed: u64) -> Trace {
        let high = Trace::generate(kind, burst, len.div_ceil(2), seed);
        let low = Trace::generate(kind, burst, len.div_ceil(2), seed ^ 0x5eed);
        let mut requests = Vec::with_capacity(len);
        let (mut h, mut l) = (0, 0);
        while requests.len() < len {
            let from_high = (requests.len() / burst).is_multiple_of(2);
            let (src, at, site) = if from_high { (&high, &mut h, 0u32) } else { (&low, &mut l, 1u32) };
            if *at >= src.requests.len() {
                break;
            }
            requests.push(src.requests[*at] | site << SITE_SHIFT);
            *at += 1;
        }
        Trace { kind, requests }
    }

    /// Fraction of dynamic requests.
    pub fn dynamic_fraction(&self) -> f64 {
        if self.requests.is_empty() {
            return 0.0;
        }
        self.requests.iter().filter(|r| *r & DYNAMIC_BIT != 0).count() as f64 / self.requests.len() as f64
    }
}

/// Size in bytes of static document `doc`: 1–8 KiB, 4.5 KiB on average (the thesis'
/// request-size experiments used 2 and 4 KiB averages).
pub fn document_size(doc: u32) -> usize {
    let h = (u64::from(doc) ^ 0x5bd1_e995).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40;
    1024 + (h % (7 * 1024)) as usize
}

/// Size in bytes of a dynamic page.
pub const DYNAMIC_PAGE_BYTES: usize = 2048;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bursts_alternate() {
        let t = Trace::generate(TraceKind::Burst, 4, 16, 1);
        let kinds: Vec<bool> = (0..16).map(|i| t.get(i).is_dynamic()).collect();
        assert_eq!(kinds, [[false; 4], [true; 4], [false; 4], [true; 4]].concat());
        assert_eq!(t.get(0), t.get(3), "a burst is one document");
    }

    #[test]
    fn two_site_bursts_alternate_sites() {
        let t = Trace::two_sites(TraceKind::Burst, 2, 16, 1);
        let sites: Vec<u8> = (0..16).map(|i| t.site(i)).collect();
        assert_eq!(sites, [0, 0, 1, 1, 0, 0, 1, 1, 0, 0, 1, 1, 0, 0, 1, 1]);
        let high_dynamic: Vec<bool> = (0..16).filter(|&i| t.site(i) == 0).map(|i| t.get(i).is_dynamic()).collect();
        assert_eq!(high_dynamic, [false, false, true, true, false, false, true, true]);
    }

    #[test]
    fn worldcup_is_about_two_thirds_dynamic() {
        for (burst, len, seed) in [(WORLDCUP_REFERENCE_BURST, 2_000_000, 7), (16_384, 200_000, 1), (16_384, 200_000, 2)]
        {
            let t = Trace::generate(TraceKind::Worldcup, burst, len, seed);
            let f = t.dynamic_fraction();
            assert!((0.6..0.74).contains(&f), "dynamic fraction {f} (burst {burst}, {len} requests, seed {seed})");
        }
    }

    #[test]
    fn zipf_favours_low_ranks() {
        let t = Trace::generate(TraceKind::Zipf, 100_000, 100_000, 3);
        let top = (0..t.len()).filter(|&i| t.get(i) == Request::Static(0)).count();
        let mid = (0..t.len()).filter(|&i| t.get(i) == Request::Static(100)).count();
        assert!(top > 20 * mid.max(1), "rank 0: {top}, rank 100: {mid}");
    }
}
