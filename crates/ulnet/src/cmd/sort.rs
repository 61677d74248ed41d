//! `ulnet sort`: the distributed sort of Sort Benchmark records, and its launchers.
//!
//! * `--launcher local` (default): `--nodes N` processes on this host (`ulnet sort-node`),
//!   connected by shared-memory channels.
//! * `--launcher ssh --hosts H1,H2`: one node per host, started with `ssh HOST ulnet
//!   sort-node …` (the same `ulnet` path and working directory on every host, and the
//!   input and output on a file system all hosts share), connected over TCP.
//! * `--launcher slurm` / `--launcher mpirun`: this process is one node, started on every
//!   host by `srun` or `mpirun`; its rank and the number of nodes come from the launcher's
//!   environment. Node 0 prints the report.
//!
//! TCP channels prove a cluster secret (see [`super::secret`]): the one given
//! (`--secret-file`, `ULNET_SECRET_FILE`, or the older `ULNET_SECRET` holding the secret
//! itself). The local and ssh launchers hand it to their nodes on standard input, never on
//! a command line other users of a host can read, and make a new one for the run when none
//! is given; nodes started by srun or mpirun on several hosts cannot agree on one by
//! themselves, so they refuse to start without one (unless `--insecure-no-secret`).
//!
//! Nodes report progress and their result as JSON lines on standard output; the launcher
//! draws progress bars on standard error and prints the report (a table, or one JSON object
//! with `--json`). A node that dies fails the sort with a message naming it, and no output
//! file appears.

use super::secret::{self, SecretError};
use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use ulnet_river::mesh::{MeshConfig, MeshTransport};
use ulnet_river::sort::launch::{from_mpi, from_slurm};
use ulnet_river::sort::{run_node, FormatChoice, NodePlace, OutputIo, Phase, SortJob, SortReport};
use ulnet_sortbench::room::{self, Replaced};

/// How the nodes are started.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Launcher {
    /// Local processes on this host.
    Local,
    /// One node per host of `--hosts`, started over ssh.
    Ssh,
    /// This process is a node started by `srun` (falls back to MPI variables).
    Slurm,
    /// This process is a node started by `mpirun`.
    Mpirun,
}

/// Arguments of `ulnet sort`.
#[derive(Args, Debug, Clone)]
pub struct SortArgs {
    /// File of 100-byte records to sort (gensort binary or ASCII).
    #[arg(long)]
    input: PathBuf,
    /// Where the sorted records go (with --partitioned, the prefix of OUTPUT.NNNNN files).
    #[arg(long)]
    output: PathBuf,
    /// Number of nodes (local launcher).
    #[arg(long, default_value_t = 2)]
    nodes: usize,
    /// How the nodes are started.
    #[arg(long, value_enum, default_value_t = Launcher::Local)]
    launcher: Launcher,
    /// Hosts for --launcher ssh, comma-separated; node 0 is the first.
    #[arg(long, value_delimiter = ',')]
    hosts: Vec<String>,
    /// Print one JSON object with the figures on stdout.
    #[arg(long)]
    json: bool,
    /// Memory bound per node (bytes; K, M, G, KiB, MiB, GiB suffixes): past it a node
    /// spills its records to key-range group files and sorts them group by group in a
    /// second pass.
    #[arg(long, value_parser = parse_bytes)]
    memory: Option<u64>,
    /// Directory for the group files of external mode (default: the output's directory).
    #[arg(long)]
    temp_dir: Option<PathBuf>,
    /// Treat the records as ASCII (gensort -a) and check that they are.
    #[arg(short = 'a', long, conflicts_with = "binary")]
    ascii: bool,
    /// Treat the records as binary (default: detected from samples).
    #[arg(long)]
    binary: bool,
    /// Write one file per node (OUTPUT.00000, …) instead of one file; with --verify also
    /// OUTPUT.sum, the partitions' valsort summaries for `ulnet valsort -s`.
    #[arg(long)]
    partitioned: bool,
    /// Checksum the input and validate the output on the fly (valsort's checks).
    #[arg(long)]
    verify: bool,
    /// fsync the output before reporting.
    #[arg(long)]
    fsync: bool,
    /// TCP port of node 0 (ssh, slurm and mpirun launchers).
    #[arg(long, default_value_t = 7477)]
    port: u16,
    /// HOST:PORT of node 0 when the launcher's environment cannot tell (multi-host mpirun).
    #[arg(long)]
    coordinator: Option<String>,
    /// The ssh command (for --launcher ssh).
    #[arg(long, default_value = "ssh")]
    ssh_command: String,
    /// Path of ulnet on the remote hosts (default: this executable's path).
    #[arg(long)]
    remote_ulnet: Option<String>,
    /// File holding the cluster secret for TCP channels between hosts (default: the file
    /// ULNET_SECRET_FILE names, else the secret ULNET_SECRET holds). The ssh launcher makes a
    /// new one for the run when none is given; slurm and mpirun across hosts need one.
    #[arg(long)]
    secret_file: Option<PathBuf>,
    /// Connect the nodes over TCP without a cluster secret: anyone who reaches --port can
    /// join the sort. For development on one host.
    #[arg(long, conflicts_with = "secret_file")]
    insecure_no_secret: bool,
    /// Print each node's process id on stderr as it starts (for tests and debugging).
    #[arg(long, hide = true)]
    print_pids: bool,
    /// Pause after each read buffer (ms): keeps a sort running long enough to kill a node.
    #[arg(long, hide = true, default_value_t = 0)]
    debug_read_delay_ms: u64,
    /// Only this node pauses after its read buffers (a slow node, for tests of how the
    /// input is shared out).
    #[arg(long, hide = true)]
    debug_slow_node: Option<usize>,
    /// Pause after each output buffer (ms): keeps a node writing long enough to kill it.
    #[arg(long, hide = true, default_value_t = 0)]
    debug_write_delay_ms: u64,
    /// External mode: bytes of group files each node leaves in the page cache before the
    /// rest goes into the output's blocks (default: its share of the kernel's background
    /// writeback threshold). For tests of that path on small inputs.
    #[arg(long, hide = true)]
    debug_files_budget: Option<u64>,
    /// External mode: move every boundary between two nodes' expected parts of the output
    /// this many records later (for tests of group bytes placed where the output would
    /// overwrite them first).
    #[arg(long, hide = true, default_value_t = 0)]
    debug_expected_shift: u64,
    /// How the output is written: auto (direct in external mode, buffered in memory
    /// mode), buffered (page cache), direct (O_DIRECT into a preallocated file, whole
    /// blocks; falls back to buffered where the file system refuses it).
    #[arg(long, value_enum, default_value_t = OutputIoArg::Auto)]
    output_io: OutputIoArg,
}

/// `--output-io` values.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputIoArg {
    /// Direct in external mode, buffered in memory mode.
    Auto,
    /// Through the page cache.
    Buffered,
    /// O_DIRECT whole blocks into a preallocated file.
    Direct,
}

/// Arguments of one node started by a launcher (`ulnet sort-node`).
#[derive(Args, Debug, Clone)]
pub struct SortNodeArgs {
    #[command(flatten)]
    sort: SortArgs,
    /// Name of the run.
    #[arg(long)]
    job: String,
    /// This node's rank.
    #[arg(long)]
    rank: usize,
    /// Number of nodes.
    #[arg(long)]
    size: usize,
    /// Connect over TCP (node 0 at --coordinator) instead of shared memory.
    #[arg(long)]
    tcp: bool,
    /// Host name the other nodes reach this one by (TCP).
    #[arg(long, default_value = "127.0.0.1")]
    advertise: String,
    /// Command start, Unix time in ns.
    #[arg(long)]
    t0: u128,
    /// Stop when standard input closes: the launcher (or the ssh session to it) is gone.
    #[arg(long)]
    watch_stdin: bool,
    /// Read the cluster secret from the first line of standard input, in hexadecimal, as
    /// the launcher writes it.
    #[arg(long)]
    secret_stdin: bool,
}

fn parse_bytes(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (n, unit) = s.split_at(split);
    let n: u64 = n.parse().map_err(|_| format!("`{s}` is not a size in bytes"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" => 1_000,
        "m" | "mb" => 1_000_000,
        "g" | "gb" => 1_000_000_000,
        "kib" => 1 << 10,
        "mib" => 1 << 20,
        "gib" => 1 << 30,
        other => return Err(format!("unknown size unit `{other}` (use K, M, G, KiB, MiB, GiB)")),
    };
    n.checked_mul(mult).ok_or_else(|| format!("`{s}` is too large"))
}

fn now_ns() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos())
}

fn absolute(p: &Path) -> Result<PathBuf> {
    Ok(if p.is_absolute() { p.to_path_buf() } else { std::env::current_dir()?.join(p) })
}

fn job_of(a: &SortArgs, job: String, nodes: usize, t0: u128) -> SortJob {
    SortJob {
        job,
        input: a.input.clone(),
        output: a.output.clone(),
        nodes,
        memory: a.memory,
        temp_dir: a.temp_dir.clone(),
        partitioned: a.partitioned,
        verify: a.verify,
        format: if a.ascii {
            FormatChoice::Ascii
        } else if a.binary {
            FormatChoice::Binary
        } else {
            FormatChoice::Auto
        },
        start_unix_ns: t0,
        fsync: a.fsync,
        read_delay_ms: a.debug_read_delay_ms,
        slow_node: a.debug_slow_node,
        write_delay_ms: a.debug_write_delay_ms,
        files_budget: a.debug_files_budget,
        expected_shift: a.debug_expected_shift,
        output_io: match a.output_io {
            OutputIoArg::Auto => OutputIo::Auto,
            OutputIoArg::Buffered => OutputIo::Buffered,
            OutputIoArg::Direct => OutputIo::Direct,
        },
    }
}

/// The secret given for TCP channels: `--secret-file`, the file `ULNET_SECRET_FILE` names,
/// or the secret `ULNET_SECRET` holds (the older way, kept for the scripts that use it).
fn given_secret(a: &SortArgs) -> Result<Option<Vec<u8>>, SecretError> {
    let from_env = || std::env::var("ULNET_SECRET").ok().filter(|s| !s.is_empty()).map(String::into_bytes);
    Ok(secret::given(a.secret_file.as_deref())?.or_else(from_env))
}

/// The secret of a node that connects over TCP by itself (started by srun or mpirun): the
/// one given, or the empty one with `--insecure-no-secret`; refused without either.
fn tcp_secret(a: &SortArgs) -> Result<Vec<u8>, SecretError> {
    if a.insecure_no_secret {
        return secret::for_server(None, true);
    }
    given_secret(a)?.ok_or(SecretError::Missing)
}

/// The secret for the nodes the local and ssh launchers start: the one given, the empty
/// one with `--insecure-no-secret`, else a new one for the run.
fn launched_secret(a: &SortArgs) -> Result<Vec<u8>> {
    match tcp_secret(a) {
        Err(SecretError::Missing) => Ok(secret::random()?),
        other => Ok(other?),
    }
}

/// The secret the launcher writes on the first line of a node's standard input.
fn secret_from_launcher() -> Result<Vec<u8>> {
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).context("reading the cluster secret from the launcher")?;
    secret::from_hex(line.trim_end()).context("the launcher's secret line is not hexadecimal")
}

/// `ulnet sort`.
pub fn run(a: SortArgs) -> Result<i32> {
    let t0 = now_ns();
    match a.launcher {
        Launcher::Local | Launcher::Ssh => launch(a, t0),
        Launcher::Slurm | Launcher::Mpirun => run_from_environment(a, t0),
    }
}

/// `ulnet sort-node`: one node started by `ulnet sort`; reports as JSON lines on stdout.
pub fn run_node_command(n: SortNodeArgs) -> Result<i32> {
    if !n.tcp {
        // While this process has one thread (see `Endpoint::prepare_shm`).
        ulnet_core::Endpoint::prepare_shm();
    }
    let transport = if n.tcp {
        MeshTransport::Tcp {
            coordinator: n.sort.coordinator.clone().context("--tcp needs --coordinator")?,
            bind_host: "0.0.0.0".into(),
            advertise_host: n.advertise.clone(),
        }
    } else {
        MeshTransport::Shm
    };
    let mut mesh = MeshConfig::shm(&n.job, n.rank, n.size);
    mesh.transport = transport;
    mesh.secret = if n.secret_stdin {
        secret_from_launcher()?
    } else if n.tcp {
        tcp_secret(&n.sort)?
    } else {
        Vec::new()
    };
    let job = job_of(&n.sort, n.job.clone(), n.size, n.t0);
    if n.watch_stdin {
        // A node whose launcher died (or whose ssh session was cut) must not linger holding
        // ports and files: the launcher keeps our stdin open for as long as it waits for us.
        let rank = n.rank;
        let mut partial = vec![job.partial_partition_file(rank)];
        if rank == 0 {
            partial.push(job.partial_output());
        }
        std::thread::spawn(move || {
            let mut buf = [0u8; 64];
            while matches!(std::io::Read::read(&mut std::io::stdin(), &mut buf), Ok(n) if n > 0) {}
            for p in &partial {
                let _ = std::fs::remove_file(p);
            }
            eprintln!("ulnet: error: node {rank}: the launcher went away; stopping");
            std::process::exit(1);
        });
    }
    let place = NodePlace { rank: n.rank, mesh };
    let rank = n.rank;
    let mut progress = |phase: Phase, records: u64| {
        let phase = match phase {
            Phase::Read => "read",
            Phase::Write => "write",
        };
        println!("{}", serde_json::json!({"progress": {"rank": rank, "phase": phase, "records": records}}));
    };
    let report = run_node(&job, &place, &mut progress).with_context(|| format!("node {rank}"))?;
    if let Some(r) = report {
        println!("{}", serde_json::json!({ "report": r }));
    }
    Ok(0)
}

/// A node started by srun or mpirun: runs here; node 0 prints the report.
fn run_from_environment(a: SortArgs, t0: u128) -> Result<i32> {
    let env = |k: &str| std::env::var(k).ok();
    let placement = match a.launcher {
        Launcher::Slurm => match from_slurm(&env, a.port)? {
            Some(p) => Some(p),
            None => from_mpi(&env, a.port, a.coordinator.as_deref())?,
        },
        _ => from_mpi(&env, a.port, a.coordinator.as_deref())?,
    };
    let Some(p) = placement else {
        bail!("--launcher {:?} but no Slurm or MPI rank variables are set: start it with srun or mpirun", a.launcher)
    };
    // Every rank checks, so that all refuse together rather than some wait for the others.
    if let Ok(input) = std::fs::metadata(&a.input) {
        check_output_room(&a, input.len(), p.single_host)?;
    }
    if p.single_host {
        // While this process has one thread (see `Endpoint::prepare_shm`).
        ulnet_core::Endpoint::prepare_shm();
    }
    let mut mesh = MeshConfig::shm(&p.job, p.rank, p.size);
    if !p.single_host {
        mesh.secret = tcp_secret(&a)?;
        mesh.transport = MeshTransport::Tcp {
            coordinator: p.coordinator.clone(),
            bind_host: "0.0.0.0".into(),
            // Slurm names the node it placed us on; otherwise the host's own name.
            advertise_host: std::env::var("SLURMD_NODENAME").ok().unwrap_or_else(|| {
                std::fs::read_to_string("/proc/sys/kernel/hostname")
                    .map(|h| h.trim().to_string())
                    .unwrap_or_else(|_| "127.0.0.1".into())
            }),
        };
    }
    let job = job_of(&a, p.job.clone(), p.size, t0);
    let bars = (p.rank == 0 && !a.json).then(|| Bars::new(job_records(&job)));
    let mut progress = |phase: Phase, records: u64| {
        if let Some(b) = &bars {
            b.set(0, phase, records);
        }
    };
    let report = match run_node(&job, &NodePlace { rank: p.rank, mesh }, &mut progress) {
        Ok(r) => r,
        Err(e) => bail!("{} rank {} of {}: {e}", p.launcher, p.rank, p.size),
    };
    if let Some(b) = bars {
        b.finish();
    }
    if let Some(r) = report {
        print_report(&r, a.json)?;
    }
    Ok(0)
}

/// Refuses an output its file system cannot hold before any node starts: the sorted
/// records take the input's size, and an output already there stays until the new one is
/// renamed over it. Partitions on several hosts (`--partitioned`) each take a share known
/// only after sampling, on file systems this process may not see: not checked.
fn check_output_room(a: &SortArgs, input_bytes: u64, one_host: bool) -> Result<()> {
    if a.partitioned && !one_host {
        return Ok(());
    }
    room::check(&a.output, u128::from(input_bytes), Replaced::AfterRename).context("the sorted records")
}

fn job_records(job: &SortJob) -> u64 {
    std::fs::metadata(&job.input).map_or(0, |m| m.len() / 100)
}

/// Progress bars on stderr: records read and distributed, records written.
struct Bars {
    _multi: MultiProgress,
    read: ProgressBar,
    write: ProgressBar,
    read_by_node: std::cell::RefCell<Vec<u64>>,
    write_by_node: std::cell::RefCell<Vec<u64>>,
}

impl Bars {
    fn new(total: u64) -> Self {
        let multi = MultiProgress::with_draw_target(ProgressDrawTarget::stderr_with_hz(10));
        let style = ProgressStyle::with_template("{prefix:>16} [{bar:40}] {human_pos}/{human_len} records, {elapsed}")
            .expect("a valid template")
            .progress_chars("=> ");
        let read = multi.add(ProgressBar::new(total).with_style(style.clone()).with_prefix("read+distribute"));
        let write = multi.add(ProgressBar::new(total).with_style(style).with_prefix("sort+write"));
        Bars { _multi: multi, read, write, read_by_node: Default::default(), write_by_node: Default::default() }
    }

    fn set(&self, rank: usize, phase: Phase, records: u64) {
        let (bar, by) = match phase {
            Phase::Read => (&self.read, &self.read_by_node),
            Phase::Write => (&self.write, &self.write_by_node),
        };
        let mut by = by.borrow_mut();
        if by.len() <= rank {
            by.resize(rank + 1, 0);
        }
        by[rank] = records;
        bar.set_position(by.iter().sum());
    }

    fn finish(&self) {
        self.read.finish_and_clear();
        self.write.finish_and_clear();
    }
}

/// Lines of each node's stderr kept (the rest is dropped): enough for its error and the
/// warnings before it.
const NODE_LOG_LINES: usize = 64;

enum NodeEvent {
    Progress(usize, Phase, u64),
    Report(Box<SortReport>),
    Exited(usize),
}

fn shell_quote(s: &str) -> String {
    if !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || "-_./:=,@".contains(c)) {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

/// The arguments every node gets: the job as the launcher was given it.
fn node_args(a: &SortArgs, job: &str, rank: usize, size: usize, t0: u128) -> Vec<String> {
    let mut v: Vec<String> = vec!["sort-node".into(), "--watch-stdin".into(), "--secret-stdin".into()];
    v.extend(["--job".into(), job.into()]);
    v.extend(["--rank".into(), rank.to_string(), "--size".into(), size.to_string(), "--t0".into(), t0.to_string()]);
    v.extend(["--input".into(), a.input.display().to_string(), "--output".into(), a.output.display().to_string()]);
    if let Some(m) = a.memory {
        v.extend(["--memory".into(), m.to_string()]);
    }
    if let Some(t) = &a.temp_dir {
        v.extend(["--temp-dir".into(), t.display().to_string()]);
    }
    for (flag, on) in [
        ("--ascii", a.ascii),
        ("--binary", a.binary),
        ("--partitioned", a.partitioned),
        ("--verify", a.verify),
        ("--fsync", a.fsync),
    ] {
        if on {
            v.push(flag.into());
        }
    }
    if a.debug_write_delay_ms > 0 {
        v.extend(["--debug-write-delay-ms".into(), a.debug_write_delay_ms.to_string()]);
    }
    if a.output_io != OutputIoArg::Auto {
        let name = clap::ValueEnum::to_possible_value(&a.output_io).expect("no skipped values");
        v.extend(["--output-io".into(), name.get_name().to_string()]);
    }
    if a.debug_read_delay_ms > 0 {
        v.extend(["--debug-read-delay-ms".into(), a.debug_read_delay_ms.to_string()]);
    }
    if let Some(r) = a.debug_slow_node {
        v.extend(["--debug-slow-node".into(), r.to_string()]);
    }
    if let Some(b) = a.debug_files_budget {
        v.extend(["--debug-files-budget".into(), b.to_string()]);
    }
    if a.debug_expected_shift > 0 {
        v.extend(["--debug-expected-shift".into(), a.debug_expected_shift.to_string()]);
    }
    v
}

/// Starts the nodes (local processes or over ssh), shows progress, reports.
fn launch(mut a: SortArgs, t0: u128) -> Result<i32> {
    a.input = absolute(&a.input)?;
    a.output = absolute(&a.output)?;
    let meta = std::fs::metadata(&a.input).with_context(|| format!("reading {}", a.input.display()))?;
    if meta.len() % 100 != 0 {
        bail!("{} holds {} bytes, not a whole number of 100-byte records", a.input.display(), meta.len());
    }
    let ssh = a.launcher == Launcher::Ssh;
    let size = if ssh {
        if a.hosts.is_empty() {
            bail!("--launcher ssh needs --hosts H1,H2,...");
        }
        a.hosts.len()
    } else {
        a.nodes
    };
    if !(1..=256).contains(&size) {
        bail!("--nodes must be between 1 and 256");
    }
    check_output_room(&a, meta.len(), !ssh)?;
    let job = format!("{}-{:x}", std::process::id(), t0 % (1 << 32));
    let sort_job = job_of(&a, job.clone(), size, t0);
    let secret_line = format!("{}\n", secret::to_hex(&launched_secret(&a)?));
    let exe = std::env::current_exe()?;
    let remote_exe = a.remote_ulnet.clone().unwrap_or_else(|| exe.display().to_string());
    let coordinator =
        a.coordinator.clone().unwrap_or_else(|| format!("{}:{}", a.hosts.first().map_or("", |h| h.as_str()), a.port));
    let cwd = std::env::current_dir()?;

    let (tx, rx) = mpsc::channel::<NodeEvent>();
    let node_logs: Vec<Arc<Mutex<Vec<String>>>> = (0..size).map(|_| Arc::default()).collect();
    // Held open until the nodes are done: a node stops when its stdin closes.
    let mut stdins = Vec::with_capacity(size);
    let mut children: Vec<Child> = Vec::with_capacity(size);
    for (rank, log) in node_logs.iter().enumerate() {
        let mut args = node_args(&a, &job, rank, size, t0);
        let mut cmd = if ssh {
            args.extend(["--tcp".into(), "--coordinator".into(), coordinator.clone()]);
            args.extend(["--advertise".into(), a.hosts[rank].clone()]);
            let remote = format!(
                "cd {} && exec {} {}",
                shell_quote(&cwd.display().to_string()),
                shell_quote(&remote_exe),
                args.iter().map(|s| shell_quote(s)).collect::<Vec<_>>().join(" ")
            );
            let mut parts = a.ssh_command.split_whitespace();
            let mut c = Command::new(parts.next().context("empty --ssh-command")?);
            c.args(parts).args(["-o", "BatchMode=yes", &a.hosts[rank], &remote]);
            c
        } else {
            let mut c = Command::new(&exe);
            c.args(&args);
            c
        };
        // Nodes' stderr is kept: on failure their first error joins the launcher's one-line
        // message; on success whatever they logged is passed on.
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                kill_all(&mut children);
                bail!("starting node {rank}: {e}");
            }
        };
        if a.print_pids {
            eprintln!("ulnet sort: node {rank} pid {}", child.id());
        }
        let mut stdin = child.stdin.take();
        if let Some(s) = stdin.as_mut() {
            // A node that cannot take it has ended, and its exit status and stderr say why
            // below.
            let _ = s.write_all(secret_line.as_bytes());
        }
        stdins.push(stdin);
        let err = child.stderr.take().expect("piped stderr");
        let log = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                let mut log = log.lock().unwrap_or_else(|e| e.into_inner());
                if log.len() < NODE_LOG_LINES {
                    log.push(line);
                }
            }
        });
        let out = child.stdout.take().expect("piped stdout");
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else { continue };
                if let Some(p) = v.get("progress") {
                    let phase = if p["phase"] == "write" { Phase::Write } else { Phase::Read };
                    let _ = tx.send(NodeEvent::Progress(rank, phase, p["records"].as_u64().unwrap_or(0)));
                } else if let Some(r) = v.get("report") {
                    if let Ok(r) = serde_json::from_value::<SortReport>(r.clone()) {
                        let _ = tx.send(NodeEvent::Report(Box::new(r)));
                    }
                }
            }
            let _ = tx.send(NodeEvent::Exited(rank));
        });
        children.push(child);
    }
    drop(tx);

    let bars = (!a.json).then(|| Bars::new(meta.len() / 100));
    let mut report = None;
    let mut running = size;
    // The node that failed first, and how.
    let mut failure: Option<(usize, String)> = None;
    while running > 0 {
        let event = match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(e) => e,
            Err(mpsc::RecvTimeoutError::Timeout) => continue,
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        };
        match event {
            NodeEvent::Progress(rank, phase, n) => {
                if let Some(b) = &bars {
                    b.set(rank, phase, n);
                }
            }
            NodeEvent::Report(r) => report = Some(r),
            NodeEvent::Exited(rank) => {
                running -= 1;
                let status = children[rank].wait()?;
                if !status.success() && failure.is_none() {
                    let how = match (status.code(), std::os::unix::process::ExitStatusExt::signal(&status)) {
                        (_, Some(sig)) => format!("was killed by signal {sig}"),
                        (Some(c), _) => format!("exited with status {c}"),
                        _ => format!("ended ({status})"),
                    };
                    let place = if ssh { format!(" on {}", a.hosts[rank]) } else { String::new() };
                    failure = Some((rank, format!("node {rank} (pid {}{place}) {how}", children[rank].id())));
                    // The others notice through their channels and stop; give them a moment
                    // to say so, then make sure.
                    let deadline = Instant::now() + Duration::from_secs(5);
                    while Instant::now() < deadline && children.iter_mut().any(|c| matches!(c.try_wait(), Ok(None))) {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    kill_all(&mut children);
                }
            }
        }
    }
    if let Some(b) = &bars {
        b.finish();
    }
    drop(stdins);
    let logs: Vec<Vec<String>> =
        node_logs.iter().map(|l| std::mem::take(&mut *l.lock().unwrap_or_else(|e| e.into_inner()))).collect();
    if let Some((failed, f)) = failure {
        for p in sort_job.partial_files() {
            let _ = std::fs::remove_file(p);
        }
        // What went wrong, said by a node that saw it first-hand rather than one told by
        // another: the failed node's own error when it said one, else the first other's.
        let errors: Vec<&str> = std::iter::once(&logs[failed])
            .chain(logs.iter().enumerate().filter(|&(rank, _)| rank != failed).map(|(_, l)| l))
            .flatten()
            .filter_map(|l| l.strip_prefix("ulnet: error: "))
            .collect();
        let seen = errors
            .iter()
            .find(|e| !e.contains("(reported by node"))
            .or(errors.first())
            .map(|e| format!(" ({e})"))
            .unwrap_or_default();
        bail!("sort failed: {f}{seen}; no output was written");
    }
    for line in logs.iter().flatten() {
        eprintln!("{line}");
    }
    let mut report = *report.context("node 0 ended without a report")?;
    report.total_s = now_ns().saturating_sub(t0) as f64 / 1e9;
    print_report(&report, a.json)?;
    Ok(0)
}

fn kill_all(children: &mut [Child]) {
    for c in children.iter_mut() {
        if matches!(c.try_wait(), Ok(None)) {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn print_report(r: &SortReport, json: bool) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string(r)?);
        return Ok(());
    }
    println!(
        "sorted {} {} records ({:.1} MB) on {} node{} in {:.3} s ({} mode{}), {:.1} MB/s",
        r.records,
        r.format,
        r.bytes as f64 / 1e6,
        r.nodes,
        if r.nodes == 1 { "" } else { "s" },
        r.total_s,
        r.mode,
        if r.verified { ", verified: sorted, complete, checksum matches" } else { "" },
        r.bytes as f64 / 1e6 / r.total_s
    );
    println!("node  host            records     startup_s  read+dist_s  sort_s  write_s  spills  groups(merged)  sent");
    for n in &r.per_node {
        println!(
            "{:>4}  {:<14}  {:>10}  {:>9.3}  {:>11.3}  {:>6.3}  {:>7.3}  {:>6}  {:>6}({})  {}",
            n.rank,
            n.host,
            n.records,
            n.startup_s,
            n.read_distribute_s,
            n.sort_s,
            n.write_s,
            n.spills,
            n.groups,
            n.merged_groups,
            n.records_sent
        );
    }
    println!(
        "node  launched_s  connected_s  read_own_s  cpu_user_s  cpu_sys_s  minor_faults  switches(vol/invol)  peak_rss_MiB"
    );
    for n in &r.per_node {
        let u = &n.usage;
        println!(
            "{:>4}  {:>10.3}  {:>11.3}  {:>10.3}  {:>10.3}  {:>9.3}  {:>12}  {}/{}  {:.1}",
            n.rank,
            n.launched_s,
            n.connected_s,
            n.read_own_s,
            u.user_s,
            u.sys_s,
            u.minor_faults,
            u.voluntary_switches,
            u.involuntary_switches,
            u.max_rss_kib as f64 / 1024.0
        );
    }
    println!(
        "slowest node: startup {:.3} s, read+distribute {:.3} s, sort {:.3} s, write {:.3} s; largest partition {:.3} x mean",
        r.startup_s, r.read_distribute_s, r.sort_s, r.write_s, r.imbalance
    );
    Ok(())
}
