//! # ulnet-trace: what a cluster's communication looks like
//!
//! Reads the trace files that `ulnet-core` writes (see `ulnet_core::trace`) and studies
//! them the way the Solaris MC communication study did: traffic matrices in messages and
//! bytes, message-size distributions by count and by bytes, per-node message rates over
//! time, buffers per message and bytes per buffer position, and the request–response
//! latency broken into stages ([`analyze`]). [`tail`] tests any sample for heavy tails the
//! way the file-system usage study did (log-log CCDF slope, Hill estimator, QQ plot against
//! the fitted Pareto, counts at time scales ten times apart against a Poisson process).
//! [`report`] draws the figures (SVG, PNG) and writes self-contained HTML reports.
//!
//! ```no_run
//! let trace = ulnet_trace::load::load(&["node-0.ultrace", "node-1.ultrace"])?;
//! let study = ulnet_trace::analyze::analyze(&trace, &Default::default());
//! println!("{}", study.render_text());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(missing_docs)]

pub mod analyze;
pub mod input;
pub mod load;
pub mod plot;
pub mod report;
pub mod tail;
#[cfg(test)]
mod test_files;
