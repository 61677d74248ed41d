//! Anonymous, size-sealed memory files for shared mappings.

use rustix::fs::{MemfdFlags, SealFlags};
use std::fs::File;
use std::io;

/// Creates a memory file of `len` bytes whose size is sealed, so a peer holding the
/// descriptor can neither shrink it (which would turn our accesses into SIGBUS) nor grow it.
pub(crate) fn create_sealed(name: &str, len: usize) -> io::Result<File> {
    let fd = rustix::fs::memfd_create(name, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)?;
    rustix::fs::ftruncate(&fd, len as u64)?;
    rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)?;
    Ok(File::from(fd))
}

/// Checks that a peer's memory file is sealed against shrinking and returns its size.
pub(crate) fn check_sealed(file: &File) -> io::Result<usize> {
    let seals = rustix::fs::fcntl_get_seals(file)?;
    if !seals.contains(SealFlags::SHRINK) {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            "peer memory file is not sealed against shrinking",
        ));
    }
    let len = file.metadata()?.len();
    usize::try_from(len).map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "peer memory file too large"))
}
