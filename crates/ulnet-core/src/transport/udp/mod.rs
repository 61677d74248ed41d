//! The UDP transport: reliable, ordered, flow-controlled channels over UDP datagrams.
//!
//! Split as quinn is: [`conn`] is the protocol, a sans-IO state machine (sequence numbers,
//! cumulative and selective acks, RTT-estimated retransmission, duplicate suppression,
//! fragmentation, credit-based flow control, the HMAC handshake) with no sockets and no
//! clock, run both by the socket driver here and by `ulnet-sim` in the tests; [`wire`] is
//! its versioned packet format.

pub mod config;
pub mod conn;
pub mod wire;

pub use config::UdpConfig;
pub use conn::{Connection, UdpCounters};
