//! One [`PacketParser`] per trace ID, fed from the frame deformatter.

use super::{Packet, PacketParser, PacketSink, PacketStats};
use crate::by_id::ById;
use crate::frame::{ChunkIndex, FrameSink};
use crate::snapshot::EtmConfig;

/// Parsers for up to 128 trace IDs; only the IDs added hold one ([`ById`]).
#[derive(Debug, Clone)]
pub struct PacketDemux {
    parsers: ById<PacketParser>,
    /// Bytes for trace IDs without a parser.
    pub unknown_id_bytes: u64,
}

impl Default for PacketDemux {
    fn default() -> Self {
        Self::new()
    }
}

impl PacketDemux {
    /// No parsers yet.
    pub fn new() -> PacketDemux {
        PacketDemux { parsers: ById::default(), unknown_id_bytes: 0 }
    }

    /// Adds (or replaces) the parser for trace ID `id` (0..=127).
    pub fn add(&mut self, id: u8, cfg: &EtmConfig) {
        self.parsers.insert(id, PacketParser::new(cfg));
    }

    /// See [`PacketParser::set_report_all_unsynced`]; applies to every parser.
    pub fn set_report_all_unsynced(&mut self, on: bool) {
        for p in self.parsers.values_mut() {
            p.set_report_all_unsynced(on);
        }
    }

    /// Trace IDs with a parser, ascending.
    pub fn ids(&self) -> impl Iterator<Item = u8> + '_ {
        self.parsers.ids()
    }

    /// The parser for `id`.
    pub fn parser(&self, id: u8) -> Option<&PacketParser> {
        self.parsers.get(id)
    }

    /// Feeds bytes of trace ID `id`; packets go to `sink(id, index, packet, raw)`.
    pub fn feed<F: FnMut(u8, u64, &Packet, &[u8])>(&mut self, id: u8, index: u64, bytes: &[u8], sink: &mut F) {
        match self.parsers.get_mut(id) {
            Some(p) => p.feed(index, bytes, &mut |i, pk: &Packet, raw: &[u8]| sink(id, i, pk, raw)),
            None => self.unknown_id_bytes += bytes.len() as u64,
        }
    }

    /// Feeds bytes of trace ID `id` to a sink of that ID's packets (which may take atom
    /// packets without a [`Packet`], see [`PacketSink::atoms`]).
    #[inline]
    pub fn feed_to<S: PacketSink + ?Sized>(&mut self, id: u8, index: ChunkIndex, bytes: &[u8], sink: &mut S) {
        match self.parsers.get_mut(id) {
            Some(p) => p.feed_at(index, bytes, sink),
            None => self.unknown_id_bytes += bytes.len() as u64,
        }
    }

    /// Resets every parser (4 x FSYNC barrier, new buffer).
    pub fn reset_all(&mut self) {
        for p in self.parsers.values_mut() {
            p.reset();
        }
    }

    /// End of trace for `id`: flushes an incomplete packet.
    pub fn finish<F: FnMut(u8, u64, &Packet, &[u8])>(&mut self, id: u8, sink: &mut F) {
        if let Some(p) = self.parsers.get_mut(id) {
            p.finish(&mut |i, pk: &Packet, raw: &[u8]| sink(id, i, pk, raw));
        }
    }

    /// Sum of all parsers' counters.
    pub fn stats(&self) -> PacketStats {
        let mut s = PacketStats::default();
        for p in self.parsers.values() {
            let t = p.stats();
            s.bytes += t.bytes;
            s.packets += t.packets;
            s.errors += t.errors;
            s.unsynced_bytes += t.unsynced_bytes;
        }
        s
    }

    /// A [`FrameSink`] feeding this demux and passing packets to `sink`.
    pub fn sink<'a, F: FnMut(u8, u64, &Packet, &[u8])>(&'a mut self, sink: &'a mut F) -> DemuxSink<'a, F> {
        DemuxSink { demux: self, sink }
    }
}

/// [`FrameSink`] adapter returned by [`PacketDemux::sink`].
pub struct DemuxSink<'a, F> {
    demux: &'a mut PacketDemux,
    sink: &'a mut F,
}

impl<F: FnMut(u8, u64, &Packet, &[u8])> FrameSink for DemuxSink<'_, F> {
    fn data(&mut self, id: u8, index: u64, bytes: &[u8]) {
        self.demux.feed(id, index, bytes, self.sink);
    }
    fn reset(&mut self) {
        self.demux.reset_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::Protocol;

    /// Parsers added in any order are found by their ID, listed ascending, replaced in place;
    /// bytes of an ID without one are counted, not parsed.
    #[test]
    fn parsers_by_id_in_any_order() {
        let mut d = PacketDemux::new();
        for id in [0x30, 0x10, 0x7F, 0x20] {
            d.add(id, &EtmConfig::generic(Protocol::Etmv4, id));
        }
        d.add(0x10, &EtmConfig::generic(Protocol::Ete, 0x10));
        assert_eq!(d.ids().collect::<Vec<_>>(), [0x10, 0x20, 0x30, 0x7F]);
        for id in [0x20, 0x30, 0x7F] {
            assert_eq!(d.parser(id).map(|p| p.config().trace_id()), Some(id));
        }
        assert!(d.parser(0x10).unwrap().config().is_ete());
        assert!(d.parser(0x11).is_none() && d.parser(200).is_none());
        let mut n = 0;
        // A-sync, then a trace-info packet: the parser of 0x20 alone sees them.
        let bytes = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x80, 0x01, 0x00];
        d.feed(0x20, 0, &bytes, &mut |id, _, _, _| {
            assert_eq!(id, 0x20);
            n += 1;
        });
        d.feed(0x11, 0, &bytes, &mut |_, _, _, _| panic!("no parser for 0x11"));
        assert!(n > 0);
        assert_eq!(d.unknown_id_bytes, bytes.len() as u64);
        assert_eq!(d.stats().bytes, bytes.len() as u64);
    }
}
