//! A minimal reader for `perf.data` files (`PERFILE2`): the attrs and the records of the data
//! section. Used to check the record parser against files recorded by real kernels, and
//! usable by tools importing perf.data into a session.
//!
//! Layout: `tools/perf/util/header.h` (`struct perf_file_header`, `perf_file_attr`). User
//! record types (>= 64) are passed through; `PERF_RECORD_AUXTRACE` (71) is followed in the
//! file by `size` bytes of trace, which [`PerfData::records`] hands over separately.

use crate::attr::PerfEventAttr;
use crate::bytes::u64_at;
use crate::records::peek_header;

/// `PERF_RECORD_AUXTRACE` (perf tool user type).
pub const PERF_RECORD_AUXTRACE: u32 = 71;

/// perf.data parse failures.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PerfDataError {
    /// Not a little-endian `PERFILE2` file.
    #[error("not a perf.data file (bad magic)")]
    BadMagic,
    /// A section points outside the file.
    #[error("perf.data section out of bounds")]
    Bounds,
}

/// A parsed `perf.data` file, borrowing the file bytes.
#[derive(Debug)]
pub struct PerfData<'a> {
    pub bytes: &'a [u8],
    /// Attrs with their event ids.
    pub attrs: Vec<(PerfEventAttr, Vec<u64>)>,
    /// Data section `(offset, size)`.
    pub data: (usize, usize),
}

/// One entry of the data section.
#[derive(Debug, Clone, Copy)]
pub struct FileRecord<'a> {
    /// File offset of the record header.
    pub offset: usize,
    /// The record bytes (header included).
    pub bytes: &'a [u8],
    /// For AUXTRACE, the trace bytes that follow the record.
    pub aux_payload: &'a [u8],
}

impl<'a> PerfData<'a> {
    pub fn parse(bytes: &'a [u8]) -> Result<Self, PerfDataError> {
        if bytes.get(..8) != Some(b"PERFILE2") {
            return Err(PerfDataError::BadMagic);
        }
        let g = |o| u64_at(bytes, o).map(|v| v as usize).ok_or(PerfDataError::Bounds);
        let attr_size = g(16)?;
        let (aoff, asize) = (g(24)?, g(32)?);
        let (doff, dsize) = (g(40)?, g(48)?);
        if aoff.checked_add(asize).is_none_or(|e| e > bytes.len()) || doff.checked_add(dsize).is_none_or(|e| e > bytes.len()) {
            return Err(PerfDataError::Bounds);
        }
        let mut attrs = Vec::new();
        if attr_size >= 16 {
            for chunk in bytes[aoff..aoff + asize].chunks_exact(attr_size) {
                let attr = PerfEventAttr::from_bytes(&chunk[..attr_size - 16]);
                let (ioff, isize) = (g_at(chunk, attr_size - 16), g_at(chunk, attr_size - 8));
                let ids = bytes
                    .get(ioff..ioff.saturating_add(isize))
                    .map(|s| s.chunks_exact(8).filter_map(|c| u64_at(c, 0)).collect())
                    .unwrap_or_default();
                attrs.push((attr, ids));
            }
        }
        Ok(PerfData { bytes, attrs, data: (doff, dsize) })
    }

    /// The records of the data section in file order (stops at the first malformed header).
    pub fn records(&self) -> Vec<FileRecord<'a>> {
        let (start, size) = self.data;
        let end = start + size;
        let mut out = Vec::new();
        let mut pos = start;
        while pos + 8 <= end {
            let Some((ty, _, rsize)) = peek_header(&self.bytes[pos..end]) else { break };
            let rsize = rsize as usize;
            if rsize < 8 || pos + rsize > end {
                break;
            }
            let rec = &self.bytes[pos..pos + rsize];
            let mut next = pos + rsize;
            let mut payload: &[u8] = &[];
            if ty == PERF_RECORD_AUXTRACE {
                let n = u64_at(rec, 8).unwrap_or(0) as usize;
                payload = self.bytes.get(next..next.saturating_add(n).min(end)).unwrap_or(&[]);
                next = next.saturating_add(n);
            }
            out.push(FileRecord { offset: pos, bytes: rec, aux_payload: payload });
            pos = next;
        }
        out
    }
}

fn g_at(b: &[u8], o: usize) -> usize {
    u64_at(b, o).unwrap_or(0) as usize
}
