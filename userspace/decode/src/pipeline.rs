//! Full decode of a trace buffer: frame deformatter -> per-ID packet parser -> per-ID
//! instruction-level [`Decoder`] over a code image, delivering [`Element`]s in trace order
//! (OpenCSD decode-tree order, so listings match `trc_pkt_lister -decode`).

use std::ops::ControlFlow;

use crate::by_id::ById;
use crate::cache::SharedBlockCache;
use crate::decoder::{DecodeOptions, DecodeStats, Decoder, DecoderConfig, ElementSink};
use crate::elements::Element;
use crate::frame::{ChunkIndex, Deformatter, FrameSink, FrameStats, StreamFormat};
use crate::image::{MemSpace, MemoryAccess, MemoryImage};
use crate::insn::ArchVersion;
use crate::packet::{Address, Atoms, Lookahead, Packet, PacketDemux, PacketSink, PacketStats};
use crate::snapshot::{EtmConfig, Snapshot, SnapshotError, SnapshotFiles, TraceBuffer};

/// Builds the code image of a snapshot: every `dump` section of every device, in device
/// order (first match wins for overlapping dumps, like OpenCSD's accessor map). Dumps whose
/// file is missing are skipped and returned in the second value.
pub fn snapshot_image(snap: &Snapshot, files: &dyn SnapshotFiles) -> (MemoryImage, Vec<String>) {
    let mut img = MemoryImage::new();
    let mut missing = Vec::new();
    let mut seen: Vec<(u64, String, MemSpace)> = Vec::new();
    for dev in &snap.devices {
        for d in &dev.dumps {
            let space = MemSpace::from_snapshot(d.space.as_deref());
            if seen.iter().any(|(a, f, s)| *a == d.address && *f == d.file && *s == space) {
                continue;
            }
            seen.push((d.address, d.file.clone(), space));
            match snap.read_dump(files, d) {
                Ok(bytes) => img.add(d.address, bytes, space),
                Err(_) => missing.push(d.file.clone()),
            }
        }
    }
    (img, missing)
}

/// Totals of a buffer decode.
#[derive(Debug, Clone, Copy, Default)]
pub struct DecodeSummary {
    /// Trace bytes processed.
    pub bytes: u64,
    /// Deformatter counters.
    pub frames: FrameStats,
    /// Packet parser counters (all IDs).
    pub packets: PacketStats,
    /// Element decoder counters (all IDs).
    pub decode: DecodeStats,
}

/// Decoders for every trace ID of one buffer. A trace ID's element decoder is created when
/// its first packet arrives; all of them share one block cache (per code image, see
/// [`crate::cache`]).
pub struct BufferDecoder {
    format: StreamFormat,
    demux: PacketDemux,
    decs: Decoders,
    deformatter: Deformatter,
}

/// The element decoders of a buffer, created on first use: only the trace IDs seen hold one
/// ([`ById`]).
struct Decoders {
    decoders: ById<Decoder>,
    /// Configuration of each source's decoder.
    configs: Vec<Option<DecoderConfig>>,
    cache: SharedBlockCache,
    opts: Option<DecodeOptions>,
    src_addr_n: bool,
    unmarked_ts: bool,
}

impl Decoders {
    /// The decoder of `id`, created now if it is a source without one yet.
    #[inline(always)]
    fn get(&mut self, id: u8) -> Option<&mut Decoder> {
        let i = id & 0x7F;
        if self.decoders.get(i).is_none() {
            return self.create(i);
        }
        self.decoders.get_mut(i)
    }

    #[cold]
    #[inline(never)]
    fn create(&mut self, id: u8) -> Option<&mut Decoder> {
        let cfg = self.configs[id as usize]?;
        let mut d = Decoder::with_cache(cfg, self.cache.clone());
        if let Some(o) = self.opts {
            d.set_options(o);
        }
        d.set_src_addr_n(self.src_addr_n);
        d.set_unmarked_timestamps(self.unmarked_ts);
        // (in trace ID order: flushes and resets go by ascending ID)
        Some(self.decoders.insert(id, d))
    }

    /// The decoders created, by ascending trace ID.
    fn existing(&mut self) -> impl Iterator<Item = &mut Decoder> {
        self.decoders.values_mut().iter_mut()
    }
}

impl BufferDecoder {
    /// Decoders for `buffer` of `snap` (format and per-ID configuration from the snapshot).
    pub fn for_snapshot(snap: &Snapshot, buffer: &TraceBuffer) -> Self {
        let (format, cfgs) = crate::listing::buffer_setup(snap, buffer);
        let sources = snap.sources_for_buffer(&buffer.name);
        let list: Vec<(u8, EtmConfig, ArchVersion)> = cfgs
            .into_iter()
            .map(|(id, cfg)| {
                let arch = sources
                    .iter()
                    .find(|s| s.config == cfg)
                    .and_then(|s| s.core.as_ref())
                    .map(|c| ArchVersion::of_core_type(&c.core_type))
                    .unwrap_or_default();
                (id, cfg, arch)
            })
            .collect();
        Self::new(format, &list)
    }

    /// Decoders for `(listing id, config, core architecture)` sources in `format`.
    pub fn new(format: StreamFormat, sources: &[(u8, EtmConfig, ArchVersion)]) -> Self {
        Self::with_cache(format, sources, crate::cache::shared(crate::cache::DEFAULT_BITS))
    }

    /// [`new`](Self::new) with a block cache shared beyond this buffer (every buffer of one
    /// code image).
    pub fn with_cache(format: StreamFormat, sources: &[(u8, EtmConfig, ArchVersion)], cache: SharedBlockCache) -> Self {
        let mut demux = PacketDemux::new();
        let mut configs: Vec<Option<DecoderConfig>> = vec![None; 128];
        for (id, cfg, arch) in sources {
            demux.add(*id, cfg);
            configs[(*id & 0x7F) as usize] = Some(DecoderConfig::new(cfg, *arch));
        }
        BufferDecoder {
            format,
            demux,
            decs: Decoders { decoders: ById::default(), configs, cache, opts: None, src_addr_n: false, unmarked_ts: false },
            deformatter: Deformatter::new(format),
        }
    }

    /// Sets OpenCSD's `-src_addr_n` mode on every decoder (see [`Decoder::set_src_addr_n`]).
    pub fn set_src_addr_n(&mut self, on: bool) {
        self.decs.src_addr_n = on;
        for d in self.decs.existing() {
            d.set_src_addr_n(on);
        }
    }

    /// Sets the optional OpenCSD checks on every decoder (see [`Decoder::set_options`]).
    pub fn set_options(&mut self, opts: DecodeOptions) {
        self.decs.opts = Some(opts);
        for d in self.decs.existing() {
            d.set_options(opts);
        }
    }

    /// Reports timestamps before the first ETE timestamp marker too
    /// ([`Decoder::set_unmarked_timestamps`]).
    pub fn set_unmarked_timestamps(&mut self, on: bool) {
        self.decs.unmarked_ts = on;
        for d in self.decs.existing() {
            d.set_unmarked_timestamps(on);
        }
    }

    /// Element decoders created so far (trace IDs seen).
    pub fn decoders_created(&self) -> usize {
        self.decs.decoders.values().len()
    }

    /// The element decoder of a trace ID (e.g. for [`Decoder::pending_target`] at the end of
    /// the data pushed so far).
    pub fn decoder(&self, trace_id: u8) -> Option<&Decoder> {
        self.decs.decoders.get(trace_id & 0x7F)
    }

    /// Starts a new trace session with the same decoders (trace index back to 0, parsers and
    /// decoders reset and waiting for synchronisation), like `trc_pkt_lister -multi_session`
    /// between buffers. Call [`finish`](Self::finish) on the previous session first.
    pub fn restart(&mut self) {
        self.deformatter = Deformatter::new(self.format);
        self.demux.reset_all();
        for d in self.decs.existing() {
            d.reset();
        }
    }

    /// The stream format.
    pub fn format(&self) -> StreamFormat {
        self.format
    }

    /// Pushes trace bytes; elements go to `sink`. Returns `Break` if the sink stopped.
    pub fn push<M: MemoryAccess + ?Sized, S: ElementSink + ?Sized>(
        &mut self,
        data: &[u8],
        mem: &M,
        sink: &mut S,
    ) -> ControlFlow<()> {
        let mut fs = Fs { demux: &mut self.demux, decoders: &mut self.decs, mem, sink, stop: false };
        self.deformatter.push(data, &mut fs);
        if fs.stop { ControlFlow::Break(()) } else { ControlFlow::Continue(()) }
    }

    /// End of trace: flushes every ID (ascending) and emits their `EO_TRACE` elements.
    pub fn finish<M: MemoryAccess + ?Sized, S: ElementSink + ?Sized>(&mut self, mem: &M, sink: &mut S) -> ControlFlow<()> {
        let ids: Vec<u8> = self.demux.ids().collect();
        let mut stop = false;
        for id in ids {
            let decoders = &mut self.decs;
            self.demux.finish(id, &mut |id: u8, idx: u64, p: &Packet, _raw: &[u8]| {
                if !stop
                    && let Some(d) = decoders.get(id)
                    && d.packet(idx, p, mem, sink).is_break()
                {
                    stop = true;
                }
            });
            // Every source ends with EO_TRACE, also one whose ID sent nothing.
            if let Some(d) = self.decs.get(id)
                && !stop
                && d.finish(sink).is_break()
            {
                stop = true;
            }
        }
        if stop { ControlFlow::Break(()) } else { ControlFlow::Continue(()) }
    }

    /// Counters so far.
    pub fn summary(&self) -> DecodeSummary {
        let mut d = DecodeStats::default();
        for dec in self.decs.decoders.values() {
            let s = dec.stats();
            d.packets += s.packets;
            d.elements += s.elements;
            d.ranges += s.ranges;
            d.instructions += s.instructions;
            d.bad_packets += s.bad_packets;
            d.sequence_errors += s.sequence_errors;
            d.nacc += s.nacc;
            d.stack_overflows += s.stack_overflows;
        }
        // One cache for all decoders: its counters once.
        (d.cache_hits, d.cache_misses) = (self.decs.cache.hits(), self.decs.cache.misses());
        DecodeSummary {
            bytes: self.deformatter.index(),
            frames: self.deformatter.stats(),
            packets: self.demux.stats(),
            decode: d,
        }
    }
}

struct Fs<'a, M: ?Sized, S: ?Sized> {
    demux: &'a mut PacketDemux,
    decoders: &'a mut Decoders,
    mem: &'a M,
    sink: &'a mut S,
    stop: bool,
}

impl<M: MemoryAccess + ?Sized, S: ElementSink + ?Sized> Fs<'_, M, S> {
    /// Bytes of trace ID `id` to its parser and decoder, then what the decoder holds to the
    /// sink.
    #[inline]
    fn chunk(&mut self, id: u8, index: ChunkIndex, bytes: &[u8]) {
        if self.stop {
            return;
        }
        match self.decoders.get(id) {
            Some(dec) => {
                let mut s = IdSink { dec, mem: self.mem, sink: &mut *self.sink, stop: false };
                self.demux.feed_to(id, index, bytes, &mut s);
                self.stop = s.stop || s.dec.flush_held(s.sink).is_break();
            }
            // no decoder for this ID: its packets are parsed (and counted) only
            None => self.demux.feed_to(id, index, bytes, &mut |_: u64, _: &Packet, _: &[u8]| {}),
        }
    }
}

impl<M: MemoryAccess + ?Sized, S: ElementSink + ?Sized> FrameSink for Fs<'_, M, S> {
    fn data(&mut self, id: u8, index: u64, bytes: &[u8]) {
        self.chunk(id, ChunkIndex::linear(index), bytes);
    }

    fn frames(&mut self, id: u8, index: u64, bytes: &[u8]) {
        self.chunk(id, ChunkIndex::frames(index), bytes);
    }

    fn reset(&mut self) {
        self.demux.reset_all();
        for d in self.decoders.existing() {
            if !self.stop && d.flush_held(&mut *self.sink).is_break() {
                self.stop = true;
            }
            d.reset();
        }
    }
}

/// The packets of one trace ID to its decoder (atom packets without a `Packet`).
struct IdSink<'a, M: ?Sized, S: ?Sized> {
    dec: &'a mut Decoder,
    mem: &'a M,
    sink: &'a mut S,
    stop: bool,
}

impl<M: MemoryAccess + ?Sized, S: ElementSink + ?Sized> PacketSink for IdSink<'_, M, S> {
    #[inline]
    fn packet(&mut self, index: u64, p: &Packet, _raw: &[u8]) {
        if !self.stop && self.dec.packet(index, p, self.mem, self.sink).is_break() {
            self.stop = true;
        }
    }

    #[inline]
    fn atoms(&mut self, index: u64, format: u8, atoms: Atoms, _header: u8) {
        if !self.stop && self.dec.atoms(index, format, atoms, self.mem, self.sink).is_break() {
            self.stop = true;
        }
    }

    #[inline]
    fn atom_run(&mut self, index: ChunkIndex, data: &[u8], look: &mut Lookahead<'_>) -> usize {
        let mut n = 0;
        if !self.stop {
            let r;
            (n, r) = self.dec.atom_run(index, data, look, self.mem, self.sink);
            if r.is_continue() {
                return n;
            }
            self.stop = true;
        }
        // stopped: the atom packets left are only counted
        n + data[n..].iter().take_while(|&&b| look.atoms(b).0 != 0).count()
    }

    #[inline]
    fn address(&mut self, index: u64, addr: Address, _raw: &[u8]) {
        if !self.stop && self.dec.address(index, addr, self.mem, self.sink).is_break() {
            self.stop = true;
        }
    }
}

/// Decodes a whole snapshot buffer with the snapshot's memory image.
pub fn decode_snapshot_buffer(
    snap: &Snapshot,
    files: &dyn SnapshotFiles,
    buffer: &TraceBuffer,
    sink: &mut dyn FnMut(&Element) -> ControlFlow<()>,
) -> Result<DecodeSummary, SnapshotError> {
    decode_snapshot_buffer_with(snap, files, buffer, false, sink)
}

/// [`decode_snapshot_buffer`] with OpenCSD's `-src_addr_n` mode on or off.
pub fn decode_snapshot_buffer_with(
    snap: &Snapshot,
    files: &dyn SnapshotFiles,
    buffer: &TraceBuffer,
    src_addr_n: bool,
    sink: &mut dyn FnMut(&Element) -> ControlFlow<()>,
) -> Result<DecodeSummary, SnapshotError> {
    decode_snapshot_buffer_opts(snap, files, buffer, src_addr_n, DecodeOptions::default(), sink)
}

/// [`decode_snapshot_buffer_with`] with optional OpenCSD checks ([`DecodeOptions`]: instruction
/// range limit, A64 opcode check).
pub fn decode_snapshot_buffer_opts(
    snap: &Snapshot,
    files: &dyn SnapshotFiles,
    buffer: &TraceBuffer,
    src_addr_n: bool,
    opts: DecodeOptions,
    sink: &mut dyn FnMut(&Element) -> ControlFlow<()>,
) -> Result<DecodeSummary, SnapshotError> {
    let data = files.read(&buffer.file)?;
    let (img, _missing) = snapshot_image(snap, files);
    let mut bd = BufferDecoder::for_snapshot(snap, buffer);
    bd.set_src_addr_n(src_addr_n);
    bd.set_options(opts);
    let mut s = |e: &Element| sink(e);
    for chunk in data.chunks(4096) {
        if bd.push(chunk, &img, &mut s).is_break() {
            return Ok(bd.summary());
        }
    }
    let _ = bd.finish(&img, &mut s);
    Ok(bd.summary())
}

/// Decodes every buffer of the snapshot in `trace.ini` order as consecutive sessions of the
/// first buffer's decoders (`trc_pkt_lister -multi_session`): each buffer ends with
/// `EO_TRACE`, then the decoders are reset for the next one.
pub fn decode_snapshot_multi_session(
    snap: &Snapshot,
    files: &dyn SnapshotFiles,
    sink: &mut dyn FnMut(&Element) -> ControlFlow<()>,
) -> Result<DecodeSummary, SnapshotError> {
    let (img, _missing) = snapshot_image(snap, files);
    let Some(first) = snap.first_buffer() else { return Ok(DecodeSummary::default()) };
    let mut bd = BufferDecoder::for_snapshot(snap, first);
    let mut s = |e: &Element| sink(e);
    for (i, buffer) in snap.buffers.iter().enumerate() {
        if i > 0 {
            bd.restart();
        }
        let data = files.read(&buffer.file)?;
        for chunk in data.chunks(4096) {
            if bd.push(chunk, &img, &mut s).is_break() {
                return Ok(bd.summary());
            }
        }
        if bd.finish(&img, &mut s).is_break() {
            break;
        }
    }
    Ok(bd.summary())
}

/// Fuzzing entry point for the full decoder, shared by the cargo-fuzz target
/// (`fuzz/fuzz_targets/decode.rs`) and the deterministic test (`tests/decode_fuzz.rs`).
/// Not part of the stable API.
pub mod fuzz {
    use std::hash::{Hash, Hasher};
    use std::ops::ControlFlow;

    use super::{BufferDecoder, DecodeStats};
    use crate::branches::{BranchBatch, BranchBuilder, BranchRecord, BranchRule};
    use crate::decoder::ElementSink;
    use crate::elements::{Element, ElementKind};
    use crate::frame::StreamFormat;
    use crate::image::{MemSpace, MemoryImage};
    use crate::insn::ArchVersion;
    use crate::snapshot::{CoreProfile, EtmConfig, Protocol};

    /// Base address of the fixed A64 code image.
    pub const CODE_BASE: u64 = 0x1000;

    /// A fixed code image: 4 KiB of A64 code mixing straight-line instructions with every
    /// branch class (B, BL, B.cond, CBZ, TBZ, BR, BLR, RET, ERET, ISB, WFI), and 1 KiB of T32
    /// code with IT blocks, so that arbitrary atoms and addresses exercise the walker.
    pub fn code_image() -> MemoryImage {
        let mut a64 = Vec::with_capacity(4096);
        let mut x: u32 = 0x1234_5678;
        for i in 0..1024u32 {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            let w = match x % 16 {
                0 => 0x1400_0000 | (x >> 8 & 0x3F),                    // b +n
                1 => 0x9400_0000 | (x >> 8 & 0x3F),                    // bl +n
                2 => 0x5400_0000 | ((x >> 8 & 0x3F) << 5) | (x & 0xF), // b.cond
                3 => 0xB400_0000 | ((x >> 8 & 0x3F) << 5),             // cbz
                4 => 0x3600_0000 | ((x >> 8 & 0x3F) << 5),             // tbz
                5 => 0xD61F_0000 | ((x & 0x1F) << 5),                  // br
                6 => 0xD63F_0000 | ((x & 0x1F) << 5),                  // blr
                7 => 0xD65F_03C0,                                      // ret
                8 if i % 7 == 0 => 0xD69F_03E0,                        // eret
                9 if i % 5 == 0 => 0xD503_3FDF,                        // isb
                10 if i % 5 == 0 => 0xD503_207F,                       // wfi
                11 => 0x17FF_FFF0 | (x & 0xF),                         // b backwards
                _ => 0xD503_201F,                                      // nop
            };
            a64.extend_from_slice(&w.to_le_bytes());
        }
        let mut t32 = Vec::with_capacity(1024);
        for i in 0..256u32 {
            let hw: [u16; 2] = match i % 8 {
                0 => [0xBF0C, 0x4770], // ite eq; bx lr
                1 => [0xD0FE, 0xBF00], // beq; nop
                2 => [0xF000, 0xF800], // bl
                3 => [0xE7FE, 0xBD00], // b; pop {pc}
                _ => [0xBF00, 0x2000], // nop; movs
            };
            for h in hw {
                t32.extend_from_slice(&h.to_le_bytes());
            }
        }
        let mut img = MemoryImage::new();
        img.add(CODE_BASE, a64, MemSpace::ANY);
        img.add(0x8000, t32, MemSpace::ANY);
        img
    }

    fn config(sel: &[u8], id: u8) -> (EtmConfig, ArchVersion) {
        let ete = sel[0] & 4 != 0;
        let mut cfg = EtmConfig::generic(if ete { Protocol::Ete } else { Protocol::Etmv4 }, id);
        if sel[0] & 8 != 0 {
            cfg.core_profile = CoreProfile::M;
        }
        cfg.idr[0] ^= ((sel[1] as u32 & 1) << 29) | ((sel[1] as u32 >> 1 & 3) << 15) | ((sel[1] as u32 >> 5 & 1) << 23);
        cfg.idr[2] |= (sel[2] as u32 & 1) << 31;
        cfg.idr[8] = sel[3] as u32 & 0x7F;
        cfg.configr ^= ((sel[2] as u32 >> 1) & 1) << 12 | ((sel[2] as u32 >> 2) & 1) << 4;
        let arch = [ArchVersion::V7, ArchVersion::V8, ArchVersion::V8r3, ArchVersion::Aa64][(sel[2] >> 3 & 3) as usize];
        (cfg, arch)
    }

    /// The decoder for `data`'s selector bytes `sel` (see [`check`]).
    fn decoder(sel: &[u8]) -> BufferDecoder {
        let format = match sel[0] & 3 {
            0 => StreamFormat::Coresight,
            1 => StreamFormat::Raw { trace_id: 1 },
            2 => StreamFormat::Tpiu,
            _ => StreamFormat::Dstream,
        };
        let ids: &[u8] = if matches!(format, StreamFormat::Raw { .. }) { &[1] } else { &[0x10, 0x11, 1] };
        let srcs: Vec<_> = ids
            .iter()
            .map(|&id| {
                let (c, a) = config(sel, id);
                (id, c, a)
            })
            .collect();
        BufferDecoder::new(format, &srcs)
    }

    /// `data` pushed to `bd` in the pieces `splits` cut, then the end of trace.
    fn push_all<S: ElementSink>(bd: &mut BufferDecoder, data: &[u8], splits: &[usize], img: &MemoryImage, sink: &mut S) {
        let mut last = 0;
        for &s in splits.iter().chain(std::iter::once(&data.len())) {
            let s = s.clamp(last, data.len());
            let _ = bd.push(&data[last..s], img, sink);
            last = s;
        }
        let _ = bd.finish(img, sink);
    }

    fn run(data: &[u8], sel: &[u8], splits: &[usize], img: &MemoryImage) -> (u64, u64) {
        let mut bd = decoder(sel);
        let mut h = std::collections::hash_map::DefaultHasher::new();
        let mut n = 0u64;
        let mut sink = |e: &Element| {
            n += 1;
            e.to_string().hash(&mut h);
            if let ElementKind::InstrRange(r) = e.kind {
                assert!(r.num_instr >= 1, "empty range");
            }
            ControlFlow::Continue(())
        };
        push_all(&mut bd, data, splits, img, &mut sink);
        (h.finish(), n)
    }

    /// Taken branches per trace ID, per ID the trace index of each range, and the decoder's
    /// counts.
    type Branches = (Vec<(u8, BranchRecord)>, Vec<Vec<u64>>, DecodeStats);

    /// The taken branches of the element stream by perf's rule, element by element
    /// ([`BranchBuilder`]): the reference.
    fn branches_of_elements(mut bd: BufferDecoder, data: &[u8], splits: &[usize], img: &MemoryImage) -> Branches {
        let mut builders: Vec<BranchBuilder> = (0..128).map(|_| BranchBuilder::new(1)).collect();
        let (mut recs, mut ranges) = (Vec::new(), vec![Vec::new(); 128]);
        let mut sink = |e: &Element| {
            let id = e.trace_id & 0x7f;
            if let ElementKind::InstrRange(_) = e.kind {
                ranges[id as usize].push(e.index);
            }
            if let Some(r) = builders[id as usize].element(e) {
                recs.push((id, r));
            }
            ControlFlow::Continue(())
        };
        push_all(&mut bd, data, splits, img, &mut sink);
        (recs, ranges, bd.summary().decode)
    }

    /// A sink that takes branches ([`ElementSink::takes_branches`]), as the session's does:
    /// each batch joined to its ID's chain, to which it applies exceptions and discontinuities.
    struct Taker {
        rules: Vec<BranchRule>,
        recs: Vec<(u8, BranchRecord)>,
        /// Per ID, (ranges so far, trace index of the last) at each batch.
        batches: Vec<Vec<(u64, u64)>>,
        ranges: Vec<u64>,
    }

    impl ElementSink for Taker {
        fn element(&mut self, e: &Element) -> ControlFlow<()> {
            assert!(!matches!(e.kind, ElementKind::InstrRange(_)), "a range handed to a sink that takes branches: {e}");
            self.rules[(e.trace_id & 0x7f) as usize].other_element(&e.kind);
            ControlFlow::Continue(())
        }

        fn takes_branches(&self) -> bool {
            true
        }

        fn branches(&mut self, trace_id: u8, batch: &mut BranchBatch<'_>) -> ControlFlow<()> {
            let id = (trace_id & 0x7f) as usize;
            assert!(batch.ranges > 0, "an empty batch");
            assert!(batch.records.len() as u64 <= batch.ranges, "more records than ranges");
            self.ranges[id] += batch.ranges;
            self.batches[id].push((self.ranges[id], batch.last_index));
            let recs = batch.join(&mut self.rules[id]);
            self.recs.extend(recs.iter().map(|&r| (id as u8, r)));
            ControlFlow::Continue(())
        }
    }

    /// The taken branches the decoder hands to a sink that takes them
    /// ([`ElementSink::takes_branches`]) are those of its element stream by perf's rule,
    /// element by element ([`BranchBuilder`]), with the same ranges counted and the same last
    /// range of each batch: `data` decoded over `img` in the pieces `splits` cut by two
    /// decoders that `make` returns. Panics otherwise; returns the records.
    pub fn branches_agree(make: &dyn Fn() -> BufferDecoder, data: &[u8], splits: &[usize], img: &MemoryImage) -> usize {
        let (want, ranges, stats) = branches_of_elements(make(), data, splits, img);
        let mut bd = make();
        let mut t = Taker {
            rules: vec![BranchRule::default(); 128],
            recs: Vec::new(),
            batches: vec![Vec::new(); 128],
            ranges: vec![0; 128],
        };
        push_all(&mut bd, data, splits, img, &mut t);
        assert_eq!(t.recs, want, "taken branches differ from the elements'");
        // (but the cache's: shared by the decoders `make` returns, they add up)
        let own = |s: DecodeStats| DecodeStats { cache_hits: 0, cache_misses: 0, ..s };
        assert_eq!(own(bd.summary().decode), own(stats), "the decoder's counts");
        for (id, bs) in t.batches.iter().enumerate() {
            assert_eq!(t.ranges[id], ranges[id].len() as u64, "ranges of ID {id}");
            for &(n, index) in bs {
                assert_eq!(index, ranges[id][n as usize - 1], "last range of a batch of ID {id}");
            }
        }
        want.len()
    }

    /// Decodes `data` (after 4 selector bytes: format/protocol, IDR0 options, IDR2/RS/CCI/arch,
    /// MAXSPEC) over [`code_image`], whole and split into chunks; panics on any panic inside the
    /// decoder or if the two runs disagree, or if the taken branches the decoder hands to a
    /// sink that takes them differ from its elements' ([`branches_agree`]), whole or chunked.
    /// Returns the number of elements.
    pub fn check(data: &[u8]) -> u64 {
        check_with(data, &code_image())
    }

    /// [`check`] with a prebuilt image (the fuzz target builds it once).
    pub fn check_with(data: &[u8], img: &MemoryImage) -> u64 {
        if data.len() < 5 {
            return 0;
        }
        let (sel, body) = data.split_at(4);
        let (h1, n1) = run(body, sel, &[], img);
        let step = 1 + body.first().copied().unwrap_or(0) as usize % 37;
        let splits: Vec<usize> = (step..body.len()).step_by(step).collect();
        let (h2, n2) = run(body, sel, &splits, img);
        assert_eq!((h1, n1), (h2, n2), "chunked decode differs from whole decode");
        branches_agree(&|| decoder(sel), body, &[], img);
        branches_agree(&|| decoder(sel), body, &splits, img);
        n1
    }
}
