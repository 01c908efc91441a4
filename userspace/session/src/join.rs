//! The join: per CPU, attach to each pause sample the branch records of the trace window that
//! pause closed, validate the resulting hybrid sample, and count rejects by reason.
//!
//! # Inputs
//!
//! Per CPU, in time order: *windows* (a window begins at a trace-on after resume, gets a time
//! from its first timestamp or the AUX record, and collects taken branches oldest to newest)
//! and *pause samples* (time, stack leaf first). The two streams come from different kernel
//! channels (AUX ring vs. the eBPF ring/sample ring) so they interleave arbitrarily; the join
//! buffers samples and resolves a sample only once nothing earlier can arrive for its CPU
//! (samply's `EventSorter` shape): when a window that began after the sample has been seen, at
//! an explicit flush (end of stream), or when the per-CPU backlog bound is hit.
//!
//! # Matching rule
//!
//! A pause at time `t` on CPU `c` closed the newest window of `c` with `time <= t`, provided
//! that window began after the previous pause sample of `c` (otherwise the window of this
//! pause was lost and the newest one belongs to an earlier pause) and was not used already.
//! An optional maximum age rejects windows too old to have been closed by this pause.
//!
//! # Validation (a sample that fails is counted by [`RejectReason`], never kept)
//!
//! * leaf after target: the sampled IP must lie at or after the newest branch's target, and
//!   the code between them must be straight-line (only not-taken conditional branches) per the
//!   code image ([`CodeOracle`]);
//! * calls and returns: replaying the window's branches (oldest first) on a shadow stack, a
//!   return must go to the address after its matching call, a return out of the window's
//!   frames must land after a call instruction, and the calls still open at the end must be
//!   the return addresses at the top of the sample's stack (newest call = `stack[1]`; the
//!   leaf frame's own return address may be missing when the leaf had not stored its frame
//!   record yet, which frame-pointer unwinding cannot see).
//!
//! Without code for an address, the code checks are skipped and counted
//! ([`JoinStats::unverified`]).
//!
//! # Synthesized samples ([`JoinConfig::synth_samples`])
//!
//! A window longer than `depth` branches holds more of the path than its pause sample's
//! branches: at earlier points of it, the stack is the pause stack unwound backwards through
//! the window's branches (what perf's instruction-trace synthesis and llvm-profgen's hybrid
//! input do). Walking back from the pause, a return (RET from A to B) means the frame it left
//! existed before it: its return address B is pushed (B must follow a call instruction); a
//! call (BL/BLR at A) means the callee's frame did not exist before it: the top return address
//! must be A + 4 and is popped. Other branches (jumps, tail calls) leave the return addresses
//! as they are. With `m` branches in the window's newest segment (oldest `b[0]`), the
//! synthesized sample `k` (1, 2, ...) is at the source of branch `b[m - k*depth]` (the
//! instruction before that branch ran, leaf of its stack), with the `depth` branches before
//! it (`b[m - k*depth - 1]` newest, fewer for the oldest): `floor((m - 1) / depth)` samples,
//! at most `synth_samples`, each validated like the pause sample ([`RejectReason`], counted in
//! [`JoinStats::synth_rejected`]; undoing a sample's own branches, which the next sample needs
//! anyway, proves every check of that validation, so it runs only where the walk stops). The
//! walk stops for the window, counted by [`SynthStop`],
//! when the reconstruction is not sound (unknown code, a call that is not the top of the
//! stack, a return not after a call, a branch from an exception return) or the window's trace
//! goes on beyond the segment (a trace restart: an exception filtered out, a gap) or beyond
//! the branches kept.

use std::collections::{HashMap, VecDeque};
use std::marker::PhantomData;

use crate::session::BranchPair;

/// Instruction kinds the validation needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum InsnKind {
    /// Not a branch.
    #[default]
    Other,
    /// Conditional direct branch (may be not taken).
    CondBranch,
    /// Unconditional branch without link (B, BR).
    Jump,
    /// Branch with link (BL, BLR).
    Call,
    /// Return (RET).
    Return,
    /// Exception-generating instruction (SVC, HVC, SMC): execution resumes after it.
    Exception,
    /// Anything else that always changes the flow (ERET, DRPS, ...).
    Flow,
}

/// Classifies the instruction at a runtime address of a process (the code image).
pub trait CodeOracle {
    /// Kind of the instruction at `addr` in process `pid`, or `None` if no code is known there.
    fn insn_kind(&self, pid: u32, addr: u64) -> Option<InsnKind>;
    /// Identifies the code the oracle sees: while it is the same, so is every answer
    /// (results may be cached); `None` (the default): answers may change at any time.
    fn generation(&self) -> Option<u64> {
        None
    }
    /// Size of instructions (A64: 4).
    fn insn_size(&self) -> u64 {
        4
    }
    /// Length of the instruction at `addr` (where a call there returns to); default
    /// [`insn_size`](Self::insn_size).
    fn insn_len(&self, _pid: u32, _addr: u64) -> Option<u64> {
        Some(self.insn_size())
    }
    /// Whether a call instruction ends at `addr` (a return into a frame older than the
    /// branch records must land there); `None` if the code is unknown.
    fn after_call(&self, pid: u32, addr: u64) -> Option<bool> {
        addr.checked_sub(self.insn_size().max(1)).and_then(|p| self.insn_kind(pid, p)).map(|k| k == InsnKind::Call)
    }
    /// Whether `[from, to)` holds only instructions that do not always change the flow
    /// ([`InsnKind::Other`], [`InsnKind::CondBranch`], [`InsnKind::Exception`]), checked in
    /// order. Oracles with contiguous code override this to look the code up once instead of
    /// per instruction.
    fn straight_code(&self, pid: u32, from: u64, to: u64) -> Straight {
        let step = self.insn_size().max(1);
        let mut a = from;
        while a < to {
            match self.insn_kind(pid, a) {
                None => return Straight::Unknown,
                Some(k) if k.is_straight() => {}
                Some(_) => return Straight::Flow,
            }
            a += step;
        }
        Straight::Yes
    }
}

/// Result of [`CodeOracle::straight_code`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Straight {
    /// Only straight-line instructions.
    Yes,
    /// Code is unknown from some instruction on (before any flow change).
    Unknown,
    /// An instruction that always changes the flow.
    Flow,
}

impl InsnKind {
    /// Execution continues after the instruction (or may: conditional branch, SVC).
    #[inline]
    pub fn is_straight(self) -> bool {
        matches!(self, InsnKind::Other | InsnKind::CondBranch | InsnKind::Exception)
    }
}

/// A code oracle that knows no code (all code checks skipped).
#[derive(Debug, Default, Clone, Copy)]
pub struct NoCode;

impl CodeOracle for NoCode {
    fn insn_kind(&self, _pid: u32, _addr: u64) -> Option<InsnKind> {
        None
    }
}

/// Why a sample was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RejectReason {
    /// The sample has no stack.
    EmptyStack,
    /// No window of this CPU ended at this pause (lost, truncated or never synced).
    NoWindow,
    /// The newest window is older than the maximum window age.
    StaleWindow,
    /// The window decoded to no branches.
    EmptyWindow,
    /// The window's trace at the pause was lost (corrupt, truncated, overflow).
    BrokenWindow,
    /// Code between two consecutive branches is not straight-line (inconsistent chain).
    BrokenChain,
    /// The leaf IP lies before the newest branch target, or too far after it.
    LeafBeforeTarget,
    /// A taken-type branch lies between the newest branch target and the leaf IP.
    LeafNotReachable,
    /// A return in the window does not go back after its call.
    ReturnMismatch,
    /// A return out of the window's frames does not land after a call instruction.
    ReturnNotAfterCall,
    /// The calls open at the end of the window are not the top of the call stack.
    StackMismatch,
    /// Samples of a CPU arrived out of time order.
    OutOfOrder,
    /// The kernel throttled the CPU's event group while the window was open: its trace was
    /// dropped (`perf_event_throttle_group` stops the AUX leader too).
    Throttled,
    /// The newest trace before the pause belongs to another thread (a context switch the
    /// trace or the switch records show): no branch of the sample's thread is left.
    ForeignContext,
    /// The branch unit says a branch was a call or a return (the entry's `type`) and the code
    /// at its source says otherwise (or the reverse): the code is not what ran.
    BranchTypeMismatch,
}

impl RejectReason {
    /// All reasons, in display order.
    pub const ALL: [RejectReason; 15] = [
        RejectReason::EmptyStack,
        RejectReason::NoWindow,
        RejectReason::StaleWindow,
        RejectReason::EmptyWindow,
        RejectReason::BrokenWindow,
        RejectReason::BrokenChain,
        RejectReason::LeafBeforeTarget,
        RejectReason::LeafNotReachable,
        RejectReason::ReturnMismatch,
        RejectReason::ReturnNotAfterCall,
        RejectReason::StackMismatch,
        RejectReason::OutOfOrder,
        RejectReason::Throttled,
        RejectReason::ForeignContext,
        RejectReason::BranchTypeMismatch,
    ];

    /// Short name for summaries.
    pub fn name(self) -> &'static str {
        match self {
            RejectReason::EmptyStack => "empty-stack",
            RejectReason::NoWindow => "no-window",
            RejectReason::StaleWindow => "stale-window",
            RejectReason::EmptyWindow => "empty-window",
            RejectReason::BrokenWindow => "broken-window",
            RejectReason::BrokenChain => "broken-chain",
            RejectReason::LeafBeforeTarget => "leaf-before-target",
            RejectReason::LeafNotReachable => "leaf-not-reachable",
            RejectReason::ReturnMismatch => "return-mismatch",
            RejectReason::ReturnNotAfterCall => "return-not-after-call",
            RejectReason::StackMismatch => "stack-mismatch",
            RejectReason::OutOfOrder => "out-of-order",
            RejectReason::Throttled => "throttled",
            RejectReason::ForeignContext => "foreign-context",
            RejectReason::BranchTypeMismatch => "branch-type-mismatch",
        }
    }
}

/// A reason with a counter in [`ReasonCounts`].
pub trait Reason: Copy + 'static {
    /// Every reason, in display order; a reason's counter is at [`index`](Self::index).
    fn all() -> &'static [Self];
    fn index(self) -> usize;
}

/// One counter per [`Reason`] `R` (`N` of them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReasonCounts<R, const N: usize>([u64; N], PhantomData<R>);

impl<R, const N: usize> Default for ReasonCounts<R, N> {
    fn default() -> Self {
        ReasonCounts([0; N], PhantomData)
    }
}

impl<R: Reason, const N: usize> ReasonCounts<R, N> {
    /// Count of one reason.
    pub fn get(&self, r: R) -> u64 {
        self.0[r.index()]
    }
    /// Sum over all reasons.
    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }
    fn bump(&mut self, r: R) {
        self.0[r.index()] += 1;
    }
    /// `(reason, count)` for the non-zero reasons.
    pub fn iter(&self) -> impl Iterator<Item = (R, u64)> + '_ {
        R::all().iter().map(|&r| (r, self.get(r))).filter(|&(_, n)| n > 0)
    }
}

impl Reason for RejectReason {
    fn all() -> &'static [Self] {
        &RejectReason::ALL
    }
    fn index(self) -> usize {
        self as usize
    }
}

/// Rejected-sample counters, one per [`RejectReason`].
pub type RejectCounts = ReasonCounts<RejectReason, { RejectReason::ALL.len() }>;

/// Why the synthesis of a window's earlier samples stopped before the window's start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SynthStop {
    /// The pause stack lacked the leaf frame's return address: the stack to unwind from is
    /// not known.
    LeafFrameMissing,
    /// No code for a branch source, or for a return's target.
    UnknownCode,
    /// Undoing a call: the top of the known stack is not that call's return address.
    CallMismatch,
    /// Undoing a return: its target does not follow a call instruction.
    ReturnNotAfterCall,
    /// A branch from an instruction that is neither a call, a return nor a jump (an exception
    /// return, ...): not user code's call flow.
    ExceptionFlow,
    /// The window's trace restarted before the segment (an exception filtered out of the
    /// trace, a context change, a gap): the stack before it is not followed.
    TraceRestart,
    /// The window had more branches than the segment keeps (`depth * (1 + synth_samples)`, at
    /// most 65,536 unless `depth` is more).
    BranchLimit,
}

impl SynthStop {
    /// All reasons, in display order.
    pub const ALL: [SynthStop; 7] = [
        SynthStop::LeafFrameMissing,
        SynthStop::UnknownCode,
        SynthStop::CallMismatch,
        SynthStop::ReturnNotAfterCall,
        SynthStop::ExceptionFlow,
        SynthStop::TraceRestart,
        SynthStop::BranchLimit,
    ];

    /// Short name for summaries.
    pub fn name(self) -> &'static str {
        match self {
            SynthStop::LeafFrameMissing => "leaf-frame-missing",
            SynthStop::UnknownCode => "unknown-code",
            SynthStop::CallMismatch => "call-mismatch",
            SynthStop::ReturnNotAfterCall => "return-not-after-call",
            SynthStop::ExceptionFlow => "exception-flow",
            SynthStop::TraceRestart => "trace-restart",
            SynthStop::BranchLimit => "branch-limit",
        }
    }
}

impl Reason for SynthStop {
    fn all() -> &'static [Self] {
        &SynthStop::ALL
    }
    fn index(self) -> usize {
        self as usize
    }
}

/// Synthesis stops, one counter per [`SynthStop`].
pub type SynthStopCounts = ReasonCounts<SynthStop, { SynthStop::ALL.len() }>;

/// Synthesized samples per window the binary asks for unless told not to
/// ([`JoinConfig::synth_samples`]).
pub const DEFAULT_SYNTH_SAMPLES: usize = 64;

/// Join configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JoinConfig {
    /// Branch records kept per sample (newest N of the window; `usize::MAX` = whole window).
    pub depth: usize,
    /// Validate samples (leaf after target, calls/returns).
    pub validate: bool,
    /// Maximum distance in bytes from the newest branch target to the leaf IP.
    pub max_straight_line: u64,
    /// Maximum age (ns) of a window at the pause that closed it; `None` = unbounded.
    pub max_window_age: Option<u64>,
    /// Pending samples per CPU before the oldest is resolved with what is known.
    pub max_pending_samples: usize,
    /// Accept a stack that lacks the newest open call's return address (frame-pointer
    /// unwinding in a leaf function that has not stored its frame record).
    pub allow_missing_leaf_frame: bool,
    /// Pending segments per CPU kept for samples that have not arrived yet.
    pub max_pending_segments: usize,
    /// At most this many synthesized samples per window (module docs), 0 = none; a segment
    /// keeps its newest `depth * (1 + synth_samples)` branches (at most 65,536 beyond `depth`).
    pub synth_samples: usize,
}

/// Branches a segment keeps for synthesized samples at most (16 bytes each), whatever the
/// depth: a large `depth` gets fewer synthesized samples, not a larger ring.
const MAX_SYNTH_RING: usize = 1 << 16;

impl JoinConfig {
    /// Branches a segment keeps: `depth`, or `depth * (1 + synth_samples)` up to
    /// [`MAX_SYNTH_RING`].
    fn ring_cap(&self) -> usize {
        let want = self.depth.saturating_mul(self.synth_samples.saturating_add(1));
        want.min(self.depth.max(MAX_SYNTH_RING))
    }
}

impl Default for JoinConfig {
    fn default() -> Self {
        JoinConfig {
            depth: 32,
            validate: true,
            max_straight_line: 64 * 1024,
            max_window_age: None,
            max_pending_samples: 4096,
            allow_missing_leaf_frame: true,
            max_pending_segments: 1024,
            synth_samples: 0,
        }
    }
}

/// Join counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct JoinStats {
    /// Trace segments begun (trace-on to trace-on; a window has one or more).
    pub segments: u64,
    /// Segments no pause claimed (before a pause's window, or left at the end).
    pub segments_unmatched: u64,
    /// Segments dropped because too many were pending.
    pub segments_overflow: u64,
    /// Joined samples whose branch chain stopped at a broken segment (fewer than N branches).
    pub partial: u64,
    /// Samples received.
    pub samples: u64,
    /// Samples joined and validated.
    pub joined: u64,
    /// Samples resolved early because the per-CPU backlog was full.
    pub forced: u64,
    /// Samples resolved by the driver's watermark ([`Joiner::trace_complete_until`]).
    pub by_watermark: u64,
    /// Joined samples whose code checks could not run (no code image for some address).
    pub unverified: u64,
    /// Joined samples whose stack lacked the leaf frame's return address.
    pub leaf_frame_missing: u64,
    /// Windows closed in other processes (their pause records): their segments are dropped.
    pub window_ends: u64,
    /// Segments dropped because they belonged to another process's window.
    pub foreign_segments: u64,
    /// Joined samples whose chain stopped at a context switch (other thread before it).
    pub context_cut: u64,
    /// Throttle intervals seen (PERF_RECORD_THROTTLE).
    pub throttles: u64,
    /// Rejected samples by reason.
    pub rejected: RejectCounts,
    /// Synthesized samples ([`JoinConfig::synth_samples`]) validated and kept.
    pub synthesized: u64,
    /// Of those, samples whose code checks could not all run.
    pub synth_unverified: u64,
    /// Synthesized samples rejected by the pause sample's validation, by reason (the window's
    /// synthesis stops there).
    pub synth_rejected: RejectCounts,
    /// Windows whose synthesis stopped before the window's start, by reason.
    pub synth_stops: SynthStopCounts,
}

/// A joined, validated hybrid sample (borrowed for the duration of the callback).
#[derive(Debug, Clone, Copy)]
pub struct Joined<'a> {
    /// CPU.
    pub cpu: i32,
    /// Process id.
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// Pause time.
    pub time: u64,
    /// Call stack, leaf first.
    pub stack: &'a [u64],
    /// Branch records, newest first.
    pub branches: &'a [BranchPair],
    /// 0 for the pause sample; `k` for the window's `k`-th synthesized sample back from the
    /// pause ([`JoinConfig::synth_samples`]), which carries the pause's `time`.
    pub synth: u32,
}

/// A sample waiting for its window.
#[derive(Debug)]
struct PendingSample {
    pid: u32,
    tid: u32,
    time: u64,
    stack: Vec<u64>,
    /// A window closed in another process ([`Joiner::window_end`]): it only consumes its
    /// segments.
    foreign: bool,
}

/// A trace segment: from one trace-on to the next (a window is one or more segments: trace
/// restarts inside a window after exceptions filtered out of the trace).
#[derive(Debug)]
struct Segment {
    /// Time: first timestamp, else the AUX record time (see the module docs).
    time: u64,
    /// Whether `time` came from a trace timestamp (a later timestamp does not move it).
    ts_known: bool,
    /// Ring of the newest `depth` branches (oldest to newest, starting at `head`).
    ring: Vec<BranchPair>,
    head: usize,
    /// Data of this segment was lost: its branches are gone and the chain breaks here.
    broken: bool,
    /// The loss was the kernel throttling the group.
    throttled: bool,
    /// The segment is the first of a trace window: the trace unit resynchronised (Trace
    /// Info) before it, as it does at every resume; a chain never runs past it.
    window_start: bool,
    /// The traced context (CONTEXTIDR: the thread id) if the trace reported one.
    ctx: Option<u32>,
    /// Older branches fell out of the ring.
    dropped: bool,
}

impl Segment {
    fn push(&mut self, b: BranchPair, cap: usize) {
        if self.ring.len() < cap {
            self.ring.push(b);
        } else if cap > 0 {
            self.ring[self.head] = b;
            self.head += 1;
            self.dropped = true;
            if self.head == cap {
                self.head = 0;
            }
        }
    }
    /// The newest `n` branches (all if fewer), newest first, appended to `out`. (The ring,
    /// oldest to newest from `head`, in its two parts.)
    fn newest_into(&self, out: &mut Vec<BranchPair>, n: usize) {
        let (a, b) = self.ring.split_at(self.head);
        let from_a = n.min(a.len());
        out.extend(a[a.len() - from_a..].iter().rev());
        let from_b = (n - from_a).min(b.len());
        out.extend(b[b.len() - from_b..].iter().rev());
    }
}

#[derive(Debug, Default)]
struct CpuJoin {
    /// Segments not yet attached to a pause, oldest first; the last may still be open.
    segs: VecDeque<Segment>,
    open: bool,
    samples: VecDeque<PendingSample>,
    last_sample_time: Option<u64>,
    /// Time of the previous resolved sample (its window's segments are gone).
    prev_resolved: Option<u64>,
    /// The next segment begins a trace window (Trace Info seen).
    next_window_start: bool,
    /// Recent context switches into a thread on this CPU: (time, tid), oldest first.
    switch_ins: VecDeque<(u64, u32)>,
}

/// The per-CPU join.
#[derive(Debug)]
pub struct Joiner {
    cfg: JoinConfig,
    cpus: CpuMap<CpuJoin>,
    stats: JoinStats,
    pool_rings: Vec<Vec<BranchPair>>,
    pool_stacks: Vec<Vec<u64>>,
    scratch: Vec<BranchPair>,
    shadow: Vec<u64>,
    /// Synthesized samples: the return addresses (outermost first) and the stack.
    synth_callers: Vec<u64>,
    synth_stack: Vec<u64>,
    /// The code's answers for the validation and the synthesized samples.
    code_cache: CodeCache,
}

impl Joiner {
    /// A join with `cfg`.
    pub fn new(cfg: JoinConfig) -> Self {
        Joiner {
            cfg,
            cpus: CpuMap::default(),
            stats: JoinStats::default(),
            pool_rings: Vec::new(),
            pool_stacks: Vec::new(),
            scratch: Vec::new(),
            shadow: Vec::new(),
            synth_callers: Vec::new(),
            synth_stack: Vec::new(),
            code_cache: CodeCache::default(),
        }
    }

    /// Counters.
    pub fn stats(&self) -> &JoinStats {
        &self.stats
    }

    /// Configuration.
    pub fn config(&self) -> &JoinConfig {
        &self.cfg
    }

    /// Trace (re)started on `cpu`: a new segment begins. `time` is its time if known from a
    /// trace timestamp (`ts_known`), else an upper bound such as the AUX record time.
    /// Samples older than this segment are now certain and resolved through `oracle`/`out`.
    pub fn begin_segment(
        &mut self,
        cpu: i32,
        time: u64,
        ts_known: bool,
        oracle: &dyn CodeOracle,
        out: &mut dyn FnMut(&Joined<'_>),
    ) {
        self.stats.segments += 1;
        let ring = self.pool_rings.pop().unwrap_or_default();
        let c = self.cpus.entry(cpu);
        c.open = true;
        let window_start = std::mem::take(&mut c.next_window_start);
        c.segs.push_back(Segment {
            time,
            ts_known,
            ring,
            head: 0,
            broken: false,
            throttled: false,
            window_start,
            ctx: None,
            dropped: false,
        });
        if c.segs.len() > self.cfg.max_pending_segments
            && let Some(g) = c.segs.pop_front()
        {
            // Keep the newest; nothing claimed the oldest in time.
            self.stats.segments_overflow += 1;
            recycle(&mut self.pool_rings, g.ring);
        }
        self.resolve(cpu, oracle, out);
    }

    /// The trace of `cpu` resynchronised (a Trace Info packet: the trace unit was enabled,
    /// i.e. resumed): the open segment ends and the next one begins a trace window.
    pub fn trace_info(&mut self, cpu: i32) {
        let c = self.cpus.entry(cpu);
        c.open = false;
        c.next_window_start = true;
    }

    /// The trace of `cpu` reported context `ctx` (CONTEXTIDR: a thread id) for the open
    /// segment. A different context inside a segment starts a new segment (same time).
    pub fn context(&mut self, cpu: i32, ctx: u32, oracle: &dyn CodeOracle, out: &mut dyn FnMut(&Joined<'_>)) {
        let Some(c) = self.cpus.get_mut(cpu) else { return };
        let Some(g) = c.segs.back_mut().filter(|_| c.open) else { return };
        match g.ctx {
            None => g.ctx = Some(ctx),
            Some(x) if x == ctx => {}
            Some(_) => {
                let (t, known) = (g.time, g.ts_known);
                c.open = false;
                self.begin_segment(cpu, t, known, oracle, out);
                if let Some(g) = self.cpus.get_mut(cpu).and_then(|c| c.segs.back_mut()) {
                    g.ctx = Some(ctx);
                }
            }
        }
    }

    /// A context switch on `cpu` at `time` into thread `tid` (a switch record).
    pub fn switch_in(&mut self, cpu: i32, time: u64, tid: u32) {
        let c = self.cpus.entry(cpu);
        c.switch_ins.push_back((time, tid));
        // Keep what a pending sample may still ask about: switches after the previous pause.
        let keep_after = c.prev_resolved.unwrap_or(0);
        while c.switch_ins.len() > 1 && c.switch_ins.get(1).is_some_and(|s| s.0 <= keep_after) {
            c.switch_ins.pop_front();
        }
        if c.switch_ins.len() > MAX_SWITCHES {
            c.switch_ins.pop_front();
        }
    }

    /// The kernel throttled the event group of `cpu` at `time` (its AUX leader stopped, the
    /// open trace dropped): the open segment breaks, and a window the throttle cut is never
    /// joined. (An unthrottle needs no action: the trace that follows starts a new window.)
    pub fn throttle(&mut self, cpu: i32, time: u64) {
        self.stats.throttles += 1;
        let ring = self.pool_rings.pop().unwrap_or_default();
        let c = self.cpus.entry(cpu);
        c.open = false;
        c.segs.push_back(Segment {
            time,
            ts_known: true,
            ring,
            head: 0,
            broken: true,
            throttled: true,
            window_start: false,
            ctx: None,
            dropped: false,
        });
    }

    /// A window closed at `time` on `cpu` in another process (its pause record): the trace up
    /// to it belongs to no sample of the target. Queued like a sample, so it consumes exactly
    /// the segments of its window.
    pub fn window_end(&mut self, cpu: i32, time: u64, oracle: &dyn CodeOracle, out: &mut dyn FnMut(&Joined<'_>)) {
        self.stats.window_ends += 1;
        let c = self.cpus.entry(cpu);
        if c.last_sample_time.is_some_and(|t| time < t) {
            return;
        }
        c.last_sample_time = Some(time);
        let stack = self.pool_stacks.pop().unwrap_or_default();
        c.samples.push_back(PendingSample { pid: 0, tid: 0, time, stack, foreign: true });
        if c.samples.len() > self.cfg.max_pending_samples {
            self.stats.forced += 1;
            self.resolve_front(cpu, oracle, out);
        }
        self.resolve(cpu, oracle, out);
    }

    /// A trace timestamp (perf clock) inside the open segment of `cpu`: the first one dates
    /// the segment if it had no timestamp yet.
    pub fn segment_time(&mut self, cpu: i32, time: u64) {
        if let Some(c) = self.cpus.get_mut(cpu)
            && c.open
            && let Some(g) = c.segs.back_mut()
            && !g.ts_known
        {
            g.time = time;
            g.ts_known = true;
        }
    }

    /// A taken branch in the open segment of `cpu` (in execution order).
    #[inline]
    pub fn branch(&mut self, cpu: i32, b: BranchPair) {
        let cap = self.cfg.ring_cap();
        if let Some(c) = self.cpus.get_mut(cpu)
            && c.open
            && let Some(g) = c.segs.back_mut()
        {
            g.push(b, cap);
        }
    }

    /// Taken branches in the open segment of `cpu`, oldest first (only the newest the ring
    /// keeps can matter: older ones would fall out of it).
    #[inline]
    pub fn branches(&mut self, cpu: i32, bs: &[BranchPair]) {
        let cap = self.cfg.ring_cap();
        if let Some(c) = self.cpus.get_mut(cpu)
            && c.open
            && let Some(g) = c.segs.back_mut()
        {
            if g.ring.len() + bs.len() <= cap {
                // (the common case: the ring has room, nothing wraps)
                g.ring.extend_from_slice(bs);
                return;
            }
            let skip = bs.len().saturating_sub(cap);
            if skip > 0 {
                g.dropped = true;
            }
            for &b in &bs[skip..] {
                g.push(b, cap);
            }
        }
    }

    /// The open segment of `cpu` lost data (overflow, decode error, lost sync): it is closed
    /// and marked broken, so no branch chain runs through it; branches until the next
    /// [`Joiner::begin_segment`] are ignored.
    pub fn discontinuity(&mut self, cpu: i32) {
        if let Some(c) = self.cpus.get_mut(cpu)
            && c.open
        {
            c.open = false;
            if let Some(g) = c.segs.back_mut() {
                g.ring.clear();
                g.head = 0;
                g.broken = true;
                g.dropped = false;
            }
        }
    }

    /// The open segment of `cpu` ended cleanly (its data ended at a pause).
    pub fn end_segment(&mut self, cpu: i32) {
        if let Some(c) = self.cpus.get_mut(cpu) {
            c.open = false;
        }
    }

    /// A pause sample. It is joined (and `out` called) once its window is certain.
    #[allow(clippy::too_many_arguments)]
    pub fn sample(
        &mut self,
        cpu: i32,
        pid: u32,
        tid: u32,
        time: u64,
        stack: &[u64],
        oracle: &dyn CodeOracle,
        out: &mut dyn FnMut(&Joined<'_>),
    ) {
        self.stats.samples += 1;
        if stack.is_empty() {
            self.stats.rejected.bump(RejectReason::EmptyStack);
            return;
        }
        let c = self.cpus.entry(cpu);
        if c.last_sample_time.is_some_and(|t| time < t) {
            self.stats.rejected.bump(RejectReason::OutOfOrder);
            return;
        }
        c.last_sample_time = Some(time);
        let mut s = self.pool_stacks.pop().unwrap_or_default();
        s.clear();
        s.extend_from_slice(stack);
        c.samples.push_back(PendingSample { pid, tid, time, stack: s, foreign: false });
        if c.samples.len() > self.cfg.max_pending_samples {
            self.stats.forced += 1;
            self.resolve_front(cpu, oracle, out);
        }
        // A segment that already began after this sample makes it certain.
        self.resolve(cpu, oracle, out);
    }

    /// All trace of `cpu` up to `time` has been seen (the live driver drained the AUX buffer
    /// after that time): samples before it are certain and are resolved even if no later
    /// segment began (an idle CPU).
    pub fn trace_complete_until(&mut self, cpu: i32, time: u64, oracle: &dyn CodeOracle, out: &mut dyn FnMut(&Joined<'_>)) {
        while self.cpus.get(cpu).and_then(|c| c.samples.front()).is_some_and(|s| s.time < time) {
            self.stats.by_watermark += 1;
            self.resolve_front(cpu, oracle, out);
        }
    }

    /// Resolve every pending sample of every CPU with what is known (end of stream).
    pub fn flush(&mut self, oracle: &dyn CodeOracle, out: &mut dyn FnMut(&Joined<'_>)) {
        let mut cpus: Vec<i32> = self.cpus.keys().collect();
        cpus.sort_unstable();
        for cpu in cpus {
            while self.cpus.get(cpu).is_some_and(|c| !c.samples.is_empty()) {
                self.resolve_front(cpu, oracle, out);
            }
            if let Some(c) = self.cpus.get_mut(cpu) {
                c.open = false;
                for g in c.segs.drain(..) {
                    self.stats.segments_unmatched += 1;
                    recycle(&mut self.pool_rings, g.ring);
                }
            }
        }
    }

    /// Resolve the samples of `cpu` that are certain: older than the newest segment.
    fn resolve(&mut self, cpu: i32, oracle: &dyn CodeOracle, out: &mut dyn FnMut(&Joined<'_>)) {
        loop {
            let Some(c) = self.cpus.get(cpu) else { return };
            let Some(s) = c.samples.front() else { return };
            match c.segs.back() {
                Some(g) if g.time > s.time => self.resolve_front(cpu, oracle, out),
                _ => return,
            }
        }
    }

    /// Resolve the oldest pending sample of `cpu` against the segments known now.
    fn resolve_front(&mut self, cpu: i32, oracle: &dyn CodeOracle, out: &mut dyn FnMut(&Joined<'_>)) {
        let Some(c) = self.cpus.get_mut(cpu) else { return };
        let Some(s) = c.samples.pop_front() else { return };
        let prev = c.prev_resolved.replace(s.time);
        // Segments that began before the previous pause belong to no later pause.
        while c.segs.front().is_some_and(|g| prev.is_some_and(|p| g.time <= p)) {
            let g = c.segs.pop_front().expect("checked");
            self.stats.segments_unmatched += 1;
            recycle(&mut self.pool_rings, g.ring);
        }
        // This pause's window: the segments that began before it (after the previous pause).
        let n = c.segs.iter().take_while(|g| g.time <= s.time).count();
        if s.foreign {
            for _ in 0..n {
                if let Some(g) = c.segs.pop_front() {
                    self.stats.foreign_segments += 1;
                    recycle(&mut self.pool_rings, g.ring);
                }
            }
            recycle(&mut self.pool_stacks, s.stack);
            return;
        }
        // A context switch on this CPU since the previous pause: an undated segment without a
        // traced context cannot be placed before or after it.
        let switched = c.switch_ins.iter().any(|&(t, _)| prev.is_none_or(|p| t > p) && t <= s.time);
        // The newest branches that came from one segment: consecutive records of one decoded
        // chain, the straight code between them walked by the decoder.
        let mut walked: Option<usize> = None;
        let verdict = if n == 0 {
            Err(RejectReason::NoWindow)
        } else if self.cfg.max_window_age.is_some_and(|a| s.time - c.segs[n - 1].time > a) {
            Err(RejectReason::StaleWindow)
        } else {
            // Newest N branches, newest segment first; the chain stops at a broken segment, at
            // the start of the trace window, and where the trace stops being the sample's
            // thread.
            self.scratch.clear();
            let mut stop: Option<RejectReason> = None;
            let mut cut = false;
            for g in c.segs.range(..n).rev() {
                if g.broken {
                    stop = Some(if g.throttled { RejectReason::Throttled } else { RejectReason::BrokenWindow });
                    break;
                }
                let owner = match g.ctx {
                    Some(t) => Some(t),
                    // No context in the trace: the switch records say who ran, if the segment is
                    // dated and switches were recorded.
                    None if g.ts_known => c.switch_ins.iter().rev().find(|&&(t, _)| t <= g.time).map(|&(_, tid)| tid),
                    None => None,
                };
                let foreign = match owner {
                    Some(t) => t != s.tid,
                    // Undated and without context: the sample's only if no switch happened on
                    // this CPU since the previous pause (or no switches are recorded at all:
                    // per-thread tracing follows one thread).
                    None => switched,
                };
                if foreign {
                    if self.scratch.is_empty() {
                        stop = Some(RejectReason::ForeignContext);
                    } else {
                        cut = true;
                    }
                    break;
                }
                let room = self.cfg.depth - self.scratch.len().min(self.cfg.depth);
                g.newest_into(&mut self.scratch, room);
                if walked.is_none() {
                    walked = Some(self.scratch.len());
                }
                if self.scratch.len() >= self.cfg.depth || g.window_start {
                    break;
                }
            }
            match stop {
                Some(r) if self.scratch.is_empty() => Err(r),
                _ if self.scratch.is_empty() => Err(RejectReason::EmptyWindow),
                Some(_) => {
                    self.stats.partial += 1;
                    Ok(())
                }
                None => {
                    if cut {
                        self.stats.context_cut += 1;
                    }
                    Ok(())
                }
            }
        };
        // Whatever happened, these segments belonged to this pause; the newest one's branches
        // are kept for the synthesized samples.
        let mut newest: Option<Segment> = None;
        for i in 0..n {
            if let Some(g) = c.segs.pop_front() {
                if i + 1 == n && self.cfg.synth_samples > 0 {
                    newest = Some(g);
                } else {
                    recycle(&mut self.pool_rings, g.ring);
                }
            }
        }
        let verdict = verdict.and_then(|()| {
            if self.cfg.validate {
                let walked = Walked { chain: walked.unwrap_or(0), leaf: false };
                validate(&s.stack, &self.scratch, &[], walked, s.pid, oracle, &self.cfg, &mut self.shadow, &mut self.code_cache)
            } else {
                Ok(Check::default())
            }
        });
        match verdict {
            Ok(check) => {
                self.stats.joined += 1;
                self.stats.unverified += u64::from(check.unverified);
                self.stats.leaf_frame_missing += u64::from(check.leaf_frame_missing);
                out(&Joined { cpu, pid: s.pid, tid: s.tid, time: s.time, stack: &s.stack, branches: &self.scratch, synth: 0 });
                if let Some(g) = newest.as_mut()
                    && !g.broken
                {
                    g.ring.rotate_left(g.head);
                    let more = if g.dropped {
                        Some(SynthStop::BranchLimit)
                    } else {
                        (!g.window_start).then_some(SynthStop::TraceRestart)
                    };
                    let w = SynthWindow { cpu, s: &s, leaf_frame_missing: check.leaf_frame_missing, ring: &g.ring, more };
                    let buf = SynthBuf {
                        callers: &mut self.synth_callers,
                        stack: &mut self.synth_stack,
                        branches: &mut self.scratch,
                        cache: &mut self.code_cache,
                    };
                    synthesize(&w, buf, &self.cfg, oracle, &mut self.shadow, &mut self.stats, out);
                }
            }
            Err(r) => self.stats.rejected.bump(r),
        }
        if let Some(g) = newest {
            recycle(&mut self.pool_rings, g.ring);
        }
        recycle(&mut self.pool_stacks, s.stack);
    }

    /// Validate a sample that carried its own branch records (LBR/BRBE), with the same rules.
    /// `types` (empty, or one per branch) is what the branch unit says each branch was (the
    /// entry's `type`): a call or return must be one in the code too, and where the code is
    /// unknown the type stands in for it.
    pub fn validate_sample(
        &mut self,
        pid: u32,
        stack: &[u64],
        branches: &[BranchPair],
        types: &[Option<InsnKind>],
        oracle: &dyn CodeOracle,
    ) -> Result<(), RejectReason> {
        self.stats.samples += 1;
        let r = if stack.is_empty() {
            Err(RejectReason::EmptyStack)
        } else if branches.is_empty() || !self.cfg.validate {
            Ok(Check::default())
        } else {
            validate(stack, branches, types, Walked::NOTHING, pid, oracle, &self.cfg, &mut self.shadow, &mut self.code_cache)
        };
        match r {
            Ok(c) => {
                self.stats.joined += 1;
                self.stats.unverified += u64::from(c.unverified);
                self.stats.leaf_frame_missing += u64::from(c.leaf_frame_missing);
                Ok(())
            }
            Err(e) => {
                self.stats.rejected.bump(e);
                Err(e)
            }
        }
    }
}

/// Per-CPU state indexed directly by CPU number (hot path: one lookup per branch); CPU
/// numbers outside `-1..65535` go to a map.
#[derive(Debug)]
pub(crate) struct CpuMap<T> {
    dense: Vec<Option<T>>,
    other: HashMap<i32, T>,
}

impl<T> Default for CpuMap<T> {
    fn default() -> Self {
        CpuMap { dense: Vec::new(), other: HashMap::new() }
    }
}

impl<T: Default> CpuMap<T> {
    #[inline]
    fn slot(cpu: i32) -> Option<usize> {
        let i = cpu.checked_add(1)?;
        (0..65536).contains(&i).then_some(i as usize)
    }

    /// The state of `cpu`, created if absent.
    #[inline]
    pub(crate) fn entry(&mut self, cpu: i32) -> &mut T {
        match Self::slot(cpu) {
            Some(i) => {
                if i >= self.dense.len() {
                    self.dense.resize_with(i + 1, || None);
                }
                self.dense[i].get_or_insert_with(T::default)
            }
            None => self.other.entry(cpu).or_default(),
        }
    }

    #[inline]
    pub(crate) fn get(&self, cpu: i32) -> Option<&T> {
        match Self::slot(cpu) {
            Some(i) => self.dense.get(i).and_then(|o| o.as_ref()),
            None => self.other.get(&cpu),
        }
    }

    #[inline]
    pub(crate) fn get_mut(&mut self, cpu: i32) -> Option<&mut T> {
        match Self::slot(cpu) {
            Some(i) => self.dense.get_mut(i).and_then(|o| o.as_mut()),
            None => self.other.get_mut(&cpu),
        }
    }

    /// CPUs present.
    pub(crate) fn keys(&self) -> impl Iterator<Item = i32> + '_ {
        self.dense.iter().enumerate().filter(|(_, o)| o.is_some()).map(|(i, _)| i as i32 - 1).chain(self.other.keys().copied())
    }
}

/// Context switches kept per CPU.
const MAX_SWITCHES: usize = 256;

fn recycle<T>(pool: &mut Vec<Vec<T>>, mut v: Vec<T>) {
    if pool.len() < 64 {
        v.clear();
        pool.push(v);
    }
}

#[derive(Debug, Default, Clone, Copy)]
struct Check {
    unverified: bool,
    leaf_frame_missing: bool,
}

/// A joined pause sample's window, for its synthesized samples.
struct SynthWindow<'a> {
    cpu: i32,
    s: &'a PendingSample,
    leaf_frame_missing: bool,
    /// The newest segment's branches, oldest first.
    ring: &'a [BranchPair],
    /// Why the window goes on before the ring's oldest branch, if it does.
    more: Option<SynthStop>,
}

/// Scratch buffers of [`synthesize`].
struct SynthBuf<'a> {
    callers: &'a mut Vec<u64>,
    stack: &'a mut Vec<u64>,
    branches: &'a mut Vec<BranchPair>,
    cache: &'a mut CodeCache,
}

/// What the code says of a branch: its source's kind, where a call there returns to, and
/// for a return whether a call precedes its target (what the synthesized samples' walk and
/// [`validate`] ask of it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Facts {
    kind: Option<InsnKind>,
    /// Kind `Call`: its return address ([`CodeOracle::insn_len`] on).
    ret: Option<u64>,
    /// Kind `Return`: [`CodeOracle::after_call`] of its target.
    after_call: Option<bool>,
}

impl Facts {
    fn of(pid: u32, b: BranchPair, oracle: &dyn CodeOracle) -> Facts {
        let kind = oracle.insn_kind(pid, b.from);
        let ret = if kind == Some(InsnKind::Call) { oracle.insn_len(pid, b.from).map(|n| n + b.from) } else { None };
        let after_call = if kind == Some(InsnKind::Return) { oracle.after_call(pid, b.to) } else { None };
        Facts { kind, ret, after_call }
    }
}

/// Answers of one oracle for its [`generation`](CodeOracle::generation), direct-mapped:
/// [`Facts`] by (process, branch) and [`CodeOracle::straight_code`] by (process, span) (a
/// window's branches and the code between them are mostly the same few hundred, window after
/// window). Without a generation nothing is kept.
#[derive(Debug, Default)]
struct CodeCache {
    /// The oracle (its address) and generation the slots hold answers of, if they may be used.
    of: Option<(usize, u64)>,
    on: bool,
    facts: Vec<(u32, BranchPair, Facts)>,
    /// Spans `[from, to)` as pairs.
    straight: Vec<(u32, BranchPair, Straight)>,
}

/// Slots of each table of a [`CodeCache`] (a power of two).
const CODE_CACHE: usize = 4096;

impl CodeCache {
    /// Empties the cache unless it holds `oracle`'s answers (or turns it off: no generation).
    fn prepare(&mut self, oracle: &dyn CodeOracle) {
        let Some(g) = oracle.generation() else {
            self.on = false;
            return;
        };
        let key = (oracle as *const dyn CodeOracle as *const () as usize, g);
        if self.of != Some(key) {
            // (no branch is from u64::MAX: instructions are aligned)
            let none = BranchPair { from: u64::MAX, to: u64::MAX };
            self.facts.clear();
            self.facts.resize(CODE_CACHE, (0, none, Facts { kind: None, ret: None, after_call: None }));
            self.straight.clear();
            self.straight.resize(CODE_CACHE, (0, none, Straight::Unknown));
            self.of = Some(key);
        }
        self.on = true;
    }

    #[inline]
    fn slot(pid: u32, b: BranchPair) -> usize {
        let h = (b.from ^ b.to.rotate_left(23) ^ u64::from(pid)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        (h >> (64 - CODE_CACHE.trailing_zeros())) as usize
    }

    /// [`Facts::of`] the branch (after [`prepare`](Self::prepare) with `oracle`).
    #[inline(always)]
    fn facts(&mut self, pid: u32, b: BranchPair, oracle: &dyn CodeOracle) -> Facts {
        if self.on {
            let slot = &self.facts[Self::slot(pid, b)];
            if slot.0 == pid && slot.1 == b {
                return slot.2;
            }
        }
        self.facts_miss(pid, b, oracle)
    }

    #[cold]
    #[inline(never)]
    fn facts_miss(&mut self, pid: u32, b: BranchPair, oracle: &dyn CodeOracle) -> Facts {
        let f = Facts::of(pid, b, oracle);
        if self.on {
            self.facts[Self::slot(pid, b)] = (pid, b, f);
        }
        f
    }

    /// [`CodeOracle::straight_code`] (after [`prepare`](Self::prepare) with `oracle`).
    #[inline]
    fn straight(&mut self, pid: u32, from: u64, to: u64, oracle: &dyn CodeOracle) -> Straight {
        if !self.on {
            return oracle.straight_code(pid, from, to);
        }
        let span = BranchPair { from, to };
        let slot = &mut self.straight[Self::slot(pid, span)];
        if slot.0 == pid && slot.1 == span {
            return slot.2;
        }
        let r = oracle.straight_code(pid, from, to);
        *slot = (pid, span, r);
        r
    }
}

/// The synthesized samples of a window (module docs): the pause stack unwound backwards
/// through the branches, a sample every `depth` branches, each validated by [`validate`].
fn synthesize(
    w: &SynthWindow<'_>,
    buf: SynthBuf<'_>,
    cfg: &JoinConfig,
    oracle: &dyn CodeOracle,
    shadow: &mut Vec<u64>,
    stats: &mut JoinStats,
    out: &mut dyn FnMut(&Joined<'_>),
) {
    let (ring, d, pid) = (w.ring, cfg.depth, w.s.pid);
    let m = ring.len();
    if d == 0 || m <= d {
        return;
    }
    if w.leaf_frame_missing {
        stats.synth_stops.bump(SynthStop::LeafFrameMissing);
        return;
    }
    // Return addresses, the innermost last.
    let callers = buf.callers;
    callers.clear();
    callers.extend(w.s.stack[1..].iter().rev());
    let cache = buf.cache;
    cache.prepare(oracle);
    let mut walk = UndoWalk { ring, pid, oracle };
    // The stack is rebuilt from a complete pause stack: its leaf frame cannot be missing.
    let vcfg = JoinConfig { allow_missing_leaf_frame: false, ..*cfg };
    // Branches ring[undone..] are undone: the stack is the one before ring[undone] ran.
    let mut undone = m;
    for k in 1..=cfg.synth_samples {
        // The point: the source of branch p, before it ran.
        let Some(p) = m.checked_sub(k * d).filter(|&p| p >= 1) else { break };
        if let Err(r) = walk.undo_to(&mut undone, p, callers, cache) {
            stats.synth_stops.bump(r);
            return;
        }
        buf.stack.clear();
        buf.stack.push(ring[p].from);
        buf.stack.extend(callers.iter().rev());
        buf.branches.clear();
        buf.branches.extend(ring[p.saturating_sub(d)..p].iter().rev());
        // Undoing the sample's own branches (the next sample's walk, done now) proves what
        // its validation would check: every call matched by its return or the top return
        // address of the stack, every return landing after a call, all code known. Only where
        // that walk stops is the sample validated (and the next one, if any, not made).
        let stop = walk.undo_to(&mut undone, p.saturating_sub(d), callers, cache).err();
        let check = if cfg.validate && stop.is_some() {
            // its leaf and branches lie in the segment the decoder walked: the straight code
            // between them is proven
            match validate(buf.stack, buf.branches, &[], Walked::ALL, pid, oracle, &vcfg, shadow, cache) {
                Ok(c) => c,
                Err(r) => {
                    stats.synth_rejected.bump(r);
                    return;
                }
            }
        } else {
            Check::default()
        };
        stats.synthesized += 1;
        stats.synth_unverified += u64::from(check.unverified);
        out(&Joined { cpu: w.cpu, pid, tid: w.s.tid, time: w.s.time, stack: buf.stack, branches: buf.branches, synth: k as u32 });
        if let Some(r) = stop {
            // The next sample's walk stops here (none is made past the last one).
            if k < cfg.synth_samples && m.checked_sub((k + 1) * d).is_some_and(|p| p >= 1) {
                stats.synth_stops.bump(r);
                return;
            }
            break;
        }
    }
    if let Some(r) = w.more {
        stats.synth_stops.bump(r);
    }
}

/// The synthesized samples' backward walk over a window's branches (oldest first in `ring`),
/// each branch's facts from the code cache.
struct UndoWalk<'a> {
    ring: &'a [BranchPair],
    pid: u32,
    oracle: &'a dyn CodeOracle,
}

impl UndoWalk<'_> {
    /// Undoes `ring[to..*undone]`, newest first, moving `undone` down: the stack (`callers`,
    /// the innermost last) becomes the one before `ring[to]` ran. Stops at the first branch
    /// that cannot be undone (it counts as undone).
    #[inline(always)]
    fn undo_to(&mut self, undone: &mut usize, to: usize, callers: &mut Vec<u64>, cache: &mut CodeCache) -> Result<(), SynthStop> {
        while *undone > to {
            *undone -= 1;
            let b = self.ring[*undone];
            let f = cache.facts(self.pid, b, self.oracle);
            match f.kind {
                Some(InsnKind::Other | InsnKind::CondBranch | InsnKind::Jump) => {}
                None => return Err(SynthStop::UnknownCode),
                Some(InsnKind::Call) => {
                    let ret = f.ret.ok_or(SynthStop::UnknownCode)?;
                    if callers.last() == Some(&ret) {
                        callers.pop();
                    } else {
                        return Err(SynthStop::CallMismatch);
                    }
                }
                Some(InsnKind::Return) => match f.after_call {
                    Some(true) => callers.push(b.to),
                    Some(false) => return Err(SynthStop::ReturnNotAfterCall),
                    None => return Err(SynthStop::UnknownCode),
                },
                Some(InsnKind::Exception | InsnKind::Flow) => return Err(SynthStop::ExceptionFlow),
            }
        }
        Ok(())
    }
}

/// Walk `[from, to)` and require straight-line code (no instruction that always changes the
/// flow). `Ok(false)` if some code was unknown.
fn straight_line(pid: u32, from: u64, to: u64, oracle: &dyn CodeOracle, max: u64, cache: &mut CodeCache) -> Result<bool, ()> {
    if to < from || to - from > max {
        return Err(());
    }
    match cache.straight(pid, from, to, oracle) {
        Straight::Yes => Ok(true),
        Straight::Unknown => Ok(false),
        Straight::Flow => Err(()),
    }
}

/// What the decoder's walk of a sample's trace proved: the straight code between each pair of
/// the newest `chain` branches (consecutive records of one decoded segment: the ranges
/// between them were walked), and, with `leaf`, from the newest branch's target to the leaf
/// (the leaf lies in that segment too: a synthesized sample's point).
#[derive(Debug, Clone, Copy)]
struct Walked {
    chain: usize,
    leaf: bool,
}

impl Walked {
    /// Nothing walked (branches from a branch unit: LBR, BRBE).
    const NOTHING: Walked = Walked { chain: 0, leaf: false };
    /// The leaf and every branch in one walked segment.
    const ALL: Walked = Walked { chain: usize::MAX, leaf: true };
}

/// Validate a hybrid sample; `branches` newest first, `types` empty or one per branch.
/// `walked`: what the decoder's walk proved (see [`Walked`]); those straight-code checks are
/// not repeated. The calls and returns are checked all the same.
#[allow(clippy::too_many_arguments)]
fn validate(
    stack: &[u64],
    branches: &[BranchPair],
    types: &[Option<InsnKind>],
    walked: Walked,
    pid: u32,
    oracle: &dyn CodeOracle,
    cfg: &JoinConfig,
    shadow: &mut Vec<u64>,
    cache: &mut CodeCache,
) -> Result<Check, RejectReason> {
    cache.prepare(oracle);
    let mut check = Check::default();
    if !walked.leaf {
        let leaf = stack[0];
        let target = branches[0].to;
        if leaf < target || leaf - target > cfg.max_straight_line {
            return Err(RejectReason::LeafBeforeTarget);
        }
        match straight_line(pid, target, leaf, oracle, cfg.max_straight_line, cache) {
            Ok(true) => {}
            Ok(false) => check.unverified = true,
            Err(()) => return Err(RejectReason::LeafNotReachable),
        }
    }
    // The chain: between consecutive branches (older.to .. newer.from) only straight code;
    // pairs the walk proved are skipped.
    for w in branches.windows(2).skip(walked.chain.saturating_sub(1)) {
        let (newer, older) = (w[0], w[1]);
        match straight_line(pid, older.to, newer.from, oracle, cfg.max_straight_line, cache) {
            Ok(true) => {}
            Ok(false) => check.unverified = true,
            Err(()) => return Err(RejectReason::BrokenChain),
        }
    }
    // Calls and returns, oldest first.
    shadow.clear();
    for (i, b) in branches.iter().enumerate().rev() {
        let facts = cache.facts(pid, *b, oracle);
        let code = facts.kind;
        let ty = types.get(i).copied().flatten();
        let kind = match (code, ty) {
            (Some(c), Some(t)) => {
                let class = |k: InsnKind| (k == InsnKind::Call, k == InsnKind::Return);
                if class(c) != class(t) {
                    return Err(RejectReason::BranchTypeMismatch);
                }
                Some(c)
            }
            (Some(c), None) => Some(c),
            (None, t) => {
                check.unverified = true;
                t
            }
        };
        match kind {
            None => {
                check.unverified = true;
                return Ok(check);
            }
            // (the type stands in for unknown code)
            Some(InsnKind::Call) => {
                match if code.is_some() { facts.ret } else { oracle.insn_len(pid, b.from).map(|n| b.from + n) } {
                    Some(ret) => shadow.push(ret),
                    None => {
                        check.unverified = true;
                        return Ok(check);
                    }
                }
            }
            Some(InsnKind::Return) => match shadow.pop() {
                Some(ret) if ret != b.to => return Err(RejectReason::ReturnMismatch),
                Some(_) => {}
                None => {
                    // Returned into a frame older than the window: it must follow a call.
                    match if code.is_some() { facts.after_call } else { oracle.after_call(pid, b.to) } {
                        Some(true) => {}
                        None => check.unverified = true,
                        Some(false) => return Err(RejectReason::ReturnNotAfterCall),
                    }
                }
            },
            Some(_) => {}
        }
    }
    // Open calls, newest first, against stack[1..].
    let callers = &stack[1..];
    let open = shadow.iter().rev();
    let exact = open.clone().zip(callers).all(|(a, b)| a == b);
    if !exact {
        // The leaf's own return address may be missing (no frame record yet).
        let skipped = open.skip(1).zip(callers).all(|(a, b)| a == b);
        if cfg.allow_missing_leaf_frame && skipped && !shadow.is_empty() {
            check.leaf_frame_missing = true;
        } else {
            return Err(RejectReason::StackMismatch);
        }
    }
    Ok(check)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A segment's newest branches, newest first, whatever the ring's head: fewer than it
    /// holds, all, more than it holds; before and after the ring wrapped.
    #[test]
    fn segment_newest_branches() {
        let b = |i: u64| BranchPair { from: i, to: i + 1 };
        let mut g = Segment {
            time: 0,
            ts_known: false,
            ring: Vec::new(),
            head: 0,
            broken: false,
            throttled: false,
            window_start: false,
            ctx: None,
            dropped: false,
        };
        let cap = 5;
        for pushed in 0..13u64 {
            for n in 0..8 {
                let mut got = vec![b(99)];
                g.newest_into(&mut got, n);
                // the truth: the newest `cap` pushed, newest first
                let want: Vec<BranchPair> = std::iter::once(b(99)).chain((0..pushed).rev().take(cap.min(n)).map(b)).collect();
                assert_eq!(got, want, "{pushed} pushed, {n} wanted");
            }
            g.push(b(pushed), cap);
        }
    }

    /// A toy code image: explicit kinds at addresses, `Other` elsewhere in [lo, hi).
    struct Toy {
        lo: u64,
        hi: u64,
        kinds: HashMap<u64, InsnKind>,
    }

    impl CodeOracle for Toy {
        fn insn_kind(&self, _pid: u32, addr: u64) -> Option<InsnKind> {
            if addr < self.lo || addr >= self.hi {
                return None;
            }
            Some(*self.kinds.get(&addr).unwrap_or(&InsnKind::Other))
        }
    }

    // Program: main 0x1000.. calls f at 0x1010 (bl f -> 0x2000), f loops with b.cond at
    // 0x2010 -> 0x2000, f calls g at 0x2020 (bl -> 0x3000), g returns at 0x3008 -> 0x2024,
    // jump at 0x2030 -> 0x2040, ret at 0x2050 -> 0x1014.
    fn toy() -> Toy {
        let kinds = HashMap::from([
            (0x1010, InsnKind::Call),
            (0x2010, InsnKind::CondBranch),
            (0x2020, InsnKind::Call),
            (0x3008, InsnKind::Return),
            (0x2030, InsnKind::Jump),
            (0x2050, InsnKind::Return),
            (0x1030, InsnKind::Jump),
        ]);
        Toy { lo: 0x1000, hi: 0x4000, kinds }
    }

    /// A random number below its argument.
    type Draw<'a> = dyn FnMut(u64) -> u64 + 'a;

    /// A random path of `len` branches from `pc` through toy code: the next branch is the
    /// first flow instruction at most `reach - 1` instructions on, else a new one of a random
    /// kind; a call pushes its return address on `stack`, a return goes to the top of it (one
    /// in `corrupt` to new code instead), other branches to new code (`alloc`, which may draw
    /// from `next`). Returns the path and where it ends.
    #[allow(clippy::too_many_arguments)]
    fn toy_path(
        next: &mut Draw<'_>,
        alloc: &mut dyn FnMut(&mut Draw<'_>) -> u64,
        kinds: &mut HashMap<u64, InsnKind>,
        stack: &mut Vec<u64>,
        mut pc: u64,
        len: u64,
        reach: u64,
        corrupt: u64,
    ) -> (Vec<BranchPair>, u64) {
        let mut path = Vec::new();
        for _ in 0..len {
            let mut from = pc + 4 * next(reach);
            if let Some(a) = (pc..=from).step_by(4).find(|a| kinds.get(a).is_some_and(|k: &InsnKind| !k.is_straight())) {
                from = a;
            }
            let kind = *kinds.entry(from).or_insert(match next(20) {
                0 => InsnKind::Exception,
                1..7 => InsnKind::Call,
                7..13 => InsnKind::Return,
                _ => InsnKind::Jump,
            });
            let to = match kind {
                InsnKind::Call => {
                    stack.push(from + 4);
                    alloc(next)
                }
                InsnKind::Return => match stack.pop() {
                    Some(r) if next(corrupt) > 0 => r,
                    _ => alloc(next),
                },
                _ => alloc(next),
            };
            path.push(bp(from, to));
            pc = to;
        }
        (path, pc)
    }

    fn bp(from: u64, to: u64) -> BranchPair {
        BranchPair { from, to }
    }

    /// Window branches of the toy's path main->f (loop twice)->g->ret->jump, sampled in f at
    /// 0x2044 whose caller return address is 0x1014.
    fn window_path() -> Vec<BranchPair> {
        vec![
            bp(0x1010, 0x2000),
            bp(0x2010, 0x2000),
            bp(0x2010, 0x2000),
            bp(0x2020, 0x3000),
            bp(0x3008, 0x2024),
            bp(0x2030, 0x2040),
        ]
    }

    fn run(events: &[Ev], cfg: JoinConfig) -> (Vec<(i32, u64, Vec<BranchPair>)>, JoinStats) {
        let oracle = toy();
        let mut j = Joiner::new(cfg);
        let mut got = Vec::new();
        let mut out = |s: &Joined<'_>| got.push((s.cpu, s.time, s.branches.to_vec()));
        for e in events {
            match e {
                Ev::Win(cpu, t, brs) => {
                    j.begin_segment(*cpu, *t, true, &oracle, &mut out);
                    for b in brs {
                        j.branch(*cpu, *b);
                    }
                    j.end_segment(*cpu);
                }
                Ev::Sample(cpu, t, stack) => j.sample(*cpu, 1, 1, *t, stack, &oracle, &mut out),
            }
        }
        j.flush(&oracle, &mut out);
        let st = *j.stats();
        (got, st)
    }

    #[derive(Clone)]
    enum Ev {
        Win(i32, u64, Vec<BranchPair>),
        Sample(i32, u64, Vec<u64>),
    }

    fn newest_first(v: &[BranchPair]) -> Vec<BranchPair> {
        v.iter().rev().copied().collect()
    }

    /// Branches handed over in pieces (`Joiner::branches`, longer and shorter than the depth)
    /// join exactly as the same branches one by one.
    #[test]
    fn branches_in_pieces_equal_one_by_one() {
        let cfg = JoinConfig { depth: 4, validate: false, ..JoinConfig::default() };
        let brs: Vec<BranchPair> = (0..11u64).map(|i| bp(0x1000 + 16 * i, 0x2000 + 16 * i)).collect();
        let oracle = toy();
        let mut outs = Vec::new();
        for pieces in [vec![11], vec![1, 10], vec![3, 3, 3, 2], vec![10, 1], vec![0, 2, 9]] {
            let mut j = Joiner::new(cfg);
            let mut got = Vec::new();
            let mut out = |s: &Joined<'_>| got.push(s.branches.to_vec());
            j.begin_segment(0, 10, true, &oracle, &mut out);
            let mut rest = &brs[..];
            for n in pieces {
                let (a, b) = rest.split_at(n);
                j.branches(0, a);
                rest = b;
            }
            j.end_segment(0);
            j.sample(0, 1, 1, 20, &[0x3000], &oracle, &mut out);
            j.flush(&oracle, &mut out);
            outs.push(got);
        }
        let (one_by_one, _) = run(&[Ev::Win(0, 10, brs.clone()), Ev::Sample(0, 20, vec![0x3000])], cfg);
        let want: Vec<Vec<BranchPair>> = one_by_one.into_iter().map(|g| g.2).collect();
        assert_eq!(want, vec![newest_first(&brs[7..])]);
        for got in outs {
            assert_eq!(got, want);
        }
    }

    /// A correct sample joins with its window's branches newest first; the depth limit keeps
    /// the newest N.
    #[test]
    fn joins_window_newest_first_with_depth() {
        let w = window_path();
        let evs = [Ev::Win(0, 10, w.clone()), Ev::Sample(0, 20, vec![0x2044, 0x1014])];
        let (got, st) = run(&evs, JoinConfig::default());
        assert_eq!(got, vec![(0, 20, newest_first(&w))]);
        assert_eq!((st.joined, st.rejected.total(), st.unverified), (1, 0, 0));
        let (got, _) = run(&evs, JoinConfig { depth: 2, ..Default::default() });
        assert_eq!(got[0].2, vec![bp(0x2030, 0x2040), bp(0x3008, 0x2024)]);
    }

    /// Windows and samples of two CPUs interleaved in any order across CPUs (and samples
    /// arriving before or after their window) give the same joins.
    #[test]
    fn interleavings_across_cpus_are_equivalent() {
        let w = window_path();
        let mut w2 = w.clone();
        w2.remove(0); // a different window content on cpu 1
        let s = vec![0x2044, 0x1014];
        let cpu0 =
            [Ev::Win(0, 10, w.clone()), Ev::Sample(0, 20, s.clone()), Ev::Win(0, 30, w2.clone()), Ev::Sample(0, 40, s.clone())];
        let cpu1 =
            [Ev::Win(1, 12, w2.clone()), Ev::Sample(1, 22, s.clone()), Ev::Win(1, 32, w.clone()), Ev::Sample(1, 42, s.clone())];
        let expect = {
            let mut e = vec![
                (0, 20, newest_first(&w)),
                (0, 40, newest_first(&w2)),
                (1, 22, newest_first(&w2)),
                (1, 42, newest_first(&w)),
            ];
            e.sort_by_key(|x| (x.0, x.1));
            e
        };
        // All merges of the two per-CPU sequences (each kept in order), plus per CPU the
        // variant where samples arrive late (after the next window).
        let late0 = [cpu0[0].clone(), cpu0[2].clone(), cpu0[1].clone(), cpu0[3].clone()];
        for a in [&cpu0[..], &late0[..]] {
            let n = a.len() + cpu1.len();
            for mask in 0u32..(1 << n) {
                if mask.count_ones() as usize != a.len() {
                    continue;
                }
                let (mut i, mut k) = (0, 0);
                let mut evs = Vec::new();
                for bit in 0..n {
                    if mask & (1 << bit) != 0 {
                        evs.push(a[i].clone());
                        i += 1;
                    } else {
                        evs.push(cpu1[k].clone());
                        k += 1;
                    }
                }
                let (mut got, st) = run(&evs, JoinConfig::default());
                got.sort_by_key(|x| (x.0, x.1));
                assert_eq!(got, expect, "mask {mask:b}");
                assert_eq!(st.rejected.total(), 0);
            }
        }
    }

    /// A pause whose window was lost is rejected (it must not take the previous pause's window),
    /// and the samples around it still join.
    #[test]
    fn lost_window_rejected_without_poisoning_neighbours() {
        let w = window_path();
        let s = vec![0x2044, 0x1014];
        let evs = [
            Ev::Win(0, 10, w.clone()),
            Ev::Sample(0, 20, s.clone()),
            // window at 30 lost
            Ev::Sample(0, 40, s.clone()),
            Ev::Win(0, 50, w.clone()),
            Ev::Sample(0, 60, s.clone()),
        ];
        let (got, st) = run(&evs, JoinConfig::default());
        assert_eq!(got.iter().map(|g| g.1).collect::<Vec<_>>(), vec![20, 60]);
        assert_eq!(st.rejected.get(RejectReason::NoWindow), 1);
        // With the previous sample also lost, the age bound catches the stale window.
        let evs2 = [Ev::Win(0, 10, w.clone()), Ev::Sample(0, 40, s.clone())];
        let (got, st) = run(&evs2, JoinConfig { max_window_age: Some(15), ..Default::default() });
        assert!(got.is_empty());
        assert_eq!(st.rejected.get(RejectReason::StaleWindow), 1);
    }

    /// Each validation rule rejects a sample that breaks it, with its own reason.
    #[test]
    fn validation_rejects_by_reason() {
        let w = window_path();
        let cases: Vec<(Vec<u64>, Vec<BranchPair>, Option<RejectReason>)> = vec![
            (vec![0x2044, 0x1014], w.clone(), None),
            // Leaf before the newest target.
            (vec![0x2038, 0x1014], w.clone(), Some(RejectReason::LeafBeforeTarget)),
            // A jump (0x2030 is taken-type) between target 0x2024 and leaf 0x2034.
            (vec![0x2034, 0x1014], w[..5].to_vec(), Some(RejectReason::LeafNotReachable)),
            // Return from g to the wrong place.
            (
                vec![0x2044, 0x1014],
                {
                    let mut v = w.clone();
                    v[4] = bp(0x3008, 0x2028);
                    v
                },
                Some(RejectReason::ReturnMismatch),
            ),
            // Wrong caller in the stack (two open calls: f's return 0x1014, g's 0x2024).
            (vec![0x3004, 0x2024, 0x1018], vec![bp(0x1010, 0x2000), bp(0x2020, 0x3000)], Some(RejectReason::StackMismatch)),
            (vec![0x3004, 0x2024, 0x1014, 0x9999], vec![bp(0x1010, 0x2000), bp(0x2020, 0x3000)], None),
            // Leaf frame missing is tolerated (only the newest open call may be missing).
            (vec![0x2044], w.clone(), None),
            // Return out of the window to an address not after a call (0x2054-4 is Other).
            (vec![0x1020], vec![bp(0x2050, 0x1018)], Some(RejectReason::ReturnNotAfterCall)),
            // Return out of the window after the call at 0x1010.
            (vec![0x1020], vec![bp(0x2050, 0x1014)], None),
            // (A chain with a call between two consecutive branches of one segment cannot come
            // from the decoder; across segments it is rejected: `chain_checked_across_segments_only`.)
        ];
        // Strict mode: the leaf frame must be present.
        let strict = JoinConfig { allow_missing_leaf_frame: false, ..Default::default() };
        let (got, st) = run(&[Ev::Win(0, 1, w.clone()), Ev::Sample(0, 2, vec![0x2044, 0x1018])], strict);
        assert!(got.is_empty());
        assert_eq!(st.rejected.get(RejectReason::StackMismatch), 1);
        for (i, (stack, brs, want)) in cases.into_iter().enumerate() {
            let (got, st) = run(&[Ev::Win(0, 1, brs), Ev::Sample(0, 2, stack)], JoinConfig::default());
            match want {
                None => assert_eq!((got.len(), st.rejected.total()), (1, 0), "case {i}"),
                Some(r) => {
                    assert!(got.is_empty(), "case {i}");
                    assert_eq!(st.rejected.get(r), 1, "case {i}: {:?}", st.rejected);
                }
            }
        }
    }

    /// A window broken by a discontinuity, an empty stack and out-of-order samples are counted.
    #[test]
    fn discontinuity_empty_and_order() {
        let oracle = toy();
        let mut j = Joiner::new(JoinConfig::default());
        let mut n = 0;
        let mut out = |_: &Joined<'_>| n += 1;
        j.begin_segment(0, 1, true, &oracle, &mut out);
        j.branch(0, bp(0x1010, 0x2000));
        j.discontinuity(0);
        j.branch(0, bp(0x2010, 0x2000)); // ignored: no new window yet
        j.sample(0, 1, 1, 2, &[0x2004, 0x1014], &oracle, &mut out);
        j.sample(0, 1, 1, 3, &[], &oracle, &mut out);
        j.sample(0, 1, 1, 1, &[0x2004], &oracle, &mut out);
        j.flush(&oracle, &mut out);
        assert_eq!(n, 0);
        let st = j.stats();
        assert_eq!(st.rejected.get(RejectReason::BrokenWindow), 1);
        assert_eq!(st.rejected.get(RejectReason::EmptyStack), 1);
        assert_eq!(st.rejected.get(RejectReason::OutOfOrder), 1);
    }

    /// Samples are held until a later window proves their window complete, and memory stays
    /// bounded: the pending backlog forces resolution.
    #[test]
    fn waits_for_certainty_and_bounds_backlog() {
        let oracle = toy();
        let mut j = Joiner::new(JoinConfig { max_pending_samples: 2, ..Default::default() });
        let times = std::cell::RefCell::new(Vec::new());
        let mut out = |s: &Joined<'_>| times.borrow_mut().push(s.time);
        j.begin_segment(0, 10, true, &oracle, &mut out);
        for b in window_path() {
            j.branch(0, b);
        }
        j.sample(0, 1, 1, 20, &[0x2044, 0x1014], &oracle, &mut out);
        assert!(times.borrow().is_empty(), "window 10 could still be followed by one before 20");
        j.begin_segment(0, 30, true, &oracle, &mut out);
        assert_eq!(*times.borrow(), vec![20]);
        for t in [40, 50, 60] {
            j.sample(0, 1, 1, t, &[0x2044, 0x1014], &oracle, &mut out);
        }
        assert_eq!(j.stats().forced, 1);
    }

    /// A window made of several segments (trace restarted after an exception) joins as one
    /// chain; a broken older segment stops the chain there (partial), a broken newest one
    /// rejects the sample.
    #[test]
    fn segments_concatenate_and_break() {
        let oracle = toy();
        let w = window_path();
        let run_segs = |segs: &[(u64, &[BranchPair], bool)]| {
            let mut j = Joiner::new(JoinConfig::default());
            let got = std::cell::RefCell::new(Vec::new());
            let mut out = |s: &Joined<'_>| got.borrow_mut().push(s.branches.to_vec());
            for &(t, brs, broken) in segs {
                j.begin_segment(0, t, true, &oracle, &mut out);
                for b in brs {
                    j.branch(0, *b);
                }
                if broken {
                    j.discontinuity(0);
                }
            }
            j.sample(0, 1, 1, 100, &[0x2044, 0x1014], &oracle, &mut out);
            j.flush(&oracle, &mut out);
            (got.into_inner(), *j.stats())
        };
        let (got, st) = run_segs(&[(10, &w[..3], false), (20, &w[3..], false)]);
        assert_eq!(got, vec![newest_first(&w)]);
        assert_eq!(st.partial, 0);
        let (got, st) = run_segs(&[(10, &w[..3], true), (20, &w[3..], false)]);
        assert_eq!(got, vec![newest_first(&w[3..])]);
        assert_eq!(st.partial, 1);
        let (got, st) = run_segs(&[(10, &w[..3], false), (20, &w[3..], true)]);
        assert!(got.is_empty());
        assert_eq!(st.rejected.get(RejectReason::BrokenWindow), 1);
    }

    /// The straight code between branches is checked where the chain crosses from one
    /// segment to the next (the trace restarted: nothing was walked between), not between the
    /// records of one segment, which the decoder made from ranges it walked.
    #[test]
    fn chain_checked_across_segments_only() {
        let oracle = toy();
        // A call (0x2020) lies between 0x2000 and 0x2030: no straight code.
        let (a, b) = (bp(0x1010, 0x2000), bp(0x2030, 0x2040));
        let run = |segs: &[&[BranchPair]]| {
            let mut j = Joiner::new(JoinConfig::default());
            let mut n = 0;
            let mut out = |_: &Joined<'_>| n += 1;
            for (i, brs) in segs.iter().enumerate() {
                j.begin_segment(0, 10 * (i as u64 + 1), true, &oracle, &mut out);
                j.branches(0, brs);
            }
            j.sample(0, 1, 1, 100, &[0x2044, 0x1014], &oracle, &mut out);
            j.flush(&oracle, &mut out);
            (n, j.stats().rejected.get(RejectReason::BrokenChain))
        };
        assert_eq!(run(&[&[a], &[b]]), (0, 1), "across a restart the code is asked");
        assert_eq!(run(&[&[a, b]]), (1, 0), "one decoded segment: the walk is the proof");
    }

    /// An idle CPU's sample is resolved by the driver's "trace complete until" watermark
    /// without waiting for a later window; samples after the watermark still wait.
    #[test]
    fn watermark_resolves_idle_cpu() {
        let oracle = toy();
        let mut j = Joiner::new(JoinConfig::default());
        let got = std::cell::RefCell::new(Vec::new());
        let mut out = |s: &Joined<'_>| got.borrow_mut().push(s.time);
        j.begin_segment(0, 10, true, &oracle, &mut out);
        for b in window_path() {
            j.branch(0, b);
        }
        j.sample(0, 1, 1, 20, &[0x2044, 0x1014], &oracle, &mut out);
        j.sample(0, 1, 1, 40, &[0x2044, 0x1014], &oracle, &mut out);
        j.trace_complete_until(0, 30, &oracle, &mut out);
        assert_eq!(*got.borrow(), vec![20]);
        assert_eq!(j.stats().rejected.total(), 0);
    }

    /// Without code the checks are skipped and the sample counted as unverified.
    #[test]
    fn no_code_is_unverified() {
        let mut j = Joiner::new(JoinConfig::default());
        let mut n = 0;
        let mut out = |_: &Joined<'_>| n += 1;
        j.begin_segment(0, 1, true, &NoCode, &mut out);
        j.branch(0, bp(0x10, 0x20));
        j.sample(0, 1, 1, 2, &[0x24], &NoCode, &mut out);
        j.flush(&NoCode, &mut out);
        assert_eq!(n, 1);
        assert_eq!(j.stats().unverified, 1);
    }

    /// One window of the toy path (Trace Info before it), its pause sample, synthesized
    /// samples collected as (synth, stack, branches).
    type Synth = Vec<(u32, Vec<u64>, Vec<BranchPair>)>;
    fn synth_run(cfg: JoinConfig, stack: &[u64], window_start: bool) -> (Synth, JoinStats) {
        synth_run_path(cfg, &window_path(), stack, window_start)
    }
    fn synth_run_path(cfg: JoinConfig, path: &[BranchPair], stack: &[u64], window_start: bool) -> (Synth, JoinStats) {
        let oracle = toy();
        let mut j = Joiner::new(cfg);
        let mut got = Vec::new();
        let mut out = |s: &Joined<'_>| got.push((s.synth, s.stack.to_vec(), s.branches.to_vec()));
        if window_start {
            j.trace_info(0);
        }
        j.begin_segment(0, 10, true, &oracle, &mut out);
        j.branches(0, path);
        j.end_segment(0);
        j.sample(0, 1, 1, 20, stack, &oracle, &mut out);
        j.flush(&oracle, &mut out);
        (got, *j.stats())
    }

    /// Depth 2 over the toy's 6 branches: floor(5 / 2) = 2 synthesized samples, worked out by
    /// hand from the toy's code: at g's ret (0x3008, g called from f at 0x2020, f from main)
    /// after f's call of g and its loop branch; at f's loop branch (0x2010) after f's second
    /// iteration and main's call of f.
    #[test]
    fn synthesized_samples_unwind_the_pause_stack() {
        let cfg = JoinConfig { depth: 2, synth_samples: 8, ..Default::default() };
        let (got, st) = synth_run(cfg, &[0x2044, 0x1014], true);
        let w = window_path();
        assert_eq!(
            got,
            vec![
                (0, vec![0x2044, 0x1014], vec![w[5], w[4]]),
                (1, vec![0x3008, 0x2024, 0x1014], vec![w[3], w[2]]),
                (2, vec![0x2010, 0x1014], vec![w[1], w[0]]),
            ]
        );
        assert_eq!((st.joined, st.synthesized, st.synth_rejected.total(), st.synth_stops.total()), (1, 2, 0, 0), "{st:?}");
        // Off: the pause sample alone.
        let (got, st) = synth_run(JoinConfig { synth_samples: 0, ..cfg }, &[0x2044, 0x1014], true);
        assert_eq!((got.len(), st.synthesized), (1, 0));
        // Depth 5: floor(5 / 5) = 1, with the one branch before the point.
        let (got, _) = synth_run(JoinConfig { depth: 5, ..cfg }, &[0x2044, 0x1014], true);
        assert_eq!(got[1..], [(1, vec![0x2010, 0x1014], vec![w[0]])]);
    }

    /// A wrong caller below the pause's branches: the pause sample cannot see it, the first
    /// synthesized sample neither, the second (main's call of f) is rejected by the pause
    /// sample's validation and the synthesis stops there.
    #[test]
    fn synthesized_samples_are_validated() {
        let cfg = JoinConfig { depth: 2, synth_samples: 8, ..Default::default() };
        let (got, st) = synth_run(cfg, &[0x2044, 0x5550], true);
        assert_eq!(got.len(), 2);
        assert_eq!((st.synthesized, st.synth_rejected.get(RejectReason::StackMismatch)), (1, 1), "{st:?}");
    }

    /// A synthesized sample is validated only where undoing its own branches stops: where
    /// that walk succeeds, the validation it stands for must pass. Random calls, returns and
    /// jumps through fresh code, some returns and pause stacks corrupted; every sample made is
    /// checked against `validate` (which the walk replaces), and the runs must reach samples
    /// both ways (proven, and validated after a stop).
    #[test]
    fn undone_branches_prove_the_validation() {
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move |n: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % n
        };
        let (mut proven, mut stopped, mut rejected) = (0, 0, 0);
        for _ in 0..400 {
            let mut kinds = HashMap::new();
            let mut fresh = 0x10_0000u64;
            let mut alloc = |n: u64| {
                fresh += n * 4 + 0x100;
                fresh
            };
            // Callers older than the window: call sites, their return addresses on the stack.
            // (An exception's branch, which validation lets pass and the walk stops at, goes to
            // fresh code like a jump.)
            let mut stack: Vec<u64> = Vec::new();
            for _ in 0..next(4) {
                let site = alloc(1);
                kinds.insert(site, InsnKind::Call);
                stack.push(site + 4);
            }
            let pc = alloc(8);
            let len = next(60) + 4;
            let (path, pc) = toy_path(&mut next, &mut |_: &mut Draw<'_>| alloc(8), &mut kinds, &mut stack, pc, len, 4, 40);
            let mut pause = vec![pc];
            pause.extend(stack.iter().rev());
            if pause.len() > 1 && next(10) == 0 {
                let i = 1 + next(pause.len() as u64 - 1) as usize;
                pause[i] += 8;
            }
            let oracle = Toy { lo: 0x1000, hi: u64::MAX, kinds };
            let cfg = JoinConfig { depth: 1 + next(6) as usize, synth_samples: 64, ..Default::default() };
            let mut j = Joiner::new(cfg);
            let mut got = Vec::new();
            let mut out = |s: &Joined<'_>| got.push((s.synth, s.stack.to_vec(), s.branches.to_vec()));
            j.trace_info(0);
            j.begin_segment(0, 10, true, &oracle, &mut out);
            j.branches(0, &path);
            j.end_segment(0);
            j.sample(0, 1, 1, 20, &pause, &oracle, &mut out);
            j.flush(&oracle, &mut out);
            let vcfg = JoinConfig { allow_missing_leaf_frame: false, ..cfg };
            for (k, stack, branches) in got.iter().filter(|g| g.0 > 0) {
                let r =
                    validate(stack, branches, &[], Walked::ALL, 1, &oracle, &vcfg, &mut Vec::new(), &mut CodeCache::default());
                assert!(r.is_ok_and(|c| !c.unverified && !c.leaf_frame_missing), "sample {k}: {r:?} {stack:x?} {branches:x?}");
            }
            let st = j.stats();
            proven += st.synthesized;
            stopped += st.synth_stops.total() - st.synth_stops.get(SynthStop::BranchLimit);
            rejected += st.synth_rejected.total();
        }
        assert!(proven > 500 && stopped > 20 && rejected > 20, "{proven} {stopped} {rejected}");
    }

    /// The cache of the code's answers ([`CodeCache`]) answers as the oracle
    /// does: one joiner over many windows whose branches recur in a small code region (with
    /// an oracle that reports a generation) makes the same samples and counts as a joiner whose
    /// oracle forbids caching; every 97 windows the code changes (new kinds at the same
    /// addresses) under a new generation.
    #[test]
    fn undo_cache_answers_as_the_oracle() {
        struct Versioned {
            toy: RefCell<Toy>,
            generation: Cell<u64>,
        }
        impl CodeOracle for Versioned {
            fn insn_kind(&self, pid: u32, addr: u64) -> Option<InsnKind> {
                self.toy.borrow().insn_kind(pid, addr)
            }
            fn generation(&self) -> Option<u64> {
                Some(self.generation.get())
            }
        }
        use std::cell::{Cell, RefCell};
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut next = move |n: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % n
        };
        let versioned =
            Versioned { toy: RefCell::new(Toy { lo: 0x1000, hi: u64::MAX, kinds: HashMap::new() }), generation: Cell::new(0) };
        let cfg = JoinConfig { depth: 3, synth_samples: 64, ..Default::default() };
        let (mut cached, mut plain) = (Joiner::new(cfg), Joiner::new(cfg));
        let (mut got_cached, mut got_plain) = (Vec::new(), Vec::new());
        for w in 0..600u64 {
            if w % 97 == 0 {
                versioned.toy.borrow_mut().kinds.clear();
                versioned.generation.set(versioned.generation.get() + 1);
            }
            let mut kinds = versioned.toy.borrow().kinds.clone();
            // addresses recur: 512 places for code
            let mut fresh = 0x10_0000 + 4 * next(512);
            let mut alloc = |step: u64| {
                fresh = 0x10_0000 + (fresh - 0x10_0000 + 4 * (1 + step)) % 0x800;
                fresh
            };
            let mut stack: Vec<u64> = Vec::new();
            for _ in 0..next(4) {
                let site = alloc(next(8));
                if *kinds.entry(site).or_insert(InsnKind::Call) == InsnKind::Call {
                    stack.push(site + 4);
                }
            }
            let pc = alloc(next(8));
            let len = next(60) + 4;
            let (path, pc) =
                toy_path(&mut next, &mut |next: &mut Draw<'_>| alloc(next(8)), &mut kinds, &mut stack, pc, len, 3, 20);
            let mut pause = vec![pc];
            pause.extend(stack.iter().rev());
            let plain_oracle = Toy { lo: 0x1000, hi: u64::MAX, kinds: kinds.clone() };
            if kinds.len() != versioned.toy.borrow().kinds.len() {
                // new kinds where the toy said `Other`: other code
                versioned.generation.set(versioned.generation.get() + 1);
            }
            versioned.toy.borrow_mut().kinds = kinds;
            let t = 100 * w;
            for (j, oracle, got) in
                [(&mut cached, &versioned as &dyn CodeOracle, &mut got_cached), (&mut plain, &plain_oracle, &mut got_plain)]
            {
                let mut out = |s: &Joined<'_>| got.push((w, s.synth, s.stack.to_vec(), s.branches.to_vec()));
                j.trace_info(0);
                j.begin_segment(0, t + 10, true, oracle, &mut out);
                j.branches(0, &path);
                j.end_segment(0);
                j.sample(0, 1, 1, t + 20, &pause, oracle, &mut out);
                j.flush(oracle, &mut out);
            }
        }
        assert_eq!(got_cached, got_plain);
        assert_eq!(cached.stats(), plain.stats());
        let st = cached.stats();
        assert!(
            st.synthesized > 2000 && st.synth_stops.total() > 100,
            "{} {:?} {:?} {:?}",
            st.synthesized,
            st.synth_stops,
            st.rejected,
            st.joined
        );
    }

    /// A reason's counter is its place in the display order (the counts' `iter`, the summary).
    #[test]
    fn reason_counters_follow_the_display_order() {
        let mut r = RejectCounts::default();
        for (i, &k) in RejectReason::ALL.iter().enumerate() {
            (0..=i).for_each(|_| r.bump(k));
        }
        assert!(r.iter().enumerate().all(|(i, (k, n))| k == RejectReason::ALL[i] && n == i as u64 + 1));
        let mut s = SynthStopCounts::default();
        for (i, &k) in SynthStop::ALL.iter().enumerate() {
            (0..=i).for_each(|_| s.bump(k));
        }
        assert!(s.iter().enumerate().all(|(i, (k, n))| k == SynthStop::ALL[i] && n == i as u64 + 1));
        assert_eq!(s.total(), (1..=SynthStop::ALL.len() as u64).sum::<u64>());
    }

    /// The ring's bound: depth * (1 + synth_samples), at most 65,536 branches unless the depth
    /// alone is more.
    #[test]
    fn synthesis_ring_is_bounded() {
        let c = |depth, synth_samples| JoinConfig { depth, synth_samples, ..Default::default() }.ring_cap();
        assert_eq!(
            (c(32, 0), c(32, 64), c(4096, 64), c(100_000, 64), c(usize::MAX, 64)),
            (32, 2080, 65_536, 100_000, usize::MAX)
        );
    }

    /// The ring keeps depth * (1 + synth_samples) branches: one synthesized sample, and the
    /// window's older branches counted as beyond the limit; a segment that is not the start of
    /// its window (no Trace Info) counts as a restart.
    #[test]
    fn synthesis_stops_are_counted() {
        let cfg = JoinConfig { depth: 2, synth_samples: 1, ..Default::default() };
        let (got, st) = synth_run(cfg, &[0x2044, 0x1014], true);
        assert_eq!(got.len(), 2);
        assert_eq!(st.synth_stops.get(SynthStop::BranchLimit), 1, "{st:?}");
        let cfg = JoinConfig { depth: 2, synth_samples: 8, ..Default::default() };
        let (got, st) = synth_run(cfg, &[0x2044, 0x1014], false);
        assert_eq!(got.len(), 3);
        assert_eq!(st.synth_stops.get(SynthStop::TraceRestart), 1, "{st:?}");
        // Sampled in g before its frame record: the pause stack lacks f's return address
        // (accepted as a missing leaf frame), so there is no stack to unwind from.
        let (got, st) = synth_run_path(JoinConfig { depth: 1, ..cfg }, &window_path()[..4], &[0x3004, 0x1014], true);
        assert_eq!((got.len(), st.leaf_frame_missing), (1, 1), "{st:?}");
        assert_eq!(st.synth_stops.get(SynthStop::LeafFrameMissing), 1, "{st:?}");
    }
}
