//! `ulnet bench` runs every RMA latency mode between two processes and prints one JSON
//! object with the contract's fields (tiny iteration counts: this checks the modes work,
//! the figures are bench/rma.sh's business).

use std::process::Command;

fn bench(args: &[&str]) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_ulnet"))
        .arg("bench")
        .args(args)
        .args(["--size", "8", "--iters", "300", "--warmup", "20", "--json"])
        .output()
        .expect("run ulnet");
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{args:?}: not one JSON object ({e})"))
}

#[test]
fn rma_latency_modes_run_over_every_transport() {
    for transport in ["shm", "udp", "tcp"] {
        for mode in [
            &["faa-lat"][..],
            &["faa-lat", "--whole-op"],
            &["cas-lat", "--whole-op"],
            &["faa-lat", "--overhead"],
            &["get-lat"],
            &["put-lat"],
        ] {
            let args: Vec<&str> = mode.iter().copied().chain(["--transport", transport]).collect();
            let v = bench(&args);
            assert_eq!(v["test"], mode[0], "{args:?}");
            assert_eq!(v["transport"], transport, "{args:?}");
            let p50 = v["p50_us"].as_f64().unwrap_or_else(|| panic!("{args:?}: no p50_us in {v}"));
            assert!(p50 > 0.0 && v["p99_us"].as_f64().unwrap() >= p50, "{args:?}: {v}");
        }
    }
}

#[test]
fn overhead_and_whole_op_exclude_each_other() {
    let out = Command::new(env!("CARGO_BIN_EXE_ulnet"))
        .args(["bench", "faa-lat", "--whole-op", "--overhead", "--json"])
        .output()
        .expect("run ulnet");
    assert!(!out.status.success());
}
