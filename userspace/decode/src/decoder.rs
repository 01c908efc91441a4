//! Instruction-level ETMv4/ETE decoder: consumes the packet stream of one trace source and the
//! program image, and emits generic trace [`Element`]s.
//!
//! This follows the "P0 element" model of IHI 0064 chapter 6 (section 6.2 "Speculation" /
//! 6.4.2 "P0 elements": atoms, exceptions, Q elements, ETE source addresses and transaction
//! starts are speculative until committed; Commit, Cancel, Mispredict and Discard packets
//! resolve them, and anything beyond TRCIDR8.MAXSPEC is implicitly committed) and OpenCSD's
//! `TrcPktDecodeEtmV4I` (v1.8.0) state machine, so that the output matches OpenCSD line for
//! line:
//!
//! * packets become P0 stack entries (newest at the back here);
//! * committed atoms walk the image from the current address to the next waypoint
//!   ([`crate::walk`]), applying E/N to the waypoint: direct branch targets are computed,
//!   indirect targets come from the next address packet or, with return-stack compression
//!   (TRCCONFIGR.RS, IHI 0064 section 6.4.12 "Return stack"), from a 16-entry return stack;
//! * exceptions (IHI 0064 section 6.4.6) output the range up to the preferred return address,
//!   then an `EXCEPTION` element; ETE has no exception-return packet, so an E atom on an ERET
//!   emits `EXCEPTION_RET` (DDI 0608);
//! * Q elements (section 6.4.13) output `I_RANGE_NOPATH` unless the path is unambiguous;
//! * ETE source-address packets (DDI 0608 "Source address packets") give the last executed
//!   instruction of a range directly.
//!
//! Corrupt or inconsistent input resets to "not synchronised" (counted in [`DecodeStats`]) and
//! the decoder resynchronises at the next A-sync + Trace Info, exactly as OpenCSD does. Nothing
//! is allocated per packet or element: the P0 stack and output buffer are reused and bounded.

use std::collections::VecDeque;
use std::ops::ControlFlow;

use crate::branches::{BranchBatch, BranchRecord, BranchRule, RangeEnd};
use crate::cache::{self, INNER_MAX, RUN_MAX, Run, RunSlot, SharedBlockCache, StackEffect};
use crate::elements::{Element, ElementKind, InstrRange, MemTrans, PeContext, Range, Security, TraceOnReason, UnsyncReason};
use crate::frame::ChunkIndex;
use crate::image::{MemSpace, MemoryAccess};
use crate::insn::{ArchVersion, DecodeConfig, InstrSubtype, InstrType, Isa};
use crate::packet::{Address, Atoms, Context, Lookahead, Packet};
use crate::snapshot::{CoreProfile, EtmConfig};
pub use crate::walk::DecodeOptions;
use crate::walk::{self, RawRange, WalkState, WpRes};

/// Receives decoded elements; return `ControlFlow::Break(())` to stop decoding early.
///
/// Instruction ranges arrive through [`ranges`](ElementSink::ranges) (never through
/// [`elements`](ElementSink::elements)), the other kinds through `elements`; the calls follow
/// trace order. The defaults hand every element, ranges included, to
/// [`element`](ElementSink::element).
pub trait ElementSink {
    /// Called for every element, in trace order (by the defaults of the batch methods).
    fn element(&mut self, e: &Element) -> ControlFlow<()>;

    /// Called with each run of consecutive non-range elements the decoder produced for one
    /// packet (in order); the default calls [`element`](ElementSink::element) for each.
    #[inline(always)]
    fn elements(&mut self, es: &[Element]) -> ControlFlow<()> {
        for e in es {
            self.element(e)?;
        }
        ControlFlow::Continue(())
    }

    /// Called with each run of consecutive instruction ranges of source `trace_id` (in
    /// order; a run may span packets); the default calls [`element`](ElementSink::element)
    /// with each as an element.
    #[inline]
    fn ranges(&mut self, trace_id: u8, rs: &[Range]) -> ControlFlow<()> {
        for r in rs {
            self.element(&r.element(trace_id))?;
        }
        ControlFlow::Continue(())
    }

    /// Whether the decoder may hand ranges over through
    /// [`packet_ranges`](ElementSink::packet_ranges) (without buffering them first): then
    /// ranges come through `packet_ranges` or [`ranges`](ElementSink::ranges), in trace order.
    /// The default is no.
    #[inline]
    fn takes_packet_ranges(&self) -> bool {
        false
    }

    /// Called (only if [`takes_packet_ranges`](ElementSink::takes_packet_ranges)) with
    /// instruction ranges of source `trace_id`, in order, all of the packet at trace index
    /// `index`: the ranges of the decoder's cache of atom runs, as they are stored. The
    /// default hands them to [`ranges`](ElementSink::ranges).
    #[inline]
    fn packet_ranges(&mut self, trace_id: u8, index: u64, rs: &[InstrRange]) -> ControlFlow<()> {
        for &range in rs {
            self.ranges(trace_id, &[Range { index, range }])?;
        }
        ControlFlow::Continue(())
    }

    /// Whether the sink takes the taken branches of the ranges instead of the ranges
    /// themselves ([`branches`](ElementSink::branches)): then the decoder rules its ranges
    /// by perf's rule ([`BranchRule`]), from the records its run cache stored with each run
    /// where a packet is one stored run, and hands no range over. The default is no.
    #[inline]
    fn takes_branches(&self) -> bool {
        false
    }

    /// Called (only if [`takes_branches`](ElementSink::takes_branches)) with the taken
    /// branches of a stretch of ranges of source `trace_id` (at least one range), in trace
    /// order with the other elements: before every call of
    /// [`elements`](ElementSink::elements), and at the end of every piece of data. The sink
    /// [`join`](BranchBatch::join)s them to its chain, to which it applies the elements
    /// (exceptions, discontinuities) itself.
    #[inline]
    fn branches(&mut self, _trace_id: u8, _batch: &mut BranchBatch<'_>) -> ControlFlow<()> {
        ControlFlow::Continue(())
    }
}

/// Records [`Branches`] holds before it hands them over at the next packet.
const BRANCH_BATCH: usize = 256;

/// Room [`Branches`] keeps beyond [`BRANCH_BATCH`] for one packet's records from the run
/// cache: a packet has at most 32 atoms (`Atoms::bits`), a range makes at most one record, and
/// a stored run's are copied as a block of [`RUN_MAX`].
const PACKET_ROOM: usize = 32 + 1 + RUN_MAX;

/// The taken branches not handed over yet, for a sink that takes branches
/// ([`ElementSink::takes_branches`]): perf's rule over the ranges in trace order, from an open
/// chain ([`BranchRule::OPEN`]) after each hand-over.
struct Branches {
    /// `recs[..len]` held.
    recs: Box<[BranchRecord; BRANCH_BATCH + PACKET_ROOM]>,
    len: usize,
    /// The chain after the last range.
    chain: RangeEnd,
    /// Ranges ruled since the hand-over, and the packet index of the last.
    ranges: u64,
    last_index: u64,
    /// Where the current packet's records began, while it may still fail (an error
    /// discards its output: [`Decoder::discard_out`]).
    mark: Option<BranchMark>,
}

/// [`Branches`] before a packet (see [`Branches::mark`]), and what its stored runs added to
/// the decoder's counts.
#[derive(Debug, Clone, Copy)]
struct BranchMark {
    len: usize,
    chain: RangeEnd,
    ranges: u64,
    last_index: u64,
    /// The instructions of the packet's ranges so far (set when the packet leaves the loop).
    instructions: u64,
}

impl Default for Branches {
    fn default() -> Self {
        Branches {
            recs: Box::new([BranchRecord::default(); BRANCH_BATCH + PACKET_ROOM]),
            len: 0,
            chain: RangeEnd::OPEN,
            ranges: 0,
            last_index: 0,
            mark: None,
        }
    }
}

impl Branches {
    /// Hands the records over, if any range came since the last hand-over. (Out of line: it
    /// is called once per batch, and inlined it would grow the parser's loop.)
    #[inline(never)]
    fn hand_over<S: ElementSink + ?Sized>(&mut self, id: u8, sink: &mut S) -> ControlFlow<()> {
        if self.ranges == 0 {
            return ControlFlow::Continue(());
        }
        let mut batch = BranchBatch {
            records: &mut self.recs[..self.len],
            end: BranchRule::after(self.chain),
            ranges: self.ranges,
            last_index: self.last_index,
        };
        let r = sink.branches(id, &mut batch);
        self.len = 0;
        self.chain = RangeEnd::OPEN;
        self.ranges = 0;
        self.mark = None;
        r
    }

    /// Before a packet's records from the run cache: room for them ([`PACKET_ROOM`]), the
    /// held ones handed over if need be.
    #[inline(always)]
    fn room<S: ElementSink + ?Sized>(&mut self, id: u8, sink: &mut S) -> ControlFlow<()> {
        if self.len > BRANCH_BATCH { self.hand_over(id, sink) } else { ControlFlow::Continue(()) }
    }

    /// Ranges of the decoder's buffer, ruled one by one.
    #[inline]
    fn rule_ranges<S: ElementSink + ?Sized>(&mut self, id: u8, mut rs: &[Range], sink: &mut S) -> ControlFlow<()> {
        while !rs.is_empty() {
            if self.len >= BRANCH_BATCH {
                self.hand_over(id, sink)?;
            }
            let (now, rest) = rs.split_at(rs.len().min(BRANCH_BATCH - self.len));
            let mut rule = BranchRule::after(self.chain);
            self.len += rule.ranges(now, &mut self.recs[self.len..], |_, _| {});
            self.chain = rule.range_end().unwrap_or(self.chain);
            self.ranges += now.len() as u64;
            self.last_index = now.last().map_or(self.last_index, |r| r.index);
            rs = rest;
        }
        ControlFlow::Continue(())
    }

    /// A stored run (`slot`, its `count` ranges, its records after the first range's
    /// `inner`) from `start` (its first range's) in the packet at trace index `index`: its
    /// records from the run cache, after [`room`](Self::room) for the packet.
    #[inline(always)]
    fn stored(&mut self, slot: &RunSlot, inner: &[BranchRecord; INNER_MAX], count: u8, start: u64, index: u64) {
        let (n, end) = slot.branches();
        self.len = BranchRule::stored(&mut self.chain, start, inner, n, end, &mut self.recs[..], self.len);
        self.ranges += count as u64;
        self.last_index = index;
    }

    /// Marks the start of a packet whose records may be taken back (see
    /// [`mark`](Self::mark)).
    #[inline(always)]
    fn set_mark(&mut self) {
        self.mark = Some(BranchMark {
            len: self.len,
            chain: self.chain,
            ranges: self.ranges,
            last_index: self.last_index,
            instructions: 0,
        });
    }
}

impl<F: FnMut(&Element) -> ControlFlow<()>> ElementSink for F {
    fn element(&mut self, e: &Element) -> ControlFlow<()> {
        self(e)
    }
}

/// How [`cached_run`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RunEnd {
    /// All the atoms applied, or up to a taken indirect branch: a run to store.
    Whole,
    /// At a block not cached.
    Uncached,
    /// After a taken exception return (its element, in ETE, depends on the decoder).
    Eret,
}

/// What a run built now may take from the return stack ([`cached_run`]): whether a
/// compressed return in it is followed at all (`on`: for a sink that takes branches, the
/// return stack live), and the entries pushed before it that it may pop, top first
/// ([`cache::NO_TOP`] where there are none, or not A64).
#[derive(Debug, Clone, Copy)]
struct RunPops {
    on: bool,
    top: [u64; cache::OUTER_MAX],
}

impl RunPops {
    /// Runs stop at every taken indirect branch.
    const OFF: RunPops = RunPops { on: false, top: [cache::NO_TOP; cache::OUTER_MAX] };
}

/// The one rule for atoms applied from cached blocks: up to `max` atoms `bits` (oldest in
/// bit 0) from the A64 address `start`, while their blocks are in `cache` under `tag`; one
/// range per atom into `out`; stops after a taken indirect branch (its target comes from the
/// trace) unless `pops` allows going on through a compressed return (an atom follows in the
/// packet: the return stack gives the target, as [`Decoder::run_atoms`] pops it): to an
/// address the run itself pushed, or else to the next of `pops.top`; and at the first block
/// not cached. Returns what they did besides their ranges, their effect on the return stack
/// if they pop, and why it stopped. (`POPS`: whether `pops` is looked at, compiled in only
/// for the loop of a sink that takes branches.)
#[inline(always)]
fn cached_run<const POPS: bool>(
    cache: &cache::BlockCache,
    start: u64,
    tag: u64,
    bits: u32,
    max: u8,
    pops: RunPops,
    out: &mut [InstrRange; RUN_MAX],
) -> (Run, StackEffect, RunEnd) {
    let mut run = Run { next: start, ..Run::default() };
    let mut effect = StackEffect::NONE;
    let mut bits = bits;
    // the return addresses the run pushed and has not popped (at most one per atom)
    let mut pushed = [0u64; RUN_MAX];
    let mut depth = 0usize;
    while run.count < max {
        let addr = run.next;
        let Some(blk) = cache.lookup(addr, tag) else {
            return (run, effect, RunEnd::Uncached);
        };
        let taken = bits & 1 != 0;
        bits >>= 1;
        let last = blk.last;
        run.instructions += blk.num_instr;
        let k = run.count;
        if let Some(r) = out.get_mut(k as usize) {
            *r = InstrRange {
                start: addr,
                end: blk.end,
                num_instr: blk.num_instr,
                isa: Isa::A64,
                last_size: 4,
                executed: taken,
                last_type: last.ty,
                last_subtype: last.subtype,
                last_cond: last.is_cond,
            };
        }
        run.next = blk.end;
        run.count += 1;
        if taken {
            if POPS && pops.on && last.is_link && matches!(last.ty, InstrType::Br | InstrType::BrIndirect) {
                // its return address, pushed (`push_links`)
                pushed[depth.min(RUN_MAX - 1)] = blk.end;
                depth += 1;
                effect.peak = effect.peak.max(depth as u8);
            }
            match last.ty {
                InstrType::Br => {
                    run.links |= (last.is_link as u8) << k;
                    run.next = last.branch_addr;
                }
                InstrType::BrIndirect => {
                    run.links |= (last.is_link as u8) << k;
                    if last.subtype == InstrSubtype::V8Eret {
                        run.indirect = true;
                        return (run, effect, RunEnd::Eret);
                    }
                    if POPS && pops.on {
                        // a compressed return: the return stack's top (`return_stack_pop`)
                        if run.count < max {
                            let popped = effect.popped as usize;
                            if depth > 0 {
                                depth -= 1;
                                run.next = pushed[depth.min(RUN_MAX - 1)];
                                run.pops |= 1 << k;
                                continue;
                            }
                            if let Some(&t) = pops.top.get(popped)
                                && t != cache::NO_TOP
                            {
                                effect.outer[popped] = t;
                                effect.popped += 1;
                                run.next = t;
                                run.pops |= 1 << k;
                                continue;
                            }
                        }
                    }
                    run.indirect = true;
                    break;
                }
                _ => {}
            }
        }
    }
    if POPS {
        effect.kept = depth as u8;
        for (p, &a) in effect.pushes.iter_mut().zip(&pushed[..depth.min(RUN_MAX)]) {
            *p = a;
        }
        let p = usize::from(effect.popped);
        effect.same = depth == p && effect.pushes.iter().take(p).eq(effect.outer[..p].iter().rev());
    }
    (run, effect, RunEnd::Whole)
}

/// The run of `bits` (`max` atoms) from `start` built from the blocks in `cache` (in
/// `scratch`; with `POPS`, through compressed returns as `scratch.pops` allows, and stored
/// apart, under [`cache::THROUGH_RETURNS`]), stored if it is one to store
/// ([`RunEnd::Whole`]): the slot now holding it. Out of line: the atom-run loop's registers
/// are for its hits.
#[inline(never)]
fn store_cached_run<'c, const POPS: bool>(
    cache: &'c cache::BlockCache,
    scratch: &mut RunScratch,
    start: u64,
    tag: u64,
    bits: u32,
    max: u8,
) -> Option<&'c cache::RunSlot> {
    match cached_run::<POPS>(cache, start, tag, bits, max, scratch.pops, &mut scratch.ranges) {
        (run, effect, RunEnd::Whole) => {
            let run_tag = if POPS { tag | cache::THROUGH_RETURNS } else { tag };
            cache.store_run(start, run_tag, bits, max, run, effect, &scratch.ranges[..run.count as usize])
        }
        (run, _, RunEnd::Uncached) => {
            // (a run cut through a compressed return is built again by the general path,
            // which applies a cut run's pushes only)
            scratch.cut = (run.pops == 0).then_some((start, bits, max, run));
            None
        }
        (_, _, RunEnd::Eret) => None,
    }
}

/// Where a run is built ([`cached_run`]) before it is stored or applied, and, after
/// [`store_cached_run`] found a block not cached, what it had built: the run's start, atom
/// bits and count, and the run up to that block (its ranges in `ranges`); and what the run
/// to build may pop (for a sink that takes branches).
#[derive(Debug)]
struct RunScratch {
    ranges: [InstrRange; RUN_MAX],
    cut: Option<(u64, u32, u8, Run)>,
    pops: RunPops,
}

impl Default for RunScratch {
    fn default() -> Self {
        RunScratch { ranges: Default::default(), cut: None, pops: RunPops::OFF }
    }
}

/// Static decoder configuration, derived from the trace unit's registers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecoderConfig {
    /// Trace ID printed in element lines.
    pub trace_id: u8,
    /// ETE (version 5.x) rather than ETMv4.
    pub ete: bool,
    /// TRCIDR8.MAXSPEC.
    pub max_spec_depth: u32,
    /// TRCCONFIGR.RS.
    pub ret_stack: bool,
    /// TRCCONFIGR.CCI (timestamps carry a cycle count).
    pub cycle_count: bool,
    /// TSTART is a P0 element (TRCIDR0.COMMTRANS == 0).
    pub comm_trans_p0: bool,
    /// ETE timestamp markers implemented: timestamps are only reported after the first marker.
    pub ts_marker: bool,
    /// M-profile core.
    pub m_profile: bool,
    /// Instruction classification options.
    pub insn: DecodeConfig,
    /// Optional OpenCSD error checks (range limit, A64 opcode check); default off.
    pub opts: DecodeOptions,
}

impl DecoderConfig {
    /// From a snapshot/perf trace-unit configuration and the core's architecture.
    pub fn new(etm: &EtmConfig, arch: ArchVersion) -> Self {
        DecoderConfig {
            trace_id: etm.trace_id(),
            ete: etm.major_version() >= 5,
            max_spec_depth: etm.max_spec_depth(),
            ret_stack: etm.ret_stack_enabled(),
            cycle_count: etm.cycle_count_enabled(),
            comm_trans_p0: etm.comm_trans_p0(),
            ts_marker: etm.has_ts_marker(),
            m_profile: etm.core_profile == CoreProfile::M,
            insn: DecodeConfig { arch, wfi_wfe_branch: etm.wfi_wfe_branch(), dsb_dmb_waypoints: false },
            opts: DecodeOptions::default(),
        }
    }
}

/// Counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DecodeStats {
    /// Packets processed.
    pub packets: u64,
    /// Elements emitted.
    pub elements: u64,
    /// Instruction ranges emitted.
    pub ranges: u64,
    /// Instructions in those ranges.
    pub instructions: u64,
    /// Bad/reserved packets seen by the decoder.
    pub bad_packets: u64,
    /// Packet-sequence errors (commit overrun, missing address, return-stack underflow, ...).
    pub sequence_errors: u64,
    /// `ADDR_NACC` elements (code not in the image).
    pub nacc: u64,
    /// Resets because the P0 stack exceeded its bound.
    pub stack_overflows: u64,
    /// Decode-cache hits.
    pub cache_hits: u64,
    /// Decode-cache misses.
    pub cache_misses: u64,
}

impl DecodeStats {
    /// All errors.
    pub fn errors(&self) -> u64 {
        self.bad_packets + self.sequence_errors + self.stack_overflows
    }
}

/// Most ranges [`Decoder::atoms`] holds back before handing them over (within the output
/// buffer's initial capacity, so holding allocates nothing).
const HOLD_MAX: usize = 128;

/// Bound on stacked (uncommitted) P0 entries; beyond it the decoder resynchronises.
const MAX_P0_STACK: usize = 1 << 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    NoSync,
    WaitSync,
    WaitTinfo,
    Decode,
}

#[derive(Debug, Clone, Copy)]
enum P0Kind {
    Atom { bits: u32, num: u8 },
    Addr { addr: u64, is: u8 },
    SrcAddr { addr: u64, is: u8 },
    Ctxt { ctx: Context, is: u8 },
    TrcOn,
    Excep { num: u16, prev_same: bool, pe_reset: bool },
    ExcepRet,
    FuncRet,
    Event(u16),
    Ts { ts: u64, cc: Option<u32> },
    Cc(u32),
    Marker,
    Q { count: u32, addr: Option<(u64, u8)> },
    TransStart,
    TransCommit,
    TransFail,
    TransTraceInit,
    Ite { el: u8, value: u64 },
    Unseen,
    TInfo,
}

#[derive(Debug, Clone, Copy)]
struct P0 {
    kind: P0Kind,
    is_p0: bool,
    index: u64,
}

/// See [`Decoder::next_addr`]: the address, instruction set and packet index of a target
/// address packet, valid when `set`.
#[derive(Debug, Default, Clone, Copy)]
struct NextAddr {
    set: bool,
    is: u8,
    addr: u64,
    index: u64,
}

#[derive(Debug, Default, Clone, Copy)]
struct ElemRes {
    commit: i64,
    cancel: i64,
    mispredict: bool,
    discard: bool,
}

impl ElemRes {
    fn any(&self) -> bool {
        self.commit != 0 || self.cancel != 0 || self.mispredict || self.discard
    }
}

/// 16-entry return stack (OpenCSD `TrcAddrReturnStack`).
#[derive(Debug, Clone, Default)]
struct RetStack {
    active: bool,
    pop_pending: bool,
    tinfo_wait_addr: bool,
    head: usize,
    entries: i32,
    stack: [(u64, Isa); 16],
}

impl RetStack {
    fn push(&mut self, addr: u64, isa: Isa) {
        if self.active && !self.tinfo_wait_addr {
            self.head = (self.head + 1) & 15;
            self.stack[self.head] = (addr, isa);
            if self.entries < 16 {
                self.entries += 1;
            }
            // as OpenCSD's push: a new entry supersedes a pending pop
            self.pop_pending = false;
        }
    }
    /// Pops the top entry and consumes the pending pop (OpenCSD's `pop` clears it too: one
    /// compressed return pops exactly once, not again at every following atom).
    fn pop(&mut self) -> (u64, Isa) {
        let mut r = (u64::MAX, Isa::A64);
        if self.active {
            if self.entries > 0 {
                r = self.stack[self.head];
                self.entries -= 1;
                self.head = (self.head + 15) & 15;
            } else {
                self.entries = -1;
            }
            self.pop_pending = false;
        }
        r
    }
    /// Pushes the return addresses of a run's ranges that ended in a taken branch with link
    /// (bit `i` of `links`: range `i`, whose end `end(i)` gives), oldest first.
    #[inline(always)]
    fn push_links(&mut self, mut links: u8, end: impl Fn(usize) -> Option<u64>) {
        while links != 0 {
            let i = links.trailing_zeros() as usize;
            links &= links - 1;
            if let Some(e) = end(i) {
                self.push(e, Isa::A64);
            }
        }
    }
    /// The return-stack operations of a run that pops ([`Run::pops`]) summed up (its
    /// `effect`, which [`admits`](Self::admits) it here): its pops of entries from before it,
    /// then the pushes it keeps. False (nothing done) where they are not enough: it keeps more
    /// than [`cache::KEPT_MAX`], or its pushes would not fit without dropping an entry (then
    /// [`run_ops`](Self::run_ops)).
    #[inline(always)]
    fn take_summed(&mut self, effect: &StackEffect) -> bool {
        if usize::from(effect.kept) > cache::KEPT_MAX || self.entries + i32::from(effect.peak) > 16 {
            return false;
        }
        // (the stack is live: `admits`)
        self.pop_pending = false;
        if effect.same {
            return true;
        }
        let mut head = (self.head + 16 - usize::from(effect.popped)) & 15;
        for &a in &effect.pushes[..usize::from(effect.kept)] {
            head = (head + 1) & 15;
            self.stack[head] = (a, Isa::A64);
        }
        self.head = head;
        self.entries += i32::from(effect.kept) - i32::from(effect.popped);
        true
    }
    /// The return-stack operations of a run that pops, one at a time: range by range, the
    /// push of its end (`end(i)`) if it ended in a taken branch with link, then the pop of a
    /// compressed return after it. (Where [`take_summed`](Self::take_summed) is not enough.)
    #[inline(never)]
    fn run_ops(&mut self, run: &Run, end: impl Fn(usize) -> Option<u64>) {
        let (links, pops) = (run.links, run.pops);
        let mut ops = links | pops;
        while ops != 0 {
            let i = ops.trailing_zeros() as usize;
            ops &= ops - 1;
            if links & (1 << i) != 0
                && let Some(e) = end(i)
            {
                self.push(e, Isa::A64);
            }
            if pops & (1 << i) != 0 {
                let _popped = self.pop();
                debug_assert_eq!(_popped.1, Isa::A64);
            }
        }
    }
    /// The entry `i` below the top, if the stack holds it and it is A64: its address.
    #[inline]
    fn entry_a64(&self, i: usize) -> Option<u64> {
        let e = self.entry(i);
        (i < self.entries.max(0) as usize && e.1 == Isa::A64).then_some(e.0)
    }
    /// The ring's entry `i` below the top, whether the stack holds it or not.
    #[inline(always)]
    fn entry(&self, i: usize) -> (u64, Isa) {
        self.stack[(self.head + 16 - i) & 15]
    }
    /// Whether a run's pushes and pops happen as [`cached_run`] follows them: the stack on
    /// and not waiting for the address after a trace info.
    #[inline]
    fn live(&self) -> bool {
        self.active && !self.tinfo_wait_addr
    }
    /// What a run built now may pop ([`cached_run`]): with `outer`, the entries pushed
    /// before it too; without, only those it pushes itself (a run built again where the
    /// stored one did not hold: a run reached with different return addresses below it is
    /// then stored once without them, not again each time).
    #[inline]
    fn run_pops(&self, outer: bool) -> RunPops {
        let mut top = [cache::NO_TOP; cache::OUTER_MAX];
        if outer {
            for (i, t) in top.iter_mut().enumerate() {
                *t = self.entry_a64(i).unwrap_or(cache::NO_TOP);
            }
        }
        RunPops { on: self.live(), top }
    }
    /// Whether a stored run that pops (`effect`) holds here: the stack is live and its
    /// entries from before the run are those the run's pops took.
    #[inline(always)]
    fn admits(&self, effect: &StackEffect) -> bool {
        let p = i32::from(effect.popped);
        self.live()
            && self.entries >= p
            && (p < 1 || self.entry(0) == (effect.outer[0], Isa::A64))
            && (p < 2 || self.entry(1) == (effect.outer[1], Isa::A64))
    }
    /// The pending pop, if the top entry is there and A64 (what
    /// [`Decoder::return_stack_pop`] then does, without its error case): its address.
    #[inline(always)]
    fn pop_pending_a64(&mut self) -> Option<u64> {
        if self.pop_pending && self.entries > 0 && self.stack[self.head].1 == Isa::A64 {
            return Some(self.pop().0);
        }
        None
    }
    fn flush(&mut self) {
        self.head = 15;
        self.entries = 0;
        self.pop_pending = false;
    }
    fn overflow(&self) -> bool {
        self.entries < 0
    }
    /// An address from the trace applies (an address entry committed): the target is the
    /// address packet's, so a pending pop is not made, and the wait for an address after a
    /// trace info ends.
    #[inline(always)]
    fn address_applied(&mut self) {
        self.pop_pending = false;
        self.tinfo_wait_addr = false;
    }
    fn set_pop_pending(&mut self) {
        if self.active {
            self.pop_pending = true;
        }
    }
}

#[derive(Debug)]
struct DecodeErr;

/// The decoder for one trace source.
pub struct Decoder {
    cfg: DecoderConfig,
    state: State,
    unsync: UnsyncReason,
    p0: VecDeque<P0>,
    /// A target address packet that [`address`](Self::address)'s fast path took with the P0
    /// stack empty (address, instruction set, packet index), not applied yet: logically the
    /// stack's one entry, kept out of the deque for the atom packet that usually follows
    /// ([`atoms_now`](Self::atoms_now) applies it). Only set while `p0` is empty; `run` and
    /// `finish` first put it onto the stack ([`spill_addr`](Self::spill_addr)). Plain fields
    /// and a flag rather than an `Option`: the atom path then reads two and clears one byte.
    next_addr: NextAddr,
    res: ElemRes,
    need_ctxt: bool,
    need_addr: bool,
    elem_pending_addr: bool,
    prev_overflow: bool,
    /// Cached [`quiet`](Self::quiet) (see [`settled`](Self::settled)): only `run` and
    /// `reset_decoder` change what it depends on, and both clear it.
    settled: bool,
    is_secure: bool,
    is_64bit: bool,
    last_is: u8,
    spec_depth: i64,
    ete_first_ts_marker: bool,
    walk: WalkState,
    ret: RetStack,
    ctx: PeContext,
    /// Elements other than ranges not yet handed over, each with the length of `ranges` when
    /// it was added (the ranges before it in trace order) ...
    out: Vec<Element>,
    out_at: Vec<u32>,
    /// ... and the ranges (see [`ElementSink::ranges`]).
    ranges: Vec<Range>,
    /// `ranges[..held]` are those of atom packets entered through [`atoms`](Self::atoms)
    /// whose hand-over waits for the packets that follow (see [`flush_held`](Self::flush_held)):
    /// complete, so an error in a later packet does not discard them.
    held: usize,
    cur_index: u64,
    cache: SharedBlockCache,
    /// The part of the cache tag that depends on the instruction-classification options.
    cfg_tag: u64,
    /// `tag` must be recomputed (context or space changed) ...
    tag_dirty: bool,
    /// ... or the memory's generation moved on from this one.
    tag_gen: u64,
    /// memory space for code reads and the cache tag derived from it (see `refresh_space`)
    space: MemSpace,
    tag: u64,
    /// The context sees no code ([`MemoryAccess::has_code`]), as of `tag`.
    no_code: bool,
    scratch: Vec<P0>,
    /// Where [`cached_packets`](Self::cached_packets) and [`cached_atoms`](Self::cached_atoms)
    /// build a run.
    run_scratch: RunScratch,
    /// Taken branches not handed over yet (for a sink that takes branches).
    branches: Branches,
    /// ETE source-address ranges are split at the waypoints they pass (OpenCSD -src_addr_n)
    src_addr_n: bool,
    /// report timestamps before the first ETE timestamp marker too (`set_unmarked_timestamps`)
    unmarked_ts: bool,
    stopped: bool,
    stats: DecodeStats,
}

impl Decoder {
    /// A decoder in the "not synchronised" state, with a block cache of its own.
    pub fn new(cfg: DecoderConfig) -> Self {
        Self::with_cache(cfg, cache::shared(cache::DEFAULT_BITS))
    }

    /// A decoder using `cache`, shared with the other decoders of the same code image (see
    /// [`crate::cache`]); the cache's counters are then those of all its decoders.
    pub fn with_cache(cfg: DecoderConfig, cache: SharedBlockCache) -> Self {
        let mut d = Decoder {
            cfg,
            state: State::NoSync,
            unsync: UnsyncReason::InitDecoder,
            p0: VecDeque::with_capacity(64),
            next_addr: NextAddr::default(),
            res: ElemRes::default(),
            need_ctxt: true,
            need_addr: true,
            elem_pending_addr: false,
            prev_overflow: false,
            settled: false,
            is_secure: true,
            is_64bit: false,
            last_is: 0,
            spec_depth: 0,
            ete_first_ts_marker: false,
            walk: WalkState::default(),
            ret: RetStack { active: cfg.ret_stack, ..Default::default() },
            ctx: PeContext::default(),
            out: Vec::with_capacity(64),
            out_at: Vec::with_capacity(64),
            ranges: Vec::with_capacity(256),
            held: 0,
            cur_index: 0,
            cache,
            cfg_tag: 0,
            tag_dirty: true,
            tag_gen: 0,
            space: MemSpace::S,
            tag: MemSpace::S.0 as u64,
            no_code: false,
            scratch: Vec::new(),
            run_scratch: RunScratch::default(),
            branches: Branches::default(),
            src_addr_n: false,
            unmarked_ts: false,
            stopped: false,
            stats: DecodeStats::default(),
        };
        d.ret.flush();
        d.cfg_tag = d.options_tag();
        d.refresh_space();
        d
    }

    /// Bits 40..=61 of the cache tag: the options that decide where blocks end (the context
    /// ID takes bits 8..40, the memory space bits 0..8, bit 62 marks runs through compressed
    /// returns, `cache::THROUGH_RETURNS`, and bit 63 valid entries).
    fn options_tag(&self) -> u64 {
        let i = self.cfg.insn;
        let o = self.cfg.opts;
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in format!("{:?}{}{}{:?}", i.arch, i.wfi_wfe_branch, i.dsb_dmb_waypoints, o).bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
        (h & 0x3f_ffff) << 40
    }

    /// The configuration.
    pub fn config(&self) -> &DecoderConfig {
        &self.cfg
    }

    /// Counters so far.
    pub fn stats(&self) -> DecodeStats {
        let mut s = self.stats;
        s.cache_hits = self.cache.hits();
        s.cache_misses = self.cache.misses();
        s
    }

    /// Splits ETE source-address ranges at the waypoints they pass, reporting those as not
    /// taken (OpenCSD `ETE_OPFLG_PKTDEC_SRCADDR_N_ATOMS`, `trc_pkt_lister -src_addr_n`).
    pub fn set_src_addr_n(&mut self, on: bool) {
        self.src_addr_n = on;
    }

    /// Sets the optional OpenCSD checks ([`DecodeOptions`]); blocks checked under other
    /// options are not used (they are tagged with the options).
    pub fn set_options(&mut self, opts: DecodeOptions) {
        if opts != self.cfg.opts {
            self.cfg.opts = opts;
            self.cfg_tag = self.options_tag();
            self.refresh_space();
        }
    }

    /// Reports every timestamp as a `Timestamp` element, also before the first ETE timestamp
    /// marker (OpenCSD, and so the default, drops those when TRCIDR0.TSMARK is set). For
    /// consumers that date trace windows by their leading timestamp.
    pub fn set_unmarked_timestamps(&mut self, on: bool) {
        self.unmarked_ts = on;
    }

    /// Where execution continues after the last instruction range emitted so far, as far as
    /// the trace received up to now tells, including packets not yet committed (at the end of
    /// the data, an address packet stays on the P0 stack until the next atom): the current
    /// address if known (a direct branch's target, an applied address), else the first
    /// uncommitted address packet ahead of any P0 element, else, for a return compressed by
    /// the return stack, the top of the return stack. `None` if unknown (an indirect branch
    /// whose address packet has not arrived) or not synchronised. The target of a window's
    /// last taken branch: perf's rules only complete a branch when the next range starts.
    pub fn pending_target(&self) -> Option<u64> {
        if self.state != State::Decode || self.need_ctxt {
            return None;
        }
        if !self.need_addr {
            return Some(self.walk.addr);
        }
        if self.next_addr.set {
            return Some(self.next_addr.addr); // (the P0 stack is empty)
        }
        for e in &self.p0 {
            match e.kind {
                P0Kind::Addr { addr, .. } => return Some(addr),
                _ if e.is_p0 => return None,
                _ => {}
            }
        }
        if self.ret.active && self.ret.pop_pending && self.ret.entries > 0 {
            return Some(self.ret.stack[self.ret.head].0);
        }
        None
    }

    /// Forgets cached code blocks (call when the code image changes).
    pub fn invalidate_cache(&mut self) {
        self.cache.clear();
    }

    /// Resets to the unsynchronised state (e.g. at a trace-buffer boundary or FSYNC barrier);
    /// ranges held back by [`atoms`](Self::atoms) stay to be handed over first (call
    /// [`flush_held`](Self::flush_held) before, to have them now).
    pub fn reset(&mut self) {
        self.unsync = UnsyncReason::ResetDecoder;
        self.reset_decoder();
    }

    fn reset_decoder(&mut self) {
        self.settled = false;
        self.state = State::NoSync;
        self.is_secure = true;
        self.is_64bit = false;
        self.spec_depth = 0;
        self.need_ctxt = true;
        self.need_addr = true;
        self.elem_pending_addr = false;
        self.prev_overflow = false;
        self.p0.clear();
        self.next_addr.set = false;
        self.discard_out();
        self.res = ElemRes::default();
        self.ete_first_ts_marker = false;
        self.refresh_space();
    }

    /// Drops buffered (unsent) elements, as OpenCSD does when an error resets the decoder.
    fn discard_out(&mut self) {
        for e in &self.out {
            if let ElementKind::AddrNacc { .. } = e.kind {
                self.stats.nacc -= 1
            }
        }
        for r in &self.ranges[self.held..] {
            self.stats.ranges -= 1;
            self.stats.instructions -= r.range.num_instr as u64;
        }
        // (likewise the taken branches of its runs from the run cache)
        if let Some(m) = self.branches.mark.take() {
            let b = &mut self.branches;
            let added = b.ranges - m.ranges;
            (b.len, b.chain, b.ranges, b.last_index) = (m.len, m.chain, m.ranges, m.last_index);
            self.stats.ranges -= added;
            self.stats.instructions -= m.instructions;
            self.stats.elements = self.stats.elements.wrapping_sub(added);
        }
        // (the held ranges precede what this packet added: no other element is among them)
        self.out.clear();
        self.out_at.clear();
        self.ranges.truncate(self.held);
    }

    #[inline]
    fn clear_out(&mut self) {
        self.out.clear();
        self.out_at.clear();
        self.ranges.clear();
        self.held = 0;
    }

    /// Hands over the ranges that [`atoms`](Self::atoms) held back, if any: call at the end
    /// of the data pushed (before reading what the sink received) and before [`reset`](Self::reset).
    #[inline]
    pub fn flush_held<S: ElementSink + ?Sized>(&mut self, sink: &mut S) -> ControlFlow<()> {
        if self.ranges.is_empty() && self.branches.ranges == 0 {
            return ControlFlow::Continue(());
        }
        self.stopped = false;
        self.flush(sink);
        // (the taken branches, for a sink that takes them, wait for the end of the data)
        if !self.stopped && self.branches.hand_over(self.cfg.trace_id, sink).is_break() {
            self.stopped = true;
        }
        self.sink_answer()
    }

    #[inline]
    fn has_out(&self) -> bool {
        !self.out.is_empty() || !self.ranges.is_empty()
    }

    /// Processes one packet that started at trace index `index`.
    /// Returns `Break` if the sink asked to stop.
    pub fn packet<M: MemoryAccess + ?Sized, S: ElementSink + ?Sized>(
        &mut self,
        index: u64,
        pkt: &Packet,
        mem: &M,
        sink: &mut S,
    ) -> ControlFlow<()> {
        if let Packet::Address { addr, context: None, source: false } = *pkt {
            return self.address(index, addr, mem, sink);
        }
        self.begin_packet(index);
        self.run(index, pkt, mem, sink)
    }

    /// Processes a target address packet without context (`Packet::Address { addr, context:
    /// None, source: false }`, see [`packet`](Self::packet)): the entry for the parser's
    /// address fast path ([`crate::packet::PacketSink::address`]).
    #[inline]
    pub fn address<M: MemoryAccess + ?Sized, S: ElementSink + ?Sized>(
        &mut self,
        index: u64,
        addr: Address,
        mem: &M,
        sink: &mut S,
    ) -> ControlFlow<()> {
        self.begin_packet(index);
        // the common case (the target of an indirect branch, nothing speculative or
        // pending): what `decode_packet` does with it, without the state machine
        if self.settled() && self.p0.is_empty() && !self.next_addr.set && !self.elem_pending_addr {
            // `push_addr`, into the field of its own
            self.last_is = addr.is;
            self.next_addr = NextAddr { set: true, is: addr.is, addr: addr.addr, index };
            return ControlFlow::Continue(());
        }
        self.run(index, &Packet::Address { addr, context: None, source: false }, mem, sink)
    }

    /// In sync, with nothing speculative or being resolved (TRCIDR8.MAXSPEC == 0): a packet
    /// may be applied at once.
    #[inline]
    fn quiet(&self) -> bool {
        self.state == State::Decode && self.cfg.max_spec_depth == 0 && self.spec_depth == 0 && !self.res.any()
    }

    /// [`quiet`](Self::quiet), from the cached flag when it is set (outside `run`, where
    /// nothing it depends on changes).
    #[inline]
    fn settled(&mut self) -> bool {
        if !self.settled {
            self.settled = self.quiet();
        }
        self.settled
    }

    #[inline]
    fn begin_packet(&mut self, index: u64) {
        self.cur_index = index;
        self.stats.packets += 1;
        self.stopped = false;
    }

    /// Processes an atom packet (`Packet::Atom { format, atoms }`, see [`packet`](Self::packet)):
    /// the entry for the parser's atom fast path ([`crate::packet::PacketSink::atoms`]), with
    /// no `Packet` to build or match. Ranges that are all a packet produced may be held back
    /// to go to the sink in one run with those of the packets that follow: the next packet
    /// that produces another element, or [`flush_held`](Self::flush_held), hands them over.
    #[inline]
    pub fn atoms<M: MemoryAccess + ?Sized, S: ElementSink + ?Sized>(
        &mut self,
        index: u64,
        format: u8,
        atoms: Atoms,
        mem: &M,
        sink: &mut S,
    ) -> ControlFlow<()> {
        self.begin_packet(index);
        if self.settled() && self.atoms_now() {
            return self.atoms_from(atoms.bits, atoms.count, index, format, atoms, mem, sink);
        }
        // not committed at once
        self.run(index, &Packet::Atom { format, atoms }, mem, sink)
    }

    /// Processes the packets that lead `data` (`data[0]` has trace index `index`) as
    /// [`crate::packet::PacketSink::atom_run`] describes (single-byte atom packets and target
    /// address packets, taken through `look`), as many calls of [`atoms`](Self::atoms) and
    /// [`address`](Self::address) would: the entry for the parser's run of packets. Returns
    /// the bytes taken, up to the first packet of another kind unless the sink asked to stop
    /// (then `Break`, after the packet where it did).
    ///
    /// While the decoder is settled, the P0 stack empty and the address known, atom packets
    /// are applied from the run cache and address packets taken in one loop
    /// ([`cached_packets`](Self::cached_packets)) with the decoder's state in locals; a packet
    /// any of whose runs is not stored, or any other case, goes the way of `atoms` or
    /// `address`.
    #[inline]
    pub fn atom_run<M: MemoryAccess + ?Sized, S: ElementSink + ?Sized>(
        &mut self,
        index: ChunkIndex,
        data: &[u8],
        look: &mut Lookahead<'_>,
        mem: &M,
        sink: &mut S,
    ) -> (usize, ControlFlow<()>) {
        let mut i = 0;
        while let Some(&b) = data.get(i) {
            let (format, atoms) = look.atoms(b);
            if format == 0 {
                let Some((addr, n)) = look.target_address(data, i) else { break };
                let r = self.address(index.at(i), addr, mem, sink);
                i += n;
                if r.is_break() {
                    return (i, r);
                }
                continue;
            }
            if self.settled() && self.p0.is_empty() && self.out.is_empty() && !self.elem_pending_addr {
                if self.next_addr.set {
                    self.atoms_now();
                }
                if (self.need_ctxt || self.need_addr) && !self.ret.pop_pending {
                    // no address to go from (after code not accessible, say): the packet's
                    // atoms are dropped, as `atoms` would drop them (`run_atoms`)
                    self.begin_packet(index.at(i));
                    i += 1;
                    if self.hold_or_flush(sink).is_break() {
                        return (i, ControlFlow::Break(()));
                    }
                    continue;
                }
                // (`no_code` as of the last tag: a context without code takes the general path)
                if !(self.need_ctxt || self.need_addr || self.ret.pop_pending || self.no_code) && self.walk.isa == Isa::A64 {
                    let r;
                    (i, r) = self.cached_packets(index, data, i, look, mem, sink);
                    if r.is_break() {
                        return (i, r);
                    }
                    continue;
                }
            }
            let r = self.atoms(index.at(i), format, atoms, mem, sink);
            i += 1;
            if r.is_break() {
                return (i, r);
            }
        }
        (i, ControlFlow::Continue(()))
    }

    /// The loop of [`atom_run`](Self::atom_run) from `data[i]`, an atom packet, the decoder
    /// settled with the P0 stack and the output empty, no address element pending, an A64
    /// address known and no return-stack pop pending: atom packets whose runs are all in the
    /// run cache, and the target address packets between them (what
    /// [`address`](Self::address)'s fast path and [`atoms_now`](Self::atoms_now) do with
    /// them), with the address, the pending target and the counts in locals. Returns the
    /// position of the first packet not taken, at least `i + 1`: a packet with a run not stored
    /// is finished by [`atoms_from`](Self::atoms_from). `Break` if the sink asked to stop,
    /// after the packet whose ranges it was given (`i` itself when it stopped at the ranges
    /// buffered before the loop).
    #[inline]
    fn cached_packets<M: MemoryAccess + ?Sized, S: ElementSink + ?Sized>(
        &mut self,
        index: ChunkIndex,
        data: &[u8],
        i: usize,
        look: &mut Lookahead<'_>,
        mem: &M,
        sink: &mut S,
    ) -> (usize, ControlFlow<()>) {
        // (a loop of its own for a sink that takes branches, out of line: the other is
        // inlined into the parser's loop as it was)
        if sink.takes_branches() {
            self.cached_branches(index, data, i, look, mem, sink)
        } else {
            self.cached_loop::<false, M, S>(index, data, i, look, mem, sink)
        }
    }

    /// [`cached_packets`](Self::cached_packets) for a sink that takes branches.
    #[inline(never)]
    fn cached_branches<M: MemoryAccess + ?Sized, S: ElementSink + ?Sized>(
        &mut self,
        index: ChunkIndex,
        data: &[u8],
        i: usize,
        look: &mut Lookahead<'_>,
        mem: &M,
        sink: &mut S,
    ) -> (usize, ControlFlow<()>) {
        self.cache.rule_runs();
        self.cached_loop::<true, M, S>(index, data, i, look, mem, sink)
    }

    /// A stored run (`slot` of `cache`) from `start` in the packet at trace index `index`, for
    /// a sink that takes branches: its records from the run cache ([`Branches::stored`]), and
    /// its calls' return addresses pushed (its ranges are read only for those).
    #[inline(always)]
    fn stored_branches(&mut self, cache: &cache::BlockCache, slot: &RunSlot, start: u64, index: u64) {
        let run = slot.run();
        self.branches.stored(slot, &cache.run_inner(slot), run.count, start, index);
        // (a run that pops made its return-stack operations when it was taken: `take_stack`)
        if run.pops == 0 && run.links != 0 {
            let rs = cache.run_ranges(slot);
            self.ret.push_links(run.links, |j| rs.get(j).map(|r| r.end));
        }
    }

    /// A target address packet taken in [`cached_packets`](Self::cached_packets)' loop applies
    /// at the atom packet after it, as [`atoms_now`](Self::atoms_now) applies `next_addr`: the
    /// return stack's pending pop and its wait for an address after a trace info end. False
    /// (nothing done) if the address is not A64 code's (`is`: its packet's IS).
    #[inline(always)]
    fn take_target(&mut self, is: u8) -> bool {
        if self.calc_isa(is) != Isa::A64 {
            return false;
        }
        self.ret.address_applied();
        true
    }

    /// Whether the run stored in `slot` holds here, for a sink that takes branches: it does
    /// not pop, or its pops take the entries the return stack has ([`RetStack::admits`]), in
    /// which case its return-stack operations are made now (before
    /// [`stored_branches`](Self::stored_branches)).
    #[inline(always)]
    fn take_stack(&mut self, cache: &cache::BlockCache, slot: &RunSlot) -> bool {
        let run = slot.run();
        if run.pops == 0 {
            return true;
        }
        let effect = cache.run_effect(slot);
        if !self.ret.admits(&effect) {
            return false;
        }
        if !self.ret.take_summed(&effect) {
            let rs = cache.run_ranges(slot);
            self.ret.run_ops(&run, |j| rs.get(j).map(|r| r.end));
        }
        true
    }

    /// [`cached_packets`](Self::cached_packets) for a sink that takes branches or not
    /// (`TAKES_BRANCHES`, [`ElementSink::takes_branches`]).
    #[inline]
    fn cached_loop<const TAKES_BRANCHES: bool, M: MemoryAccess + ?Sized, S: ElementSink + ?Sized>(
        &mut self,
        index: ChunkIndex,
        data: &[u8],
        i: usize,
        look: &mut Lookahead<'_>,
        mem: &M,
        sink: &mut S,
    ) -> (usize, ControlFlow<()>) {
        let tag = self.cache_tag(mem);
        // for a sink that takes branches, runs go on through compressed returns: stored apart
        let run_tag = if TAKES_BRANCHES { tag | cache::THROUGH_RETURNS } else { tag };
        // a packet that is one stored run goes to the sink from the run cache: its taken
        // branches, or its ranges
        let direct = TAKES_BRANCHES || sink.takes_packet_ranges();
        if direct && !self.ranges.is_empty() && self.flush_out_of_line(sink).is_break() {
            // what is buffered goes first; the sink asked to stop there
            self.stopped = false;
            return (i, ControlFlow::Break(()));
        }
        let id = self.cfg.trace_id;
        // (a handle of its own: the loop changes `self`)
        let cache = self.cache.clone();
        let cache = &*cache;
        let slots = cache.run_slots();
        let mut addr = self.walk.addr;
        // an indirect branch was taken: the next atom needs an address (or the return stack)
        let mut need_addr = false;
        // a target address packet taken, not applied yet (`next_addr`): address, IS, index
        let mut pending: Option<(u64, u8, u64)> = None;
        // ranges (those not handed over directly: `buffered`), instructions, packets
        let (mut ranges, mut buffered, mut instructions, mut packets) = (0u64, 0u64, 0u64, 0u64);
        let mut at = index.cursor(i);
        let mut last = at.index;
        let mut stop = false;
        while let Some(&b) = data.get(at.pos) {
            let (format, atoms) = look.atoms(b);
            let pkt_index = at.index;
            if format == 0 {
                // `address`'s fast path (two in a row: the general path)
                if pending.is_some() {
                    break;
                }
                let Some((a, n)) = look.target_address(data, at.pos) else { break };
                self.last_is = a.is;
                pending = Some((a.addr, a.is, pkt_index));
                packets += 1;
                last = pkt_index;
                at.advance(n);
                continue;
            }
            if let Some((a, is, _)) = pending {
                if !self.take_target(is) {
                    break;
                }
                pending = None;
                addr = a;
                need_addr = false;
            }
            // (a pop is pending only after a taken indirect branch: entered without one, the
            // loop sets it only with `need_addr`)
            debug_assert!(need_addr || !self.ret.pop_pending);
            if need_addr {
                // a compressed return (`return_stack_pop` at the packet's first atom)
                match self.ret.pop_pending_a64() {
                    Some(a) => {
                        addr = a;
                        need_addr = false;
                    }
                    None => break,
                }
            }
            // the common packet first, for a sink taking a packet's ranges from the run cache:
            // one stored run for all the packet's atoms
            if direct
                && let Some(mut slot) = cache::BlockCache::find_in(slots, addr, run_tag, look.run_key(b))
                && slot.run().count == atoms.count
                && (!TAKES_BRANCHES || self.take_stack(cache, slot))
            {
                // and the packets after it as long as they are such packets
                let (mut format, mut atoms, mut pkt_index) = (format, atoms, pkt_index);
                loop {
                    let run = slot.run();
                    if TAKES_BRANCHES {
                        stop |= self.branches.room(id, sink).is_break();
                        self.stored_branches(cache, slot, addr, pkt_index);
                    } else {
                        let rs = cache.run_ranges(slot);
                        stop |= sink.packet_ranges(id, pkt_index, &rs).is_break();
                        self.ret.push_links(run.links, |j| rs.get(j).map(|r| r.end));
                    }
                    addr = run.next;
                    ranges += run.count as u64;
                    instructions += run.instructions as u64;
                    packets += 1;
                    last = pkt_index;
                    at.advance(1);
                    if stop {
                        self.end_cached(ranges, ranges - buffered, instructions, packets - 1, addr, need_addr, pending);
                        let _ = self.packet_rest(self.ranges.len(), pkt_index, 0, 0, format, atoms, mem, sink);
                        return (at.pos, ControlFlow::Break(()));
                    }
                    let b = if run.indirect {
                        self.ret.set_pop_pending();
                        need_addr = true;
                        if !TAKES_BRANCHES {
                            break;
                        }
                        // for a sink that takes branches, the target address packet after it
                        // and the atom packet after that on this path too, as the loop's head
                        // takes them
                        let Some(&b) = data.get(at.pos) else { break };
                        if look.atoms(b).0 != 0 {
                            break;
                        }
                        let Some((a, n)) = look.target_address(data, at.pos) else { break };
                        self.last_is = a.is;
                        pending = Some((a.addr, a.is, at.index));
                        packets += 1;
                        last = at.index;
                        at.advance(n);
                        let Some(&b) = data.get(at.pos) else { break };
                        (format, atoms) = look.atoms(b);
                        if format == 0 || !self.take_target(a.is) {
                            break;
                        }
                        pending = None;
                        addr = a.addr;
                        need_addr = false;
                        b
                    } else {
                        let Some(&b) = data.get(at.pos) else { break };
                        (format, atoms) = look.atoms(b);
                        if format == 0 {
                            break;
                        }
                        b
                    };
                    match cache::BlockCache::find_in(slots, addr, run_tag, look.run_key(b)) {
                        Some(s) if s.run().count == atoms.count && (!TAKES_BRANCHES || self.take_stack(cache, s)) => slot = s,
                        _ => break,
                    }
                    pkt_index = at.index;
                }
                continue;
            }
            let (mut bits, n) = (atoms.bits, atoms.count);
            let mut k = 0;
            let r0 = self.ranges.len();
            let instructions0 = instructions;
            if TAKES_BRANCHES {
                // the packet's runs' records go in as they come; an error later in the packet
                // (`packet_rest`) takes them back (`discard_out`)
                stop |= self.branches.room(id, sink).is_break();
                self.branches.set_mark();
            }
            while k < n {
                // (`bits` holds only the atoms left)
                let (m, key) = if n - k <= RUN_MAX as u8 { (n - k, bits) } else { (RUN_MAX as u8, bits & ((1 << RUN_MAX) - 1)) };
                // a run not stored yet whose blocks are all cached is stored here (for a sink
                // that takes branches, also one stored that pops entries not on the stack now:
                // built again without popping entries from before it)
                let slot = if TAKES_BRANCHES {
                    match cache.find_run(addr, run_tag, key, m) {
                        Some(s) if self.take_stack(cache, s) => Some(s),
                        found => {
                            self.run_scratch.pops = self.ret.run_pops(found.is_none());
                            let built = store_cached_run::<true>(cache, &mut self.run_scratch, addr, tag, key, m);
                            // (built from the stack as it is: it holds)
                            built.filter(|s| self.take_stack(cache, s))
                        }
                    }
                } else {
                    cache
                        .find_run(addr, tag, key, m)
                        .or_else(|| store_cached_run::<false>(cache, &mut self.run_scratch, addr, tag, key, m))
                };
                let Some(slot) = slot else {
                    break;
                };
                let run = slot.run();
                let c = run.count as usize;
                if TAKES_BRANCHES {
                    self.stored_branches(cache, slot, addr, pkt_index);
                } else {
                    let rs = cache.run_ranges(slot);
                    let rs = &rs[..];
                    if direct && k == 0 && run.count == n {
                        // the whole packet (no error can discard it)
                        stop |= sink.packet_ranges(id, pkt_index, rs).is_break();
                    } else {
                        self.ranges.extend(rs.iter().map(|&range| Range { index: pkt_index, range }));
                        buffered += c as u64;
                    }
                    self.ret.push_links(run.links, |j| rs.get(j).map(|r| r.end));
                }
                addr = run.next;
                ranges += c as u64;
                instructions += run.instructions as u64;
                bits >>= run.count;
                k += run.count;
                if run.indirect {
                    self.ret.set_pop_pending();
                    // atoms left after a compressed return: `run_atoms` pops before the next
                    if k < n
                        && let Some(a) = self.ret.pop_pending_a64()
                    {
                        addr = a;
                        continue;
                    }
                    need_addr = true;
                    break;
                }
            }
            packets += 1;
            last = pkt_index;
            at.advance(1);
            if k < n || stop {
                // atoms left (a run not in the cache, or after a taken indirect branch the
                // address or the return stack is needed): the general path
                self.end_cached(ranges, ranges - buffered, instructions, packets - 1, addr, need_addr, pending);
                if let Some(m) = &mut self.branches.mark {
                    m.instructions = instructions - instructions0;
                }
                let r = self.packet_rest(r0, pkt_index, bits, n - k, format, atoms, mem, sink);
                self.branches.mark = None;
                return (at.pos, if stop { ControlFlow::Break(()) } else { r });
            }
            if TAKES_BRANCHES {
                self.branches.mark = None;
            }
            if self.ranges.len() >= if direct { 1 } else { HOLD_MAX } && self.flush_out_of_line(sink).is_break() {
                // (all handed over)
                self.end_cached(ranges, ranges - buffered, instructions, packets, addr, need_addr, pending);
                self.cur_index = last;
                self.stopped = false;
                self.held = 0;
                return (at.pos, ControlFlow::Break(()));
            }
        }
        self.end_cached(ranges, ranges - buffered, instructions, packets, addr, need_addr, pending);
        self.cur_index = last;
        self.stopped = false;
        self.held = self.ranges.len();
        (at.pos, ControlFlow::Continue(()))
    }

    /// The bookkeeping of [`cached_packets`](Self::cached_packets)'s packets added up: the
    /// address, whether an address is needed, the target address packet not applied yet,
    /// the counts (of `packets` packets, `ranges` ranges, `handed` of them handed over
    /// directly), as [`apply_run`](Self::apply_run), [`address`](Self::address) and
    /// [`begin_packet`](Self::begin_packet) do for each.
    #[inline]
    #[allow(clippy::too_many_arguments)]
    fn end_cached(
        &mut self,
        ranges: u64,
        handed: u64,
        instructions: u64,
        packets: u64,
        addr: u64,
        need_addr: bool,
        pending: Option<(u64, u8, u64)>,
    ) {
        self.walk.addr = addr;
        if ranges != 0 {
            self.walk.it.remaining = 0;
        }
        self.need_addr = need_addr;
        if let Some((addr, is, index)) = pending {
            self.next_addr = NextAddr { set: true, is, addr, index };
        }
        self.cache.count_hits(ranges);
        self.stats.ranges += ranges;
        self.stats.instructions += instructions;
        // (`flush` counts what it hands over)
        self.stats.elements = self.stats.elements.wrapping_add(handed);
        self.stats.packets += packets;
    }

    /// What the sink answered to the output handed over since the entry point began
    /// (`stopped`, which [`flush`](Self::flush) records).
    #[inline]
    fn sink_answer(&self) -> ControlFlow<()> {
        if self.stopped { ControlFlow::Break(()) } else { ControlFlow::Continue(()) }
    }

    /// [`flush`](Self::flush) at a packet's end (see [`begin_packet`](Self::begin_packet)),
    /// out of line: for the atom-run loop, whose registers are for its hits.
    #[inline(never)]
    fn flush_out_of_line<S: ElementSink + ?Sized>(&mut self, sink: &mut S) -> ControlFlow<()> {
        self.stopped = false;
        self.flush(sink);
        self.sink_answer()
    }

    /// The end of packet `index` (`format`, `atoms`) that
    /// [`cached_packets`](Self::cached_packets) leaves: its ranges from `ranges[r0]` on, the
    /// `n` atoms `bits` left (if any) through [`atoms_from`](Self::atoms_from). Out of line:
    /// the loop's registers are for its hits.
    #[inline(never)]
    #[allow(clippy::too_many_arguments)]
    fn packet_rest<M: MemoryAccess + ?Sized, S: ElementSink + ?Sized>(
        &mut self,
        r0: usize,
        index: u64,
        bits: u32,
        n: u8,
        format: u8,
        atoms: Atoms,
        mem: &M,
        sink: &mut S,
    ) -> ControlFlow<()> {
        // this packet's ranges so far are its own (an error discards them)
        self.held = r0;
        self.begin_packet(index);
        if n > 0 {
            let (m, key) = if n <= RUN_MAX as u8 { (n, bits) } else { (RUN_MAX as u8, bits & ((1 << RUN_MAX) - 1)) };
            if let Some((start, b, c, run)) = self.run_scratch.cut.take()
                && (start, b, c) == (self.walk.addr, key, m)
                && run.count > 0
            {
                // the loop left the packet at this run, cut by a block not cached: what
                // `run_atoms` does first (the run is not stored, `cached_atoms` builds it
                // again), without building it again
                let r1 = self.ranges.len();
                self.ranges.extend(self.run_scratch.ranges[..run.count as usize].iter().map(|&range| Range { index, range }));
                self.apply_run(&run, r1);
                return self.atoms_from(bits >> run.count, n - run.count, index, format, atoms, mem, sink);
            }
            self.atoms_from(bits, n, index, format, atoms, mem, sink)
        } else {
            self.hold_or_flush(sink)
        }
    }

    /// The rest of an atom packet entered through [`atoms`](Self::atoms) (or
    /// [`cached_packets`](Self::cached_packets)) and committed at once: the `n` atoms `bits`
    /// left, then the ranges held or handed over; an error resets the decoder and reports
    /// `NO_SYNC` at the packet (`format`, `atoms`) as [`run`](Self::run) does.
    #[inline(never)]
    #[allow(clippy::too_many_arguments)]
    fn atoms_from<M: MemoryAccess + ?Sized, S: ElementSink + ?Sized>(
        &mut self,
        bits: u32,
        n: u8,
        index: u64,
        format: u8,
        atoms: Atoms,
        mem: &M,
        sink: &mut S,
    ) -> ControlFlow<()> {
        if self.run_atoms(bits, n, index, mem).is_ok() {
            return self.hold_or_flush(sink);
        }
        self.run(index, &Packet::Atom { format, atoms }, mem, sink)
    }

    /// After an atom packet committed at once: output that is only ranges stays buffered
    /// (see [`atoms`](Self::atoms)), up to [`HOLD_MAX`] of them; anything else is handed over
    /// (`Break` if the sink asked to stop).
    #[inline]
    fn hold_or_flush<S: ElementSink + ?Sized>(&mut self, sink: &mut S) -> ControlFlow<()> {
        if self.out.is_empty() && self.ranges.len() < HOLD_MAX {
            self.held = self.ranges.len();
            return ControlFlow::Continue(());
        }
        self.flush(sink);
        self.sink_answer()
    }

    /// An atom packet now, the decoder [`quiet`](Self::quiet), is committed at once (the
    /// common case with TRCIDR8.MAXSPEC == 0: an empty P0 stack, or one holding only the
    /// address packet after an indirect branch, which this applies as the commit would), so
    /// it is applied directly instead of being stacked and popped.
    #[inline]
    fn atoms_now(&mut self) -> bool {
        if self.next_addr.set {
            // as for the stack's one address entry below (`p0` is empty)
            self.next_addr.set = false;
            self.ret.address_applied();
            self.set_addr_isa(self.next_addr.addr, self.next_addr.is);
            self.need_addr = false;
            return true;
        }
        match self.p0.len() {
            0 => true,
            1 => match self.p0[0].kind {
                P0Kind::Addr { addr, is } => {
                    // commit's handling of an address entry
                    self.ret.address_applied();
                    self.set_addr_isa(addr, is);
                    self.need_addr = false;
                    self.p0.clear();
                    true
                }
                _ => false,
            },
            _ => false,
        }
    }

    /// Applies an atom packet committed at once (see [`atoms_now`](Self::atoms_now)) and hands
    /// its output over; same semantics as decode_packet + commit. False on an error (the
    /// decoder was reset). ([`atoms_from`](Self::atoms_from) is the same for the atom entry,
    /// which may hold the ranges back.)
    #[inline]
    fn commit_atoms_now<M: MemoryAccess + ?Sized, S: ElementSink + ?Sized>(
        &mut self,
        atoms: Atoms,
        index: u64,
        mem: &M,
        sink: &mut S,
    ) -> bool {
        // (`res.commit` stays 0: nothing else is pending)
        if self.run_atoms(atoms.bits, atoms.count, index, mem).is_ok() {
            self.flush(sink);
            true
        } else {
            false
        }
    }

    fn run<M: MemoryAccess + ?Sized, S: ElementSink + ?Sized>(
        &mut self,
        index: u64,
        pkt: &Packet,
        mem: &M,
        sink: &mut S,
    ) -> ControlFlow<()> {
        // what `settled` caches may change from here on
        self.settled = false;
        self.spill_addr();
        loop {
            match self.state {
                State::NoSync => {
                    self.discard_out();
                    self.add(index, ElementKind::NoSync(self.unsync));
                    self.flush(sink);
                    self.state = State::WaitSync;
                }
                State::WaitSync => {
                    if matches!(pkt, Packet::Async) {
                        self.state = State::WaitTinfo;
                    }
                    break;
                }
                State::WaitTinfo => {
                    self.need_ctxt = true;
                    self.need_addr = true;
                    if let Packet::TraceInfo(ti) = pkt {
                        self.spec_depth = ti.spec_depth as i64;
                        for _ in 0..ti.spec_depth.min(MAX_P0_STACK as u32) {
                            self.push(P0Kind::Unseen, true, index);
                        }
                        self.push(P0Kind::TInfo, false, index);
                        if ti.in_transaction() {
                            self.push(P0Kind::TransTraceInit, false, index);
                        }
                        self.state = State::Decode;
                        self.ret.flush();
                    } else if self.cfg.ete && matches!(pkt, Packet::Event(_)) {
                        let _ = self.decode_packet(index, pkt);
                        if self.res.any() {
                            self.resolve(mem, sink);
                        }
                    }
                    break;
                }
                State::Decode => {
                    if let Packet::Atom { atoms, .. } = pkt
                        && self.quiet()
                        && self.atoms_now()
                    {
                        if self.commit_atoms_now(*atoms, index, mem, sink) {
                            break;
                        }
                        // error: decoder reset; report NO_SYNC here and re-check this packet
                        continue;
                    }
                    if self.decode_packet(index, pkt).is_err() {
                        break;
                    }
                    if self.p0.len() > MAX_P0_STACK {
                        self.stats.stack_overflows += 1;
                        self.unsync = UnsyncReason::BadPacket;
                        self.reset_decoder();
                        break;
                    }
                    if self.res.any() {
                        self.resolve(mem, sink);
                        if self.state == State::NoSync && !self.stopped {
                            // a resolution error: report NO_SYNC at this packet and re-check it
                            continue;
                        }
                    }
                    break;
                }
            }
        }
        self.sink_answer()
    }

    /// End of trace: flushes what can be flushed and emits `EO_TRACE`.
    pub fn finish<S: ElementSink + ?Sized>(&mut self, sink: &mut S) -> ControlFlow<()> {
        self.stopped = false;
        self.spill_addr();
        while let Some(e) = self.p0.front().copied() {
            match e.kind {
                P0Kind::Atom { .. }
                | P0Kind::TrcOn
                | P0Kind::Excep { .. }
                | P0Kind::ExcepRet
                | P0Kind::Q { .. }
                | P0Kind::Unseen => {
                    self.p0.clear();
                    break;
                }
                P0Kind::TransStart if self.cfg.comm_trans_p0 => {
                    self.p0.clear();
                    break;
                }
                P0Kind::TransFail | P0Kind::TransCommit if self.cfg.max_spec_depth == 0 || self.spec_depth == 0 => {
                    self.trans_elem(&e);
                }
                P0Kind::Event(_) | P0Kind::Ts { .. } | P0Kind::Cc(_) => self.ts_cc_event(&e),
                P0Kind::Marker => self.marker(&e),
                P0Kind::Ite { .. } => self.ite(&e),
                _ => {}
            }
            self.p0.pop_front();
        }
        let reason = if self.prev_overflow { UnsyncReason::Overflow } else { UnsyncReason::EndOfTrace };
        self.add(self.cur_index, ElementKind::EoTrace(reason));
        self.flush(sink);
        self.sink_answer()
    }

    // ---------------------------------------------------------------- output

    #[inline]
    fn add(&mut self, index: u64, kind: ElementKind) {
        match kind {
            ElementKind::AddrNacc { .. } => self.stats.nacc += 1,
            // Not an OpenCSD element: `flush` counts every element it hands over, so this one
            // is taken back to keep `elements` comparable with trc_pkt_lister's count.
            ElementKind::TraceInfo => self.stats.elements = self.stats.elements.wrapping_sub(1),
            ElementKind::InstrRange(range) => {
                self.ranges.push(Range { index, range });
                return;
            }
            _ => {}
        }
        self.out.push(Element { index, trace_id: self.cfg.trace_id, kind });
        self.out_at.push(self.ranges.len() as u32);
    }

    #[inline]
    fn flush<S: ElementSink + ?Sized>(&mut self, sink: &mut S) {
        // (wrapping: a TRACE_INFO, not an OpenCSD element, is taken off the count when it is
        // emitted, before the flush that counts it)
        self.stats.elements = self.stats.elements.wrapping_add((self.out.len() + self.ranges.len()) as u64);
        if !self.stopped {
            // the common case (an atom packet's ranges and nothing else) without the loop
            let takes_branches = sink.takes_branches();
            let r = if takes_branches || !self.out.is_empty() {
                self.hand_over(takes_branches, sink)
            } else if !self.ranges.is_empty() {
                sink.ranges(self.cfg.trace_id, &self.ranges)
            } else {
                ControlFlow::Continue(())
            };
            if r.is_break() {
                self.stopped = true;
            }
        }
        self.clear_out();
    }

    /// The buffered output to the sink in trace order: runs of ranges and runs of other
    /// elements. For a sink that takes branches (`takes_branches`) the ranges are ruled into
    /// [`branches`](Self::branches), which are handed over before each run of other elements
    /// (and by [`flush_held`](Self::flush_held), at the end of the data). (One function for
    /// both: the sink's element calls are then inlined in one place.)
    #[inline(never)]
    fn hand_over<S: ElementSink + ?Sized>(&mut self, takes_branches: bool, sink: &mut S) -> ControlFlow<()> {
        let id = self.cfg.trace_id;
        let (branches, ranges, out, out_at) = (&mut self.branches, &self.ranges, &self.out, &self.out_at);
        let ranges_to = |branches: &mut Branches, sink: &mut S, rs: &[Range]| {
            if takes_branches { branches.rule_ranges(id, rs, sink) } else { sink.ranges(id, rs) }
        };
        let mut r0 = 0;
        let mut e0 = 0;
        while e0 < out.len() {
            let at = out_at[e0] as usize;
            if at > r0 {
                ranges_to(branches, sink, &ranges[r0..at])?;
                r0 = at;
            }
            if takes_branches {
                branches.hand_over(id, sink)?;
            }
            let mut e1 = e0 + 1;
            while e1 < out.len() && out_at[e1] as usize == at {
                e1 += 1;
            }
            sink.elements(&out[e0..e1])?;
            e0 = e1;
        }
        if r0 < ranges.len() {
            ranges_to(branches, sink, &ranges[r0..])?;
        }
        ControlFlow::Continue(())
    }

    // ---------------------------------------------------------------- packets -> P0 stack

    /// A (target) address packet onto the P0 stack.
    #[inline]
    fn push_addr(&mut self, addr: Address, index: u64) {
        self.last_is = addr.is;
        self.push(P0Kind::Addr { addr: addr.addr, is: addr.is }, false, index);
    }

    /// Puts [`next_addr`](Self::next_addr) onto the (empty) P0 stack, where the state machine
    /// expects it.
    #[inline]
    fn spill_addr(&mut self) {
        if self.next_addr.set {
            self.next_addr.set = false;
            let NextAddr { addr, is, index, .. } = self.next_addr;
            self.push(P0Kind::Addr { addr, is }, false, index);
        }
    }

    #[inline]
    fn push(&mut self, kind: P0Kind, is_p0: bool, index: u64) {
        self.p0.push_back(P0 { kind, is_p0, index });
    }

    fn decode_packet(&mut self, index: u64, pkt: &Packet) -> Result<(), DecodeErr> {
        let mut is_addr = false;
        match *pkt {
            Packet::Async | Packet::Ignore | Packet::NotSync => {}
            Packet::TraceInfo(_) => self.push(P0Kind::TInfo, false, index),
            Packet::TraceOn => self.push(P0Kind::TrcOn, false, index),
            Packet::Atom { atoms, .. } => {
                self.push(P0Kind::Atom { bits: atoms.bits, num: atoms.count }, true, index);
                self.spec_depth += atoms.count as i64;
            }
            Packet::Context(ctx) => {
                let is = self.last_is;
                self.push(P0Kind::Ctxt { ctx, is }, false, index);
            }
            Packet::Address { addr, context, source } => {
                if source {
                    self.last_is = addr.is;
                    self.push(P0Kind::SrcAddr { addr: addr.addr, is: addr.is }, true, index);
                    self.spec_depth += 1;
                } else {
                    self.push_addr(addr, index);
                    is_addr = true;
                    if let Some(ctx) = context {
                        self.push(P0Kind::Ctxt { ctx, is: addr.is }, false, index);
                    }
                }
            }
            Packet::Exception(ex) => {
                self.push(P0Kind::Excep { num: ex.exc_type, prev_same: ex.addr_interp == 2, pe_reset: false }, true, index);
                self.elem_pending_addr = true;
            }
            Packet::PeReset(ex) => {
                self.push(P0Kind::Excep { num: ex.exc_type, prev_same: false, pe_reset: true }, true, index);
            }
            Packet::TransFail(_) => self.push(P0Kind::TransFail, false, index),
            Packet::ExceptionReturn => {
                let v7m = self.cfg.m_profile && self.cfg.insn.arch == ArchVersion::V7;
                self.push(P0Kind::ExcepRet, v7m, index);
                if v7m {
                    self.spec_depth += 1;
                }
            }
            Packet::FuncRet => {
                if self.cfg.m_profile && self.cfg.insn.arch >= ArchVersion::V8 {
                    self.push(P0Kind::FuncRet, true, index);
                    self.spec_depth += 1;
                }
            }
            Packet::Event(ev) => self.push(P0Kind::Event(ev as u16), false, index),
            Packet::CycleCount { count, commit, .. } => {
                self.push(P0Kind::Cc(count), false, index);
                self.res.commit = commit.unwrap_or(0) as i64;
            }
            Packet::Timestamp { value, cycle_count, .. } => {
                let cc = if self.cfg.cycle_count { Some(cycle_count.unwrap_or(0)) } else { None };
                self.push(P0Kind::Ts { ts: value, cc }, false, index);
            }
            Packet::TsMarker => self.push(P0Kind::Marker, false, index),
            Packet::BadSequence(_) | Packet::Reserved(_) | Packet::ReservedCfg(..) | Packet::IncompleteEot(_) => {
                self.stats.bad_packets += 1;
                self.unsync = UnsyncReason::BadPacket;
                self.reset_decoder();
                return Err(DecodeErr);
            }
            Packet::Mispredict(atoms) => {
                self.res.mispredict = true;
                if atoms.count > 0 {
                    self.push(P0Kind::Atom { bits: atoms.bits, num: atoms.count }, true, index);
                    self.spec_depth += atoms.count as i64;
                }
                self.res.cancel = 0;
            }
            Packet::Cancel { format, count, mispredict, atoms } => {
                if format != 1 || mispredict {
                    self.res.mispredict = true;
                    if atoms.count > 0 {
                        self.push(P0Kind::Atom { bits: atoms.bits, num: atoms.count }, true, index);
                        self.spec_depth += atoms.count as i64;
                    }
                }
                self.res.cancel = count as i64;
            }
            Packet::Commit(n) => self.res.commit = n as i64,
            Packet::Overflow => {
                self.prev_overflow = true;
                self.spec_depth = 0;
                self.res.discard = true;
            }
            Packet::Discard => {
                self.spec_depth = 0;
                self.res.discard = true;
            }
            Packet::Q(q) => {
                let addr = q.addr.map(|a| (a.addr, a.is));
                self.push(P0Kind::Q { count: q.count.unwrap_or(0), addr }, true, index);
                if addr.is_some() {
                    self.spec_depth += 1;
                } else {
                    self.elem_pending_addr = true;
                }
            }
            Packet::TransStart => {
                let p0 = self.cfg.comm_trans_p0;
                self.push(P0Kind::TransStart, p0, index);
                if p0 {
                    self.spec_depth += 1;
                }
            }
            Packet::TransCommit => self.push(P0Kind::TransCommit, false, index),
            Packet::Ite { el, value } => self.push(P0Kind::Ite { el, value }, false, index),
            Packet::Conditional(_) | Packet::DataSyncMarker { .. } => {
                // data-trace related: unsupported, as in OpenCSD
                self.stats.sequence_errors += 1;
                self.unsync = UnsyncReason::BadPacket;
                self.reset_decoder();
                return Err(DecodeErr);
            }
        }
        if is_addr && self.elem_pending_addr {
            self.spec_depth += 1;
            self.elem_pending_addr = false;
        }
        if self.spec_depth > self.cfg.max_spec_depth as i64 {
            self.res.commit = self.spec_depth - self.cfg.max_spec_depth as i64;
        }
        Ok(())
    }

    // ---------------------------------------------------------------- resolution

    fn seq_error(&mut self) -> DecodeErr {
        self.stats.sequence_errors += 1;
        self.unsync = UnsyncReason::BadPacket;
        self.reset_decoder();
        DecodeErr
    }

    fn resolve<M: MemoryAccess + ?Sized, S: ElementSink + ?Sized>(&mut self, mem: &M, sink: &mut S) {
        loop {
            if self.has_out() {
                self.flush(sink);
            } else if self.res.any() {
                let mut r = Ok(());
                if self.res.commit != 0 {
                    r = self.commit(mem);
                }
                if r.is_ok() && self.res.commit == 0 {
                    if self.res.cancel != 0 {
                        r = self.cancel();
                    }
                    if r.is_ok() && self.res.mispredict {
                        r = self.mispredict();
                    }
                    if r.is_ok() && self.res.discard {
                        self.discard();
                    }
                }
                let _ = r;
            }
            if !self.has_out() && !self.res.any() {
                break;
            }
        }
    }

    fn commit<M: MemoryAccess + ?Sized>(&mut self, mem: &M) -> Result<(), DecodeErr> {
        let requested = self.res.commit;
        let mut context_flush = false;
        let mut result = Ok(());
        while self.res.commit > 0 && !context_flush {
            let Some(e) = self.p0.front().copied() else {
                self.res.commit = 0;
                return Err(self.seq_error());
            };
            let mut pop = true;
            let r: Result<(), DecodeErr> = match e.kind {
                P0Kind::TrcOn => {
                    let reason = if self.prev_overflow { TraceOnReason::Overflow } else { TraceOnReason::Normal };
                    self.add(e.index, ElementKind::TraceOn(reason));
                    self.prev_overflow = false;
                    self.ret.flush();
                    Ok(())
                }
                P0Kind::Addr { addr, is } => {
                    self.ret.address_applied();
                    self.set_addr_isa(addr, is);
                    self.need_addr = false;
                    Ok(())
                }
                P0Kind::Ctxt { ctx, is } => {
                    if ctx.updated {
                        self.update_context(&ctx, is, e.index);
                        context_flush = true;
                    }
                    Ok(())
                }
                P0Kind::Event(_) | P0Kind::Ts { .. } | P0Kind::Cc(_) => {
                    self.ts_cc_event(&e);
                    Ok(())
                }
                P0Kind::Marker => {
                    self.marker(&e);
                    Ok(())
                }
                P0Kind::Atom { bits, num } => {
                    // apply the atoms in locals; write the remainder back if the commit ends early
                    let (mut bits, mut num) = (bits, num);
                    let r = self.apply_atoms(&mut bits, &mut num, e.index, mem);
                    if r.is_ok() && num != 0 {
                        if let Some(P0 { kind: P0Kind::Atom { bits: b, num: n }, .. }) = self.p0.front_mut() {
                            *b = bits;
                            *n = num;
                        }
                        pop = false;
                    }
                    r
                }
                P0Kind::Excep { .. } => {
                    self.return_stack_pop()?;
                    self.process_exception(mem)?;
                    self.res.commit -= 1;
                    Ok(())
                }
                P0Kind::ExcepRet => {
                    self.add(e.index, ElementKind::ExceptionRet);
                    if e.is_p0 {
                        self.res.commit -= 1;
                    }
                    Ok(())
                }
                P0Kind::FuncRet => {
                    if e.is_p0 {
                        self.res.commit -= 1;
                    }
                    Ok(())
                }
                P0Kind::SrcAddr { addr, is } => {
                    self.process_source_address(addr, is, e.index, mem)?;
                    self.res.commit -= 1;
                    Ok(())
                }
                P0Kind::Q { .. } => {
                    self.process_q(mem)?;
                    self.res.commit -= 1;
                    Ok(())
                }
                P0Kind::TransStart | P0Kind::TransCommit | P0Kind::TransFail | P0Kind::TransTraceInit => {
                    if matches!(e.kind, P0Kind::TransStart) && self.cfg.comm_trans_p0 {
                        self.res.commit -= 1;
                    }
                    self.trans_elem(&e);
                    Ok(())
                }
                P0Kind::Ite { .. } => {
                    self.ite(&e);
                    Ok(())
                }
                P0Kind::Unseen => {
                    self.res.commit -= 1;
                    Ok(())
                }
                P0Kind::TInfo => {
                    self.ret.tinfo_wait_addr = true;
                    self.ret.flush();
                    self.add(e.index, ElementKind::TraceInfo);
                    Ok(())
                }
            };
            // on error the decoder has been reset: nothing left to pop or account
            r?;
            if pop {
                self.p0.pop_front();
            }
            result = Ok(());
        }
        self.spec_depth -= requested - self.res.commit;
        result
    }

    /// Applies committed atoms (oldest in bit 0) while `res.commit` allows.
    #[inline]
    fn apply_atoms<M: MemoryAccess + ?Sized>(
        &mut self,
        bits: &mut u32,
        num: &mut u8,
        index: u64,
        mem: &M,
    ) -> Result<(), DecodeErr> {
        let n = (*num as i64).min(self.res.commit.max(0)) as u8;
        *bits = self.run_atoms(*bits, n, index, mem)?;
        *num -= n;
        self.res.commit -= n as i64;
        Ok(())
    }

    /// Applies `n` committed atoms (oldest in bit 0 of `bits`); returns the bits left.
    #[inline(always)]
    fn run_atoms<M: MemoryAccess + ?Sized>(&mut self, mut b: u32, n: u8, index: u64, mem: &M) -> Result<u32, DecodeErr> {
        // One tag for the whole packet.
        let tag = self.cache_tag(mem);
        let mut k = 0;
        while k < n {
            if self.ret.pop_pending {
                // on error the decoder has been reset: nothing to write back
                self.return_stack_pop()?;
            }
            if self.need_ctxt || self.need_addr {
                // no address to walk from: the atom is dropped
                b >>= 1;
                k += 1;
                continue;
            }
            if self.walk.isa == Isa::A64 && !self.no_code {
                let m = (n - k).min(RUN_MAX as u8);
                let start = self.walk.addr;
                let key = b & ((1u32 << m) - 1);
                let r0 = self.ranges.len();
                if let Some(run) = self.cache.replay_run(start, tag, key, m, &mut self.ranges, index) {
                    self.apply_run(&run, r0);
                    b >>= run.count;
                    k += run.count;
                    continue;
                }
                let (run, whole) = self.cached_atoms(&mut b, m, index, tag);
                if run.count > 0 {
                    self.apply_run(&run, r0);
                    if whole {
                        self.cache.put_run(start, tag, key, m, run, &self.ranges[r0..]);
                    }
                    k += run.count;
                    continue;
                }
            }
            // one atom by walking the code (a block not cached yet, or not A64)
            let taken = b & 1 != 0;
            b >>= 1;
            k += 1;
            self.process_atom(taken, index, mem, tag)?;
        }
        Ok(b)
    }

    /// The hot path of [`apply_atoms`](Self::apply_atoms): up to `max` atoms (oldest in bit 0
    /// of `bits`, consumed) from an A64 address while their blocks are cached
    /// ([`cached_run`]); pushes one range per atom, as [`process_atom`](Self::process_atom)'s
    /// cached case does, and returns what else they did as a [`Run`] for
    /// [`apply_run`](Self::apply_run), and whether the run cache may store it.
    #[inline]
    fn cached_atoms(&mut self, bits: &mut u32, max: u8, index: u64, tag: u64) -> (Run, bool) {
        let (run, _, end) =
            cached_run::<false>(&self.cache, self.walk.addr, tag, *bits, max, RunPops::OFF, &mut self.run_scratch.ranges);
        *bits >>= run.count;
        self.ranges.extend(self.run_scratch.ranges[..run.count as usize].iter().map(|&range| Range { index, range }));
        if end == RunEnd::Eret && self.cfg.ete {
            self.add(index, ElementKind::ExceptionRet);
        }
        (run, end == RunEnd::Whole)
    }

    /// What a run of cached atoms did besides its ranges (`self.ranges[r0..]`, already
    /// pushed), the one rule for runs just walked ([`cached_atoms`](Self::cached_atoms)) and
    /// runs replayed from the run cache: the return-stack pushes of its calls, the pending
    /// address and pop after a taken indirect branch, the address, the counts.
    #[inline(always)]
    fn apply_run(&mut self, run: &Run, r0: usize) {
        self.ret.push_links(run.links, |i| self.ranges.get(r0 + i).map(|r| r.range.end));
        if run.indirect {
            self.need_addr = true;
            self.ret.set_pop_pending();
        }
        let c = run.count as u64;
        self.cache.count_hits(c);
        self.walk.addr = run.next;
        self.walk.it.remaining = 0;
        self.stats.ranges += c;
        self.stats.instructions += run.instructions as u64;
    }

    #[inline]
    fn return_stack_pop(&mut self) -> Result<(), DecodeErr> {
        if self.ret.pop_pending {
            let (addr, isa) = self.ret.pop();
            if self.ret.overflow() {
                return Err(self.seq_error());
            }
            self.walk.addr = addr;
            self.walk.isa = isa;
            self.need_addr = false;
        }
        Ok(())
    }

    fn cancel(&mut self) -> Result<(), DecodeErr> {
        let requested = self.res.cancel;
        let mut saved = std::mem::take(&mut self.scratch);
        saved.clear();
        while self.res.cancel > 0 {
            let Some(back) = self.p0.back_mut() else {
                self.res.cancel = 0;
                self.restore(saved);
                return Err(self.seq_error());
            };
            if back.is_p0 {
                if let P0Kind::Atom { num, .. } = &mut back.kind {
                    let n = (self.res.cancel).min(*num as i64);
                    *num -= n as u8;
                    self.res.cancel -= n;
                    if *num == 0 {
                        self.p0.pop_back();
                    }
                } else {
                    self.res.cancel -= 1;
                    self.p0.pop_back();
                }
            } else {
                let e = self.p0.pop_back().unwrap();
                if matches!(e.kind, P0Kind::Event(_) | P0Kind::Ts { .. } | P0Kind::Cc(_) | P0Kind::Marker | P0Kind::Ite { .. }) {
                    saved.push(e);
                }
            }
        }
        self.restore(saved);
        self.spec_depth -= requested - self.res.cancel;
        Ok(())
    }

    fn restore(&mut self, mut saved: Vec<P0>) {
        for e in saved.drain(..).rev() {
            self.p0.push_back(e);
        }
        self.scratch = saved;
    }

    fn mispredict(&mut self) -> Result<(), DecodeErr> {
        let mut found = false;
        let mut i = self.p0.len();
        while i > 0 {
            i -= 1;
            match &mut self.p0[i].kind {
                P0Kind::Atom { bits, num } => {
                    if *num > 0 {
                        *bits ^= 1 << (*num - 1);
                    }
                    found = true;
                    break;
                }
                P0Kind::Addr { .. } => {
                    self.p0.remove(i);
                }
                P0Kind::Unseen => {
                    found = true;
                    break;
                }
                _ => {}
            }
        }
        self.res.mispredict = false;
        if !found {
            return Err(self.seq_error());
        }
        Ok(())
    }

    fn discard(&mut self) {
        while let Some(e) = self.p0.pop_front() {
            match e.kind {
                P0Kind::Marker => self.marker(&e),
                P0Kind::Ite { .. } => self.ite(&e),
                _ => self.ts_cc_event(&e),
            }
        }
        self.res = ElemRes::default();
        self.spec_depth = 0;
        self.state = State::NoSync;
        self.unsync = if self.prev_overflow { UnsyncReason::Overflow } else { UnsyncReason::Discard };
        self.need_ctxt = true;
        self.need_addr = true;
        self.elem_pending_addr = false;
    }

    // ---------------------------------------------------------------- element processing

    fn ts_cc_event(&mut self, e: &P0) {
        let permit_ts = !self.cfg.ts_marker || self.ete_first_ts_marker || self.unmarked_ts;
        match e.kind {
            P0Kind::Event(n) => self.add(e.index, ElementKind::Event(n)),
            P0Kind::Ts { ts, cc } if permit_ts => self.add(e.index, ElementKind::Timestamp { ts, cc }),
            P0Kind::Cc(c) => self.add(e.index, ElementKind::CycleCount(c)),
            _ => {}
        }
    }

    fn marker(&mut self, e: &P0) {
        if self.cfg.ts_marker {
            self.ete_first_ts_marker = true;
        }
        self.add(e.index, ElementKind::SyncMarker(0));
    }

    fn trans_elem(&mut self, e: &P0) {
        let t = match e.kind {
            P0Kind::TransStart => MemTrans::Start,
            P0Kind::TransCommit => MemTrans::Commit,
            P0Kind::TransFail => MemTrans::Fail,
            _ => MemTrans::TraceInit,
        };
        self.add(e.index, ElementKind::MemTrans(t));
    }

    fn ite(&mut self, e: &P0) {
        if let P0Kind::Ite { el, value } = e.kind {
            self.add(e.index, ElementKind::Instrumentation { el, value });
        }
    }

    #[inline]
    fn calc_isa(&self, is: u8) -> Isa {
        if self.is_64bit {
            Isa::A64
        } else if is == 0 {
            Isa::Arm
        } else {
            Isa::Thumb2
        }
    }

    #[inline]
    fn set_addr_isa(&mut self, addr: u64, is: u8) {
        self.walk.addr = addr;
        self.walk.isa = self.calc_isa(is);
    }

    fn update_context(&mut self, c: &Context, is: u8, index: u64) {
        self.is_64bit = c.sf;
        self.is_secure = !c.ns;
        self.ctx.bits64 = c.sf;
        self.ctx.security = match (c.nse, c.ns) {
            (true, true) => Security::Realm,
            (true, false) => Security::Root,
            (false, true) => Security::NonSecure,
            (false, false) => Security::Secure,
        };
        self.ctx.el = c.el;
        self.ctx.el_valid = true;
        if let Some(id) = c.context_id {
            self.ctx.context_id = Some(id);
        }
        if let Some(v) = c.vmid {
            self.ctx.vmid = Some(v);
        }
        let isa = self.calc_isa(is);
        self.walk.isa = isa;
        self.need_ctxt = false;
        self.refresh_space();
        self.add(index, ElementKind::PeContext { isa, ctx: self.ctx });
    }

    #[inline]
    fn mem_space(&self) -> MemSpace {
        self.space
    }

    /// Recomputes the memory space for code reads (OpenCSD `getCurrMemSpace`) and the
    /// decode-cache tag after the context or security state changed.
    fn refresh_space(&mut self) {
        self.space = self.compute_space();
        self.tag_dirty = true;
    }

    /// The block-cache tag of the current context: options, the memory's id of the code the
    /// context sees ([`MemoryAccess::code_id`]), memory space.
    #[inline]
    fn cache_tag<M: MemoryAccess + ?Sized>(&mut self, mem: &M) -> u64 {
        let g = mem.generation();
        if self.tag_dirty || g != self.tag_gen {
            let id = mem.code_id(self.space, self.ctx.context_id) & 0xffff_ffff;
            self.tag = self.cfg_tag | (id << 8) | self.space.0 as u64;
            self.no_code = !mem.has_code(self.space, self.ctx.context_id);
            self.tag_dirty = false;
            self.tag_gen = g;
        }
        self.tag
    }

    fn compute_space(&self) -> MemSpace {
        if !self.ctx.el_valid {
            return if self.is_secure { MemSpace::S } else { MemSpace::N };
        }
        let el = self.ctx.el & 3;
        match self.ctx.security {
            Security::Root => MemSpace::ROOT,
            Security::Realm => [MemSpace::EL1R, MemSpace::EL1R, MemSpace::EL2R, MemSpace::ROOT][el as usize],
            Security::NonSecure => [MemSpace::EL1N, MemSpace::EL1N, MemSpace::EL2, MemSpace::EL3][el as usize],
            Security::Secure => [MemSpace::EL1S, MemSpace::EL1S, MemSpace::EL2S, MemSpace::EL3][el as usize],
        }
    }

    /// Walks to the next waypoint (or `target`); a failed optional check
    /// ([`DecodeOptions`]) is a sequence error that resynchronises the decoder, as OpenCSD's
    /// "Error processing atom packet." (no range is output for the failed walk).
    fn walk_wp<M: MemoryAccess + ?Sized>(&mut self, mem: &M, target: Option<u64>) -> Result<(RawRange, WpRes), DecodeErr> {
        let tag = self.cache_tag(mem);
        self.walk_wp_in(mem, target, tag)
    }

    /// [`walk_wp`](Self::walk_wp) with the cache already borrowed.
    fn walk_wp_in<M: MemoryAccess + ?Sized>(
        &mut self,
        mem: &M,
        target: Option<u64>,
        tag: u64,
    ) -> Result<(RawRange, WpRes), DecodeErr> {
        if self.no_code {
            // (what the walk would find at its first instruction, without the reads; `tag`
            // and `no_code` were computed together)
            let a = self.walk.addr;
            return Ok((RawRange { start: a, end: a, num: 0 }, WpRes::Nacc));
        }
        let (r, res) = walk::walk(
            &mut self.walk,
            mem,
            self.space,
            self.ctx.context_id,
            &self.cfg.insn,
            &self.cfg.opts,
            target,
            Some((&self.cache, tag)),
        );
        match res {
            WpRes::RangeLimit | WpRes::BadOpcode => {
                log::debug!("trace id {:#x}: walk from {:#x} failed: {res:?}", self.cfg.trace_id, r.start);
                Err(self.seq_error())
            }
            _ => Ok((r, res)),
        }
    }

    /// Builds a range element from the last walked instruction (OpenCSD `setElemTraceRange`).
    #[inline]
    fn range_elem(&mut self, r: RawRange, executed: bool, index: u64) {
        let last = self.walk.last;
        self.stats.ranges += 1;
        self.stats.instructions += r.num as u64;
        self.add(
            index,
            ElementKind::InstrRange(InstrRange {
                start: r.start,
                end: r.end,
                num_instr: r.num,
                isa: self.walk.isa,
                last_size: last.size,
                executed,
                last_type: last.ty,
                last_subtype: last.subtype,
                last_cond: last.is_cond,
            }),
        );
        if executed {
            self.walk.isa = last.next_isa;
        }
    }

    fn nacc(&mut self, addr: u64, index: u64) {
        let space = self.mem_space();
        self.add(index, ElementKind::AddrNacc { addr, space });
    }

    /// One atom by walking the code to the next waypoint (storing the block in the cache);
    /// cached A64 blocks take [`cached_atoms`](Self::cached_atoms) instead.
    fn process_atom<M: MemoryAccess + ?Sized>(&mut self, taken: bool, index: u64, mem: &M, tag: u64) -> Result<(), DecodeErr> {
        let (r, res) = self.walk_wp_in(mem, None, tag)?;
        if res == WpRes::Found {
            let next = self.walk.addr;
            let last = self.walk.last;
            let mut eret = false;
            match last.ty {
                InstrType::Br if taken => {
                    self.walk.addr = last.branch_addr;
                    if last.is_link {
                        self.ret.push(next, self.walk.isa);
                    }
                    self.walk.it.remaining = 0;
                }
                InstrType::BrIndirect if taken => {
                    self.need_addr = true;
                    if last.is_link {
                        self.ret.push(next, self.walk.isa);
                    }
                    self.walk.it.remaining = 0;
                    self.ret.set_pop_pending();
                    eret = self.cfg.ete && last.subtype == InstrSubtype::V8Eret;
                }
                _ => {}
            }
            self.range_elem(r, taken, index);
            if eret {
                self.add(index, ElementKind::ExceptionRet);
            }
        } else {
            self.need_addr = true;
            if r.start != r.end {
                self.range_elem(r, true, index);
            }
            if res == WpRes::Nacc {
                self.nacc(self.walk.addr, index);
            }
        }
        Ok(())
    }

    fn process_exception<M: MemoryAccess + ?Sized>(&mut self, mem: &M) -> Result<(), DecodeErr> {
        let ex = *self.p0.front().unwrap();
        let P0Kind::Excep { num, prev_same, pe_reset } = ex.kind else { unreachable!() };
        let index = ex.index;
        let mut ctxt: Option<(Context, u8, u64)> = None;
        let mut ret_addr = 0u64;
        // entries [1..=used] after the exception are consumed here
        let mut used = 0usize;
        if !pe_reset {
            let mut i = 1;
            if let Some(P0 { kind: P0Kind::Ctxt { ctx, is }, index: ci, .. }) = self.p0.get(i) {
                ctxt = Some((*ctx, *is, *ci));
                i += 1;
            }
            let Some(P0 { kind: P0Kind::Addr { addr, is }, .. }) = self.p0.get(i).copied() else {
                return Err(self.seq_error());
            };
            used = i;
            ret_addr = addr;
            if prev_same {
                let b64 = match ctxt {
                    Some((c, _, _)) => c.sf,
                    None => self.walk.isa == Isa::A64,
                };
                self.walk.addr = addr;
                self.walk.isa = if is == 0 { if b64 { Isa::A64 } else { Isa::Arm } } else { Isa::Thumb2 };
                self.need_addr = false;
            }
        }
        if let Some((c, is, _)) = ctxt {
            // OpenCSD outputs the context taken with the exception even if unchanged
            self.update_context(&c, is, index);
        }
        let mut wp = WpRes::NotFound;
        if !pe_reset {
            let m_tail = self.cfg.m_profile && ret_addr == 0xFFFF_FFFE;
            if self.walk.addr < ret_addr && !m_tail {
                let (r, res) = self.walk_wp(mem, Some(ret_addr))?;
                wp = res;
                if res == WpRes::Found {
                    self.range_elem(r, true, index);
                } else {
                    self.need_addr = true;
                    if r.start != r.end {
                        self.range_elem(r, true, index);
                    }
                }
            }
            if wp == WpRes::Nacc {
                self.nacc(self.walk.addr, index);
            }
        }
        let m_tail = !pe_reset && self.cfg.m_profile && ret_addr == 0xFFFF_FFFE;
        self.add(
            index,
            ElementKind::Exception {
                ret_addr,
                ret_addr_valid: !m_tail,
                ret_addr_br_tgt: prev_same,
                m_tail_chain: m_tail,
                number: num,
            },
        );
        self.walk.it.remaining = 0;
        // remove the consumed context/address entries (the exception itself is popped by commit)
        for _ in 0..used {
            self.p0.remove(1);
        }
        Ok(())
    }

    fn process_q<M: MemoryAccess + ?Sized>(&mut self, mem: &M) -> Result<(), DecodeErr> {
        let q = *self.p0.front().unwrap();
        let P0Kind::Q { count, addr } = q.kind else { unreachable!() };
        let (qaddr, qis) = match addr {
            Some(a) => a,
            None => {
                let mut i = 1;
                let mut ctxt = None;
                if let Some(e @ P0 { kind: P0Kind::Ctxt { .. }, .. }) = self.p0.get(i) {
                    ctxt = Some(*e);
                    i += 1;
                }
                let Some(P0 { kind: P0Kind::Addr { addr, is }, .. }) = self.p0.get(i).copied() else {
                    return Err(self.seq_error());
                };
                for _ in 0..i {
                    self.p0.remove(1);
                }
                if let Some(c) = ctxt {
                    self.p0.insert(1, c);
                }
                (addr, is)
            }
        };
        let start = self.walk.addr;
        let space = self.mem_space();
        let cfg = self.cfg.insn;
        let mut n = 0u32;
        let mut is_branch = false;
        for _ in 0..count {
            if !walk::step(&mut self.walk, mem, space, self.ctx.context_id, &cfg) {
                break;
            }
            n += 1;
            is_branch = matches!(self.walk.last.ty, InstrType::Br | InstrType::BrIndirect);
            if is_branch {
                break;
            }
        }
        let mut incomplete = true;
        if count > 0 && n == count && (self.walk.addr == qaddr || is_branch) {
            incomplete = false;
            let r = RawRange { start, end: self.walk.addr, num: n };
            self.range_elem(r, true, q.index);
        }
        if incomplete {
            let isa = self.calc_isa(qis);
            self.add(q.index, ElementKind::IRangeNoPath { start, next: qaddr, num_instr: count, isa });
        }
        self.set_addr_isa(qaddr, qis);
        self.need_addr = false;
        Ok(())
    }

    fn process_source_address<M: MemoryAccess + ?Sized>(
        &mut self,
        src: u64,
        _is: u8,
        index: u64,
        mem: &M,
    ) -> Result<(), DecodeErr> {
        let space = self.mem_space();
        let cfg = self.cfg.insn;
        let curr = self.walk.addr;
        let (n, _) = walk::read_opcode(mem, src, space, self.ctx.context_id);
        if n != 4 {
            self.add(index, ElementKind::AddrNacc { addr: src, space });
            return Ok(());
        }
        self.walk.addr = src;
        if !walk::step(&mut self.walk, mem, space, self.ctx.context_id, &cfg) {
            self.add(index, ElementKind::AddrNacc { addr: src, space });
            return Ok(());
        }
        let last = self.walk.last;
        let mut r = RawRange { start: 0, end: self.walk.addr, num: 1 };
        if self.need_addr || curr > src {
            self.need_addr = false;
            r.start = src;
        } else {
            r.start = curr;
        }
        let span = r.end.wrapping_sub(r.start);
        if span > last.size as u64 && r.end > r.start {
            if self.walk.isa != Isa::Thumb2 && !self.src_addr_n {
                r.num = (span / 4) as u32;
            } else {
                // count T32 instructions of mixed sizes, and/or split the range at every
                // waypoint passed (they were N atoms: OpenCSD's -src_addr_n mode)
                let mut tmp = WalkState { addr: r.start, isa: self.walk.isa, ..WalkState::default() };
                r.num = 0;
                while tmp.addr < r.end {
                    if r.num >= walk::MAX_WALK || !walk::step(&mut tmp, mem, space, self.ctx.context_id, &cfg) {
                        self.add(index, ElementKind::AddrNacc { addr: src, space });
                        r.num = 1;
                        r.start = src;
                        break;
                    }
                    r.num += 1;
                    if self.src_addr_n && tmp.addr < r.end && tmp.last.ty != InstrType::Other {
                        let l = tmp.last;
                        self.stats.ranges += 1;
                        self.stats.instructions += r.num as u64;
                        self.add(
                            index,
                            ElementKind::InstrRange(InstrRange {
                                start: r.start,
                                end: tmp.addr,
                                num_instr: r.num,
                                isa: tmp.isa,
                                last_size: l.size,
                                executed: false,
                                last_type: l.ty,
                                last_subtype: l.subtype,
                                last_cond: l.is_cond,
                            }),
                        );
                        r.start = tmp.addr;
                        r.num = 0;
                    }
                }
            }
        }
        match last.ty {
            InstrType::Br => {
                if last.is_link {
                    self.ret.push(self.walk.addr, self.walk.isa);
                }
                self.walk.addr = last.branch_addr;
            }
            InstrType::BrIndirect => {
                self.need_addr = true;
                if last.is_link {
                    self.ret.push(self.walk.addr, self.walk.isa);
                }
                self.ret.set_pop_pending();
            }
            _ => {}
        }
        // OpenCSD switches the ISA before building the element; range_elem then re-applies it.
        self.walk.isa = last.next_isa;
        self.range_elem(r, true, index);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::MemoryImage;
    use crate::packet::{AddrForm, Address, Atoms, Exception, TraceInfo};

    const NOP: u32 = 0xD503_201F;

    /// 0x1000: nop; bl 0x2000; nop; b.eq 0x1000 ... 0x2000: nop; ret
    fn image() -> MemoryImage {
        let mut words = vec![NOP; 0x1010 / 4];
        words[0x1000 / 4] = NOP;
        words[0x1004 / 4] = 0x9400_03FF; // bl +0xffc -> 0x2000
        words[0x1008 / 4] = NOP;
        words[0x100C / 4] = 0x54FF_F7A0; // b.eq -0x10c -> 0xF00 (conditional)
        let mut m = MemoryImage::new();
        m.add(0, words.iter().flat_map(|w| w.to_le_bytes()).collect(), MemSpace::ANY);
        m.add(0x2000, [NOP, 0xD65F_03C0].iter().flat_map(|w| w.to_le_bytes()).collect(), MemSpace::ANY);
        m
    }

    fn cfg(max_spec: u32) -> DecoderConfig {
        DecoderConfig {
            trace_id: 1,
            ete: false,
            max_spec_depth: max_spec,
            ret_stack: true,
            cycle_count: false,
            comm_trans_p0: true,
            ts_marker: false,
            m_profile: false,
            insn: DecodeConfig { arch: ArchVersion::V8, wfi_wfe_branch: false, dsb_dmb_waypoints: false },
            opts: DecodeOptions::default(),
        }
    }

    fn start_packets(addr: u64) -> Vec<Packet> {
        let ctx = Context { updated: true, el: 0, sf: true, ns: true, nse: false, context_id: None, vmid: None };
        vec![
            Packet::Async,
            Packet::TraceInfo(TraceInfo::default()),
            Packet::TraceOn,
            Packet::Address {
                addr: Address { form: AddrForm::Long64, is: 0, addr, pkt_bits: 64 },
                context: Some(ctx),
                source: false,
            },
        ]
    }

    fn atom(e: bool) -> Packet {
        Packet::Atom { format: 1, atoms: Atoms { bits: e as u32, count: 1 } }
    }

    fn run(cfg: DecoderConfig, pkts: &[Packet]) -> Vec<String> {
        let img = image();
        let mut d = Decoder::new(cfg);
        let mut out = Vec::new();
        let mut sink = |e: &Element| {
            out.push(e.kind.to_string());
            ControlFlow::Continue(())
        };
        for (i, p) in pkts.iter().enumerate() {
            let _ = d.packet(i as u64, p, &img, &mut sink);
        }
        out.into_iter().filter(|l| l.contains("RANGE") || l.contains("EXCEPTION")).collect()
    }

    /// Memory with no code, which says so or not ([`MemoryAccess::has_code`]), counting the
    /// reads the decoder makes.
    struct NoCode {
        says: bool,
        reads: std::cell::Cell<u32>,
    }

    impl MemoryAccess for NoCode {
        fn read(&self, _addr: u64, _space: MemSpace, _buf: &mut [u8]) -> usize {
            self.reads.set(self.reads.get() + 1);
            0
        }
        fn slice_at(&self, _addr: u64, _space: MemSpace) -> Option<&[u8]> {
            self.reads.set(self.reads.get() + 1);
            None
        }
        fn has_code(&self, _space: MemSpace, _context_id: Option<u32>) -> bool {
            !self.says
        }
    }

    /// A context that has no code (`has_code` false) is not walked, and gives the elements
    /// walking it gives: each atom after an address an address-not-accessible element, the
    /// atoms after it dropped until the next address.
    #[test]
    fn context_without_code() {
        let addr = |a: u64| Packet::Address {
            addr: Address { form: AddrForm::Long64, is: 0, addr: a, pkt_bits: 64 },
            context: None,
            source: false,
        };
        let mut pkts = start_packets(0x1000);
        for k in 0..6u64 {
            pkts.extend([
                atom(true),
                atom(false),
                Packet::Atom { format: 3, atoms: Atoms { bits: 0b101, count: 3 } },
                addr(0x2000 + 8 * k),
            ]);
        }
        pkts.push(atom(true));
        let decode = |says: bool| {
            let mem = NoCode { says, reads: std::cell::Cell::new(0) };
            let mut d = Decoder::new(cfg(0));
            let mut out = Vec::new();
            let mut sink = |e: &Element| {
                out.push(format!("{} {}", e.index, e.kind));
                ControlFlow::Continue(())
            };
            for (i, p) in pkts.iter().enumerate() {
                let _ = d.packet(i as u64, p, &mem, &mut sink);
            }
            let _ = d.finish(&mut sink);
            (out, mem.reads.get())
        };
        let (walked, reads) = decode(false);
        let (skipped, none) = decode(true);
        assert_eq!(skipped, walked);
        assert_eq!(walked.iter().filter(|l| l.contains("ADDR_NACC")).count(), 7, "{walked:#?}");
        assert!(reads > 0);
        assert_eq!(none, 0);
    }

    /// The ranges of atom packets entered through `atoms` are held back, not lost: an error
    /// in a later packet leaves them to come before its NO_SYNC, and `flush_held` hands over
    /// those held at the end of the data.
    #[test]
    fn held_ranges_keep_their_place() {
        let img = image();
        let mut d = Decoder::new(cfg(0));
        let log = std::cell::RefCell::new(Vec::new());
        let mut sink = |e: &Element| {
            let k = e.kind.to_string();
            if k.contains("RANGE") || k.contains("NO_SYNC") {
                log.borrow_mut().push(k[..k.find('(').unwrap()].to_string());
            }
            ControlFlow::Continue(())
        };
        let mut i = 0;
        for p in start_packets(0x1000) {
            let _ = d.packet(i, &p, &img, &mut sink);
            i += 1;
        }
        // the first atom commits the stacked trace-on, address and context (no holding), the
        // next two are applied at once and their ranges held
        let e = Atoms { bits: 1, count: 1 };
        for _ in 0..3 {
            let _ = d.atoms(i, 1, e, &img, &mut sink);
            i += 1;
        }
        let r = "OCSD_GEN_TRC_ELEM_INSTR_RANGE";
        let n = "OCSD_GEN_TRC_ELEM_NO_SYNC";
        assert_eq!(*log.borrow(), [n, r], "the last two ranges are held");
        let _ = d.packet(i, &Packet::Reserved(0), &img, &mut sink);
        let _ = d.packet(i + 1, &Packet::Async, &img, &mut sink);
        assert_eq!(*log.borrow(), [n, r, r, r, n]);
        // resynchronised: held again, then handed over by flush_held
        for p in start_packets(0x1000).iter().skip(1) {
            let _ = d.packet(i + 2, p, &img, &mut sink);
        }
        for k in 3..5 {
            let _ = d.atoms(i + k, 1, e, &img, &mut sink);
        }
        assert_eq!(log.borrow().len(), 6);
        assert!(d.flush_held(&mut sink).is_continue());
        assert_eq!(*log.borrow(), [n, r, r, r, n, r, r]);
        assert_eq!(d.stats().ranges, 5);
    }

    /// A BL is followed to its target, and an E atom on RET with no address packet returns
    /// via the return stack (TRCCONFIGR.RS compression) to the instruction after the BL.
    #[test]
    fn call_and_compressed_return() {
        let mut p = start_packets(0x1000);
        p.extend([atom(true), atom(true), atom(false)]);
        assert_eq!(
            run(cfg(0), &p),
            vec![
                "OCSD_GEN_TRC_ELEM_INSTR_RANGE(exec range=0x1000:[0x1008] num_i(2) last_sz(4) (ISA=A64) E BR  b+link )",
                "OCSD_GEN_TRC_ELEM_INSTR_RANGE(exec range=0x2000:[0x2008] num_i(2) last_sz(4) (ISA=A64) E iBR A64:ret )",
                "OCSD_GEN_TRC_ELEM_INSTR_RANGE(exec range=0x1008:[0x1010] num_i(2) last_sz(4) (ISA=A64) N BR   <cond>)",
            ]
        );
    }

    /// An exception outputs the range executed up to its preferred return address, then the
    /// exception with that address.
    #[test]
    fn exception_range_to_return_address() {
        let mut p = start_packets(0x1000);
        p.push(Packet::Exception(Exception { exc_type: 0x0e, addr_interp: 1, m_fault_pending: false, m_type: false }));
        p.push(Packet::Address {
            addr: Address { form: AddrForm::Long64, is: 0, addr: 0x1008, pkt_bits: 64 },
            context: None,
            source: false,
        });
        assert_eq!(
            run(cfg(0), &p),
            vec![
                "OCSD_GEN_TRC_ELEM_INSTR_RANGE(exec range=0x1000:[0x1008] num_i(2) last_sz(4) (ISA=A64) E BR  b+link )",
                "OCSD_GEN_TRC_ELEM_EXCEPTION(pref ret addr:0x1008; excep num (0x0e) )",
            ]
        );
    }

    /// With speculation (MAXSPEC > 0) atoms wait for a commit; cancelled atoms never execute.
    #[test]
    fn speculation_commit_and_cancel() {
        let mut p = start_packets(0x1000);
        p.extend([atom(true), atom(true)]);
        assert!(run(cfg(8), &p).is_empty(), "nothing committed yet");
        p.extend([Packet::Cancel { format: 1, count: 1, mispredict: false, atoms: Atoms::default() }, Packet::Commit(1)]);
        assert_eq!(
            run(cfg(8), &p),
            vec!["OCSD_GEN_TRC_ELEM_INSTR_RANGE(exec range=0x1000:[0x1008] num_i(2) last_sz(4) (ISA=A64) E BR  b+link )"]
        );
    }

    fn feed(d: &mut Decoder, pkts: &[Packet]) -> Vec<ElementKind> {
        let img = image();
        let mut out = Vec::new();
        let mut sink = |e: &Element| {
            out.push(e.kind);
            ControlFlow::Continue(())
        };
        for (i, p) in pkts.iter().enumerate() {
            let _ = d.packet(i as u64, p, &img, &mut sink);
        }
        out
    }

    /// Records every element as "index kind"; with `direct`, takes ranges through
    /// `packet_ranges`. With `stop_at` n > 0, asks to stop at the n-th element (it keeps it, and any after it).
    struct Recorder {
        direct: bool,
        out: Vec<String>,
        stop_at: usize,
    }

    impl ElementSink for Recorder {
        fn element(&mut self, e: &Element) -> ControlFlow<()> {
            self.out.push(format!("{} {}", e.index, e.kind));
            if self.out.len() == self.stop_at {
                return ControlFlow::Break(());
            }
            ControlFlow::Continue(())
        }
        fn takes_packet_ranges(&self) -> bool {
            self.direct
        }
        fn packet_ranges(&mut self, trace_id: u8, index: u64, rs: &[InstrRange]) -> ControlFlow<()> {
            for &range in rs {
                self.element(&Range { index, range }.element(trace_id))?;
            }
            ControlFlow::Continue(())
        }
    }

    /// The parser's packets to a decoder: each through `packet`, `atoms` or `address`, or
    /// (with `runs`) those that lead the data through `atom_run`. Once the sink asked to stop (`stopped`), the decoder is not called again.
    struct ToDecoder<'a> {
        dec: &'a mut Decoder,
        img: &'a MemoryImage,
        rec: &'a mut Recorder,
        runs: bool,
        stopped: bool,
    }

    impl crate::packet::PacketSink for ToDecoder<'_> {
        fn packet(&mut self, index: u64, p: &Packet, _raw: &[u8]) {
            self.stopped = self.stopped || self.dec.packet(index, p, self.img, self.rec).is_break();
        }
        fn atoms(&mut self, index: u64, format: u8, atoms: Atoms, _header: u8) {
            self.stopped = self.stopped || self.dec.atoms(index, format, atoms, self.img, self.rec).is_break();
        }
        fn address(&mut self, index: u64, addr: Address, _raw: &[u8]) {
            self.stopped = self.stopped || self.dec.address(index, addr, self.img, self.rec).is_break();
        }
        fn atom_run(&mut self, index: ChunkIndex, data: &[u8], look: &mut Lookahead<'_>) -> usize {
            if !self.runs || self.stopped {
                return crate::packet::atom_packets(self, index, data, look);
            }
            let (n, r) = self.dec.atom_run(index, data, look, self.img, self.rec);
            self.stopped = r.is_break();
            n
        }
    }

    /// The start of an ETMv4 trace at 0x1000 ([`decode_stream`]'s configuration): A-sync, trace
    /// info, trace on, then the address 0x1000 with its context (AArch64, EL0, non-secure).
    const SYNC_AT_0X1000: &[u8] = &[
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x80, 0x01, 0x00, 0x04, // A-sync, TINFO, TRACE_ON
        0x85, 0, 8, 0, 0, 0, 0, 0, 0, 0x30, // 0x1000 with context
    ];

    /// A sink that takes branches instead of ranges gets the elements' taken branches (perf's
    /// rule, element by element) also when a packet's first run comes from the run cache and
    /// the rest of the packet fails, which discards the packet's output: at 0x1000 `nop; b
    /// 0x2000`, at 0x2000 `nop; ret`; after each sync E (the B), then E E: a compressed return
    /// (the RET, then an E) with the return stack empty. The first pass walks 0x2000; from the
    /// second the RET's run comes from the cache.
    #[test]
    fn failing_packet_takes_back_its_stored_branches() {
        use crate::frame::StreamFormat;
        use crate::pipeline::BufferDecoder;
        use crate::pipeline::fuzz::branches_agree;
        use crate::snapshot::Protocol;
        let mut img = MemoryImage::new();
        let words = |w: &[u32]| w.iter().flat_map(|w| w.to_le_bytes()).collect::<Vec<u8>>();
        img.add(0x1000, words(&[NOP, 0x1400_03FF]), MemSpace::ANY);
        img.add(0x2000, words(&[NOP, 0xD65F_03C0]), MemSpace::ANY);
        let mut data = Vec::new();
        for _ in 0..6 {
            data.extend(SYNC_AT_0X1000);
            data.extend([0xF7, 0xDB]);
        }
        let etm = EtmConfig::generic(Protocol::Etmv4, 1);
        let make = || BufferDecoder::new(StreamFormat::Raw { trace_id: 1 }, &[(1, etm, ArchVersion::V8)]);
        let (mut errors, mut ranges) = (0, 0);
        let _ = make().push(&data, &img, &mut |e: &Element| {
            errors += usize::from(matches!(e.kind, ElementKind::NoSync(UnsyncReason::BadPacket)));
            ranges += usize::from(matches!(e.kind, ElementKind::InstrRange(_)));
            ControlFlow::Continue(())
        });
        // (the B's range each time; the failing packet's ranges are dropped)
        assert_eq!((errors, ranges), (6, 6));
        assert_eq!(branches_agree(&make, &data, &[], &img), 0);
    }

    /// A sink that takes branches gets the elements' taken branches from a run cache whose runs
    /// a sink that takes ranges stored before (without their records: the cache forgets them
    /// when the first sink that takes branches comes, `BlockCache::rule_runs`): calls,
    /// compressed returns and conditional branches, as runs of one and several packets.
    #[test]
    fn branches_from_a_cache_a_ranges_sink_filled() {
        use crate::frame::StreamFormat;
        use crate::pipeline::BufferDecoder;
        use crate::pipeline::fuzz::branches_agree;
        use crate::snapshot::Protocol;
        let img = image();
        let mut data = SYNC_AT_0X1000.to_vec();
        for _ in 0..50 {
            // BL, RET, B.EQ taken, ... in packets of one, two and three E atoms
            data.extend([0xF7, 0xDB, 0xFF, 0xF7, 0xDB]);
        }
        let etm = EtmConfig::generic(Protocol::Etmv4, 1);
        let cache = cache::shared(8);
        let make = || BufferDecoder::with_cache(StreamFormat::Raw { trace_id: 1 }, &[(1, etm, ArchVersion::V8)], cache.clone());
        let mut ranges = 0;
        let _ = make().push(&data, &img, &mut |e: &Element| {
            ranges += usize::from(matches!(e.kind, ElementKind::InstrRange(_)));
            ControlFlow::Continue(())
        });
        assert!(ranges > 200, "{ranges} ranges");
        assert!(branches_agree(&make, &data, &[], &img) > 100);
    }

    /// `data`, an ETMv4 trace (trace ID 1, generic configuration: return stack compression on),
    /// through the packet parser to a decoder over `img`, in chunks of 37 bytes (so runs are
    /// also cut by the end of the data), its packets entered one by one or (`runs`) as runs,
    /// the sink taking packets' ranges or not (`direct`), asking to stop at element `stop_at`
    /// (0: never): the elements, the decoder's counts, the packets.
    fn decode_stream(
        img: &MemoryImage,
        data: &[u8],
        runs: bool,
        direct: bool,
        stop_at: usize,
    ) -> (Vec<String>, DecodeStats, u64) {
        use crate::packet::PacketParser;
        use crate::snapshot::Protocol;
        let etm = EtmConfig::generic(Protocol::Etmv4, 1);
        let mut dec = Decoder::with_cache(DecoderConfig::new(&etm, ArchVersion::V8), cache::shared(8));
        let mut rec = Recorder { direct, out: Vec::new(), stop_at };
        let mut parser = PacketParser::new(&etm);
        let mut sink = ToDecoder { dec: &mut dec, img, rec: &mut rec, runs, stopped: false };
        for (k, chunk) in data.chunks(37).enumerate() {
            parser.feed(k as u64 * 37, chunk, &mut sink);
            sink.stopped = sink.stopped || sink.dec.flush_held(sink.rec).is_break();
        }
        parser.finish(&mut sink);
        if !sink.stopped {
            let _ = dec.finish(&mut rec);
        }
        (rec.out, dec.stats(), parser.stats().packets)
    }

    /// Packets entered as runs (`atom_run`: atom packets applied from the run cache and
    /// target address packets taken in the decoder's loop), the sink taking ranges directly or
    /// not, give the elements and counts that entering them one by one gives: the loop
    /// entered with and without a pending target address, left at a run not cached (also in
    /// the middle of a packet of more than `RUN_MAX` atoms), at a compressed return after a
    /// taken indirect branch, at two address packets in a row, at the other packets; atom
    /// packets dropped after code not accessible.
    #[test]
    fn atom_run_as_packets() {
        let img = image();
        let long = |a: u64| {
            let mut v = vec![0x9D, ((a >> 2) & 0x7F) as u8, ((a >> 9) & 0x7F) as u8];
            v.extend((2..8).map(|k| (a >> (8 * k)) as u8));
            v
        };
        let mut data = Vec::new();
        for _ in 0..6 {
            data.extend(SYNC_AT_0X1000);
            for _ in 0..3 {
                // E E (bl, ret) 0x1000 EE (bl, ret) E (compressed return) E 0x2000 E
                data.extend([0xF7, 0xF7]);
                data.extend(long(0x1000));
                data.extend([0xDB, 0xF7, 0xF7]);
                data.extend(long(0x2000));
                data.extend([0xF7]);
                // 9 E (a taken indirect branch first), 0x1000 twice, EEE, exact match, E, short
                // address, N, E, 13 E
                data.push(0xC5);
                data.extend(long(0x1000));
                data.extend(long(0x1000));
                data.extend([0xFF, 0x90, 0xF7, 0x95, 0x00, 0xF6, 0xF7, 0xC9]);
                // code not accessible at 0x40000: the atoms after its first dropped, up to
                // 0x1000
                data.extend(long(0x40000));
                data.extend([0xF7, 0xF7, 0xDB, 0xC5, 0xF6]);
                data.extend(long(0x1000));
            }
        }
        let decode = |runs: bool, direct: bool, stop_at: usize| decode_stream(&img, &data, runs, direct, stop_at);
        let by_packet = decode(false, false, 0);
        assert!(by_packet.0.iter().filter(|l| l.contains("RANGE")).count() > 100, "{:?}", by_packet.0);
        assert!(by_packet.1.cache_hits > 100);
        assert!(by_packet.0.iter().filter(|l| l.contains("ADDR_NACC")).count() >= 18, "{:?}", by_packet.0);
        assert_eq!(decode(true, false, 0), by_packet);
        assert_eq!(decode(true, true, 0), by_packet);
        // a sink that asks to stop at any element, the caller then calling the decoder no
        // more: it has the elements up to that one, and no more
        for n in 1..by_packet.0.len() {
            for (runs, direct) in [(false, false), (true, false), (true, true)] {
                let got = decode(runs, direct, n).0;
                assert_eq!(got[..], by_packet.0[..n], "stop at {n}, runs {runs}, direct {direct}");
            }
        }
    }

    /// One function (0x2000: nop; ret) called from two sites (0x1004 returns to 0x1008, 0x1104
    /// to 0x1108), each call site's return then branching to the other's block.
    fn two_callers() -> MemoryImage {
        let mut m = MemoryImage::new();
        let words = |w: &[u32]| w.iter().flat_map(|w| w.to_le_bytes()).collect::<Vec<u8>>();
        // nop; bl 0x2000; b.eq 0x1100; b 0x1000
        m.add(0x1000, words(&[NOP, 0x9400_03FF, 0x5400_07C0, 0x17FF_FFFD]), MemSpace::ANY);
        // nop; bl 0x2000; b.eq 0x1000; b 0x1100
        m.add(0x1100, words(&[NOP, 0x9400_03BF, 0x54FF_F7C0, 0x17FF_FFFD]), MemSpace::ANY);
        m.add(0x2000, words(&[NOP, 0xD65F_03C0]), MemSpace::ANY);
        m
    }

    /// Compressed returns (an atom after a taken RET, no address packet: the return stack
    /// gives the target) return to the caller whose return address is on the stack, whether
    /// the call was in the same packet (BL, RET, B.EQ) or the one before (BL; RET, B.EQ), when
    /// the function's blocks and the runs from its entry are cached under the other caller:
    /// the ranges are the program's path, entered as packets, as runs, and with the sink
    /// taking packets' ranges. (A run cache keyed without the return stack must not carry a
    /// run across such a return: bench/README "Runs through compressed returns".)
    #[test]
    fn runs_through_compressed_returns() {
        let img = two_callers();
        let mut data = SYNC_AT_0X1000.to_vec();
        // per caller: E (BL) then EE (RET, B.EQ); EEE (BL, RET, B.EQ); E (BL) then EE again
        let cycles = [[0xF7, 0xDB, 0xF7, 0xDB].as_slice(), &[0xFF, 0xFF], &[0xF7, 0xDB, 0xF7, 0xDB]];
        for c in cycles {
            for _ in 0..4 {
                data.extend(c);
            }
        }
        // the program's path: 12 times through both callers
        let path: Vec<(u64, u64)> = (0..12)
            .flat_map(|_| {
                [(0x1000, 0x1008), (0x2000, 0x2008), (0x1008, 0x100C), (0x1100, 0x1108), (0x2000, 0x2008), (0x1108, 0x110C)]
            })
            .collect();
        for (runs, direct) in [(false, false), (true, false), (true, true)] {
            let (out, _, _) = decode_stream(&img, &data, runs, direct, 0);
            let got: Vec<(u64, u64)> = out
                .iter()
                .filter_map(|l| {
                    let r = l.split("exec range=0x").nth(1)?;
                    let (a, b) = r.split_once(":[0x")?;
                    Some((u64::from_str_radix(a, 16).ok()?, u64::from_str_radix(b.split(']').next()?, 16).ok()?))
                })
                .collect();
            assert_eq!(got, path, "runs {runs}, direct {direct}: {out:?}");
            assert!(!out.iter().any(|l| l.contains("ERR") || l.contains("NACC")), "{out:?}");
        }
    }

    /// The runs a sink that takes branches stored through compressed returns: how many, and
    /// how many of them pop entries pushed before them.
    fn popping_runs(cache: &cache::BlockCache) -> (usize, usize) {
        let popping: Vec<&RunSlot> = cache.run_slots().iter().filter(|s| s.run().pops != 0).collect();
        (popping.len(), popping.iter().filter(|s| cache.run_effect(s).popped > 0).count())
    }

    /// A sink that takes branches gets runs that go on through compressed returns
    /// (`cache::THROUGH_RETURNS`): to a return address the run pushed itself, and to one
    /// pushed before it, which the run holds only under (a run stored under one caller is built
    /// again without that pop under the other). Its records are the elements' by perf's rule
    /// ([`branches_agree`](crate::pipeline::fuzz::branches_agree)), and a sink that takes
    /// ranges decoding after it from the same cache still gets the program's path.
    #[test]
    fn branch_runs_through_compressed_returns() {
        use crate::frame::StreamFormat;
        use crate::pipeline::BufferDecoder;
        use crate::pipeline::fuzz::branches_agree;
        use crate::snapshot::Protocol;
        let img = two_callers();
        let mut data = SYNC_AT_0X1000.to_vec();
        // per caller: E (BL) then EE (RET, B.EQ); EEE (BL, RET, B.EQ); E (BL) then EE again;
        // E (the first's BL), EEE (RET, B.EQ, the second's BL: a return address popped and
        // another pushed), EE (RET, B.EQ)
        let cycles = [[0xF7, 0xDB, 0xF7, 0xDB].as_slice(), &[0xFF, 0xFF], &[0xF7, 0xDB, 0xF7, 0xDB], &[0xF7, 0xFF, 0xDB]];
        for c in cycles {
            for _ in 0..4 {
                data.extend(c);
            }
        }
        let etm = EtmConfig::generic(Protocol::Etmv4, 1);
        let on = |c: &SharedBlockCache| {
            BufferDecoder::with_cache(StreamFormat::Raw { trace_id: 1 }, &[(1, etm, ArchVersion::V8)], c.clone())
        };
        // the ranges a sink that takes them gets
        let ranges = |c: &SharedBlockCache| {
            let mut got = Vec::new();
            let _ = on(c).push(&data, &img, &mut |e: &Element| {
                if let ElementKind::InstrRange(r) = &e.kind {
                    got.push((r.start, r.end));
                }
                ControlFlow::Continue(())
            });
            got
        };
        let path: Vec<(u64, u64)> = (0..16)
            .flat_map(|_| {
                [(0x1000, 0x1008), (0x2000, 0x2008), (0x1008, 0x100C), (0x1100, 0x1108), (0x2000, 0x2008), (0x1108, 0x110C)]
            })
            .collect();
        // the first caller's call, return and B.EQ alone: the run from the function's entry
        // pops the caller's return address; a sink that takes ranges from that cache then
        // reaches the function from both callers
        let first = cache::shared(8);
        assert_eq!(branches_agree(&|| on(&first), &data[..SYNC_AT_0X1000.len() + 2], &[], &img), 2);
        assert_eq!(popping_runs(&first), (1, 1));
        assert_eq!(ranges(&first), path);
        let shared = cache::shared(8);
        // (a record per range after the first: 16 times through both callers, 6 ranges)
        assert_eq!(branches_agree(&|| on(&shared), &data, &[], &img), 95);
        // (the run from the function's entry, stored without popping once the second caller
        // called it, and the BL, RET, B.EQ packets' runs)
        assert!(popping_runs(&shared).0 >= 2, "{:?}", popping_runs(&shared));
        assert_eq!(ranges(&shared), path);
    }

    /// Runs through compressed returns where the return stack fills: calls up to 18 deep,
    /// then their returns, in packets of 3 and of 8 E atoms (a run of calls and returns, some
    /// pushing onto a stack that drops its oldest entry, their operations then made one by
    /// one); past 16 deep the last returns find the stack empty (an error, then the next
    /// sync). Taken branches, counts and errors are the elements' by perf's rule.
    #[test]
    fn branch_runs_through_compressed_returns_on_a_full_stack() {
        use crate::frame::StreamFormat;
        use crate::pipeline::BufferDecoder;
        use crate::pipeline::fuzz::branches_agree;
        use crate::snapshot::Protocol;
        const RET: u32 = 0xD65F_03C0;
        for (depth, per) in [(14, 3), (16, 3), (17, 3), (14, 8), (16, 8), (18, 8)] {
            let mut img = MemoryImage::new();
            let words = |w: &[u32]| w.iter().flat_map(|w| w.to_le_bytes()).collect::<Vec<u8>>();
            // bl 0x2000; b 0x1000
            img.add(0x1000, words(&[0x9400_0400, 0x17FF_FFFF]), MemSpace::ANY);
            for i in 0..depth {
                // bl the next; ret (the last: nop; ret)
                let first = if i + 1 < depth { 0x9400_0004 } else { NOP };
                img.add(0x2000 + 0x10 * i, words(&[first, RET]), MemSpace::ANY);
            }
            // per pass: `depth` calls, `depth` returns, the B: in packets of `per` E atoms
            // (format 3: 3; format 6: 8), the rest one by one
            let atoms = 2 * depth as usize + 1;
            let header = if per == 3 { 0xFF } else { 0xC4 };
            let mut data = Vec::new();
            for _ in 0..8 {
                data.extend(SYNC_AT_0X1000);
                data.extend(std::iter::repeat_n(header, atoms / per));
                data.extend(std::iter::repeat_n(0xF7, atoms % per));
            }
            let etm = EtmConfig::generic(Protocol::Etmv4, 1);
            let shared = cache::shared(8);
            let make =
                || BufferDecoder::with_cache(StreamFormat::Raw { trace_id: 1 }, &[(1, etm, ArchVersion::V8)], shared.clone());
            let records = branches_agree(&make, &data, &[], &img);
            // (a record per range after each pass's first; past 16 the last returns fail)
            let whole = 8 * 2 * depth as usize;
            assert!(if depth <= 16 { records == whole } else { records < whole }, "depth {depth}: {records} records");
            assert!(popping_runs(&shared).0 > 0, "depth {depth}: no run through a return");
        }
    }

    fn addr_pkt(addr: u64) -> Packet {
        Packet::Address { addr: Address { form: AddrForm::Long64, is: 0, addr, pkt_bits: 64 }, context: None, source: false }
    }

    /// At the end of the data, the pending target is a direct branch's target from the code,
    /// an indirect branch's from the (uncommitted) address packet after it, a compressed
    /// return's from the return stack, and unknown while an indirect branch awaits its address.
    #[test]
    fn pending_target_at_end_of_data() {
        let mut d = Decoder::new(cfg(0));
        assert_eq!(d.pending_target(), None, "not synchronised");
        let mut p = start_packets(0x1000);
        p.push(atom(true)); // BL 0x2000 taken
        feed(&mut d, &p);
        assert_eq!(d.pending_target(), Some(0x2000));
        feed(&mut d, &[atom(true)]); // RET taken, compressed: the return stack gives 0x1008
        assert_eq!(d.pending_target(), Some(0x1008));

        let mut no_rs = cfg(0);
        no_rs.ret_stack = false;
        let mut d = Decoder::new(no_rs);
        let mut p = start_packets(0x1000);
        p.extend([atom(true), atom(true)]);
        feed(&mut d, &p);
        assert_eq!(d.pending_target(), None, "indirect branch, address not yet traced");
        feed(&mut d, &[addr_pkt(0x1234)]);
        assert_eq!(d.pending_target(), Some(0x1234));
    }

    /// A target address packet the fast path keeps out of the P0 stack (`next_addr`) is
    /// applied by the atom packet after it, whether that comes through `atoms` (which takes
    /// it from the field) or `packet` (through `run`, which first puts it onto the stack); of
    /// two address packets in a row the second counts; one left at the end is no range.
    #[test]
    fn target_address_then_atoms_either_entry() {
        let img = image();
        let ret = "OCSD_GEN_TRC_ELEM_INSTR_RANGE(exec range=0x2000:[0x2008] num_i(2) last_sz(4) (ISA=A64) E iBR A64:ret )";
        let bl = "OCSD_GEN_TRC_ELEM_INSTR_RANGE(exec range=0x1000:[0x1008] num_i(2) last_sz(4) (ISA=A64) E BR  b+link )";
        for via_atoms in [false, true] {
            let mut d = Decoder::new(cfg(0));
            let mut out = Vec::new();
            let mut sink = |e: &Element| {
                out.push(e.kind.to_string());
                ControlFlow::Continue(())
            };
            let mut p = start_packets(0x1000);
            // BL 0x2000, RET; then its target 0x1000 and BL; then 0x1000 and 0x2000, and RET
            p.extend([atom(true), atom(true), addr_pkt(0x1000), atom(true), addr_pkt(0x1000), addr_pkt(0x2000), atom(true)]);
            p.push(addr_pkt(0x1000));
            for (i, pkt) in p.iter().enumerate() {
                let i = i as u64;
                if let (true, Packet::Atom { format, atoms }) = (via_atoms, pkt) {
                    let _ = d.atoms(i, *format, *atoms, &img, &mut sink);
                } else {
                    let _ = d.packet(i, pkt, &img, &mut sink);
                }
            }
            assert!(d.flush_held(&mut sink).is_continue());
            assert_eq!(d.pending_target(), Some(0x1000), "via_atoms {via_atoms}");
            assert!(d.finish(&mut sink).is_continue());
            let ranges: Vec<&str> = out.iter().map(String::as_str).filter(|l| l.contains("RANGE")).collect();
            assert_eq!(ranges, [bl, ret, bl, ret], "via_atoms {via_atoms}");
            assert!(out.last().unwrap().contains("EO_TRACE"), "via_atoms {via_atoms}: {out:?}");
        }
    }

    /// With TRCIDR0.TSMARK set, timestamps before the first marker are dropped (OpenCSD) unless
    /// unmarked timestamps are requested.
    #[test]
    fn unmarked_timestamps() {
        let mut c = cfg(0);
        c.ts_marker = true;
        let ts = Packet::Timestamp { value: 0x6fd7, bits: 64, cycle_count: None };
        let mut p = vec![Packet::Async, Packet::TraceInfo(TraceInfo::default()), ts];
        p.extend(start_packets(0x1000).into_iter().skip(2));
        p.push(atom(true));
        let has_ts = |k: &Vec<ElementKind>| k.iter().any(|k| matches!(k, ElementKind::Timestamp { ts: 0x6fd7, .. }));
        assert!(!has_ts(&feed(&mut Decoder::new(c), &p)));
        let mut d = Decoder::new(c);
        d.set_unmarked_timestamps(true);
        assert!(has_ts(&feed(&mut d, &p)));
    }
}
