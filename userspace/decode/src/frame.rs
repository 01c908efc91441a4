//! Trace formatter frame deformatter (Arm IHI 0029 "CoreSight Architecture Specification",
//! chapter D4 "Trace Formatter"): 16-byte frames carrying several trace IDs, FSYNC
//! (`0x7FFFFFFF`) handling, demultiplexing by trace ID. Also passes unformatted
//! single-source data through (ETE/TRBE raw), and strips DSTREAM block footers.
//!
//! Frame unpacking follows OpenCSD `TraceFmtDcdImpl::unpackFrame`, including how it assigns
//! trace indices to the demultiplexed runs (a run starts at the frame start, or at the
//! ID byte that switched to its ID), so packet `Idx:` values match `trc_pkt_lister`. Runs of
//! frames without an ID byte (most frames) can be taken in one piece
//! ([`FrameSink::frames`]), each byte's index from [`ChunkIndex`], as if frame by frame.
//!
//! ```
//! use etm_decode::frame::{Deformatter, FrameSink, StreamFormat};
//! struct Collect(Vec<(u8, u64, Vec<u8>)>);
//! impl FrameSink for Collect {
//!     fn data(&mut self, id: u8, index: u64, bytes: &[u8]) { self.0.push((id, index, bytes.to_vec())); }
//!     fn reset(&mut self) {}
//! }
//! let mut frame = [0u8; 16];
//! frame[0] = (0x10 << 1) | 1; // ID 0x10, then data
//! for (i, b) in frame[1..15].iter_mut().enumerate() { *b = (i as u8) << 1; }
//! let mut d = Deformatter::new(StreamFormat::Coresight);
//! let mut sink = Collect(Vec::new());
//! d.push(&frame, &mut sink);
//! assert_eq!(sink.0[0].0, 0x10);
//! assert_eq!(sink.0[0].2.len(), 14);
//! ```

/// Bit 0 of bytes 0, 2, ..., 14 of a frame read as a little-endian `u128`: an ID byte's
/// marker (a data byte's bit 0 is in the flag byte).
const EVEN_LSB: u128 = 0x0001_0001_0001_0001_0001_0001_0001_0001;

/// Flag bit `k` of a frame's byte 15 moved to bit 0 of byte `2k` (bit `16k` of the `u128`).
#[inline]
fn spread_flags(flags: u8) -> u128 {
    // bit j of a nibble times 2^(15j) lands at bit 16j; the partial products do not overlap
    const M: u64 = 0x0000_2000_4000_8001;
    const LSB: u64 = 0x0001_0001_0001_0001;
    let lo = (u64::from(flags & 0xF).wrapping_mul(M)) & LSB;
    let hi = (u64::from(flags >> 4).wrapping_mul(M)) & LSB;
    u128::from(lo) | (u128::from(hi) << 64)
}

/// How a trace buffer is laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamFormat {
    /// Memory-aligned 16-byte formatter frames (ETB/ETF/ETR; perf AUX without the RAW flag).
    /// A frame of four FSYNCs (the ETR barrier) resets all decoders.
    Coresight,
    /// TPIU port capture: frames not memory aligned, FSYNCs may appear between frames.
    Tpiu,
    /// DSTREAM capture of a TPIU port: 512-byte blocks whose last 8 bytes are a footer;
    /// the remaining bytes form a [`StreamFormat::Tpiu`] stream (indices count data bytes only).
    Dstream,
    /// Unformatted single-source data (TRBE, ETE raw): every byte belongs to `trace_id`.
    Raw {
        /// Trace ID to report the data under.
        trace_id: u8,
    },
}

/// Frames (and their data bytes) a batch of [`FrameSink::frames`] holds at most.
pub const FRAME_BATCH: usize = 128;

/// The trace indices of the bytes of one chunk of a trace ID's data: byte `i` is at
/// `base + i`, or, for the data of consecutive whole frames without an ID byte
/// ([`FrameSink::frames`]: the first 15 bytes of each 16-byte frame), at `base + i + i / 15`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkIndex {
    base: u64,
    /// The chunk's first byte in the frames' data (see [`skip`](Self::skip)).
    off: u64,
    /// Frames (else bytes at consecutive indices).
    framed: bool,
}

impl ChunkIndex {
    /// Bytes at consecutive trace indices from `base`.
    pub const fn linear(base: u64) -> Self {
        ChunkIndex { base, off: 0, framed: false }
    }

    /// The data of consecutive whole frames without an ID byte, the first starting at `base`.
    pub const fn frames(base: u64) -> Self {
        ChunkIndex { base, off: 0, framed: true }
    }

    /// The trace index of byte `i`.
    #[inline]
    pub fn at(self, i: usize) -> u64 {
        let i = self.off + i as u64;
        if self.framed { self.base + i + i / 15 } else { self.base + i }
    }

    /// The indices of the chunk's bytes from byte `n` on.
    #[inline]
    pub fn skip(self, n: usize) -> ChunkIndex {
        ChunkIndex { off: self.off + n as u64, ..self }
    }

    /// A cursor at byte `i`, for a loop that moves forward through the chunk.
    #[inline]
    pub fn cursor(self, i: usize) -> IndexCursor {
        let boundary = if !self.framed { usize::MAX } else { i + 15 - ((self.off as usize + i) % 15) };
        IndexCursor { pos: i, index: self.at(i), boundary }
    }
}

/// A position in a chunk and its trace index ([`ChunkIndex::at`]), moved forward without a
/// division: the index steps over a frame's flag byte when the position reaches the next
/// frame.
#[derive(Debug, Clone, Copy)]
pub struct IndexCursor {
    /// The byte.
    pub pos: usize,
    /// Its trace index.
    pub index: u64,
    /// The position of the next frame's first byte (`usize::MAX` in a linear chunk).
    boundary: usize,
}

impl IndexCursor {
    /// `n` bytes on.
    #[inline]
    pub fn advance(&mut self, n: usize) {
        self.pos += n;
        self.index += n as u64;
        if self.pos >= self.boundary {
            // (one boundary at most when `n` < 15, and no loop: as a loop, the compiler
            // computes its trip count with a division)
            let frames = (self.pos - self.boundary) / 15 + 1;
            self.index += frames as u64;
            self.boundary += 15 * frames;
        }
    }
}

/// Receiver of demultiplexed data.
pub trait FrameSink {
    /// `bytes` of trace ID `id`; `index` is the trace index OpenCSD assigns to `bytes[0]`.
    fn data(&mut self, id: u8, index: u64, bytes: &[u8]);
    /// The data of consecutive whole frames of trace ID `id` without an ID byte, the first
    /// frame starting at trace index `index`: 15 bytes from each, byte `i` at
    /// `index + i + i / 15` ([`ChunkIndex::frames`]). The same as each frame's bytes to
    /// [`data`](FrameSink::data), which the default does; a sink that takes them in one
    /// piece saves the per-call cost of every frame.
    fn frames(&mut self, id: u8, index: u64, bytes: &[u8]) {
        for (k, c) in bytes.chunks(15).enumerate() {
            self.data(id, index + 16 * k as u64, c);
        }
    }
    /// A 4 x FSYNC barrier was seen: all per-ID decoders should reset.
    fn reset(&mut self);
}

/// Counters kept by the deformatter.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FrameStats {
    /// Input bytes.
    pub bytes: u64,
    /// Complete frames unpacked.
    pub frames: u64,
    /// FSYNC words skipped.
    pub fsyncs: u64,
    /// Resets from 4 x FSYNC barriers.
    pub resets: u64,
    /// Data bytes for reserved/null IDs or before any ID (discarded).
    pub discarded_bytes: u64,
    /// Malformed FSYNC sequences (partial barrier frames).
    pub bad_fsync: u64,
    /// Bytes skipped while searching for the first FSYNC (TPIU) .
    pub unsynced_bytes: u64,
}

const FSYNC: [u8; 4] = [0xFF, 0xFF, 0xFF, 0x7F];
const NO_ID: u8 = 0xFF;

/// Streaming deformatter: push buffer bytes in any chunking.
#[derive(Debug, Clone)]
pub struct Deformatter {
    format: StreamFormat,
    frame: [u8; 16],
    n: usize,
    /// trace index of the next input byte (DSTREAM: footers not counted)
    index: u64,
    cur_id: u8,
    /// TPIU: FSYNC seen yet
    synced: bool,
    /// TPIU: bytes of a potential FSYNC while unsynced
    sync_match: usize,
    /// DSTREAM: position in the 512-byte block
    block_pos: usize,
    stats: FrameStats,
    /// Frames without an ID byte gathered for [`FrameSink::frames`] (and room for writing a
    /// whole frame at the last one's place).
    batch: Box<[u8; 15 * FRAME_BATCH + 1]>,
}

impl Deformatter {
    /// A deformatter for `format`.
    pub fn new(format: StreamFormat) -> Deformatter {
        Deformatter {
            format,
            frame: [0; 16],
            n: 0,
            index: 0,
            cur_id: NO_ID,
            synced: false,
            sync_match: 0,
            block_pos: 0,
            stats: FrameStats::default(),
            batch: Box::new([0; 15 * FRAME_BATCH + 1]),
        }
    }

    /// The format.
    pub fn format(&self) -> StreamFormat {
        self.format
    }

    /// Counters so far.
    pub fn stats(&self) -> FrameStats {
        self.stats
    }

    /// Trace index of the next byte to be pushed (bytes of data, excluding DSTREAM footers).
    pub fn index(&self) -> u64 {
        self.index
    }

    /// Forgets the partial frame and current ID (e.g. between perf AUX records).
    pub fn reset(&mut self) {
        self.n = 0;
        self.cur_id = NO_ID;
        self.synced = false;
        self.sync_match = 0;
    }

    /// Pushes buffer bytes; demultiplexed data goes to `sink`.
    pub fn push(&mut self, data: &[u8], sink: &mut impl FrameSink) {
        self.stats.bytes += data.len() as u64;
        match self.format {
            StreamFormat::Raw { trace_id } => {
                if !data.is_empty() {
                    sink.data(trace_id, self.index, data);
                    self.index += data.len() as u64;
                }
            }
            StreamFormat::Coresight => {
                let mut rest = data;
                // complete a partial frame first
                if self.n > 0 {
                    let take = (16 - self.n).min(rest.len());
                    self.frame[self.n..self.n + take].copy_from_slice(&rest[..take]);
                    self.n += take;
                    self.index += take as u64;
                    rest = &rest[take..];
                    if self.n < 16 {
                        return; // input exhausted inside the frame
                    }
                    self.n = 0;
                    let f = self.frame;
                    self.aligned_frame(&f, self.index - 16, sink);
                }
                // whole frames straight from the input
                // consecutive frames without an ID byte (most frames) go in batches: each
                // frame's 15 data bytes, each even one completed by its flag bit (as
                // `unpack_ids` would), the batch ended by any other frame
                let (mut len, mut start) = (0usize, 0u64);
                let mut chunks = rest.chunks_exact(16);
                for c in &mut chunks {
                    let mut f = [0u8; 16];
                    f.copy_from_slice(c);
                    let sof = self.index;
                    self.index += 16;
                    let v = u128::from_le_bytes(f);
                    // (an FSYNC frame has bit 0 of byte 0 set)
                    if v & EVEN_LSB == 0 {
                        if len == 0 {
                            start = sof;
                        }
                        self.stats.frames += 1;
                        // 16 bytes written, 15 kept: the flag byte is overwritten next
                        self.batch[len..len + 16].copy_from_slice(&(v | spread_flags(f[15])).to_le_bytes());
                        len += 15;
                        if len == 15 * FRAME_BATCH {
                            self.flush_frames(start, len, sink);
                            len = 0;
                        }
                        continue;
                    }
                    if len > 0 {
                        self.flush_frames(start, len, sink);
                        len = 0;
                    }
                    self.aligned_frame(&f, sof, sink);
                }
                if len > 0 {
                    self.flush_frames(start, len, sink);
                }
                let tail = chunks.remainder();
                self.frame[..tail.len()].copy_from_slice(tail);
                self.n = tail.len();
                self.index += tail.len() as u64;
            }
            StreamFormat::Tpiu => {
                for &b in data {
                    self.tpiu_byte(b, sink);
                }
            }
            StreamFormat::Dstream => {
                for &b in data {
                    let pos = self.block_pos;
                    self.block_pos = (self.block_pos + 1) % 512;
                    if pos >= 504 {
                        continue; // footer
                    }
                    self.tpiu_byte(b, sink);
                }
            }
        }
    }

    fn aligned_frame(&mut self, frame: &[u8; 16], sof: u64, sink: &mut impl FrameSink) {
        if frame[0..4] == FSYNC {
            let words = frame.chunks(4).take_while(|w| *w == FSYNC).count();
            self.stats.fsyncs += words as u64;
            if words == 4 {
                self.stats.resets += 1;
                self.cur_id = NO_ID;
                sink.reset();
            } else {
                // a partial barrier: not a valid frame either; drop it
                self.stats.bad_fsync += 1;
                self.cur_id = NO_ID;
            }
            return;
        }
        self.unpack(frame, sof, sink);
    }

    fn tpiu_byte(&mut self, b: u8, sink: &mut impl FrameSink) {
        let idx = self.index;
        self.index += 1;
        if !self.synced {
            if b == FSYNC[self.sync_match] {
                self.sync_match += 1;
                if self.sync_match == 4 {
                    self.synced = true;
                    self.sync_match = 0;
                    self.stats.fsyncs += 1;
                    self.n = 0;
                }
            } else {
                self.stats.unsynced_bytes += self.sync_match as u64 + 1;
                self.sync_match = if b == FSYNC[0] { 1 } else { 0 };
                if self.sync_match == 1 {
                    self.stats.unsynced_bytes -= 1;
                }
            }
            return;
        }
        self.frame[self.n] = b;
        self.n += 1;
        if self.n == 4 && self.frame[0..4] == FSYNC {
            self.stats.fsyncs += 1;
            self.n = 0;
            return;
        }
        if self.n == 16 {
            self.n = 0;
            let sof = idx - 15;
            let f = self.frame;
            self.unpack(&f, sof, sink);
        }
    }

    /// OpenCSD `unpackFrame`: bytes 0..13 in pairs, byte 14, flags in byte 15.
    #[inline]
    fn unpack(&mut self, f: &[u8; 16], sof: u64, sink: &mut impl FrameSink) {
        self.stats.frames += 1;
        let v = u128::from_le_bytes(*f);
        if v & EVEN_LSB == 0 {
            // no ID byte (most frames): 15 data bytes of the current ID, each even one
            // completed by its flag bit, as the loop below would
            let out = (v | spread_flags(f[15])).to_le_bytes();
            self.flush(self.cur_id, sof, &out[..15], sink);
            return;
        }
        self.unpack_ids(f, sof, sink);
    }

    /// [`unpack`](Self::unpack) of a frame with an ID byte.
    fn unpack_ids(&mut self, f: &[u8; 16], sof: u64, sink: &mut impl FrameSink) {
        let flags = f[15];
        let mut out = [0u8; 15];
        let mut len = 0usize;
        let mut blk_id = self.cur_id;
        let mut blk_idx = sof;
        for k in 0..7 {
            let i = 2 * k;
            let flag = (flags >> k) & 1;
            let mut prev_id_change = false;
            if f[i] & 1 == 1 {
                let new = (f[i] >> 1) & 0x7F;
                if new != self.cur_id {
                    prev_id_change = flag == 1;
                    if prev_id_change {
                        out[len] = f[i + 1];
                        len += 1;
                    }
                    self.cur_id = new;
                    if len > 0 {
                        self.flush(blk_id, blk_idx, &out[..len], sink);
                        len = 0;
                        blk_idx = sof + i as u64;
                    }
                    blk_id = new;
                }
            } else {
                out[len] = f[i] | flag;
                len += 1;
            }
            if !prev_id_change {
                out[len] = f[i + 1];
                len += 1;
            }
        }
        if f[14] & 1 == 1 {
            self.cur_id = (f[14] >> 1) & 0x7F;
        } else {
            out[len] = f[14] | ((flags >> 7) & 1);
            len += 1;
        }
        self.flush(blk_id, blk_idx, &out[..len], sink);
    }

    fn flush(&mut self, id: u8, index: u64, bytes: &[u8], sink: &mut impl FrameSink) {
        if bytes.is_empty() {
            return;
        }
        if !Self::source(id) {
            self.stats.discarded_bytes += bytes.len() as u64;
            return;
        }
        sink.data(id, index, bytes);
    }

    /// The batch of `len` bytes of frames without an ID byte ([`FrameSink::frames`]) of the
    /// current ID.
    fn flush_frames(&mut self, index: u64, len: usize, sink: &mut impl FrameSink) {
        let id = self.cur_id;
        if !Self::source(id) {
            self.stats.discarded_bytes += len as u64;
            return;
        }
        sink.frames(id, index, &self.batch[..len]);
    }

    /// A trace source's ID: not 0 (no ID yet is `NO_ID`) or a reserved one.
    fn source(id: u8) -> bool {
        id != 0 && id < 0x70
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Collect {
        runs: Vec<(u8, u64, Vec<u8>)>,
        resets: usize,
    }
    impl FrameSink for Collect {
        fn data(&mut self, id: u8, index: u64, bytes: &[u8]) {
            self.runs.push((id, index, bytes.to_vec()));
        }
        fn reset(&mut self) {
            self.resets += 1;
        }
    }

    /// IHI 0029 example: an ID change with the "previous ID" flag keeps the next byte with the
    /// old ID; data bytes get their LSB from the flag byte.
    #[test]
    fn unpack_id_change_and_flags() {
        // byte0: ID 0x10; byte1 data 0xAA; byte2 data 0x02 (flag bit1 -> 0x03); byte3 0xBB;
        // byte4: ID 0x11 with flag bit2 set -> byte5 (0xCC) still belongs to 0x10;
        // bytes 6..13 data for 0x11; byte14 data 0x08 with flag bit7 -> 0x09.
        let mut f = [0u8; 16];
        f[0] = (0x10 << 1) | 1;
        f[1] = 0xAA;
        f[2] = 0x02;
        f[3] = 0xBB;
        f[4] = (0x11 << 1) | 1;
        f[5] = 0xCC;
        for (k, b) in f[6..14].iter_mut().enumerate() {
            *b = (k as u8 + 1) << 1;
        }
        f[14] = 0x08;
        f[15] = 0b1000_0110;
        let mut d = Deformatter::new(StreamFormat::Coresight);
        let mut s = Collect::default();
        d.push(&f, &mut s);
        assert_eq!(s.runs[0], (0x10, 0, vec![0xAA, 0x03, 0xBB, 0xCC]));
        assert_eq!(s.runs[1], (0x11, 4, vec![2, 4, 6, 8, 10, 12, 14, 16, 0x09]));
    }

    /// A frame without ID bytes takes the fast path of `unpack`; it gives what the general
    /// unpacking does, for every flag byte and data bytes with all bit patterns.
    #[test]
    fn frame_without_ids_as_general_unpack() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for flags in 0..=255u8 {
            let mut f = [0u8; 16];
            for b in f.iter_mut() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *b = x as u8;
            }
            for i in (0..15).step_by(2) {
                f[i] &= !1;
            }
            f[15] = flags;
            let (mut fast, mut general) = (Collect::default(), Collect::default());
            let (mut d1, mut d2) = (Deformatter::new(StreamFormat::Coresight), Deformatter::new(StreamFormat::Coresight));
            d1.cur_id = 0x10;
            d2.cur_id = 0x10;
            d1.unpack(&f, 32, &mut fast);
            d2.unpack_ids(&f, 32, &mut general);
            assert_eq!(fast.runs, general.runs, "flags {flags:#x}");
            assert_eq!(fast.runs[0].2.len(), 15);
        }
        assert_eq!(spread_flags(0xFF), EVEN_LSB);
    }

    /// Aligned frames split at every byte boundary across three pushes give the same runs.
    #[test]
    fn coresight_split_frames() {
        let mut buf = Vec::new();
        for k in 0..3u8 {
            let mut f = [0u8; 16];
            f[0] = ((0x10 + k) << 1) | 1;
            for (i, b) in f[1..15].iter_mut().enumerate() {
                *b = ((i as u8) + k) << 1;
            }
            buf.extend(f);
        }
        let mut whole = Collect::default();
        Deformatter::new(StreamFormat::Coresight).push(&buf, &mut whole);
        for a in 0..buf.len() {
            for b in a..buf.len() {
                let mut d = Deformatter::new(StreamFormat::Coresight);
                let mut s = Collect::default();
                d.push(&buf[..a], &mut s);
                d.push(&buf[a..b], &mut s);
                d.push(&buf[b..], &mut s);
                assert_eq!(s.runs, whole.runs, "split {a} {b}");
            }
        }
    }

    /// Four FSYNC words in an aligned frame reset decoders and produce no data.
    #[test]
    fn fsync_barrier_resets() {
        let mut buf = Vec::new();
        for _ in 0..4 {
            buf.extend(FSYNC);
        }
        let mut d = Deformatter::new(StreamFormat::Coresight);
        let mut s = Collect::default();
        d.push(&buf, &mut s);
        assert_eq!(s.resets, 1);
        assert!(s.runs.is_empty());
        assert_eq!(d.stats().fsyncs, 4);
    }

    /// TPIU: FSYNCs between frames are skipped and frame indices count them.
    #[test]
    fn tpiu_fsyncs_skipped() {
        let mut f = [0u8; 16];
        f[0] = (1 << 1) | 1;
        let mut buf = FSYNC.to_vec();
        buf.extend(f);
        buf.extend(FSYNC);
        buf.extend(f);
        let mut d = Deformatter::new(StreamFormat::Tpiu);
        let mut s = Collect::default();
        // split in odd chunks to exercise resumption
        for c in buf.chunks(3) {
            d.push(c, &mut s);
        }
        assert_eq!(s.runs.len(), 2);
        assert_eq!((s.runs[0].0, s.runs[0].1), (1, 4));
        assert_eq!((s.runs[1].0, s.runs[1].1), (1, 24));
        assert_eq!(d.stats().fsyncs, 2);
    }

    /// Every byte with its ID and trace index; batches of frames taken whole.
    #[derive(Default)]
    struct Bytes {
        bytes: Vec<(u8, u64, u8)>,
        resets: Vec<usize>,
        batches: usize,
        longest: usize,
    }
    impl FrameSink for Bytes {
        fn data(&mut self, id: u8, index: u64, bytes: &[u8]) {
            self.bytes.extend(bytes.iter().enumerate().map(|(i, &b)| (id, index + i as u64, b)));
        }
        fn frames(&mut self, id: u8, index: u64, bytes: &[u8]) {
            assert!(bytes.len().is_multiple_of(15) && bytes.len() <= 15 * FRAME_BATCH);
            let at = ChunkIndex::frames(index);
            self.bytes.extend(bytes.iter().enumerate().map(|(i, &b)| (id, at.at(i), b)));
            self.batches += 1;
            self.longest = self.longest.max(bytes.len());
        }
        fn reset(&mut self) {
            self.resets.push(self.bytes.len());
        }
    }

    /// Frames without an ID byte handed over in batches ([`FrameSink::frames`], each byte's
    /// index from [`ChunkIndex::frames`]) give every byte the ID and trace index the frame by
    /// frame unpacking gives (the default `frames`: each frame to `data` at the frame's
    /// start), across batches longer than [`FRAME_BATCH`], ID changes, reserved IDs, FSYNC
    /// barriers and pushes split anywhere.
    #[test]
    fn batched_frames_as_frame_by_frame() {
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let mut rnd = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let (mut buf, mut barriers) = (Vec::new(), 0);
        for k in 0..1000 {
            let r = rnd();
            let mut f = [0u8; 16];
            // a long stretch without ID bytes or barriers (batches longer than FRAME_BATCH),
            // elsewhere an ID byte in about one frame in eight
            let stretch = (200..500).contains(&k);
            if r % 97 == 0 && !stretch {
                barriers += 1;
                for w in f.chunks_mut(4) {
                    w.copy_from_slice(&FSYNC);
                }
            } else {
                for b in f.iter_mut() {
                    *b = rnd() as u8;
                }
                let ids = !stretch && r % 8 == 0;
                for i in (0..15).step_by(2) {
                    f[i] &= !1;
                    if ids && (r >> (8 + i)) % 5 == 0 {
                        // IDs 0x10..0x12, 0 and a reserved one
                        let id = [0x10, 0x11, 0x12, 0, 0x7a][(r >> 32) as usize % 5];
                        f[i] = (id << 1) | 1;
                    }
                }
                if k == 200 {
                    // (the stretch's ID)
                    f[0] = (0x11 << 1) | 1;
                }
            }
            buf.extend(f);
        }
        let mut frame_by_frame = Collect::default();
        Deformatter::new(StreamFormat::Coresight).push(&buf, &mut frame_by_frame);
        let mut expect = Vec::new();
        for (id, index, bytes) in &frame_by_frame.runs {
            expect.extend(bytes.iter().enumerate().map(|(i, &b)| (*id, index + i as u64, b)));
        }
        assert!(barriers >= 3);
        assert_eq!(frame_by_frame.resets, barriers);
        for split in [buf.len(), 16 * 300 + 5, 7, 16] {
            let mut got = Bytes::default();
            let mut d = Deformatter::new(StreamFormat::Coresight);
            for c in buf.chunks(split) {
                d.push(c, &mut got);
            }
            assert_eq!(got.bytes.len(), expect.len(), "split {split}");
            assert!(got.bytes == expect, "split {split}");
            assert_eq!(got.resets.len(), barriers);
            if split >= 16 * 300 {
                // (the stretch without ID bytes fills batches)
                assert!(got.batches > 10 && got.longest == 15 * FRAME_BATCH, "split {split}");
            }
        }
    }

    /// A cursor moved forward by any steps has the index [`ChunkIndex::at`] gives, in linear
    /// chunks and frames, from any start.
    #[test]
    fn cursor_as_at() {
        for at in [ChunkIndex::linear(1000), ChunkIndex::frames(1000)] {
            assert_eq!(at.at(15), if at.framed { 1016 } else { 1015 });
            for skip in 0..40 {
                let at = at.skip(skip);
                for start in 0..20 {
                    let mut c = at.cursor(start);
                    assert_eq!(c.index, at.at(start));
                    for step in (0..200).map(|k| 1 + (k * 7 + skip) % 35) {
                        c.advance(step);
                        assert_eq!(c.index, at.at(c.pos), "skip {skip} start {start}");
                    }
                }
            }
        }
    }
}
