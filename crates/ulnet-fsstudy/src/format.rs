//! The file-system trace format: a header, then checksummed blocks of length-prefixed
//! records. One format holds both kinds of file the study writes: per-operation traces
//! (`ulnet fsstudy trace`) and content snapshots (`ulnet fsstudy snapshot`).
//!
//! All integers are little-endian. A file is written by one process.
//!
//! ```text
//!  file header (64 bytes)
//!  0  magic "ULFSTUDY"            8  version u16 (1)       10 min_reader u16 (1)
//!  12 header_len u16 (64)         14 block_header_len u16 (32)
//!  16 kind u16 (1 trace, 2 snapshot)                       18 reserved u16 (0)
//!  20 tracer_pid u32
//!  24 start_real_ns u64  (CLOCK_REALTIME when the file was started)
//!  32 start_mono_ns u64  (CLOCK_MONOTONIC at the same instant; record times count from it)
//!  40 reserved [u8; 20] (0)
//!  60 crc32c u32 of bytes 0..60
//!
//!  block (32-byte header, then record_count records in body_len bytes)
//!  0  magic "ULFB"    4 flags u16 (1: end block)    6 reserved u16 (0)
//!  8  sequence u32 (0, 1, 2, ... per file)         12 record_count u32
//!  16 body_len u32 (at most BLOCK_BODY_MAX)
//!  20 dropped_total u64 (records lost to a full ring so far)
//!  28 crc32c u32 of header bytes 0..28 and the body
//!
//!  record: tag u8, payload_len varint, payload (fields in this order, each a varint
//!  unless said otherwise; a string is a varint length, at most STRING_MAX, then UTF-8)
//!  tag 1 op       kind u8, start_ns (zigzag of the difference from the block's previous
//!                 op's start; the first against 0), duration_ns, pid, file, handle,
//!                 offset, size, zigzag(result), file_size, flags, other
//!  tag 2 name     file, parent, kind u8, path (relative to the traced root; "" is the root)
//!  tag 3 process  pid, name
//!  tag 4 entry    kind u8, depth, size, zigzag(modified_ns), zigzag(accessed_ns),
//!                 zigzag(changed_ns), zigzag(created_ns; 0: not known), files, dirs, path
//!  varints are LEB128 (7 bits a byte, low bits first, at most 10 bytes); zigzag(d) =
//!  (d << 1) ^ (d >> 63).
//! ```
//!
//! **Evolution.** The format is append-only: a later version may add record tags, append
//! fields to a record's payload, and lengthen the headers (their lengths are in the file
//! header). It raises `version` for that and keeps `min_reader`; a change that older
//! readers cannot skip over raises `min_reader`. A reader refuses a file whose
//! `min_reader` is above its own version, and reads a newer file as far as it knows it:
//! it skips records of unknown tags and ignores fields beyond the ones it knows, and says
//! so ([`crate::reader`]).
//!
//! **Times** are nanoseconds of CLOCK_MONOTONIC since the header's `start_mono_ns`, so
//! a trace needs no calibration; `start_real_ns` dates it.
//!
//! Versions: 1 — this layout.

use serde::Serialize;

/// The first bytes of every file.
pub const FILE_MAGIC: [u8; 8] = *b"ULFSTUDY";
/// The first bytes of every block.
pub const BLOCK_MAGIC: [u8; 4] = *b"ULFB";
/// The format version this build writes, and the newest it knows fully.
pub const VERSION: u16 = 1;
/// The oldest reader version that reads what this build writes.
pub const MIN_READER: u16 = 1;
/// Bytes of the file header.
pub const FILE_HEADER_LEN: usize = 64;
/// Bytes of a block header.
pub const BLOCK_HEADER_LEN: usize = 32;
/// Block flag: the last block of a complete file.
pub const BLOCK_FLAG_END: u16 = 1;
/// Most bytes of a block's body: 4 MiB. Writers close a block at [`BLOCK_BODY_TARGET`];
/// the bound lets a reader refuse a forged length before it allocates anything.
pub const BLOCK_BODY_MAX: usize = 4 << 20;
/// Writers close a block once its body reaches this: 64 KiB, about 2,000 operations, so a
/// crash loses at most that and a write is large enough to cost little per record.
pub const BLOCK_BODY_TARGET: usize = 64 << 10;
/// Longest string (path or process name) a record holds, in bytes; longer ones are cut
/// at a character boundary. Linux's PATH_MAX.
pub const STRING_MAX: usize = 4096;
/// Most bytes of a varint.
const VARINT_MAX: usize = 10;

const TAG_OP: u8 = 1;
const TAG_NAME: u8 = 2;
const TAG_PROCESS: u8 = 3;
const TAG_ENTRY: u8 = 4;

/// What a file holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
#[repr(u16)]
pub enum FileKind {
    /// Per-operation records of a traced directory.
    Trace = 1,
    /// A walk of a directory tree.
    Snapshot = 2,
}

/// The file header, decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct FileHeader {
    /// Format version of the writer.
    pub version: u16,
    /// Oldest reader version that can read the file.
    pub min_reader: u16,
    /// Bytes of the file header (64 in version 1).
    pub header_len: u16,
    /// Bytes of each block header (32 in version 1).
    pub block_header_len: u16,
    /// What the file holds.
    pub kind: FileKind,
    /// Process id of the writer.
    pub tracer_pid: u32,
    /// CLOCK_REALTIME at the start, in nanoseconds.
    pub start_real_ns: u64,
    /// CLOCK_MONOTONIC at the same instant, in nanoseconds.
    pub start_mono_ns: u64,
}

/// What the operation was. Discriminants are part of the format: never renumber, only
/// append.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
#[repr(u8)]
pub enum OpKind {
    /// A name looked up in a directory (every path component the kernel resolves).
    Lookup = 0,
    /// Attributes read (`stat`).
    Getattr = 1,
    /// Attributes changed (`chmod`, `chown`, `utimes`, `truncate`); `flags` has the
    /// FATTR bits, `size` the new size when it was set.
    Setattr = 2,
    /// A symbolic link read.
    Readlink = 3,
    /// A special file or fifo created.
    Mknod = 4,
    /// A directory created.
    Mkdir = 5,
    /// A name removed; `other` is the removed file.
    Unlink = 6,
    /// A directory removed; `other` is the removed directory.
    Rmdir = 7,
    /// A symbolic link created.
    Symlink = 8,
    /// A name moved: `file` is what moved, `other` the file it replaced (0: none).
    Rename = 9,
    /// A hard link made.
    Link = 10,
    /// A file opened; `flags` are the open flags, `file_size` the size at open.
    Open = 11,
    /// Data read: `offset`, `size` asked for, `result` bytes read.
    Read = 12,
    /// Data written: `offset`, `size` given, `result` bytes written.
    Write = 13,
    /// A descriptor closed (one per `close` of any duplicate).
    Flush = 14,
    /// The last reference to an open file went away; `file_size` is the size then.
    Release = 15,
    /// Data and metadata made durable.
    Fsync = 16,
    /// A directory opened for listing.
    Opendir = 17,
    /// Directory entries listed; `result` entries returned.
    Readdir = 18,
    /// A directory listing closed.
    Releasedir = 19,
    /// A directory made durable.
    Fsyncdir = 20,
    /// File-system statistics read.
    Statfs = 21,
    /// An extended attribute read.
    Getxattr = 22,
    /// An extended attribute set.
    Setxattr = 23,
    /// Extended attribute names listed.
    Listxattr = 24,
    /// An extended attribute removed.
    Removexattr = 25,
    /// Access permission tested.
    Access = 26,
    /// A file created and opened in one step (`open` with `O_CREAT`); `flags` are the
    /// open flags, `other` is the parent directory, `result` 1 when the file is new.
    Create = 27,
    /// Space allocated or punched.
    Fallocate = 28,
    /// A data or hole offset looked for (`SEEK_DATA`, `SEEK_HOLE`).
    Lseek = 29,
    /// A device control request (`ioctl`); `flags` is its command.
    Ioctl = 30,
}

impl OpKind {
    /// Every kind, in discriminant order.
    pub const ALL: [OpKind; 31] = [
        OpKind::Lookup,
        OpKind::Getattr,
        OpKind::Setattr,
        OpKind::Readlink,
        OpKind::Mknod,
        OpKind::Mkdir,
        OpKind::Unlink,
        OpKind::Rmdir,
        OpKind::Symlink,
        OpKind::Rename,
        OpKind::Link,
        OpKind::Open,
        OpKind::Read,
        OpKind::Write,
        OpKind::Flush,
        OpKind::Release,
        OpKind::Fsync,
        OpKind::Opendir,
        OpKind::Readdir,
        OpKind::Releasedir,
        OpKind::Fsyncdir,
        OpKind::Statfs,
        OpKind::Getxattr,
        OpKind::Setxattr,
        OpKind::Listxattr,
        OpKind::Removexattr,
        OpKind::Access,
        OpKind::Create,
        OpKind::Fallocate,
        OpKind::Lseek,
        OpKind::Ioctl,
    ];

    /// The kind with this discriminant.
    pub fn from_u8(v: u8) -> Option<Self> {
        Self::ALL.get(v as usize).copied()
    }

    /// A short lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            OpKind::Lookup => "lookup",
            OpKind::Getattr => "getattr",
            OpKind::Setattr => "setattr",
            OpKind::Readlink => "readlink",
            OpKind::Mknod => "mknod",
            OpKind::Mkdir => "mkdir",
            OpKind::Unlink => "unlink",
            OpKind::Rmdir => "rmdir",
            OpKind::Symlink => "symlink",
            OpKind::Rename => "rename",
            OpKind::Link => "link",
            OpKind::Open => "open",
            OpKind::Read => "read",
            OpKind::Write => "write",
            OpKind::Flush => "flush",
            OpKind::Release => "release",
            OpKind::Fsync => "fsync",
            OpKind::Opendir => "opendir",
            OpKind::Readdir => "readdir",
            OpKind::Releasedir => "releasedir",
            OpKind::Fsyncdir => "fsyncdir",
            OpKind::Statfs => "statfs",
            OpKind::Getxattr => "getxattr",
            OpKind::Setxattr => "setxattr",
            OpKind::Listxattr => "listxattr",
            OpKind::Removexattr => "removexattr",
            OpKind::Access => "access",
            OpKind::Create => "create",
            OpKind::Fallocate => "fallocate",
            OpKind::Lseek => "lseek",
            OpKind::Ioctl => "ioctl",
        }
    }
}

/// What a named thing is. Discriminants are part of the format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
#[repr(u8)]
pub enum NodeKind {
    /// A regular file.
    File = 0,
    /// A directory.
    Dir = 1,
    /// A symbolic link.
    Symlink = 2,
    /// A device, fifo or socket.
    Other = 3,
}

impl NodeKind {
    /// The kind with this discriminant.
    pub fn from_u8(v: u8) -> Option<Self> {
        [NodeKind::File, NodeKind::Dir, NodeKind::Symlink, NodeKind::Other].get(v as usize).copied()
    }

    /// The kind of a file type.
    pub fn of(t: std::fs::FileType) -> Self {
        if t.is_file() {
            NodeKind::File
        } else if t.is_dir() {
            NodeKind::Dir
        } else if t.is_symlink() {
            NodeKind::Symlink
        } else {
            NodeKind::Other
        }
    }
}

/// One file-system request as the pass-through served it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Op {
    /// What it was ([`OpKind`] discriminant).
    pub kind: u8,
    /// When it reached the pass-through, in nanoseconds since the trace's start.
    pub start_ns: u64,
    /// How long the pass-through took to serve it.
    pub duration_ns: u64,
    /// The requesting thread's id as the kernel gave it (0: the kernel itself, as for
    /// release).
    pub pid: u32,
    /// The file or directory it is on (ids are named by [`Name`] records; 0: none).
    pub file: u64,
    /// The open instance it belongs to (0: none): one per open or create, like the
    /// thesis's FileObject.
    pub handle: u64,
    /// Byte offset (reads, writes, fallocate, lseek; readdir: entry index).
    pub offset: u64,
    /// Bytes asked for (reads), given (writes), or the new size (setattr).
    pub size: u64,
    /// Bytes or entries moved, 0 or 1 for others; a negative errno when it failed.
    pub result: i64,
    /// The file's size after the operation, where it was known (open, read, write,
    /// release, getattr, setattr, create), else 0.
    pub file_size: u64,
    /// Open flags (open, create), the FATTR bits (setattr), rename flags, lseek whence.
    pub flags: u32,
    /// A second file: what a rename replaced or an unlink removed, the parent of a create.
    pub other: u64,
}

impl Op {
    /// The operation kind, if known to this build.
    pub fn op_kind(&self) -> Option<OpKind> {
        OpKind::from_u8(self.kind)
    }

    /// It failed.
    pub fn failed(&self) -> bool {
        self.result < 0
    }

    /// When it finished.
    pub fn end_ns(&self) -> u64 {
        self.start_ns.saturating_add(self.duration_ns)
    }
}

/// Names a file id: the path it had when the pass-through first met it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Name {
    /// The id.
    pub file: u64,
    /// Its directory's id (0 for the root).
    pub parent: u64,
    /// What it is.
    pub kind: NodeKind,
    /// The path below the traced root ("" for the root itself).
    pub path: String,
}

/// Names a process the first time it is seen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Process {
    /// The id the kernel gave.
    pub pid: u32,
    /// Its command name (`/proc/PID/comm`), or "?" when it had gone.
    pub name: String,
}

/// One file or directory of a snapshot.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Entry {
    /// What it is ([`NodeKind`] discriminant).
    pub kind: u8,
    /// Directories between it and the snapshot's root (the root's children: 1).
    pub depth: u32,
    /// Bytes.
    pub size: u64,
    /// Last modification, nanoseconds since the Unix epoch.
    pub modified_ns: i64,
    /// Last access.
    pub accessed_ns: i64,
    /// Last status change.
    pub changed_ns: i64,
    /// Creation (birth) time, 0 when the file system does not keep it.
    pub created_ns: i64,
    /// Directories: files directly inside.
    pub files: u32,
    /// Directories: subdirectories directly inside.
    pub dirs: u32,
    /// The path below the snapshot's root.
    pub path: String,
}

/// A record of either kind of file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    /// An operation.
    Op(Op),
    /// A file's name.
    Name(Name),
    /// A process's name.
    Process(Process),
    /// A snapshot entry.
    Entry(Entry),
}

/// Why a record could not be decoded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    /// The bytes end inside it.
    #[error("record cut off: {0}")]
    Truncated(&'static str),
    /// A field that cannot be what it says.
    #[error("record malformed: {0}")]
    Malformed(String),
    /// A tag this build does not know (a newer writer's record).
    #[error("record of unknown tag {0}")]
    UnknownTag(u8),
}

impl FileHeader {
    /// A header for a file of `kind` written by this build, started now.
    pub fn new(kind: FileKind, start_real_ns: u64, start_mono_ns: u64) -> Self {
        FileHeader {
            version: VERSION,
            min_reader: MIN_READER,
            header_len: FILE_HEADER_LEN as u16,
            block_header_len: BLOCK_HEADER_LEN as u16,
            kind,
            tracer_pid: std::process::id(),
            start_real_ns,
            start_mono_ns,
        }
    }

    /// Encodes the header with its checksum (the layout of version 1).
    pub fn encode(&self) -> [u8; FILE_HEADER_LEN] {
        let mut b = [0u8; FILE_HEADER_LEN];
        b[0..8].copy_from_slice(&FILE_MAGIC);
        b[8..10].copy_from_slice(&self.version.to_le_bytes());
        b[10..12].copy_from_slice(&self.min_reader.to_le_bytes());
        b[12..14].copy_from_slice(&(FILE_HEADER_LEN as u16).to_le_bytes());
        b[14..16].copy_from_slice(&(BLOCK_HEADER_LEN as u16).to_le_bytes());
        b[16..18].copy_from_slice(&(self.kind as u16).to_le_bytes());
        b[20..24].copy_from_slice(&self.tracer_pid.to_le_bytes());
        b[24..32].copy_from_slice(&self.start_real_ns.to_le_bytes());
        b[32..40].copy_from_slice(&self.start_mono_ns.to_le_bytes());
        let crc = crc32c::crc32c(&b[..60]);
        b[60..64].copy_from_slice(&crc.to_le_bytes());
        b
    }
}

/// A little-endian u16 at `at` (the caller checked the length).
pub(crate) fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

/// A little-endian u32 at `at`.
pub(crate) fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// A little-endian u64 at `at`.
pub(crate) fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

/// A block header, decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockHeader {
    /// `BLOCK_FLAG_*`.
    pub flags: u16,
    /// Position of the block in the file.
    pub sequence: u32,
    /// Records in the body.
    pub record_count: u32,
    /// Bytes of the body.
    pub body_len: u32,
    /// Records lost to a full ring so far.
    pub dropped_total: u64,
}

impl BlockHeader {
    /// Appends the block (header with its checksum, then `body`) to `out`.
    pub fn encode_with(&self, body: &[u8], out: &mut Vec<u8>) {
        assert_eq!(self.body_len as usize, body.len(), "the header states the body's length");
        assert!(body.len() <= BLOCK_BODY_MAX, "a block body is at most {BLOCK_BODY_MAX} bytes");
        let start = out.len();
        out.extend_from_slice(&BLOCK_MAGIC);
        out.extend_from_slice(&self.flags.to_le_bytes());
        out.extend_from_slice(&0u16.to_le_bytes());
        out.extend_from_slice(&self.sequence.to_le_bytes());
        out.extend_from_slice(&self.record_count.to_le_bytes());
        out.extend_from_slice(&self.body_len.to_le_bytes());
        out.extend_from_slice(&self.dropped_total.to_le_bytes());
        let crc = crc32c::crc32c_append(crc32c::crc32c(&out[start..start + 28]), body);
        out.extend_from_slice(&crc.to_le_bytes());
        out.extend_from_slice(body);
    }
}

/// Appends `v` as a varint.
pub(crate) fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

fn unzigzag(z: u64) -> i64 {
    ((z >> 1) as i64) ^ -((z & 1) as i64)
}

/// Appends a string field, cut to [`STRING_MAX`] bytes at a character boundary.
fn put_str(out: &mut Vec<u8>, s: &str) {
    let mut end = s.len().min(STRING_MAX);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    put_varint(out, end as u64);
    out.extend_from_slice(&s.as_bytes()[..end]);
}

/// What a record's start time is encoded against: the block's previous op's start.
#[derive(Clone, Copy, Debug, Default)]
pub struct BlockContext {
    prev_start_ns: u64,
}

/// Appends `record` to a block body.
pub fn encode_record(ctx: &mut BlockContext, record: &Record, out: &mut Vec<u8>) {
    let mut p = Vec::with_capacity(64);
    let tag = match record {
        Record::Op(op) => {
            p.push(op.kind);
            put_varint(&mut p, zigzag(op.start_ns.wrapping_sub(ctx.prev_start_ns) as i64));
            ctx.prev_start_ns = op.start_ns;
            for v in [op.duration_ns, u64::from(op.pid), op.file, op.handle, op.offset, op.size] {
                put_varint(&mut p, v);
            }
            put_varint(&mut p, zigzag(op.result));
            for v in [op.file_size, u64::from(op.flags), op.other] {
                put_varint(&mut p, v);
            }
            TAG_OP
        }
        Record::Name(n) => {
            put_varint(&mut p, n.file);
            put_varint(&mut p, n.parent);
            p.push(n.kind as u8);
            put_str(&mut p, &n.path);
            TAG_NAME
        }
        Record::Process(pr) => {
            put_varint(&mut p, u64::from(pr.pid));
            put_str(&mut p, &pr.name);
            TAG_PROCESS
        }
        Record::Entry(e) => {
            p.push(e.kind);
            put_varint(&mut p, u64::from(e.depth));
            put_varint(&mut p, e.size);
            for t in [e.modified_ns, e.accessed_ns, e.changed_ns, e.created_ns] {
                put_varint(&mut p, zigzag(t));
            }
            put_varint(&mut p, u64::from(e.files));
            put_varint(&mut p, u64::from(e.dirs));
            put_str(&mut p, &e.path);
            TAG_ENTRY
        }
    };
    out.push(tag);
    put_varint(out, p.len() as u64);
    out.extend_from_slice(&p);
}

/// Reads fields of one payload.
struct Fields<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Fields<'a> {
    fn varint(&mut self, what: &'static str) -> Result<u64, RecordError> {
        let mut v = 0u64;
        for i in 0..VARINT_MAX {
            let Some(&byte) = self.b.get(self.at) else { return Err(RecordError::Truncated(what)) };
            self.at += 1;
            if i == VARINT_MAX - 1 && byte > 1 {
                return Err(RecordError::Malformed(format!("{what}: varint longer than 64 bits")));
            }
            v |= u64::from(byte & 0x7f) << (7 * i);
            if byte & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(RecordError::Malformed(format!("{what}: varint longer than {VARINT_MAX} bytes")))
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, RecordError> {
        let v = self.varint(what)?;
        u32::try_from(v).map_err(|_| RecordError::Malformed(format!("{what} {v} is beyond 32 bits")))
    }

    fn byte(&mut self, what: &'static str) -> Result<u8, RecordError> {
        let Some(&byte) = self.b.get(self.at) else { return Err(RecordError::Truncated(what)) };
        self.at += 1;
        Ok(byte)
    }

    fn string(&mut self, what: &'static str) -> Result<String, RecordError> {
        let len = self.varint(what)?;
        if len > STRING_MAX as u64 {
            return Err(RecordError::Malformed(format!("{what} of {len} bytes (at most {STRING_MAX})")));
        }
        let end = self.at + len as usize;
        let Some(bytes) = self.b.get(self.at..end) else { return Err(RecordError::Truncated(what)) };
        self.at = end;
        String::from_utf8(bytes.to_vec()).map_err(|_| RecordError::Malformed(format!("{what} is not UTF-8")))
    }
}

/// One record decoded from a body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decoded {
    /// A record this build knows.
    Record(Record),
    /// A record of a tag from a newer version, skipped.
    Skipped(u8),
}

/// Decodes the record at `body[*at..]` and moves `at` past it. `newer`: the file is of a
/// newer version than this build, so unknown tags are skipped and bytes after the known
/// fields ignored (in a file of this version both are corruption).
pub fn decode_record(ctx: &mut BlockContext, body: &[u8], at: &mut usize, newer: bool) -> Result<Decoded, RecordError> {
    let mut head = Fields { b: body, at: *at };
    let tag = head.byte("record tag")?;
    let len = head.varint("record length")?;
    let start = head.at;
    if len > (body.len() - start) as u64 {
        return Err(RecordError::Truncated("record payload"));
    }
    let end = start + len as usize;
    *at = end;
    let mut f = Fields { b: &body[start..end], at: 0 };
    let record = match tag {
        TAG_OP => Record::Op(decode_op(ctx, &mut f)?),
        TAG_NAME => {
            let file = f.varint("name file")?;
            let parent = f.varint("name parent")?;
            let kind = f.byte("name kind")?;
            let kind = NodeKind::from_u8(kind)
                .ok_or_else(|| RecordError::Malformed(format!("name of unknown kind {kind}")))?;
            Record::Name(Name { file, parent, kind, path: f.string("name path")? })
        }
        TAG_PROCESS => Record::Process(Process { pid: f.u32("process pid")?, name: f.string("process name")? }),
        TAG_ENTRY => Record::Entry(decode_entry(&mut f)?),
        _ if newer => return Ok(Decoded::Skipped(tag)),
        _ => return Err(RecordError::UnknownTag(tag)),
    };
    if f.at != f.b.len() && !newer {
        return Err(RecordError::Malformed(format!("{} bytes after the record's fields", f.b.len() - f.at)));
    }
    Ok(Decoded::Record(record))
}

fn decode_op(ctx: &mut BlockContext, f: &mut Fields) -> Result<Op, RecordError> {
    let kind = f.byte("op kind")?;
    let start_ns = ctx.prev_start_ns.wrapping_add(unzigzag(f.varint("op start")?) as u64);
    ctx.prev_start_ns = start_ns;
    Ok(Op {
        kind,
        start_ns,
        duration_ns: f.varint("op duration")?,
        pid: f.u32("op pid")?,
        file: f.varint("op file")?,
        handle: f.varint("op handle")?,
        offset: f.varint("op offset")?,
        size: f.varint("op size")?,
        result: unzigzag(f.varint("op result")?),
        file_size: f.varint("op file size")?,
        flags: f.u32("op flags")?,
        other: f.varint("op other")?,
    })
}

fn decode_entry(f: &mut Fields) -> Result<Entry, RecordError> {
    let kind = f.byte("entry kind")?;
    if NodeKind::from_u8(kind).is_none() {
        return Err(RecordError::Malformed(format!("entry of unknown kind {kind}")));
    }
    Ok(Entry {
        kind,
        depth: f.u32("entry depth")?,
        size: f.varint("entry size")?,
        modified_ns: unzigzag(f.varint("entry modified")?),
        accessed_ns: unzigzag(f.varint("entry accessed")?),
        changed_ns: unzigzag(f.varint("entry changed")?),
        created_ns: unzigzag(f.varint("entry created")?),
        files: f.u32("entry files")?,
        dirs: f.u32("entry dirs")?,
        path: f.string("entry path")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn roundtrip(records: &[Record]) -> Vec<Record> {
        let mut body = Vec::new();
        let mut ctx = BlockContext::default();
        for r in records {
            encode_record(&mut ctx, r, &mut body);
        }
        let (mut at, mut ctx, mut out) = (0, BlockContext::default(), Vec::new());
        while at < body.len() {
            match decode_record(&mut ctx, &body, &mut at, false).expect("decodes") {
                Decoded::Record(r) => out.push(r),
                Decoded::Skipped(t) => panic!("skipped tag {t}"),
            }
        }
        out
    }

    fn op_strategy() -> impl Strategy<Value = Op> {
        (any::<u8>(), any::<u64>(), any::<u64>(), any::<u32>(), any::<u64>(), any::<u64>(), any::<i64>(), any::<u32>())
            .prop_map(|(kind, start_ns, duration_ns, pid, file, offset, result, flags)| Op {
                kind,
                start_ns,
                duration_ns,
                pid,
                file,
                handle: file ^ 7,
                offset,
                size: offset / 3,
                result,
                file_size: duration_ns / 5,
                flags,
                other: start_ns / 11,
            })
    }

    proptest! {
        #[test]
        fn ops_survive_encoding(ops in proptest::collection::vec(op_strategy(), 0..50)) {
            let records: Vec<Record> = ops.into_iter().map(Record::Op).collect();
            prop_assert_eq!(roundtrip(&records), records);
        }

        #[test]
        fn names_and_entries_survive_encoding(path in "\\PC{0,40}", file in any::<u64>(), t in any::<i64>()) {
            let records = vec![
                Record::Name(Name { file, parent: file / 2, kind: NodeKind::Symlink, path: path.clone() }),
                Record::Process(Process { pid: file as u32, name: path.clone() }),
                Record::Entry(Entry { kind: 1, depth: 3, size: file, modified_ns: t, accessed_ns: -t / 2,
                    changed_ns: 0, created_ns: t / 3, files: 4, dirs: 5, path }),
            ];
            prop_assert_eq!(roundtrip(&records), records);
        }

        #[test]
        fn any_bytes_decode_or_fail_without_panic(body in proptest::collection::vec(any::<u8>(), 0..200)) {
            let (mut at, mut ctx) = (0, BlockContext::default());
            while at < body.len() {
                if decode_record(&mut ctx, &body, &mut at, true).is_err() {
                    break;
                }
            }
        }
    }

    #[test]
    fn long_strings_are_cut_at_a_character_boundary() {
        let long = "é".repeat(STRING_MAX);
        let r = roundtrip(&[Record::Process(Process { pid: 1, name: long })]);
        let Record::Process(p) = &r[0] else { panic!("a process") };
        assert!(p.name.len() <= STRING_MAX && p.name.len() >= STRING_MAX - 1);
        assert!(p.name.chars().all(|c| c == 'é'));
    }

    #[test]
    fn a_newer_writers_tags_and_fields_are_skipped_only_in_newer_files() {
        let mut body = vec![99, 2, 0xAA, 0xBB];
        encode_record(&mut BlockContext::default(), &Record::Process(Process { pid: 4, name: "sh".into() }), &mut body);
        // The process record with one appended field.
        let len_at = 5;
        body[len_at] += 1;
        body.push(7);
        let (mut at, mut ctx) = (0, BlockContext::default());
        assert_eq!(decode_record(&mut ctx, &body, &mut at, true), Ok(Decoded::Skipped(99)));
        assert_eq!(
            decode_record(&mut ctx, &body, &mut at, true),
            Ok(Decoded::Record(Record::Process(Process { pid: 4, name: "sh".into() })))
        );
        assert_eq!(at, body.len());
        let mut at = 0;
        assert_eq!(decode_record(&mut ctx, &body, &mut at, false), Err(RecordError::UnknownTag(99)));
        assert!(matches!(decode_record(&mut ctx, &body, &mut at, false), Err(RecordError::Malformed(_))));
    }

    #[test]
    fn a_varint_beyond_64_bits_is_refused() {
        let mut f = Fields { b: &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02], at: 0 };
        assert!(matches!(f.varint("x"), Err(RecordError::Malformed(_))));
        let mut f = Fields { b: &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01], at: 0 };
        assert_eq!(f.varint("x"), Ok(u64::MAX));
    }
}
