//! Fuzzing entry point shared by the cargo-fuzz target (`fuzz/fuzz_targets/packets.rs`) and
//! the deterministic fuzz test (`tests/packets_fuzz.rs`). Not part of the stable API.

use std::hash::{Hash, Hasher};

use super::{Packet, PacketDemux};
use crate::frame::{Deformatter, StreamFormat};
use crate::listing::write_line;
use crate::snapshot::{CoreProfile, EtmConfig, Protocol};

/// Result of one fuzz run (for corpus statistics).
#[derive(Debug, Clone, Copy, Default)]
pub struct FuzzOutcome {
    /// Packets produced.
    pub packets: u64,
    /// Error packets.
    pub errors: u64,
}

fn config_from(sel: &[u8; 6], id: u8) -> EtmConfig {
    let ete = sel[0] & 4 != 0;
    let mut cfg = EtmConfig::generic(if ete { Protocol::Ete } else { Protocol::Etmv4 }, id);
    if sel[0] & 8 != 0 {
        cfg.core_profile = CoreProfile::M;
    }
    // TRCIDR0: vary commit option, Q support, conditional trace, TS size, cycle counting.
    let b = sel[1];
    cfg.idr[0] ^= ((b as u32 & 1) << 29)
        | ((b as u32 >> 1 & 3) << 15)
        | ((b as u32 >> 3 & 1) << 6)
        | ((b as u32 >> 4 & 1) << 7)
        | ((b as u32 >> 5 & 1) << 23);
    // TRCIDR2: CID size, VMID size, CC size.
    let c = sel[2];
    cfg.idr[2] = (cfg.idr[2] & !((0x1F << 5) | (0x1F << 10) | (0xF << 25)))
        | (if c & 1 != 0 { 4 << 5 } else { 0 })
        | (((c as u32 >> 1) & 7) << 10)
        | (((c as u32 >> 4) & 0xF) << 25);
    // version and max speculation depth
    cfg.idr[1] = (cfg.idr[1] & !0xF0) | (((sel[3] & 7) as u32) << 4);
    cfg.devarch = (cfg.devarch & !0xF_0000) | (((sel[3] >> 3) & 7) as u32) << 16;
    cfg.idr[8] = (sel[4] as u32) & 0x7F;
    cfg.configr ^= (sel[4] as u32 & 0x80) << 1; // conditional trace enable bit 8
    cfg
}

fn run(format: StreamFormat, sel: &[u8; 6], ids: &[u8], data: &[u8], splits: &[usize]) -> (u64, FuzzOutcome) {
    let mut demux = PacketDemux::new();
    for &id in ids {
        demux.add(id, &config_from(sel, id));
    }
    demux.set_report_all_unsynced(sel[5] & 1 != 0);
    let mut h = std::collections::hash_map::DefaultHasher::new();
    let mut line = String::new();
    let mut out = FuzzOutcome::default();
    let ete = sel[0] & 4 != 0;
    let mut sink = |id: u8, idx: u64, p: &Packet, raw: &[u8]| {
        (id, idx, p, raw).hash(&mut h);
        out.packets += 1;
        out.errors += p.is_error() as u64;
        line.clear();
        let _ = write_line(&mut line, idx, id, p, Some(raw), ete);
        assert!(line.len() < 4096, "runaway line");
    };
    let mut d = Deformatter::new(format);
    let mut last = 0;
    for &s in splits.iter().chain(std::iter::once(&data.len())) {
        let s = s.clamp(last, data.len());
        d.push(&data[last..s], &mut demux.sink(&mut sink));
        last = s;
    }
    let all: Vec<u8> = demux.ids().collect();
    for id in all {
        demux.finish(id, &mut sink);
    }
    (h.finish(), out)
}

/// Feeds `data` through deformatter + packet parsers in a configuration chosen by its first
/// bytes, once whole and once split into chunks; panics if anything panics or if the two
/// runs give different packets (the parser must be resumable at any byte boundary).
pub fn check(data: &[u8]) -> FuzzOutcome {
    if data.len() < 7 {
        return FuzzOutcome::default();
    }
    let sel: [u8; 6] = [data[0], data[1], data[2], data[3], data[4], data[5]];
    let seed = data[6];
    let body = &data[7..];
    let format = match sel[0] & 3 {
        0 => StreamFormat::Coresight,
        1 => StreamFormat::Raw { trace_id: 0 },
        2 => StreamFormat::Tpiu,
        _ => StreamFormat::Dstream,
    };
    let ids: &[u8] = match format {
        StreamFormat::Raw { .. } => &[0],
        _ => &[0x01, 0x10, 0x11, 0x12, 0x13, 0x14, 0x15, 0x6F],
    };
    let (whole, outcome) = run(format, &sel, ids, body, &[]);
    // deterministic split points from the seed
    let mut splits = Vec::new();
    let mut x = seed as usize + 1;
    let mut pos = 0;
    while pos < body.len() {
        x = x.wrapping_mul(1103515245).wrapping_add(12345) & 0x7FFF_FFFF;
        pos += 1 + x % 37;
        splits.push(pos);
    }
    let (chunked, _) = run(format, &sel, ids, body, &splits);
    assert_eq!(whole, chunked, "chunked parse differs from whole parse");
    outcome
}
