// The cost of one time-stamp-counter read on this machine: the floor of what tracing adds
// per recorded stage. Run: rustc -O bench/rdtsc-cost.rs -o /tmp/rdtsc-cost && /tmp/rdtsc-cost
use std::time::Instant;

fn main() {
    let n = 20_000_000u64;
    let t = Instant::now();
    let mut acc = 0u64;
    for _ in 0..n {
        // SAFETY: RDTSC has no preconditions on x86-64.
        acc = acc.wrapping_add(unsafe { core::arch::x86_64::_rdtsc() });
    }
    println!("rdtsc: {:.2} ns per read ({n} reads; checksum {acc})", t.elapsed().as_nanos() as f64 / n as f64);
    let t = Instant::now();
    for _ in 0..n {
        acc = acc.wrapping_add(Instant::now().elapsed().as_nanos() as u64);
    }
    println!("Instant::now: {:.2} ns per read ({acc})", t.elapsed().as_nanos() as f64 / (2 * n) as f64);
}
