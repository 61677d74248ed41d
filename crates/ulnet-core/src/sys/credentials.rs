//! Who is at the other end of a Unix socket: the kernel's record of the peer's process,
//! user and groups (`SO_PEERCRED`, `SO_PEERGROUPS`), taken when the connection was made
//! (for a connector: when it connected; for a listener: when it called `listen`). A peer
//! cannot forge it: it is the kernel's, not anything the peer sent.

use std::io;
use std::os::fd::{AsFd, AsRawFd};

/// The credentials of the process at the other end of a Unix socket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PeerCredentials {
    /// Its process id (in our pid namespace; 0 when it has none there).
    pub(crate) pid: i32,
    /// Its effective user id.
    pub(crate) uid: u32,
    /// Its effective group id.
    pub(crate) gid: u32,
}

impl PeerCredentials {
    /// The credentials of `socket`'s peer.
    pub(crate) fn of(socket: impl AsFd) -> io::Result<Self> {
        let c = rustix::net::sockopt::get_socket_peercred(socket)?;
        Ok(Self { pid: c.pid.as_raw_nonzero().get(), uid: c.uid.as_raw(), gid: c.gid.as_raw() })
    }

    /// Whether the peer runs with this process's effective user id.
    pub(crate) fn is_our_user(&self) -> bool {
        self.uid == rustix::process::geteuid().as_raw()
    }
}

/// The supplementary groups of `socket`'s peer.
pub(crate) fn peer_groups(socket: impl AsFd) -> io::Result<Vec<u32>> {
    // 32 fit most peers; the kernel says how many bytes more need (it caps a process's
    // groups at 65,536), and the second call then fits unless they changed in between.
    let mut groups: Vec<libc::gid_t> = vec![0; 32];
    for _ in 0..2 {
        let mut len = (groups.len() * std::mem::size_of::<libc::gid_t>()) as libc::socklen_t;
        // SAFETY: `groups` is valid for writes of `len` bytes, and `len` is a valid
        // socklen_t the kernel overwrites with the bytes it wrote or, on ERANGE, needs
        // (it writes nothing to the buffer then).
        let r = unsafe {
            libc::getsockopt(
                socket.as_fd().as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_PEERGROUPS,
                groups.as_mut_ptr().cast(),
                &mut len,
            )
        };
        let n = len as usize / std::mem::size_of::<libc::gid_t>();
        if r == 0 {
            groups.truncate(n.min(groups.len()));
            return Ok(groups);
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::ERANGE) {
            return Err(e);
        }
        groups = vec![0; n.max(groups.len() + 1)];
    }
    Err(io::Error::other("the peer's groups changed while they were read"))
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;

    #[test]
    fn a_socket_pair_sees_this_process() {
        let (a, _b) = UnixStream::pair().unwrap();
        let c = PeerCredentials::of(&a).unwrap();
        assert_eq!(c.pid, std::process::id() as i32);
        assert!(c.is_our_user());
        assert_eq!(c.gid, rustix::process::getegid().as_raw());
        let mut ours = rustix::process::getgroups().unwrap().iter().map(|g| g.as_raw()).collect::<Vec<_>>();
        let mut groups = peer_groups(&a).unwrap();
        ours.sort_unstable();
        groups.sort_unstable();
        assert_eq!(groups, ours);
    }
}
