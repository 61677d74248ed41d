//! Mounting the tracing pass-through, and the two ways of tracing with it: a mount over a
//! directory that lasts until it is stopped (`ulnet fsstudy trace --mount DIR`), and a
//! command run with its working directory inside the mount (`-- COMMAND`).
//!
//! **Over the directory itself.** The pass-through holds the directory open before the
//! mount covers it, so the mount may be made on the directory it passes through to: every
//! process that reaches the directory by its path from then on goes through the trace;
//! one whose working directory was already inside it keeps the uncovered directory and
//! is not traced.
//!
//! **Mount options and why.** Direct I/O for every open file (each `read` and `write` a
//! program makes reaches the trace with its own offset and size, not the page cache's
//! read-ahead and write-behind, and a re-read is not hidden by the cache); no writeback
//! cache (it would turn the program's writes into the kernel's, later and page-sized);
//! names and attributes not cached by default ([`super::FsOptions::cache_ttl`]), so every
//! `stat` and name lookup is seen; requests of up to 1 MiB (the kernel's most); sessions
//! served by [`MountOptions::threads`] threads, each with its own cloned FUSE descriptor.
//! Only the user who mounts (here root) may use the mount, so files it creates have the
//! owner they would have had.

use super::fs::{FsOptions, Passthrough};
use crate::recorder::{Recorder, RING_RECORDS_DEFAULT};
use crate::writer::{WriteError, WriteSummary};
use fuser::{BackgroundSession, Config, MountOption, Session, SessionACL};
use std::path::{Path, PathBuf};

/// How to mount and record.
#[derive(Clone, Debug)]
pub struct MountOptions {
    /// Threads serving requests. Default: the number of CPUs, at least 2, so one request
    /// waiting on the backing disk does not hold up the others; more than the CPUs only
    /// adds switching.
    pub threads: usize,
    /// Records the ring between the serving threads and the trace writer holds (see
    /// [`crate::recorder`]).
    pub ring_records: usize,
    /// How files are served.
    pub fs: FsOptions,
}

impl Default for MountOptions {
    fn default() -> Self {
        let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
        MountOptions { threads: cpus.max(2), ring_records: RING_RECORDS_DEFAULT, fs: FsOptions::default() }
    }
}

/// Why tracing could not start or finish.
#[derive(Debug, thiserror::Error)]
pub enum CollectError {
    /// The trace file.
    #[error(transparent)]
    Write(#[from] WriteError),
    /// FUSE is not available.
    #[error("FUSE is not available: {0} (load the fuse module, run as root, or install fuse3 for fusermount3)")]
    NoFuse(String),
    /// The directory to trace.
    #[error("{path}: {source} (give an existing directory)")]
    Directory {
        /// The directory.
        path: PathBuf,
        /// What the system said.
        #[source]
        source: std::io::Error,
    },
    /// The mount failed.
    #[error("mounting the tracing pass-through on {path}: {source}")]
    Mount {
        /// The mount point.
        path: PathBuf,
        /// What the system said.
        #[source]
        source: std::io::Error,
    },
    /// Unmounting failed.
    #[error("unmounting {path}: {source} (unmount it with `umount -l {path}`)", path = .path.display())]
    Unmount {
        /// The mount point.
        path: PathBuf,
        /// What the system said.
        #[source]
        source: std::io::Error,
    },
    /// The command could not be started.
    #[error("starting {command}: {source}")]
    Command {
        /// The command.
        command: String,
        /// What the system said.
        #[source]
        source: std::io::Error,
    },
}

/// What a finished trace holds.
#[derive(Clone, Debug, serde::Serialize)]
pub struct TraceSummary {
    /// The trace file.
    pub output: PathBuf,
    /// The file's contents.
    pub written: WriteSummary,
    /// The mount was still in use when tracing stopped and was detached: later operations
    /// on it are not traced.
    pub detached_busy: bool,
}

/// A mounted, recording pass-through.
pub struct Mounted {
    session: BackgroundSession,
    recorder: Recorder,
    mountpoint: PathBuf,
    output: PathBuf,
}

/// Whether this process can mount FUSE file systems here; the reason when not.
pub fn fuse_available() -> Result<(), String> {
    if !Path::new("/dev/fuse").exists() {
        return Err("/dev/fuse does not exist".into());
    }
    if !rustix::process::geteuid().is_root() {
        return Err("mounting without fusermount3 needs root".into());
    }
    Ok(())
}

/// Mounts a pass-through to `source` on `mountpoint` (they may be the same directory)
/// that records every operation into `output`.
pub fn mount(source: &Path, mountpoint: &Path, output: &Path, options: &MountOptions) -> Result<Mounted, CollectError> {
    for dir in [source, mountpoint] {
        std::fs::read_dir(dir).map_err(|e| CollectError::Directory { path: dir.into(), source: e })?;
    }
    let recorder = Recorder::start(output, options.ring_records)?;
    let fs = Passthrough::new(source, recorder.sink(), &options.fs)
        .map_err(|e| CollectError::Directory { path: source.into(), source: e })?;
    let mut config = Config::default();
    config.mount_options = vec![MountOption::FSName("ulnet-fsstudy".into()), MountOption::Subtype("fsstudy".into())];
    config.acl = SessionACL::Owner;
    config.n_threads = Some(options.threads.max(1));
    config.clone_fd = true;
    let mount_err = |source| CollectError::Mount { path: mountpoint.into(), source };
    let session = Session::new(fs, mountpoint, &config).map_err(mount_err)?.spawn().map_err(mount_err)?;
    Ok(Mounted { session, recorder, mountpoint: mountpoint.into(), output: output.into() })
}

impl Mounted {
    /// Where the pass-through is mounted.
    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// Unmounts (detaching the mount if a process still uses it), lets the serving threads
    /// end, and finishes the trace file.
    pub fn finish(self) -> Result<TraceSummary, CollectError> {
        let unmount_err = |source: std::io::Error| CollectError::Unmount { path: self.mountpoint.clone(), source };
        // Unmounting ends the kernel's session and with it the serving threads; a mount
        // still in use is detached instead, and its threads left to end with its last user.
        let detached_busy = match self.session.umount_and_join() {
            Ok(()) => false,
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                rustix::mount::unmount(&self.mountpoint, rustix::mount::UnmountFlags::DETACH)
                    .map_err(|e| unmount_err(e.into()))?;
                true
            }
            Err(e) => return Err(unmount_err(e)),
        };
        let written = self.recorder.finish()?;
        Ok(TraceSummary { output: self.output, written, detached_busy })
    }
}

/// Mounts over `dir`, runs `command` with its working directory there, and finishes the
/// trace when the command has exited. Returns the command's exit status.
pub fn run_command(
    dir: &Path,
    output: &Path,
    command: &[std::ffi::OsString],
    options: &MountOptions,
) -> Result<(std::process::ExitStatus, TraceSummary), CollectError> {
    let (program, args) = command.split_first().ok_or_else(|| CollectError::Command {
        command: String::new(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "no command given"),
    })?;
    let mounted = mount(dir, dir, output, options)?;
    let status = std::process::Command::new(program).args(args).current_dir(dir).status();
    let summary = mounted.finish()?;
    let status =
        status.map_err(|source| CollectError::Command { command: program.to_string_lossy().into(), source })?;
    Ok((status, summary))
}
