//! Full decode of a trace buffer: frame deformatter -> per-ID packet parser -> per-ID
//! instruction-level [`Decoder`] over a code image, delivering [`Element`]s in trace order
//! (OpenCSD decode-tree order, so listings match `trc_pkt_lister -decode`).

use std::ops::ControlFlow;

use crate::decoder::{DecodeStats, Decoder, DecoderConfig, ElementSink};
use crate::elements::Element;
use crate::frame::{Deformatter, FrameSink, FrameStats, StreamFormat};
use crate::image::{MemSpace, MemoryAccess, MemoryImage};
use crate::insn::ArchVersion;
use crate::packet::{Packet, PacketDemux, PacketStats};
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

/// Decoders for every trace ID of one buffer.
pub struct BufferDecoder {
    format: StreamFormat,
    demux: PacketDemux,
    decoders: Vec<Option<Decoder>>,
    deformatter: Deformatter,
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
        let mut demux = PacketDemux::new();
        let mut decoders: Vec<Option<Decoder>> = (0..128).map(|_| None).collect();
        for (id, cfg, arch) in sources {
            demux.add(*id, cfg);
            decoders[(*id & 0x7F) as usize] = Some(Decoder::new(DecoderConfig::new(cfg, *arch)));
        }
        BufferDecoder { format, demux, decoders, deformatter: Deformatter::new(format) }
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
        let mut fs = Fs { demux: &mut self.demux, decoders: &mut self.decoders, mem, sink, stop: false };
        self.deformatter.push(data, &mut fs);
        if fs.stop { ControlFlow::Break(()) } else { ControlFlow::Continue(()) }
    }

    /// End of trace: flushes every ID (ascending) and emits their `EO_TRACE` elements.
    pub fn finish<M: MemoryAccess + ?Sized, S: ElementSink + ?Sized>(&mut self, mem: &M, sink: &mut S) -> ControlFlow<()> {
        let ids: Vec<u8> = self.demux.ids().collect();
        let mut stop = false;
        for id in ids {
            let decoders = &mut self.decoders;
            self.demux.finish(id, &mut |id: u8, idx: u64, p: &Packet, _raw: &[u8]| {
                if let Some(d) = decoders[(id & 0x7F) as usize].as_mut() {
                    if !stop && d.packet(idx, p, mem, sink).is_break() {
                        stop = true;
                    }
                }
            });
            if let Some(d) = self.decoders[(id & 0x7F) as usize].as_mut() {
                if !stop && d.finish(sink).is_break() {
                    stop = true;
                }
            }
        }
        if stop { ControlFlow::Break(()) } else { ControlFlow::Continue(()) }
    }

    /// Counters so far.
    pub fn summary(&self) -> DecodeSummary {
        let mut d = DecodeStats::default();
        for dec in self.decoders.iter().flatten() {
            let s = dec.stats();
            d.packets += s.packets;
            d.elements += s.elements;
            d.ranges += s.ranges;
            d.instructions += s.instructions;
            d.bad_packets += s.bad_packets;
            d.sequence_errors += s.sequence_errors;
            d.nacc += s.nacc;
            d.stack_overflows += s.stack_overflows;
            d.cache_hits += s.cache_hits;
            d.cache_misses += s.cache_misses;
        }
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
    decoders: &'a mut Vec<Option<Decoder>>,
    mem: &'a M,
    sink: &'a mut S,
    stop: bool,
}

impl<M: MemoryAccess + ?Sized, S: ElementSink + ?Sized> FrameSink for Fs<'_, M, S> {
    fn data(&mut self, id: u8, index: u64, bytes: &[u8]) {
        if self.stop {
            return;
        }
        let (decoders, mem, sink, stop) = (&mut *self.decoders, self.mem, &mut *self.sink, &mut self.stop);
        self.demux.feed(id, index, bytes, &mut |id: u8, idx: u64, p: &Packet, _raw: &[u8]| {
            if *stop {
                return;
            }
            if let Some(d) = decoders[(id & 0x7F) as usize].as_mut() {
                if d.packet(idx, p, mem, sink).is_break() {
                    *stop = true;
                }
            }
        });
    }

    fn reset(&mut self) {
        self.demux.reset_all();
        for d in self.decoders.iter_mut().flatten() {
            d.reset();
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
    let data = files.read(&buffer.file)?;
    let (img, _missing) = snapshot_image(snap, files);
    let mut bd = BufferDecoder::for_snapshot(snap, buffer);
    let mut s = |e: &Element| sink(e);
    for chunk in data.chunks(4096) {
        if bd.push(chunk, &img, &mut s).is_break() {
            return Ok(bd.summary());
        }
    }
    let _ = bd.finish(&img, &mut s);
    Ok(bd.summary())
}
