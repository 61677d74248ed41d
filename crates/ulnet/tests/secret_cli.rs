//! The cluster secret on the command line: `ulnet node` refuses to start without one
//! (unless `--insecure-no-secret`), reads it from `--secret-file` or `ULNET_SECRET_FILE`,
//! refuses an empty file and warns about one other users may read; a client without the
//! node's secret is told the likely cause.

mod common;

use common::free_addrs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const ULNET: &str = env!("CARGO_BIN_EXE_ulnet");

/// `ulnet ARGS` without the caller's ULNET_SECRET_FILE.
fn ulnet(args: &[&str]) -> Command {
    let mut c = Command::new(ULNET);
    c.args(args).env_remove("ULNET_SECRET_FILE").env("ULNET_LOG", "error").stdin(Stdio::null());
    c
}

/// Runs `c` to its end, or kills it after 10 s and returns `None`: a node that starts never
/// ends by itself.
fn run_to_end(c: &mut Command) -> Option<Output> {
    let mut child = c.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            child.kill().unwrap();
            child.wait().unwrap();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Some(child.wait_with_output().unwrap())
}

fn stderr_of(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A secret file holding `text`, with permissions `mode`.
fn secret_file(dir: &Path, name: &str, text: &str, mode: u32) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
    path
}

/// A node process, killed when dropped; its stderr goes to a file.
struct Node {
    child: Child,
    stderr: PathBuf,
}

impl Node {
    fn start(mut c: Command, dir: &Path) -> Node {
        let stderr = dir.join("node.stderr");
        let log = std::fs::File::create(&stderr).unwrap();
        Node { child: c.stdout(Stdio::null()).stderr(log).spawn().unwrap(), stderr }
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Asks `addr` for its status with `c` until it answers (10 s at most).
fn status_answers(addr: &str, with: impl Fn(&mut Command) -> &mut Command) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        let out = with(&mut ulnet(&["cluster", "status", "--connect", addr, "--json"])).output().unwrap();
        if out.status.success() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

#[test]
fn a_node_without_a_secret_exits_2_saying_what_to_do() {
    let addr = free_addrs(1, 0)[0].to_string();
    let out =
        run_to_end(&mut ulnet(&["node", "--name", "a", "--listen", &addr])).expect("the node started without a secret");
    assert_eq!(out.status.code(), Some(2), "{}", stderr_of(&out));
    let err = stderr_of(&out);
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    for what in ["--secret-file", "head -c 32 /dev/urandom", "chmod 600", "ULNET_SECRET_FILE", "--insecure-no-secret"] {
        assert!(err.contains(what), "the error names {what}: {err}");
    }
}

#[test]
fn an_insecure_node_starts_and_answers_without_a_secret() {
    let dir = tempfile::tempdir().unwrap();
    let addr = free_addrs(1, 10)[0].to_string();
    let node = Node::start(ulnet(&["node", "--name", "a", "--listen", &addr, "--insecure-no-secret"]), dir.path());
    assert!(status_answers(&addr, |c| c), "the insecure node answers a client without a secret: {}", node.stderr());
    assert!(node.stderr().contains("running without a cluster secret"), "{}", node.stderr());
}

#[test]
fn the_secret_file_may_come_from_ulnet_secret_file() {
    let dir = tempfile::tempdir().unwrap();
    let secret = secret_file(dir.path(), "secret", "env-secret\n", 0o600);
    let addr = free_addrs(1, 20)[0].to_string();
    let mut c = ulnet(&["node", "--name", "a", "--listen", &addr]);
    c.env("ULNET_SECRET_FILE", &secret);
    let node = Node::start(c, dir.path());
    assert!(status_answers(&addr, |c| c.env("ULNET_SECRET_FILE", &secret)), "{}", node.stderr());
    assert!(status_answers(&addr, |c| c.arg("--secret-file").arg(&secret)), "{}", node.stderr());
    assert_eq!(node.stderr().matches("warning").count(), 0, "a private file is not warned about: {}", node.stderr());
    // Without the secret, clients are refused, and told why.
    for args in [&["cluster", "status", "--connect", &addr][..], &["registry", "get", "k", "--connect", &addr]] {
        let out = run_to_end(&mut ulnet(args)).expect("a client ends");
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", stderr_of(&out));
        assert!(stderr_of(&out).contains("wrong or missing --secret-file"), "{args:?}: {}", stderr_of(&out));
    }
    let wrong = secret_file(dir.path(), "wrong", "another secret", 0o600);
    let out = ulnet(&["cluster", "status", "--connect", &addr]).arg("--secret-file").arg(&wrong).output().unwrap();
    assert!(stderr_of(&out).contains("wrong or missing --secret-file"), "{}", stderr_of(&out));
}

/// Runs `c` (given an empty secret file), which must refuse it: exit 2, naming the cause.
fn refuses_the_empty_file(c: &mut Command) {
    let out = run_to_end(c).expect("the command went on with an empty secret");
    assert_eq!(out.status.code(), Some(2), "{}", stderr_of(&out));
    assert!(stderr_of(&out).contains("is empty"), "{}", stderr_of(&out));
}

#[test]
fn an_empty_secret_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let empty = secret_file(dir.path(), "secret", " \n", 0o600);
    let addr = free_addrs(1, 30)[0].to_string();
    refuses_the_empty_file(ulnet(&["node", "--name", "a", "--listen", &addr]).arg("--secret-file").arg(&empty));
    refuses_the_empty_file(ulnet(&["node", "--name", "a", "--listen", &addr]).env("ULNET_SECRET_FILE", &empty));
    refuses_the_empty_file(ulnet(&["registry", "get", "k", "--connect", &addr]).arg("--secret-file").arg(&empty));
}

#[test]
fn a_secret_file_others_may_read_is_used_with_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let secret = secret_file(dir.path(), "secret", "readable-secret", 0o644);
    let addr = free_addrs(1, 40)[0].to_string();
    let mut c = ulnet(&["node", "--name", "a", "--listen", &addr]);
    c.arg("--secret-file").arg(&secret);
    let node = Node::start(c, dir.path());
    assert!(status_answers(&addr, |c| c.arg("--secret-file").arg(&secret)), "{}", node.stderr());
    let err = node.stderr();
    assert!(err.contains("other users may read") && err.contains("chmod 600"), "{err}");
}
