//! Generic trace elements produced by the instruction-level decoder, and their
//! `trc_pkt_lister` text form (`Idx:N; ID:N; OCSD_GEN_TRC_ELEM_...(...)`, OpenCSD 1.8.0
//! `OcsdTraceElement::toString`), so our listings diff line for line against OpenCSD's.
//!
//! The element kinds are those OpenCSD's ETMv4/ETE decoder emits (IHI 0064 section 6.2 "The
//! trace stream and its interpretation"; DDI 0608 chapter 6): instruction ranges with the last
//! instruction's type and E/N result, exceptions with their preferred return address, PE context
//! changes, trace-on and no-sync discontinuities, timestamps, cycle counts, events, ...

use crate::image::MemSpace;
use crate::insn::{InstrSubtype, InstrType, Isa};
use std::fmt;

/// Why the decoder is (or went) out of sync, or why trace ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnsyncReason {
    /// Unknown.
    Unknown,
    /// Decoder just created.
    InitDecoder,
    /// Decoder reset.
    ResetDecoder,
    /// Trace overflow.
    Overflow,
    /// Discard packet.
    Discard,
    /// Bad or unexpected packet.
    BadPacket,
    /// Inconsistent program image.
    BadImage,
    /// End of trace data.
    EndOfTrace,
}

impl UnsyncReason {
    fn name(self) -> &'static str {
        match self {
            UnsyncReason::Unknown => "undefined",
            UnsyncReason::InitDecoder => "init-decoder",
            UnsyncReason::ResetDecoder => "reset-decoder",
            UnsyncReason::Overflow => "overflow",
            UnsyncReason::Discard => "discard",
            UnsyncReason::BadPacket => "bad-packet",
            UnsyncReason::BadImage => "bad-program-image",
            UnsyncReason::EndOfTrace => "end-of-trace",
        }
    }
}

/// Why trace (re)started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TraceOnReason {
    /// Start of trace or trace filtering.
    Normal,
    /// After an overflow.
    Overflow,
    /// Debug restart.
    ExDebug,
}

/// Security state of the PE.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Security {
    /// Secure.
    #[default]
    Secure,
    /// Non-secure.
    NonSecure,
    /// Root (RME).
    Root,
    /// Realm (RME).
    Realm,
}

/// PE context as reported in `PE_CONTEXT` elements. Like OpenCSD, the context ID and VMID
/// stay valid once seen (they are persistent element state).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PeContext {
    /// Exception level.
    pub el: u8,
    /// `el` is known.
    pub el_valid: bool,
    /// Security state.
    pub security: Security,
    /// AArch64.
    pub bits64: bool,
    /// Last VMID seen.
    pub vmid: Option<u32>,
    /// Last context ID seen.
    pub context_id: Option<u32>,
}

/// An executed instruction range `[start, end)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct InstrRange {
    /// First instruction address.
    pub start: u64,
    /// Address after the last instruction (exclusive end).
    pub end: u64,
    /// Number of instructions.
    pub num_instr: u32,
    /// ISA of the range.
    pub isa: Isa,
    /// Size of the last instruction.
    pub last_size: u8,
    /// Last instruction executed (E atom) or not (N atom; conditional branch not taken).
    pub executed: bool,
    /// Last instruction class.
    pub last_type: InstrType,
    /// Last instruction sub-type.
    pub last_subtype: InstrSubtype,
    /// Last instruction is conditional.
    pub last_cond: bool,
}

impl InstrRange {
    /// Address of the last instruction of the range.
    pub fn last_instr_addr(&self) -> u64 {
        self.end.wrapping_sub(self.last_size as u64)
    }
}

/// Transactional-memory element kinds (ETE, FEAT_TME).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemTrans {
    /// Trace started inside a transaction.
    TraceInit,
    /// Transaction start.
    Start,
    /// Transaction commit.
    Commit,
    /// Transaction failure.
    Fail,
}

/// What an element reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ElementKind {
    /// Decoder not (or no longer) synchronised.
    NoSync(UnsyncReason),
    /// Trace (re)started: a discontinuity.
    TraceOn(TraceOnReason),
    /// End of trace.
    EoTrace(UnsyncReason),
    /// A Trace Info packet was committed: the trace unit (re)synchronised, as it does when it
    /// is enabled (a new trace session, or the resume of a paused one). OpenCSD outputs no
    /// element for it; listings skip it ([`Element::write_line`]).
    TraceInfo,
    /// PE context changed.
    PeContext {
        /// ISA after the change.
        isa: Isa,
        /// The context.
        ctx: PeContext,
    },
    /// Executed instructions.
    InstrRange(InstrRange),
    /// `num_instr` instructions executed from `start` on an unknown path, continuing at `next`.
    IRangeNoPath {
        /// First instruction.
        start: u64,
        /// Where execution continued.
        next: u64,
        /// Instruction count.
        num_instr: u32,
        /// ISA.
        isa: Isa,
    },
    /// Code at `addr` could not be read from the image.
    AddrNacc {
        /// Address.
        addr: u64,
        /// Memory space that was searched.
        space: MemSpace,
    },
    /// Exception taken.
    Exception {
        /// Preferred return address (if `ret_addr_valid`).
        ret_addr: u64,
        /// The return address is given.
        ret_addr_valid: bool,
        /// The return address was also the previous branch's target.
        ret_addr_br_tgt: bool,
        /// M-profile tail chain.
        m_tail_chain: bool,
        /// Exception number.
        number: u16,
    },
    /// Exception return.
    ExceptionRet,
    /// Timestamp (with the cycle count of the TS packet if cycle counting is on).
    Timestamp {
        /// Timestamp value.
        ts: u64,
        /// Cycle count.
        cc: Option<u32>,
    },
    /// Cycle count.
    CycleCount(u32),
    /// Numbered event.
    Event(u16),
    /// ETE timestamp marker.
    SyncMarker(u32),
    /// Transactional memory.
    MemTrans(MemTrans),
    /// ETE instrumentation.
    Instrumentation {
        /// Exception level.
        el: u8,
        /// Value.
        value: u64,
    },
}

/// One decoded element: `index` is the trace byte index of the packet it came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Element {
    /// Trace index of the originating packet.
    pub index: u64,
    /// Trace ID of the source.
    pub trace_id: u8,
    /// The element.
    pub kind: ElementKind,
}

/// An instruction range as the decoder hands it over: ranges, by far the most common element,
/// go to [`ElementSink::ranges`](crate::decoder::ElementSink::ranges) in batches of these,
/// without an [`Element`] built for each (the trace ID is the batch's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Range {
    /// Trace index of the originating packet.
    pub index: u64,
    /// The range.
    pub range: InstrRange,
}

impl AsRef<InstrRange> for Range {
    #[inline(always)]
    fn as_ref(&self) -> &InstrRange {
        &self.range
    }
}

impl AsRef<InstrRange> for InstrRange {
    #[inline(always)]
    fn as_ref(&self) -> &InstrRange {
        self
    }
}

impl Range {
    /// The range as an element of source `trace_id`.
    #[inline]
    pub fn element(&self, trace_id: u8) -> Element {
        Element { index: self.index, trace_id, kind: ElementKind::InstrRange(self.range) }
    }
}

impl fmt::Display for ElementKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            ElementKind::NoSync(r) => write!(f, "OCSD_GEN_TRC_ELEM_NO_SYNC( [{}])", r.name()),
            ElementKind::EoTrace(r) => write!(f, "OCSD_GEN_TRC_ELEM_EO_TRACE( [{}])", r.name()),
            ElementKind::TraceInfo => f.write_str("TRACE_INFO (not an OpenCSD element)"),
            ElementKind::TraceOn(r) => {
                let s = match r {
                    TraceOnReason::Normal => "begin or filter",
                    TraceOnReason::Overflow => "overflow",
                    TraceOnReason::ExDebug => "debug restart",
                };
                write!(f, "OCSD_GEN_TRC_ELEM_TRACE_ON( [{s}])")
            }
            ElementKind::PeContext { isa, ctx } => {
                write!(f, "OCSD_GEN_TRC_ELEM_PE_CONTEXT((ISA={}) ", isa.name())?;
                if ctx.el_valid {
                    write!(f, "EL{}", ctx.el)?;
                }
                f.write_str(match ctx.security {
                    Security::Secure => "S; ",
                    Security::NonSecure => "N; ",
                    Security::Root => "Root; ",
                    Security::Realm => "Realm; ",
                })?;
                f.write_str(if ctx.bits64 { "64-bit; " } else { "32-bit; " })?;
                if let Some(v) = ctx.vmid {
                    write!(f, "VMID=0x{v:x}; ")?;
                }
                if let Some(c) = ctx.context_id {
                    write!(f, "CTXTID=0x{c:x}; ")?;
                }
                f.write_str(")")
            }
            ElementKind::InstrRange(r) => {
                write!(
                    f,
                    "OCSD_GEN_TRC_ELEM_INSTR_RANGE(exec range=0x{:x}:[0x{:x}] num_i({}) last_sz({}) (ISA={}) {} {}{}{})",
                    r.start,
                    r.end,
                    r.num_instr,
                    r.last_size,
                    r.isa.name(),
                    if r.executed { "E" } else { "N" },
                    r.last_type.name(),
                    r.last_subtype.name(),
                    if r.last_cond { " <cond>" } else { "" }
                )
            }
            ElementKind::IRangeNoPath { start, next, num_instr, .. } => {
                write!(f, "OCSD_GEN_TRC_ELEM_I_RANGE_NOPATH(first 0x{start:x}:[next 0x{next:x}] num_i({num_instr}) )")
            }
            ElementKind::AddrNacc { addr, space } => {
                write!(f, "OCSD_GEN_TRC_ELEM_ADDR_NACC( 0x{addr:x}; Memspace [0x{:x}:{}] )", space.0, space.name())
            }
            ElementKind::Exception { ret_addr, ret_addr_valid, ret_addr_br_tgt, number, .. } => {
                f.write_str("OCSD_GEN_TRC_ELEM_EXCEPTION(")?;
                if ret_addr_valid {
                    write!(f, "pref ret addr:0x{ret_addr:x}")?;
                    if ret_addr_br_tgt {
                        f.write_str(" [addr also prev br tgt]")?;
                    }
                    f.write_str("; ")?;
                }
                write!(f, "excep num (0x{number:02x}) )")
            }
            ElementKind::ExceptionRet => f.write_str("OCSD_GEN_TRC_ELEM_EXCEPTION_RET()"),
            ElementKind::Timestamp { ts, cc } => {
                write!(f, "OCSD_GEN_TRC_ELEM_TIMESTAMP( [ TS=0x{ts:012x}]; ")?;
                if let Some(c) = cc {
                    write!(f, " [CC={c}]; ")?;
                }
                f.write_str(")")
            }
            ElementKind::CycleCount(c) => write!(f, "OCSD_GEN_TRC_ELEM_CYCLE_COUNT( [CC={c}]; )"),
            ElementKind::Event(n) => write!(f, "OCSD_GEN_TRC_ELEM_EVENT( Numbered:{n}; )"),
            ElementKind::SyncMarker(v) => {
                write!(f, "OCSD_GEN_TRC_ELEM_SYNC_MARKER( [Timestamp marker(0x{v:08x})])")
            }
            ElementKind::MemTrans(t) => write!(
                f,
                "OCSD_GEN_TRC_ELEM_MEMTRANS({})",
                match t {
                    MemTrans::TraceInit => "Init",
                    MemTrans::Start => "Start",
                    MemTrans::Commit => "Commit",
                    MemTrans::Fail => "Fail",
                }
            ),
            ElementKind::Instrumentation { el, value } => {
                write!(f, "OCSD_GEN_TRC_ELEM_INSTRUMENTATION(EL{el}; 0x{value:016x})")
            }
        }
    }
}

impl fmt::Display for Element {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Idx:{}; ID:{:x}; {}", self.index, self.trace_id, self.kind)
    }
}

#[inline]
fn push_hex(out: &mut Vec<u8>, v: u64) {
    const D: &[u8; 16] = b"0123456789abcdef";
    let mut buf = [0u8; 16];
    let mut i = 16;
    let mut x = v;
    loop {
        i -= 1;
        buf[i] = D[(x & 0xF) as usize];
        x >>= 4;
        if x == 0 {
            break;
        }
    }
    out.extend_from_slice(&buf[i..]);
}

#[inline]
fn push_dec(out: &mut Vec<u8>, v: u64) {
    let mut buf = [0u8; 20];
    let mut i = 20;
    let mut x = v;
    loop {
        i -= 1;
        buf[i] = b'0' + (x % 10) as u8;
        x /= 10;
        if x == 0 {
            break;
        }
    }
    out.extend_from_slice(&buf[i..]);
}

impl Element {
    /// Appends the listing line (same text as `Display`, plus `\n`) to `out`. Instruction
    /// ranges, by far the most common element, are formatted without `core::fmt`.
    pub fn write_line(&self, out: &mut Vec<u8>) {
        if let ElementKind::TraceInfo = self.kind {
            return;
        }
        if let ElementKind::InstrRange(r) = &self.kind {
            out.extend_from_slice(b"Idx:");
            push_dec(out, self.index);
            out.extend_from_slice(b"; ID:");
            push_hex(out, self.trace_id as u64);
            out.extend_from_slice(b"; OCSD_GEN_TRC_ELEM_INSTR_RANGE(exec range=0x");
            push_hex(out, r.start);
            out.extend_from_slice(b":[0x");
            push_hex(out, r.end);
            out.extend_from_slice(b"] num_i(");
            push_dec(out, r.num_instr as u64);
            out.extend_from_slice(b") last_sz(");
            push_dec(out, r.last_size as u64);
            out.extend_from_slice(b") (ISA=");
            out.extend_from_slice(r.isa.name().as_bytes());
            out.extend_from_slice(if r.executed { b") E " } else { b") N " });
            out.extend_from_slice(r.last_type.name().as_bytes());
            out.extend_from_slice(r.last_subtype.name().as_bytes());
            if r.last_cond {
                out.extend_from_slice(b" <cond>");
            }
            out.extend_from_slice(b")\n");
        } else {
            use std::io::Write;
            let _ = writeln!(out, "{self}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fast line writer gives exactly the `Display` text for every element kind.
    #[test]
    fn write_line_matches_display() {
        let r = InstrRange {
            start: 0xffff_ffc0_0008_3400,
            end: 0xffff_ffc0_0008_3404,
            num_instr: 1,
            isa: Isa::A64,
            last_size: 4,
            executed: false,
            last_type: InstrType::BrIndirect,
            last_subtype: InstrSubtype::V8Ret,
            last_cond: true,
        };
        let kinds = [
            ElementKind::InstrRange(r),
            ElementKind::InstrRange(InstrRange {
                start: 0,
                end: 2,
                isa: Isa::Thumb2,
                last_size: 2,
                executed: true,
                last_subtype: InstrSubtype::None,
                last_cond: false,
                ..r
            }),
            ElementKind::NoSync(UnsyncReason::InitDecoder),
            ElementKind::Timestamp { ts: 0x1234, cc: Some(7) },
            ElementKind::AddrNacc { addr: 0x10, space: MemSpace::EL3 },
        ];
        for (i, k) in kinds.into_iter().enumerate() {
            let e = Element { index: 1234567 * i as u64, trace_id: 0x1a, kind: k };
            let mut v = Vec::new();
            e.write_line(&mut v);
            assert_eq!(String::from_utf8(v).unwrap(), format!("{e}\n"));
        }
    }

    /// Range lines render exactly like trc_pkt_lister's (text copied from an OpenCSD listing).
    #[test]
    fn range_text() {
        let e = Element {
            index: 48,
            trace_id: 1,
            kind: ElementKind::InstrRange(InstrRange {
                start: 0x1886c,
                end: 0x18878,
                num_instr: 3,
                isa: Isa::A64,
                last_size: 4,
                executed: true,
                last_type: InstrType::Br,
                last_subtype: InstrSubtype::None,
                last_cond: true,
            }),
        };
        assert_eq!(
            e.to_string(),
            "Idx:48; ID:1; OCSD_GEN_TRC_ELEM_INSTR_RANGE(exec range=0x1886c:[0x18878] num_i(3) last_sz(4) (ISA=A64) E BR   <cond>)"
        );
    }

    /// Context and NACC lines match OpenCSD text.
    #[test]
    fn context_and_nacc_text() {
        let ctx =
            PeContext { el: 1, el_valid: true, security: Security::NonSecure, bits64: true, vmid: Some(0), context_id: Some(0) };
        assert_eq!(
            ElementKind::PeContext { isa: Isa::A64, ctx }.to_string(),
            "OCSD_GEN_TRC_ELEM_PE_CONTEXT((ISA=A64) EL1N; 64-bit; VMID=0x0; CTXTID=0x0; )"
        );
        assert_eq!(
            ElementKind::AddrNacc { addr: 0x40188c, space: MemSpace::EL1N }.to_string(),
            "OCSD_GEN_TRC_ELEM_ADDR_NACC( 0x40188c; Memspace [0x2:EL1N] )"
        );
    }
}
