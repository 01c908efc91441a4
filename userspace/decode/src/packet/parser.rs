//! Resumable byte-at-a-time ETMv4/ETE packet parser.
//!
//! The state machine follows IHI 0064 (instruction trace packet headers) and DDI 0608 (ETE packets)
//! (ETE packet encodings), with OpenCSD's `TrcPktProcEtmV4I` behaviour for
//! synchronisation, error packets and index reporting, so that listings compare
//! line-for-line with `trc_pkt_lister`.

use super::{AddrForm, Address, Atoms, Context, Exception, Packet, PacketSink, PacketType, QPacket, TraceInfo};
use crate::cache::RunKey;
use crate::frame::ChunkIndex;
use crate::snapshot::{CoreProfile, EtmConfig};

/// Maximum bytes buffered for one packet; longer packets are reported as `BadSequence`.
const MAX_PKT: usize = 48;

/// Counters kept by the parser.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PacketStats {
    /// Bytes fed.
    pub bytes: u64,
    /// Packets emitted (including error packets).
    pub packets: u64,
    /// Error packets (reserved header, bad sequence, incomplete at end).
    pub errors: u64,
    /// Bytes skipped while unsynchronised.
    pub unsynced_bytes: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Hdr,
    Data,
    SendPkt,
    SendUnsynced,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum H {
    NotSync,
    NoPayload,
    Reserved,
    InvalidCfg,
    Extension,
    ASync,
    TraceInfo,
    Timestamp,
    Exception,
    CycleCnt,
    SpeclRes,
    CondInstr,
    CondResult,
    Context,
    AddrCtxt,
    ShortAddr,
    LongAddr,
    Q,
    Atom,
    Ite,
}

#[derive(Debug, Clone, Copy, Default)]
struct VAddr {
    val: u64,
    is: u8,
    pkt_bits: u8,
}

/// Packet parser for one trace source. See the [module docs](super) for the API.
#[derive(Debug, Clone)]
pub struct PacketParser {
    cfg: EtmConfig,
    table: [(PacketType, H); 256],
    /// Per header byte, the atom packet it is (format 0: not an atom header): single-byte
    /// atom packets are decoded by one lookup.
    atom_table: [(u8, Atoms); 256],
    /// Per header byte, the run-cache key of its atoms (see [`Lookahead::run_key`]).
    run_keys: [RunKey; 256],
    state: State,
    buf: [u8; MAX_PKT],
    len: usize,
    handler: H,
    ty: PacketType,
    err_ty: PacketType,
    err_hdr: u8,
    packet_index: u64,
    block_index: ChunkIndex,
    processed: usize,
    update_on_unsync: u64,
    dump_unsynced: usize,
    is_sync: bool,
    first_trace_info: bool,
    sent_notsync: bool,
    monitor_unsynced: bool,
    // per-handler scratch
    tinfo_flags: u8,
    tinfo_ctrl_bytes: u8,
    excep_size: usize,
    count_done: bool,
    commit_done: bool,
    has_count: bool,
    f2_maxspec: bool,
    addr_is: u8,
    addr_bytes: u8,
    addr64: bool,
    vmid_bytes: u8,
    cid_bytes: u8,
    ctxt_info_done: bool,
    addr_done: bool,
    q_type: u8,
    q_has_addr: bool,
    q_addr_short: bool,
    q_addr_match: bool,
    f1p1: bool,
    f1p2: bool,
    // persistent packet state (OpenCSD EtmV4ITrcPacket fields that live across packets)
    vaddr: VAddr,
    vstack: [VAddr; 3],
    ctx: Context,
    ctx_valid: bool,
    cid: u32,
    vmid: u32,
    ts: u64,
    ts_valid: bool,
    cc_threshold: u32,
    // the packet being built
    out: Packet,
    stats: PacketStats,
}

impl PacketParser {
    /// A parser for the source described by `cfg`, waiting for A-sync.
    pub fn new(cfg: &EtmConfig) -> PacketParser {
        let mut p = PacketParser {
            cfg: *cfg,
            table: [(PacketType::Reserved, H::Reserved); 256],
            atom_table: [(0, Atoms::default()); 256],
            run_keys: [RunKey::default(); 256],
            state: State::Hdr,
            buf: [0; MAX_PKT],
            len: 0,
            handler: H::NotSync,
            ty: PacketType::NotSync,
            err_ty: PacketType::NoErrType,
            err_hdr: 0,
            packet_index: 0,
            block_index: ChunkIndex::linear(0),
            processed: 0,
            update_on_unsync: 0,
            dump_unsynced: 0,
            is_sync: false,
            first_trace_info: false,
            sent_notsync: false,
            monitor_unsynced: false,
            tinfo_flags: 0,
            tinfo_ctrl_bytes: 0,
            excep_size: 3,
            count_done: false,
            commit_done: false,
            has_count: false,
            f2_maxspec: false,
            addr_is: 0,
            addr_bytes: 0,
            addr64: false,
            vmid_bytes: 0,
            cid_bytes: 0,
            ctxt_info_done: false,
            addr_done: false,
            q_type: 0,
            q_has_addr: false,
            q_addr_short: false,
            q_addr_match: false,
            f1p1: false,
            f1p2: false,
            vaddr: VAddr::default(),
            vstack: [VAddr::default(); 3],
            ctx: Context::default(),
            ctx_valid: false,
            cid: 0,
            vmid: 0,
            ts: 0,
            ts_valid: false,
            cc_threshold: 0,
            out: Packet::NotSync,
            stats: PacketStats::default(),
        };
        p.build_table();
        for b in 0..=255u8 {
            if let (ty, H::Atom) = p.table[b as usize] {
                let (format, atoms) = atom_of(ty, b);
                p.atom_table[b as usize] = (format, atoms);
                p.run_keys[b as usize] = RunKey::of_packet(atoms.bits, atoms.count);
            }
        }
        p
    }

    /// Report every block of skipped unsynchronised bytes as a [`Packet::NotSync`] (with its
    /// raw bytes), as OpenCSD's raw packet monitor (`-pkt_mon`, `-decode` listings) does.
    /// By default only the first one is reported, like OpenCSD's packet sink.
    pub fn set_report_all_unsynced(&mut self, on: bool) {
        self.monitor_unsynced = on;
    }

    /// The configuration this parser was built with.
    pub fn config(&self) -> &EtmConfig {
        &self.cfg
    }

    /// Counters so far.
    pub fn stats(&self) -> PacketStats {
        self.stats
    }

    /// Forgets all state (partial packet, sync, address history) and waits for A-sync.
    pub fn reset(&mut self) {
        self.init_packet_state();
        self.handler = H::NotSync;
        self.packet_index = 0;
        self.is_sync = false;
        self.first_trace_info = false;
        self.sent_notsync = false;
        self.state = State::Hdr;
        self.vaddr = VAddr::default();
        self.vstack = [VAddr::default(); 3];
        self.ctx = Context::default();
        self.ctx_valid = false;
        self.ts = 0;
        self.ts_valid = false;
    }

    /// Between packets the per-packet state is as
    /// [`init_packet_state`](Self::init_packet_state) leaves it.
    #[inline(always)]
    fn debug_assert_initialised(&self) {
        debug_assert!(self.len == 0 && self.err_ty == PacketType::NoErrType && self.update_on_unsync == 0);
    }

    fn init_packet_state(&mut self) {
        self.len = 0;
        self.err_ty = PacketType::NoErrType;
        self.update_on_unsync = 0;
    }

    /// Feeds `data`, whose first byte has trace index `index`. Each complete packet is passed
    /// to `sink(packet_index, &packet, raw_bytes)`.
    pub fn feed<S: PacketSink + ?Sized>(&mut self, index: u64, data: &[u8], sink: &mut S) {
        self.feed_at(ChunkIndex::linear(index), data, sink);
    }

    /// [`feed`](Self::feed) of `data` whose bytes have the trace indices `index` gives.
    #[inline(never)]
    pub fn feed_at<S: PacketSink + ?Sized>(&mut self, index: ChunkIndex, data: &[u8], sink: &mut S) {
        self.block_index = index;
        self.processed = 0;
        self.stats.bytes += data.len() as u64;
        loop {
            match self.state {
                State::Hdr => {
                    if self.is_sync {
                        // fast path: single-byte atom packets dominate real traces; each is one
                        // table lookup and goes to the sink without a `Packet` (between
                        // packets the per-packet state is already initialised), the run of
                        // them in one call (see `PacketSink::atom_run`)
                        let p = self.processed;
                        if let Some(rest) = data.get(p..) {
                            let index = self.block_index.skip(p);
                            let mut look = Lookahead { parser: self, addr_bytes: 0 };
                            let n = sink.atom_run(index, rest, &mut look);
                            let addr_bytes = look.addr_bytes;
                            self.processed = p + n;
                            // (the address packets were counted as they were parsed)
                            self.stats.packets += (n - addr_bytes) as u64;
                        }
                    }
                    if self.processed >= data.len() {
                        break;
                    }
                    if self.is_sync && self.whole(data, self.processed, sink) {
                        self.init_packet_state();
                        continue;
                    }
                    self.packet_index = self.block_index.at(self.processed);
                    if self.is_sync {
                        let b = data[self.processed];
                        let (t, h) = self.table[b as usize];
                        self.ty = t;
                        self.handler = h;
                    } else {
                        self.handler = H::NotSync;
                        self.ty = PacketType::NotSync;
                    }
                    self.state = State::Data;
                }
                State::Data => {
                    while self.processed < data.len() && self.state == State::Data {
                        let b = data[self.processed];
                        self.processed += 1;
                        if self.len >= MAX_PKT {
                            // over-long packet: report and drop what we have
                            self.err_ty = self.ty;
                            self.out = Packet::BadSequence(self.ty);
                            self.state = State::SendPkt;
                            self.processed -= 1;
                            break;
                        }
                        self.buf[self.len] = b;
                        self.len += 1;
                        self.handle(b);
                    }
                    if self.state == State::Data {
                        break;
                    }
                }
                State::SendPkt => {
                    self.emit(sink);
                    self.init_packet_state();
                    self.state = State::Hdr;
                }
                State::SendUnsynced => {
                    if self.processed >= data.len() {
                        break;
                    }
                    self.output_unsynced(sink);
                    if self.update_on_unsync != 0 {
                        self.packet_index = self.update_on_unsync;
                        self.update_on_unsync = 0;
                    }
                    self.state = State::Data;
                }
            }
        }
    }

    /// End of trace: a partial packet is emitted as [`Packet::IncompleteEot`].
    pub fn finish<S: PacketSink + ?Sized>(&mut self, sink: &mut S) {
        if self.state == State::SendPkt {
            self.emit(sink);
            self.init_packet_state();
            self.state = State::Hdr;
        }
        if self.len != 0 {
            let t = if self.ty == PacketType::NotSync && !self.is_sync { PacketType::NotSync } else { self.ty };
            self.out = Packet::IncompleteEot(t);
            self.stats.errors += 1;
            self.stats.packets += 1;
            sink.packet(self.packet_index, &self.out, &self.buf[..self.len]);
            self.init_packet_state();
            self.state = State::Hdr;
        }
    }

    fn emit<S: PacketSink + ?Sized>(&mut self, sink: &mut S) {
        self.stats.packets += 1;
        if self.out.is_error() {
            self.stats.errors += 1;
        }
        sink.packet(self.packet_index, &self.out, &self.buf[..self.len]);
    }

    fn output_unsynced<S: PacketSink + ?Sized>(&mut self, sink: &mut S) {
        let n = self.dump_unsynced.min(self.len);
        self.stats.unsynced_bytes += n as u64;
        if !self.sent_notsync || self.monitor_unsynced {
            self.stats.packets += 1;
            // OpenCSD outputs the packet being built; while unsynced that is NOT_SYNC
            let pkt = if self.ty == PacketType::Async { Packet::Async } else { Packet::NotSync };
            sink.packet(self.packet_index, &pkt, &self.buf[..n]);
            self.sent_notsync = true;
        }
        self.buf.copy_within(n..self.len, 0);
        self.len -= n;
    }

    fn build_table(&mut self) {
        use PacketType as T;
        let t = &mut self.table;
        let cfg = &self.cfg;
        let full = cfg.full_version();
        let ete = cfg.is_ete();
        t[0x00] = (T::Extension, H::Extension);
        t[0x01] = (T::TraceInfo, H::TraceInfo);
        t[0x02] = (T::Timestamp, H::Timestamp);
        t[0x03] = (T::Timestamp, H::Timestamp);
        t[0x04] = (T::TraceOn, H::NoPayload);
        t[0x05] = (T::FuncRet, if cfg.core_profile == CoreProfile::M && full >= 0x42 { H::NoPayload } else { H::Reserved });
        t[0x06] = (T::Except, H::Exception);
        t[0x07] = (T::ExceptRtn, if ete { H::InvalidCfg } else { H::NoPayload });
        if ete {
            t[0x0A] = (T::TransSt, H::NoPayload);
            t[0x0B] = (T::TransCommit, H::NoPayload);
            if cfg.minor_version() >= 3 {
                t[0x09] = (T::Ite, H::Ite);
            }
        }
        t[0x0C] = (T::CcntF2, H::CycleCnt);
        t[0x0D] = (T::CcntF2, H::CycleCnt);
        t[0x0E] = (T::CcntF1, H::CycleCnt);
        t[0x0F] = (T::CcntF1, H::CycleCnt);
        for e in &mut t[0x10..=0x1F] {
            *e = (T::CcntF3, H::CycleCnt);
        }
        let data = cfg.data_trace_enabled();
        for e in &mut t[0x20..=0x27] {
            *e = (T::NumDsMkr, if data { H::NoPayload } else { H::InvalidCfg });
        }
        for e in &mut t[0x28..=0x2C] {
            *e = (T::UnnumDsMkr, if data { H::NoPayload } else { H::InvalidCfg });
        }
        t[0x2D] = (T::Commit, H::SpeclRes);
        t[0x2E] = (T::CancelF1, H::SpeclRes);
        t[0x2F] = (T::CancelF1Mispred, H::SpeclRes);
        for e in &mut t[0x30..=0x33] {
            *e = (T::Mispredict, H::SpeclRes);
        }
        for e in &mut t[0x34..=0x37] {
            *e = (T::CancelF2, H::SpeclRes);
        }
        for e in &mut t[0x38..=0x3F] {
            *e = (T::CancelF3, H::SpeclRes);
        }
        let cond = cfg.has_cond_trace() && cfg.cond_trace_enabled();
        let ch = |h: H| if cond { h } else { H::InvalidCfg };
        for e in &mut t[0x40..=0x42] {
            *e = (T::CondIF2, ch(H::CondInstr));
        }
        t[0x43] = (T::CondFlush, ch(H::NoPayload));
        for e in &mut t[0x44..=0x46] {
            *e = (T::CondResF4, ch(H::CondResult));
        }
        for i in (0x48..=0x4A).chain(0x4C..=0x4E) {
            t[i] = (T::CondResF2, ch(H::CondResult));
        }
        for e in &mut t[0x50..=0x5F] {
            *e = (T::CondResF3, ch(H::CondResult));
        }
        for e in &mut t[0x68..=0x6B] {
            *e = (T::CondResF1, ch(H::CondResult));
        }
        t[0x6C] = (T::CondIF1, ch(H::CondInstr));
        t[0x6D] = (T::CondIF3, ch(H::CondInstr));
        t[0x6E] = (T::CondResF1, ch(H::CondResult));
        t[0x6F] = (T::CondResF1, ch(H::CondResult));
        if full >= 0x43 {
            t[0x70] = (T::Ignore, H::NoPayload);
        }
        for e in &mut t[0x71..=0x7F] {
            *e = (T::Event, H::NoPayload);
        }
        t[0x80] = (T::Ctxt, H::Context);
        t[0x81] = (T::Ctxt, H::Context);
        t[0x82] = (T::AddrCtxtL32Is0, H::AddrCtxt);
        t[0x83] = (T::AddrCtxtL32Is1, H::AddrCtxt);
        t[0x85] = (T::AddrCtxtL64Is0, H::AddrCtxt);
        t[0x86] = (T::AddrCtxtL64Is1, H::AddrCtxt);
        if full >= 0x46 {
            t[0x88] = (T::TsMarker, H::NoPayload);
        }
        for e in &mut t[0x90..=0x92] {
            *e = (T::AddrMatch, H::NoPayload);
        }
        t[0x95] = (T::AddrSIs0, H::ShortAddr);
        t[0x96] = (T::AddrSIs1, H::ShortAddr);
        t[0x9A] = (T::AddrL32Is0, H::LongAddr);
        t[0x9B] = (T::AddrL32Is1, H::LongAddr);
        t[0x9D] = (T::AddrL64Is0, H::LongAddr);
        t[0x9E] = (T::AddrL64Is1, H::LongAddr);
        for i in 0..16usize {
            let h = match i {
                3 | 4 | 7 | 8 | 9 | 0xD | 0xE => H::Reserved,
                _ if cfg.has_q_elem() => H::Q,
                _ => H::Reserved,
            };
            t[0xA0 + i] = (T::Q, h);
        }
        if full >= 0x50 {
            for e in &mut t[0xB0..=0xB2] {
                *e = (T::SrcAddrMatch, H::NoPayload);
            }
            t[0xB4] = (T::SrcAddrSIs0, H::ShortAddr);
            t[0xB5] = (T::SrcAddrSIs1, H::ShortAddr);
            t[0xB6] = (T::SrcAddrL32Is0, H::LongAddr);
            t[0xB7] = (T::SrcAddrL32Is1, H::LongAddr);
            t[0xB8] = (T::SrcAddrL64Is0, H::LongAddr);
            t[0xB9] = (T::SrcAddrL64Is1, H::LongAddr);
        }
        for e in &mut t[0xC0..=0xD4] {
            *e = (T::AtomF6, H::Atom);
        }
        for e in &mut t[0xD5..=0xD7] {
            *e = (T::AtomF5, H::Atom);
        }
        for e in &mut t[0xD8..=0xDB] {
            *e = (T::AtomF2, H::Atom);
        }
        for e in &mut t[0xDC..=0xDF] {
            *e = (T::AtomF4, H::Atom);
        }
        for e in &mut t[0xE0..=0xF4] {
            *e = (T::AtomF6, H::Atom);
        }
        t[0xF5] = (T::AtomF5, H::Atom);
        t[0xF6] = (T::AtomF1, H::Atom);
        t[0xF7] = (T::AtomF1, H::Atom);
        for e in &mut t[0xF8..=0xFF] {
            *e = (T::AtomF3, H::Atom);
        }
    }

    #[inline]
    fn send(&mut self, p: Packet) {
        self.out = p;
        self.state = State::SendPkt;
    }

    fn bad_sequence(&mut self, ty: PacketType) {
        self.err_ty = ty;
        self.send(Packet::BadSequence(ty));
    }

    fn handle(&mut self, b: u8) {
        match self.handler {
            H::NotSync => self.h_not_sync(b),
            H::NoPayload => self.h_no_payload(b),
            H::Reserved => {
                self.err_hdr = b;
                self.send(Packet::Reserved(b));
            }
            H::InvalidCfg => {
                self.err_hdr = b;
                let t = self.ty;
                self.send(Packet::ReservedCfg(t, b));
            }
            H::Extension => self.h_extension(b),
            H::ASync => self.h_async(b),
            H::TraceInfo => self.h_trace_info(b),
            H::Timestamp => self.h_timestamp(b),
            H::Exception => self.h_exception(b),
            H::CycleCnt => self.h_cycle_count(b),
            H::SpeclRes => self.h_specl_res(b),
            H::CondInstr => self.h_cond_instr(b),
            H::CondResult => self.h_cond_result(b),
            H::Context => self.h_context(b),
            H::AddrCtxt => self.h_addr_ctxt(b),
            H::ShortAddr => self.h_short_addr(b),
            H::LongAddr => self.h_long_addr(b),
            H::Q => self.h_q(b),
            H::Atom => self.h_atom(b),
            H::Ite => self.h_ite(),
        }
    }

    fn h_not_sync(&mut self, b: u8) {
        if b == 0x00 {
            if self.len > 1 {
                self.dump_unsynced = self.len - 1;
                self.state = State::SendUnsynced;
                self.update_on_unsync = self.block_index.at(self.processed - 1);
            } else {
                self.packet_index = self.block_index.at(self.processed - 1);
            }
            self.handler = H::Extension;
        } else if self.len >= 8 {
            self.dump_unsynced = self.len;
            self.state = State::SendUnsynced;
            // the index one past the byte (as OpenCSD counts it within the frame's data: a
            // frame's last byte is followed by its flag byte's index)
            self.update_on_unsync = self.block_index.at(self.processed - 1) + 1;
        }
    }

    fn h_no_payload(&mut self, b: u8) {
        use PacketType as T;
        let p = match self.ty {
            T::AddrMatch | T::SrcAddrMatch => self.addr_match_packet(b),
            T::Event => Packet::Event(b & 0xF),
            T::NumDsMkr => Packet::DataSyncMarker { numbered: true, value: b & 7 },
            T::UnnumDsMkr => Packet::DataSyncMarker { numbered: false, value: b & 7 },
            T::CondFlush => Packet::Conditional(T::CondFlush),
            T::ExceptRtn => Packet::ExceptionReturn,
            T::TraceOn => Packet::TraceOn,
            T::FuncRet => Packet::FuncRet,
            T::Ignore => Packet::Ignore,
            T::TsMarker => Packet::TsMarker,
            T::TransSt => Packet::TransStart,
            T::TransCommit => Packet::TransCommit,
            other => Packet::Conditional(other),
        };
        self.send(p);
    }

    fn h_extension(&mut self, b: u8) {
        if self.len == 2 {
            if !self.is_sync && b != 0x00 {
                self.handler = H::NotSync;
                self.ty = PacketType::NotSync;
                return;
            }
            match b {
                0x03 => self.send(Packet::Discard),
                0x05 => self.send(Packet::Overflow),
                0x00 => {
                    self.ty = PacketType::Async;
                    self.handler = H::ASync;
                }
                _ => self.bad_sequence(PacketType::Extension),
            }
        }
    }

    fn h_async(&mut self, b: u8) {
        if b != 0x00 {
            if !self.is_sync && self.len != 12 {
                self.handler = H::NotSync;
                self.ty = PacketType::NotSync;
                return;
            }
            if self.len != 12 || b != 0x80 {
                self.bad_sequence(PacketType::Async);
            } else {
                self.is_sync = true;
                self.send(Packet::Async);
            }
        } else if self.len == 12 {
            if !self.is_sync {
                self.dump_unsynced = 1;
                self.state = State::SendUnsynced;
            } else {
                self.bad_sequence(PacketType::Async);
            }
        }
    }

    /// Continuation field (7 bits per byte, bit 7 = more) starting at `st`; returns
    /// (value, bytes used).
    fn cont_field(&self, st: usize, limit: usize) -> (u32, usize) {
        cont_field_in(&self.buf[..self.len], st, limit)
    }

    fn h_trace_info(&mut self, b: u8) {
        const INFO: u8 = 0x01;
        const KEY: u8 = 0x02;
        const SPEC: u8 = 0x04;
        const CYCT: u8 = 0x08;
        const WNDW: u8 = 0x10;
        const ALL_SECT: u8 = 0x1F;
        const CTRL: u8 = 0x20;
        const ALL: u8 = 0x3F;
        let done = b & 0x80 == 0;
        match self.len {
            1 => {
                self.tinfo_flags = 0;
                self.tinfo_ctrl_bytes = 1;
            }
            2 => {
                self.tinfo_flags = !b & ALL_SECT;
                if done {
                    self.tinfo_flags |= CTRL;
                }
            }
            _ => {
                let f = self.tinfo_flags;
                if f & CTRL == 0 {
                    if done {
                        self.tinfo_flags |= CTRL;
                    }
                    self.tinfo_ctrl_bytes = self.tinfo_ctrl_bytes.saturating_add(1);
                } else {
                    for s in [INFO, KEY, SPEC, CYCT, WNDW] {
                        if f & s == 0 {
                            if done {
                                self.tinfo_flags |= s;
                            }
                            break;
                        }
                    }
                }
            }
        }
        if self.tinfo_flags == ALL {
            let mut idx = self.tinfo_ctrl_bytes as usize + 1;
            let pres = self.buf[1] & ALL_SECT;
            let mut ti = TraceInfo::default();
            self.clear_trace_info();
            if pres & INFO != 0 && idx < self.len {
                let (v, n) = self.cont_field(idx, 5);
                idx += n;
                ti.info = v;
            }
            if pres & KEY != 0 && idx < self.len {
                let (v, n) = self.cont_field(idx, 5);
                idx += n;
                ti.key = v;
            }
            if pres & SPEC != 0 && idx < self.len {
                let (v, n) = self.cont_field(idx, 5);
                idx += n;
                ti.spec_depth = v;
                ti.spec_present = true;
            }
            if pres & CYCT != 0 && idx < self.len {
                let (v, _n) = self.cont_field(idx, 5);
                self.cc_threshold = v;
            }
            ti.cc_threshold = self.cc_threshold;
            if !self.first_trace_info {
                ti.initial = true;
                self.first_trace_info = true;
            }
            self.send(Packet::TraceInfo(ti));
        }
    }

    fn clear_trace_info(&mut self) {
        self.ts_valid = false;
        self.ctx_valid = false;
        self.vstack = [VAddr::default(); 3];
        self.vaddr = VAddr::default();
    }

    fn h_timestamp(&mut self, _b: u8) {
        if timestamp_len(&self.buf[..self.len]).is_some() {
            let buf = self.buf;
            let p = self.timestamp_packet(&buf[..self.len]);
            self.send(p);
        }
    }

    /// The timestamp packet `b` (whole, see [`timestamp_len`]): the timestamp it updates and
    /// its cycle count.
    #[inline]
    fn timestamp_packet(&mut self, b: &[u8]) -> Packet {
        let mut val: u64 = 0;
        let mut n = 0usize;
        while 1 + n < b.len() {
            let byte = b[1 + n];
            if n == 8 {
                val |= (byte as u64) << 56;
                n += 1;
                break;
            }
            val |= ((byte & 0x7F) as u64) << (7 * n);
            n += 1;
            if byte & 0x80 == 0 {
                break;
            }
        }
        let mut bits: u32 = if n >= 9 { 64 } else { 7 * n as u32 };
        if !self.ts_valid && self.first_trace_info {
            bits = 64;
        }
        let mask = if bits >= 64 { u64::MAX } else { (1u64 << bits) - 1 };
        self.ts = (self.ts & !mask) | (val & mask);
        self.ts_valid = true;
        let cycle_count = if b[0] & 1 == 1 {
            let (c, _) = cont_field_in(b, 1 + n, 3);
            let cc_size = self.cfg.cc_size().min(32);
            let m = if cc_size >= 32 { u32::MAX } else { (1u32 << cc_size) - 1 };
            Some(c & m)
        } else {
            None
        };
        Packet::Timestamp { value: self.ts, bits: bits as u8, cycle_count }
    }

    fn h_exception(&mut self, b: u8) {
        match self.len {
            1 => self.excep_size = 3,
            2 => {
                if b & 0x80 == 0 {
                    self.excep_size = 2;
                }
                if self.cfg.is_ete() {
                    let t = (b >> 1) & 0x1F;
                    if t == 0 || t == 0x18 {
                        self.excep_size = 3;
                    }
                }
            }
            _ => {}
        }
        if self.len == self.excep_size {
            let b1 = self.buf[1];
            let mut etype = ((b1 >> 1) & 0x1F) as u16;
            let addr_interp = ((b1 & 0x40) >> 5) | (b1 & 1);
            let mut fault = false;
            if b1 & 0x80 != 0 {
                etype |= ((self.buf[2] & 0x1F) as u16) << 5;
                fault = (self.buf[2] >> 5) & 1 != 0;
            }
            let e = Exception {
                exc_type: etype,
                addr_interp,
                m_fault_pending: fault,
                m_type: self.cfg.core_profile == CoreProfile::M,
            };
            let p = if self.cfg.is_ete() && etype == 0x18 {
                Packet::TransFail(e)
            } else if self.cfg.is_ete() && etype == 0 {
                Packet::PeReset(e)
            } else {
                Packet::Exception(e)
            };
            self.send(p);
        }
    }

    fn h_cycle_count(&mut self, b: u8) {
        use PacketType as T;
        let fmt = self.ty;
        let opt1 = self.cfg.commit_opt1();
        if self.len == 1 {
            self.count_done = false;
            self.commit_done = false;
            self.has_count = true;
            self.f2_maxspec = false;
            match fmt {
                T::CcntF3 => {
                    let commit = if !opt1 { Some(((b >> 2) & 3) as u32 + 1) } else { None };
                    let count = self.cc_threshold.wrapping_add((b & 3) as u32);
                    self.send(Packet::CycleCount { format: 3, count, commit });
                    return;
                }
                T::CcntF1 => {
                    if b & 1 == 1 {
                        self.has_count = false;
                        self.count_done = true;
                    }
                    if opt1 {
                        self.commit_done = true;
                    }
                }
                _ => {
                    self.f2_maxspec = b & 1 == 1;
                }
            }
        } else if fmt == T::CcntF2 && self.len == 2 {
            let count = self.cc_threshold.wrapping_add((b & 0xF) as u32);
            let commit = if !opt1 {
                let off: i64 = if self.f2_maxspec { self.cfg.max_spec_depth() as i64 - 15 } else { 1 };
                Some((((b >> 4) & 0xF) as i64 + off) as u32)
            } else {
                None
            };
            self.send(Packet::CycleCount { format: 2, count, commit });
            return;
        } else if !self.commit_done {
            self.commit_done = b & 0x80 == 0;
        } else if !self.count_done {
            self.count_done = b & 0x80 == 0;
        }
        if fmt == T::CcntF1 && self.commit_done && self.count_done {
            let mut idx = 1;
            let mut commit = None;
            if !opt1 {
                let (v, n) = self.cont_field(idx, 5);
                idx += n;
                commit = Some(v);
            }
            let count = if self.has_count {
                let (v, _) = self.cont_field(idx, 3);
                v.wrapping_add(self.cc_threshold)
            } else {
                0
            };
            self.send(Packet::CycleCount { format: 1, count, commit });
        }
    }

    fn h_specl_res(&mut self, b: u8) {
        use PacketType as T;
        if self.len == 1 {
            match self.ty {
                T::Mispredict | T::CancelF2 => {
                    let atoms = match b & 3 {
                        1 => Atoms { bits: 1, count: 1 },
                        2 => Atoms { bits: 3, count: 2 },
                        3 => Atoms { bits: 0, count: 1 },
                        _ => Atoms::default(),
                    };
                    if self.ty == T::CancelF2 {
                        self.send(Packet::Cancel { format: 2, count: 1, mispredict: true, atoms });
                    } else {
                        self.send(Packet::Mispredict(atoms));
                    }
                }
                T::CancelF3 => {
                    let atoms = if b & 1 != 0 { Atoms { bits: 1, count: 1 } } else { Atoms::default() };
                    let count = ((b >> 1) & 3) as u32 + 2;
                    self.send(Packet::Cancel { format: 3, count, mispredict: true, atoms });
                }
                _ => {}
            }
        } else if b & 0x80 == 0 {
            let (v, _) = self.cont_field(1, 5);
            let p = match self.ty {
                T::Commit => Packet::Commit(v),
                T::CancelF1Mispred => Packet::Cancel { format: 1, count: v, mispredict: true, atoms: Atoms::default() },
                _ => Packet::Cancel { format: 1, count: v, mispredict: false, atoms: Atoms::default() },
            };
            self.send(p);
        }
    }

    fn h_cond_instr(&mut self, b: u8) {
        use PacketType as T;
        let mut f1_done = false;
        if self.len == 1 {
            if self.ty == T::CondIF2 {
                self.send(Packet::Conditional(T::CondIF2));
            }
        } else if self.len == 2 {
            if self.ty == T::CondIF3 {
                self.send(Packet::Conditional(T::CondIF3));
            } else {
                f1_done = b & 0x80 == 0;
            }
        } else {
            f1_done = b & 0x80 == 0;
        }
        if f1_done {
            let t = self.ty;
            self.send(Packet::Conditional(t));
        }
    }

    fn h_cond_result(&mut self, b: u8) {
        use PacketType as T;
        if self.len == 1 {
            self.f1p1 = false;
            self.f1p2 = false;
            match self.ty {
                T::CondResF1 if b & 0xFC == 0x6C => self.f1p2 = true,
                T::CondResF2 | T::CondResF4 => {
                    let t = self.ty;
                    self.send(Packet::Conditional(t));
                }
                _ => {}
            }
        } else if self.ty == T::CondResF3 && self.len == 2 {
            self.send(Packet::Conditional(T::CondResF3));
        } else {
            if !self.f1p1 {
                self.f1p1 = b & 0x80 == 0;
            } else if !self.f1p2 {
                self.f1p2 = b & 0x80 == 0;
            }
            if self.f1p1 && self.f1p2 {
                self.send(Packet::Conditional(T::CondResF1));
            }
        }
    }

    fn h_context(&mut self, b: u8) {
        let mut send = false;
        if self.len == 1 {
            if b & 1 == 0 {
                self.ctx_valid = true;
                let mut c = self.ctx;
                c.updated = false;
                c.context_id = None;
                c.vmid = None;
                self.send(Packet::Context(c));
            }
        } else if self.len == 2 {
            if b & 0xC0 == 0 {
                send = true;
            } else {
                let (nv, nc) = self.id_bytes(b);
                (self.vmid_bytes, self.cid_bytes) = (nv as u8, nc as u8);
                send = self.vmid_bytes == 0 && self.cid_bytes == 0;
            }
        } else {
            if self.vmid_bytes > 0 {
                self.vmid_bytes -= 1;
            } else if self.cid_bytes > 0 {
                self.cid_bytes -= 1;
            }
            send = self.vmid_bytes == 0 && self.cid_bytes == 0;
        }
        if send {
            let c = self.extract_context(1);
            self.send(Packet::Context(c));
        }
    }

    /// Applies the context info byte at `st` (and VMID/CID bytes after it).
    fn extract_context(&mut self, st: usize) -> Context {
        let info = self.buf[st];
        self.ctx_valid = true;
        self.ctx.updated = true;
        self.ctx.el = info & 3;
        self.ctx.nse = info & 0x08 != 0 && self.cfg.is_ete();
        self.ctx.sf = info & 0x10 != 0;
        self.ctx.ns = info & 0x20 != 0;
        let (nv, nc) = self.id_bytes(info);
        let mut i = st + 1;
        let mut c = self.ctx;
        c.vmid = None;
        c.context_id = None;
        if nv > 0 {
            let mut v = 0u32;
            for k in 0..nv {
                v |= (*self.buf.get(i + k).unwrap_or(&0) as u32) << (8 * k);
            }
            i += nv;
            self.vmid = v;
            c.vmid = Some(v);
        }
        if nc > 0 {
            let mut v = 0u32;
            for k in 0..nc {
                v |= (*self.buf.get(i + k).unwrap_or(&0) as u32) << (8 * k);
            }
            self.cid = v;
            c.context_id = Some(v);
        }
        c
    }

    fn h_addr_ctxt(&mut self, b: u8) {
        if self.len == 1 {
            self.addr_ctxt_type();
            self.addr_bytes = if self.addr64 { 8 } else { 4 };
            self.vmid_bytes = 0;
            self.cid_bytes = 0;
            self.ctxt_info_done = false;
            return;
        }
        if self.addr_bytes == 0 {
            if !self.ctxt_info_done {
                self.ctxt_info_done = true;
                let (nv, nc) = self.id_bytes(b);
                (self.vmid_bytes, self.cid_bytes) = (nv as u8, nc as u8);
            } else if self.vmid_bytes > 0 {
                self.vmid_bytes -= 1;
            } else if self.cid_bytes > 0 {
                self.cid_bytes -= 1;
            }
        } else {
            self.addr_bytes -= 1;
        }
        if self.addr_bytes == 0 && self.ctxt_info_done && self.vmid_bytes == 0 && self.cid_bytes == 0 {
            let p = self.addr_ctxt_packet();
            self.send(p);
        }
    }

    /// The address-and-context packet in `buf[..len]` (complete, type in `ty`, `addr_is` and
    /// `addr64` set from it).
    #[inline]
    fn addr_ctxt_packet(&mut self) -> Packet {
        let a = if self.addr64 { self.set64(1) } else { self.set32(1) };
        let st = if self.addr64 { 9 } else { 5 };
        let c = self.extract_context(st);
        Packet::Address { addr: a, context: Some(c), source: false }
    }

    /// The VMID and context ID bytes that follow a context information byte `info`.
    #[inline]
    fn id_bytes(&self, info: u8) -> (usize, usize) {
        let nv = if info & 0x40 != 0 { (self.cfg.vmid_size() / 8) as usize } else { 0 };
        let nc = if info & 0x80 != 0 { (self.cfg.cid_size() / 8) as usize } else { 0 };
        (nv, nc)
    }

    fn short_addr(&self, st: usize, is: u8) -> (u64, u8, usize) {
        short_addr_in(&self.buf[..self.len], st, is)
    }

    fn update_short(&mut self, v: u64, is: u8, bits: u8) -> Address {
        let mask = (1u64 << bits) - 1;
        self.vaddr.val = (self.vaddr.val & !mask) | (v & mask);
        self.vaddr.pkt_bits = bits;
        self.vaddr.is = is;
        self.push_vaddr();
        Address { form: AddrForm::Short, is, addr: self.vaddr.val, pkt_bits: bits }
    }

    fn set32(&mut self, st: usize) -> Address {
        let v = long32_in(&self.buf, st, self.addr_is);
        self.set32_to(v)
    }

    /// The address of a 32-bit long address packet whose address field is `v`.
    #[inline]
    fn set32_to(&mut self, v: u64) -> Address {
        let is = self.addr_is;
        if self.ctx_valid && self.ctx.sf {
            self.vaddr.val = (self.vaddr.val & !0xFFFF_FFFF) | v;
        } else {
            self.vaddr.val = v;
        }
        self.vaddr.pkt_bits = 32;
        self.vaddr.is = is;
        self.push_vaddr();
        Address { form: AddrForm::Long32, is, addr: self.vaddr.val, pkt_bits: 32 }
    }

    fn set64(&mut self, st: usize) -> Address {
        let v = long64_in(&self.buf, st, self.addr_is);
        self.set64_to(v)
    }

    /// The address of a 64-bit long address packet whose address field is `v`.
    #[inline]
    fn set64_to(&mut self, v: u64) -> Address {
        let is = self.addr_is;
        self.vaddr = VAddr { val: v, is, pkt_bits: 64 };
        self.push_vaddr();
        Address { form: AddrForm::Long64, is, addr: v, pkt_bits: 64 }
    }

    fn push_vaddr(&mut self) {
        self.vstack[2] = self.vstack[1];
        self.vstack[1] = self.vstack[0];
        self.vstack[0] = self.vaddr;
    }

    /// The exact-match address packet with header `b` (type in `ty`).
    #[inline]
    fn addr_match_packet(&mut self, b: u8) -> Packet {
        let a = self.exact_match(b & 3);
        Packet::Address { addr: a, context: None, source: self.ty == PacketType::SrcAddrMatch }
    }

    #[inline(always)]
    fn exact_match(&mut self, idx: u8) -> Address {
        let e = self.vstack[(idx as usize).min(2)];
        self.vaddr = e;
        self.push_vaddr();
        Address { form: AddrForm::Match(idx), is: e.is, addr: e.val, pkt_bits: e.pkt_bits }
    }

    fn h_short_addr(&mut self, b: u8) {
        if self.len == 1 {
            self.addr_done = false;
        } else if !self.addr_done {
            self.addr_done = self.len == 3 || b & 0x80 == 0;
        }
        if self.addr_done {
            let p = self.short_addr_packet();
            self.send(p);
        }
    }

    /// The short address packet in `buf[..len]` (complete).
    #[inline]
    fn short_addr_packet(&mut self) -> Packet {
        let (addr, source) = self.short_addr_fields();
        Packet::Address { addr, context: None, source }
    }

    /// The address of the short address packet in `buf[..len]` (complete), and whether it is
    /// a source address.
    #[inline]
    fn short_addr_fields(&mut self) -> (Address, bool) {
        let buf = self.buf;
        self.short_addr_fields_in(&buf[..self.len])
    }

    /// [`short_addr_fields`](Self::short_addr_fields) of the packet `b` (its bytes, type in
    /// `ty`).
    #[inline]
    fn short_addr_fields_in(&mut self, b: &[u8]) -> (Address, bool) {
        use PacketType as T;
        let is = matches!(self.ty, T::AddrSIs1 | T::SrcAddrSIs1) as u8;
        self.addr_is = is;
        let (v, bits, _) = short_addr_in(b, 1, is);
        let a = self.update_short(v, is, bits);
        (a, matches!(self.ty, T::SrcAddrSIs0 | T::SrcAddrSIs1))
    }

    /// Is the long address packet type `t` a 64-bit one?
    #[inline]
    fn long_addr_is_64(t: PacketType) -> bool {
        use PacketType as T;
        matches!(t, T::AddrL64Is0 | T::AddrL64Is1 | T::SrcAddrL64Is0 | T::SrcAddrL64Is1)
    }

    fn h_long_addr(&mut self, _b: u8) {
        if self.len == 1 {
            self.addr64 = Self::long_addr_is_64(self.ty);
            self.addr_bytes = if self.addr64 { 8 } else { 4 };
        }
        if self.len == 1 + self.addr_bytes as usize {
            let p = self.long_addr_packet();
            self.send(p);
        }
    }

    /// The long address packet in `buf[..len]` (complete).
    #[inline]
    fn long_addr_packet(&mut self) -> Packet {
        let (addr, source) = self.long_addr_fields();
        Packet::Address { addr, context: None, source }
    }

    /// The address of the long address packet in `buf[..len]` (complete), and whether it is
    /// a source address.
    #[inline]
    fn long_addr_fields(&mut self) -> (Address, bool) {
        let buf = self.buf;
        self.long_addr_fields_in(&buf)
    }

    /// [`long_addr_fields`](Self::long_addr_fields) of the packet `b` (its bytes, type in
    /// `ty`).
    #[inline]
    fn long_addr_fields_in(&mut self, b: &[u8]) -> (Address, bool) {
        use PacketType as T;
        let is = matches!(self.ty, T::AddrL32Is1 | T::AddrL64Is1 | T::SrcAddrL32Is1 | T::SrcAddrL64Is1) as u8;
        self.addr_is = is;
        let a =
            if Self::long_addr_is_64(self.ty) { self.set64_to(long64_in(b, 1, is)) } else { self.set32_to(long32_in(b, 1, is)) };
        (a, matches!(self.ty, T::SrcAddrL32Is0 | T::SrcAddrL32Is1 | T::SrcAddrL64Is0 | T::SrcAddrL64Is1))
    }

    /// The parser's second fast path (after atoms): an address packet (short, long, or exact
    /// match without payload: most of the other packets in real traces) whose bytes are all
    /// in `data[p..]` is parsed whole, as the byte-by-byte handlers would, instead of byte by
    /// byte, and sent (a target address without context through [`PacketSink::address`]).
    /// False (nothing changed) for any other packet or one cut by the end of `data`.
    #[inline]
    fn address_whole<S: PacketSink + ?Sized>(&mut self, data: &[u8], p: usize, sink: &mut S) -> bool {
        let Some((addr, source, n)) = self.address_at::<true>(data, p) else { return false };
        let index = self.block_index.at(p);
        self.packet_index = index;
        self.processed = p + n;
        let raw = &data[p..p + n];
        if source {
            sink.packet(index, &Packet::Address { addr, context: None, source }, raw);
        } else {
            sink.address(index, addr, raw);
        }
        true
    }

    /// The packet at `data[p..]`, in sync, taken whole if it is one of the kinds parsed so
    /// (address, A-sync, timestamp, address and context) and all its bytes are in `data`:
    /// passed to the sink as its byte-by-byte handler would send it. False (nothing taken)
    /// otherwise.
    #[inline]
    fn whole<S: PacketSink + ?Sized>(&mut self, data: &[u8], p: usize, sink: &mut S) -> bool {
        let Some(&b) = data.get(p) else { return false };
        match self.table[b as usize].1 {
            H::Extension => self.async_whole(data, p, sink),
            H::Timestamp => self.timestamp_whole(data, p, sink),
            H::AddrCtxt => self.addr_ctxt_whole(data, p, sink),
            _ => self.address_whole(data, p, sink),
        }
    }

    /// [`whole`](Self::whole) of an address-and-context packet: its length from its type
    /// and its context information byte, then [`addr_ctxt_packet`](Self::addr_ctxt_packet)
    /// on its bytes.
    #[inline]
    fn addr_ctxt_whole<S: PacketSink + ?Sized>(&mut self, data: &[u8], p: usize, sink: &mut S) -> bool {
        let t = self.table[data[p] as usize].0;
        let a = if addr_ctxt_kind(t).1 { 8 } else { 4 };
        let Some(&info) = data.get(p + 1 + a) else { return false };
        let (nv, nc) = self.id_bytes(info);
        let n = 2 + a + nv + nc;
        let Some(raw) = data.get(p..p + n) else { return false };
        let index = self.take_whole(p, n, t);
        self.addr_ctxt_type();
        self.buf[..n].copy_from_slice(raw);
        self.len = n;
        let pkt = self.addr_ctxt_packet();
        sink.packet(index, &pkt, raw);
        true
    }

    /// `addr_is` and `addr64` of the address-and-context packet type `ty`.
    #[inline]
    fn addr_ctxt_type(&mut self) {
        (self.addr_is, self.addr64) = addr_ctxt_kind(self.ty);
    }

    /// A packet of type `t` at `data[p..p + n]` taken whole: the parser's place, type and count
    /// as its byte path leaves them; returns its trace index.
    #[inline]
    fn take_whole(&mut self, p: usize, n: usize, t: PacketType) -> u64 {
        let index = self.block_index.at(p);
        self.packet_index = index;
        self.processed = p + n;
        self.ty = t;
        self.stats.packets += 1;
        index
    }

    /// [`whole`](Self::whole) of a timestamp packet.
    #[inline]
    fn timestamp_whole<S: PacketSink + ?Sized>(&mut self, data: &[u8], p: usize, sink: &mut S) -> bool {
        let Some(n) = data.get(p..).and_then(timestamp_len) else { return false };
        let raw = &data[p..p + n];
        let index = self.take_whole(p, n, self.table[raw[0] as usize].0);
        let pkt = self.timestamp_packet(raw);
        sink.packet(index, &pkt, raw);
        true
    }

    /// The A-sync packet (eleven 0x00 bytes and 0x80) whose bytes are all in `data[p..]`,
    /// in sync, taken whole and passed to the sink as [`h_async`](Self::h_async) would end
    /// it, without the byte-by-byte state machine: every trace window starts with one. False
    /// (nothing taken) for any other bytes.
    #[inline]
    fn async_whole<S: PacketSink + ?Sized>(&mut self, data: &[u8], p: usize, sink: &mut S) -> bool {
        const ASYNC: [u8; 12] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x80];
        match data.get(p..p + 12) {
            Some(raw) if raw == ASYNC => {
                let index = self.take_whole(p, 12, PacketType::Async);
                sink.packet(index, &Packet::Async, raw);
                true
            }
            _ => false,
        }
    }

    /// The address packet (short, long, or exact match; a source address only with
    /// `SOURCE`) whose bytes are all in `data[p..]`, parsed whole and counted: its address,
    /// whether it is a source address, its length. `None` (nothing changed) for any other
    /// packet or one cut by the end of `data`. The per-packet state is left for
    /// `init_packet_state`. (Inlined: a call costs the address fast paths ~25 instructions
    /// per packet.)
    #[inline(always)]
    fn address_at<const SOURCE: bool>(&mut self, data: &[u8], p: usize) -> Option<(Address, bool, usize)> {
        use PacketType as T;
        let b = *data.get(p)?;
        let (t, h) = self.table[b as usize];
        if !SOURCE
            && matches!(
                t,
                T::SrcAddrSIs0 | T::SrcAddrSIs1 | T::SrcAddrL32Is0 | T::SrcAddrL32Is1 | T::SrcAddrL64Is0 | T::SrcAddrL64Is1
            )
        {
            return None;
        }
        let n = match h {
            H::ShortAddr => match data.get(p + 1) {
                Some(&b1) if b1 & 0x80 == 0 => 2,
                Some(_) => 3,
                None => return None,
            },
            H::LongAddr => 1 + if Self::long_addr_is_64(t) { 8 } else { 4 },
            H::NoPayload if t == PacketType::AddrMatch => 1,
            _ => return None,
        };
        let raw = data.get(p..p + n)?;
        self.ty = t;
        self.handler = h;
        // (parsed from `raw`: the packet is whole, `buf` is not needed)
        self.stats.packets += 1;
        let (addr, source) = match h {
            H::ShortAddr => self.short_addr_fields_in(raw),
            H::LongAddr => self.long_addr_fields_in(raw),
            _ => (self.exact_match(b & 3), false),
        };
        Some((addr, source, n))
    }

    fn h_q(&mut self, b: u8) {
        if self.len == 1 {
            self.q_type = b & 0xF;
            self.addr_bytes = 0;
            self.count_done = false;
            self.q_has_addr = false;
            self.q_addr_short = true;
            self.q_addr_match = false;
            self.addr_is = 1;
            match self.q_type {
                0..=2 => {
                    self.q_addr_match = true;
                    self.q_has_addr = true;
                }
                0xC => {}
                5 | 6 => {
                    if self.q_type == 5 {
                        self.addr_is = 0;
                    }
                    self.q_has_addr = true;
                    self.addr_bytes = 2;
                }
                0xA | 0xB => {
                    if self.q_type == 0xA {
                        self.addr_is = 0;
                    }
                    self.q_has_addr = true;
                    self.q_addr_short = false;
                    self.addr_bytes = 4;
                }
                0xF => self.count_done = true,
                _ => {
                    self.bad_sequence(PacketType::Q);
                    return;
                }
            }
        } else if self.addr_bytes > 0 {
            if self.q_addr_short && self.addr_bytes == 2 && b & 0x80 == 0 {
                self.addr_bytes -= 1;
            }
            self.addr_bytes -= 1;
        } else if !self.count_done {
            self.count_done = b & 0x80 == 0;
        }
        if self.addr_bytes == 0 && self.count_done {
            let mut idx = 1;
            let mut addr = None;
            if self.q_has_addr {
                if self.q_addr_match {
                    addr = Some(self.exact_match(self.q_type & 3));
                } else if self.q_addr_short {
                    let is = self.addr_is;
                    let (v, bits, n) = self.short_addr(idx, is);
                    idx += n;
                    addr = Some(self.update_short(v, is, bits));
                } else {
                    addr = Some(self.set32(idx));
                    idx += 4;
                }
            }
            let count = if self.q_type != 0xF { Some(self.cont_field(idx, 5).0) } else { None };
            let q_type = self.q_type;
            self.send(Packet::Q(QPacket { count, addr, q_type }));
        }
    }

    fn h_atom(&mut self, b: u8) {
        let (format, atoms) = atom_of(self.ty, b);
        self.send(Packet::Atom { format, atoms });
    }

    fn h_ite(&mut self) {
        if self.len == 10 {
            let mut v = 0u64;
            for k in 0..8 {
                v |= (self.buf[2 + k] as u64) << (8 * k);
            }
            let el = self.buf[1];
            self.send(Packet::Ite { el, value: v });
        }
    }
}

/// The instruction set (`addr_is`) and the 64-bit address (`addr64`) of an address-and-context
/// packet of type `t`.
#[inline]
fn addr_ctxt_kind(t: PacketType) -> (u8, bool) {
    use PacketType as T;
    (matches!(t, T::AddrCtxtL32Is1 | T::AddrCtxtL64Is1) as u8, matches!(t, T::AddrCtxtL64Is0 | T::AddrCtxtL64Is1))
}

/// The continued field at `b[st..]` (7 bits a byte, bit 7 set on every byte but its last), of
/// at most `limit` bytes: its value and its bytes.
fn cont_field_in(b: &[u8], st: usize, limit: usize) -> (u32, usize) {
    let mut v: u32 = 0;
    let mut i = 0;
    while i < limit && st + i < b.len() {
        let x = b[st + i];
        v |= ((x & 0x7F) as u32).wrapping_shl(7 * i as u32);
        i += 1;
        if x & 0x80 == 0 {
            break;
        }
    }
    (v, i)
}

/// The length of the timestamp packet that `b` starts (header `b[0]`) if `b` holds all of it
/// (IHI 0064 "Timestamp packet"): up to nine timestamp bytes, each but the ninth continued by
/// bit 7, then, with bit 0 of the header set, a cycle count continued by bit 7. `None` while
/// it goes on past `b`, or past [`MAX_PKT`] (an over-long packet, the byte path's error).
#[inline]
fn timestamp_len(b: &[u8]) -> Option<usize> {
    let mut i = 1;
    loop {
        let x = *b.get(i)?;
        i += 1;
        if i == 10 || x & 0x80 == 0 {
            break;
        }
    }
    if b[0] & 1 == 1 {
        loop {
            let x = *b.get(i)?;
            i += 1;
            if x & 0x80 == 0 {
                break;
            }
        }
    }
    (i <= MAX_PKT).then_some(i)
}

/// The address field of a short address packet from `b[st]` (one byte, or two if the first
/// has bit 7 set and `b` has a second): value, its bits, bytes used.
#[inline]
fn short_addr_in(b: &[u8], st: usize, is: u8) -> (u64, u8, usize) {
    let shift = if is == 0 { 2 } else { 1 };
    let b0 = b[st];
    let mut v = ((b0 & 0x7F) as u64) << shift;
    let mut bits = 7u8;
    let mut n = 1;
    if b0 & 0x80 != 0
        && let Some(&b1) = b.get(st + 1)
    {
        v |= (b1 as u64) << (7 + shift);
        bits += 8;
        n = 2;
    }
    (v, bits + shift as u8, n)
}

/// The 32-bit address field of a long address packet at `b[st..st + 4]`.
#[inline]
fn long32_in(b: &[u8], st: usize, is: u8) -> u64 {
    let b = &b[st..st + 4];
    let mut v: u64 = if is == 0 {
        (((b[0] & 0x7F) as u64) << 2) | (((b[1] & 0x7F) as u64) << 9)
    } else {
        (((b[0] & 0x7F) as u64) << 1) | ((b[1] as u64) << 8)
    };
    v |= (b[2] as u64) << 16;
    v |= (b[3] as u64) << 24;
    v
}

/// The 64-bit address field of a long address packet at `b[st..st + 8]`.
#[inline]
fn long64_in(b: &[u8], st: usize, is: u8) -> u64 {
    let mut v = long32_in(b, st, is);
    for k in 4..8 {
        v |= (b[st + k] as u64) << (8 * k);
    }
    v
}

/// What a sink's own loop over the packets that lead the data
/// ([`PacketSink::atom_run`]) may ask of the parser: the format and atoms of an atom packet's
/// header byte, and target address packets parsed whole.
pub struct Lookahead<'a> {
    parser: &'a mut PacketParser,
    /// bytes of the address packets taken through `target_address`
    addr_bytes: usize,
}

impl Lookahead<'_> {
    /// The format and atoms of the single-byte atom packet with header `b`; format 0 if `b`
    /// does not make an atom packet.
    #[inline]
    pub fn atoms(&self, b: u8) -> (u8, Atoms) {
        self.parser.atom_table[b as usize]
    }

    /// The run-cache key of the atoms of the single-byte atom packet with header `b` (of
    /// [`atoms`](Self::atoms)`(b).1`) as one run ([`RunKey::of_packet`]): computed when the
    /// parser is built, not per packet.
    #[inline]
    pub fn run_key(&self, b: u8) -> RunKey {
        self.parser.run_keys[b as usize]
    }

    /// The target address packet without context (short, long or exact match) at `data[p..]`
    /// (`data` the slice given to `atom_run`, `p` right after the packets taken so far),
    /// parsed whole and taken: its address and length,
    /// the same as [`PacketSink::address`] would have been given. `None` (nothing taken) for
    /// any other packet, or one cut by the end of `data`.
    #[inline]
    pub fn target_address(&mut self, data: &[u8], p: usize) -> Option<(Address, usize)> {
        let (addr, _, n) = self.parser.address_at::<false>(data, p)?;
        // (`address_at` parses from `data` and leaves the per-packet state as it found it:
        // initialised, as it always is between the packets of the sink's loop)
        self.parser.debug_assert_initialised();
        self.addr_bytes += n;
        Some((addr, n))
    }
}

/// The atoms of a single-byte atom packet of type `ty` with header `b` (IHI 0064 "Atom
/// packets", formats 1-6).
fn atom_of(ty: PacketType, b: u8) -> (u8, Atoms) {
    use PacketType as T;
    const F4: [u32; 4] = [0xE, 0x0, 0xA, 0x5];
    let (format, atoms) = match ty {
        T::AtomF1 => (1, Atoms { bits: (b & 1) as u32, count: 1 }),
        T::AtomF2 => (2, Atoms { bits: (b & 3) as u32, count: 2 }),
        T::AtomF3 => (3, Atoms { bits: (b & 7) as u32, count: 3 }),
        T::AtomF4 => (4, Atoms { bits: F4[(b & 3) as usize], count: 4 }),
        T::AtomF5 => {
            let idx = ((b & 0x20) >> 3) | (b & 3);
            let bits = match idx {
                5 => 0x1E,
                1 => 0x00,
                2 => 0x0A,
                3 => 0x15,
                _ => 0,
            };
            (5, Atoms { bits, count: if matches!(idx, 1 | 2 | 3 | 5) { 5 } else { 0 } })
        }
        _ => {
            let n = (b & 0x1F) as u32 + 3;
            let mut bits = (1u32 << n) - 1;
            if b & 0x20 == 0 {
                bits |= 1 << n;
            }
            (6, Atoms { bits, count: (n + 1) as u8 })
        }
    };
    (format, atoms)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packet::{Context, Exception};
    use crate::snapshot::Protocol;

    fn parse(cfg: &EtmConfig, data: &[u8]) -> Vec<(u64, Packet)> {
        let mut p = PacketParser::new(cfg);
        let mut v = Vec::new();
        p.feed(0, data, &mut |i, pk: &Packet, _r: &[u8]| v.push((i, *pk)));
        p.finish(&mut |i, pk: &Packet, _r: &[u8]| v.push((i, *pk)));
        v
    }

    const ASYNC: [u8; 12] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x80];

    /// A-sync, trace info, a 64-bit address, a short address and an exact match resolve
    /// through the address history as IHI 0064 ("Address packets") describes.
    #[test]
    fn address_history() {
        let cfg = EtmConfig::generic(Protocol::Etmv4, 0x10);
        let mut d = ASYNC.to_vec();
        d.extend([0x01, 0x00]); // TINFO, no sections
        d.extend([0x9D, 0x00, 0x5A, 0x09, 0xC0, 0xFF, 0xFF, 0xFF, 0xFF]); // 0xFFFFFFFFC0096A00 >> bit layout
        d.extend([0x95, 0x05]); // short: bits[8:2] = 5
        d.extend([0x91]); // exact match [1] = the long address
        let v = parse(&cfg, &d);
        let addrs: Vec<u64> =
            v.iter().filter_map(|(_, p)| if let Packet::Address { addr, .. } = p { Some(addr.addr) } else { None }).collect();
        let long = (0x5Au64 << 9) | (0x09 << 16) | (0xC0 << 24) | (0xFFFF_FFFFu64 << 32);
        assert_eq!(addrs, vec![long, (long & !0x1FF) | (5 << 2), long]);
        assert_eq!(v[0], (0, Packet::Async));
    }

    /// Atom format 6: 0xC1 = 4 E atoms then E (bit5 clear); 0xE0 = 3 E then N (bit5 set).
    #[test]
    fn atom_f6() {
        let cfg = EtmConfig::generic(Protocol::Etmv4, 1);
        let mut d = ASYNC.to_vec();
        d.extend([0xC1, 0xE0]);
        let v = parse(&cfg, &d);
        assert_eq!(v[1].1, Packet::Atom { format: 6, atoms: Atoms { bits: 0x1F, count: 5 } });
        assert_eq!(v[2].1, Packet::Atom { format: 6, atoms: Atoms { bits: 0x7, count: 4 } });
    }

    /// Splitting the input at every possible point gives the same packets and indices.
    #[test]
    fn resumable_across_chunks() {
        let cfg = EtmConfig::generic(Protocol::Ete, 1);
        let mut d = vec![0x55, 0x00, 0x12];
        d.extend(ASYNC);
        d.extend([0x01, 0x81, 0x01, 0x00]);
        d.extend([0x02, 0x81, 0x82, 0x01, 0x03, 0x81, 0x02, 0x05]);
        d.extend([0x81, 0xD1, 0x44, 0x33, 0x22, 0x11, 0x85, 0x04, 0x03, 0x02, 0x01, 0x00, 0x00, 0x00, 0x00, 0x11]);
        // in sync, the packets the parser takes whole when their bytes are all in one chunk:
        // A-sync; address and context (32-bit, VMID and context ID); a timestamp of nine
        // bytes; a timestamp whose cycle count runs on past the three bytes its value takes
        d.extend(ASYNC);
        d.extend([0x82, 0x10, 0x20, 0x30, 0x40, 0xC1, 0x2A, 0x78, 0x56, 0x34, 0x12]);
        d.extend([0x02, 0x81, 0x81, 0x81, 0x81, 0x81, 0x81, 0x81, 0x81, 0x7F]);
        d.extend([0x03, 0x05, 0x81, 0x82, 0x83, 0x04, 0xF5]);
        d.extend([0x06, 0x1D, 0xA6, 0x83, 0x05, 0x0C, 0x2D, 0x83, 0x01, 0xF5, 0x09]);
        let whole = parse(&cfg, &d);
        let kinds = |t: fn(&Packet) -> bool| whole.iter().filter(|(_, p)| t(p)).count();
        assert_eq!(kinds(|p| matches!(p, Packet::Async)), 2);
        assert_eq!(kinds(|p| matches!(p, Packet::Address { context: Some(_), .. })), 1);
        assert_eq!(kinds(|p| matches!(p, Packet::Timestamp { .. })), 5);
        // (IS0 32-bit address field: bits 8:2 and 15:9 from the first two bytes' low 7 bits)
        let ctxt = whole.iter().find_map(|(_, p)| match p {
            Packet::Address { addr, context: Some(c), .. } => Some((addr.addr, c.el, c.vmid, c.context_id)),
            _ => None,
        });
        assert_eq!(ctxt, Some(((0x10 << 2) | (0x20 << 9) | (0x30 << 16) | (0x40 << 24), 1, Some(0x2A), Some(0x1234_5678))));
        // (nine bytes: 7 bits from each of the first eight, 8 from the ninth; then the low 7
        // bits replaced, and a cycle count of its first three bytes, cut to the counter's size)
        let ts = (0x7Fu64 << 56) | 0x2_0408_1020_4081;
        assert!(whole.contains(&(66, Packet::Timestamp { value: ts, bits: 64, cycle_count: None })));
        let cc = (0x01 | (0x02 << 7) | (0x03 << 14)) & ((1u32 << cfg.cc_size()) - 1);
        assert!(whole.contains(&(76, Packet::Timestamp { value: (ts & !0x7F) | 5, bits: 7, cycle_count: Some(cc) })));
        for split in 0..d.len() {
            let mut p = PacketParser::new(&cfg);
            let mut v = Vec::new();
            let mut s = |i, pk: &Packet, _r: &[u8]| v.push((i, *pk));
            p.feed(0, &d[..split], &mut s);
            p.feed(split as u64, &d[split..], &mut s);
            p.finish(&mut s);
            assert_eq!(v, whole, "split at {split}");
        }
    }

    fn parse_after_sync(cfg: &EtmConfig, body: &[u8]) -> Vec<Packet> {
        let mut d = ASYNC.to_vec();
        d.extend([0x01, 0x00]); // TINFO with no sections
        d.extend(body);
        parse(cfg, &d).into_iter().skip(2).map(|(_, p)| p).collect()
    }

    /// Timestamps (IHI 0064, "Timestamp packets"): the first after TINFO replaces all 64 bits; later ones
    /// replace only the low 7*n bits; header 0x03 adds a cycle count.
    #[test]
    fn timestamp_partial_update() {
        let cfg = EtmConfig::generic(Protocol::Etmv4, 1);
        // 0x02 [0x81 0x01] = 0x81: 7 bits 0x01 | (0x01 << 7) = 0x81
        // then 0x03 [0x05] [0x0A]: low 7 bits := 5, CC = 10
        let v = parse_after_sync(&cfg, &[0x02, 0x81, 0x01, 0x03, 0x05, 0x0A]);
        assert_eq!(v[0], Packet::Timestamp { value: 0x81, bits: 64, cycle_count: None });
        assert_eq!(v[1], Packet::Timestamp { value: 0x85, bits: 7, cycle_count: Some(10) });
    }

    /// Context packet 0x81 with info byte 0xF1 (EL1, SF, NS, VMID and CID follow): 8-bit VMID
    /// then 32-bit context ID, little endian (IHI 0064, "Context packets").
    #[test]
    fn context_with_vmid_and_cid() {
        let cfg = EtmConfig::generic(Protocol::Etmv4, 1); // VMID 8 bits, CID 32 bits
        let v = parse_after_sync(&cfg, &[0x81, 0xF1, 0x2A, 0x78, 0x56, 0x34, 0x12]);
        assert_eq!(
            v[0],
            Packet::Context(Context {
                updated: true,
                el: 1,
                sf: true,
                ns: true,
                nse: false,
                context_id: Some(0x1234_5678),
                vmid: Some(0x2A),
            })
        );
    }

    /// ETE exception packets of type 0 (PE reset) and 0x18 (transaction failure) always take
    /// three bytes in OpenCSD (tme_tcancel: `06 31 70` is one TRANS_FAIL packet).
    #[test]
    fn ete_trans_fail_three_bytes() {
        let cfg = EtmConfig::generic(Protocol::Ete, 1);
        let v = parse_after_sync(&cfg, &[0x06, 0x31, 0x70, 0xF7]);
        assert!(matches!(v[0], Packet::TransFail(Exception { exc_type: 0x18, addr_interp: 1, .. })));
        assert_eq!(v[1], Packet::Atom { format: 1, atoms: Atoms { bits: 1, count: 1 } });
    }

    /// Cycle count format 1 with commit field then count (threshold 0), format 2 commit = AAAA+1,
    /// format 3 count = bits[1:0], commit = bits[3:2]+1.
    #[test]
    fn cycle_count_formats() {
        let cfg = EtmConfig::generic(Protocol::Etmv4, 1);
        let v = parse_after_sync(&cfg, &[0x0E, 0x03, 0x85, 0x01, 0x0C, 0x52, 0x1B]);
        assert_eq!(v[0], Packet::CycleCount { format: 1, count: 0x85, commit: Some(3) });
        assert_eq!(v[1], Packet::CycleCount { format: 2, count: 2, commit: Some(6) });
        assert_eq!(v[2], Packet::CycleCount { format: 3, count: 3, commit: Some(3) });
    }

    /// Q packet type 5 (short IS0 address + count) after a 64-bit address.
    #[test]
    fn q_packet_short_address() {
        let cfg = EtmConfig::generic(Protocol::Etmv4, 1);
        let v = parse_after_sync(&cfg, &[0x9D, 0, 0, 0, 0x40, 0, 0, 0, 0, 0xA5, 0x10, 0x03]);
        match v[1] {
            Packet::Q(q) => {
                assert_eq!(q.count, Some(3));
                assert_eq!(q.addr.map(|a| a.addr), Some(0x4000_0040));
            }
            ref p => panic!("expected Q, got {p:?}"),
        }
    }

    /// Garbage never panics and bad headers are counted.
    #[test]
    fn reserved_header_counted() {
        let cfg = EtmConfig::generic(Protocol::Etmv4, 1);
        let mut d = ASYNC.to_vec();
        d.extend([0x08, 0xF7]);
        let mut p = PacketParser::new(&cfg);
        let mut v = Vec::new();
        p.feed(0, &d, &mut |_i, pk: &Packet, _r: &[u8]| v.push(*pk));
        assert_eq!(v[1], Packet::Reserved(0x08));
        assert_eq!(p.stats().errors, 1);
        assert_eq!(v[2], Packet::Atom { format: 1, atoms: Atoms { bits: 1, count: 1 } });
    }
}
