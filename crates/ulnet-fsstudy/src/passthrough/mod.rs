//! Collection: a FUSE pass-through that serves a directory unchanged and records every
//! request made to it ([`fs`]), with its inode and handle tables ([`inodes`],
//! [`handles`]), the calls it makes on the backing files ([`sys`]) and the mappings large
//! reads are served from ([`mapped`]); mounting it and
//! running a command inside it ([`mount`](mod@mount)).
//!
//! What a FUSE pass-through sees is what reaches the file system through the kernel's VFS:
//! name lookups (one per path component resolved), attribute reads, opens and closes
//! (`flush` at each `close`, `release` at the last), reads and writes with their offsets
//! and sizes (direct I/O: as the program made them), directory listings, creates,
//! removals, renames, links, extended attributes and errors. A seek is not a request: it
//! shows as the next read's or write's offset. Reads of memory-mapped files (programs
//! and libraries being loaded) arrive as page-sized reads. Inode numbers are the mount's
//! own (stable for each file while mounted, equal for hard links); every other attribute
//! is the backing file's.

pub mod fs;
pub mod handles;
pub mod inodes;
pub mod mapped;
pub mod mount;
pub mod sys;

pub use fs::{FsOptions, Passthrough};
pub use mount::{fuse_available, mount, run_command, CollectError, MountOptions, Mounted, TraceSummary};
