//! `ulnet trace` from the command line: a traced benchmark analysed, damaged files refused
//! with the offset, and the JSON fields of the contract.

use std::path::Path;
use std::process::Command;

const DEJAVU: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";

/// The tests here take turns: each runs busy-polling benchmark processes or analyses
/// millions of records, and `trace_ab_compares_blocks_of_one_run` needs its processes to
/// keep the cores for most of its blocks (run beside the others on 2 cores in CI, it
/// formed 4 pairs of blocks of about 50).
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn ulnet(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_ulnet")).args(args).output().expect("run ulnet")
}

fn json(out: &std::process::Output) -> serde_json::Value {
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("exactly one JSON object on stdout")
}

#[test]
fn traced_benchmark_is_analysed_and_damage_is_reported_with_its_offset() {
    let _turn = one_at_a_time();
    let dir = std::env::temp_dir().join(format!("ulnet-trace-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("rpc.ultrace");
    let f = file.to_str().unwrap();
    let out = ulnet(&["bench", "rpc-lat", "--iters", "20000", "--warmup", "100", "--json", "--trace", f]);
    let bench = json(&out);
    assert_eq!(bench["test"], "rpc-lat");
    let peer = format!("{f}.peer");
    let html = dir.join("report.html");
    let plots = dir.join("plots");
    let fonts = std::env::var_os("ULNET_FONT").is_some() || Path::new(DEJAVU).exists();
    let (h, p) = (html.to_str().unwrap(), plots.to_str().unwrap());
    let out = if fonts {
        ulnet(&["trace", "analyze", f, &peer, "--json", "--html", h, "--plots", p])
    } else {
        eprintln!("skipping figures and HTML: no font at {DEJAVU} (scripts/test-deps installs it)");
        ulnet(&["trace", "analyze", f, &peer, "--json"])
    };
    let a = json(&out);
    // 20,100 calls and their responses, each counted once: with two records per call a side
    // writes 20,100 records, so more than one block of at most 4,096 (the cut below needs an
    // intact block before the damaged one).
    assert_eq!(a["messages"], 40200);
    assert_eq!(a["latency"]["pairs"], 20100);
    // Stages come from the exact records only (one call in 64 by default): coarse times
    // (one 1 ms tick) would put most transits at exactly 0.
    let transit = &a["latency"]["stages"][0];
    let timed = transit["samples"].as_u64().unwrap();
    assert!(timed > 0 && timed < 20100, "sampled calls only: {timed}");
    let p50 = transit["p50_us"].as_f64().unwrap();
    assert!(p50 > 0.0, "a timed transit is never zero: {p50} us");
    assert_eq!(a["matrix"].as_array().unwrap().len(), 2);
    if fonts {
        let page = std::fs::read_to_string(&html).unwrap();
        assert!(page.contains("<svg") && !page.contains("src=\"http"), "self-contained HTML with inline SVG");
        assert!(plots.join("matrix-messages.svg").exists() && plots.join("sizes-all.png").exists());
    }

    let bytes = std::fs::read(&file).unwrap();
    let cut = dir.join("cut.ultrace");
    std::fs::write(&cut, &bytes[..bytes.len() - 50]).unwrap();
    let out = ulnet(&["trace", "analyze", cut.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "one-line error: {err}");
    assert!(err.contains("truncated at byte offset"), "{err}");
    // --partial reads the intact blocks of a file cut short, and says what it skipped.
    let out = ulnet(&["trace", "analyze", "--partial", "--json", cut.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("truncated at byte offset") && err.contains("intact records"), "{err}");
    let partial = json(&out)["messages"].as_u64().unwrap();
    // One side alone: its sends and what it received from the untraced side.
    assert!(partial > 0 && partial <= 40200, "the intact blocks of one side: {partial}");
    let mut bad = bytes.clone();
    bad[100] ^= 0x10;
    std::fs::write(&cut, &bad).unwrap();
    let err = String::from_utf8_lossy(&ulnet(&["trace", "analyze", cut.to_str().unwrap()]).stderr).to_string();
    assert!(err.contains("corrupt at byte offset 72: block checksum mismatch"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A format-3 trace file of node 0 holding one run record from node 0 to node 1: `count`
/// messages of `size` bytes, the first at tick 1000, the last `span` ticks later (1 GHz).
fn write_run_trace(path: &Path, count: u32, span: u32, size: u64) {
    use ulnet_core::trace::format::{encode_block, BlockHeader, FileHeader, BLOCK_FLAG_END};
    let header = FileHeader {
        version: 3,
        node_id: 0,
        pid: 1,
        boot_id: 2,
        ref_ticks: 0,
        ref_mono_ns: 0,
        ref_real_ns: 0,
        ticks_per_sec: 1_000_000_000,
    };
    // The 64-byte record of versions 2 and 3 (crates/ulnet-core/src/trace/format.rs): a run
    // (flag 4) keeps its count and span where a single message keeps its stage times.
    let words = [1000, 1 << 32, 4 << 40, size, 0, 0, 0, u64::from(count) | u64::from(span) << 32];
    let record: Vec<u8> = words.iter().flat_map(|w: &u64| w.to_le_bytes()).collect();
    let block = BlockHeader {
        flags: BLOCK_FLAG_END,
        record_count: 1,
        sequence: 0,
        dropped_total: 0,
        ref_ticks: 2_000_000,
        ref_mono_ns: 2_000_000,
    };
    let mut bytes = header.encode().to_vec();
    encode_block(&block, &record, &mut bytes);
    std::fs::write(path, bytes).unwrap();
}

/// A run record claims up to 2^32 - 1 messages: `analyze` counts them all from the one
/// record, `tail`, which takes messages one by one, refuses so many by name.
#[test]
fn a_record_of_four_billion_messages_is_analysed_and_too_many_to_tail() {
    let _turn = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("run.ultrace");
    write_run_trace(&file, u32::MAX, 1_000_000, 64);
    let f = file.to_str().unwrap();
    let a = json(&ulnet(&["trace", "analyze", f, "--json"]));
    let messages = u64::from(u32::MAX);
    assert_eq!((a["messages"].as_u64(), a["bytes"].as_u64()), (Some(messages), Some(64 * messages)));
    assert_eq!(a["matrix"][0]["messages"].as_u64(), Some(messages));
    let binned: u64 = a["rates"]["nodes"][0]["per_bin"].as_array().unwrap().iter().map(|n| n.as_u64().unwrap()).sum();
    assert_eq!(binned, messages);
    let out = ulnet(&["trace", "tail", f]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("4294967295 messages") && err.contains("at most 134217728"), "{err}");
    write_run_trace(&file, 1000, 999_000, 64);
    let r = json(&ulnet(&["trace", "tail", f, "--column", "interarrival_ns", "--json"]));
    assert_eq!((r["n"].as_u64(), r["min"].as_f64(), r["max"].as_f64()), (Some(999), Some(1000.0), Some(1000.0)));
}

fn write_sample(path: &Path, values: impl Iterator<Item = f64>) {
    let text: String = values.map(|v| format!("{v}\n")).collect();
    std::fs::write(path, text).unwrap();
}

#[test]
fn tail_json_has_the_contract_fields() {
    let _turn = one_at_a_time();
    let dir = std::env::temp_dir().join(format!("ulnet-tail-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("pareto.txt");
    // A deterministic Pareto(1.5) sample by inverse transform of an even grid.
    let n = 20_000;
    write_sample(&file, (0..n).map(|i| (1.0 - (i as f64 + 0.5) / n as f64).powf(-1.0 / 1.5)));
    let r = json(&ulnet(&["trace", "tail", file.to_str().unwrap(), "--json"]));
    for field in ["n", "mean", "hill_alpha", "ccdf_slope_alpha", "poisson_like"] {
        assert!(r.get(field).is_some(), "missing {field}: {r}");
    }
    assert_eq!(r["n"], n);
    assert!((r["hill_alpha"].as_f64().unwrap() - 1.5).abs() < 0.1, "{r}");
    assert_eq!(r["heavy_tailed"], true);
    let out = ulnet(&["trace", "tail", file.to_str().unwrap(), "--column", "nope"]);
    assert!(!out.status.success());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `ulnet bench --trace-ab`: tracing switched on and off within one run, the comparison in
/// the report; traced blocks leave records in the file, a control run none.
#[test]
fn trace_ab_compares_blocks_of_one_run() {
    let _turn = one_at_a_time();
    let dir = std::env::temp_dir().join(format!("ulnet-trace-ab-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let messages = |file: &Path| {
        let a = json(&ulnet(&["trace", "analyze", file.to_str().unwrap(), "--json"]));
        a["messages"].as_u64().unwrap()
    };
    // am-bw's large messages: a clock reading per message, not per 64.
    let cases = [
        ("rpc-lat", &["p50_us", "trimmed_mean_us", "mean_us"][..], "128"),
        ("msg-rate", &["msgs_per_s"][..], "8"),
        ("am-bw", &["msgs_per_s"][..], "1048576"),
    ];
    for (test, metrics, size) in cases {
        for mode in ["traced", "control"] {
            let file = dir.join(format!("{test}-{mode}.ultrace"));
            let f = file.to_str().unwrap();
            let args = ["bench", test, "--size", size, "--trace", f, "--trace-ab", mode, "--duration-ms", "600"];
            let bench = json(&ulnet(&[&args[..], &["--warmup", "1000", "--json"]].concat()));
            let figures = bench["trace_ab"].as_array().expect("trace_ab figures");
            let names: Vec<&str> = figures.iter().map(|f| f["metric"].as_str().unwrap()).collect();
            assert_eq!(names, metrics, "{test} {mode}");
            // 600 ms is about 100 blocks of 6 ms; a loaded machine may lose some, not all.
            for fig in figures {
                let pairs = fig["pairs"].as_u64().unwrap();
                let ratio = fig["ratio"].as_f64().unwrap();
                assert!(pairs >= 5, "{test} {mode}: {fig}");
                assert!(ratio > 0.2 && ratio < 5.0, "{test} {mode}: {fig}");
            }
            assert!(bench["iters"].as_u64().unwrap() > 1000, "{bench}");
            assert!(figures.iter().all(|f| f["ratio"].is_number()), "{test} {mode}: {bench}");
            let (own, peer) = (messages(&file), messages(&dir.join(format!("{test}-{mode}.ultrace.peer"))));
            if mode == "traced" {
                assert!(own > 0 && peer > 0, "{test}: traced blocks recorded ({own}, {peer})");
            } else {
                assert_eq!((own, peer), (0, 0), "{test}: the control run never traces");
            }
        }
    }
    let out = ulnet(&["bench", "rpc-rate", "--trace", dir.join("x").to_str().unwrap(), "--trace-ab"]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("--trace-ab is for"));
    std::fs::remove_dir_all(&dir).unwrap();
}
