//! The tracing pass-through file system: every FUSE request is served by the same call on
//! the backing file (data, metadata and errors passed through as the backing file system
//! gives them) and recorded as one [`Op`], timed from when the request reached the
//! pass-through to when its reply was ready.
//!
//! Each handler reads as its steps: begin (the time, the caller), serve (a function that
//! returns the reply's contents or an errno), reply, record. Recording hands the op to
//! the [`RecordSink`] and never waits.

use super::handles::{Handles, Listed, OpenDir, OpenFile};
use super::inodes::{Inodes, ROOT_ID};
use super::sys::{self, errno};
use crate::format::{Name, Op, OpKind, Process, Record};
use crate::recorder::RecordSink;
use fuser::{
    AccessFlags, Errno, FileAttr, FileHandle, FopenFlags, Generation, INodeNo, InitFlags, KernelConfig, LockOwner,
    OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyLseek,
    ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use rustix::fs::{AtFlags, Mode, OFlags, Timespec, Timestamps, CWD};
use std::cell::RefCell;
use std::collections::HashSet;
use std::ffi::OsStr;
use std::os::fd::AsFd;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How the pass-through serves files.
#[derive(Clone, Debug)]
pub struct FsOptions {
    /// How long the kernel may keep names and attributes without asking again. Zero (the
    /// default) makes every lookup and `stat` reach the pass-through and the trace; more
    /// makes metadata-heavy work faster and the trace miss the repeats.
    pub cache_ttl: Duration,
}

impl Default for FsOptions {
    fn default() -> Self {
        FsOptions { cache_ttl: Duration::ZERO }
    }
}

/// `Op::flags` bits of a setattr: which attributes were set.
pub mod setattr_bits {
    /// The mode.
    pub const MODE: u32 = 1;
    /// The owner.
    pub const UID: u32 = 2;
    /// The group.
    pub const GID: u32 = 4;
    /// The size (truncation).
    pub const SIZE: u32 = 8;
    /// The access time.
    pub const ATIME: u32 = 16;
    /// The modification time.
    pub const MTIME: u32 = 32;
}

/// The inode number readdir reports for an entry the kernel has not looked up
/// (`FUSE_UNKNOWN_INO`, as libfuse reports it).
const UNKNOWN_INO: u64 = 0xffff_ffff;

/// Largest read served: the kernel's largest FUSE request (256 pages).
const READ_MAX: usize = 1 << 20;

thread_local! {
    /// Each session thread's read buffer, sized once.
    static READ_BUF: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    /// This serving thread has its own umask of 0.
    static OWN_UMASK: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Gives the calling serving thread a umask of its own, 0: the kernel has already applied
/// the caller's umask to the modes of creates, and the process's umask (of the tracer,
/// and inherited by a traced command) must not apply again, nor change.
fn own_umask() {
    if OWN_UMASK.get() {
        return;
    }
    match rustix::thread::unshare(rustix::thread::UnshareFlags::FS) {
        Ok(()) => {
            rustix::process::umask(Mode::empty());
        }
        Err(e) => {
            tracing::warn!("serving thread keeps the process umask (unshare: {e}): created files may lose mode bits")
        }
    }
    OWN_UMASK.set(true);
}

/// The tracing pass-through over one directory.
pub struct Passthrough {
    inodes: Inodes,
    handles: Handles,
    sink: RecordSink,
    ttl: Duration,
    seen_pids: Mutex<HashSet<u32>>,
}

/// A request being served: when it arrived and who made it.
struct Begun {
    start_ns: u64,
    pid: u32,
}

type Served<T> = Result<T, Errno>;

fn result_of<T>(r: &Served<T>, ok: impl FnOnce(&T) -> i64) -> i64 {
    match r {
        Ok(v) => ok(v),
        Err(e) => -i64::from(e.code()),
    }
}

impl Passthrough {
    /// A pass-through over the directory `root` (held open, so the mount may cover it),
    /// recording into `sink`.
    pub fn new(root: &Path, sink: RecordSink, options: &FsOptions) -> std::io::Result<Self> {
        let fd = rustix::fs::open(root, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())?;
        let st = sys::stat_fd(fd.as_fd())?;
        sink.record(Record::Name(Name {
            file: ROOT_ID,
            parent: 0,
            kind: crate::format::NodeKind::Dir,
            path: String::new(),
        }));
        Ok(Passthrough {
            inodes: Inodes::new(fd, sys::key(&st)),
            handles: Handles::default(),
            sink,
            ttl: options.cache_ttl,
            seen_pids: Mutex::new(HashSet::new()),
        })
    }

    /// Files and directories open through the mount now.
    pub fn open_count(&self) -> usize {
        self.handles.open_count()
    }

    fn begin(&self, req: &Request) -> Begun {
        own_umask();
        let pid = req.pid();
        self.name_process(pid);
        Begun { start_ns: self.sink.now_ns(), pid }
    }

    /// Records `op` as served for `b`, its reply sent at `end_ns` (taken before replying:
    /// the next request of a program can arrive as soon as the reply is sent).
    fn record(&self, b: Begun, end: u64, kind: OpKind, op: Op) {
        self.sink.record(Record::Op(Op {
            kind: kind as u8,
            start_ns: b.start_ns,
            duration_ns: end.saturating_sub(b.start_ns),
            pid: b.pid,
            ..op
        }));
    }

    /// Names a process in the trace the first time it makes a request.
    fn name_process(&self, pid: u32) {
        if pid == 0 || !self.seen_pids.lock().unwrap_or_else(|e| e.into_inner()).insert(pid) {
            return;
        }
        let name = std::fs::read_to_string(format!("/proc/{pid}/comm")).map(|s| s.trim_end().to_string());
        self.sink.record(Record::Process(Process { pid, name: name.unwrap_or_else(|_| "?".into()) }));
    }

    fn inode(&self, id: INodeNo) -> Served<std::sync::Arc<super::inodes::Inode>> {
        self.inodes.get(id.0).ok_or(Errno::ESTALE)
    }

    /// Looks `name` up in `parent` and counts the kernel's reference to it.
    fn lookup_entry(&self, parent: u64, name: &OsStr) -> Served<FileAttr> {
        let dir = self.inodes.get(parent).ok_or(Errno::ESTALE)?;
        let fd = sys::open_path(dir.fd.as_fd(), name).map_err(errno)?;
        let st = sys::stat_fd(fd.as_fd()).map_err(errno)?;
        let kind = sys::node_kind(st.st_mode);
        let looked = self.inodes.add_lookup(sys::key(&st), kind, fd, parent, &name.to_string_lossy());
        if looked.new {
            self.sink.record(Record::Name(Name { file: looked.inode.id, parent, kind, path: looked.path }));
        }
        Ok(sys::attr(looked.inode.id, &st))
    }

    fn reply_entry(&self, reply: ReplyEntry, r: &Served<FileAttr>) {
        match r {
            Ok(attr) => reply.entry(&self.ttl, attr, Generation(0)),
            Err(e) => reply.error(*e),
        }
    }

    /// The id the kernel knows `name` in `parent` by, and its link count, before a call
    /// that removes or replaces it.
    fn existing(&self, parent: u64, name: &OsStr) -> Option<(u64, (u64, u64), u64, bool)> {
        let dir = self.inodes.get(parent)?;
        let st = rustix::fs::statat(dir.fd.as_fd(), name, AtFlags::SYMLINK_NOFOLLOW).ok()?;
        let key = sys::key(&st);
        let is_dir = st.st_mode & libc::S_IFMT == libc::S_IFDIR;
        Some((self.inodes.id_of(key).unwrap_or(0), key, st.st_nlink, is_dir))
    }

    fn getattr_of(&self, ino: INodeNo) -> Served<FileAttr> {
        let inode = self.inode(ino)?;
        let st = sys::stat_fd(inode.fd.as_fd()).map_err(errno)?;
        Ok(sys::attr(inode.id, &st))
    }

    #[allow(clippy::too_many_arguments)]
    fn setattr_of(
        &self,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        fh: Option<FileHandle>,
    ) -> Served<FileAttr> {
        let inode = self.inode(ino)?;
        let path = sys::proc_path(inode.fd.as_fd());
        if let Some(mode) = mode {
            rustix::fs::chmodat(CWD, &path, Mode::from_raw_mode(mode & 0o7777), AtFlags::empty()).map_err(errno)?;
        }
        if uid.is_some() || gid.is_some() {
            let (u, g) = (uid.and_then(sys::uid), gid.and_then(sys::gid));
            rustix::fs::chownat(inode.fd.as_fd(), c"", u, g, AtFlags::EMPTY_PATH | AtFlags::SYMLINK_NOFOLLOW)
                .map_err(errno)?;
        }
        if let Some(size) = size {
            match fh.and_then(|h| self.handles.file(h.0)) {
                Some(open) => rustix::fs::ftruncate(&open.fd, size).map_err(errno)?,
                None => {
                    let fd = rustix::fs::open(&path, OFlags::WRONLY | OFlags::CLOEXEC, Mode::empty()).map_err(errno)?;
                    rustix::fs::ftruncate(&fd, size).map_err(errno)?;
                }
            }
        }
        if atime.is_some() || mtime.is_some() {
            let times = Timestamps { last_access: timespec(atime), last_modification: timespec(mtime) };
            rustix::fs::utimensat(CWD, &path, &times, AtFlags::empty()).map_err(errno)?;
        }
        let st = sys::stat_fd(inode.fd.as_fd()).map_err(errno)?;
        Ok(sys::attr(inode.id, &st))
    }

    fn open_of(&self, ino: INodeNo, flags: i32) -> Served<(u64, u64, u64)> {
        let inode = self.inode(ino)?;
        let fd = sys::reopen(inode.fd.as_fd(), flags).map_err(errno)?;
        let size = rustix::fs::fstat(&fd).map(|st| st.st_size as u64).unwrap_or(0);
        let h = self.handles.add_file(OpenFile { fd, file: inode.id, map: Default::default() });
        Ok((inode.id, h, size))
    }

    /// Creates `name` in `parent` (new: `true`) or opens it if it exists and `O_EXCL` was
    /// not asked for; returns (attributes, handle, new).
    fn create_of(&self, parent: u64, name: &OsStr, mode: u32, flags: i32) -> Served<(FileAttr, u64, bool)> {
        let dir = self.inodes.get(parent).ok_or(Errno::ESTALE)?;
        let asked = OFlags::from_bits_retain(flags as u32) & !OFlags::NOFOLLOW;
        let exclusive = asked | OFlags::CREATE | OFlags::EXCL | OFlags::CLOEXEC;
        let (fd, new) = match rustix::fs::openat(dir.fd.as_fd(), name, exclusive, Mode::from_raw_mode(mode)) {
            Ok(fd) => (fd, true),
            Err(rustix::io::Errno::EXIST) if !asked.contains(OFlags::EXCL) => {
                let existing = (asked & !OFlags::CREATE) | OFlags::CLOEXEC;
                (rustix::fs::openat(dir.fd.as_fd(), name, existing, Mode::empty()).map_err(errno)?, false)
            }
            Err(e) => return Err(errno(e)),
        };
        let attr = self.lookup_entry(parent, name)?;
        let h = self.handles.add_file(OpenFile { fd, file: attr.ino.0, map: Default::default() });
        Ok((attr, h, new))
    }

    /// Serves a read and replies; returns the bytes read and when the reply went.
    fn read_of(&self, fh: FileHandle, offset: u64, size: u32, reply: ReplyData) -> (Served<usize>, u64) {
        let Some(open) = self.handles.file(fh.0) else {
            let end = self.sink.now_ns();
            reply.error(Errno::EBADF);
            return (Err(Errno::EBADF), end);
        };
        let want = (size as usize).min(READ_MAX);
        if let Ok(st) = rustix::fs::fstat(&open.fd) {
            let file_size = st.st_size as u64;
            let stop = offset.saturating_add(want as u64).min(file_size);
            let map = (offset < file_size).then(|| open.map.covering(&open.fd, stop, file_size, want)).flatten();
            if offset >= file_size || map.is_some() {
                let data = map.as_deref().map_or(&[][..], |m| &m[offset as usize..stop as usize]);
                let end = self.sink.now_ns();
                reply.data(data);
                return (Ok(data.len()), end);
            }
        }
        READ_BUF.with_borrow_mut(|buf| {
            if buf.len() < want {
                buf.resize(want, 0);
            }
            let r = sys::pread_full(&open.fd, &mut buf[..want], offset).map_err(errno);
            let end = self.sink.now_ns();
            match &r {
                Ok(n) => reply.data(&buf[..*n]),
                Err(e) => reply.error(*e),
            }
            (r, end)
        })
    }

    fn readdir_of(&self, fh: FileHandle, offset: u64, reply: &mut ReplyDirectory) -> Served<(u64, i64)> {
        let dir = self.handles.dir(fh.0).ok_or(Errno::EBADF)?;
        let mut entries = dir.entries.lock().unwrap_or_else(|e| e.into_inner());
        if offset == 0 || entries.is_none() {
            *entries = Some(self.list(&dir)?);
        }
        let listed = entries.as_deref().unwrap_or(&[]);
        let mut added = 0;
        for (i, e) in listed.iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(e.ino), i as u64 + 1, e.kind, &e.name) {
                break;
            }
            added += 1;
        }
        Ok((dir.file, added))
    }

    /// The entries of an open directory, as the backing file system lists them.
    fn list(&self, dir: &OpenDir) -> Served<Vec<Listed>> {
        let dir_dev = rustix::fs::fstat(&dir.fd).map_err(errno)?.st_dev;
        let mut reader = rustix::fs::Dir::read_from(&dir.fd).map_err(errno)?;
        let mut out = Vec::new();
        while let Some(entry) = reader.read() {
            let entry = entry.map_err(errno)?;
            let name = <OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(entry.file_name().to_bytes());
            let ino = self.inodes.id_of((dir_dev, entry.ino())).unwrap_or(UNKNOWN_INO);
            let kind = match entry.file_type() {
                rustix::fs::FileType::Unknown => {
                    rustix::fs::statat(&dir.fd, entry.file_name(), AtFlags::SYMLINK_NOFOLLOW)
                        .map(|st| sys::file_type(st.st_mode))
                        .unwrap_or(fuser::FileType::RegularFile)
                }
                t => sys::file_type(t.as_raw_mode()),
            };
            out.push(Listed { ino, kind, name: name.to_os_string() });
        }
        Ok(out)
    }

    /// The path xattr calls use; symbolic links have no extended attributes here.
    fn xattr_path(&self, ino: INodeNo) -> Served<(u64, String)> {
        let inode = self.inode(ino)?;
        if inode.kind == crate::format::NodeKind::Symlink {
            return Err(Errno::ENOTSUP);
        }
        Ok((inode.id, sys::proc_path(inode.fd.as_fd())))
    }
}

fn timespec(t: Option<TimeOrNow>) -> Timespec {
    match t {
        None => Timespec { tv_sec: 0, tv_nsec: rustix::fs::UTIME_OMIT },
        Some(TimeOrNow::Now) => Timespec { tv_sec: 0, tv_nsec: rustix::fs::UTIME_NOW },
        Some(TimeOrNow::SpecificTime(t)) => system_timespec(t),
    }
}

fn system_timespec(t: SystemTime) -> Timespec {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => Timespec { tv_sec: d.as_secs() as i64, tv_nsec: d.subsec_nanos().into() },
        Err(e) => {
            let d = e.duration();
            let (secs, nanos) = (d.as_secs() as i64, i64::from(d.subsec_nanos()));
            if nanos == 0 {
                Timespec { tv_sec: -secs, tv_nsec: 0 }
            } else {
                Timespec { tv_sec: -secs - 1, tv_nsec: 1_000_000_000 - nanos }
            }
        }
    }
}

fn empty(reply: ReplyEmpty, r: &Served<impl Sized>) {
    match r {
        Ok(_) => reply.ok(),
        Err(e) => reply.error(*e),
    }
}

impl fuser::Filesystem for Passthrough {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // Truncating opens arrive as one open with O_TRUNC (not a setattr and an open);
        // a large direct read is split into requests served in parallel; shared mappings
        // of direct-I/O files work; lookups in one directory run in parallel.
        let wanted = InitFlags::FUSE_ATOMIC_O_TRUNC
            | InitFlags::FUSE_ASYNC_DIO
            | InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP
            | InitFlags::FUSE_PARALLEL_DIROPS;
        let _ = config.add_capabilities(wanted & config.capabilities());
        let _ = config.set_max_write(READ_MAX as u32);
        let _ = config.set_max_readahead(READ_MAX as u32).or_else(|max| config.set_max_readahead(max));
        let _ = config.set_max_background(64);
        Ok(())
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let b = self.begin(req);
        let r = self.lookup_entry(parent.0, name);
        let end = self.sink.now_ns();
        self.reply_entry(reply, &r);
        let file = r.as_ref().map_or(0, |a| a.ino.0);
        self.record(
            b,
            end,
            OpKind::Lookup,
            Op { file, other: parent.0, result: result_of(&r, |_| 1), ..Op::default() },
        );
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.inodes.forget(ino.0, nlookup);
    }

    fn getattr(&self, req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        let b = self.begin(req);
        let r = self.getattr_of(ino);
        let end = self.sink.now_ns();
        match &r {
            Ok(attr) => reply.attr(&self.ttl, attr),
            Err(e) => reply.error(*e),
        }
        let op = Op {
            file: ino.0,
            handle: fh.map_or(0, |h| h.0),
            file_size: r.as_ref().map_or(0, |a| a.size),
            result: result_of(&r, |_| 0),
            ..Op::default()
        };
        self.record(b, end, OpKind::Getattr, op);
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        use setattr_bits::*;
        let b = self.begin(req);
        let r = self.setattr_of(ino, mode, uid, gid, size, atime, mtime, fh);
        let end = self.sink.now_ns();
        match &r {
            Ok(attr) => reply.attr(&self.ttl, attr),
            Err(e) => reply.error(*e),
        }
        let bits = [(mode.is_some(), MODE), (uid.is_some(), UID), (gid.is_some(), GID), (size.is_some(), SIZE)]
            .into_iter()
            .chain([(atime.is_some(), ATIME), (mtime.is_some(), MTIME)])
            .filter(|(set, _)| *set)
            .fold(0, |acc, (_, bit)| acc | bit);
        let op = Op {
            file: ino.0,
            handle: fh.map_or(0, |h| h.0),
            size: size.unwrap_or(0),
            flags: bits,
            file_size: r.as_ref().map_or(0, |a| a.size),
            result: result_of(&r, |_| 0),
            ..Op::default()
        };
        self.record(b, end, OpKind::Setattr, op);
    }

    fn readlink(&self, req: &Request, ino: INodeNo, reply: ReplyData) {
        let b = self.begin(req);
        let r =
            self.inode(ino).and_then(|inode| rustix::fs::readlinkat(inode.fd.as_fd(), c"", Vec::new()).map_err(errno));
        let end = self.sink.now_ns();
        match &r {
            Ok(target) => reply.data(target.as_bytes()),
            Err(e) => reply.error(*e),
        }
        let result = result_of(&r, |t| t.as_bytes().len() as i64);
        self.record(b, end, OpKind::Readlink, Op { file: ino.0, result, ..Op::default() });
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let b = self.begin(req);
        let r = self.inode(parent).and_then(|dir| {
            let (kind, perm) = (rustix::fs::FileType::from_raw_mode(mode), Mode::from_raw_mode(mode & 0o7777));
            rustix::fs::mknodat(dir.fd.as_fd(), name, kind, perm, u64::from(rdev)).map_err(errno)?;
            self.lookup_entry(parent.0, name)
        });
        let end = self.sink.now_ns();
        self.reply_entry(reply, &r);
        let file = r.as_ref().map_or(0, |a| a.ino.0);
        self.record(b, end, OpKind::Mknod, Op { file, other: parent.0, result: result_of(&r, |_| 1), ..Op::default() });
    }

    fn mkdir(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, _umask: u32, reply: ReplyEntry) {
        let b = self.begin(req);
        let r = self.inode(parent).and_then(|dir| {
            rustix::fs::mkdirat(dir.fd.as_fd(), name, Mode::from_raw_mode(mode & 0o7777)).map_err(errno)?;
            self.lookup_entry(parent.0, name)
        });
        let end = self.sink.now_ns();
        self.reply_entry(reply, &r);
        let file = r.as_ref().map_or(0, |a| a.ino.0);
        self.record(b, end, OpKind::Mkdir, Op { file, other: parent.0, result: result_of(&r, |_| 1), ..Op::default() });
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let b = self.begin(req);
        let r = self.remove(parent.0, name, AtFlags::empty());
        let end = self.sink.now_ns();
        empty(reply, &r);
        let other = r.as_ref().map_or(0, |id| *id);
        self.record(
            b,
            end,
            OpKind::Unlink,
            Op { file: parent.0, other, result: result_of(&r, |_| 0), ..Op::default() },
        );
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let b = self.begin(req);
        let r = self.remove(parent.0, name, AtFlags::REMOVEDIR);
        let end = self.sink.now_ns();
        empty(reply, &r);
        let other = r.as_ref().map_or(0, |id| *id);
        self.record(b, end, OpKind::Rmdir, Op { file: parent.0, other, result: result_of(&r, |_| 0), ..Op::default() });
    }

    fn symlink(&self, req: &Request, parent: INodeNo, link_name: &OsStr, target: &Path, reply: ReplyEntry) {
        let b = self.begin(req);
        let r = self.inode(parent).and_then(|dir| {
            rustix::fs::symlinkat(target, dir.fd.as_fd(), link_name).map_err(errno)?;
            self.lookup_entry(parent.0, link_name)
        });
        let end = self.sink.now_ns();
        self.reply_entry(reply, &r);
        let file = r.as_ref().map_or(0, |a| a.ino.0);
        self.record(
            b,
            end,
            OpKind::Symlink,
            Op { file, other: parent.0, result: result_of(&r, |_| 1), ..Op::default() },
        );
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let b = self.begin(req);
        let r = self.rename_of((parent.0, name), (newparent.0, newname), flags);
        let end = self.sink.now_ns();
        empty(reply, &r);
        let (file, other) = r.as_ref().copied().unwrap_or((0, 0));
        let op = Op { file, other, flags: flags.bits(), result: result_of(&r, |_| 0), ..Op::default() };
        self.record(b, end, OpKind::Rename, op);
    }

    fn link(&self, req: &Request, ino: INodeNo, newparent: INodeNo, newname: &OsStr, reply: ReplyEntry) {
        let b = self.begin(req);
        let r = self.inode(ino).and_then(|inode| {
            let dir = self.inode(newparent)?;
            rustix::fs::linkat(inode.fd.as_fd(), c"", dir.fd.as_fd(), newname, AtFlags::EMPTY_PATH).map_err(errno)?;
            self.lookup_entry(newparent.0, newname)
        });
        let end = self.sink.now_ns();
        self.reply_entry(reply, &r);
        self.record(
            b,
            end,
            OpKind::Link,
            Op { file: ino.0, other: newparent.0, result: result_of(&r, |_| 1), ..Op::default() },
        );
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let b = self.begin(req);
        let r = self.open_of(ino, flags.0);
        let end = self.sink.now_ns();
        match &r {
            Ok((_, h, _)) => reply.opened(FileHandle(*h), FopenFlags::FOPEN_DIRECT_IO),
            Err(e) => reply.error(*e),
        }
        let (handle, file_size) = r.as_ref().map_or((0, 0), |(_, h, s)| (*h, *s));
        let op =
            Op { file: ino.0, handle, file_size, flags: flags.0 as u32, result: result_of(&r, |_| 0), ..Op::default() };
        self.record(b, end, OpKind::Open, op);
    }

    fn read(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let b = self.begin(req);
        let (r, end) = self.read_of(fh, offset, size, reply);
        let op = Op {
            file: ino.0,
            handle: fh.0,
            offset,
            size: u64::from(size),
            result: result_of(&r, |n| *n as i64),
            ..Op::default()
        };
        self.record(b, end, OpKind::Read, op);
    }

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let b = self.begin(req);
        let r = self
            .handles
            .file(fh.0)
            .ok_or(Errno::EBADF)
            .and_then(|open| sys::pwrite_full(&open.fd, data, offset).map_err(errno));
        let end = self.sink.now_ns();
        match &r {
            Ok(n) => reply.written(*n as u32),
            Err(e) => reply.error(*e),
        }
        let op = Op {
            file: ino.0,
            handle: fh.0,
            offset,
            size: data.len() as u64,
            result: result_of(&r, |n| *n as i64),
            ..Op::default()
        };
        self.record(b, end, OpKind::Write, op);
    }

    fn flush(&self, req: &Request, ino: INodeNo, fh: FileHandle, _lock_owner: LockOwner, reply: ReplyEmpty) {
        let b = self.begin(req);
        // A local backing file has nothing to report at close: flush succeeds when the
        // handle is open.
        let r = self.handles.file(fh.0).map(|_| ()).ok_or(Errno::EBADF);
        let end = self.sink.now_ns();
        empty(reply, &r);
        self.record(
            b,
            end,
            OpKind::Flush,
            Op { file: ino.0, handle: fh.0, result: result_of(&r, |_| 0), ..Op::default() },
        );
    }

    fn release(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let b = self.begin(req);
        let r = self.handles.remove_file(fh.0).ok_or(Errno::EBADF);
        let file_size =
            r.as_ref().ok().and_then(|open| rustix::fs::fstat(&open.fd).ok()).map_or(0, |st| st.st_size as u64);
        let end = self.sink.now_ns();
        empty(reply, &r);
        let op = Op { file: ino.0, handle: fh.0, file_size, result: result_of(&r, |_| 0), ..Op::default() };
        self.record(b, end, OpKind::Release, op);
    }

    fn fsync(&self, req: &Request, ino: INodeNo, fh: FileHandle, datasync: bool, reply: ReplyEmpty) {
        let b = self.begin(req);
        let r = self.handles.file(fh.0).ok_or(Errno::EBADF).and_then(|open| {
            if datasync {
                rustix::fs::fdatasync(&open.fd).map_err(errno)
            } else {
                rustix::fs::fsync(&open.fd).map_err(errno)
            }
        });
        let end = self.sink.now_ns();
        empty(reply, &r);
        let op =
            Op { file: ino.0, handle: fh.0, flags: u32::from(datasync), result: result_of(&r, |_| 0), ..Op::default() };
        self.record(b, end, OpKind::Fsync, op);
    }

    fn opendir(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let b = self.begin(req);
        let r = self.inode(ino).and_then(|inode| {
            let how = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
            let fd = rustix::fs::openat(inode.fd.as_fd(), c".", how, Mode::empty()).map_err(errno)?;
            Ok(self.handles.add_dir(OpenDir { fd, file: inode.id, entries: Mutex::new(None) }))
        });
        let end = self.sink.now_ns();
        match &r {
            Ok(h) => reply.opened(FileHandle(*h), FopenFlags::empty()),
            Err(e) => reply.error(*e),
        }
        let handle = r.as_ref().map_or(0, |h| *h);
        let op = Op { file: ino.0, handle, flags: flags.0 as u32, result: result_of(&r, |_| 0), ..Op::default() };
        self.record(b, end, OpKind::Opendir, op);
    }

    fn readdir(&self, req: &Request, ino: INodeNo, fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let b = self.begin(req);
        let r = self.readdir_of(fh, offset, &mut reply);
        let end = self.sink.now_ns();
        match &r {
            Ok(_) => reply.ok(),
            Err(e) => reply.error(*e),
        }
        let op = Op { file: ino.0, handle: fh.0, offset, result: result_of(&r, |(_, n)| *n), ..Op::default() };
        self.record(b, end, OpKind::Readdir, op);
    }

    fn releasedir(&self, req: &Request, ino: INodeNo, fh: FileHandle, _flags: OpenFlags, reply: ReplyEmpty) {
        let b = self.begin(req);
        let r = self.handles.remove_dir(fh.0).map(|_| ()).ok_or(Errno::EBADF);
        let end = self.sink.now_ns();
        empty(reply, &r);
        self.record(
            b,
            end,
            OpKind::Releasedir,
            Op { file: ino.0, handle: fh.0, result: result_of(&r, |_| 0), ..Op::default() },
        );
    }

    fn fsyncdir(&self, req: &Request, ino: INodeNo, fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        let b = self.begin(req);
        let r = self.handles.dir(fh.0).ok_or(Errno::EBADF).and_then(|d| rustix::fs::fsync(&d.fd).map_err(errno));
        let end = self.sink.now_ns();
        empty(reply, &r);
        self.record(
            b,
            end,
            OpKind::Fsyncdir,
            Op { file: ino.0, handle: fh.0, result: result_of(&r, |_| 0), ..Op::default() },
        );
    }

    fn statfs(&self, req: &Request, ino: INodeNo, reply: ReplyStatfs) {
        let b = self.begin(req);
        let r = self.inode(ino).and_then(|inode| rustix::fs::fstatvfs(inode.fd.as_fd()).map_err(errno));
        let end = self.sink.now_ns();
        match &r {
            Ok(s) => reply.statfs(
                s.f_blocks,
                s.f_bfree,
                s.f_bavail,
                s.f_files,
                s.f_ffree,
                s.f_bsize as u32,
                s.f_namemax as u32,
                s.f_frsize as u32,
            ),
            Err(e) => reply.error(*e),
        }
        self.record(b, end, OpKind::Statfs, Op { file: ino.0, result: result_of(&r, |_| 0), ..Op::default() });
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let b = self.begin(req);
        let r = self.xattr_path(ino).and_then(|(_, path)| {
            let flags = rustix::fs::XattrFlags::from_bits_retain(flags as u32);
            rustix::fs::setxattr(path.as_str(), name, value, flags).map_err(errno)
        });
        let end = self.sink.now_ns();
        empty(reply, &r);
        let op = Op { file: ino.0, size: value.len() as u64, result: result_of(&r, |_| 0), ..Op::default() };
        self.record(b, end, OpKind::Setxattr, op);
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let b = self.begin(req);
        let r = self.xattr_path(ino).and_then(|(_, path)| {
            let mut buf = vec![0u8; size as usize];
            let n = rustix::fs::getxattr(path.as_str(), name, &mut buf).map_err(errno)?;
            buf.truncate(n);
            Ok(buf)
        });
        let end = self.sink.now_ns();
        reply_xattr(reply, size, &r);
        let op = Op { file: ino.0, size: u64::from(size), result: result_of(&r, |v| v.len() as i64), ..Op::default() };
        self.record(b, end, OpKind::Getxattr, op);
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let b = self.begin(req);
        let r = self.xattr_path(ino).and_then(|(_, path)| {
            let mut buf = vec![0u8; size as usize];
            let n = rustix::fs::listxattr(path.as_str(), &mut buf).map_err(errno)?;
            buf.truncate(n);
            Ok(buf)
        });
        let end = self.sink.now_ns();
        reply_xattr(reply, size, &r);
        let op = Op { file: ino.0, size: u64::from(size), result: result_of(&r, |v| v.len() as i64), ..Op::default() };
        self.record(b, end, OpKind::Listxattr, op);
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let b = self.begin(req);
        let r = self.xattr_path(ino).and_then(|(_, path)| rustix::fs::removexattr(path.as_str(), name).map_err(errno));
        let end = self.sink.now_ns();
        empty(reply, &r);
        self.record(b, end, OpKind::Removexattr, Op { file: ino.0, result: result_of(&r, |_| 0), ..Op::default() });
    }

    fn access(&self, req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        let b = self.begin(req);
        let r = self.inode(ino).and_then(|inode| {
            let access = rustix::fs::Access::from_bits_retain(mask.bits() as u32);
            rustix::fs::accessat(CWD, sys::proc_path(inode.fd.as_fd()), access, AtFlags::empty()).map_err(errno)
        });
        let end = self.sink.now_ns();
        empty(reply, &r);
        let op = Op { file: ino.0, flags: mask.bits() as u32, result: result_of(&r, |_| 0), ..Op::default() };
        self.record(b, end, OpKind::Access, op);
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let b = self.begin(req);
        let r = self.create_of(parent.0, name, mode, flags);
        let end = self.sink.now_ns();
        match &r {
            Ok((attr, h, _)) => {
                reply.created(&self.ttl, attr, Generation(0), FileHandle(*h), FopenFlags::FOPEN_DIRECT_IO)
            }
            Err(e) => reply.error(*e),
        }
        let (file, handle, file_size) = r.as_ref().map_or((0, 0, 0), |(a, h, _)| (a.ino.0, *h, a.size));
        let op = Op {
            file,
            handle,
            file_size,
            other: parent.0,
            flags: flags as u32,
            result: result_of(&r, |(_, _, new)| i64::from(*new)),
            ..Op::default()
        };
        self.record(b, end, OpKind::Create, op);
    }

    fn fallocate(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let b = self.begin(req);
        let r = self.handles.file(fh.0).ok_or(Errno::EBADF).and_then(|open| {
            let how = rustix::fs::FallocateFlags::from_bits_retain(mode as u32);
            rustix::fs::fallocate(&open.fd, how, offset, length).map_err(errno)
        });
        let end = self.sink.now_ns();
        empty(reply, &r);
        let op = Op {
            file: ino.0,
            handle: fh.0,
            offset,
            size: length,
            flags: mode as u32,
            result: result_of(&r, |_| 0),
            ..Op::default()
        };
        self.record(b, end, OpKind::Fallocate, op);
    }

    fn ioctl(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: fuser::IoctlFlags,
        cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: fuser::ReplyIoctl,
    ) {
        let b = self.begin(req);
        let r = self.ioctl_of();
        let end = self.sink.now_ns();
        match &r {
            Ok(()) => reply.ioctl(0, &[]),
            Err(e) => reply.error(*e),
        }
        let op = Op { file: ino.0, handle: fh.0, flags: cmd, result: result_of(&r, |_| 0), ..Op::default() };
        self.record(b, end, OpKind::Ioctl, op);
    }

    fn lseek(&self, req: &Request, ino: INodeNo, fh: FileHandle, offset: i64, whence: i32, reply: ReplyLseek) {
        let b = self.begin(req);
        let r = self.handles.file(fh.0).ok_or(Errno::EBADF).and_then(|open| {
            let to = match whence {
                libc::SEEK_DATA => rustix::fs::SeekFrom::Data(offset),
                libc::SEEK_HOLE => rustix::fs::SeekFrom::Hole(offset),
                _ => return Err(Errno::EINVAL),
            };
            rustix::fs::seek(&open.fd, to).map_err(errno)
        });
        let end = self.sink.now_ns();
        match &r {
            Ok(pos) => reply.offset(*pos as i64),
            Err(e) => reply.error(*e),
        }
        let op = Op {
            file: ino.0,
            handle: fh.0,
            offset: offset as u64,
            flags: whence as u32,
            result: result_of(&r, |p| *p as i64),
            ..Op::default()
        };
        self.record(b, end, OpKind::Lseek, op);
    }
}

impl Passthrough {
    /// Device control requests are answered as a regular file or directory answers the
    /// ones programs send most (a terminal test before buffering: `TCGETS`): not a device
    /// (ENOTTY). They are not passed on: their arguments are the caller's memory, in a
    /// layout each command defines.
    fn ioctl_of(&self) -> Served<()> {
        Err(Errno::from_i32(libc::ENOTTY))
    }
}

fn reply_xattr(reply: ReplyXattr, size: u32, r: &Served<Vec<u8>>) {
    match r {
        Ok(v) if size == 0 => reply.size(v.len() as u32),
        Ok(v) => reply.data(v),
        Err(e) => reply.error(*e),
    }
}

impl Passthrough {
    /// Removes `name` from `parent` (a file, or with `REMOVEDIR` a directory); returns the
    /// id the kernel knew it by (0: none).
    fn remove(&self, parent: u64, name: &OsStr, how: AtFlags) -> Served<u64> {
        let dir = self.inodes.get(parent).ok_or(Errno::ESTALE)?;
        let before = self.existing(parent, name);
        rustix::fs::unlinkat(dir.fd.as_fd(), name, how).map_err(errno)?;
        let Some((id, key, nlink, is_dir)) = before else { return Ok(0) };
        if nlink <= 1 || is_dir {
            self.inodes.unlinked(key);
        }
        Ok(id)
    }

    /// Renames; returns (the id of what moved, the id of what it replaced or 0).
    fn rename_of(
        &self,
        (parent, name): (u64, &OsStr),
        (newparent, newname): (u64, &OsStr),
        flags: RenameFlags,
    ) -> Served<(u64, u64)> {
        let (from, to) = (self.inode(INodeNo(parent))?, self.inode(INodeNo(newparent))?);
        let moved = self.existing(parent, name);
        let replaced = self.existing(newparent, newname);
        let how = rustix::fs::RenameFlags::from_bits_retain(flags.bits());
        rustix::fs::renameat_with(from.fd.as_fd(), name, to.fd.as_fd(), newname, how).map_err(errno)?;
        let moved_id = moved.map_or(0, |m| m.0);
        if moved_id != 0 {
            self.inodes.renamed(moved_id, newparent, &newname.to_string_lossy());
        }
        let exchange = flags.contains(RenameFlags::RENAME_EXCHANGE);
        let replaced_id = match replaced {
            Some((id, key, nlink, is_dir)) if !exchange => {
                if nlink <= 1 || is_dir {
                    self.inodes.unlinked(key);
                }
                id
            }
            _ => 0,
        };
        Ok((moved_id, replaced_id))
    }
}
