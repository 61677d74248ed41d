//! The registry's client protocol, and a client library over it.
//!
//! Clients call the registry service of any `ulnet node` over the node's control plane
//! (ulnet RPC on its TCP address, authenticated with the cluster secret). A set is answered
//! once it is committed (fsynced on a quorum of the voters) and applied at that node; a get
//! once the node's state reflects every update committed before the get was asked for
//! (linearizable).
//!
//! ```no_run
//! use std::time::Duration;
//! use ulnet_registry::client::RegistryClient;
//!
//! let mut c = RegistryClient::connect("127.0.0.1:7100", b"my cluster secret", Duration::from_secs(5))?;
//! let seq = c.set(b"svc/web", b"10.0.0.7:80")?;
//! let got = c.get(b"svc/web")?;
//! assert_eq!(got.value.as_deref(), Some(&b"10.0.0.7:80"[..]));
//! assert!(got.seq >= seq);
//! # Ok::<(), ulnet_registry::client::ClientError>(())
//! ```
//!
//! Requests and answers (little-endian, lengths as u32 before the bytes; append-only):
//!
//! ```text
//!  SET     key blob | value blob   ->  status u8 | seq u64 | message blob
//!  DELETE  key blob                ->  status u8 | seq u64 | message blob
//!  GET     key blob                ->  status u8 | seq u64 | found u8 | value blob | message blob
//!  STATUS  (nothing)               ->  JSON (RegistryStatus)
//! ```
//! Status: 0 done; 1 indeterminate (not committed in time: it may still take effect);
//! 2 refused (nothing happened: not a member, not ready, too large, overloaded).

use crate::codec::{DecodeError, Reader, Writer};
use crate::store::{KEY_BYTES_MAX, VALUE_BYTES_MAX};
use serde::{Deserialize, Serialize};
use std::time::{Duration, Instant};
use ulnet_core::{ChannelId, Endpoint, EndpointConfig};
use ulnet_msg::rpc::{CallError, CallId, CallOutcome, Rpc, RpcConfig, RpcEvent};

/// Control-plane method: set a key (ids are on the wire; append only).
pub const METHOD_SET: u16 = ulnet_cluster::runtime::METHOD_SERVICE_MIN;
/// Control-plane method: linearizable get.
pub const METHOD_GET: u16 = METHOD_SET + 1;
/// Control-plane method: delete a key.
pub const METHOD_DELETE: u16 = METHOD_SET + 2;
/// Control-plane method: the node's registry status (JSON).
pub const METHOD_STATUS: u16 = METHOD_SET + 3;

/// How a request ended, as the service answers it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Committed and applied (a set or delete), or answered (a get).
    Done = 0,
    /// Not committed within the node's timeout: it may or may not take effect.
    Indeterminate = 1,
    /// Refused: nothing happened.
    Refused = 2,
}

impl Outcome {
    fn from_u8(v: u8) -> Result<Self, DecodeError> {
        match v {
            0 => Ok(Outcome::Done),
            1 => Ok(Outcome::Indeterminate),
            2 => Ok(Outcome::Refused),
            tag => Err(DecodeError::UnknownTag { what: "outcome", tag }),
        }
    }
}

/// A set's or delete's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UpdateAnswer {
    /// How it ended.
    pub outcome: Outcome,
    /// The log position it took (when done).
    pub seq: u64,
    /// Why, when it did not end well.
    pub message: String,
}

/// A get's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GetAnswer {
    /// How it ended.
    pub outcome: Outcome,
    /// The log position the answer reflects.
    pub seq: u64,
    /// The value (None: no such key).
    pub value: Option<Vec<u8>>,
    /// Why, when it did not end well.
    pub message: String,
}

/// What a node's registry reports about itself (`registry status`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegistryStatus {
    /// The node (its membership id, hexadecimal).
    pub node: String,
    /// Whether its registry runs (false until it has a view, or after a disk failure).
    pub running: bool,
    /// The epoch it follows, as `e<view>.<round>/<locker>`.
    pub epoch: String,
    /// Whether it holds its epoch's log and takes part.
    pub normal: bool,
    /// Whether it is the locker.
    pub locker: bool,
    /// Position applied.
    pub applied: u64,
    /// Committed position known.
    pub committed: u64,
    /// The voting configuration at the applied position.
    pub voters: Vec<String>,
    /// Keys stored.
    pub keys: u64,
    /// Why the registry is stopped and what it does about it (empty while it runs or waits
    /// for its first view), as its clients are told: e.g. `registry stopped: no space left
    /// on DIR; retrying every 1 s`.
    #[serde(default)]
    pub stopped: String,
    /// Times a disk failure (no space, a quota, an I/O error) stopped the registry.
    #[serde(default)]
    pub disk_failures: u64,
    /// Times the registry restarted in place from its log once the disk took writes again.
    #[serde(default)]
    pub restarts: u64,
}

/// Encodes a set request.
pub fn encode_set(key: &[u8], value: &[u8]) -> Vec<u8> {
    let mut w = Writer::new();
    w.blob(key);
    w.blob(value);
    w.buf
}

/// Encodes a get or delete request.
pub fn encode_key(key: &[u8]) -> Vec<u8> {
    let mut w = Writer::new();
    w.blob(key);
    w.buf
}

/// Decodes a set request: key and value.
pub fn decode_set(buf: &[u8]) -> Result<(Vec<u8>, Vec<u8>), DecodeError> {
    let mut r = Reader::new(buf);
    let key = r.blob("key", KEY_BYTES_MAX)?.to_vec();
    let value = r.blob("value", VALUE_BYTES_MAX)?.to_vec();
    r.finish()?;
    Ok((key, value))
}

/// Decodes a get or delete request: the key.
pub fn decode_key(buf: &[u8]) -> Result<Vec<u8>, DecodeError> {
    let mut r = Reader::new(buf);
    let key = r.blob("key", KEY_BYTES_MAX)?.to_vec();
    r.finish()?;
    Ok(key)
}

/// Encodes a set's or delete's answer.
pub fn encode_update_answer(a: &UpdateAnswer) -> Vec<u8> {
    let mut w = Writer::new();
    w.u8(a.outcome as u8);
    w.u64(a.seq);
    w.blob(a.message.as_bytes());
    w.buf
}

/// Decodes a set's or delete's answer.
pub fn decode_update_answer(buf: &[u8]) -> Result<UpdateAnswer, DecodeError> {
    let mut r = Reader::new(buf);
    let outcome = Outcome::from_u8(r.u8()?)?;
    let seq = r.u64()?;
    let message = String::from_utf8_lossy(&r.blob("message", 4096)?).into_owned();
    r.finish()?;
    Ok(UpdateAnswer { outcome, seq, message })
}

/// Encodes a get's answer.
pub fn encode_get_answer(a: &GetAnswer) -> Vec<u8> {
    let mut w = Writer::new();
    w.u8(a.outcome as u8);
    w.u64(a.seq);
    w.bool(a.value.is_some());
    w.blob(a.value.as_deref().unwrap_or_default());
    w.blob(a.message.as_bytes());
    w.buf
}

/// Decodes a get's answer.
pub fn decode_get_answer(buf: &[u8]) -> Result<GetAnswer, DecodeError> {
    let mut r = Reader::new(buf);
    let outcome = Outcome::from_u8(r.u8()?)?;
    let seq = r.u64()?;
    let found = r.bool()?;
    let value = r.blob("value", VALUE_BYTES_MAX)?.to_vec();
    let message = String::from_utf8_lossy(&r.blob("message", 4096)?).into_owned();
    r.finish()?;
    Ok(GetAnswer { outcome, seq, value: found.then_some(value), message })
}

/// Why a client call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The node could not be reached.
    #[error("cannot connect to {addr}: {error}")]
    Connect {
        /// The node.
        addr: String,
        /// Why.
        error: String,
    },
    /// The call failed (timeout, the node went away, unknown method: an older node).
    #[error("call failed: {0}")]
    Call(#[from] CallError),
    /// No answer in time.
    #[error(
        "no answer within {0:?}: the node is overloaded, stopped, or has no quorum (see `ulnet cluster status`); \
         an update may still take effect"
    )]
    Timeout(Duration),
    /// The update was not committed in time: it may or may not take effect.
    #[error("indeterminate: {0}")]
    Indeterminate(String),
    /// The node refused the request; nothing happened.
    #[error("refused: {0}")]
    Refused(String),
    /// The answer did not decode.
    #[error("malformed answer: {0}")]
    Malformed(#[from] DecodeError),
}

/// A get's result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Got {
    /// The value (None: no such key).
    pub value: Option<Vec<u8>>,
    /// The log position the answer reflects.
    pub seq: u64,
}

/// A blocking client of one node's registry. For many requests in flight use the encoding
/// functions of this module with an [`Rpc`] of your own.
pub struct RegistryClient {
    rpc: Rpc,
    channel: ChannelId,
    timeout: Duration,
}

impl RegistryClient {
    /// Connects to the node at `addr` (its `--listen` address) with the cluster secret;
    /// every call waits at most `timeout`. Fails at once when nothing listens at `addr`.
    pub fn connect(addr: &str, secret: &[u8], timeout: Duration) -> Result<Self, ClientError> {
        let mut config = EndpointConfig::default();
        config.tcp.secret = secret.to_vec();
        let mut ep = Endpoint::new(config);
        let channel = ep
            .connect_tcp(addr, timeout)
            .map_err(|e| ClientError::Connect { addr: addr.to_string(), error: e.to_string() })?;
        Ok(Self { rpc: Rpc::new(ep, RpcConfig { workers: 0, ..RpcConfig::default() }), channel, timeout })
    }

    fn call(&mut self, method: u16, payload: &[u8]) -> Result<Vec<u8>, ClientError> {
        let deadline = Instant::now() + self.timeout;
        let id: CallId = loop {
            match self.rpc.call(self.channel, method, &[payload], Some(self.timeout))? {
                CallOutcome::Sent(id) => break id,
                CallOutcome::NoResource => {
                    self.rpc.poll(64, |_| {});
                    if Instant::now() > deadline {
                        return Err(ClientError::Timeout(self.timeout));
                    }
                }
            }
        };
        let mut answer = None;
        while answer.is_none() {
            self.rpc.poll(64, |e| match e {
                RpcEvent::Reply { call, data, .. } if call == id => answer = Some(Ok(data.to_vec())),
                RpcEvent::Failed { call, error, .. } if call == id => answer = Some(Err(error.into())),
                _ => {}
            });
            if answer.is_none() {
                if Instant::now() > deadline + Duration::from_millis(100) {
                    return Err(ClientError::Timeout(self.timeout));
                }
                let _ = self.rpc.endpoint().wait(Some(Duration::from_millis(10)));
            }
        }
        answer.expect("loop ends with an answer")
    }

    fn update(&mut self, method: u16, payload: &[u8]) -> Result<u64, ClientError> {
        let a = decode_update_answer(&self.call(method, payload)?)?;
        match a.outcome {
            Outcome::Done => Ok(a.seq),
            Outcome::Indeterminate => Err(ClientError::Indeterminate(a.message)),
            Outcome::Refused => Err(ClientError::Refused(a.message)),
        }
    }

    /// Sets `key` to `value`; returns the log position once committed and applied.
    pub fn set(&mut self, key: &[u8], value: &[u8]) -> Result<u64, ClientError> {
        self.update(METHOD_SET, &encode_set(key, value))
    }

    /// Deletes `key`; returns the log position once committed and applied.
    pub fn delete(&mut self, key: &[u8]) -> Result<u64, ClientError> {
        self.update(METHOD_DELETE, &encode_key(key))
    }

    /// Reads `key`, linearizably.
    pub fn get(&mut self, key: &[u8]) -> Result<Got, ClientError> {
        let a = decode_get_answer(&self.call(METHOD_GET, &encode_key(key))?)?;
        match a.outcome {
            Outcome::Done => Ok(Got { value: a.value, seq: a.seq }),
            Outcome::Indeterminate => Err(ClientError::Indeterminate(a.message)),
            Outcome::Refused => Err(ClientError::Refused(a.message)),
        }
    }

    /// The node's registry status.
    pub fn status(&mut self) -> Result<RegistryStatus, ClientError> {
        let body = self.call(METHOD_STATUS, &[])?;
        serde_json::from_slice(&body).map_err(|_| ClientError::Malformed(DecodeError::Invalid("status JSON")))
    }
}
