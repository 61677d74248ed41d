//! `ulnet-relay`: the seeded fault-injecting UDP relay of ulnet-netlab as a program.
//!
//! ```text
//! ulnet-relay --listen 10.77.0.3:7000 --upstream 10.77.0.2:7000 --seed 42 \
//!     --duplicate 0.05 --reorder 0.05 --delay-min-us 50 --delay-max-us 300
//! ```
//! Runs until killed (or for `--seconds`), then prints its counters on stderr.

use clap::Parser;
use std::net::SocketAddr;
use std::time::Duration;
use ulnet_netlab::{Relay, RelayConfig, RelayFaults};

#[derive(Parser)]
#[command(name = "ulnet-relay", about = "Seeded fault-injecting UDP relay (delay, duplication, reordering, loss)")]
struct Args {
    /// Address clients send to.
    #[arg(long)]
    listen: SocketAddr,
    /// Address packets are forwarded to.
    #[arg(long)]
    upstream: SocketAddr,
    /// Seed of every random choice (default: random, printed).
    #[arg(long)]
    seed: Option<u64>,
    /// Probability of dropping a packet.
    #[arg(long, default_value_t = 0.0)]
    loss: f64,
    /// Probability of sending a packet twice.
    #[arg(long, default_value_t = 0.0)]
    duplicate: f64,
    /// Probability of holding a packet back so that later ones overtake it.
    #[arg(long, default_value_t = 0.0)]
    reorder: f64,
    /// Longest extra hold of a reordered packet, in microseconds.
    #[arg(long, default_value_t = 2000)]
    reorder_max_us: u64,
    /// Shortest delay of every packet, in microseconds.
    #[arg(long, default_value_t = 0)]
    delay_min_us: u64,
    /// Longest delay of every packet, in microseconds.
    #[arg(long, default_value_t = 0)]
    delay_max_us: u64,
    /// Stop after this many seconds (default: run until killed).
    #[arg(long)]
    seconds: Option<u64>,
}

fn main() {
    let a = Args::parse();
    let seed = a.seed.unwrap_or_else(rand::random);
    let faults = RelayFaults {
        loss: a.loss,
        duplicate: a.duplicate,
        delay_min: Duration::from_micros(a.delay_min_us),
        delay_max: Duration::from_micros(a.delay_max_us.max(a.delay_min_us)),
        reorder: a.reorder,
        reorder_delay_max: Duration::from_micros(a.reorder_max_us),
    };
    for (name, p) in [("loss", a.loss), ("duplicate", a.duplicate), ("reorder", a.reorder)] {
        if !(0.0..=1.0).contains(&p) {
            eprintln!("ulnet-relay: error: --{name} must be between 0 and 1");
            std::process::exit(2);
        }
    }
    let relay = match Relay::start(RelayConfig { listen: a.listen, upstream: a.upstream, faults, seed }) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("ulnet-relay: error: cannot listen on {}: {e}", a.listen);
            std::process::exit(1);
        }
    };
    match a.seconds {
        Some(s) => std::thread::sleep(Duration::from_secs(s)),
        None => loop {
            std::thread::sleep(Duration::from_secs(3600));
        },
    }
    eprintln!("ulnet-relay: {:?}", relay.stop());
}
