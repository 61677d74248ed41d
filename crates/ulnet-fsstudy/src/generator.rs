//! A workload whose figures are known: it performs a planned mix of file operations in a
//! directory (in the tests, through the tracing mount) and counts what it did — opens,
//! bytes, new and deleted files, the pattern of every open that moved data — and times
//! the lifetimes and open durations it planned. A study of its trace must find the same.
//!
//! Every step uses plain `std::fs` calls, one request each as far as the kernel goes:
//! reads and writes of at most [`CHUNK`] bytes, so none is split.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::time::{Duration, Instant};

/// Bytes per read or write request.
pub const CHUNK: usize = 64 << 10;

/// What to do. Sizes are in bytes (more than 0: an empty file moves no data); each entry
/// is one file.
#[derive(Clone, Debug, Default)]
pub struct Plan {
    /// Files written whole, then read whole.
    pub whole_files: Vec<u64>,
    /// Files (written whole) of which the middle half is read sequentially.
    pub partial_reads: Vec<u64>,
    /// Files (written whole) read in an order that jumps back.
    pub random_reads: Vec<u64>,
    /// Files created, written, and deleted this long after their create.
    pub deleted_after: Vec<Duration>,
    /// Files created, written, and overwritten by a truncating open this long after.
    pub overwritten_after: Vec<Duration>,
    /// Files opened (read-only, no data moved) and held open this long.
    pub held_open: Vec<Duration>,
    /// Opens of names that do not exist.
    pub missing_opens: u32,
}

/// What the workload did, as it counted and timed it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Done {
    /// Opens and creates that succeeded.
    pub opens: u64,
    /// Bytes read.
    pub bytes_read: u64,
    /// Bytes written.
    pub bytes_written: u64,
    /// New files created.
    pub files_created: u64,
    /// Files deleted.
    pub files_deleted: u64,
    /// Opens that moved data over whole files sequentially.
    pub whole_file: u64,
    /// Opens that moved data sequentially over part of a file.
    pub sequential: u64,
    /// Opens that moved data out of sequence.
    pub random: u64,
    /// Lifetimes of deleted files, as timed here (create call to unlink call).
    pub deleted_lifetimes: Vec<Duration>,
    /// Lifetimes of overwritten files (create call to truncating open).
    pub overwritten_lifetimes: Vec<Duration>,
    /// Durations of the held opens (open call to close).
    pub held_durations: Vec<Duration>,
}

fn content(len: u64, seed: u64) -> Vec<u8> {
    (0..len).map(|i| (i.wrapping_mul(31).wrapping_add(seed) % 251) as u8).collect()
}

impl Done {
    /// Creates `path` and writes `len` bytes in chunks: one create, one whole-file write.
    fn write_whole(&mut self, path: &Path, len: u64) -> std::io::Result<()> {
        let mut f = OpenOptions::new().write(true).create_new(true).open(path)?;
        self.opens += 1;
        self.files_created += 1;
        for chunk in content(len, len).chunks(CHUNK) {
            f.write_all(chunk)?;
        }
        self.bytes_written += len;
        self.whole_file += 1;
        Ok(())
    }

    /// Reads `path` to its end in chunks.
    fn read_whole(&mut self, path: &Path) -> std::io::Result<()> {
        let mut f = File::open(path)?;
        self.opens += 1;
        let mut buf = vec![0u8; CHUNK];
        loop {
            let n = f.read(&mut buf)?;
            if n == 0 {
                break;
            }
            self.bytes_read += n as u64;
        }
        self.whole_file += 1;
        Ok(())
    }

    /// Reads the middle half of `path` (`len` bytes) sequentially.
    fn read_middle(&mut self, path: &Path, len: u64) -> std::io::Result<()> {
        let mut f = File::open(path)?;
        self.opens += 1;
        f.seek(SeekFrom::Start(len / 4))?;
        let mut left = len / 2;
        let mut buf = vec![0u8; CHUNK];
        while left > 0 {
            let want = left.min(CHUNK as u64) as usize;
            f.read_exact(&mut buf[..want])?;
            (self.bytes_read, left) = (self.bytes_read + want as u64, left - want as u64);
        }
        self.sequential += 1;
        Ok(())
    }

    /// Reads `path` (`len` bytes) in chunks: the second half first, then the first.
    fn read_jumping(&mut self, path: &Path, len: u64) -> std::io::Result<()> {
        let mut f = File::open(path)?;
        self.opens += 1;
        let mut buf = vec![0u8; CHUNK];
        for start in [len / 2, 0] {
            f.seek(SeekFrom::Start(start))?;
            let want = (len / 2).min(CHUNK as u64) as usize;
            f.read_exact(&mut buf[..want])?;
            self.bytes_read += want as u64;
        }
        self.random += 1;
        Ok(())
    }
}

/// Performs `plan` in `dir` and returns what it did.
pub fn run(dir: &Path, plan: &Plan) -> std::io::Result<Done> {
    let sizes = plan.whole_files.iter().chain(&plan.partial_reads).chain(&plan.random_reads);
    if sizes.clone().any(|&len| len == 0) {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, "planned file sizes must be above 0"));
    }
    let mut done = Done::default();
    for (i, &len) in plan.whole_files.iter().enumerate() {
        let path = dir.join(format!("whole-{i}.dat"));
        done.write_whole(&path, len)?;
        done.read_whole(&path)?;
    }
    for (i, &len) in plan.partial_reads.iter().enumerate() {
        let path = dir.join(format!("partial-{i}.dat"));
        done.write_whole(&path, len)?;
        done.read_middle(&path, len)?;
    }
    for (i, &len) in plan.random_reads.iter().enumerate() {
        let path = dir.join(format!("random-{i}.dat"));
        done.write_whole(&path, len)?;
        done.read_jumping(&path, len)?;
    }
    for (i, &after) in plan.deleted_after.iter().enumerate() {
        let path = dir.join(format!("temp-{i}.tmp"));
        let born = Instant::now();
        done.write_whole(&path, 100)?;
        sleep_until(born + after);
        done.deleted_lifetimes.push(born.elapsed());
        std::fs::remove_file(&path)?;
        done.files_deleted += 1;
    }
    for (i, &after) in plan.overwritten_after.iter().enumerate() {
        let path = dir.join(format!("over-{i}.out"));
        let born = Instant::now();
        done.write_whole(&path, 200)?;
        sleep_until(born + after);
        done.overwritten_lifetimes.push(born.elapsed());
        let mut f = OpenOptions::new().write(true).truncate(true).open(&path)?;
        done.opens += 1;
        f.write_all(b"again")?;
        done.bytes_written += 5;
        done.whole_file += 1;
    }
    for (i, &hold) in plan.held_open.iter().enumerate() {
        let path = dir.join(format!("held-{i}.cfg"));
        done.write_whole(&path, 10)?;
        let opened = Instant::now();
        let f = File::open(&path)?;
        done.opens += 1;
        sleep_until(opened + hold);
        done.held_durations.push(opened.elapsed());
        drop(f);
    }
    for i in 0..plan.missing_opens {
        let missing = File::open(dir.join(format!("missing-{i}")));
        assert!(missing.is_err(), "a planned missing file exists");
    }
    Ok(done)
}

fn sleep_until(t: Instant) {
    let now = Instant::now();
    if t > now {
        std::thread::sleep(t - now);
    }
}
