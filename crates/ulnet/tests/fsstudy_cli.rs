//! `ulnet fsstudy` from the command line: a command traced inside the mount (its exit
//! status passed on), a snapshot, the report's JSON fields of the contract and its files,
//! and a damaged trace reported with its block and offset. The trace step needs
//! /dev/fuse and root and is skipped, with the reason, without them.

use std::path::Path;
use std::process::Command;

fn ulnet(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_ulnet")).args(args).output().expect("run ulnet")
}

fn json(out: &std::process::Output) -> serde_json::Value {
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("exactly one JSON object on stdout")
}

fn fuse_usable() -> bool {
    match ulnet_fsstudy::passthrough::fuse_available() {
        Ok(()) => true,
        Err(why) => {
            eprintln!("trace step skipped: {why}");
            false
        }
    }
}

const CONTRACT_FIELDS: [&str; 9] = [
    "opens",
    "bytes_read",
    "bytes_written",
    "files_created",
    "files_deleted",
    "size_hill_alpha",
    "whole_file",
    "sequential",
    "random",
];

#[test]
fn a_traced_command_is_reported_with_the_contract_fields() {
    let dir = tempfile::tempdir().expect("temp dir");
    let work = dir.path().join("work");
    std::fs::create_dir(&work).expect("mkdir");
    let trace = dir.path().join("t.fstrace");
    let (w, t) = (work.to_str().unwrap(), trace.to_str().unwrap());
    if fuse_usable() {
        let script = "for i in 1 2 3 4 5; do echo line $i > f$i; cat f$i > /dev/null; done; rm f1 f2; exit 7";
        let out = ulnet(&["fsstudy", "trace", "--mount", w, "--output", t, "--json", "--", "sh", "-c", script]);
        assert_eq!(out.status.code(), Some(7), "the command's exit status: {}", String::from_utf8_lossy(&out.stderr));
        let summary: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
        assert!(summary["written"]["records"].as_u64().unwrap() > 20);
        assert_eq!(std::fs::read_dir(&work).unwrap().count(), 3, "the files the command left, in the directory itself");
        let report = json(&ulnet(&["fsstudy", "report", t, "--json"]));
        for field in CONTRACT_FIELDS {
            assert!(report.get(field).is_some(), "report --json has {field}");
        }
        assert_eq!(report["files_created"], 5);
        assert_eq!(report["files_deleted"], 2);
        assert_eq!(report["opens"], 10);
        assert_eq!(report["bytes_written"], report["bytes_read"]);
        assert_eq!(report["whole_file"], 10);
    }
    let snap = dir.path().join("s.fssnap");
    let out = ulnet(&[
        "fsstudy",
        "snapshot",
        Path::new(env!("CARGO_MANIFEST_DIR")).to_str().unwrap(),
        "--output",
        snap.to_str().unwrap(),
        "--json",
    ]);
    let s = json(&out);
    assert!(s["files"].as_u64().unwrap() > 10);
    let report_dir = dir.path().join("report");
    let out = ulnet(&["fsstudy", "report", snap.to_str().unwrap(), "--json", "--out", report_dir.to_str().unwrap()]);
    let report = json(&out);
    assert!(report["size_hill_alpha"].is_number() || report["size_hill_alpha"].is_null());
    assert!(report["content"]["files"].as_u64().unwrap() > 10);
    let md = std::fs::read_to_string(report_dir.join("report.md")).expect("report.md");
    assert!(md.contains("Table 9.1") && md.contains("## Content"));
    assert!(report_dir.join("study.json").exists());
    assert!(report_dir.join("figures/snapshot-sizes.svg").exists() || std::env::var("ULNET_FONT").is_err());
}

#[test]
fn a_damaged_trace_is_reported_with_its_block_and_offset_and_read_as_far_as_whole() {
    let dir = tempfile::tempdir().expect("temp dir");
    let snap = dir.path().join("s.fssnap");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    json(&ulnet(&["fsstudy", "snapshot", src.to_str().unwrap(), "--output", snap.to_str().unwrap(), "--json"]));
    let bytes = std::fs::read(&snap).expect("read");
    let cut = dir.path().join("cut.fssnap");
    std::fs::write(&cut, &bytes[..bytes.len() - 7]).expect("write");
    let out = ulnet(&["fsstudy", "report", cut.to_str().unwrap(), "--json"]);
    let report = json(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("block 0 at byte 64 is cut off"), "{stderr}");
    assert_eq!(report["content"]["files"], 0, "nothing whole in a one-block file cut inside its block");
    let out = ulnet(&["fsstudy", "report", src.join("main.rs").to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a file-system study trace"));
}
