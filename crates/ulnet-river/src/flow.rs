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

    /// Takes the records of `records` (whole records of `record_size` bytes) at the
    /// positions in `which`, in that order: what a partitioner hands each destination, so
    /// that every record is copied once, straight to where it is kept. The default takes
    /// them one by one through [`Sink::sink_records`]; sinks that copy override it.
    fn sink_gathered(&mut self, records: &[u8], record_size: usize, which: &[u32]) -> Result<(), RiverError> {
        for &i in which {
            let at = i as usize * record_size;
            self.sink_records(&records[at..at + record_size])?;
        }
        Ok(())
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
    fn sink_gathered(&mut self, records: &[u8], record_size: usize, which: &[u32]) -> Result<(), RiverError> {
        (**self).sink_gathered(records, record_size, which)
    }
    fn close(&mut self) -> Result<(), RiverError> {
        (**self).close()
    }
}

/// A sink that lends its own memory: a producer writes records straight into the space it
/// lends ([`SpaceSink::space`]) and counts them in ([`SpaceSink::commit`]), saving the copy
/// that [`Sink::sink_records`] makes. The sorted output goes to disk this way.
pub trait SpaceSink {
    /// Writable room for whole records (at least one), valid until the next call.
    fn space(&mut self) -> Result<&mut [u8], RiverError>;

    /// The first `bytes` of the last [`SpaceSink::space`] (whole records) are filled.
    fn commit(&mut self, bytes: usize) -> Result<(), RiverError>;

    /// Whether what is committed is read next by a device, not by a CPU (direct I/O): then
    /// the space is better filled with stores that bypass the cache, which need not fetch
    /// the lines they overwrite. No, unless a sink says so.
    fn bypass_cache(&self) -> bool {
        false
    }
}

/// Lends a staging area in front of any [`Sink`] (for sinks that own no memory to lend);
/// [`StagedSink::flush`] hands over what is staged.
pub struct StagedSink<'a, S: Sink + ?Sized> {
    sink: &'a mut S,
    staged: Box<[u8]>,
    len: usize,
    record_size: usize,
}

impl<'a, S: Sink + ?Sized> StagedSink<'a, S> {
    /// Stages up to `records` records of `record_size` bytes in front of `sink`.
    pub fn new(sink: &'a mut S, record_size: usize, records: usize) -> Self {
        StagedSink { sink, staged: vec![0u8; records.max(1) * record_size].into(), len: 0, record_size }
    }

    /// Hands what is staged to the sink.
    pub fn flush(&mut self) -> Result<(), RiverError> {
        if self.len > 0 {
            self.sink.sink_records(&self.staged[..self.len])?;
            self.len = 0;
        }
        Ok(())
    }
}

impl<S: Sink + ?Sized> SpaceSink for StagedSink<'_, S> {
    fn space(&mut self) -> Result<&mut [u8], RiverError> {
        if self.staged.len() - self.len < self.record_size {
            self.flush()?;
        }
        let room = (self.staged.len() - self.len) / self.record_size * self.record_size;
        Ok(&mut self.staged[self.len..self.len + room])
    }

    fn commit(&mut self, bytes: usize) -> Result<(), RiverError> {
        assert!(self.len + bytes <= self.staged.len(), "committed more than was lent");
        self.len += bytes;
        Ok(())
    }
}

/// Copies the records of `src` at the positions in `which` into `dst`, one after another
/// (`dst` holds exactly `which.len()` records). Records of the Sort Benchmark's 100 bytes
/// are copied with a fixed-size move the compiler inlines, instead of a call per record.
#[inline]
pub(crate) fn copy_gathered(dst: &mut [u8], src: &[u8], record_size: usize, which: &[u32]) {
    debug_assert_eq!(dst.len(), which.len() * record_size);
    if record_size == ulnet_sortbench::RECORD_SIZE {
        const RS: usize = ulnet_sortbench::RECORD_SIZE;
        for (d, &i) in dst.chunks_exact_mut(RS).zip(which) {
            let at = i as usize * RS;
            let s: &[u8; RS] = src[at..at + RS].try_into().expect("a whole record");
            let d: &mut [u8; RS] = d.try_into().expect("a whole record");
            *d = *s;
        }
    } else {
        for (d, &i) in dst.chunks_exact_mut(record_size).zip(which) {
            let at = i as usize * record_size;
            d.copy_from_slice(&src[at..at + record_size]);
        }
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
        if !records.len().is_multiple_of(self.record_size) {
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
