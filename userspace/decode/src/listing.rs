//! Packet printer in OpenCSD `trc_pkt_lister` line format (OpenCSD 1.8.0
//! `EtmV4ITrcPacket::toString`), so our output diffs against reference listings:
//!
//! ```text
//! Idx:1704; ID:10;<TAB>I_ADDR_S_IS0 : Address, Short, IS0.; Addr=0xFFFFFFC000592B58 ~[0x12B58]
//! ```
//!
//! (`<TAB>` is a tab character.) With raw bytes (as in `-decode` / `-pkt_mon` listings):
//! `Idx:0; ID:0; [0x00 0x00 ... 0x80 ];<TAB>I_ASYNC : Alignment Synchronisation.`

use std::fmt::{self, Write};

use crate::packet::{AddrForm, Atoms, Context, Exception, Packet, PacketType};

/// Appends `v` in decimal.
fn push_dec(s: &mut String, mut v: u64) {
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    for &c in &buf[i..] {
        s.push(c as char);
    }
}

const HEX_UP: &[u8; 16] = b"0123456789ABCDEF";
const HEX_LO: &[u8; 16] = b"0123456789abcdef";

/// Appends `v` in hex, at least `min_digits` digits.
fn push_hex(s: &mut String, v: u64, min_digits: usize, upper: bool) {
    let digits = if upper { HEX_UP } else { HEX_LO };
    let mut buf = [0u8; 16];
    let mut i = buf.len();
    let mut x = v;
    loop {
        i -= 1;
        buf[i] = digits[(x & 0xF) as usize];
        x >>= 4;
        if x == 0 && buf.len() - i >= min_digits {
            break;
        }
    }
    for &c in &buf[i..] {
        s.push(c as char);
    }
}

/// Writes the packet description (`I_NAME : desc...`) without the `Idx`/`ID` prefix.
pub fn write_packet(w: &mut String, p: &Packet, ete: bool) -> fmt::Result {
    let ty = p.packet_type();
    let (name, desc) = ty.name_desc();
    w.push_str(name);
    w.push_str(" : ");
    w.push_str(desc);
    match *p {
        Packet::BadSequence(t) | Packet::IncompleteEot(t) | Packet::ReservedCfg(t, _) => {
            write!(w, "[{}]", t.name())?;
        }
        Packet::Address { addr, context, .. } => {
            if let AddrForm::Match(i) = addr.form {
                write!(w, ", [{i}]; Addr=0x{:016X}; ", addr.addr)?;
            } else {
                w.push_str("; Addr=0x");
                push_hex(w, addr.addr, 16, true);
                match addr.form {
                    AddrForm::Short => {
                        let m = (1u64 << addr.pkt_bits) - 1;
                        w.push_str(" ~[0x");
                        push_hex(w, addr.addr & m, 1, true);
                        w.push(']');
                    }
                    _ => {
                        w.write_str("; ")?;
                        if let Some(c) = context {
                            write_context(w, &c)?;
                        }
                    }
                }
            }
        }
        Packet::Context(c) => {
            w.write_str("; ")?;
            write_context(w, &c)?;
        }
        Packet::Atom { atoms, .. } => {
            w.write_str("; ")?;
            write_atoms(w, atoms)?;
        }
        Packet::Exception(e) => {
            w.write_str("; ")?;
            write_exception(w, &e)?;
        }
        Packet::Timestamp { value, cycle_count, .. } => {
            write!(w, "; Updated val = 0x{value:x}")?;
            if let Some(cc) = cycle_count {
                write!(w, "; CC=0x{cc:x}")?;
            }
        }
        Packet::TraceInfo(ti) => {
            write!(w, "; INFO=0x{:x} {{ CC.{}", ti.info, ti.info & 1)?;
            if ete {
                write!(w, ", TSTATE.{}", (ti.info >> 6) & 1)?;
            }
            w.write_str(" }")?;
            if ti.cc_enabled() {
                write!(w, "; CC_THRESHOLD=0x{:x}", ti.cc_threshold)?;
            }
            if ti.initial {
                if ti.spec_present {
                    write!(w, "; INIT SPEC DEPTH={}", ti.spec_depth)?;
                }
                w.write_str("; Decoder Sync point TINFO")?;
            }
        }
        Packet::CycleCount { count, commit, .. } => {
            w.push_str("; Count=0x");
            push_hex(w, count as u64, 1, false);
            if let Some(c) = commit {
                write!(w, "; Commit({c})")?;
            }
        }
        Packet::Cancel { format, count, atoms, .. } => match format {
            1 => {
                write!(w, "; Cancel({count})")?;
                if ty == PacketType::CancelF1Mispred {
                    w.write_str(", Mispredict")?;
                }
            }
            2 => {
                w.write_str("; ")?;
                if atoms.count > 0 {
                    w.write_str("Atom: ")?;
                    write_atoms(w, atoms)?;
                    w.write_str(", ")?;
                }
                w.write_str("Cancel(1), Mispredict")?;
            }
            _ => {
                w.write_str("; ")?;
                if atoms.count > 0 {
                    w.write_str("Atom: E, ")?;
                }
                write!(w, "Cancel({count}), Mispredict")?;
            }
        },
        Packet::Mispredict(atoms) => {
            w.write_str("; ")?;
            if atoms.count > 0 {
                w.write_str("Atom: ")?;
                write_atoms(w, atoms)?;
                w.write_str(", ")?;
            }
            w.write_str("Mispredict")?;
        }
        Packet::Commit(n) => write!(w, "; Commit({n})")?,
        Packet::Q(q) => {
            match q.count {
                Some(c) => write!(w, "; Count({c})")?,
                None => w.write_str("; Count(Unknown)")?,
            }
            if let Some(a) = q.addr {
                if let AddrForm::Match(i) = a.form {
                    write!(w, "; [{i}]")?;
                }
                write!(w, "; Addr=0x{:016X}", a.addr)?;
                if a.pkt_bits > 0 && a.pkt_bits < 64 && !matches!(a.form, AddrForm::Match(_)) {
                    let m = (1u64 << a.pkt_bits) - 1;
                    write!(w, " ~[0x{:X}]", a.addr & m)?;
                }
            }
        }
        Packet::Ite { el, value } => write!(w, "; EL{el}; Payload=0x{value:x}")?,
        _ => {}
    }
    Ok(())
}

fn write_atoms(w: &mut String, a: Atoms) -> fmt::Result {
    for i in 0..a.count.min(32) {
        w.push(if (a.bits >> i) & 1 != 0 { 'E' } else { 'N' });
    }
    Ok(())
}

fn write_context(w: &mut String, c: &Context) -> fmt::Result {
    if !c.updated {
        return w.write_str("Ctxt: Same");
    }
    let sec = match (c.ns, c.nse) {
        (false, false) => "S; ",
        (true, false) => "NS; ",
        (false, true) => "Root; ",
        (true, true) => "Realm; ",
    };
    write!(w, "Ctxt: {}EL{}, {}", if c.sf { "AArch64," } else { "AArch32, " }, c.el, sec)?;
    if let Some(cid) = c.context_id {
        write!(w, "CID=0x{cid:08x}; ")?;
    }
    if let Some(v) = c.vmid {
        write!(w, "VMID=0x{v:04x}; ")?;
    }
    Ok(())
}

const ARMV8_EXC: [&str; 16] = [
    "PE Reset",
    "Debug Halt",
    "Call",
    "Trap",
    "System Error",
    "Reserved",
    "Inst Debug",
    "Data Debug",
    "Reserved",
    "Reserved",
    "Alignment",
    "Inst Fault",
    "Data Fault",
    "Reserved",
    "IRQ",
    "FIQ",
];
const M_EXC: [&str; 32] = [
    "Reserved",
    "PE Reset",
    "NMI",
    "HardFault",
    "MemManage",
    "BusFault",
    "UsageFault",
    "Reserved",
    "Reserved",
    "Reserved",
    "Reserved",
    "SVC",
    "DebugMonitor",
    "Reserved",
    "PendSV",
    "SysTick",
    "IRQ0",
    "IRQ1",
    "IRQ2",
    "IRQ3",
    "IRQ4",
    "IRQ5",
    "IRQ6",
    "IRQ7",
    "DebugHalt",
    "LazyFP Push",
    "Lockup",
    "Reserved",
    "Reserved",
    "Reserved",
    "Reserved",
    "Reserved",
];

fn write_exception(w: &mut String, e: &Exception) -> fmt::Result {
    w.write_char(' ')?;
    let t = e.exc_type as usize;
    if !e.m_type {
        write!(w, "{};", ARMV8_EXC.get(t).copied().unwrap_or("Reserved"))?;
    } else {
        if t < 0x20 {
            write!(w, "{};", M_EXC[t])?;
        } else if (0x208..=0x3EF).contains(&t) {
            write!(w, "IRQ{};", t - 0x200)?;
        } else {
            w.write_str("Reserved;")?;
        }
        if e.m_fault_pending {
            w.write_str(" Fault Pending;")?;
        }
    }
    match e.addr_interp {
        1 => w.write_str(" Ret Addr Follows;"),
        2 => w.write_str(" Ret Addr Follows, Match Prev;"),
        _ => Ok(()),
    }
}

/// Writes one full listing line (no newline): optional OpenCSD error-message prefix for
/// reserved headers (`PKTP_ETMV4I_...` which OpenCSD prints without a newline), `Idx`, `ID`,
/// optional raw bytes, then the packet text.
pub fn write_line(w: &mut String, index: u64, id: u8, p: &Packet, raw: Option<&[u8]>, ete: bool) -> fmt::Result {
    if matches!(p, Packet::Reserved(_) | Packet::ReservedCfg(..)) {
        write!(
            w,
            "PKTP_ETMV4I_{:04} : 0x0014 (OCSD_ERR_INVALID_PCKT_HDR) [Invalid packet header]; TrcIdx={}; CS ID={:02x}; ",
            id, index, id
        )?;
    }
    w.push_str("Idx:");
    push_dec(w, index);
    w.push_str("; ID:");
    push_hex(w, id as u64, 1, false);
    w.push(';');
    if let Some(raw) = raw {
        w.push_str(" [");
        for b in raw {
            w.push_str("0x");
            push_hex(w, *b as u64, 2, false);
            w.push(' ');
        }
        w.push_str("];");
    }
    w.push('\t');
    write_packet(w, p, ete)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packet::{Address, TraceInfo};

    fn line(p: &Packet, ete: bool) -> String {
        let mut s = String::new();
        write_line(&mut s, 1704, 0x10, p, None, ete).unwrap();
        s
    }

    /// Short-address text matches the juno_r1_1 reference line at Idx 1704.
    #[test]
    fn short_address_text() {
        let p = Packet::Address {
            addr: Address { form: AddrForm::Short, is: 0, addr: 0xFFFF_FFC0_0059_2B58, pkt_bits: 17 },
            context: None,
            source: false,
        };
        assert_eq!(line(&p, false), "Idx:1704; ID:10;\tI_ADDR_S_IS0 : Address, Short, IS0.; Addr=0xFFFFFFC000592B58 ~[0x12B58]");
    }

    /// Trace info text for ETE carries TSTATE, and the first one is the sync point.
    #[test]
    fn trace_info_text() {
        let p = Packet::TraceInfo(TraceInfo { info: 1, cc_threshold: 0x16, initial: true, ..Default::default() });
        assert!(
            line(&p, true).ends_with(
                "I_TRACE_INFO : Trace Info.; INFO=0x1 { CC.1, TSTATE.0 }; CC_THRESHOLD=0x16; Decoder Sync point TINFO"
            )
        );
    }
}

/// Options for [`list_buffer`].
#[derive(Debug, Clone, Copy, Default)]
pub struct ListOptions {
    /// Print the raw packet bytes (`[0x.. ]`) and every unsynchronised block, as
    /// `-decode`/`-pkt_mon` listings do.
    pub raw_bytes: bool,
    /// Do not format lines at all (measure parsing only); `out` is not called for packets.
    pub no_print: bool,
}

/// What [`list_buffer`] processed.
#[derive(Debug, Clone, Copy, Default)]
pub struct ListSummary {
    /// Bytes of the buffer file processed (DSTREAM: footers excluded, as OpenCSD counts).
    pub bytes: u64,
    /// Frame deformatter counters.
    pub frames: crate::frame::FrameStats,
    /// Packet parser counters (all IDs).
    pub packets: crate::packet::PacketStats,
}

/// The deformatter format and per-ID configs for a snapshot buffer: `(format, [(listing id,
/// config)])`. Unformatted buffers list their single source under ID 0, like `trc_pkt_lister`.
pub fn buffer_setup(
    snap: &crate::snapshot::Snapshot,
    buffer: &crate::snapshot::TraceBuffer,
) -> (crate::frame::StreamFormat, Vec<(u8, crate::snapshot::EtmConfig)>) {
    use crate::frame::StreamFormat;
    use crate::snapshot::BufferFormat;
    let sources = snap.sources_for_buffer(&buffer.name);
    match buffer.format {
        BufferFormat::SourceData | BufferFormat::Other(_) => {
            let cfgs = sources.first().map(|s| vec![(0u8, s.config)]).unwrap_or_default();
            (StreamFormat::Raw { trace_id: 0 }, cfgs)
        }
        BufferFormat::Coresight => (StreamFormat::Coresight, sources.iter().map(|s| (s.config.trace_id(), s.config)).collect()),
        BufferFormat::DstreamCoresight => {
            (StreamFormat::Dstream, sources.iter().map(|s| (s.config.trace_id(), s.config)).collect())
        }
    }
}

/// Lists the packets of one snapshot buffer in `trc_pkt_lister` format: the
/// `Protocol printer` lines, one line per packet, `END OF TRACE DATA` per ID and the
/// `Trace buffer done` line. Each line (without newline) goes to `out`.
pub fn list_buffer(
    snap: &crate::snapshot::Snapshot,
    files: &dyn crate::snapshot::SnapshotFiles,
    buffer: &crate::snapshot::TraceBuffer,
    opts: ListOptions,
    out: &mut dyn FnMut(&str),
) -> Result<ListSummary, crate::snapshot::SnapshotError> {
    use crate::frame::Deformatter;
    use crate::packet::PacketDemux;
    let data = files.read(&buffer.file)?;
    let (format, cfgs) = buffer_setup(snap, buffer);
    let mut demux = PacketDemux::new();
    let mut ete = [false; 128];
    for (id, cfg) in &cfgs {
        demux.add(*id, cfg);
        ete[(*id & 0x7F) as usize] = cfg.is_ete();
        let proto = if cfg.is_ete() { "ETE" } else { "ETMV4I" };
        out(&format!("Trace Packet Lister : Protocol printer {proto} on Trace ID 0x{id:x}"));
    }
    demux.set_report_all_unsynced(opts.raw_bytes);
    let mut line = String::with_capacity(256);
    let mut print = |out: &mut dyn FnMut(&str), id: u8, idx: u64, p: &Packet, raw: &[u8]| {
        if opts.no_print {
            return;
        }
        line.clear();
        let _ = write_line(&mut line, idx, id, p, opts.raw_bytes.then_some(raw), ete[(id & 0x7F) as usize]);
        out(&line);
    };
    let mut deformatter = Deformatter::new(format);
    for chunk in data.chunks(1024) {
        let mut sink = |id: u8, idx: u64, p: &Packet, raw: &[u8]| print(&mut *out, id, idx, p, raw);
        deformatter.push(chunk, &mut demux.sink(&mut sink));
    }
    let ids: Vec<u8> = demux.ids().collect();
    for id in ids {
        demux.finish(id, &mut |id: u8, idx: u64, p: &Packet, raw: &[u8]| print(&mut *out, id, idx, p, raw));
        if !opts.no_print {
            out(&format!("ID:{id:x}\tEND OF TRACE DATA"));
        }
    }
    let bytes = deformatter.index();
    out(&format!("Trace Packet Lister : Trace buffer done, processed {bytes} bytes."));
    Ok(ListSummary { bytes, frames: deformatter.stats(), packets: demux.stats() })
}

#[cfg(test)]
mod fmt_tests {
    use super::*;

    /// The hand-written number formatting agrees with `format!` on edge values.
    #[test]
    fn number_helpers_match_std() {
        for v in [0u64, 1, 9, 10, 255, 0x1234_5678_9ABC_DEF0, u64::MAX] {
            let mut s = String::new();
            push_dec(&mut s, v);
            assert_eq!(s, format!("{v}"));
            s.clear();
            push_hex(&mut s, v, 16, true);
            assert_eq!(s, format!("{v:016X}"));
            s.clear();
            push_hex(&mut s, v, 2, false);
            assert_eq!(s, format!("{v:02x}"));
        }
    }
}
