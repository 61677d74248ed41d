//! Batched datagram I/O (`sendmmsg`, `recvmmsg`) and the path MTU, the only `unsafe` of
//! the UDP transport.

use std::io;
use std::os::fd::{AsFd, AsRawFd};

/// Most datagrams one batched call moves.
pub(crate) const BATCH_MAX: usize = 32;

/// Sends `datagrams` on a connected socket with one `sendmmsg`; returns how many the
/// kernel took (0 when its buffer is full).
pub(crate) fn send_batch(socket: impl AsFd, datagrams: &[&[u8]]) -> io::Result<usize> {
    let n = datagrams.len().min(BATCH_MAX);
    if n == 0 {
        return Ok(0);
    }
    let mut iov: [libc::iovec; BATCH_MAX] = [libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; BATCH_MAX];
    // SAFETY: mmsghdr is plain data for which all-zero bytes are a valid (empty) value.
    let mut msgs: [libc::mmsghdr; BATCH_MAX] = unsafe { std::mem::zeroed() };
    for i in 0..n {
        iov[i] = libc::iovec { iov_base: datagrams[i].as_ptr() as *mut libc::c_void, iov_len: datagrams[i].len() };
    }
    for i in 0..n {
        msgs[i].msg_hdr.msg_iov = &mut iov[i];
        msgs[i].msg_hdr.msg_iovlen = 1;
    }
    loop {
        // SAFETY: `msgs[..n]` point at `iov[..n]`, which point at the caller's slices; all
        // outlive the call and the kernel only reads them (no addresses: the socket is
        // connected).
        let r = unsafe { libc::sendmmsg(socket.as_fd().as_raw_fd(), msgs.as_mut_ptr(), n as u32, libc::MSG_DONTWAIT) };
        if r >= 0 {
            return Ok(r as usize);
        }
        let e = io::Error::last_os_error();
        match e.kind() {
            io::ErrorKind::WouldBlock => return Ok(0),
            io::ErrorKind::Interrupted => continue,
            _ => return Err(e),
        }
    }
}

/// Receives up to `bufs.len()` datagrams with one `recvmmsg`, each into the spare capacity
/// of its buffer, whose length is set to the datagram's (a datagram larger than the
/// capacity is cut and flagged in `truncated`). Returns how many arrived (0: none waiting).
pub(crate) fn recv_batch(socket: impl AsFd, bufs: &mut [Vec<u8>], truncated: &mut [bool]) -> io::Result<usize> {
    let n = bufs.len().min(BATCH_MAX).min(truncated.len());
    if n == 0 {
        return Ok(0);
    }
    let mut iov: [libc::iovec; BATCH_MAX] = [libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; BATCH_MAX];
    // SAFETY: mmsghdr is plain data for which all-zero bytes are a valid (empty) value.
    let mut msgs: [libc::mmsghdr; BATCH_MAX] = unsafe { std::mem::zeroed() };
    for i in 0..n {
        bufs[i].clear();
        let spare = bufs[i].spare_capacity_mut();
        iov[i] = libc::iovec { iov_base: spare.as_mut_ptr() as *mut libc::c_void, iov_len: spare.len() };
    }
    for i in 0..n {
        msgs[i].msg_hdr.msg_iov = &mut iov[i];
        msgs[i].msg_hdr.msg_iovlen = 1;
    }
    let got = loop {
        // SAFETY: each iovec covers exactly the spare (allocated, uninitialised) capacity of
        // its buffer, which nobody else touches during the call; the kernel writes at most
        // `iov_len` bytes there and reports the count in `msg_len`.
        let r = unsafe {
            libc::recvmmsg(
                socket.as_fd().as_raw_fd(),
                msgs.as_mut_ptr(),
                n as u32,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        if r >= 0 {
            break r as usize;
        }
        let e = io::Error::last_os_error();
        match e.kind() {
            io::ErrorKind::WouldBlock => return Ok(0),
            io::ErrorKind::Interrupted => continue,
            // An ICMP error queued on the socket (port unreachable): not data.
            io::ErrorKind::ConnectionRefused => return Ok(0),
            _ => return Err(e),
        }
    };
    for i in 0..got {
        let len = (msgs[i].msg_len as usize).min(iov[i].iov_len);
        // SAFETY: the kernel initialised the first `msg_len` bytes of the spare capacity
        // (never more than `iov_len`, the capacity left), so the length covers only
        // initialised bytes.
        unsafe { bufs[i].set_len(len) };
        truncated[i] = msgs[i].msg_hdr.msg_flags & libc::MSG_TRUNC != 0;
    }
    Ok(got)
}

/// The path MTU the kernel knows for a connected socket (`IP_MTU` / `IPV6_MTU`).
pub(crate) fn path_mtu(socket: impl AsFd, ipv6: bool) -> io::Result<usize> {
    let mut mtu: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    let (level, name) = if ipv6 { (libc::IPPROTO_IPV6, libc::IPV6_MTU) } else { (libc::IPPROTO_IP, libc::IP_MTU) };
    // SAFETY: `mtu` and `len` are valid for writes of an int and its length, as
    // getsockopt(IP_MTU) requires.
    let r = unsafe {
        libc::getsockopt(
            socket.as_fd().as_raw_fd(),
            level,
            name,
            &mut mtu as *mut libc::c_int as *mut libc::c_void,
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(mtu.max(0) as usize)
}
