//! Sleeping on channels: the one place that runs the arm → sleep → disarm order of
//! [`ReadyProbe`] for endpoints and completion queues alike.

use crate::transport::ReadyProbe;
use std::os::fd::BorrowedFd;
use std::sync::Arc;
use std::time::Duration;

/// Sleeps until a probe's channel has something or hangs up, one of `extra` (listening
/// sockets) is readable, or `timeout` passes. Returns whether it actually slept (it does
/// not when a probe refuses to arm because data arrived meanwhile).
pub(crate) fn sleep_on(
    probes: &[Arc<dyn ReadyProbe>],
    extra: &[BorrowedFd<'_>],
    timeout: Option<Duration>,
) -> std::io::Result<bool> {
    let mut armed = 0;
    for p in probes {
        if !p.arm() {
            break;
        }
        armed += 1;
    }
    let mut result = Ok(false);
    if armed == probes.len() {
        let mut fds: Vec<rustix::event::PollFd<'_>> = Vec::new();
        for fd in probes.iter().flat_map(|p| p.wait_fds()).chain(extra.iter().copied()) {
            fds.push(rustix::event::PollFd::from_borrowed_fd(fd, rustix::event::PollFlags::IN));
        }
        let ms = timeout.map_or(-1, |t| t.as_millis().min(i32::MAX as u128) as i32);
        result = match rustix::event::poll(&mut fds, ms) {
            Ok(_) | Err(rustix::io::Errno::INTR) => Ok(true),
            Err(e) => Err(e.into()),
        };
    }
    for p in &probes[..armed] {
        p.disarm();
    }
    result
}
