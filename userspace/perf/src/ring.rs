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
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
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
        if rsize < HEADER_SIZE as u64 || !rsize.is_multiple_of(8) || rsize > avail {
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
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
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
    /// Bytes before a record's start that hold only ETE Ignore packets (0x70): padding a
    /// TRBE wrote and skipped without a record (`trbe_pad_buf` -> `perf_aux_output_skip`);
    /// handed over with the record's data, as perf's copy of the ring range would.
    pub pad_bytes: u64,
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

/// The ETE Ignore packet a TRBE pads skipped AUX space with (`ETE_IGNORE_PACKET`,
/// drivers/hwtracing/coresight/coresight-trbe.c).
pub const ETE_IGNORE: u8 = 0x70;

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

    /// The AUX area's size (0: none).
    pub fn size(&self) -> u64 {
        self.size
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

    /// [`AuxCursor::on_aux_record`] for a normal-mode ring whose bytes are at hand: if the
    /// record starts after the cursor and everything in between is ETE Ignore padding (a TRBE
    /// aligning its write pointer, `__trbe_normal_offset`, or skipping a too-short run,
    /// `trbe_normal_offset`: both pad with `ETE_IGNORE_PACKET` and advance `aux_head` through
    /// `perf_aux_output_skip`, which writes no record), the window starts at the cursor and
    /// includes the padding. Otherwise the same as `on_aux_record`.
    pub fn on_aux_record_in(&mut self, ring: &[u8], aux_offset: u64, aux_size: u64, flags: u64) -> AuxWindow {
        let pad = aux_offset.wrapping_sub(self.tail);
        if flags & aux_flags::OVERWRITE == 0
            && aux_offset > self.tail
            && !ring.is_empty()
            && pad.saturating_add(aux_size) <= ring.len() as u64
            && (self.tail..aux_offset).all(|p| ring[(p % ring.len() as u64) as usize] == ETE_IGNORE)
        {
            self.stats.pad_bytes += pad;
            return self.on_aux_record(self.tail, aux_size + pad, flags);
        }
        self.on_aux_record(aux_offset, aux_size, flags)
    }

    /// Gives up on the bytes between the cursor and `pos` (their PERF_RECORD_AUX records were
    /// lost): counted as gap bytes; the next record is expected at `pos`.
    pub fn skip_to(&mut self, pos: u64) {
        if pos > self.tail {
            self.stats.gap_bytes += pos - self.tail;
            self.tail = pos;
        }
    }

    /// Copies a window out of the AUX ring into `out` (appended). Returns false (and copies
    /// nothing) if the window is larger than the ring.
    pub fn copy_window(&self, ring: &[u8], w: &AuxWindow, out: &mut Vec<u8>) -> bool {
        if w.len > ring.len() as u64 || ring.is_empty() {
            return false;
        }
        let off = (w.start % ring.len() as u64) as usize;
        let len = w.len as usize;
        let first = len.min(ring.len() - off);
        out.extend_from_slice(&ring[off..off + first]);
        out.extend_from_slice(&ring[..len - first]);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::{PerfRecord, SampleFormat, SampleId, build, parse_record, sample};

    const FMT: SampleFormat = SampleFormat {
        sample_type: sample::IDENTIFIER | sample::TID | sample::TIME | sample::CPU,
        sample_id_all: true,
        branch_hw_index: false,
        regs_user_mask: 0,
    };

    /// Writes records into a ring of `size` bytes starting at free-running position `start`,
    /// as the kernel does (wrapping at the end); returns the new head.
    fn produce(ring: &mut [u8], start: u64, recs: &[Vec<u8>]) -> u64 {
        let mut pos = start;
        for r in recs {
            for (i, b) in r.iter().enumerate() {
                let n = ring.len() as u64;
                ring[((pos + i as u64) % n) as usize] = *b;
            }
            pos += r.len() as u64;
        }
        pos
    }

    fn aux_recs(n: usize) -> Vec<Vec<u8>> {
        (0..n)
            .map(|i| {
                build::aux(i as u64 * 100, 100, 0, &FMT, &SampleId { time: Some(i as u64), cpu: Some(1), ..Default::default() })
            })
            .collect()
    }

    /// Records that straddle the end of the ring come out whole and in order, repeatedly
    /// across many wraps.
    #[test]
    fn data_ring_wraps() {
        let mut ring = vec![0u8; 256];
        let mut tail = 0u64;
        let mut scratch = Vec::new();
        let mut stats = DataRingStats::default();
        let mut seen = Vec::new();
        for round in 0..20u64 {
            // 64 + 48 + 64 bytes: 176 does not divide 256, so records straddle the end.
            let mut recs = aux_recs(3);
            recs[1] = build::record(12, 0, &[1, 0, 0, 0, 1, 0, 0, 0], &FMT, &SampleId { time: Some(1), ..Default::default() });
            let head = produce(&mut ring, tail, &recs);
            tail = read_data_ring(&ring, tail, head, &mut scratch, &mut stats, |b| {
                let r = parse_record(b, &FMT).unwrap();
                if let PerfRecord::Aux { aux_offset, .. } = r.kind {
                    seen.push((round, aux_offset, r.sample_id.time.unwrap()));
                }
            });
            assert_eq!(tail, head);
        }
        assert_eq!((seen.len(), stats.records), (40, 60));
        assert!(
            seen.iter()
                .enumerate()
                .all(|(i, &(r, off, t))| r == i as u64 / 2 && off == (i as u64 % 2) * 200 && t == (i as u64 % 2) * 2)
        );
        assert!(stats.wrapped > 0, "test must exercise wrapping");
        assert_eq!(stats.corrupt, 0);
    }

    /// A corrupt size field drops the rest of the pending bytes (counted) and the next batch
    /// parses normally.
    #[test]
    fn data_ring_resyncs_after_corruption() {
        let mut ring = vec![0u8; 512];
        let recs = aux_recs(4);
        let head = produce(&mut ring, 0, &recs);
        ring[64 + 6] = 3; // second record: size 3 (< header)
        ring[64 + 7] = 0;
        let mut stats = DataRingStats::default();
        let mut n = 0;
        let tail = read_data_ring(&ring, 0, head, &mut Vec::new(), &mut stats, |_| n += 1);
        assert_eq!((n, stats.corrupt, stats.dropped_bytes, tail), (1, 1, 192, head));
        let head2 = produce(&mut ring, tail, &aux_recs(2));
        let tail2 = read_data_ring(&ring, tail, head2, &mut Vec::new(), &mut stats, |_| n += 1);
        assert_eq!((n, tail2), (3, head2));
    }

    /// A record claiming to extend past head (torn write or bad counters) is not delivered.
    #[test]
    fn data_ring_partial_record_not_delivered() {
        let mut ring = vec![0u8; 256];
        let head = produce(&mut ring, 0, &aux_recs(2));
        let mut stats = DataRingStats::default();
        let mut n = 0;
        read_data_ring(&ring, 0, head - 8, &mut Vec::new(), &mut stats, |_| n += 1);
        assert_eq!((n, stats.corrupt), (1, 1));
    }

    /// Normal-mode windows are [aux_offset, aux_offset+size); copying across the ring end
    /// reproduces the produced bytes.
    #[test]
    fn aux_window_copy_wraps() {
        let size = 64u64;
        let mut ring = vec![0u8; size as usize];
        let mut cur = AuxCursor::new(size, 0);
        let mut produced = 0u64;
        for k in 0..10u64 {
            let len = 17 + k * 3;
            let data: Vec<u8> = (0..len).map(|i| (produced + i) as u8).collect();
            for (i, b) in data.iter().enumerate() {
                ring[((produced + i as u64) % size) as usize] = *b;
            }
            let w = cur.on_aux_record(produced, len, 0);
            let mut out = Vec::new();
            assert!(cur.copy_window(&ring, &w, &mut out));
            assert_eq!(out, data);
            produced += len;
            assert_eq!(cur.tail(), produced);
        }
        assert_eq!(cur.stats.bytes, produced);
    }

    /// Lost AUX records leave a gap that is counted and skipped; an overlap is trimmed; a
    /// TRUNCATED record and a full ring both ask for exactly one re-enable.
    #[test]
    fn aux_gaps_overlaps_reenable() {
        let mut cur = AuxCursor::new(1024, 0);
        cur.on_aux_record(0, 100, 0);
        let w = cur.on_aux_record(300, 50, 0);
        assert_eq!((w.start, w.len, cur.stats.gap_bytes), (300, 50, 200));
        let w = cur.on_aux_record(340, 30, 0);
        assert_eq!((w.start, w.len, cur.stats.overlaps), (350, 20, 1));
        assert!(!cur.take_reenable());
        cur.on_aux_record(370, 10, aux_flags::TRUNCATED);
        assert!(cur.take_reenable());
        assert!(!cur.take_reenable());
        cur.observe_head(1024 + 380, 380);
        assert!(cur.take_reenable());
        assert_eq!((cur.stats.truncated, cur.stats.full, cur.stats.reenables), (1, 1, 2));
        // A record claiming more than the ring keeps only the newest ring-full.
        let w = cur.on_aux_record(380, 5000, 0);
        assert_eq!((w.start, w.len, cur.stats.oversize), (380 + 5000 - 1024, 1024, 1));
    }

    /// Random bytes in the data ring (any head/tail) never panic the reader or the record
    /// parser, and the tail always ends at the head.
    #[test]
    fn random_bytes_never_panic() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut ring = vec![0u8; 512];
        let mut stats = DataRingStats::default();
        for _ in 0..5000 {
            for b in ring.iter_mut() {
                *b = next() as u8;
            }
            // Plausible headers now and then: a small size at a random record start.
            let at = (next() % 64) as usize * 8;
            ring[at + 6] = ((next() % 8 + 1) * 8) as u8;
            ring[at + 7] = 0;
            let tail = next() % 4096;
            let head = tail + next() % 700;
            let t = read_data_ring(&ring, tail, head, &mut Vec::new(), &mut stats, |b| {
                let _ = parse_record(b, &FMT);
                let _ = parse_record(b, &SampleFormat { sample_type: !sample::READ, ..FMT });
            });
            assert_eq!(t, head.max(tail));
        }
        assert!(stats.records > 0 && stats.corrupt > 0);
    }

    /// Overwrite (snapshot) mode: the record's offset is the new head; data ends there.
    #[test]
    fn aux_overwrite_mode() {
        let mut cur = AuxCursor::new(4096, 0);
        let w = cur.on_aux_record(5000, 300, aux_flags::OVERWRITE);
        assert_eq!((w.start, w.len), (4700, 300));
        assert_eq!(cur.stats.overwrite, 1);
    }

    /// The user page view reads the uapi offsets: head/tail, aux area, u32/u16 halves.
    #[test]
    fn user_page_offsets() {
        let words: Vec<AtomicU64> = (0..512).map(|_| AtomicU64::new(0)).collect();
        let pg = UserPage::new(&words).unwrap();
        words[page::DATA_HEAD / 8].store(0x1234, Ordering::Relaxed);
        words[page::TIME_SHIFT / 8].store((0xdead_beefu64 << 32) | (31u64 << 16) | 7, Ordering::Relaxed);
        assert_eq!(pg.data_head(), 0x1234);
        assert_eq!(pg.load_u16(page::TIME_SHIFT, Ordering::Relaxed), 31);
        assert_eq!(pg.load_u32(page::TIME_MULT, Ordering::Relaxed), 0xdead_beef);
        pg.set_data_tail(0x1000);
        pg.set_aux_area(0x11000, 0x40000);
        pg.set_aux_tail(77);
        assert_eq!(words[1032 / 8].load(Ordering::Relaxed), 0x1000);
        assert_eq!((words[1072 / 8].load(Ordering::Relaxed), words[1080 / 8].load(Ordering::Relaxed)), (0x11000, 0x40000));
        assert_eq!(pg.aux_tail(), 77);
        assert!(UserPage::new(&words[..10]).is_none());
        assert_eq!(aux_offset_for(4096, 16), 17 * 4096);
    }
}
