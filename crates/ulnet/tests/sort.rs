//! `ulnet sort` end to end: real node processes over real channels, outputs checked with
//! valsort's rules (order, count, checksum equal to the input's).
//!
//! The 10^6-record matrix (uniform and skewed, binary and ASCII, 1, 2 and 4 nodes, in
//! memory and external) runs here; the 10^7-record matrix is `bench/sort-matrix.sh`.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};
use ulnet_sortbench::{write_records, Checksum, RecordFormat, Summary, Validator};

const ULNET: &str = env!("CARGO_BIN_EXE_ulnet");

fn ulnet(args: &[&str]) -> Output {
    Command::new(ULNET).args(args).stdin(Stdio::null()).output().expect("run ulnet")
}

/// Writes `n` gensort records and returns their checksum.
fn gensort(path: &Path, n: u64, format: RecordFormat) -> Checksum {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let sum = write_records(&mut f, 0, n, format, true).unwrap().unwrap();
    std::io::Write::flush(&mut f).unwrap();
    sum
}

fn summary_of(path: &Path) -> Summary {
    use std::io::Read;
    let mut f = std::fs::File::open(path).unwrap();
    let mut v = Validator::default();
    let mut buf = vec![0u8; 1 << 22];
    loop {
        let n = f.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        v.push(&buf[..n]);
    }
    v.finish().unwrap()
}

fn json_of(out: &Output) -> serde_json::Value {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .find(|l| l.starts_with('{'))
        .unwrap_or_else(|| panic!("no JSON on stdout: {stdout}\nstderr: {}", String::from_utf8_lossy(&out.stderr)));
    serde_json::from_str(line).unwrap()
}

/// A count each node reports (`key` of each of the report's `per_node` entries).
fn per_node_counts(r: &serde_json::Value, key: &str) -> Vec<u64> {
    r["per_node"].as_array().unwrap().iter().map(|n| n[key].as_u64().unwrap()).collect()
}

/// Sorts `input` with `args`, then checks the output: sorted, every record, checksum
/// equal to the input's; returns the JSON report.
fn sort_and_check(input: &Path, output: &Path, sum: Checksum, records: u64, args: &[&str]) -> serde_json::Value {
    let mut all = vec!["sort", "--input", input.to_str().unwrap(), "--output", output.to_str().unwrap(), "--json"];
    all.extend_from_slice(args);
    let out = ulnet(&all);
    assert!(out.status.success(), "ulnet {all:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    let report = json_of(&out);
    let s = summary_of(output);
    assert!(s.is_sorted(), "{args:?}: first unordered record {:?}", s.first_unordered());
    assert_eq!(s.records, u128::from(records), "{args:?}: record count");
    assert_eq!(s.checksum, sum, "{args:?}: output checksum differs from the input's");
    assert_eq!(report["records"], records);
    for field in ["total_s", "startup_s", "read_distribute_s", "sort_s", "write_s"] {
        assert!(report[field].as_f64().unwrap() >= 0.0, "{field} in {report}");
    }
    report
}

fn matrix(format: RecordFormat) {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.dat");
    let output = dir.path().join("out.dat");
    let n = 1_000_000;
    let sum = gensort(&input, n, format);
    for nodes in ["1", "2", "4"] {
        let r = sort_and_check(&input, &output, sum, n, &["--nodes", nodes]);
        assert_eq!(r["mode"], "memory");
        assert_eq!(r["format"], if format.ascii { "ascii" } else { "binary" });
        assert!(r["imbalance"].as_f64().unwrap() < 1.15, "partitions unbalanced: {r}");
        // 24 MiB per node is well below a node's share: runs are spilled and merged.
        let r = sort_and_check(&input, &output, sum, n, &["--nodes", nodes, "--memory", "24MiB", "--verify"]);
        assert_eq!(r["mode"], "external", "{r}");
        assert_eq!(r["verified"], true);
        let per_node = r["per_node"].as_array().unwrap();
        assert!(per_node.iter().all(|n| n["groups"].as_u64().unwrap() >= 2), "distribution pass: {r}");
        assert!(per_node.iter().all(|n| n["merged_groups"] == 0), "sampled groups fit in memory: {r}");
        // A partition expected not to fit goes to the group files from the start but for
        // the first groups' records, which stay in memory: the arena never filled, and
        // fewer bytes went to the group files than the partition holds.
        assert!(per_node.iter().all(|n| n["spills"] == 0), "resident groups planned from the start: {r}");
        assert!(
            per_node.iter().all(|n| n["resident_groups"].as_u64().unwrap() >= 1
                && n["temp_bytes"].as_u64().unwrap() < n["records"].as_u64().unwrap() * 100),
            "resident groups: {r}"
        );
        assert!(r["imbalance"].as_f64().unwrap() < 1.15, "partitions unbalanced: {r}");
        // External mode writes the output directly (whole blocks, O_DIRECT) by default;
        // the page-cache path stays available and correct.
        assert!(per_node.iter().all(|n| n["output_io"] == "direct"), "direct output: {r}");
        // Group bytes past the page cache's share go into the output's own blocks, to be
        // read back before the output overwrites them; with no share at all, as many as
        // their cells hold (skewed keys move the groups' places from the sampled ones).
        let args = ["--nodes", nodes, "--memory", "24MiB", "--verify", "--debug-files-budget", "0"];
        let r = sort_and_check(&input, &output, sum, n, &args);
        let per_node = r["per_node"].as_array().unwrap();
        assert!(
            per_node.iter().all(|n| n["spare_bytes"].as_u64().unwrap() > 0
                && n["spare_bytes"].as_u64().unwrap() < n["temp_bytes"].as_u64().unwrap()),
            "group bytes in the output: {r}"
        );
        if nodes == "2" {
            let args = ["--nodes", nodes, "--memory", "24MiB", "--verify", "--output-io", "buffered"];
            let r = sort_and_check(&input, &output, sum, n, &args);
            assert!(r["per_node"].as_array().unwrap().iter().all(|n| n["output_io"] == "buffered"), "{r}");
        }
    }
}

#[test]
fn sorts_uniform_binary_records() {
    matrix(RecordFormat::BINARY);
}

#[test]
fn sorts_skewed_binary_records() {
    matrix(RecordFormat { ascii: false, skewed: true });
}

#[test]
fn sorts_uniform_ascii_records() {
    matrix(RecordFormat::ASCII);
}

#[test]
fn sorts_skewed_ascii_records() {
    matrix(RecordFormat { ascii: true, skewed: true });
}

#[test]
fn ascii_flag_rejects_binary_records() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.dat");
    gensort(&input, 1000, RecordFormat::BINARY);
    let out = ulnet(&["sort", "--input", input.to_str().unwrap(), "--output", "/nonexistent/x", "-a", "--nodes", "2"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not gensort -a"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn partitioned_output_validates_with_valsort_summaries() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.dat");
    let prefix = dir.path().join("part");
    let sum = gensort(&input, 100_000, RecordFormat { ascii: false, skewed: true });
    let p = prefix.to_str().unwrap();
    for io in ["buffered", "direct"] {
        let args = ["--nodes", "3", "--partitioned", "--verify", "--json", "--output-io", io];
        let out = ulnet(&[&["sort", "--input", input.to_str().unwrap(), "--output", p][..], &args].concat());
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let r = json_of(&out);
        assert!(r["per_node"].as_array().unwrap().iter().all(|n| n["output_io"] == io), "{r}");
        let mut total = Checksum::default();
        for r in 0..3 {
            let part = PathBuf::from(format!("{p}.{r:05}"));
            total += summary_of(&part).checksum;
            assert_eq!(std::fs::metadata(&part).unwrap().len() % 100, 0, "whole records, no preallocated tail");
        }
        assert_eq!(total, sum);
        let v = ulnet(&["valsort", "-s", &format!("{p}.sum")]);
        let text = String::from_utf8_lossy(&v.stderr);
        assert!(v.status.success() && text.contains("SUCCESS"), "{text}");
        assert!(text.contains(&format!("Checksum: {sum}")), "{text}");
    }
}

#[test]
fn a_key_repeated_past_the_memory_bound_is_merged_not_lost() {
    // A third of the records share one key: whichever node holds it has a key-range group
    // larger than half its memory, which it sorts as runs and merges.
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.dat");
    let output = dir.path().join("out.dat");
    let n = 600_000u64;
    gensort(&input, n, RecordFormat::BINARY);
    let mut data = std::fs::read(&input).unwrap();
    for r in data.chunks_mut(100).step_by(3) {
        r[..10].copy_from_slice(b"DUPLICATE!");
    }
    std::fs::write(&input, &data).unwrap();
    let sum = Checksum::of_records(&data);
    for budget in [None, Some("0")] {
        let mut args = vec!["--nodes", "2", "--memory", "24MiB", "--verify"];
        args.extend(budget.map(|b| ["--debug-files-budget", b]).into_iter().flatten());
        let r = sort_and_check(&input, &output, sum, n, &args);
        assert_eq!(r["mode"], "external", "{r}");
        let merged: u64 = per_node_counts(&r, "merged_groups").iter().sum();
        assert!(merged >= 1, "the duplicate key's group was merged: {r}");
    }
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(left.len(), 2, "group and run files are removed: {left:?}");
}

#[test]
fn group_bytes_the_output_would_overwrite_first_move_to_the_files() {
    // Every boundary between the nodes' expected parts of the output moved 30 % of a part
    // later: node 0 puts group bytes in cells past its real part, inside the next node's,
    // which must not write there before node 0 has moved them out (and every record must
    // still arrive once).
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.dat");
    let output = dir.path().join("out.dat");
    let n = 1_000_000u64;
    let sum = gensort(&input, n, RecordFormat { ascii: false, skewed: true });
    for nodes in ["2", "3"] {
        let shift = (n * 3 / 10 / nodes.parse::<u64>().unwrap()).to_string();
        let args = [
            "--nodes",
            nodes,
            "--memory",
            "24MiB",
            "--verify",
            "--debug-files-budget",
            "0",
            "--debug-expected-shift",
            &shift,
        ];
        let r = sort_and_check(&input, &output, sum, n, &args);
        let moved = per_node_counts(&r, "spare_moved_bytes");
        assert!(moved[0] > 0, "node 0's cells past its part moved: {r}");
        assert!(per_node_counts(&r, "spare_bytes").iter().all(|&b| b > 0), "{r}");
        assert_eq!(std::fs::metadata(&output).unwrap().len(), n * 100, "the output keeps its length");
    }
}

#[test]
fn valsort_rejects_one_swapped_pair_naming_its_position() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.dat");
    let output = dir.path().join("out.dat");
    let sum = gensort(&input, 10_000, RecordFormat::BINARY);
    sort_and_check(&input, &output, sum, 10_000, &["--nodes", "2"]);
    let mut bytes = std::fs::read(&output).unwrap();
    let (a, b) = (4321 * 100, 4322 * 100);
    let first = bytes[a..a + 100].to_vec();
    bytes.copy_within(b..b + 100, a);
    bytes[b..b + 100].copy_from_slice(&first);
    std::fs::write(&output, &bytes).unwrap();
    let v = ulnet(&["valsort", output.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&v.stderr);
    assert_eq!(v.status.code(), Some(1), "{text}");
    assert!(text.contains("First unordered record is record 4322"), "{text}");
    assert!(text.contains("ERROR - there are 1 unordered records"), "{text}");
    assert!(text.contains(&format!("Checksum: {sum}")), "a swap keeps the checksum: {text}");
}

#[test]
fn a_node_killed_mid_sort_fails_the_sort_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.dat");
    let output = dir.path().join("out.dat");
    gensort(&input, 1_000_000, RecordFormat::BINARY);
    // Each node reads 25-28 buffers of up to 10,000 records with a pause of 150 ms after
    // each: about 4 s of reading and distributing, in which node 2 is killed.
    let mut sort = SortWithPids::start(&input, &output, &["--nodes", "4", "--debug-read-delay-ms", "150"], 2);
    std::thread::sleep(Duration::from_millis(400));
    let text = sort.kill_victim_and_expect_failure();
    let last = text.lines().last().unwrap_or("");
    assert!(last.contains("node 2") && last.contains("killed by signal 9"), "last line names the node: {text}");
    assert!(last.contains("node 2 failed"), "and what a surviving node saw: {text}");
    assert_eq!(text.lines().filter(|l| l.starts_with("ulnet: error")).count(), 1, "one error line: {text}");
    assert_only_input_left(dir.path(), &output);
}

#[test]
fn a_node_killed_while_writing_directly_fails_the_sort_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.dat");
    let output = dir.path().join("out.dat");
    gensort(&input, 1_000_000, RecordFormat::BINARY);
    // External mode (direct output by default); each node pauses 100 ms after each of its
    // ~60 output buffers, so it writes for seconds. Node 1 is killed once its direct
    // writer thread exists: in the middle of writing its partition, with its neighbours
    // writing theirs.
    let mut sort = SortWithPids::start(
        &input,
        &output,
        &["--nodes", "3", "--memory", "24MiB", "--debug-write-delay-ms", "100"],
        1,
    );
    let victim = sort.victim;
    let writing = || {
        std::fs::read_dir(format!("/proc/{victim}/task"))
            .map(|d| {
                d.flatten().any(|t| {
                    std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.starts_with("river-direct"))
                })
            })
            .unwrap_or(false)
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while !writing() {
        assert!(Instant::now() < deadline, "node 1 never started writing its partition");
        std::thread::sleep(Duration::from_millis(5));
    }
    let text = sort.kill_victim_and_expect_failure();
    let last = text.lines().last().unwrap_or("");
    assert!(last.contains("node 1") && last.contains("killed by signal 9"), "last line names the node: {text}");
    assert_only_input_left(dir.path(), &output);
}

/// A `ulnet sort` started with `--print-pids`, its error output read up to the line that
/// names the pid of the node a test is going to kill.
struct SortWithPids {
    child: std::process::Child,
    stderr: BufReader<std::process::ChildStderr>,
    text: String,
    victim: i32,
}

impl SortWithPids {
    fn start(input: &Path, output: &Path, args: &[&str], victim_node: usize) -> Self {
        let mut child = Command::new(ULNET)
            .args(["sort", "--input", input.to_str().unwrap(), "--output", output.to_str().unwrap()])
            .arg("--print-pids")
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stderr = BufReader::new(child.stderr.take().unwrap());
        let prefix = format!("ulnet sort: node {victim_node} pid ");
        let mut text = String::new();
        let mut victim = None;
        while victim.is_none() {
            let mut line = String::new();
            if stderr.read_line(&mut line).unwrap() == 0 {
                break;
            }
            text += &line;
            victim = line.trim().strip_prefix(prefix.as_str()).map(|pid| pid.parse().unwrap());
        }
        let Some(victim) = victim else {
            child.wait().unwrap();
            panic!("no pid of node {victim_node} in: {text}");
        };
        SortWithPids { child, stderr, text, victim }
    }

    /// Kills the victim node and returns all the sort printed, having checked that the
    /// sort failed, and promptly.
    fn kill_victim_and_expect_failure(&mut self) -> String {
        let started = Instant::now();
        assert_eq!(unsafe_free_kill(self.victim), 0, "kill pid {}", self.victim);
        std::io::Read::read_to_string(&mut self.stderr, &mut self.text).unwrap();
        let status = self.child.wait().unwrap();
        let text = std::mem::take(&mut self.text);
        assert!(!status.success(), "the sort must fail: {text}");
        assert!(started.elapsed() < Duration::from_secs(20), "the failure must be noticed promptly");
        text
    }
}

/// After a failed sort: no output, and no partial or group file beside the input.
fn assert_only_input_left(dir: &Path, output: &Path) {
    assert!(!output.exists(), "no output file after a failed sort");
    let leftovers: Vec<_> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(leftovers, vec![std::ffi::OsString::from("in.dat")], "no partial or group files left");
}

/// Sends SIGKILL with the `kill` command (no unsafe code in tests).
fn unsafe_free_kill(pid: i32) -> i32 {
    Command::new("kill").args(["-9", &pid.to_string()]).status().unwrap().code().unwrap_or(-1)
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Starts `size` processes of `ulnet sort --launcher LAUNCHER ARGS` with per-rank
/// environments (and no cluster secret but what they give), as srun or mpirun would, and
/// waits for them all.
fn run_ranks(
    launcher: &str,
    size: usize,
    args: &[&str],
    env_of: impl Fn(usize) -> Vec<(String, String)>,
) -> Vec<Output> {
    let port = free_port().to_string();
    let children: Vec<_> = (0..size)
        .map(|rank| {
            Command::new(ULNET)
                .args(["sort", "--launcher", launcher, "--port", &port])
                .args(args)
                .env_remove("ULNET_SECRET_FILE")
                .env_remove("ULNET_SECRET")
                .envs(env_of(rank))
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    children.into_iter().map(|c| c.wait_with_output().unwrap()).collect()
}

/// Sorts with `size` ranks started as srun or mpirun would, and checks the output node 0
/// reports.
fn launched_by_environment(launcher: &str, size: usize, env_of: impl Fn(usize) -> Vec<(String, String)>) {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.dat");
    let output = dir.path().join("out.dat");
    let sum = gensort(&input, 200_000, RecordFormat::ASCII);
    let files = ["--input", input.to_str().unwrap(), "--output", output.to_str().unwrap()];
    let outs = run_ranks(launcher, size, &[&["--json", "--verify"][..], &files].concat(), env_of);
    for (rank, o) in outs.iter().enumerate() {
        assert!(o.status.success(), "rank {rank}: {}", String::from_utf8_lossy(&o.stderr));
    }
    let report = json_of(&outs[0]);
    assert_eq!(report["nodes"], size);
    assert_eq!(report["verified"], true);
    assert!(outs[1..].iter().all(|o| o.stdout.is_empty()), "only node 0 reports");
    let s = summary_of(&output);
    assert!(s.is_sorted());
    assert_eq!(s.checksum, sum);
}

fn env(pairs: &[(&str, String)]) -> Vec<(String, String)> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.clone())).collect()
}

#[test]
fn slurm_environment_one_host_over_shared_memory() {
    let job = format!("t{}", std::process::id());
    launched_by_environment("slurm", 3, |rank| {
        env(&[
            ("SLURM_PROCID", rank.to_string()),
            ("SLURM_NTASKS", "3".into()),
            ("SLURM_STEP_NODELIST", "localhost".into()),
            ("SLURM_NNODES", "1".into()),
            ("SLURM_JOB_ID", job.clone()),
            ("SLURM_STEP_ID", "0".into()),
        ])
    });
}

/// The environment srun gives rank `rank` of 2 on two hosts.
fn slurm_two_hosts(rank: usize) -> Vec<(String, String)> {
    env(&[
        ("SLURM_PROCID", rank.to_string()),
        ("SLURM_NTASKS", "2".into()),
        ("SLURM_STEP_NODELIST", "127.0.0.1,127.0.0.2".into()),
        ("SLURM_NNODES", "2".into()),
        ("SLURM_JOB_ID", "4711".into()),
        ("SLURMD_NODENAME", format!("127.0.0.{}", rank + 1)),
    ])
}

#[test]
fn slurm_environment_many_hosts_over_tcp() {
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("secret");
    std::fs::write(&secret, "sort-secret").unwrap();
    std::fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    launched_by_environment("slurm", 2, |rank| {
        let mut e = slurm_two_hosts(rank);
        e.push(("ULNET_SECRET_FILE".into(), secret.display().to_string()));
        e
    });
}

#[test]
fn slurm_across_hosts_without_a_secret_refuses_to_start() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.dat");
    let output = dir.path().join("out.dat");
    gensort(&input, 1000, RecordFormat::BINARY);
    let files = ["--input", input.to_str().unwrap(), "--output", output.to_str().unwrap()];
    for (rank, out) in run_ranks("slurm", 2, &files, slurm_two_hosts).into_iter().enumerate() {
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "rank {rank}: {err}");
        assert!(err.contains("no cluster secret") && err.contains("--secret-file"), "rank {rank}: {err}");
    }
    assert!(!output.exists());
}

#[test]
fn mpirun_environment_is_read() {
    let job = format!("{}", std::process::id());
    launched_by_environment("mpirun", 2, |rank| {
        env(&[
            ("OMPI_COMM_WORLD_RANK", rank.to_string()),
            ("OMPI_COMM_WORLD_SIZE", "2".into()),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "2".into()),
            ("OMPI_MCA_ess_base_jobid", job.clone()),
        ])
    });
}

#[test]
fn real_mpirun_launch() {
    let Ok(probe) = Command::new("mpirun").arg("--version").output() else {
        eprintln!("skipped: mpirun is not installed (scripts/test-deps installs openmpi-bin)");
        return;
    };
    assert!(probe.status.success());
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.dat");
    let output = dir.path().join("out.dat");
    let sum = gensort(&input, 200_000, RecordFormat::BINARY);
    let port = free_port().to_string();
    let out = Command::new("mpirun")
        .args(["--allow-run-as-root", "--oversubscribe", "-np", "3", ULNET, "sort", "--launcher", "mpirun"])
        .args(["--port", &port, "--json", "--input", input.to_str().unwrap(), "--output", output.to_str().unwrap()])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(json_of(&out)["nodes"], 3);
    let s = summary_of(&output);
    assert!(s.is_sorted());
    assert_eq!(s.checksum, sum);
}

#[test]
fn ssh_launcher_starts_one_node_per_host() {
    let dir = tempfile::tempdir().unwrap();
    // A stand-in for ssh that runs the remote command here: `fake-ssh -o BatchMode=yes HOST CMD`.
    let fake = dir.path().join("fake-ssh");
    std::fs::write(&fake, "#!/bin/sh\necho \"$3\" >> \"$(dirname \"$0\")/hosts.log\"\nexec sh -c \"$4\"\n").unwrap();
    Command::new("chmod").args(["+x", fake.to_str().unwrap()]).status().unwrap();
    let input = dir.path().join("in.dat");
    let output = dir.path().join("out.dat");
    let sum = gensort(&input, 100_000, RecordFormat::BINARY);
    let port = free_port().to_string();
    let r = sort_and_check(
        &input,
        &output,
        sum,
        100_000,
        &[
            "--launcher",
            "ssh",
            "--hosts",
            "127.0.0.1,127.0.0.2,127.0.0.3",
            "--ssh-command",
            fake.to_str().unwrap(),
            "--port",
            &port,
        ],
    );
    assert_eq!(r["nodes"], 3);
    let hosts = std::fs::read_to_string(dir.path().join("hosts.log")).unwrap();
    let mut hosts: Vec<&str> = hosts.lines().collect();
    hosts.sort();
    assert_eq!(hosts, ["127.0.0.1", "127.0.0.2", "127.0.0.3"]);
}

#[test]
fn an_empty_input_sorts_to_an_empty_output() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("empty.in");
    std::fs::write(&input, []).unwrap();
    let output = dir.path().join("empty.out");
    let temp = dir.path().to_str().unwrap();
    for args in [
        &["--nodes", "1"][..],
        &["--nodes", "3", "--verify"],
        &["--nodes", "2", "--memory", "16MiB", "--temp-dir", temp],
    ] {
        std::fs::write(&output, b"stale").unwrap();
        let mut all = vec!["sort", "--input", input.to_str().unwrap(), "--output", output.to_str().unwrap(), "--json"];
        all.extend_from_slice(args);
        let out = ulnet(&all);
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        let r = json_of(&out);
        assert_eq!(r["records"], 0, "{args:?}");
        assert_eq!(r["imbalance"], 1.0, "{args:?}");
        assert_eq!(std::fs::metadata(&output).unwrap().len(), 0, "{args:?}: the output is empty");
        if args.contains(&"--verify") {
            assert_eq!(r["verified"], true);
        }
    }
}

#[test]
fn a_slow_node_reads_less_of_the_input_and_the_sort_is_whole() {
    // 10^6 records in 8 chunks for 2 nodes; node 1 pauses 100 ms after each of its read
    // buffers (over a second a chunk), so node 0 claims the chunks node 1 would have read
    // with the input cut in halves. Node 1 starts on its first chunk and claims one more
    // ahead: 2 of the 8.
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in");
    let output = dir.path().join("out");
    let sum = gensort(&input, 1_000_000, RecordFormat::BINARY);
    let args = ["--nodes", "2", "--debug-read-delay-ms", "100", "--debug-slow-node", "1"];
    let r = sort_and_check(&input, &output, sum, 1_000_000, &args);
    let read = per_node_counts(&r, "records_read");
    assert_eq!(read.iter().sum::<u64>(), 1_000_000, "{read:?}");
    assert!(read[1] <= 250_000, "the slow node read {} of 10^6 records: {read:?}", read[1]);
}

#[test]
fn launcher_refuses_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.dat");
    std::fs::write(&input, [0u8; 150]).unwrap();
    let out = ulnet(&["sort", "--input", input.to_str().unwrap(), "--output", "x", "--nodes", "2"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not a whole number of 100-byte records"), "{err}");
    assert_eq!(err.lines().count(), 1, "one-line error: {err}");
    let out = ulnet(&["sort", "--launcher", "slurm", "--input", input.to_str().unwrap(), "--output", "x"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("start it with srun or mpirun"));
}

#[test]
fn a_node_that_refuses_its_settings_is_named_with_its_own_error() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.dat");
    gensort(&input, 1000, RecordFormat::BINARY);
    let output = dir.path().join("out.dat");
    // Every node refuses a memory bound too small for its buffers; whichever exits first
    // is the one named, and the error shown is its own, not another node's.
    for _ in 0..3 {
        let out = ulnet(&[
            "sort",
            "--input",
            input.to_str().unwrap(),
            "--output",
            output.to_str().unwrap(),
            "--nodes",
            "3",
            "--memory",
            "1KiB",
        ]);
        assert_eq!(out.status.code(), Some(1));
        let err = String::from_utf8_lossy(&out.stderr);
        let named = err.split("sort failed: node ").nth(1).and_then(|r| r.split(' ').next()).expect("a node named");
        assert!(err.contains(&format!("(node {named}: bad settings: --memory 1024 is too small")), "{err}");
        assert!(err.trim_end().ends_with("no output was written"), "{err}");
        assert!(!output.exists());
    }
}

#[test]
fn nodes_stop_and_clean_up_when_the_launcher_dies() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.dat");
    let output = dir.path().join("out.dat");
    gensort(&input, 300_000, RecordFormat::BINARY);
    let mut launcher = Command::new(ULNET)
        .args(["sort", "--input", input.to_str().unwrap(), "--output", output.to_str().unwrap()])
        .args(["--nodes", "3", "--print-pids", "--debug-read-delay-ms", "300"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(launcher.stderr.take().unwrap());
    let mut pids = Vec::new();
    while pids.len() < 3 {
        let mut line = String::new();
        assert!(stderr.read_line(&mut line).unwrap() > 0, "launcher ended early");
        if let Some((_, pid)) = line.trim().split_once(" pid ") {
            pids.push(pid.to_string());
        }
    }
    std::thread::sleep(Duration::from_millis(300));
    launcher.kill().unwrap();
    launcher.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let alive = |pid: &str| Command::new("kill").args(["-0", pid]).stderr(Stdio::null()).status().unwrap().success();
    while pids.iter().any(|p| alive(p)) {
        assert!(Instant::now() < deadline, "nodes still running after their launcher died");
        std::thread::sleep(Duration::from_millis(50));
    }
    let leftovers: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(leftovers, vec![std::ffi::OsString::from("in.dat")], "no partial files left");
}
