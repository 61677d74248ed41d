//! [`PartitionSink`]: routes each record to one of several sinks by a rule of the
//! application's (Millennium Sort partitions lexicographically by key).

use crate::error::RiverError;
use crate::flow::Sink;
use crate::pool::Buffer;

/// Chooses the sink of each record. Records are shown in stream order, so a rule may
/// count them (the sort breaks ties between equal keys by input position).
pub trait Partitioner {
    /// The index of the sink for `record`.
    fn partition(&mut self, record: &[u8]) -> usize;
}

impl<F: FnMut(&[u8]) -> usize> Partitioner for F {
    fn partition(&mut self, record: &[u8]) -> usize {
        self(record)
    }
}

/// A sink that sends each record to `sinks[partitioner.partition(record)]`, and closes
/// them all when closed. Each slice of records is routed in two steps: the partitioner
/// picks every record's destination first, then each destination takes its records in one
/// call ([`Sink::sink_gathered`]), copying each once, straight from the caller's buffer.
///
/// ```
/// use ulnet_river::{PartitionSink, Sink, VecSink};
///
/// let (mut low, mut high) = (Vec::new(), Vec::new());
/// {
///     let sinks: Vec<Box<dyn Sink + '_>> =
///         vec![Box::new(VecSink::new(&mut low, 2)), Box::new(VecSink::new(&mut high, 2))];
///     let mut p = PartitionSink::new(|r: &[u8]| usize::from(r[0] >= b'm'), sinks, 2);
///     p.sink_records(b"a1z2b3")?;
///     p.close()?;
/// }
/// assert_eq!((low, high), (b"a1b3".to_vec(), b"z2".to_vec()));
/// # Ok::<(), ulnet_river::RiverError>(())
/// ```
pub struct PartitionSink<'a, P: Partitioner> {
    partitioner: P,
    sinks: Vec<Box<dyn Sink + 'a>>,
    /// Positions of the records of the slice being routed, per destination (kept between
    /// calls so routing allocates nothing once they have grown).
    which: Vec<Vec<u32>>,
    record_size: usize,
    counts: Vec<u64>,
}

impl<'a, P: Partitioner> PartitionSink<'a, P> {
    /// The partitioner, to change its state between buffers.
    pub fn partitioner_mut(&mut self) -> &mut P {
        &mut self.partitioner
    }

    /// Routes records of `record_size` bytes to `sinks` by `partitioner`.
    pub fn new(partitioner: P, sinks: Vec<Box<dyn Sink + 'a>>, record_size: usize) -> Self {
        let counts = vec![0; sinks.len()];
        let which = (0..sinks.len()).map(|_| Vec::new()).collect();
        PartitionSink { partitioner, sinks, which, record_size, counts }
    }

    /// Records routed to each sink so far.
    pub fn counts(&self) -> &[u64] {
        &self.counts
    }
}

impl<P: Partitioner> Sink for PartitionSink<'_, P> {
    fn sink_records(&mut self, records: &[u8]) -> Result<(), RiverError> {
        if !records.len().is_multiple_of(self.record_size) {
            return Err(RiverError::PartialRecord { len: records.len(), record_size: self.record_size });
        }
        // Slices beyond 4 G records cannot be indexed by u32: route them in pieces.
        let most = (u32::MAX as usize) * self.record_size;
        if records.len() > most {
            let (head, tail) = records.split_at(most);
            self.sink_records(head)?;
            return self.sink_records(tail);
        }
        for w in &mut self.which {
            w.clear();
        }
        let n = self.sinks.len();
        for (i, record) in records.chunks_exact(self.record_size).enumerate() {
            let to = self.partitioner.partition(record);
            assert!(to < n, "partitioner chose sink {to} of {n}");
            self.which[to].push(i as u32);
        }
        for (to, which) in self.which.iter().enumerate() {
            if !which.is_empty() {
                self.counts[to] += which.len() as u64;
                self.sinks[to].sink_gathered(records, self.record_size, which)?;
            }
        }
        Ok(())
    }

    fn sink_buffer(&mut self, buffer: Buffer) -> Result<(), RiverError> {
        self.sink_records(buffer.as_slice())
    }

    fn close(&mut self) -> Result<(), RiverError> {
        for sink in &mut self.sinks {
            sink.close()?;
        }
        Ok(())
    }
}
