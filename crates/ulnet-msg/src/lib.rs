//! # ulnet-msg: the message layer
//!
//! Request/response RPC, one-way calls and active messages ([`am`]) over ulnet endpoints
//! (any transport), built for
//! the messages cluster software actually sends: 68–256 bytes, a header and a payload or
//! two. A request is a 24-byte header ([`wire`]) followed by the caller's buffers in one
//! gather send, so nothing is copied to put them together; the server reads it in the
//! receive queue and answers from the handler into the channel.
//!
//! ```no_run
//! use ulnet_core::{Endpoint, EndpointConfig};
//! use ulnet_msg::rpc::{CallOutcome, Rpc, RpcConfig, RpcEvent};
//! use std::time::Duration;
//!
//! // Server process
//! let mut ep = Endpoint::new(EndpointConfig::default());
//! ep.listen_shm("kv")?;
//! let mut server = Rpc::new(ep, RpcConfig::default());
//! server.register_inline(7, |req, replier| replier.reply(&[b"echo: ", req.payload]));
//! server.endpoint().accept(Duration::from_secs(5))?;
//! loop { server.poll(64, |_| {}); }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(missing_docs)]

pub mod am;
mod pool;
pub mod rpc;
pub mod wire;
