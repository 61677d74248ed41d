//! The backing file system's calls as the pass-through makes them, and the conversions
//! between its answers and FUSE's.

use crate::format::NodeKind;
use fuser::{Errno, FileAttr, FileType, INodeNo};
use rustix::fs::{AtFlags, Mode, OFlags, Stat};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The FUSE error for a failed call.
pub fn errno(e: rustix::io::Errno) -> Errno {
    Errno::from_i32(e.raw_os_error())
}

/// The attributes of the file `fd` holds (an `O_PATH` descriptor works).
pub fn stat_fd(fd: BorrowedFd<'_>) -> rustix::io::Result<Stat> {
    rustix::fs::statat(fd, c"", AtFlags::EMPTY_PATH | AtFlags::SYMLINK_NOFOLLOW)
}

/// The (device, inode number) of a backing file.
pub fn key(st: &Stat) -> (u64, u64) {
    (st.st_dev, st.st_ino)
}

/// What a mode says the file is.
pub fn node_kind(mode: u32) -> NodeKind {
    match mode & libc::S_IFMT {
        libc::S_IFREG => NodeKind::File,
        libc::S_IFDIR => NodeKind::Dir,
        libc::S_IFLNK => NodeKind::Symlink,
        _ => NodeKind::Other,
    }
}

/// FUSE's file type of a mode.
pub fn file_type(mode: u32) -> FileType {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => FileType::Directory,
        libc::S_IFLNK => FileType::Symlink,
        libc::S_IFIFO => FileType::NamedPipe,
        libc::S_IFCHR => FileType::CharDevice,
        libc::S_IFBLK => FileType::BlockDevice,
        libc::S_IFSOCK => FileType::Socket,
        _ => FileType::RegularFile,
    }
}

fn time(secs: i64, nsecs: i64) -> SystemTime {
    let nanos = Duration::from_nanos(nsecs.clamp(0, 999_999_999) as u64);
    if secs >= 0 {
        UNIX_EPOCH + Duration::from_secs(secs as u64) + nanos
    } else {
        UNIX_EPOCH - Duration::from_secs(secs.unsigned_abs()) + nanos
    }
}

/// FUSE's attributes of a backing file, under the mount's id `id` (the only field that is
/// not the backing file's: the inode number, which the mount numbers itself).
pub fn attr(id: u64, st: &Stat) -> FileAttr {
    FileAttr {
        ino: INodeNo(id),
        size: st.st_size as u64,
        blocks: st.st_blocks as u64,
        atime: time(st.st_atime as i64, st.st_atime_nsec as i64),
        mtime: time(st.st_mtime as i64, st.st_mtime_nsec as i64),
        ctime: time(st.st_ctime as i64, st.st_ctime_nsec as i64),
        crtime: UNIX_EPOCH,
        kind: file_type(st.st_mode),
        perm: (st.st_mode & 0o7777) as u16,
        nlink: st.st_nlink as u32,
        uid: st.st_uid,
        gid: st.st_gid,
        rdev: st.st_rdev as u32,
        blksize: st.st_blksize as u32,
        flags: 0,
    }
}

/// A user id to change an owner to; `None` for -1 ("leave it").
pub fn uid(raw: u32) -> Option<rustix::fs::Uid> {
    // SAFETY: `Uid::from_raw` asks for an id other than -1, which is checked here.
    (raw != u32::MAX).then(|| unsafe { rustix::fs::Uid::from_raw(raw) })
}

/// A group id to change a group to; `None` for -1 ("leave it").
pub fn gid(raw: u32) -> Option<rustix::fs::Gid> {
    // SAFETY: `Gid::from_raw` asks for an id other than -1, which is checked here.
    (raw != u32::MAX).then(|| unsafe { rustix::fs::Gid::from_raw(raw) })
}

/// The `/proc` path that reaches the file an `O_PATH` descriptor holds, for the calls that
/// take no descriptor of that kind (chmod, truncate, utimes, xattrs, reopening).
pub fn proc_path(fd: BorrowedFd<'_>) -> String {
    format!("/proc/self/fd/{}", fd.as_raw_fd())
}

/// Opens the file an `O_PATH` descriptor holds with `flags` (those of an open(2) that the
/// kernel passed on; `O_CREAT`, `O_EXCL`, `O_NOCTTY` never reach a FUSE open).
pub fn reopen(fd: BorrowedFd<'_>, flags: i32) -> rustix::io::Result<OwnedFd> {
    let flags = OFlags::from_bits_retain(flags as u32) & !(OFlags::NOFOLLOW | OFlags::CREATE | OFlags::EXCL);
    rustix::fs::open(proc_path(fd), flags | OFlags::CLOEXEC, Mode::empty())
}

/// Opens `name` in the directory `dir` as an `O_PATH` descriptor, without following a
/// final symbolic link.
pub fn open_path(dir: BorrowedFd<'_>, name: &std::ffi::OsStr) -> rustix::io::Result<OwnedFd> {
    rustix::fs::openat(dir, name, OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty())
}

/// Reads up to `buf.len()` bytes at `offset`, until the end of the file.
pub fn pread_full(fd: impl AsFd, buf: &mut [u8], offset: u64) -> rustix::io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match rustix::io::pread(fd.as_fd(), &mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) if done == 0 => return Err(e),
            Err(_) => break,
        }
    }
    Ok(done)
}

/// Writes all of `data` at `offset` (or as much as goes before an error).
pub fn pwrite_full(fd: impl AsFd, data: &[u8], offset: u64) -> rustix::io::Result<usize> {
    let mut done = 0;
    while done < data.len() {
        match rustix::io::pwrite(fd.as_fd(), &data[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) if done == 0 => return Err(e),
            Err(_) => break,
        }
    }
    Ok(done)
}
