//! Sending a small message with file descriptors over a Unix stream socket.

use rustix::net::{
    recvmsg, sendmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer, SendAncillaryMessage,
    SendFlags,
};
use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;

/// Most descriptors one message carries.
pub(crate) const MAX_FDS: usize = 4;

/// Sends `bytes` (all of them, in one message) with `fds` attached.
pub(crate) fn send_with_fds(sock: &UnixStream, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    assert!(fds.len() <= MAX_FDS);
    let mut space = [0u8; rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(io::Error::other("ancillary buffer too small"));
    }
    let n = sendmsg(sock.as_fd(), &[IoSlice::new(bytes)], &mut control, SendFlags::NOSIGNAL)?;
    if n != bytes.len() {
        return Err(io::Error::new(io::ErrorKind::WriteZero, "short handshake write"));
    }
    Ok(())
}

/// Receives one message of exactly `buf.len()` bytes and the descriptors attached to it.
pub(crate) fn recv_with_fds(sock: &UnixStream, buf: &mut [u8]) -> io::Result<Vec<OwnedFd>> {
    let mut space = [0u8; rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let len = buf.len();
    let msg =
        recvmsg(sock.as_fd(), &mut [IoSliceMut::new(buf)], &mut control, RecvFlags::CMSG_CLOEXEC | RecvFlags::WAITALL)?;
    if msg.bytes != len {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "peer closed during handshake"));
    }
    let mut fds = Vec::new();
    for m in control.drain() {
        if let RecvAncillaryMessage::ScmRights(received) = m {
            fds.extend(received);
        }
    }
    Ok(fds)
}
