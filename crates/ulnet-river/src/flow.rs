//! The two primitives everything else composes: a [`Source`] produces data, a [`Sink`]
//! consumes it. Data flows as [`Buffer`]s of whole records (buffer granularity) or as
//! slices of whole records (record granularity).

use crate::error::RiverError;
use crate::pool::Buffer;

/// Something that consumes records: a file, a network peer, a partitioner, a queue.
///
/// Record granularity is [`Sink::sink_records`] (the sink copies what it keeps), buffer
/// granularity is [`Sink::sink_buffer`] (ownership passes, no copy). [`Sink::close`] is
/// the explicit end of stream: after it the sink takes nothing more, and a sink that
/// forwards to others closes them in turn.
pub trait Sink {
    /// Takes one or more whole records (`records.len()` is a multiple of the record size).
    fn sink_records(&mut self, records: &[u8]) -> Result<(), RiverError>;

    /// Takes a buffer of whole records. The default copies them through
    /// [`Sink::sink_records`]; sinks that can keep the buffer itself override it.
    fn sink_buffer(&mut self, buffer: Buffer) -> Result<(), RiverError> {
        self.sink_records(buffer.as_slice())
    }

    /// End of stream: flushes what is staged and passes the end on.
    fn close(&mut self) -> Result<(), RiverError>;
}

impl<S: Sink + ?Sized> Sink for Box<S> {
    fn sink_records(&mut self, records: &[u8]) -> Result<(), RiverError> {
        (**self).sink_records(records)
    }
    fn sink_buffer(&mut self, buffer: Buffer) -> Result<(), RiverError> {
        (**self).sink_buffer(buffer)
    }
    fn close(&mut self) -> Result<(), RiverError> {
        (**self).close()
    }
}

/// Something that produces buffers of whole records until it runs dry.
pub trait Source {
    /// The next buffer, waiting for it if need be; `None` once the source has run dry (it
    /// has delivered everything and will deliver nothing more).
    fn next_buffer(&mut self) -> Result<Option<Buffer>, RiverError>;
}

/// Pumps everything `source` produces into `sink`, then closes the sink. Returns the
/// number of bytes moved.
///
/// ```
/// use ulnet_river::{pump, Buffer, Sink, Source, RiverError};
///
/// struct Two(u8);
/// impl Source for Two {
///     fn next_buffer(&mut self) -> Result<Option<Buffer>, RiverError> {
///         self.0 += 1;
///         Ok((self.0 <= 2).then(|| Buffer::from_slice(&[self.0; 4])))
///     }
/// }
/// let mut out = Vec::new();
/// let moved = pump(&mut Two(0), &mut ulnet_river::VecSink::new(&mut out, 4))?;
/// assert_eq!((moved, out), (8, vec![1, 1, 1, 1, 2, 2, 2, 2]));
/// # Ok::<(), RiverError>(())
/// ```
pub fn pump(source: &mut dyn Source, sink: &mut dyn Sink) -> Result<u64, RiverError> {
    let mut moved = 0u64;
    while let Some(buffer) = source.next_buffer()? {
        moved += buffer.len() as u64;
        sink.sink_buffer(buffer)?;
    }
    sink.close()?;
    Ok(moved)
}

/// A sink that appends records to a `Vec<u8>` (for tests and small in-memory uses).
#[derive(Debug)]
pub struct VecSink<'a> {
    out: &'a mut Vec<u8>,
    record_size: usize,
    closed: bool,
}

impl<'a> VecSink<'a> {
    /// Appends to `out`, checking that records are whole.
    pub fn new(out: &'a mut Vec<u8>, record_size: usize) -> Self {
        VecSink { out, record_size, closed: false }
    }

    /// Whether the stream has ended.
    pub fn is_closed(&self) -> bool {
        self.closed
    }
}

impl Sink for VecSink<'_> {
    fn sink_records(&mut self, records: &[u8]) -> Result<(), RiverError> {
        if self.closed {
            return Err(RiverError::Closed);
        }
        if records.len() % self.record_size != 0 {
            return Err(RiverError::PartialRecord { len: records.len(), record_size: self.record_size });
        }
        self.out.extend_from_slice(records);
        Ok(())
    }

    fn close(&mut self) -> Result<(), RiverError> {
        self.closed = true;
        Ok(())
    }
}
