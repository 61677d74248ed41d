//! Writes a file of the study's format ([`crate::format`]): the header, then a block each
//! time the records gathered reach [`BLOCK_BODY_TARGET`] bytes or [`TraceWriter::flush`]
//! is called, and the end block from [`TraceWriter::finish`]. It runs on one thread: the
//! recorder's writer thread for traces ([`crate::recorder`]), the caller's for snapshots.

use crate::format::{
    encode_record, BlockContext, BlockHeader, FileHeader, FileKind, Record, BLOCK_BODY_TARGET, BLOCK_FLAG_END,
};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Why a file could not be written.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// The file could not be created or written.
    #[error("writing {path}: {source} (check that the directory exists, is writable and has room)")]
    Io {
        /// The file.
        path: PathBuf,
        /// What the system said.
        #[source]
        source: std::io::Error,
    },
}

/// What a finished file holds.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct WriteSummary {
    /// Records written.
    pub records: u64,
    /// Blocks written, the end block included.
    pub blocks: u32,
    /// Bytes of the file.
    pub bytes: u64,
    /// Records lost to a full ring (traces only).
    pub dropped: u64,
}

/// A file being written.
pub struct TraceWriter<W: Write> {
    out: W,
    path: PathBuf,
    body: Vec<u8>,
    context: BlockContext,
    count: u32,
    summary: WriteSummary,
}

impl TraceWriter<std::io::BufWriter<std::fs::File>> {
    /// Creates `path` and writes the header of a file of `kind` started now.
    pub fn create(path: &Path, kind: FileKind, start_mono_ns: u64) -> Result<Self, WriteError> {
        let file = std::fs::File::create(path).map_err(|source| WriteError::Io { path: path.into(), source })?;
        Self::new(std::io::BufWriter::with_capacity(1 << 20, file), path, kind, start_mono_ns)
    }
}

impl<W: Write> TraceWriter<W> {
    /// Writes the header of a file of `kind` to `out`; `path` names it in errors.
    pub fn new(mut out: W, path: &Path, kind: FileKind, start_mono_ns: u64) -> Result<Self, WriteError> {
        let header = FileHeader::new(kind, crate::clock::real_ns(), start_mono_ns);
        out.write_all(&header.encode()).map_err(|source| WriteError::Io { path: path.into(), source })?;
        Ok(TraceWriter {
            out,
            path: path.into(),
            body: Vec::with_capacity(BLOCK_BODY_TARGET + 4096),
            context: BlockContext::default(),
            count: 0,
            summary: WriteSummary { bytes: crate::format::FILE_HEADER_LEN as u64, ..Default::default() },
        })
    }

    /// Adds a record; writes the block when it is full. `dropped_total` is the count of
    /// records lost so far, carried in the block header.
    pub fn push(&mut self, record: &Record, dropped_total: u64) -> Result<(), WriteError> {
        encode_record(&mut self.context, record, &mut self.body);
        self.count += 1;
        if self.body.len() >= BLOCK_BODY_TARGET {
            self.write_block(0, dropped_total)?;
        }
        Ok(())
    }

    /// Writes the records gathered so far as a block and hands the bytes to the system.
    pub fn flush(&mut self, dropped_total: u64) -> Result<(), WriteError> {
        if self.count > 0 {
            self.write_block(0, dropped_total)?;
        }
        self.out.flush().map_err(|source| WriteError::Io { path: self.path.clone(), source })
    }

    /// Writes what is left and the end block; returns what the file holds.
    pub fn finish(mut self, dropped_total: u64) -> Result<WriteSummary, WriteError> {
        self.write_block(BLOCK_FLAG_END, dropped_total)?;
        self.out.flush().map_err(|source| WriteError::Io { path: self.path.clone(), source })?;
        self.summary.dropped = dropped_total;
        Ok(self.summary)
    }

    /// The records written or gathered so far.
    pub fn records(&self) -> u64 {
        self.summary.records + u64::from(self.count)
    }

    fn write_block(&mut self, flags: u16, dropped_total: u64) -> Result<(), WriteError> {
        let header = BlockHeader {
            flags,
            sequence: self.summary.blocks,
            record_count: self.count,
            body_len: self.body.len() as u32,
            dropped_total,
        };
        let mut block = Vec::with_capacity(crate::format::BLOCK_HEADER_LEN + self.body.len());
        header.encode_with(&self.body, &mut block);
        self.out.write_all(&block).map_err(|source| WriteError::Io { path: self.path.clone(), source })?;
        self.summary.records += u64::from(self.count);
        self.summary.blocks += 1;
        self.summary.bytes += block.len() as u64;
        self.body.clear();
        self.count = 0;
        self.context = BlockContext::default();
        Ok(())
    }
}
