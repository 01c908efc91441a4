//! Trace decoders behind [`WindowDecoder`]: the `etm_decode` adapter (the real one) and
//! [`toy::ToyDecoder`], a test double with a trivial byte format used to test the pipeline's
//! fault handling independently of the ETM decoder.

use std::ops::ControlFlow;
use std::sync::Arc;

use etm_decode::branches::{BranchBatch, BranchRule};
use etm_decode::decoder::ElementSink;
use etm_decode::elements::{Element, ElementKind, InstrRange, Range, TraceOnReason, UnsyncReason};
use etm_decode::frame::StreamFormat;
use etm_decode::image::{MemSpace, MemoryAccess};
use etm_decode::insn::{ArchVersion, DecodeConfig, InstrSubtype, InstrType, decode_a64};
use etm_decode::pipeline::BufferDecoder;
use etm_decode::snapshot::{CoreProfile, EtmConfig, Protocol};

use crate::code::{CodeMap, ContextCode};
use crate::join::InsnKind;
use crate::session::BranchPair;
use crate::session::{CpuTraceConfig, TraceArch};
use crate::window::{DecoderFactory, DecoderShared, Discontinuity, TraceRange, WindowDecoder, WindowSink};

/// The default decoder factory: [`EtmFactory`].
pub fn default_factory() -> Option<Arc<dyn DecoderFactory>> {
    Some(Arc::new(EtmFactory))
}

/// The `etm_decode` decoder configuration of a CPU's trace unit (perf AUXTRACE_INFO values).
pub fn etm_config(c: &CpuTraceConfig) -> EtmConfig {
    let mut idr = [0u32; 14];
    idr[0] = c.trcidr0;
    idr[1] = c.trcidr1;
    idr[2] = c.trcidr2;
    idr[8] = c.trcidr8;
    let protocol = match c.arch {
        TraceArch::Ete => Protocol::Ete,
        TraceArch::Etmv4 => Protocol::Etmv4,
    };
    let devarch = match (c.trcdevarch, protocol) {
        (0, Protocol::Ete) => 0x4770_5A13,
        (v, _) => v,
    };
    EtmConfig {
        protocol,
        core_profile: CoreProfile::A,
        configr: c.trcconfigr,
        traceidr: u32::from(c.trace_id),
        idr,
        authstatus: c.trcauthstatus,
        devarch,
    }
}

/// Creates [`EtmWindowDecoder`]s.
#[derive(Debug, Default)]
pub struct EtmFactory;

impl DecoderFactory for EtmFactory {
    fn create(&self, aux_cpu: i32, cpus: &[CpuTraceConfig], raw: bool, shared: &DecoderShared) -> Box<dyn WindowDecoder> {
        Box::new(EtmWindowDecoder::with_shared(aux_cpu, cpus, raw, shared))
    }
}

/// The real decoder for one AUX buffer: `etm_decode`'s deformatter, packet parser and element
/// decoder, with branch records built from the elements by perf's rule
/// (`etm_decode::branches::BranchRule`), streamed to the window sink as the decoder emits
/// them (no copy of the element stream; the ranges arrive in runs, `ElementSink::ranges`,
/// with no element built for each). When no stage takes the ranges
/// ([`DecoderShared::ranges`] false) the decoder applies the rule itself, from the records its
/// run cache stores with each run, and hands batches of taken branches
/// (`ElementSink::takes_branches`), which the adapter joins to each trace ID's chain.
///
/// Two things perf's rules leave out are completed from the element decoder itself:
/// * the *last* taken branch of a window: the element decoder emits a branch record only when
///   the next range starts, which never happens after the pause. At the end of every piece of
///   data the decoder's [`pending_target`](etm_decode::decoder::Decoder::pending_target) (a
///   direct branch's target, the uncommitted address packet after an indirect branch, or the
///   return stack's top for a compressed return) is noted; at the end of the segment (trace
///   on, loss of sync, end of trace, or [`WindowDecoder::complete_pending`]) the pending
///   branch is completed with it if no range came since (a direct branch's target is also
///   read from the code when the segment ends inside a piece of data);
/// * the window's time: the decoder reports every timestamp as an element
///   ([`set_unmarked_timestamps`](BufferDecoder::set_unmarked_timestamps): ETE's TRCIDR0.TSMARK
///   would otherwise drop those before the first timestamp marker, and synthetic and perf
///   sessions date windows by the timestamp between the sync and the trace-on).
pub struct EtmWindowDecoder {
    sources: Vec<(u8, EtmConfig, ArchVersion)>,
    buf: BufferDecoder,
    st: Adapter,
}

/// Branch state of every trace ID (separate from the decoder so elements can be handled while
/// the decoder runs).
struct Adapter {
    /// Per trace ID (index), the branch state.
    ids: Vec<Option<IdState>>,
    raw: bool,
    insn_cfg: DecodeConfig,
    /// Branches not yet handed to the sink, of trace ID `batch_id` (oldest first): handed
    /// over in one call before any other sink call and at the end of every piece of data.
    /// The first `batch.len` are held.
    batch: Batch<BranchPair>,
    /// The ranges of the same stretch, if the sink takes them (then at least as many as
    /// branches: a range completes at most one).
    rbatch: Batch<TraceRange>,
    /// The sink takes the ranges ([`DecoderShared::ranges`]; else `rbatch` stays empty and
    /// the decoder hands batches of taken branches instead of ranges: `branches`).
    want_ranges: bool,
    batch_id: Option<u8>,
    /// Per trace ID: the traced context is another process's (its code is not read).
    foreign: Vec<bool>,
}

#[derive(Debug, Clone)]
struct IdState {
    /// The branch chain: perf's rule (`etm_decode::branches::BranchRule`).
    rule: BranchRule,
    /// Instruction ranges seen (identifies the last range).
    ranges: u64,
    /// Trace index of the element of the last range.
    last_range_index: u64,
    /// Last timestamp (index, value) not yet used.
    last_ts: Option<(u64, u64)>,
    /// At the end of the data so far: (`ranges` then, target of the last range's branch).
    pending: Option<(u64, u64)>,
    /// The pending branch already emitted by [`Adapter::complete_pending`] (the record made
    /// when the next range arrives is then not emitted again).
    completed: Option<(u64, u64)>,
}

impl IdState {
    /// The last range's taken branch whose record is not made yet: (from, type).
    #[inline]
    fn pending_branch(&self) -> Option<(u64, InstrType)> {
        self.rule.pending()
    }

    /// perf's rule for a run of ranges, the previous range's taken branch ending at each: the
    /// records to `out` (which has room for the run), except the one
    /// [`Adapter::complete_pending`] already emitted; `each(i, range)` for every range, `i` its
    /// place in `rs` (the sink's ranges, when it takes them).
    #[inline(always)]
    fn ranges(&mut self, rs: &[Range], out: &mut Batch<BranchPair>, mut each: impl FnMut(usize, &InstrRange)) {
        let Some(last) = rs.last() else { return };
        if let Some(done) = self.completed.take() {
            // the first range's record, unless it is the one already emitted
            let r = &rs[0].range;
            each(0, r);
            if let Some(rec) = self.rule.range(r)
                && done != (rec.from, rec.to)
            {
                out.buf[out.len] = rec;
                out.len += 1;
            }
            out.len += self.rule.ranges(&rs[1..], &mut out.buf[out.len..], |i, r| each(i + 1, r));
        } else {
            out.len += self.rule.ranges(rs, &mut out.buf[out.len..], each);
        }
        self.ranges += rs.len() as u64;
        self.last_range_index = last.index;
    }

    fn new() -> Self {
        IdState { rule: BranchRule::default(), ranges: 0, last_range_index: 0, last_ts: None, pending: None, completed: None }
    }
}

impl EtmWindowDecoder {
    /// A decoder for the buffer of `aux_cpu`. Raw data belongs to that CPU's trace unit
    /// (TRBE); formatted data is demultiplexed by trace ID.
    pub fn new(aux_cpu: i32, cpus: &[CpuTraceConfig], raw: bool) -> Self {
        Self::with_shared(aux_cpu, cpus, raw, &DecoderShared::default())
    }

    /// [`new`](Self::new) sharing the block cache with the pipeline's other decoders, making
    /// instruction ranges for the sink only if the pipeline takes them
    /// ([`DecoderShared::ranges`]).
    pub fn with_shared(aux_cpu: i32, cpus: &[CpuTraceConfig], raw: bool, shared: &DecoderShared) -> Self {
        let cache = shared.block_cache.clone();
        let sources: Vec<(u8, EtmConfig, ArchVersion)> = if raw {
            cpus.iter()
                .find(|c| c.cpu == aux_cpu)
                .or(cpus.first())
                .map(|c| vec![(c.trace_id, etm_config(c), ArchVersion::Aa64)])
                .unwrap_or_default()
        } else {
            cpus.iter().map(|c| (c.trace_id, etm_config(c), ArchVersion::Aa64)).collect()
        };
        let format = match (raw, sources.first()) {
            (true, Some(s)) => StreamFormat::Raw { trace_id: s.0 },
            (true, None) => StreamFormat::Raw { trace_id: 0x10 },
            (false, _) => StreamFormat::Coresight,
        };
        let mut d = EtmWindowDecoder {
            buf: BufferDecoder::with_cache(format, &sources, cache),
            sources,
            st: Adapter {
                ids: (0..128).map(|_| None).collect(),
                raw,
                insn_cfg: DecodeConfig { arch: ArchVersion::Aa64, wfi_wfe_branch: false, dsb_dmb_waypoints: false },
                batch: Batch::default(),
                rbatch: Batch::default(),
                want_ranges: shared.ranges,
                batch_id: None,
                foreign: vec![false; 128],
            },
        };
        d.reset();
        d
    }

    /// Notes each trace ID's pending branch target at the end of the data decoded so far.
    fn note_pending(&mut self) {
        for (id, _, _) in &self.sources {
            let Some(st) = self.st.ids[(*id & 0x7f) as usize].as_mut() else { continue };
            st.pending = match st.pending_branch() {
                // The decoder's view, else what an exception after the branch told (the
                // decoder then waits for the handler's address and knows no target).
                Some(_) => self
                    .buf
                    .decoder(*id)
                    .and_then(|d| d.pending_target())
                    .map(|t| (st.ranges, t))
                    .or(st.pending.filter(|(n, _)| *n == st.ranges)),
                None => None,
            };
        }
    }
}

/// The range as the window sink takes it.
#[inline(always)]
fn trace_range(r: &InstrRange) -> TraceRange {
    TraceRange { start: r.start, n: r.num_instr, kind: range_kind(r) }
}

/// What a range's last instruction does to the call stack, as the decoder classified it
/// (its type and sub-type, those OpenCSD reports): a branch with link is a call, a return
/// (A64 RET family, or an A32/T32 instruction that implies one) a return. The rule is
/// [`kind_of`]; this reads its table (no branches in the adapter's loop).
#[inline(always)]
fn range_kind(r: &InstrRange) -> InsnKind {
    // (masked: no bounds check)
    KINDS[kind_at(r.last_type, r.last_subtype) & 63]
}

/// Where [`KINDS`] holds the kind of (type, sub-type).
#[inline(always)]
const fn kind_at(t: InstrType, s: InstrSubtype) -> usize {
    t as usize * 8 + s as usize
}

/// The rule of [`range_kind`].
const fn kind_of(t: InstrType, s: InstrSubtype) -> InsnKind {
    match (t, s) {
        (InstrType::Br | InstrType::BrIndirect, InstrSubtype::BrLink) => InsnKind::Call,
        (InstrType::BrIndirect, InstrSubtype::V8Ret | InstrSubtype::V7ImpliedRet) => InsnKind::Return,
        _ => InsnKind::Other,
    }
}

/// Every instruction type and sub-type (`kinds_table_is_the_rule` fails to build when one is
/// added to the decoder's and not here).
const TYPES: [InstrType; 7] = [
    InstrType::Other,
    InstrType::Br,
    InstrType::BrIndirect,
    InstrType::Isb,
    InstrType::DsbDmb,
    InstrType::WfiWfe,
    InstrType::Tstart,
];
const SUBTYPES: [InstrSubtype; 5] =
    [InstrSubtype::None, InstrSubtype::BrLink, InstrSubtype::V8Ret, InstrSubtype::V8Eret, InstrSubtype::V7ImpliedRet];

/// [`kind_of`] of every (type, sub-type), at [`kind_at`].
const KINDS: [InsnKind; 64] = {
    let mut k = [InsnKind::Other; 64];
    let mut i = 0;
    while i < TYPES.len() {
        let mut j = 0;
        while j < SUBTYPES.len() {
            k[kind_at(TYPES[i], SUBTYPES[j])] = kind_of(TYPES[i], SUBTYPES[j]);
            j += 1;
        }
        i += 1;
    }
    k
};

/// Most branches batched before they are handed to the sink.
const BATCH: usize = 256;

/// A batch being filled: its first `len` of `BATCH` held (written in place by the run loops,
/// no capacity check per item).
struct Batch<T> {
    buf: Box<[T; BATCH]>,
    len: usize,
}

impl<T: Copy + Default> Default for Batch<T> {
    fn default() -> Self {
        Batch { buf: Box::new([T::default(); BATCH]), len: 0 }
    }
}

impl<T> Batch<T> {
    fn held(&self) -> &[T] {
        &self.buf[..self.len]
    }
}

impl Adapter {
    /// Hands the batched branches to the sink.
    #[inline]
    fn flush(&mut self, sink: &mut dyn WindowSink) {
        flush_batches(&mut self.batch, &mut self.rbatch, self.batch_id, sink);
    }

    /// A run of instruction ranges of `trace_id` (the decoder's batch): perf's rule per range
    /// into the branch and range batches.
    #[inline]
    fn ranges(&mut self, trace_id: u8, rs: &[Range], sink: &mut dyn WindowSink) {
        let Some(st) = self.ids[(trace_id & 0x7f) as usize].as_mut() else { return };
        let id = if self.raw { None } else { Some(trace_id) };
        if self.batch_id != id {
            flush_batches(&mut self.batch, &mut self.rbatch, self.batch_id, sink);
            self.batch_id = id;
        }
        // at most BATCH of each handed over at once, as the batches fill (a range completes
        // at most one record: with ranges batched, the branches never outnumber them; without,
        // `rbatch` stays empty)
        for run in rs.chunks(BATCH) {
            if self.batch.len.max(self.rbatch.len) + run.len() > BATCH {
                flush_batches(&mut self.batch, &mut self.rbatch, id, sink);
            }
            if self.want_ranges {
                let rout = &mut self.rbatch.buf[self.rbatch.len..self.rbatch.len + run.len()];
                st.ranges(run, &mut self.batch, |i, r| rout[i] = trace_range(r));
                self.rbatch.len += run.len();
            } else {
                st.ranges(run, &mut self.batch, |_, _| {});
            }
        }
    }

    /// The taken branches of a stretch of ranges of `trace_id` that the decoder ruled (when
    /// the sink takes no ranges): joined to the chain, except the one
    /// [`complete_pending`](Self::complete_pending) already emitted, and handed to the sink.
    #[inline]
    fn branches(&mut self, trace_id: u8, batch: &mut BranchBatch<'_>, sink: &mut dyn WindowSink) {
        let Some(st) = self.ids[(trace_id & 0x7f) as usize].as_mut() else { return };
        let id = if self.raw { None } else { Some(trace_id) };
        // (the adapter's own batches stay empty: it takes no ranges)
        debug_assert!(self.batch.len == 0 && self.rbatch.len == 0);
        let done = st.completed.take();
        st.ranges += batch.ranges;
        st.last_range_index = batch.last_index;
        let all = batch.records.len();
        let mut recs = batch.join(&mut st.rule);
        // the first range's record (if the chain made it), unless it is the one already
        // emitted
        if let Some(done) = done
            && recs.len() == all
            && recs.first().is_some_and(|f| (f.from, f.to) == done)
        {
            recs = &recs[1..];
        }
        if !recs.is_empty() {
            sink.branches(id, recs);
        }
    }

    /// Complete the pending taken branch of `id` (end of a segment).
    fn complete_pending(&mut self, id: u8, code: &CodeMap, sink: &mut dyn WindowSink) {
        self.flush(sink);
        let raw = self.raw;
        let Some(st) = self.ids[(id & 0x7f) as usize].as_mut() else { return };
        let Some((from, ty)) = st.pending_branch() else { return };
        if st.completed.is_some_and(|(f, _)| f == from) {
            return;
        }
        let target = match st.pending {
            Some((n, t)) if n == st.ranges => Some(t),
            _ if ty == InstrType::Br => code.read_u32(None, from).map(|w| decode_a64(from, w, &self.insn_cfg).branch_addr),
            _ => None,
        };
        if let Some(to) = target {
            st.completed = Some((from, to));
            sink.branch(if raw { None } else { Some(id) }, from, to);
        }
    }

    #[inline]
    fn element(&mut self, e: &Element, code: &CodeMap, sink: &mut dyn WindowSink) {
        let slot = (e.trace_id & 0x7f) as usize;
        if self.ids[slot].is_none() {
            return;
        }
        let id = if self.raw { None } else { Some(e.trace_id) };
        if let ElementKind::InstrRange(r) = e.kind {
            // (the decoder hands ranges to `ranges`; an element built from one, the same)
            self.ranges(e.trace_id, &[Range { index: e.index, range: r }], sink);
            return;
        }
        self.flush(sink);
        match e.kind {
            ElementKind::Timestamp { ts, .. } => {
                let st = self.ids[slot].as_mut().expect("checked");
                st.last_ts = Some((e.index, ts));
                // Inside a segment (after its first range) a timestamp dates it if nothing did.
                if st.rule.in_chain() {
                    sink.timestamp(id, ts);
                }
                return;
            }
            ElementKind::TraceOn(r) => {
                log::trace!("element {e:?}");
                self.complete_pending(e.trace_id, code, sink);
                if r == TraceOnReason::Overflow {
                    sink.discontinuity(id, Discontinuity::Overflow);
                }
                sink.trace_on(id);
                // The timestamp between the sync and this trace-on dates the segment.
                let st = self.ids[slot].as_mut().expect("checked");
                if let Some((idx, ts)) = st.last_ts.take()
                    && idx > st.last_range_index
                {
                    sink.timestamp(id, ts);
                }
            }
            ElementKind::NoSync(r) => {
                log::trace!("element {e:?}");
                self.complete_pending(e.trace_id, code, sink);
                let why = match r {
                    UnsyncReason::Overflow => Discontinuity::Overflow,
                    UnsyncReason::BadPacket | UnsyncReason::BadImage => Discontinuity::Error,
                    _ => Discontinuity::NoSync,
                };
                sink.discontinuity(id, why);
            }
            ElementKind::EoTrace(_) => self.complete_pending(e.trace_id, code, sink),
            ElementKind::AddrNacc { .. } => {
                let why = if self.foreign[slot] { Discontinuity::Foreign } else { Discontinuity::NoCode };
                sink.discontinuity(id, why);
                return;
            }
            ElementKind::TraceInfo => {
                // The trace unit was (re)enabled: whatever was pending ended before it.
                self.complete_pending(e.trace_id, code, sink);
                sink.trace_info(id);
            }
            ElementKind::PeContext { ctx, .. } => {
                if let Some(c) = ctx.context_id {
                    self.foreign[slot] = code.context_code(Some(c)) == ContextCode::Foreign;
                    sink.context(id, c);
                }
                return;
            }
            ElementKind::Exception { .. } | ElementKind::ExceptionRet => {
                let st = self.ids[slot].as_mut().expect("checked");
                // An exception right after a taken branch, before its target ran: the preferred
                // return address is the branch's target (no range was walked to reach it).
                if let ElementKind::Exception { ret_addr, ret_addr_valid: true, .. } = e.kind
                    && st.pending_branch().is_some()
                {
                    st.pending = Some((st.ranges, ret_addr));
                }
                st.rule.exception();
                return;
            }
            _ => return,
        }
        // A discontinuity (trace on, no sync, end of trace) breaks the chain.
        let st = self.ids[slot].as_mut().expect("checked");
        st.rule.break_chain();
    }
}

/// Hands the batched branches, then the batched ranges, of `id` to the sink.
#[inline]
fn flush_batches(batch: &mut Batch<BranchPair>, rbatch: &mut Batch<TraceRange>, id: Option<u8>, sink: &mut dyn WindowSink) {
    if batch.len > 0 {
        sink.branches(id, batch.held());
        batch.len = 0;
    }
    if rbatch.len > 0 {
        sink.ranges(id, rbatch.held());
        rbatch.len = 0;
    }
}

/// Bridges the code map to the decoder's memory interface (the target process's code).
struct Mem<'a>(&'a CodeMap);

impl MemoryAccess for Mem<'_> {
    fn read(&self, addr: u64, space: MemSpace, buf: &mut [u8]) -> usize {
        self.read_ctx(addr, space, None, buf)
    }
    fn slice_at(&self, addr: u64, space: MemSpace) -> Option<&[u8]> {
        self.slice_at_ctx(addr, space, None)
    }
    fn read_ctx(&self, addr: u64, space: MemSpace, context_id: Option<u32>, buf: &mut [u8]) -> usize {
        match self.slice_at_ctx(addr, space, context_id) {
            Some(s) => {
                let n = s.len().min(buf.len());
                buf[..n].copy_from_slice(&s[..n]);
                n
            }
            None => 0,
        }
    }
    fn code_id(&self, _space: MemSpace, context_id: Option<u32>) -> u64 {
        self.0.code_id(context_id)
    }
    /// Another process's context has none (see `slice_at_ctx`).
    fn has_code(&self, _space: MemSpace, context_id: Option<u32>) -> bool {
        self.0.context_code(context_id) != ContextCode::Foreign
    }
    fn generation(&self) -> u64 {
        self.0.generation()
    }
    /// The code of the traced context's process; none for another process's context.
    fn slice_at_ctx(&self, addr: u64, _space: MemSpace, context_id: Option<u32>) -> Option<&[u8]> {
        match self.0.context_code(context_id) {
            ContextCode::Target => self.0.slice(None, addr),
            ContextCode::Process(pid) => self.0.slice(Some(pid), addr),
            ContextCode::Foreign => None,
        }
    }
}

/// Hands the decoder's elements to the adapter as they are produced.
struct ElemSink<'a, 'b> {
    st: &'a mut Adapter,
    code: &'a CodeMap,
    sink: &'a mut (dyn WindowSink + 'b),
}

impl ElementSink for ElemSink<'_, '_> {
    #[inline]
    fn element(&mut self, e: &Element) -> ControlFlow<()> {
        self.st.element(e, self.code, self.sink);
        ControlFlow::Continue(())
    }

    #[inline]
    fn ranges(&mut self, trace_id: u8, rs: &[Range]) -> ControlFlow<()> {
        self.st.ranges(trace_id, rs, self.sink);
        ControlFlow::Continue(())
    }

    /// Without a stage that takes the ranges, the decoder rules them itself.
    #[inline]
    fn takes_branches(&self) -> bool {
        !self.st.want_ranges
    }

    #[inline]
    fn branches(&mut self, trace_id: u8, batch: &mut BranchBatch<'_>) -> ControlFlow<()> {
        self.st.branches(trace_id, batch, self.sink);
        ControlFlow::Continue(())
    }
}

impl WindowDecoder for EtmWindowDecoder {
    fn feed(&mut self, data: &[u8], code: &CodeMap, sink: &mut dyn WindowSink) {
        let _ = self.buf.push(data, &Mem(code), &mut ElemSink { st: &mut self.st, code, sink });
        self.st.flush(sink);
        self.note_pending();
    }

    fn reset(&mut self) {
        self.st.batch.len = 0;
        self.st.rbatch.len = 0;
        // The same decoders (and cache), back to unsynchronised (not rebuilt: a reset follows
        // every gap and COLLISION).
        self.buf.restart();
        self.buf.set_unmarked_timestamps(true);
        for (id, _, _) in &self.sources {
            self.st.ids[(*id & 0x7f) as usize] = Some(IdState::new());
        }
    }

    fn complete_pending(&mut self, code: &CodeMap, sink: &mut dyn WindowSink) {
        for (id, _, _) in &self.sources {
            self.st.complete_pending(*id, code, sink);
        }
    }

    fn finish(&mut self, code: &CodeMap, sink: &mut dyn WindowSink) {
        self.note_pending();
        let _ = self.buf.finish(&Mem(code), &mut ElemSink { st: &mut self.st, code, sink });
        self.st.flush(sink);
        for (id, _, _) in &self.sources {
            self.st.complete_pending(*id, code, sink);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::isa::a64_kind;
    use etm_decode::branches::{BranchRecord, RangeEnd};
    use etm_decode::insn::Isa;

    /// The branches a window sink receives.
    #[derive(Default)]
    struct Got(Vec<(u64, u64)>);

    impl WindowSink for Got {
        fn trace_on(&mut self, _: Option<u8>) {}
        fn timestamp(&mut self, _: Option<u8>, _: u64) {}
        fn branch(&mut self, _: Option<u8>, from: u64, to: u64) {
            self.0.push((from, to));
        }
        fn discontinuity(&mut self, _: Option<u8>, _: Discontinuity) {}
    }

    fn adapter(want_ranges: bool) -> Adapter {
        let mut ids: Vec<Option<IdState>> = (0..128).map(|_| None).collect();
        ids[1] = Some(IdState::new());
        Adapter {
            ids,
            raw: false,
            insn_cfg: DecodeConfig { arch: ArchVersion::Aa64, wfi_wfe_branch: false, dsb_dmb_waypoints: false },
            batch: Batch::default(),
            rbatch: Batch::default(),
            want_ranges,
            batch_id: None,
            foreign: vec![false; 128],
        }
    }

    /// A window closed while the trace goes on (`complete_pending`: the last taken branch's
    /// record made from the decoder's pending target) gets that record once, and the trace
    /// that continues the rest: the same records with the decoder's ranges and with its
    /// batches of taken branches (ruled from the open chain, as the decoder's run cache
    /// stores them), and those of the ranges one by one.
    #[test]
    fn completed_branch_is_not_made_again() {
        // 0x100..0x108 ends in a taken BR to 0x200; 0x200..0x208 in a taken B to 0x300;
        // 0x300..0x304 in a not-taken one
        let range = |start: u64, end: u64, executed: bool| InstrRange {
            start,
            end,
            num_instr: ((end - start) / 4) as u32,
            isa: Isa::A64,
            last_size: 4,
            executed,
            last_type: if start == 0x100 { InstrType::BrIndirect } else { InstrType::Br },
            ..Default::default()
        };
        let rs = [range(0x100, 0x108, true), range(0x200, 0x208, true), range(0x300, 0x304, false)];
        let want = vec![(0x104, 0x200), (0x204, 0x300)];
        let code = CodeMap::new(None);
        for decoder_rules in [false, true] {
            let mut a = adapter(!decoder_rules);
            let mut got = Got::default();
            let feed = |a: &mut Adapter, rs: &[InstrRange], got: &mut Got| {
                if decoder_rules {
                    let mut rule = BranchRule::OPEN;
                    let mut recs = [BranchRecord::default(); 4];
                    let n = rule.ranges(rs, &mut recs, |_, _| {});
                    let mut batch = BranchBatch { records: &mut recs[..n], end: rule, ranges: rs.len() as u64, last_index: 0 };
                    a.branches(1, &mut batch, got);
                } else {
                    let rs: Vec<Range> = rs.iter().map(|&range| Range { index: 0, range }).collect();
                    a.ranges(1, &rs, got);
                    a.flush(got);
                }
            };
            feed(&mut a, &rs[..1], &mut got);
            // the end of the data: the decoder's target of the pending BR
            let st = a.ids[1].as_mut().unwrap();
            assert_eq!(st.pending_branch(), Some((0x104, InstrType::BrIndirect)));
            st.pending = Some((st.ranges, 0x200));
            a.complete_pending(1, &code, &mut got);
            a.complete_pending(1, &code, &mut got);
            assert_eq!(got.0, want[..1], "decoder rules: {decoder_rules}");
            feed(&mut a, &rs[1..], &mut got);
            assert_eq!(got.0, want, "decoder rules: {decoder_rules}");
            assert_eq!(
                a.ids[1].as_ref().unwrap().rule.range_end(),
                Some(RangeEnd { from: 0x300, ty: InstrType::Br, taken: false })
            );
        }
    }

    /// The kind the exact counts take from the decoder's classification of a range's last
    /// instruction is the one the code facts give (`a64_kind`, checked against llvm-objdump
    /// in etm-decode's tests) for calls and returns, on every branch, exception and system
    /// encoding class (bits 28:26 = 101) sampled, and on the return and call forms written out.
    #[test]
    fn range_kind_is_the_code_kind() {
        let cfg = DecodeConfig { arch: ArchVersion::Aa64, wfi_wfe_branch: false, dsb_dmb_waypoints: false };
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let fixed = [0xD65F_03C0u32, 0xD65F_0BFF, 0xD65F_0FFF, 0xD63F_0000, 0x9400_0010, 0xD73F_0820, 0xD63F_081F, 0xD61F_0200];
        let (mut calls, mut returns) = (0, 0);
        for i in 0..2_000_000u32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let w = match fixed.get(i as usize) {
                Some(&w) => w,
                None => (x as u32 & !0x1C00_0000) | 0x1400_0000,
            };
            let info = decode_a64(0x1000, w, &cfg);
            let r = InstrRange {
                start: 0x1000,
                end: 0x1004,
                num_instr: 1,
                last_type: info.ty,
                last_subtype: info.subtype,
                last_cond: info.is_cond,
                ..Default::default()
            };
            let want = match a64_kind(w) {
                k @ (InsnKind::Call | InsnKind::Return) => k,
                _ => InsnKind::Other,
            };
            assert_eq!(range_kind(&r), want, "{w:#010x}");
            calls += usize::from(want == InsnKind::Call);
            returns += usize::from(want == InsnKind::Return);
        }
        // the sample reaches both kinds many times over
        assert!(calls > 10_000 && returns > 4, "{calls} calls, {returns} returns");
    }

    /// The table `range_kind` reads holds its rule (`kind_of`) for every type and sub-type,
    /// and the lists it is built from name every one: the matches here name each once (a type
    /// or sub-type added to the decoder stops this building until it is listed).
    #[test]
    fn kinds_table_is_the_rule() {
        let type_at = |t: InstrType| match t {
            InstrType::Other => 0,
            InstrType::Br => 1,
            InstrType::BrIndirect => 2,
            InstrType::Isb => 3,
            InstrType::DsbDmb => 4,
            InstrType::WfiWfe => 5,
            InstrType::Tstart => 6,
        };
        let sub_at = |s: InstrSubtype| match s {
            InstrSubtype::None => 0,
            InstrSubtype::BrLink => 1,
            InstrSubtype::V8Ret => 2,
            InstrSubtype::V8Eret => 3,
            InstrSubtype::V7ImpliedRet => 4,
        };
        assert!(TYPES.iter().enumerate().all(|(i, &t)| type_at(t) == i));
        assert!(SUBTYPES.iter().enumerate().all(|(i, &s)| sub_at(s) == i));
        let mut kinds = Vec::new();
        for t in TYPES {
            for s in SUBTYPES {
                let r = InstrRange { last_type: t, last_subtype: s, ..Default::default() };
                assert_eq!(range_kind(&r), kind_of(t, s), "{t:?} {s:?}");
                kinds.push(kind_of(t, s));
            }
        }
        // (the rule is not constant)
        assert_eq!(kinds.iter().filter(|&&k| k == InsnKind::Call).count(), 2);
        assert_eq!(kinds.iter().filter(|&&k| k == InsnKind::Return).count(), 2);
    }
}

pub mod toy {
    //! A test double for [`WindowDecoder`](crate::window::WindowDecoder): a tiny resumable
    //! packet format with a sync marker, so tests can inject truncation, lost data, flipped
    //! bytes and missing sync and check the pipeline's handling. Format:
    //!
    //! * `A5 A5` sync (the decoder ignores everything until it has seen one);
    //! * `01` trace on; `02 <u64 le>` timestamp; `03 <u64 from> <u64 to>` taken branch;
    //!   `04` overflow; `05` trace info (a window starts); `06 <u32 le>` context id; any other
    //!   byte is an error (the decoder loses sync).

    use crate::code::CodeMap;
    use crate::session::CpuTraceConfig;
    use crate::window::{DecoderFactory, Discontinuity, WindowDecoder, WindowSink};

    /// Encoder for the toy format.
    #[derive(Debug, Default, Clone)]
    pub struct ToyWriter(pub Vec<u8>);

    impl ToyWriter {
        /// Sync marker.
        pub fn sync(&mut self) -> &mut Self {
            self.0.extend_from_slice(&[0xA5, 0xA5]);
            self
        }
        /// Trace on.
        pub fn trace_on(&mut self) -> &mut Self {
            self.0.push(1);
            self
        }
        /// Timestamp.
        pub fn ts(&mut self, t: u64) -> &mut Self {
            self.0.push(2);
            self.0.extend_from_slice(&t.to_le_bytes());
            self
        }
        /// Branch.
        pub fn branch(&mut self, from: u64, to: u64) -> &mut Self {
            self.0.push(3);
            self.0.extend_from_slice(&from.to_le_bytes());
            self.0.extend_from_slice(&to.to_le_bytes());
            self
        }
        /// Overflow.
        pub fn overflow(&mut self) -> &mut Self {
            self.0.push(4);
            self
        }
        /// Trace info (the trace unit was enabled: a window starts).
        pub fn trace_info(&mut self) -> &mut Self {
            self.0.push(5);
            self
        }
        /// Context id (a thread id).
        pub fn context(&mut self, id: u32) -> &mut Self {
            self.0.push(6);
            self.0.extend_from_slice(&id.to_le_bytes());
            self
        }
    }

    /// The toy decoder.
    #[derive(Debug, Default)]
    pub struct ToyDecoder {
        synced: bool,
        /// Bytes of an incomplete packet carried to the next chunk.
        partial: Vec<u8>,
        /// Whether the last byte seen while unsynced was 0xA5.
        half_sync: bool,
        reported_gap: bool,
    }

    fn need(op: u8) -> usize {
        match op {
            2 => 9,
            3 => 17,
            6 => 5,
            _ => 1,
        }
    }

    impl ToyDecoder {
        fn packet(&mut self, p: &[u8], sink: &mut dyn WindowSink) {
            let u = |i: usize| u64::from_le_bytes(p[i..i + 8].try_into().expect("8 bytes"));
            match p[0] {
                1 => sink.trace_on(None),
                2 => sink.timestamp(None, u(1)),
                3 => sink.branch(None, u(1), u(9)),
                4 => sink.discontinuity(None, Discontinuity::Overflow),
                5 => sink.trace_info(None),
                6 => sink.context(None, u32::from_le_bytes(p[1..5].try_into().expect("4 bytes"))),
                _ => unreachable!("checked by the caller"),
            }
        }
    }

    impl WindowDecoder for ToyDecoder {
        fn feed(&mut self, data: &[u8], _code: &CodeMap, sink: &mut dyn WindowSink) {
            let mut i = 0;
            while i < data.len() {
                if !self.synced {
                    if !self.reported_gap {
                        sink.discontinuity(None, Discontinuity::NoSync);
                        self.reported_gap = true;
                    }
                    let b = data[i];
                    i += 1;
                    if b == 0xA5 && self.half_sync {
                        self.synced = true;
                        self.half_sync = false;
                    } else {
                        self.half_sync = b == 0xA5;
                    }
                    continue;
                }
                if self.partial.is_empty() {
                    let op = data[i];
                    if op == 0xA5 {
                        // A sync marker while synced: consume it.
                        if data.get(i + 1) == Some(&0xA5) {
                            i += 2;
                            continue;
                        }
                    }
                    if !(1..=6).contains(&op) {
                        sink.discontinuity(None, Discontinuity::Error);
                        self.synced = false;
                        self.reported_gap = true;
                        self.half_sync = false;
                        continue;
                    }
                    let n = need(op);
                    if data.len() - i >= n {
                        let mut buf = [0u8; 17];
                        buf[..n].copy_from_slice(&data[i..i + n]);
                        i += n;
                        self.packet(&buf[..n], sink);
                        continue;
                    }
                    self.partial.extend_from_slice(&data[i..]);
                    return;
                }
                let n = need(self.partial[0]);
                let take = (n - self.partial.len()).min(data.len() - i);
                self.partial.extend_from_slice(&data[i..i + take]);
                i += take;
                if self.partial.len() == n {
                    let p = std::mem::take(&mut self.partial);
                    self.packet(&p, sink);
                }
            }
        }

        fn reset(&mut self) {
            *self = ToyDecoder::default();
        }
    }

    /// Factory of [`ToyDecoder`]s.
    #[derive(Debug, Default)]
    pub struct ToyFactory;

    impl DecoderFactory for ToyFactory {
        fn create(
            &self,
            _aux_cpu: i32,
            _cpus: &[CpuTraceConfig],
            _raw: bool,
            _shared: &crate::window::DecoderShared,
        ) -> Box<dyn WindowDecoder> {
            Box::new(ToyDecoder::default())
        }
    }
}
