//! # ulnet-core: user-level endpoints
//!
//! The U-Net / VIA endpoint model for processes on today's machines. An [`Endpoint`] is a
//! process's handle on the network; it holds channels to peers, each with send and
//! receive queues in shared memory and receive buffers handed back through a free queue.
//! Small messages travel inline in descriptors; larger ones are copied once into the
//! receiver's buffers and delivered in place. Many endpoints report into one
//! [`CompletionQueue`], so one thread can serve many peers.
//!
//! Waiting: [`Endpoint::poll`] is the fast path; [`Endpoint::wait`] sleeps in the kernel
//! (eventfd doorbells that a peer rings only when the receiver has said it sleeps), and
//! upcalls ([`Upcall`]) run handlers for the "non-empty" and "almost full" conditions.
//!
//! ```no_run
//! use ulnet_core::{Endpoint, EndpointConfig, Event, SendOutcome};
//! use std::time::Duration;
//!
//! // Process A
//! let mut server = Endpoint::new(EndpointConfig::default());
//! server.listen_shm("demo")?;
//! // Process B
//! let mut client = Endpoint::new(EndpointConfig::default());
//! let ch = client.connect_shm("demo", Duration::from_secs(5))?;
//! assert_eq!(client.send(ch, &[b"header", b"payload"])?, SendOutcome::Done);
//! // Process A
//! server.wait(Some(Duration::from_secs(1)))?;
//! server.poll(16, |event| if let Event::Message { data, .. } = event { println!("{data:?}") });
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(missing_docs)]

mod cq;
pub mod descriptor;
mod endpoint;
pub mod error;
pub mod log_limit;
pub mod node;
pub mod rma;
mod sys;
pub mod trace;
pub mod transport;
mod wait;
mod waker;
mod watch;

pub use cq::{Completion, CompletionKind, CompletionQueue};
pub use endpoint::{ChannelId, Endpoint, EndpointConfig, EndpointCounters, EndpointId, Event, ReplyTo, Upcall};
pub use error::{ChannelError, ConnectError, Refusal, SendError};
pub use node::NodeId;
pub use transport::{Capabilities, Responder, RmaCapabilities, SendOutcome, Transport, TransportKind};
pub use waker::Waker;

/// Most buffers in one gather list.
pub const GATHER_MAX: usize = 4;

/// Received data: a whole message, or one fragment of a large one, handed over in place.
#[derive(Clone, Copy, Debug)]
pub struct Delivery<'a> {
    /// The bytes, valid until the handler returns.
    pub data: &'a [u8],
    /// Length of the whole message.
    pub message_len: u64,
    /// Offset of `data` in the message.
    pub offset: u64,
}

impl Delivery<'_> {
    /// The message arrived in one piece.
    #[inline]
    pub fn is_whole(&self) -> bool {
        self.offset == 0 && self.data.len() as u64 == self.message_len
    }

    /// This is the last (or only) piece of its message.
    #[inline]
    pub fn is_last(&self) -> bool {
        self.offset + self.data.len() as u64 == self.message_len
    }
}
