//! The UDP transport: reliable, ordered, flow-controlled channels over UDP datagrams.
//!
//! Split as quinn is: [`conn`] is the protocol, a sans-IO state machine (sequence numbers,
//! cumulative and selective acks, RTT-estimated retransmission, duplicate suppression,
//! fragmentation, credit-based flow control, the HMAC handshake) with no sockets and no
//! clock, run both by the socket driver here and by `ulnet-sim` in the tests; [`wire`] is
//! its versioned packet format; [`channel`] and [`listener`] are the thin driver that binds
//! it to connected sockets with `sendmmsg`/`recvmmsg` batching and a timerfd for sleepers.
//!
//! Modes: *busy polling* is calling [`Endpoint::poll`](crate::Endpoint::poll) in a loop
//! (non-blocking `recvmmsg`, no sleep); *blocking* is
//! [`Endpoint::wait`](crate::Endpoint::wait), which sleeps in `poll(2)` on each channel's
//! socket and timerfd and returns when data arrived or a protocol timer is due. The
//! protocol runs only inside those calls (see [`channel`] for who drives retransmission).

pub mod channel;
pub mod config;
pub mod conn;
pub mod listener;
pub mod wire;

pub use channel::{UdpChannel, UdpStats};
pub use config::UdpConfig;
pub use conn::{Connection, UdpCounters};
pub use listener::{connect, UdpChannelListener};
