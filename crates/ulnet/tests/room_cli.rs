//! Commands that write a size chosen up front check the room first: `gensort` refuses a
//! count its file system cannot hold, or no file can, with both figures and without
//! touching the file; `sort` refuses an output its file system cannot hold before any node
//! starts. Each runs on a small tmpfs mounted in a mount namespace of its own (needs root;
//! skips with the reason otherwise).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

const ULNET: &str = env!("CARGO_BIN_EXE_ulnet");

/// A tmpfs of 1 MiB at a temporary directory, seen only by the processes of a mount
/// namespace that a holder process keeps alive; gone when dropped.
struct SmallFs {
    holder: Child,
    dir: tempfile::TempDir,
}

/// Bytes the small file system holds.
const SMALL_FS_BYTES: u64 = 1 << 20;

impl SmallFs {
    fn new() -> Option<SmallFs> {
        if !rustix::process::geteuid().is_root() {
            eprintln!("skipped: needs root (mount namespaces, tmpfs)");
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let mut holder = Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c"])
            .arg("mount -t tmpfs -o size=$1 tmpfs \"$2\" && echo mounted && exec sleep 600")
            .args(["sh", &SMALL_FS_BYTES.to_string()])
            .arg(dir.path())
            .stdout(Stdio::piped())
            .spawn()
            .expect("unshare (util-linux)");
        let mut line = String::new();
        BufReader::new(holder.stdout.take().unwrap()).read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "mounted", "mounting the small file system");
        Some(SmallFs { holder, dir })
    }

    /// `name` in the small file system, as its namespace's processes see it.
    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `name` in the small file system, as this process reaches it (through the holder's
    /// root).
    fn seen_from_here(&self, name: &str) -> PathBuf {
        Path::new(&format!("/proc/{}/root", self.holder.id())).join(self.path(name).strip_prefix("/").unwrap())
    }

    /// Runs `ulnet ARGS` in the small file system's namespace.
    fn ulnet(&self, args: &[&str]) -> Output {
        Command::new("nsenter")
            .args(["--target", &self.holder.id().to_string(), "--mount", ULNET])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = self.holder.kill();
        let _ = self.holder.wait();
    }
}

fn stderr_of(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn gensort_refuses_what_the_file_system_cannot_hold_and_writes_what_fits() {
    let Some(fs) = SmallFs::new() else { return };
    let file = fs.path("x.dat");
    let file = file.to_str().unwrap();
    // 2 MB on 1 MiB: refused with both figures, nothing created.
    let out = fs.ulnet(&["gensort", "20000", file]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr_of(&out));
    let err = stderr_of(&out);
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(err.contains("needs 2.0 MB") && err.contains("has 1.0 MB free"), "{err}");
    assert!(!fs.seen_from_here("x.dat").exists(), "nothing written");
    // More than any file can hold: refused at once.
    let out = fs.ulnet(&["gensort", "18446744073709551615", file]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr_of(&out));
    assert!(stderr_of(&out).contains("would need 1.8 ZB, more than a file can hold"), "{}", stderr_of(&out));
    assert!(!fs.seen_from_here("x.dat").exists(), "nothing written");
    // 500 kB fits.
    let out = fs.ulnet(&["gensort", "5000", file]);
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert_eq!(std::fs::metadata(fs.seen_from_here("x.dat")).unwrap().len(), 500_000);
    // 900 kB fits in place of those 500 kB (truncated first), not beside them.
    let out = fs.ulnet(&["gensort", "9000", file]);
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert_eq!(std::fs::metadata(fs.seen_from_here("x.dat")).unwrap().len(), 900_000);
    // A refusal leaves the file there as it was.
    let out = fs.ulnet(&["gensort", "20000", file]);
    assert!(stderr_of(&out).contains("counting the"), "{}", stderr_of(&out));
    assert_eq!(std::fs::metadata(fs.seen_from_here("x.dat")).unwrap().len(), 900_000);
}

#[test]
fn sort_refuses_an_output_the_file_system_cannot_hold() {
    let Some(fs) = SmallFs::new() else { return };
    let inputs = tempfile::tempdir().unwrap();
    let big = inputs.path().join("big.dat");
    let small = inputs.path().join("small.dat");
    for (path, records) in [(&big, "20000"), (&small, "5000")] {
        let out = Command::new(ULNET).args(["gensort", records, path.to_str().unwrap()]).output().unwrap();
        assert!(out.status.success(), "{}", stderr_of(&out));
    }
    let output = fs.path("out.dat");
    let output = output.to_str().unwrap();
    for extra in [&[][..], &["--partitioned"]] {
        let mut args = vec!["sort", "--nodes", "2", "--input", big.to_str().unwrap(), "--output", output];
        args.extend_from_slice(extra);
        let out = fs.ulnet(&args);
        assert_eq!(out.status.code(), Some(1), "{extra:?}: {}", stderr_of(&out));
        let err = stderr_of(&out);
        assert!(err.contains("needs 2.0 MB") && err.contains("has 1.0 MB free"), "{extra:?}: {err}");
        assert_eq!(std::fs::read_dir(fs.seen_from_here("")).unwrap().count(), 0, "{extra:?}: nothing written");
    }
    let out = fs.ulnet(&["sort", "--nodes", "2", "--input", small.to_str().unwrap(), "--output", output]);
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert_eq!(std::fs::metadata(fs.seen_from_here("out.dat")).unwrap().len(), 500_000);
}
