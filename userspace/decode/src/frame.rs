//! Trace formatter frame deformatter (Arm IHI 0029 "CoreSight Architecture Specification",
//! chapter D4 "Trace Formatter"): 16-byte frames carrying several trace IDs, FSYNC
//! (`0x7FFFFFFF`) handling, demultiplexing by trace ID. Also passes unformatted
//! single-source data through (ETE/TRBE raw), and strips DSTREAM block footers.
//!
//! Frame unpacking follows OpenCSD `TraceFmtDcdImpl::unpackFrame`, including how it assigns
//! trace indices to the demultiplexed runs (a run starts at the frame start, or at the
//! ID byte that switched to its ID), so packet `Idx:` values match `trc_pkt_lister`.
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

/// Receiver of demultiplexed data.
pub trait FrameSink {
    /// `bytes` of trace ID `id`; `index` is the trace index OpenCSD assigns to `bytes[0]`.
    fn data(&mut self, id: u8, index: u64, bytes: &[u8]);
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
                let mut chunks = rest.chunks_exact(16);
                for c in &mut chunks {
                    let mut f = [0u8; 16];
                    f.copy_from_slice(c);
                    self.index += 16;
                    self.aligned_frame(&f, self.index - 16, sink);
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
        if id == 0 || id >= 0x70 {
            self.stats.discarded_bytes += bytes.len() as u64;
            return;
        }
        sink.data(id, index, bytes);
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
}
