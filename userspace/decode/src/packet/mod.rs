//! ETMv4 / ETE instruction-trace packets (Arm IHI 0064 "ETMv4 Architecture Specification",
//! the instruction trace packet descriptions; Arm DDI 0608 "Embedded Trace Extension" for the
//! ETE additions: TS marker, ITE, TSTART/TCOMMIT, source addresses, PE reset / transaction
//! failure exceptions). The encodings and every listing text were verified against OpenCSD
//! 1.8.0 output on all the real captures (`tests/packets_conformance.rs`); the section names
//! cited below are from the specifications' packet descriptions.
//!
//! # API (stable: the element decoder consumes it)
//!
//! * [`PacketParser::new(&EtmConfig)`](PacketParser::new) builds a parser for one trace ID.
//! * [`PacketParser::feed(index, bytes, &mut sink)`](PacketParser::feed) takes any chunk of
//!   that trace ID's byte stream; `index` is the trace index of `bytes[0]` (the listing
//!   `Idx:`). Every complete packet is passed to the [`PacketSink`] (a closure
//!   `sink(index, &Packet, raw_bytes)`, or a sink that takes single-byte atom packets
//!   without a `Packet` through [`PacketSink::atoms`]). Chunks may be split anywhere: the
//!   parser is resumable and gives identical packets.
//! * [`PacketParser::finish`] at end of trace flushes a partial packet as
//!   [`Packet::IncompleteEot`]; [`PacketParser::reset`] forgets everything (e.g. on a
//!   4 x FSYNC barrier or a new AUX buffer) and waits for A-sync again.
//! * Nothing is allocated per packet. Corrupt input produces `Reserved`, `ReservedCfg`,
//!   `BadSequence` packets, is counted in [`PacketStats`], and the parser resynchronises
//!   where OpenCSD does (for bad headers it simply continues with the next byte, like
//!   OpenCSD; an A-sync is only required at the start or after [`reset`](PacketParser::reset)).
//!
//! Address packets carry the *resolved* address: the parser keeps the 3-entry address
//! history (IHI 0064, "Address packets", exact-match packets select an entry, every
//! address is pushed) and merges short/32-bit addresses into the previous value, so the
//! decoder never needs packet-level address state. Context packets likewise carry the full
//! current context (`updated` says whether the packet changed it).
//!
//! The printer in [`crate::listing`] renders packets in `trc_pkt_lister` format.

use crate::frame::ChunkIndex;

mod demux;
#[doc(hidden)]
pub mod fuzz;
mod parser;

pub use demux::{DemuxSink, PacketDemux};
pub use parser::{Lookahead, PacketParser, PacketStats};

/// [`PacketSink::atom_run`]'s default: the atom packets that lead `data` (its bytes' trace
/// indices `index`'s), each to [`PacketSink::atoms`]; returns how many (one byte each).
#[inline]
pub fn atom_packets<S: PacketSink + ?Sized>(sink: &mut S, index: ChunkIndex, data: &[u8], look: &mut Lookahead<'_>) -> usize {
    let mut n = 0;
    while let Some(&b) = data.get(n) {
        let (format, atoms) = look.atoms(b);
        if format == 0 {
            break;
        }
        sink.atoms(index.at(n), format, atoms, b);
        n += 1;
    }
    n
}

/// Receives the packets of one parser ([`PacketParser::feed`]). Closures
/// `FnMut(index, &Packet, raw_bytes)` are sinks; a sink that consumes atom packets (the hot
/// packet type) without a [`Packet`] built for them implements [`atoms`](PacketSink::atoms).
pub trait PacketSink {
    /// A packet that started at trace index `index`, with its raw bytes.
    fn packet(&mut self, index: u64, packet: &Packet, raw: &[u8]);

    /// A single-byte atom packet (`header` is its byte): the same as
    /// `packet(index, &Packet::Atom { format, atoms }, &[header])`, which the default does.
    #[inline]
    fn atoms(&mut self, index: u64, format: u8, atoms: Atoms, header: u8) {
        self.packet(index, &Packet::Atom { format, atoms }, &[header]);
    }

    /// The packets that lead `data` (the parser in sync, between packets; the trace indices
    /// of its bytes are `index`'s), as many as the sink takes in a loop of its own: single-byte atom
    /// packets, whose format and atoms `look` gives ([`Lookahead::atoms`]), and target address
    /// packets, which `look` parses ([`Lookahead::target_address`]). Returns how many bytes it
    /// took: at least all the leading atom packets (each one byte), and only whole packets.
    /// The default takes the atom packets, passing each to [`atoms`](PacketSink::atoms).
    #[inline]
    fn atom_run(&mut self, index: ChunkIndex, data: &[u8], look: &mut Lookahead<'_>) -> usize {
        atom_packets(self, index, data, look)
    }

    /// A target address packet without context (short, long or exact match; `raw` its
    /// bytes): the same as `packet(index, &Packet::Address { addr, context: None, source:
    /// false }, raw)`, which the default does.
    #[inline]
    fn address(&mut self, index: u64, addr: Address, raw: &[u8]) {
        self.packet(index, &Packet::Address { addr, context: None, source: false }, raw);
    }
}

impl<F: FnMut(u64, &Packet, &[u8])> PacketSink for F {
    #[inline]
    fn packet(&mut self, index: u64, packet: &Packet, raw: &[u8]) {
        self(index, packet, raw)
    }
}

/// Packet type identifiers, one per OpenCSD `ocsd_etmv4_i_pkt_type` (the listing name is
/// [`PacketType::name`]). Error packets carry the type that was being parsed.
#[allow(missing_docs)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PacketType {
    NotSync,
    IncompleteEot,
    NoErrType,
    BadSequence,
    BadTraceMode,
    Reserved,
    ReservedCfg,
    Extension,
    TraceInfo,
    Timestamp,
    TraceOn,
    FuncRet,
    Except,
    ExceptRtn,
    Ite,
    TransSt,
    TransCommit,
    CcntF1,
    CcntF2,
    CcntF3,
    NumDsMkr,
    UnnumDsMkr,
    Commit,
    CancelF1,
    CancelF1Mispred,
    Mispredict,
    CancelF2,
    CancelF3,
    CondIF2,
    CondFlush,
    CondResF4,
    CondResF2,
    CondResF3,
    CondResF1,
    CondIF1,
    CondIF3,
    Ignore,
    Event,
    Ctxt,
    AddrCtxtL32Is0,
    AddrCtxtL32Is1,
    AddrCtxtL64Is0,
    AddrCtxtL64Is1,
    TsMarker,
    AddrMatch,
    AddrSIs0,
    AddrSIs1,
    AddrL32Is0,
    AddrL32Is1,
    AddrL64Is0,
    AddrL64Is1,
    Q,
    SrcAddrMatch,
    SrcAddrSIs0,
    SrcAddrSIs1,
    SrcAddrL32Is0,
    SrcAddrL32Is1,
    SrcAddrL64Is0,
    SrcAddrL64Is1,
    AtomF6,
    AtomF5,
    AtomF2,
    AtomF4,
    AtomF1,
    AtomF3,
    Async,
    Discard,
    Overflow,
    PeReset,
    TransFail,
}

impl PacketType {
    /// Name and description as printed by `trc_pkt_lister` (OpenCSD 1.8.0).
    pub fn name_desc(self) -> (&'static str, &'static str) {
        use PacketType::*;
        match self {
            NotSync => ("I_NOT_SYNC", "I Stream not synchronised"),
            IncompleteEot => ("I_INCOMPLETE_EOT", "Incomplete packet at end of trace."),
            NoErrType => ("I_NO_ERR_TYPE", "No Error Type."),
            BadSequence => ("I_BAD_SEQUENCE", "Invalid Sequence in packet."),
            BadTraceMode => ("I_BAD_TRACEMODE", "Invalid Packet for trace mode."),
            Reserved => ("I_RESERVED", "Reserved Packet Header"),
            ReservedCfg => ("I_RESERVED_CFG", "Reserved header for current configuration."),
            Extension => ("I_EXTENSION", "Extension packet header."),
            TraceInfo => ("I_TRACE_INFO", "Trace Info."),
            Timestamp => ("I_TIMESTAMP", "Timestamp."),
            TraceOn => ("I_TRACE_ON", "Trace On."),
            FuncRet => ("I_FUNC_RET", "V8M - function return."),
            Except => ("I_EXCEPT", "Exception."),
            ExceptRtn => ("I_EXCEPT_RTN", "Exception Return."),
            Ite => ("I_ITE", "Instrumentation"),
            TransSt => ("I_TRANS_ST", "Transaction Start."),
            TransCommit => ("I_TRANS_COMMIT", "Transaction Commit."),
            CcntF1 => ("I_CCNT_F1", "Cycle Count format 1."),
            CcntF2 => ("I_CCNT_F2", "Cycle Count format 2."),
            CcntF3 => ("I_CCNT_F3", "Cycle Count format 3."),
            NumDsMkr => ("I_NUM_DS_MKR", "Data Synchronisation Marker - Numbered."),
            UnnumDsMkr => ("I_UNNUM_DS_MKR", "Data Synchronisation Marker - Unnumbered."),
            Commit => ("I_COMMIT", "Commit"),
            CancelF1 => ("I_CANCEL_F1", "Cancel Format 1."),
            CancelF1Mispred => ("I_CANCEL_F1_MISPRED", "Cancel Format 1 + Mispredict."),
            Mispredict => ("I_MISPREDICT", "Mispredict."),
            CancelF2 => ("I_CANCEL_F2", "Cancel Format 2."),
            CancelF3 => ("I_CANCEL_F3", "Cancel Format 3."),
            CondIF2 => ("I_COND_I_F2", "Conditional Instruction, format 2."),
            CondFlush => ("I_COND_FLUSH", "Conditional Flush."),
            CondResF4 => ("I_COND_RES_F4", "Conditional Result, format 4."),
            CondResF2 => ("I_COND_RES_F2", "Conditional Result, format 2."),
            CondResF3 => ("I_COND_RES_F3", "Conditional Result, format 3."),
            CondResF1 => ("I_COND_RES_F1", "Conditional Result, format 1."),
            CondIF1 => ("I_COND_I_F1", "Conditional Instruction, format 1."),
            CondIF3 => ("I_COND_I_F3", "Conditional Instruction, format 3."),
            Ignore => ("I_IGNORE", "Ignore."),
            Event => ("I_EVENT", "Trace Event."),
            Ctxt => ("I_CTXT", "Context Packet."),
            AddrCtxtL32Is0 => ("I_ADDR_CTXT_L_32IS0", "Address & Context, Long, 32 bit, IS0."),
            AddrCtxtL32Is1 => ("I_ADDR_CTXT_L_32IS1", "Address & Context, Long, 32 bit, IS1."),
            AddrCtxtL64Is0 => ("I_ADDR_CTXT_L_64IS0", "Address & Context, Long, 64 bit, IS0."),
            AddrCtxtL64Is1 => ("I_ADDR_CTXT_L_64IS1", "Address & Context, Long, 64 bit, IS1."),
            TsMarker => ("I_TS_MARKER", "Timestamp Marker"),
            AddrMatch => ("I_ADDR_MATCH", "Exact Address Match."),
            AddrSIs0 => ("I_ADDR_S_IS0", "Address, Short, IS0."),
            AddrSIs1 => ("I_ADDR_S_IS1", "Address, Short, IS1."),
            AddrL32Is0 => ("I_ADDR_L_32IS0", "Address, Long, 32 bit, IS0."),
            AddrL32Is1 => ("I_ADDR_L_32IS1", "Address, Long, 32 bit, IS1."),
            AddrL64Is0 => ("I_ADDR_L_64IS0", "Address, Long, 64 bit, IS0."),
            AddrL64Is1 => ("I_ADDR_L_64IS1", "Address, Long, 64 bit, IS1."),
            Q => ("I_Q", "Q Packet."),
            SrcAddrMatch => ("I_SRC_ADDR_MATCH", "Exact Source Address Match."),
            SrcAddrSIs0 => ("I_SRC_ADDR_S_IS0", "Source Address, Short, IS0."),
            SrcAddrSIs1 => ("I_SRC_ADDR_S_IS1", "Source Address, Short, IS1."),
            // sic: OpenCSD spells this one SCR.
            SrcAddrL32Is0 => ("I_SCR_ADDR_L_32IS0", "Source Address, Long, 32 bit, IS0."),
            SrcAddrL32Is1 => ("I_SRC_ADDR_L_32IS1", "Source Address, Long, 32 bit, IS1."),
            SrcAddrL64Is0 => ("I_SRC_ADDR_L_64IS0", "Source Address, Long, 64 bit, IS0."),
            SrcAddrL64Is1 => ("I_SRC_ADDR_L_64IS1", "Source Address, Long, 64 bit, IS1."),
            AtomF6 => ("I_ATOM_F6", "Atom format 6."),
            AtomF5 => ("I_ATOM_F5", "Atom format 5."),
            AtomF2 => ("I_ATOM_F2", "Atom format 2."),
            AtomF4 => ("I_ATOM_F4", "Atom format 4."),
            AtomF1 => ("I_ATOM_F1", "Atom format 1."),
            AtomF3 => ("I_ATOM_F3", "Atom format 3."),
            Async => ("I_ASYNC", "Alignment Synchronisation."),
            Discard => ("I_DISCARD", "Discard."),
            Overflow => ("I_OVERFLOW", "Overflow."),
            PeReset => ("I_PE_RESET", "PE Reset."),
            TransFail => ("I_TRANS_FAIL", "Transaction Fail."),
        }
    }

    /// Listing name, e.g. `I_ATOM_F1`.
    pub fn name(self) -> &'static str {
        self.name_desc().0
    }
}

/// A sequence of up to 24 atoms; bit 0 of `bits` is the oldest atom, 1 = E (taken), 0 = N.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct Atoms {
    /// E/N pattern, oldest in bit 0.
    pub bits: u32,
    /// Number of atoms.
    pub count: u8,
}

/// PE context (IHI 0064, "Context packets").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct Context {
    /// This packet carried context information (false: "context unchanged", header 0x80).
    pub updated: bool,
    /// Exception level 0-3.
    pub el: u8,
    /// AArch64 (SF bit).
    pub sf: bool,
    /// Non-secure (NS bit).
    pub ns: bool,
    /// ETE/RME NSE bit: with NS gives Root (NS=0) or Realm (NS=1).
    pub nse: bool,
    /// Context ID: `Some` iff this packet updated it (the value persists in the parser).
    pub context_id: Option<u32>,
    /// VMID: `Some` iff this packet updated it.
    pub vmid: Option<u32>,
}

/// Form of an address packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AddrForm {
    /// Exact match with history entry 0..=2.
    Match(u8),
    /// Short address (low 7+s or 15+s bits).
    Short,
    /// Long 32-bit address.
    Long32,
    /// Long 64-bit address.
    Long64,
}

/// A resolved address from an address packet (also Q and source-address packets).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Address {
    /// Packet form.
    pub form: AddrForm,
    /// Instruction set: 0 = IS0 (A64/A32), 1 = IS1 (T32).
    pub is: u8,
    /// Full resolved address.
    pub addr: u64,
    /// Bits supplied by this packet (for short addresses: 9/17 (IS0) or 8/16 (IS1)).
    pub pkt_bits: u8,
}

/// Trace Info packet contents (IHI 0064, "Trace Info packet").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct TraceInfo {
    /// INFO section value (bit0 CC enabled, bits3:1 cond type, bit4 p0_load, bit5 p0_store,
    /// bit6 ETE in-transaction).
    pub info: u32,
    /// P0 key (KEY section), 0 if absent.
    pub key: u32,
    /// Current speculation depth (SPEC section), 0 if absent.
    pub spec_depth: u32,
    /// SPEC section present.
    pub spec_present: bool,
    /// Cycle count threshold (CYCT section), 0 if absent.
    pub cc_threshold: u32,
    /// First Trace Info seen by this parser (OpenCSD: "Decoder Sync point").
    pub initial: bool,
}

impl TraceInfo {
    /// Cycle counting enabled.
    pub fn cc_enabled(&self) -> bool {
        self.info & 1 != 0
    }
    /// ETE: trace started inside a transaction.
    pub fn in_transaction(&self) -> bool {
        self.info & (1 << 6) != 0
    }
}

/// Exception packet contents (IHI 0064, "Exception packets").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Exception {
    /// Exception type (10 bits).
    pub exc_type: u16,
    /// E1:E0 address interpretation (1: return address follows; 2: also matches previous
    /// branch target).
    pub addr_interp: u8,
    /// M-profile fault pending bit.
    pub m_fault_pending: bool,
    /// M-profile numbering.
    pub m_type: bool,
}

/// Q packet (IHI 0064, "Q packets").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct QPacket {
    /// Instruction count, `None` for type 0xF (count unknown).
    pub count: Option<u32>,
    /// Address given by the Q packet itself, if any.
    pub addr: Option<Address>,
    /// Q type (header low nibble).
    pub q_type: u8,
}

/// One ETMv4/ETE packet. `Copy`, no heap data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Packet {
    /// Bytes skipped before the first A-sync (reported once).
    NotSync,
    /// Partial packet at end of trace: the type being parsed.
    IncompleteEot(PacketType),
    /// Malformed packet: the type being parsed (e.g. `Async`).
    BadSequence(PacketType),
    /// Reserved header byte.
    Reserved(u8),
    /// Header not valid for this configuration: its type and byte.
    ReservedCfg(PacketType, u8),
    /// A-sync.
    Async,
    /// Discard (speculative elements dropped).
    Discard,
    /// Overflow (trace lost).
    Overflow,
    /// Trace Info; resets the address history.
    TraceInfo(TraceInfo),
    /// Timestamp: `value` is the full updated timestamp, `bits` how many low bits changed.
    Timestamp {
        /// Full timestamp value after the update.
        value: u64,
        /// Number of low bits replaced by this packet.
        bits: u8,
        /// Cycle count carried by the packet.
        cycle_count: Option<u32>,
    },
    /// Trace On (discontinuity).
    TraceOn,
    /// v8-M function return.
    FuncRet,
    /// Exception (the return address follows in an address packet).
    Exception(Exception),
    /// ETMv4 exception return.
    ExceptionReturn,
    /// ETE PE reset (exception type 0, no address).
    PeReset(Exception),
    /// ETE transaction failure (exception type 0x18).
    TransFail(Exception),
    /// Cycle count formats 1-3.
    CycleCount {
        /// Format 1, 2 or 3.
        format: u8,
        /// Cycle count (0 = unknown).
        count: u32,
        /// Number of elements committed, if carried.
        commit: Option<u32>,
    },
    /// Data synchronisation marker.
    DataSyncMarker {
        /// Numbered marker.
        numbered: bool,
        /// Marker value.
        value: u8,
    },
    /// Commit N oldest speculative elements.
    Commit(u32),
    /// Cancel N newest elements (formats 1-3), optionally with mispredict and atoms.
    Cancel {
        /// Format 1, 2 or 3.
        format: u8,
        /// Elements cancelled.
        count: u32,
        /// Mispredict the newest remaining atom.
        mispredict: bool,
        /// Atoms following the cancel.
        atoms: Atoms,
    },
    /// Mispredict, optionally followed by atoms.
    Mispredict(Atoms),
    /// Conditional instruction / result / flush packets (data-less decode: ETMv4 only).
    Conditional(PacketType),
    /// Ignore (padding).
    Ignore,
    /// Event packet with the 4-bit event mask.
    Event(u8),
    /// Context packet.
    Context(Context),
    /// Address packet, optionally with context (0x82-0x86) or marked as ETE source address.
    Address {
        /// The resolved address.
        addr: Address,
        /// Context from an address-with-context packet.
        context: Option<Context>,
        /// ETE source-address packet (0xB0-0xB9).
        source: bool,
    },
    /// Q packet.
    Q(QPacket),
    /// Atom packet: format 1-6 and the atoms.
    Atom {
        /// Format 1-6.
        format: u8,
        /// The atoms.
        atoms: Atoms,
    },
    /// ETE timestamp marker.
    TsMarker,
    /// ETE instrumentation packet.
    Ite {
        /// Exception level byte.
        el: u8,
        /// 64-bit payload.
        value: u64,
    },
    /// ETE transaction start.
    TransStart,
    /// ETE transaction commit.
    TransCommit,
}

impl Packet {
    /// The listing type of this packet.
    pub fn packet_type(&self) -> PacketType {
        use PacketType as T;
        match *self {
            Packet::NotSync => T::NotSync,
            Packet::IncompleteEot(_) => T::IncompleteEot,
            Packet::BadSequence(_) => T::BadSequence,
            Packet::Reserved(_) => T::Reserved,
            Packet::ReservedCfg(..) => T::ReservedCfg,
            Packet::Async => T::Async,
            Packet::Discard => T::Discard,
            Packet::Overflow => T::Overflow,
            Packet::TraceInfo(_) => T::TraceInfo,
            Packet::Timestamp { .. } => T::Timestamp,
            Packet::TraceOn => T::TraceOn,
            Packet::FuncRet => T::FuncRet,
            Packet::Exception(_) => T::Except,
            Packet::ExceptionReturn => T::ExceptRtn,
            Packet::PeReset(_) => T::PeReset,
            Packet::TransFail(_) => T::TransFail,
            Packet::CycleCount { format: 1, .. } => T::CcntF1,
            Packet::CycleCount { format: 2, .. } => T::CcntF2,
            Packet::CycleCount { .. } => T::CcntF3,
            Packet::DataSyncMarker { numbered: true, .. } => T::NumDsMkr,
            Packet::DataSyncMarker { .. } => T::UnnumDsMkr,
            Packet::Commit(_) => T::Commit,
            Packet::Cancel { format: 1, mispredict: false, .. } => T::CancelF1,
            Packet::Cancel { format: 1, .. } => T::CancelF1Mispred,
            Packet::Cancel { format: 2, .. } => T::CancelF2,
            Packet::Cancel { .. } => T::CancelF3,
            Packet::Mispredict(_) => T::Mispredict,
            Packet::Conditional(t) => t,
            Packet::Ignore => T::Ignore,
            Packet::Event(_) => T::Event,
            Packet::Context(_) => T::Ctxt,
            Packet::Address { addr, context, source } => match (addr.form, addr.is, context.is_some(), source) {
                (AddrForm::Match(_), _, _, false) => T::AddrMatch,
                (AddrForm::Match(_), _, _, true) => T::SrcAddrMatch,
                (AddrForm::Short, 0, _, false) => T::AddrSIs0,
                (AddrForm::Short, _, _, false) => T::AddrSIs1,
                (AddrForm::Short, 0, _, true) => T::SrcAddrSIs0,
                (AddrForm::Short, _, _, true) => T::SrcAddrSIs1,
                (AddrForm::Long32, 0, true, _) => T::AddrCtxtL32Is0,
                (AddrForm::Long32, _, true, _) => T::AddrCtxtL32Is1,
                (AddrForm::Long64, 0, true, _) => T::AddrCtxtL64Is0,
                (AddrForm::Long64, _, true, _) => T::AddrCtxtL64Is1,
                (AddrForm::Long32, 0, false, false) => T::AddrL32Is0,
                (AddrForm::Long32, _, false, false) => T::AddrL32Is1,
                (AddrForm::Long64, 0, false, false) => T::AddrL64Is0,
                (AddrForm::Long64, _, false, false) => T::AddrL64Is1,
                (AddrForm::Long32, 0, false, true) => T::SrcAddrL32Is0,
                (AddrForm::Long32, _, false, true) => T::SrcAddrL32Is1,
                (AddrForm::Long64, 0, false, true) => T::SrcAddrL64Is0,
                (AddrForm::Long64, _, false, true) => T::SrcAddrL64Is1,
            },
            Packet::Q(_) => T::Q,
            Packet::Atom { format, .. } => match format {
                1 => T::AtomF1,
                2 => T::AtomF2,
                3 => T::AtomF3,
                4 => T::AtomF4,
                5 => T::AtomF5,
                _ => T::AtomF6,
            },
            Packet::TsMarker => T::TsMarker,
            Packet::Ite { .. } => T::Ite,
            Packet::TransStart => T::TransSt,
            Packet::TransCommit => T::TransCommit,
        }
    }

    /// Is this an error/corruption packet?
    pub fn is_error(&self) -> bool {
        matches!(self, Packet::IncompleteEot(_) | Packet::BadSequence(_) | Packet::Reserved(_) | Packet::ReservedCfg(..))
    }
}
