//! Kernel faults inside a host: random loss and partitions as iptables rules in chains of
//! our own, so that changing one never disturbs the other.
//!
//! ```text
//!  INPUT  -> ULNL_LOSS   (-m statistic --mode random --probability P -j DROP)
//!  INPUT  -> ULNL_PART   (-s PEER -j DROP, one per cut peer)
//!  OUTPUT -> ULNL_PART_OUT (-d PEER -j DROP)
//! ```

use crate::lab::{run_in_netns, Host, LabError};
use std::net::Ipv4Addr;

const LOSS: &str = "ULNL_LOSS";
const PART_IN: &str = "ULNL_PART";
const PART_OUT: &str = "ULNL_PART_OUT";

pub(crate) fn install_chains(host: &Host) -> Result<(), LabError> {
    for chain in [LOSS, PART_IN, PART_OUT] {
        run_in_netns(host, &["iptables", "-N", chain])?;
    }
    run_in_netns(host, &["iptables", "-A", "INPUT", "-j", LOSS])?;
    run_in_netns(host, &["iptables", "-A", "INPUT", "-j", PART_IN])?;
    run_in_netns(host, &["iptables", "-A", "OUTPUT", "-j", PART_OUT])?;
    Ok(())
}

pub(crate) fn set_loss(host: &Host, p: f64) -> Result<(), LabError> {
    if !(0.0..=1.0).contains(&p) {
        return Err(LabError::Config("loss is a probability between 0 and 1"));
    }
    run_in_netns(host, &["iptables", "-F", LOSS])?;
    if p > 0.0 {
        let p = format!("{p:.6}");
        run_in_netns(
            host,
            &["iptables", "-A", LOSS, "-m", "statistic", "--mode", "random", "--probability", &p, "-j", "DROP"],
        )?;
    }
    Ok(())
}

pub(crate) fn block(host: &Host, peer: Ipv4Addr) -> Result<(), LabError> {
    let peer = peer.to_string();
    run_in_netns(host, &["iptables", "-A", PART_IN, "-s", &peer, "-j", "DROP"])?;
    run_in_netns(host, &["iptables", "-A", PART_OUT, "-d", &peer, "-j", "DROP"])?;
    Ok(())
}

pub(crate) fn block_outgoing(host: &Host, peer: Ipv4Addr) -> Result<(), LabError> {
    run_in_netns(host, &["iptables", "-A", PART_OUT, "-d", &peer.to_string(), "-j", "DROP"]).map(|_| ())
}

pub(crate) fn unblock_all(host: &Host) -> Result<(), LabError> {
    run_in_netns(host, &["iptables", "-F", PART_IN])?;
    run_in_netns(host, &["iptables", "-F", PART_OUT])?;
    Ok(())
}
