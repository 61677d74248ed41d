//! The remote-memory step of `ulnet demo`: every node exports a counter and registers its
//! name with its clerk; every node finds every other node's counter through the name
//! service (remote reads of the other clerks' tables), maps it, and adds to it 1,000 times
//! with fetch-and-add, while the owners do nothing. Each counter must end at exactly
//! `(nodes - 1) * 1000`.

use anyhow::{bail, Context, Result};
use clap::Args;
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use ulnet_core::rma::names::{ClerkConfig, NameClerk, NameError};
use ulnet_core::rma::{Access, NodeId, NotifyMode, Rights, Rma, RmaConfig};

const ADDS: u64 = 1000;
const T: Duration = Duration::from_secs(20);

/// Arguments of one process of the remote-memory step.
#[derive(Args, Debug)]
pub struct DemoRmaNodeArgs {
    #[arg(long)]
    run: String,
    #[arg(long)]
    index: usize,
    #[arg(long)]
    nodes: usize,
}

#[derive(Serialize, Deserialize, Debug)]
struct RmaReport {
    index: usize,
    counter: u64,
    remote_slot_reads: u64,
    secs: f64,
}

/// Runs the step with `nodes` local processes (this one is node 0) and prints a summary.
pub fn run(nodes: usize) -> Result<bool> {
    let run = format!("demo-rma-{}", std::process::id());
    let exe = std::env::current_exe()?;
    let mut children = Vec::new();
    for index in 1..nodes {
        children.push(
            Command::new(&exe)
                .args(["demo-rma-node", "--run", &run, "--index", &index.to_string(), "--nodes", &nodes.to_string()])
                .stdout(Stdio::piped())
                .stdin(Stdio::null())
                .spawn()?,
        );
    }
    let mut reports = vec![node(&run, 0, nodes)?];
    for mut child in children {
        let out = child.stdout.take().context("child stdout")?;
        let line = BufReader::new(out).lines().next().context("a node printed no report")??;
        reports.push(serde_json::from_str(&line)?);
        if !child.wait()?.success() {
            bail!("a remote-memory demo node failed");
        }
    }
    let want = (nodes as u64 - 1) * ADDS;
    let ok = reports.iter().all(|r| r.counter == want);
    let reads: u64 = reports.iter().map(|r| r.remote_slot_reads).sum();
    println!(
        "remote memory: {nodes} nodes found each other's counters through the name service ({reads} remote slot reads), \
         mapped them and added {ADDS} times to each: every counter {} {want}",
        if ok { "reached exactly" } else { "did NOT reach" }
    );
    Ok(ok)
}

/// One process of the step.
pub fn run_node(a: DemoRmaNodeArgs) -> Result<i32> {
    let report = node(&a.run, a.index, a.nodes)?;
    println!("{}", serde_json::to_string(&report)?);
    Ok(0)
}

fn node(run: &str, index: usize, nodes: usize) -> Result<RmaReport> {
    let t0 = Instant::now();
    let mut rma = Rma::new(RmaConfig::new(NodeId(index as u32 + 1)))?;
    rma.listen_shm(&format!("{run}-{index}"))?;
    let mut clerk = NameClerk::new(&mut rma, ClerkConfig::default())?;
    let counter = rma.export(
        &format!("counter-{index}"),
        64,
        Access::everyone(Rights::READ | Rights::ATOMIC),
        NotifyMode::Never,
    )?;
    clerk.add_name(counter.name(), counter.descriptor())?;
    let mut others = Vec::new();
    for j in (0..nodes).filter(|&j| j != index) {
        let peer = rma.connect_shm(&format!("{run}-{j}"));
        let deadline = Instant::now() + T;
        // The other node may not have started yet: retry until its clerk and name exist.
        let descriptor = loop {
            let attempt = clerk
                .add_peer(&mut rma, NodeId(j as u32 + 1), peer)
                .and_then(|()| clerk.lookup(&mut rma, &format!("counter-{j}"), Some(NodeId(j as u32 + 1))));
            match attempt {
                Ok(d) => break d,
                Err(NameError::NotFound | NameError::Import(_)) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(5))
                }
                Err(e) => bail!("node {index} could not find counter-{j}: {e}"),
            }
        };
        others.push(rma.import_descriptor(peer, descriptor, ulnet_core::rma::ImportMode::Auto)?);
    }
    for _ in 0..ADDS {
        for seg in &others {
            rma.fetch_and_add_blocking(seg, 0, 1, T)?;
        }
    }
    // Tell every other node we are done with its counter (word 8), and stay until every
    // node is done with ours: leaving drops our segment, which revokes their mappings.
    for seg in &others {
        rma.fetch_and_add_blocking(seg, 8, 1, T)?;
    }
    let deadline = Instant::now() + T;
    while counter.load_u64(8) < nodes as u64 - 1 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(RmaReport {
        index,
        counter: counter.load_u64(0),
        remote_slot_reads: clerk.counters().remote_slot_reads,
        secs: t0.elapsed().as_secs_f64(),
    })
}
