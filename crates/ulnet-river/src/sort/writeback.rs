//! Starting the writeback of a file's dirty pages without waiting for it, from a thread of
//! its own ([`Pusher`]), so that the bytes the external sort puts in the output's blocks
//! (`spare`) reach the disk while the first pass runs and never count as dirty for long.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// How often the pusher starts the writeback of what was written since: 2 ms, in which
/// the first pass of the 4x10^7 benchmark puts about 1.5 MB there per node, so that the
/// device always has writes queued and dirty bytes never pile up.
const PUSH_EVERY: Duration = Duration::from_millis(2);

/// Starts writing back every dirty page of `file` that is not already under writeback,
/// without waiting for any of it (`sync_file_range(SYNC_FILE_RANGE_WRITE)` over the whole
/// file).
pub fn start_writeback(file: &File) -> std::io::Result<()> {
    // SAFETY: a plain system call on a descriptor `file` keeps open for the call; it takes
    // no pointers.
    let r = unsafe { libc::sync_file_range(file.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// A thread that starts the writeback of a file's dirty pages every [`PUSH_EVERY`] until
/// dropped (which starts it once more, then joins the thread).
#[derive(Debug)]
pub struct Pusher {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Pusher {
    /// Starts pushing `file`'s dirty pages to the disk.
    pub fn start(file: Arc<File>) -> std::io::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::Builder::new().name("river-spare-push".into()).spawn(move || loop {
            let last = stopped.load(Ordering::Acquire);
            if let Err(e) = start_writeback(&file) {
                // Only a hint to the kernel: its flusher writes the pages back anyway.
                tracing::debug!(error = %e, "cannot start the writeback of the output's spare bytes");
                return;
            }
            if last {
                return;
            }
            std::thread::sleep(PUSH_EVERY);
        })?;
        Ok(Pusher { stop, thread: Some(thread) })
    }
}

impl Drop for Pusher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    #[test]
    fn pushed_pages_are_written_back() {
        let dir = tempfile::tempdir().unwrap();
        let file = Arc::new(
            File::options().create(true).truncate(true).read(true).write(true).open(dir.path().join("f")).unwrap(),
        );
        let pusher = Pusher::start(file.clone()).unwrap();
        file.write_all_at(&[5u8; 1 << 20], 4096).unwrap();
        drop(pusher);
        let mut back = vec![0u8; 1 << 20];
        file.read_exact_at(&mut back, 4096).unwrap();
        assert!(back.iter().all(|&b| b == 5));
        start_writeback(&file).unwrap();
    }
}
