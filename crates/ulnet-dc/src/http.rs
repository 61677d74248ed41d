//! A small blocking HTTP/1.1 server and client on std sockets, parsing with `httparse`.
//!
//! Why not hyper: a node's capacity is modelled as a fixed number of workers, and clients
//! are closed loops (each waits for its response), so a thread per connection blocking on
//! its socket is the model itself; an async runtime would add a scheduler between the model
//! and the measurement, and seconds of build time on a two-core machine, for no gain.
//! Parsing is not hand-rolled: `httparse` (hyper's parser) reads every request and
//! response head. Only what the data center sends is supported: `GET` with keep-alive, and
//! responses with `Content-Length`.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// Longest a server waits for a client's next request (whole head) before closing the
/// connection: an idle keep-alive client, or one that sends its head a byte at a time,
/// cannot hold a connection's thread and descriptor for ever. 60 s: longer than the
/// keep-alive idle time of browsers and load generators, as nginx's `client_header_timeout`.
pub const REQUEST_WAIT_MAX: Duration = Duration::from_secs(60);
/// Largest request or response head accepted; longer heads are rejected (431 / error).
pub const HEAD_MAX: usize = 8 * 1024;
/// Largest response body accepted by the client.
pub const BODY_MAX: usize = 16 * 1024 * 1024;
/// Most headers parsed.
const HEADERS_MAX: usize = 24;

/// Why an exchange failed.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// Socket error.
    #[error("i/o: {0}")]
    Io(#[from] io::Error),
    /// The peer closed the connection before a whole message.
    #[error("connection closed")]
    Closed,
    /// Not HTTP/1.x as this module speaks it.
    #[error("malformed message: {0}")]
    Malformed(&'static str),
    /// A head or body over the limits.
    #[error("message too large")]
    TooLarge,
}

/// A request head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// Method.
    pub method: String,
    /// Path and query.
    pub path: String,
    /// Value of `X-Ulnet-Tier`, if present (which tier's work the sender asks for).
    pub tier: Option<String>,
    /// The client keeps the connection open.
    pub keep_alive: bool,
}

/// A response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// Status code.
    pub status: u16,
    /// Value of `X-Cache`, if present.
    pub cache: Option<String>,
    /// Body.
    pub body: Vec<u8>,
    /// The server keeps the connection open.
    pub keep_alive: bool,
}

/// One side of a connection with its read buffer.
pub struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
    /// Bytes of `buf` holding data not yet consumed.
    filled: usize,
}

impl Conn {
    /// Wraps a connected stream (sets `TCP_NODELAY`: every message is one small write).
    pub fn new(stream: TcpStream) -> io::Result<Conn> {
        stream.set_nodelay(true)?;
        Ok(Conn { stream, buf: vec![0; HEAD_MAX], filled: 0 })
    }

    /// Connects to `addr`.
    pub fn connect(addr: SocketAddr, timeout: Duration) -> io::Result<Conn> {
        let s = TcpStream::connect_timeout(&addr, timeout)?;
        s.set_read_timeout(Some(Duration::from_secs(30)))?;
        Conn::new(s)
    }

    /// The stream (to set timeouts or shut down).
    pub fn stream(&self) -> &TcpStream {
        &self.stream
    }

    /// Reads until a whole head is buffered; returns its length, or `None` on a clean close
    /// between messages.
    fn fill_head(&mut self) -> Result<Option<usize>, HttpError> {
        loop {
            if let Some(end) = find_head_end(&self.buf[..self.filled]) {
                return Ok(Some(end));
            }
            if self.filled == self.buf.len() {
                return Err(HttpError::TooLarge);
            }
            let n = self.stream.read(&mut self.buf[self.filled..])?;
            if n == 0 {
                return if self.filled == 0 { Ok(None) } else { Err(HttpError::Closed) };
            }
            self.filled += n;
        }
    }

    fn consume(&mut self, n: usize) {
        self.buf.copy_within(n..self.filled, 0);
        self.filled -= n;
    }

    /// Reads exactly `len` body bytes (part may already be buffered).
    fn read_body(&mut self, len: usize) -> Result<Vec<u8>, HttpError> {
        if len > BODY_MAX {
            return Err(HttpError::TooLarge);
        }
        let mut body = Vec::with_capacity(len);
        let have = self.filled.min(len);
        body.extend_from_slice(&self.buf[..have]);
        self.consume(have);
        if body.len() < len {
            body.resize(len, 0);
            self.stream.read_exact(&mut body[have..]).map_err(|e| match e.kind() {
                io::ErrorKind::UnexpectedEof => HttpError::Closed,
                _ => HttpError::Io(e),
            })?;
        }
        Ok(body)
    }

    /// Reads the next request, waiting through read timeouts until `stop` is set or
    /// [`REQUEST_WAIT_MAX`] passes (then `Ok(None)`, as for a closed connection): servers
    /// set a read timeout so that a stopped server lets its idle clients go.
    pub fn next_request(&mut self, stop: &std::sync::atomic::AtomicBool) -> Result<Option<Request>, HttpError> {
        let since = Instant::now();
        loop {
            match self.read_request() {
                Err(HttpError::Io(e)) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                    if stop.load(std::sync::atomic::Ordering::Acquire) || since.elapsed() >= REQUEST_WAIT_MAX {
                        return Ok(None);
                    }
                }
                other => return other,
            }
        }
    }

    /// Reads the next request head (request bodies are read and dropped); `None` when the
    /// client closed the connection.
    pub fn read_request(&mut self) -> Result<Option<Request>, HttpError> {
        let Some(end) = self.fill_head()? else { return Ok(None) };
        let mut headers = [httparse::EMPTY_HEADER; HEADERS_MAX];
        let mut req = httparse::Request::new(&mut headers);
        match req.parse(&self.buf[..end]) {
            Ok(httparse::Status::Complete(_)) => {}
            _ => return Err(HttpError::Malformed("request head")),
        }
        let keep_default = req.version == Some(1);
        let mut out = Request {
            method: req.method.unwrap_or("").to_string(),
            path: req.path.unwrap_or("").to_string(),
            tier: None,
            keep_alive: keep_default,
        };
        let mut body_len = 0usize;
        for h in req.headers.iter() {
            if h.name.eq_ignore_ascii_case("x-ulnet-tier") {
                out.tier = std::str::from_utf8(h.value).ok().map(str::to_string);
            } else if h.name.eq_ignore_ascii_case("connection") {
                out.keep_alive = parse_keep_alive(h.value, keep_default);
            } else if h.name.eq_ignore_ascii_case("content-length") {
                body_len = parse_len(h.value)?;
            }
        }
        self.consume(end);
        if body_len > 0 {
            self.read_body(body_len)?;
        }
        Ok(Some(out))
    }

    /// Writes a response.
    pub fn write_response(
        &mut self,
        status: u16,
        cache: Option<&str>,
        body: &[u8],
        keep_alive: bool,
    ) -> io::Result<()> {
        let reason = match status {
            200 => "OK",
            400 => "Bad Request",
            404 => "Not Found",
            431 => "Request Header Fields Too Large",
            502 => "Bad Gateway",
            _ => "Error",
        };
        let mut head = format!("HTTP/1.1 {status} {reason}\r\nContent-Length: {}\r\n", body.len());
        if let Some(c) = cache {
            head.push_str(&format!("X-Cache: {c}\r\n"));
        }
        if !keep_alive {
            head.push_str("Connection: close\r\n");
        }
        head.push_str("\r\n");
        write_gather(&mut self.stream, &[head.as_bytes(), body])
    }

    /// Sends `GET path` (with `X-Ulnet-Tier: tier` if given) and reads the response.
    pub fn get(&mut self, path: &str, tier: Option<&str>) -> Result<Response, HttpError> {
        let mut head = format!("GET {path} HTTP/1.1\r\nHost: dc\r\n");
        if let Some(t) = tier {
            head.push_str(&format!("X-Ulnet-Tier: {t}\r\n"));
        }
        head.push_str("\r\n");
        self.stream.write_all(head.as_bytes())?;
        self.read_response()
    }

    fn read_response(&mut self) -> Result<Response, HttpError> {
        let end = self.fill_head()?.ok_or(HttpError::Closed)?;
        let mut headers = [httparse::EMPTY_HEADER; HEADERS_MAX];
        let mut resp = httparse::Response::new(&mut headers);
        match resp.parse(&self.buf[..end]) {
            Ok(httparse::Status::Complete(_)) => {}
            _ => return Err(HttpError::Malformed("response head")),
        }
        let keep_default = resp.version == Some(1);
        let status = resp.code.ok_or(HttpError::Malformed("status"))?;
        let (mut len, mut cache, mut keep_alive) = (None, None, keep_default);
        for h in resp.headers.iter() {
            if h.name.eq_ignore_ascii_case("content-length") {
                len = Some(parse_len(h.value)?);
            } else if h.name.eq_ignore_ascii_case("x-cache") || h.name.eq_ignore_ascii_case("x-cache-status") {
                cache = std::str::from_utf8(h.value).ok().map(str::to_string);
            } else if h.name.eq_ignore_ascii_case("connection") {
                keep_alive = parse_keep_alive(h.value, keep_default);
            }
        }
        self.consume(end);
        let len = len.ok_or(HttpError::Malformed("no Content-Length"))?;
        let body = self.read_body(len)?;
        Ok(Response { status, cache, body, keep_alive })
    }
}

fn parse_len(v: &[u8]) -> Result<usize, HttpError> {
    std::str::from_utf8(v).ok().and_then(|s| s.trim().parse().ok()).ok_or(HttpError::Malformed("Content-Length"))
}

fn parse_keep_alive(v: &[u8], default: bool) -> bool {
    let v = String::from_utf8_lossy(v).to_ascii_lowercase();
    if v.contains("close") {
        false
    } else if v.contains("keep-alive") {
        true
    } else {
        default
    }
}

fn find_head_end(b: &[u8]) -> Option<usize> {
    b.windows(4).position(|w| w == b"\r\n\r\n").map(|p| p + 4)
}

/// Writes all of a gather list with `writev`, one system call in the usual case.
fn write_gather(stream: &mut TcpStream, parts: &[&[u8]]) -> io::Result<()> {
    let total: usize = parts.iter().map(|p| p.len()).sum();
    let mut written = 0;
    while written < total {
        let mut skip = written;
        let mut slices = Vec::with_capacity(parts.len());
        for p in parts {
            if skip >= p.len() {
                skip -= p.len();
                continue;
            }
            slices.push(io::IoSlice::new(&p[skip..]));
            skip = 0;
        }
        let n = stream.write_vectored(&slices)?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        written += n;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn request_and_response_round_trip_with_keep_alive() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let mut c = Conn::new(l.accept().unwrap().0).unwrap();
            let mut seen = Vec::new();
            while let Some(r) = c.read_request().unwrap() {
                c.write_response(200, Some("HIT"), r.path.as_bytes(), true).unwrap();
                seen.push(r);
            }
            seen
        });
        let mut c = Conn::connect(addr, Duration::from_secs(1)).unwrap();
        for p in ["/0/s/1", "/0/d/2"] {
            let r = c.get(p, Some("app")).unwrap();
            assert_eq!((r.status, r.body.as_slice(), r.cache.as_deref()), (200, p.as_bytes(), Some("HIT")));
        }
        drop(c);
        let seen = server.join().unwrap();
        assert_eq!(seen.len(), 2);
        assert_eq!(seen[0].tier.as_deref(), Some("app"));
        assert!(seen[0].keep_alive);
    }
}
