//! The UDP transport's wire format: one datagram is one packet.
//!
//! ```text
//!  common header (16 bytes)
//!  0      2        3      4                8               12              16
//!  +------+--------+------+----------------+---------------+---------------+
//!  | "uU" | version| kind | crc32c         | conn_id       | body_len      |
//!  +------+--------+------+----------------+---------------+---------------+
//!  crc32c covers every byte but itself (magic, version, kind, conn_id, body_len, body),
//!  taken in this order: bytes from offset DATA_PREFIX_LEN on (a DATA packet's records;
//!  nothing in shorter packets), then bytes 0..4, then bytes 8..DATA_PREFIX_LEN. So a
//!  sender checksums each record once, as it copies it into its send slot, and at every
//!  (re)transmission only the prefix whose ack block changed. After the handshake it is
//!  seeded with the session salt (derived from the cluster secret, both nonces, both
//!  connection ids and both node ids), so a packet from a stranger or an older session
//!  fails it. conn_id is the *receiver's* id.
//!
//!  HELLO      client_nonce[16] client_id u32 window u32 datagram_max u32 flags u32 credit u32
//!             client_node u32
//!  CHALLENGE  server_nonce[16] server_id u32 window u32 datagram_max u32 flags u32 credit u32
//!             mac[32] server_node u32
//!  PROOF      mac[32]
//!  READY      (empty)
//!  DATA       seq u64 | flags u32 | grant u32 | ack block | records...
//!  ACK        ack block | flags u32 | grant u32
//!  ack block  cum_ack u64 | credit_bytes u64 | credit_seq u64 | sack [u64; 4]
//!  record     data_len u32 | message_len u32 | offset u32 | data_len bytes
//! ```
//!
//! Append-only (STYLE §11): kinds and flags keep their numbers forever; a new field goes at
//! the end of a body and older receivers ignore bytes past the fields they know only where
//! a body says so (`body_len`). Version history:
//! - 1 — first version.
//! - 2 — the checksum takes a packet's bytes from `DATA_PREFIX_LEN` on first (see above;
//!   v1 took them in wire order), so that records are checksummed once as they are copied.
//! - 3 — node ids appended to HELLO and CHALLENGE and covered by the handshake MACs and the
//!   session salt (as in the TCP and shared-memory v2 handshakes).
//! - 4 — the word after `flags` in DATA and ACK (zero until v3) carries the sender's
//!   *grant*: the credit window it gives its peer now (its share of the receive budget),
//!   which the peer's fill-ahead bound follows.

/// Protocol version spoken; the handshake refuses any other.
pub const VERSION: u8 = 4;
/// First two bytes of every packet.
pub const MAGIC: [u8; 2] = *b"uU";
/// Bytes of the common header.
pub const HEADER_LEN: usize = 16;
/// Words of the selective-ack bitmap: 256 packets after the cumulative ack, as many as
/// the largest default window, so every hole in flight is visible to the sender.
pub const SACK_WORDS: usize = 4;
/// Packets the selective-ack bitmap covers.
pub const SACK_RANGE: u64 = 64 * SACK_WORDS as u64;
/// Bytes of an ack block.
pub const ACK_BLOCK_LEN: usize = 24 + 8 * SACK_WORDS;
/// Bytes before the records of a DATA packet (common header, seq, flags, ack block).
pub const DATA_PREFIX_LEN: usize = HEADER_LEN + 16 + ACK_BLOCK_LEN;
/// Offset of the ack block in a DATA packet.
pub const DATA_ACK_OFFSET: usize = HEADER_LEN + 16;
/// Offset of the grant word in a DATA packet (after seq and flags).
const DATA_GRANT_OFFSET: usize = HEADER_LEN + 12;
/// Bytes of a record header.
pub const RECORD_HEADER_LEN: usize = 12;
/// Bytes of an ACK packet.
pub const ACK_PACKET_LEN: usize = HEADER_LEN + ACK_BLOCK_LEN + 8;
/// Bytes of the connection parameters ([`Hello`] without its node id) that open HELLO
/// and CHALLENGE bodies.
pub const HELLO_FIELDS_LEN: usize = 36;
/// Bytes of a HELLO body: the parameters, then the node id.
pub const HELLO_BODY_LEN: usize = HELLO_FIELDS_LEN + 4;
/// Where the server's MAC starts in a CHALLENGE body.
pub const CHALLENGE_MAC_AT: usize = HELLO_FIELDS_LEN;
/// Bytes of a CHALLENGE body: the parameters, the MAC, then the node id.
pub const CHALLENGE_BODY_LEN: usize = HELLO_FIELDS_LEN + 32 + 4;
/// Bytes of a PROOF body.
pub const PROOF_BODY_LEN: usize = 32;
/// Largest message the UDP transport carries (64 MiB).
pub const MESSAGE_MAX: u64 = 64 << 20;
/// Smallest datagram a peer may announce (an IPv4 minimum reassembly size minus headers).
pub const DATAGRAM_MIN: usize = 548;
/// Largest datagram UDP over IPv4 can carry.
pub const DATAGRAM_LIMIT: usize = 65_507;

const _: () = assert!(DATA_PREFIX_LEN + RECORD_HEADER_LEN < DATAGRAM_MIN, "a record fits the smallest datagram");

/// Packet kinds. Discriminants are part of the wire format: never renumber or reuse.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// Client → server: opens a connection.
    Hello = 1,
    /// Server → client: its nonce and id, and its proof of the secret.
    Challenge = 2,
    /// Client → server: the client's proof of the secret.
    Proof = 3,
    /// Server → client: the proof was accepted; data may flow.
    Ready = 4,
    /// Sequenced data (records), with a piggybacked ack block.
    Data = 5,
    /// A standalone ack block (also keep-alive probe and window update).
    Ack = 6,
}

impl Kind {
    fn from_u8(b: u8) -> Option<Kind> {
        Some(match b {
            1 => Kind::Hello,
            2 => Kind::Challenge,
            3 => Kind::Proof,
            4 => Kind::Ready,
            5 => Kind::Data,
            6 => Kind::Ack,
            _ => return None,
        })
    }

    /// Packets of this kind are checksummed with the session salt.
    pub fn is_session(self) -> bool {
        matches!(self, Kind::Ready | Kind::Data | Kind::Ack)
    }
}

/// DATA flag: the sender closes; no data follows this packet.
pub const DATA_FIN: u32 = 1;
/// ACK flag: the sender asks for an ack at once (keep-alive, credit probe).
pub const ACK_REQUESTED: u32 = 1;
/// HELLO/CHALLENGE flag: the sender enforces credit-based flow control.
pub const HELLO_FLOW_CONTROL: u32 = 1;

/// Why a datagram was refused before it touched any state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// Shorter than its header or than the length it declares.
    #[error("truncated packet")]
    Truncated,
    /// Not a ulnet UDP packet, or fields out of range.
    #[error("malformed packet: {0}")]
    Malformed(&'static str),
    /// Another protocol version.
    #[error("protocol version {0}, we speak {VERSION}")]
    Version(u8),
    /// The checksum does not match (corruption, or not of this session).
    #[error("bad checksum")]
    Checksum,
}

/// The decoded common header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// What the body is.
    pub kind: Kind,
    /// The receiver's connection id (0 in HELLO).
    pub conn_id: u32,
    /// Bytes after the header.
    pub body_len: u32,
}

#[inline(always)]
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

#[inline(always)]
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Parses and checks the common header: magic, version, kind, and that the datagram is
/// exactly as long as it says. Does not check the checksum (see [`verify_checksum`]).
pub fn parse_header(b: &[u8]) -> Result<Header, WireError> {
    if b.len() < HEADER_LEN {
        return Err(WireError::Truncated);
    }
    if b[..2] != MAGIC {
        return Err(WireError::Malformed("bad magic"));
    }
    if b[2] != VERSION {
        return Err(WireError::Version(b[2]));
    }
    let kind = Kind::from_u8(b[3]).ok_or(WireError::Malformed("unknown kind"))?;
    let body_len = u32_at(b, 12);
    if (b.len() - HEADER_LEN) < body_len as usize {
        return Err(WireError::Truncated);
    }
    if (b.len() - HEADER_LEN) > body_len as usize {
        return Err(WireError::Malformed("trailing bytes"));
    }
    let min = match kind {
        Kind::Hello => HELLO_BODY_LEN,
        Kind::Challenge => CHALLENGE_BODY_LEN,
        Kind::Proof => PROOF_BODY_LEN,
        Kind::Ready => 0,
        Kind::Data => DATA_PREFIX_LEN - HEADER_LEN,
        Kind::Ack => ACK_PACKET_LEN - HEADER_LEN,
    };
    if (body_len as usize) < min {
        return Err(WireError::Truncated);
    }
    Ok(Header { kind, conn_id: u32_at(b, 8), body_len })
}

/// CRC32C of `data` continued from `crc` (the value [`crc32c::crc32c_append`] computes),
/// with `crc-fast`: it folds with VPCLMULQDQ where the CPU has it, 4x the crc32c crate's
/// SSE 4.2 path on 64 KiB datagrams, and falls back to that path elsewhere.
#[inline]
pub fn crc32c_append(crc: u32, data: &[u8]) -> u32 {
    let mut digest = crc_fast::Digest::new_with_init_state(crc_fast::CrcAlgorithm::Crc32Iscsi, u64::from(!crc));
    digest.update(data);
    digest.finalize() as u32
}

/// Where a packet's checksum starts: bytes from here on are taken first (see the module doc).
#[inline]
fn checksum_split(b: &[u8]) -> usize {
    b.len().min(DATA_PREFIX_LEN)
}

/// The checksum of the bytes from `DATA_PREFIX_LEN` on (a DATA packet's records),
/// continued from `salt`: the first part of [`checksum`], which a sender computes as it
/// writes the records (continuing it with [`crc32c_append`] record by record).
#[inline]
pub fn records_checksum(records: &[u8], salt: u32) -> u32 {
    crc32c_append(salt, records)
}

/// The checksum of a packet: CRC32C, continued from `salt`, of every byte but the
/// checksum field itself, in the order of the module doc.
#[inline]
pub fn checksum(b: &[u8], salt: u32) -> u32 {
    checksum_with_records(b, records_checksum(&b[checksum_split(b)..], salt))
}

/// [`checksum`] of `b` given the [`records_checksum`] of its bytes from `DATA_PREFIX_LEN` on.
#[inline]
fn checksum_with_records(b: &[u8], records_crc: u32) -> u32 {
    let split = checksum_split(b);
    crc32c_append(crc32c_append(records_crc, &b[..4]), &b[8..split])
}

fn write_header(b: &mut [u8], kind: Kind, conn_id: u32) {
    debug_assert!(b.len() >= HEADER_LEN);
    b[..2].copy_from_slice(&MAGIC);
    b[2] = VERSION;
    b[3] = kind as u8;
    b[8..12].copy_from_slice(&conn_id.to_le_bytes());
    let body_len = (b.len() - HEADER_LEN) as u32;
    b[12..16].copy_from_slice(&body_len.to_le_bytes());
}

/// Writes the common header and the checksum of the finished packet `b`.
#[inline]
pub fn finish(b: &mut [u8], kind: Kind, conn_id: u32, salt: u32) {
    write_header(b, kind, conn_id);
    let crc = checksum(b, salt);
    b[4..8].copy_from_slice(&crc.to_le_bytes());
}

/// Like [`finish`], for a packet whose bytes from `DATA_PREFIX_LEN` on were already
/// checksummed into `records_crc` (by [`records_checksum`] with the same salt): only the
/// prefix is read.
#[inline]
pub fn finish_with_records_checksum(b: &mut [u8], kind: Kind, conn_id: u32, records_crc: u32) {
    write_header(b, kind, conn_id);
    let crc = checksum_with_records(b, records_crc);
    b[4..8].copy_from_slice(&crc.to_le_bytes());
}

/// Whether the packet's checksum matches with `salt`.
#[inline]
pub fn verify_checksum(b: &[u8], salt: u32) -> bool {
    u32_at(b, 4) == checksum(b, salt)
}

/// Cumulative and selective acknowledgement plus the receiver's credit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AckBlock {
    /// Every packet up to and including this sequence number arrived.
    pub cum_ack: u64,
    /// Bit i (bit i % 64 of word i / 64) set: packet `cum_ack + 2 + i` arrived too.
    pub sack: [u64; SACK_WORDS],
    /// The sender may send data up to this stream byte (flow control).
    pub credit_bytes: u64,
    /// The sender may send packets up to this sequence number (receive slots).
    pub credit_seq: u64,
    /// Bytes of credit the receiver grants at a time (`credit_bytes` less what it has not
    /// yet consumed, when nothing is buffered): its share of its receive budget. Carried in
    /// the packet's word after `flags`, not in the block's bytes.
    pub grant: u32,
}

impl AckBlock {
    /// Writes the block at `at` (not [`AckBlock::grant`], which the packet places).
    #[inline]
    pub fn write(&self, b: &mut [u8], at: usize) {
        b[at..at + 8].copy_from_slice(&self.cum_ack.to_le_bytes());
        b[at + 8..at + 16].copy_from_slice(&self.credit_bytes.to_le_bytes());
        b[at + 16..at + 24].copy_from_slice(&self.credit_seq.to_le_bytes());
        for (i, w) in self.sack.iter().enumerate() {
            b[at + 24 + 8 * i..at + 32 + 8 * i].copy_from_slice(&w.to_le_bytes());
        }
    }

    /// Reads the block at `at` (the caller checked the length); [`AckBlock::grant`] is 0
    /// until the packet's reader sets it.
    #[inline]
    pub fn read(b: &[u8], at: usize) -> Self {
        let mut sack = [0u64; SACK_WORDS];
        for (i, w) in sack.iter_mut().enumerate() {
            *w = u64_at(b, at + 24 + 8 * i);
        }
        Self { cum_ack: u64_at(b, at), credit_bytes: u64_at(b, at + 8), credit_seq: u64_at(b, at + 16), sack, grant: 0 }
    }
}

/// The fixed part of a DATA packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DataPrefix {
    /// Packet sequence number (from 1).
    pub seq: u64,
    /// [`DATA_FIN`] or 0.
    pub flags: u32,
    /// The piggybacked ack.
    pub ack: AckBlock,
}

/// Reads the prefix of a DATA packet whose header passed [`parse_header`].
pub fn read_data_prefix(b: &[u8]) -> Result<DataPrefix, WireError> {
    let flags = u32_at(b, HEADER_LEN + 8);
    if flags & !DATA_FIN != 0 {
        return Err(WireError::Malformed("unknown data flags"));
    }
    let seq = u64_at(b, HEADER_LEN);
    if seq == 0 {
        return Err(WireError::Malformed("sequence number 0"));
    }
    let mut ack = AckBlock::read(b, DATA_ACK_OFFSET);
    ack.grant = u32_at(b, DATA_GRANT_OFFSET);
    Ok(DataPrefix { seq, flags, ack })
}

/// Writes the prefix of a DATA packet (the ack block and grant are filled in at
/// transmission, by [`write_data_ack`]).
pub fn write_data_prefix(b: &mut [u8], seq: u64, flags: u32) {
    b[HEADER_LEN..HEADER_LEN + 8].copy_from_slice(&seq.to_le_bytes());
    b[HEADER_LEN + 8..HEADER_LEN + 12].copy_from_slice(&flags.to_le_bytes());
    b[DATA_GRANT_OFFSET..DATA_GRANT_OFFSET + 4].copy_from_slice(&0u32.to_le_bytes());
}

/// Writes the piggybacked ack block and grant into a DATA packet's prefix.
#[inline]
pub fn write_data_ack(b: &mut [u8], ack: &AckBlock) {
    ack.write(b, DATA_ACK_OFFSET);
    b[DATA_GRANT_OFFSET..DATA_GRANT_OFFSET + 4].copy_from_slice(&ack.grant.to_le_bytes());
}

/// Reads an ACK packet's block and flags.
pub fn read_ack(b: &[u8]) -> Result<(AckBlock, u32), WireError> {
    let flags = u32_at(b, HEADER_LEN + ACK_BLOCK_LEN);
    if flags & !ACK_REQUESTED != 0 {
        return Err(WireError::Malformed("unknown ack flags"));
    }
    let mut ack = AckBlock::read(b, HEADER_LEN);
    ack.grant = u32_at(b, HEADER_LEN + ACK_BLOCK_LEN + 4);
    Ok((ack, flags))
}

/// Encodes an ACK packet into `out`; returns its length.
pub fn write_ack(out: &mut [u8], conn_id: u32, salt: u32, ack: &AckBlock, flags: u32) -> usize {
    let b = &mut out[..ACK_PACKET_LEN];
    ack.write(b, HEADER_LEN);
    b[HEADER_LEN + ACK_BLOCK_LEN..HEADER_LEN + ACK_BLOCK_LEN + 4].copy_from_slice(&flags.to_le_bytes());
    b[HEADER_LEN + ACK_BLOCK_LEN + 4..].copy_from_slice(&ack.grant.to_le_bytes());
    finish(b, Kind::Ack, conn_id, salt);
    ACK_PACKET_LEN
}

/// One record of a DATA packet: a whole message or a fragment of one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Record<'a> {
    /// The bytes.
    pub data: &'a [u8],
    /// Length of the whole message.
    pub message_len: u64,
    /// Offset of `data` in the message.
    pub offset: u64,
}

/// Reads the record at `at` of a packet `b`; returns it and where the next one starts.
#[inline]
pub fn read_record(b: &[u8], at: usize) -> Result<(Record<'_>, usize), WireError> {
    if b.len() - at < RECORD_HEADER_LEN {
        return Err(WireError::Truncated);
    }
    let data_len = u32_at(b, at) as usize;
    let message_len = u64::from(u32_at(b, at + 4));
    let offset = u64::from(u32_at(b, at + 8));
    let start = at + RECORD_HEADER_LEN;
    if b.len() - start < data_len {
        return Err(WireError::Truncated);
    }
    if message_len > MESSAGE_MAX || offset + data_len as u64 > message_len || (data_len == 0 && message_len != 0) {
        return Err(WireError::Malformed("record length or offset out of range"));
    }
    Ok((Record { data: &b[start..start + data_len], message_len, offset }, start + data_len))
}

/// Checks every record of a DATA packet (so that delivery later can trust them) and
/// returns the payload bytes they carry.
pub fn validate_records(b: &[u8]) -> Result<usize, WireError> {
    let mut at = DATA_PREFIX_LEN;
    let mut bytes = 0;
    while at < b.len() {
        let (r, next) = read_record(b, at)?;
        bytes += r.data.len();
        at = next;
    }
    Ok(bytes)
}

/// Writes a record header at `at`.
#[inline]
pub fn write_record_header(b: &mut [u8], at: usize, data_len: u32, message_len: u32, offset: u32) {
    b[at..at + 4].copy_from_slice(&data_len.to_le_bytes());
    b[at + 4..at + 8].copy_from_slice(&message_len.to_le_bytes());
    b[at + 8..at + 12].copy_from_slice(&offset.to_le_bytes());
}

/// The fields of HELLO and the first part of CHALLENGE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hello {
    /// The sender's fresh nonce.
    pub nonce: [u8; 16],
    /// The id the sender wants in the packets it receives.
    pub conn_id: u32,
    /// Receive slots of the sender (packets in flight towards it).
    pub window: u32,
    /// Largest datagram the sender receives.
    pub datagram_max: u32,
    /// [`HELLO_FLOW_CONTROL`].
    pub flags: u32,
    /// Stream bytes the sender buffers for its peer (its initial credit).
    pub credit: u32,
    /// The sender's node id (`NodeId::UNKNOWN` when it has none).
    pub node: u32,
}

impl Hello {
    /// Writes the body of a HELLO (`kind` Hello) or CHALLENGE (`kind` Challenge, whose
    /// MAC the caller writes at [`CHALLENGE_MAC_AT`]) starting at `at`.
    pub fn write_body(&self, kind: Kind, b: &mut [u8], at: usize) {
        self.write(b, at);
        let node_at = at + Self::node_offset(kind);
        b[node_at..node_at + 4].copy_from_slice(&self.node.to_le_bytes());
    }

    /// Reads and range-checks the body of a HELLO or CHALLENGE starting at `at`.
    pub fn read_body(kind: Kind, b: &[u8], at: usize) -> Result<Self, WireError> {
        let mut h = Self::read(b, at)?;
        h.node = u32_at(b, at + Self::node_offset(kind));
        Ok(h)
    }

    /// Where the node id sits in a body of `kind`: appended after the fields of version 1.
    fn node_offset(kind: Kind) -> usize {
        match kind {
            Kind::Challenge => CHALLENGE_MAC_AT + 32,
            _ => HELLO_FIELDS_LEN,
        }
    }

    /// Writes the [`HELLO_FIELDS_LEN`] bytes of parameters (all but the node id) at `at`.
    pub fn write(&self, b: &mut [u8], at: usize) {
        b[at..at + 16].copy_from_slice(&self.nonce);
        b[at + 16..at + 20].copy_from_slice(&self.conn_id.to_le_bytes());
        b[at + 20..at + 24].copy_from_slice(&self.window.to_le_bytes());
        b[at + 24..at + 28].copy_from_slice(&self.datagram_max.to_le_bytes());
        b[at + 28..at + 32].copy_from_slice(&self.flags.to_le_bytes());
        b[at + 32..at + 36].copy_from_slice(&self.credit.to_le_bytes());
    }

    /// Reads and range-checks the [`HELLO_FIELDS_LEN`] bytes of parameters at `at` (the
    /// node id reads as 0; see [`Hello::read_body`]).
    fn read(b: &[u8], at: usize) -> Result<Self, WireError> {
        let h = Self {
            nonce: b[at..at + 16].try_into().expect("16 bytes"),
            conn_id: u32_at(b, at + 16),
            window: u32_at(b, at + 20),
            datagram_max: u32_at(b, at + 24),
            flags: u32_at(b, at + 28),
            credit: u32_at(b, at + 32),
            node: 0,
        };
        if h.conn_id == 0 || h.window == 0 || h.window > 1 << 16 {
            return Err(WireError::Malformed("connection id or window out of range"));
        }
        if !(DATAGRAM_MIN as u32..=DATAGRAM_LIMIT as u32).contains(&h.datagram_max) {
            return Err(WireError::Malformed("datagram size out of range"));
        }
        if (h.credit as usize) < 2 * DATAGRAM_MIN {
            return Err(WireError::Malformed("credit smaller than two minimal datagrams"));
        }
        if h.flags & !HELLO_FLOW_CONTROL != 0 {
            return Err(WireError::Malformed("unknown hello flags"));
        }
        Ok(h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn data_packet(seq: u64, records: &[(Vec<u8>, u32, u32)]) -> Vec<u8> {
        let mut b = vec![0u8; DATA_PREFIX_LEN];
        write_data_prefix(&mut b, seq, 0);
        for (data, message_len, offset) in records {
            let at = b.len();
            b.resize(at + RECORD_HEADER_LEN, 0);
            write_record_header(&mut b, at, data.len() as u32, *message_len, *offset);
            b.extend_from_slice(data);
        }
        write_data_ack(
            &mut b,
            &AckBlock { cum_ack: 7, sack: [5, 0, 1 << 63, 2], credit_bytes: 1000, credit_seq: 9, grant: 1 << 21 },
        );
        finish(&mut b, Kind::Data, 42, 0xfeed);
        b
    }

    proptest! {
        #[test]
        fn data_packets_round_trip(seq in 1u64.., records in proptest::collection::vec(
            (proptest::collection::vec(any::<u8>(), 1..200), 0u32..1000), 0..8)) {
            let recs: Vec<(Vec<u8>, u32, u32)> = records.into_iter().map(|(d, extra)| {
                let len = d.len() as u32;
                (d, len + extra, extra)
            }).collect();
            let b = data_packet(seq, &recs);
            let h = parse_header(&b).unwrap();
            prop_assert_eq!((h.kind, h.conn_id), (Kind::Data, 42));
            prop_assert!(verify_checksum(&b, 0xfeed));
            prop_assert!(!verify_checksum(&b, 0xfeee));
            let p = read_data_prefix(&b).unwrap();
            prop_assert_eq!(p.seq, seq);
            prop_assert_eq!(p.ack.cum_ack, 7);
            prop_assert_eq!(p.ack.sack, [5, 0, 1 << 63, 2]);
            prop_assert_eq!((p.ack.credit_bytes, p.ack.credit_seq, p.ack.grant), (1000, 9, 1 << 21));
            let total: usize = recs.iter().map(|r| r.0.len()).sum();
            prop_assert_eq!(validate_records(&b).unwrap(), total);
            let mut at = DATA_PREFIX_LEN;
            for (data, message_len, offset) in &recs {
                let (r, next) = read_record(&b, at).unwrap();
                prop_assert_eq!(r.data, &data[..]);
                prop_assert_eq!((r.message_len, r.offset), (u64::from(*message_len), u64::from(*offset)));
                at = next;
            }
        }

        /// The fast CRC is CRC32C, continued from any value, on any length and alignment.
        #[test]
        fn fast_crc_is_crc32c(crc in any::<u32>(), skip in 0usize..64, data in proptest::collection::vec(any::<u8>(), 0..70_000)) {
            let data = &data[skip.min(data.len())..];
            prop_assert_eq!(crc32c_append(crc, data), crc32c::crc32c_append(crc, data));
        }

        /// A packet finished from the checksum of its records, computed record by record
        /// as a sender writes them, has the checksum `finish` gives it.
        #[test]
        fn checksum_from_records_matches_the_whole(seq in 1u64.., salt in any::<u32>(), records in proptest::collection::vec(
            proptest::collection::vec(any::<u8>(), 1..3000), 0..6)) {
            let mut b = vec![0u8; DATA_PREFIX_LEN];
            write_data_prefix(&mut b, seq, 0);
            let mut crc = records_checksum(&[], salt);
            for data in &records {
                let at = b.len();
                b.resize(at + RECORD_HEADER_LEN, 0);
                write_record_header(&mut b, at, data.len() as u32, data.len() as u32, 0);
                b.extend_from_slice(data);
                crc = crc32c_append(crc, &b[at..]);
            }
            let mut whole = b.clone();
            finish(&mut whole, Kind::Data, 9, salt);
            finish_with_records_checksum(&mut b, Kind::Data, 9, crc);
            prop_assert_eq!(&b, &whole);
            prop_assert!(verify_checksum(&b, salt));
        }

        /// The decoder never panics and never accepts bytes that are not a packet it could
        /// have written: random bytes, and valid packets cut short or with a flipped bit.
        #[test]
        fn decoder_survives_random_bytes(b in proptest::collection::vec(any::<u8>(), 0..300)) {
            if let Ok(h) = parse_header(&b) {
                let _ = verify_checksum(&b, 0);
                match h.kind {
                    Kind::Data => { let _ = read_data_prefix(&b); let _ = validate_records(&b); }
                    Kind::Ack => { let _ = read_ack(&b); }
                    Kind::Hello | Kind::Challenge => { let _ = Hello::read_body(h.kind, &b, HEADER_LEN); }
                    _ => {}
                }
            }
        }

        #[test]
        fn truncated_or_corrupted_packets_are_refused(cut in 0usize..200, flip in 0usize..2000) {
            let b = data_packet(3, &[(vec![1; 50], 50, 0), (vec![2; 60], 100, 40)]);
            let short = &b[..cut.min(b.len() - 1)];
            prop_assert!(parse_header(short).is_err());
            let mut c = b.clone();
            let bit = flip % (c.len() * 8);
            c[bit / 8] ^= 1 << (bit % 8);
            let accepted = parse_header(&c).is_ok() && verify_checksum(&c, 0xfeed);
            prop_assert!(!accepted, "a one-bit error must not pass header and checksum");
        }
    }

    #[test]
    fn ack_packets_round_trip_with_their_grant() {
        let ack = AckBlock { cum_ack: 11, sack: [1, 2, 3, 4], credit_bytes: 1 << 33, credit_seq: 300, grant: 2 << 20 };
        let mut out = [0u8; ACK_PACKET_LEN];
        let n = write_ack(&mut out, 5, 0xabc, &ack, ACK_REQUESTED);
        assert_eq!(n, ACK_PACKET_LEN);
        assert!(verify_checksum(&out, 0xabc));
        assert_eq!(read_ack(&out).unwrap(), (ack, ACK_REQUESTED));
    }

    #[test]
    fn records_beyond_the_message_are_malformed() {
        let b = data_packet(1, &[(vec![9; 10], 5, 0)]);
        assert!(matches!(validate_records(&b), Err(WireError::Malformed(_))));
        let b = data_packet(1, &[(vec![9; 10], u32::MAX, 0)]);
        assert!(matches!(validate_records(&b), Err(WireError::Malformed(_))));
    }
}
