//! `ulnet demo --trace DIR`: every demo process traces its messages into `DIR/node-N.ultrace`,
//! and the demo ends with the communication study of the run.

use anyhow::{Context, Result};
use std::path::Path;
use ulnet_core::trace;

/// Makes every demo process (this one and the ones it starts, which inherit the
/// environment) trace into `dir`. Call before any endpoint or child process exists.
pub fn start(dir: Option<&Path>) -> Result<()> {
    let Some(dir) = dir else { return Ok(()) };
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    // Set while the process is still single-threaded; children inherit it.
    std::env::set_var(trace::TRACE_ENV, dir.join("node-%n.ultrace"));
    Ok(())
}

/// Finishes this process's trace and prints the study of all nodes' traces on stdout.
pub fn report(dir: Option<&Path>, nodes: usize) -> Result<()> {
    let Some(dir) = dir else { return Ok(()) };
    if let Some(r) = trace::stop_if_running() {
        r?;
    }
    let files: Vec<_> = (0..nodes).map(|i| dir.join(format!("node-{i}.ultrace"))).collect();
    let study = ulnet_trace::analyze::analyze(&ulnet_trace::load::load(&files)?, &Default::default());
    println!("\nCommunication study of the run (ulnet trace analyze {}/node-*.ultrace):\n", dir.display());
    print!("{}", study.render_text());
    Ok(())
}
