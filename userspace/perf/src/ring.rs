//! The perf mmap ring buffer protocol, as pure logic over byte views.
//!
//! A perf mmap is one metadata page (`struct perf_event_mmap_page`) followed by the data ring
//! (2^n pages); the AUX ring is a second mapping at `aux_offset`. Source: `kernel/events/
//! ring_buffer.c`, `kernel/events/core.c` (`perf_mmap`), `tools/perf/util/auxtrace.h`; see
//! etm-interface.md §1.6.
//!
//! * [`UserPage`] wraps the metadata page as `&[AtomicU64]`: `data_head`/`aux_head` are read
//!   with Acquire, `data_tail`/`aux_tail` written with a full fence then Release.
//! * [`read_data_ring`] walks `[tail, head)` of the data ring, handing each complete record to a
//!   callback (records that wrap around the end are reassembled in a scratch buffer).
//! * [`AuxCursor`] turns `PERF_RECORD_AUX` records into byte windows of the AUX ring, checks
//!   them against its own tail (gaps and overlaps are counted), copies them out and says what
//!   `aux_tail` to publish and whether the event must be re-enabled (the kernel disables an AUX
//!   event when its buffer is full or the record is TRUNCATED).

use std::sync::atomic::{AtomicU64, Ordering, fence};

use crate::records::{HEADER_SIZE, aux_flags, peek_header};

/// Byte offsets in `struct perf_event_mmap_page` (uapi `perf_event.h`).
pub mod page {
    pub const LOCK: usize = 8;
    pub const CAPABILITIES: usize = 40;
    pub const TIME_SHIFT: usize = 50;
    pub const TIME_MULT: usize = 52;
    pub const TIME_OFFSET: usize = 56;
    pub const TIME_ZERO: usize = 64;
    pub const TIME_CYCLES: usize = 80;
    pub const TIME_MASK: usize = 88;
    pub const DATA_HEAD: usize = 1024;
    pub const DATA_TAIL: usize = 1032;
    pub const DATA_OFFSET: usize = 1040;
    pub const DATA_SIZE: usize = 1048;
    pub const AUX_HEAD: usize = 1056;
    pub const AUX_TAIL: usize = 1064;
    pub const AUX_OFFSET: usize = 1072;
    pub const AUX_SIZE: usize = 1080;
    /// Capability bits.
    pub const CAP_USER_TIME: u64 = 1 << 3;
    pub const CAP_USER_TIME_ZERO: u64 = 1 << 4;
    pub const CAP_USER_TIME_SHORT: u64 = 1 << 5;
    /// Words (u64) in the part of the page we use.
    pub const WORDS: usize = 1088 / 8;
}

/// The metadata page of a perf mmap, viewed as 64-bit atomic words.
///
/// The live driver builds it from the mmap pointer; tests from a `Vec<AtomicU64>`.
#[derive(Clone, Copy)]
pub struct UserPage<'a> {
    words: &'a [AtomicU64],
}

impl<'a> UserPage<'a> {
    /// `words` must cover at least [`page::WORDS`] words (the first 1088 bytes of the page).
    pub fn new(words: &'a [AtomicU64]) -> Option<Self> {
        (words.len() >= page::WORDS).then_some(UserPage { words })
    }

    /// Loads the u64 at byte offset `off` (8-aligned).
    pub fn load_u64(&self, off: usize, ord: Ordering) -> u64 {
        self.words[off / 8].load(ord)
    }

    /// Loads the u32 at byte offset `off` (4-aligned; little-endian halves of a word).
    pub fn load_u32(&self, off: usize, ord: Ordering) -> u32 {
        let w = self.words[off / 8].load(ord);
        (w >> ((off % 8) * 8)) as u32
    }

    /// Loads the u16 at byte offset `off` (2-aligned).
    pub fn load_u16(&self, off: usize, ord: Ordering) -> u16 {
        let w = self.words[off / 8].load(ord);
        (w >> ((off % 8) * 8)) as u16
    }

    fn store_u64(&self, off: usize, v: u64, ord: Ordering) {
        self.words[off / 8].store(v, ord);
    }

    /// `data_head`, read with Acquire (pairs with the kernel's smp_wmb before publishing).
    pub fn data_head(&self) -> u64 {
        self.load_u64(page::DATA_HEAD, Ordering::Acquire)
    }
    /// `data_tail` as last written by us.
    pub fn data_tail(&self) -> u64 {
        self.load_u64(page::DATA_TAIL, Ordering::Relaxed)
    }
    /// Publishes `data_tail` after all reads of the consumed records (smp_mb + store).
    pub fn set_data_tail(&self, v: u64) {
        fence(Ordering::SeqCst);
        self.store_u64(page::DATA_TAIL, v, Ordering::Release);
    }
    /// `(data_offset, data_size)` as filled by the kernel (0/0 on kernels before 4.1).
    pub fn data_area(&self) -> (u64, u64) {
        (self.load_u64(page::DATA_OFFSET, Ordering::Relaxed), self.load_u64(page::DATA_SIZE, Ordering::Relaxed))
    }
    /// `aux_head`, read with Acquire.
    pub fn aux_head(&self) -> u64 {
        self.load_u64(page::AUX_HEAD, Ordering::Acquire)
    }
    /// `aux_tail` as last written by us.
    pub fn aux_tail(&self) -> u64 {
        self.load_u64(page::AUX_TAIL, Ordering::Relaxed)
    }
    /// Publishes `aux_tail` (full fence, then Release store).
    pub fn set_aux_tail(&self, v: u64) {
        fence(Ordering::SeqCst);
        self.store_u64(page::AUX_TAIL, v, Ordering::Release);
    }
    /// Step 2 of AUX setup: write `aux_offset`/`aux_size` before mapping the AUX area.
    pub fn set_aux_area(&self, offset: u64, size: u64) {
        self.store_u64(page::AUX_OFFSET, offset, Ordering::Relaxed);
        self.store_u64(page::AUX_SIZE, size, Ordering::Release);
    }
    /// `(aux_offset, aux_size)`.
    pub fn aux_area(&self) -> (u64, u64) {
        (self.load_u64(page::AUX_OFFSET, Ordering::Relaxed), self.load_u64(page::AUX_SIZE, Ordering::Relaxed))
    }
}

/// Where to put the AUX area: first page-aligned offset after the data ring
/// (`aux_offset >= data_offset + data_size`).
pub fn aux_offset_for(page_size: u64, data_pages: u64) -> u64 {
    (1 + data_pages) * page_size
}

/// Counters for the data ring reader.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DataRingStats {
    /// Complete records handed to the callback.
    pub records: u64,
    /// Records that wrapped around the end of the ring (reassembled).
    pub wrapped: u64,
    /// Bytes consumed.
    pub bytes: u64,
    /// Headers with size < 8, size not a multiple of 8, or beyond `head`: the rest of
    /// `[tail, head)` was dropped to resync at `head`.
    pub corrupt: u64,
    /// Bytes dropped by those resyncs.
    pub dropped_bytes: u64,
}

/// Walks the records in `[tail, head)` of a data ring and returns the new tail (always
/// `head`: everything is consumed or dropped).
///
/// `ring` is the data area (power-of-two length). `head`/`tail` are the free-running u64
/// counters from the user page. Records wrapping the end are copied into `scratch` (at most
/// 64 KiB). `f` gets each record's bytes starting at its header.
pub fn read_data_ring(
    ring: &[u8],
    tail: u64,
    head: u64,
    scratch: &mut Vec<u8>,
    stats: &mut DataRingStats,
    mut f: impl FnMut(&[u8]),
) -> u64 {
    let size = ring.len() as u64;
    if size == 0 || !size.is_power_of_two() || head <= tail {
        return head.max(tail);
    }
    let mask = size - 1;
    let mut pos = tail;
    // More than a whole ring pending means the counters are corrupt; keep the last ring.
    if head - pos > size {
        stats.corrupt += 1;
        stats.dropped_bytes += head - pos - size;
        pos = head - size;
    }
    while pos < head {
        let avail = head - pos;
        let off = (pos & mask) as usize;
        let mut hdr = [0u8; HEADER_SIZE];
        if avail < HEADER_SIZE as u64 {
            stats.corrupt += 1;
            stats.dropped_bytes += avail;
            break;
        }
        copy_wrapped(ring, off, &mut hdr);
        let (_, _, rsize) = peek_header(&hdr).unwrap_or((0, 0, 0));
        let rsize = rsize as u64;
        if rsize < HEADER_SIZE as u64 || rsize % 8 != 0 || rsize > avail {
            stats.corrupt += 1;
            stats.dropped_bytes += avail;
            break;
        }
        let n = rsize as usize;
        if off + n <= ring.len() {
            f(&ring[off..off + n]);
        } else {
            scratch.clear();
            scratch.resize(n, 0);
            copy_wrapped(ring, off, scratch);
            stats.wrapped += 1;
            f(scratch);
        }
        stats.records += 1;
        stats.bytes += rsize;
        pos += rsize;
    }
    head
}

/// Copies `out.len()` bytes starting at ring index `off`, wrapping at the end of `ring`.
pub fn copy_wrapped(ring: &[u8], off: usize, out: &mut [u8]) {
    if ring.is_empty() {
        return;
    }
    let off = off % ring.len();
    let first = out.len().min(ring.len() - off);
    out[..first].copy_from_slice(&ring[off..off + first]);
    let mut done = first;
    while done < out.len() {
        let n = (out.len() - done).min(ring.len());
        out[done..done + n].copy_from_slice(&ring[..n]);
        done += n;
    }
}

/// Counters for the AUX cursor.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AuxStats {
    /// PERF_RECORD_AUX records seen.
    pub records: u64,
    /// Bytes delivered as windows.
    pub bytes: u64,
    /// Records with TRUNCATED.
    pub truncated: u64,
    /// Records with PARTIAL.
    pub partial: u64,
    /// Records with COLLISION.
    pub collision: u64,
    /// Records with OVERWRITE (snapshot mode).
    pub overwrite: u64,
    /// Bytes between our tail and a record's start (their records were lost): skipped.
    pub gap_bytes: u64,
    /// Records overlapping already consumed data (trimmed).
    pub overlaps: u64,
    /// Records claiming more than the ring holds (clamped to the newest ring-full).
    pub oversize: u64,
    /// Times the ring was found full (the kernel disables the event).
    pub full: u64,
    /// Re-enables requested.
    pub reenables: u64,
}

/// One window of AUX data, as ring counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuxWindow {
    /// Free-running AUX offset of the first byte.
    pub start: u64,
    /// Length in bytes (may be 0 for a flags-only record).
    pub len: u64,
    /// `PERF_RECORD_AUX.flags`.
    pub flags: u64,
}

impl AuxWindow {
    /// The trace is raw ETE/TRBE bytes rather than formatter frames.
    pub fn is_raw(&self) -> bool {
        self.flags & aux_flags::PMU_FORMAT_TYPE_MASK == aux_flags::CORESIGHT_FORMAT_RAW
    }
}

/// Consumer state for one AUX ring in normal (writable) mode, or snapshot mode.
#[derive(Debug, Clone)]
pub struct AuxCursor {
    size: u64,
    tail: u64,
    needs_enable: bool,
    pub stats: AuxStats,
}

impl AuxCursor {
    /// `size` = AUX area length (power of two), `tail` = current `aux_tail` (normally 0).
    pub fn new(size: u64, tail: u64) -> Self {
        AuxCursor { size, tail, needs_enable: false, stats: AuxStats::default() }
    }

    /// Our consumer position (what `aux_tail` should be after copying the delivered windows).
    pub fn tail(&self) -> u64 {
        self.tail
    }

    /// Maps a PERF_RECORD_AUX to the byte window to copy, updating the cursor.
    ///
    /// Normal mode: data is `[aux_offset, aux_offset + aux_size)`. Overwrite mode: data ends
    /// at `aux_offset` (the new head). Gaps before `aux_offset` (records lost from the data
    /// ring) are skipped and counted; overlaps with consumed data are trimmed.
    pub fn on_aux_record(&mut self, aux_offset: u64, aux_size: u64, flags: u64) -> AuxWindow {
        let s = &mut self.stats;
        s.records += 1;
        if flags & aux_flags::TRUNCATED != 0 {
            s.truncated += 1;
            // The kernel disables the event after a truncated output (perf_aux_output_end).
            self.needs_enable = true;
        }
        if flags & aux_flags::PARTIAL != 0 {
            s.partial += 1;
        }
        if flags & aux_flags::COLLISION != 0 {
            s.collision += 1;
        }
        let mut len = aux_size;
        let mut start;
        if flags & aux_flags::OVERWRITE != 0 {
            s.overwrite += 1;
            if len > self.size {
                s.oversize += 1;
                len = self.size;
            }
            start = aux_offset.saturating_sub(len);
            if start < self.tail {
                let cut = (self.tail - start).min(len);
                start += cut;
                len -= cut;
            }
        } else {
            start = aux_offset;
            if start > self.tail {
                s.gap_bytes += start - self.tail;
            } else if start < self.tail {
                s.overlaps += 1;
                let cut = (self.tail - start).min(len);
                start += cut;
                len -= cut;
            }
            if len > self.size {
                s.oversize += 1;
                start += len - self.size;
                len = self.size;
            }
        }
        if len > 0 || start > self.tail {
            self.tail = start + len;
        }
        s.bytes += len;
        AuxWindow { start, len, flags }
    }

    /// Copies a window out of the AUX ring into `out` (appended). Returns false (and copies
    /// nothing) if the window is larger than the ring.
    pub fn copy_window(&self, ring: &[u8], w: &AuxWindow, out: &mut Vec<u8>) -> bool {
        if w.len > ring.len() as u64 || ring.is_empty() {
            return false;
        }
        let at = out.len();
        out.resize(at + w.len as usize, 0);
        copy_wrapped(ring, (w.start % ring.len() as u64) as usize, &mut out[at..]);
        true
    }

    /// Checks the ring state at the start of a drain: if `aux_head - aux_tail` reached the
    /// ring size the kernel found no space and disabled the event.
    pub fn observe_head(&mut self, aux_head: u64, aux_tail: u64) {
        if aux_head.wrapping_sub(aux_tail) >= self.size {
            self.stats.full += 1;
            self.needs_enable = true;
        }
    }

    /// After the tail has been published: whether to issue `PERF_EVENT_IOC_ENABLE` on the AUX
    /// event (clears the request).
    pub fn take_reenable(&mut self) -> bool {
        let r = std::mem::take(&mut self.needs_enable);
        if r {
            self.stats.reenables += 1;
        }
        r
    }
}
