//! The one pipeline both drivers feed: AUX bytes -> per-CPU trace decoder -> windows of branch
//! records -> join with pause samples -> [`HybridProfile`] and [`ContextTrie`].
//!
//! The live driver (`etm-bpf run`) and the replay driver (`etm-bpf replay`) call
//! [`Pipeline::push`] with the same [`SessionEvent`]s in arrival order; everything after the
//! syscalls is this code, so a replay reproduces a live run and is deterministic.
//!
//! Branch history sources:
//! * ETM/ETE: AUX data is decoded per AUX buffer by a [`WindowDecoder`] (the `etm_decode`
//!   decoder, or a test double through [`DecoderFactory`]); windows are joined with pause
//!   samples by [`Joiner`].
//! * LBR/BRBE: samples carry their own branch records; they are validated with the same rules.
//! * none: stack-only samples go straight to the profile and the trie.
//!
//! Fault tolerance: an AUX record flagged truncated, a record shorter than announced,
//! `PERF_RECORD_LOST`, decode errors and windows without sync are counted in
//! [`PipelineStats`]; the decoder of the affected buffer is reset so the next window decodes
//! afresh, and the open window is marked broken so its branches are never attached to a pause.

use etm_profile::exact::IntMap;
use std::sync::Arc;

use etm_profile::{AddressResolver, BinaryInfo, HybridProfile, HybridSample, ProfileLimits};
use etm_stacks::{ContextTrie, Frame, FrameId, FrameTable};

use crate::aux::{AuxPlan, AuxStep, AuxTrack, run_step};
use crate::code::{CodeMap, Resolver};
pub use crate::exact::ExactFunction;
use crate::exact::ExactState;
use crate::image::ImageBytes;
use crate::isa;
use crate::join::{CpuMap, InsnKind, JoinConfig, JoinStats, Joined, Joiner, RejectCounts};
use crate::session::{
    AuxRecord, BranchPair, ClockParams, CodeArch, CpuTraceConfig, PauseSample, SessionEvent, SessionMeta, Sideband,
};
use crate::window::{DecoderFactory, DecoderShared, Discontinuity, WindowDecoder, WindowSink};

/// The session note that says whether trace timestamps date segments
/// ([`PipelineConfig::trace_timestamps`]).
pub const TRACE_TIMESTAMPS_NOTE: &str = "trace_timestamps";

/// Pipeline configuration.
#[derive(Clone)]
pub struct PipelineConfig {
    /// Per-CPU trace configuration (empty: no ETM in this session).
    pub cpus: Vec<CpuTraceConfig>,
    /// Trace timestamp -> perf clock; `None` = identity.
    pub clock: Option<ClockParams>,
    /// Trace timestamps are in the perf clock's timebase (every CPU's `ts_source` is 1):
    /// they date segments. Without (the SoC's timestamp generator: no FEAT_TRF), segments are
    /// dated by their AUX record's time, which only per-pause records make right.
    pub trace_timestamps: bool,
    /// Join settings (branch depth N, validation, bounds).
    pub join: JoinConfig,
    /// Profile memory bounds.
    pub profile: ProfileLimits,
    /// Context trie node bound.
    pub trie_nodes: usize,
    /// The trace decoder; `None` uses `etm_decode`.
    pub decoder: Option<Arc<dyn DecoderFactory>>,
    /// The instruction set of the code the checks decode; `None` with ETM CPUs means
    /// AArch64 (ETM exists on Arm only), otherwise branch records go unchecked (counted
    /// [`JoinStats::unverified`](crate::join::JoinStats::unverified)).
    pub arch: Option<CodeArch>,
    /// Exact per-function counts from the decoded ranges (self, inclusive, calls, coverage:
    /// `functions.csv`). Off saves their cost per decoded range (bench/README.md, "Replay").
    pub exact: bool,
    /// Threads decoding the AUX streams (each buffer on one, [`crate::pool`]); 1 decodes on
    /// the pipeline's thread. The profile is the same with any number; with more, what
    /// [`Pipeline::stats`], [`Pipeline::profile`] and [`Pipeline::trie`] show lags the pushed
    /// events (by the bounded queue) until [`Pipeline::finish`].
    pub decode_threads: usize,
}

impl Default for PipelineConfig {
    fn default() -> Self {
        PipelineConfig {
            cpus: Vec::new(),
            clock: None,
            trace_timestamps: true,
            join: JoinConfig::default(),
            profile: ProfileLimits::default(),
            trie_nodes: 1 << 20,
            decoder: None,
            arch: None,
            exact: true,
            decode_threads: 1,
        }
    }
}

impl PipelineConfig {
    /// The configuration a session's metadata implies (depth from `branch_depth`).
    pub fn from_meta(meta: &SessionMeta) -> Self {
        let mut c = PipelineConfig { cpus: meta.cpus.clone(), clock: meta.clock, arch: meta.arch, ..Default::default() };
        c.trace_timestamps = meta.notes.get(TRACE_TIMESTAMPS_NOTE).is_none_or(|v| v != "false");
        if meta.branch_depth > 0 {
            c.join.depth = meta.branch_depth as usize;
        }
        c
    }
}

/// Per-stage counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PipelineStats {
    /// AUX records pushed.
    pub aux_records: u64,
    /// AUX bytes decoded.
    pub aux_bytes: u64,
    /// AUX records flagged truncated by the kernel.
    pub aux_truncated: u64,
    /// AUX records with fewer bytes than announced (lost in copying/recording).
    pub aux_short: u64,
    /// AUX records flagged partial or collision.
    pub aux_partial_collision: u64,
    /// AUX records after which the decoder was reset because of COLLISION: a TRBE wrap or
    /// limit interrupt, after which trace may be lost and the stream resumes mid-packet
    /// (`trbe_report_wrap_event`).
    pub aux_collision_resets: u64,
    /// Raw AUX records of a per-thread buffer written by another CPU than the previous one:
    /// a new stream (perf decodes each fragment afresh, `cs_etm__queue_aux_fragment`).
    pub aux_cpu_changes: u64,
    /// AUX records in overwrite (snapshot) mode.
    pub aux_overwrite: u64,
    /// AUX records not decoded (no decoder available in this build).
    pub aux_undecoded: u64,
    /// AUX records that did not start where the previous one of their buffer ended.
    pub aux_gaps: u64,
    /// Decoder resets (after gaps).
    pub decoder_resets: u64,
    /// Overflows reported by the decoder.
    pub decode_overflows: u64,
    /// Sync losses / bytes skipped before sync reported by the decoder.
    pub decode_nosync: u64,
    /// Decode errors (bad packets, inconsistent image).
    pub decode_errors: u64,
    /// Trace that needed code that was not available.
    pub decode_nocode: u64,
    /// Trace of other processes' contexts (CONTEXTIDR of a thread not in the target), not
    /// followed.
    pub decode_foreign: u64,
    /// Trace-on events (window starts) seen.
    pub trace_on: u64,
    /// Branches decoded.
    pub branches: u64,
    /// Trace IDs without a known CPU (their data is ignored).
    pub unknown_trace_id: u64,
    /// Samples pushed.
    pub samples: u64,
    /// Samples that carried LBR/BRBE records (a branch stack, maybe empty).
    pub lbr_samples: u64,
    /// Of those, samples whose branch stack had no entry (`bpf_read_branch_records`
    /// returned 0): stack-only in effect ([`PipelineStats::branch_warning`]).
    pub lbr_empty: u64,
    /// Entries dropped as taken on a wrong speculative path (AMD LBRv2,
    /// `PERF_BR_SPEC_WRONG_PATH`).
    pub lbr_wrong_path: u64,
    /// Transaction-abort entries (Intel TSX, `abort`): the chain is cut there.
    pub lbr_tx_abort: u64,
    /// Entries with one end unknown (0: BRBE source-only or target-only records, a branch
    /// from or to a filtered exception level): the chain is cut there.
    pub lbr_partial_entries: u64,
    /// Entries older than a cut (an abort or a partial entry), dropped.
    pub lbr_cut_entries: u64,
    /// Samples whose branch flags did not match their branches one to one (flags ignored).
    pub lbr_flags_mismatch: u64,
    /// Stack-only samples (no branch source).
    pub stack_only_samples: u64,
    /// Sideband records pushed.
    pub sideband: u64,
    /// `PERF_RECORD_LOST` records.
    pub lost_records: u64,
    /// Records the kernel reported lost (sum of `lost`).
    pub lost_events: u64,
    /// Context-switch records.
    pub switches: u64,
    /// Throttle / unthrottle records.
    pub throttles: u64,
    /// Windows closed in other processes.
    pub window_ends: u64,
    /// Driver proofs that the trace up to a time was complete.
    pub trace_complete: u64,
    /// The join's counters (windows, joined, rejected by reason, ...).
    pub join: JoinStats,
    /// Pause samples added to the profile (synthesized ones: [`JoinStats::synthesized`]).
    pub profiled: u64,
    /// Decode jobs whose worker failed (a decoder panic, the thread gone): their data is
    /// lost, the buffer's open window broken ([`crate::pool`]).
    pub decode_worker_failures: u64,
    /// Profiled stacks cut at a return address not preceded by a call
    /// ([`CodeMap::checked_depth`]): the frames beyond it were not real callers.
    pub stacks_truncated: u64,
}

impl PipelineStats {
    /// Rejected samples by reason.
    pub fn rejected(&self) -> &RejectCounts {
        &self.join.rejected
    }

    /// A warning when most branch samples (of at least [`EMPTY_WARN_MIN`]) had an empty
    /// branch stack: the event was accepted but the unit records nothing (e.g. BRBE disabled
    /// by firmware at EL3/EL2, or filtered out), so the "branch" profile is stack-only.
    pub fn branch_warning(&self) -> Option<String> {
        (self.lbr_samples >= EMPTY_WARN_MIN && 2 * self.lbr_empty > self.lbr_samples).then(|| {
            format!(
                "{} of {} branch samples had an empty branch stack: the branch unit recorded nothing \
                 (BRBE disabled by firmware, or no user branches); the profile is stack-only in effect",
                self.lbr_empty, self.lbr_samples
            )
        })
    }
}

/// Branch samples needed before [`PipelineStats::branch_warning`] judges.
pub const EMPTY_WARN_MIN: u64 = 20;

/// The entries of an LBR/BRBE branch stack (newest first) that are taken branches of the
/// sampled thread's architectural path, with their unit-given kinds (`flags`: each entry's
/// `perf_branch_entry` flag word, or empty):
/// * wrong-path entries are dropped (`amd_pmu_lbr_read` keeps them with
///   `spec = PERF_BR_SPEC_WRONG_PATH`); the path around them is unbroken;
/// * a transaction abort (`abort`, Intel TSX: `from` is where the transaction aborted, not a
///   branch) cuts the chain: it and every older entry are dropped;
/// * an entry with one end 0 (`perf_entry_from_brbe_regset`: a source-only or target-only
///   BRBE record, the other end at a filtered exception level) cuts the chain likewise.
pub fn lbr_entries(
    branches: &[BranchPair],
    flags: &[u64],
    kept: &mut Vec<BranchPair>,
    types: &mut Vec<Option<InsnKind>>,
    stats: &mut PipelineStats,
) {
    kept.clear();
    types.clear();
    let flags = if flags.len() == branches.len() {
        flags
    } else {
        if !flags.is_empty() {
            stats.lbr_flags_mismatch += 1;
        }
        &[]
    };
    for (i, b) in branches.iter().enumerate() {
        let f = flags.get(i).map(|&f| isa::BranchFlags(f));
        if f.is_some_and(|f| f.wrong_path()) {
            stats.lbr_wrong_path += 1;
            continue;
        }
        let abort = f.is_some_and(|f| f.abort());
        if abort || b.from == 0 || b.to == 0 {
            if abort {
                stats.lbr_tx_abort += 1;
            } else {
                stats.lbr_partial_entries += 1;
            }
            stats.lbr_cut_entries += (branches.len() - i - 1) as u64;
            break;
        }
        kept.push(*b);
        types.push(f.and_then(|f| f.kind()));
    }
}

/// Names frames for the context trie.
pub trait FrameNamer {
    /// A frame for runtime address `addr`, resolved to `binary`/`link` if known.
    fn frame(&mut self, binary: Option<&BinaryInfo>, symbol: Option<&str>, link: u64, addr: u64) -> Frame;
    /// All frames of `addr` interned into `table` and appended to `out`, outermost first (a
    /// function, then the callees inlined at that address). The pipeline caches the result per
    /// resolved address (until [`Pipeline::clear_frame_cache`]). Default: the one
    /// [`FrameNamer::frame`].
    fn frame_ids(
        &mut self,
        binary: Option<&BinaryInfo>,
        symbol: Option<&str>,
        link: u64,
        addr: u64,
        table: &mut FrameTable,
        out: &mut Vec<FrameId>,
    ) {
        out.push(table.intern(self.frame(binary, symbol, link, addr)));
    }
}

/// Default frame names: the ELF function symbol if known, else `file+0xoffset`.
#[derive(Debug, Default)]
pub struct DefaultFrameNamer;

impl FrameNamer for DefaultFrameNamer {
    fn frame(&mut self, binary: Option<&BinaryInfo>, symbol: Option<&str>, link: u64, addr: u64) -> Frame {
        match (symbol, binary) {
            (Some(s), _) => Frame::new(s, None),
            (None, Some(b)) => Frame::new(format!("{}+{link:#x}", b.file_name()), None),
            (None, None) => Frame::new(format!("[unknown {addr:#x}]"), None),
        }
    }
}

/// A callback seeing every joined sample.
pub type Observer = Box<dyn FnMut(&Joined<'_>)>;

/// An event waiting for the join while its decode (or the decode before it) is on a worker.
enum Deferred {
    Aux(AuxRecord, AuxPlan, Option<crate::pool::Sent>),
    Sample(PauseSample),
    /// With the jobs it asked of the decoders (a trace-complete proof).
    Sideband(Sideband, Vec<crate::pool::Sent>),
    /// [`Pipeline::trace_complete_until`].
    Complete(Option<i32>, u64, Vec<crate::pool::Sent>),
    /// Jobs only (the decoders' finish).
    Jobs(Vec<crate::pool::Sent>),
}

/// Whether the last branches of AUX buffer `aux_cpu` are complete when the trace of `cpus`
/// is: a per-CPU buffer holds its CPU's trace, a per-thread buffer (-1) any CPU's.
fn completes(aux_cpu: i32, cpus: &[i32]) -> bool {
    aux_cpu < 0 || cpus.contains(&aux_cpu)
}

/// Per-AUX-buffer decoder state.
struct AuxState {
    decoder: Box<dyn WindowDecoder>,
    raw: bool,
    /// CPU that wrote the previous record (raw data of a per-thread buffer).
    source: i32,
}

/// The pipeline.
pub struct Pipeline {
    cfg: PipelineConfig,
    factory: Option<Arc<dyn DecoderFactory>>,
    /// What the decoders share (the block cache).
    shared: DecoderShared,
    aux: IntMap<i32, AuxState>,
    /// trace ID -> CPU.
    trace_cpu: IntMap<u8, i32>,
    joiner: Joiner,
    code: CodeMap,
    resolver: Resolver,
    profile: HybridProfile,
    trie: ContextTrie,
    frames: FrameTable,
    frame_cache: crate::frame_cache::FrameCache,
    callers: crate::code::CallerCache,
    namer: Box<dyn FrameNamer>,
    stats: PipelineStats,
    /// Per CPU: a trace-on was seen and the window has not been begun yet.
    pending_begin: CpuMap<bool>,
    /// Where each AUX buffer's records stand (planned when pushed).
    track: AuxTrack,
    /// The decode workers ([`PipelineConfig::decode_threads`] above 1) and the events queued
    /// for the join until their decode is back.
    pool: Option<crate::pool::Pool>,
    queue: std::collections::VecDeque<Deferred>,
    /// With a pool: the decode tapes received, replayed by the buffers' decoders.
    tapes: Option<crate::pool::Tapes>,
    scratch_frames: Vec<FrameId>,
    /// The CPUs an AUX record's windows touched (reused: no allocation per record).
    scratch_touched: Vec<i32>,
    /// An LBR/BRBE sample's entries kept, and what the unit says each branch was.
    scratch_lbr: Vec<BranchPair>,
    scratch_types: Vec<Option<InsnKind>>,
    observer: Option<Observer>,
    /// Exact instruction counts per function from the decoded ranges.
    exact: ExactState,
}

impl Pipeline {
    /// A pipeline with `cfg`.
    pub fn new(cfg: PipelineConfig) -> Self {
        let trace_cpu = cfg.cpus.iter().map(|c| (c.trace_id, c.cpu)).collect();
        let factory = cfg.decoder.clone().or_else(crate::decoder::default_factory);
        let arch = cfg.arch.or((!cfg.cpus.is_empty()).then_some(CodeArch::Aarch64));
        let code = CodeMap::new(arch);
        // (the decoded ranges feed the exact counts alone)
        let shared = DecoderShared::new(cfg.exact);
        let pool = match &factory {
            Some(f) if cfg.decode_threads > 1 && !cfg.cpus.is_empty() => {
                crate::pool::Pool::start(cfg.decode_threads, f.clone(), &cfg.cpus, code.clone(), shared.ranges)
            }
            _ => None,
        };
        let tapes = pool.as_ref().map(|_| crate::pool::Tapes::default());
        Pipeline {
            exact: ExactState::new(cfg.exact),
            joiner: Joiner::new(cfg.join),
            profile: HybridProfile::new(cfg.profile),
            trie: ContextTrie::new(cfg.trie_nodes),
            factory,
            shared,
            cfg,
            aux: IntMap::default(),
            trace_cpu,
            code,
            resolver: Resolver::default(),
            frames: FrameTable::new(),
            frame_cache: crate::frame_cache::FrameCache::default(),
            callers: crate::code::CallerCache::default(),
            namer: Box::new(DefaultFrameNamer),
            stats: PipelineStats::default(),
            pending_begin: CpuMap::default(),
            track: AuxTrack::default(),
            pool,
            queue: Default::default(),
            tapes,
            scratch_frames: Vec::new(),
            scratch_touched: Vec::new(),
            scratch_lbr: Vec::new(),
            scratch_types: Vec::new(),
            observer: None,
        }
    }

    /// The exact per-function instruction counts of the decoded trace, most first.
    pub fn exact_functions(&self) -> Vec<ExactFunction> {
        self.exact
            .counts
            .functions()
            .into_iter()
            .map(|f| {
                let (binary, function) = self.exact.names()[f.function as usize].clone();
                ExactFunction { binary, function, count: f }
            })
            .collect()
    }

    /// The instructions of each calling context of the decoded trace (the windows' visible
    /// call paths, outermost first, by function name).
    pub fn exact_contexts(&self) -> Vec<(Vec<&str>, u64)> {
        let name = |f: u32| self.exact.names()[f as usize].1.as_str();
        self.exact.counts.context_paths().into_iter().map(|(p, n)| (p.into_iter().map(name).collect(), n)).collect()
    }

    /// The calling contexts entered by a call in the decoded trace, by function name
    /// (outermost first), with their calls and instructions per call (most calls first).
    pub fn exact_context_calls(&self) -> Vec<(Vec<&str>, etm_profile::exact::ContextCalls)> {
        let name = |f: &u32| self.exact.names()[*f as usize].1.as_str();
        self.exact.counts.context_calls().into_iter().map(|c| (c.path.iter().map(name).collect(), c)).collect()
    }

    /// Whether exact counts are kept ([`PipelineConfig::exact`]).
    pub fn exact_enabled(&self) -> bool {
        self.cfg.exact
    }

    /// The totals behind [`exact_functions`](Self::exact_functions) (segments, instructions).
    pub fn exact_counts(&self) -> &etm_profile::exact::ExactCounts {
        &self.exact.counts
    }

    /// Use `namer` for context-trie frames (e.g. a blazesym symbolizer in the binary).
    pub fn set_frame_namer(&mut self, namer: Box<dyn FrameNamer>) {
        self.join_queued();
        self.namer = namer;
    }

    /// The trace clock's conversion to the perf clock from now on (AUX data pushed after
    /// this call): perf updates the ring's user page (`time_zero`, `time_mult`,
    /// `time_shift`) when the clock source changes, and a driver that re-reads it hands the
    /// new values over here. Data already pushed keeps the times it was given.
    pub fn set_clock(&mut self, clock: Option<ClockParams>) {
        self.join_queued();
        self.cfg.clock = clock;
    }

    /// Call `f` with every joined (accepted) sample, before it is profiled.
    pub fn set_observer(&mut self, f: Observer) {
        self.join_queued();
        self.observer = Some(f);
    }

    /// Register a code image (file contents read by the driver). Images are matched to MMAP2
    /// records by path (or file name); an image no MMAP2 places is taken as loaded at its
    /// link-time addresses.
    pub fn add_image(&mut self, path: &str, data: impl Into<ImageBytes>) {
        self.join_queued();
        let data: ImageBytes = data.into();
        let info = BinaryInfo::from_elf(path, &data).ok();
        let idx = self.code.add_image(path, data, info.as_ref());
        if let Some(info) = info {
            self.resolver.binaries.push((idx, info));
        }
        if let Some(pool) = self.pool.as_mut() {
            pool.code = self.code.clone();
        }
    }

    /// Forget the runtime-address -> frame cache of the context trie (the live driver calls
    /// this when the target's mappings changed, e.g. after exec or dlclose).
    pub fn clear_frame_cache(&mut self) {
        self.join_queued();
        self.frame_cache.clear();
    }

    /// The code map (for tests and drivers).
    pub fn code(&self) -> &CodeMap {
        &self.code
    }

    /// Counters.
    pub fn stats(&self) -> PipelineStats {
        let mut s = self.stats;
        s.join = *self.joiner.stats();
        s
    }

    /// The profile.
    pub fn profile(&self) -> &HybridProfile {
        &self.profile
    }

    /// Where the profile gets the code facts of the binaries it meets from now on
    /// ([`HybridProfile::set_facts_provider`]).
    pub fn set_profile_facts(&mut self, p: etm_profile::FactsProvider) {
        self.join_queued();
        self.profile.set_facts_provider(p);
    }

    /// The calling-context trie and its frame table.
    pub fn trie(&self) -> (&ContextTrie, &FrameTable) {
        (&self.trie, &self.frames)
    }

    /// The address resolver the profile was built with.
    pub fn resolver(&self) -> &dyn AddressResolver {
        &self.resolver
    }

    /// Feed one event.
    pub fn push(&mut self, ev: SessionEvent<'_>) {
        if self.pool.is_some() {
            return self.defer(ev);
        }
        self.push_now(ev);
    }

    /// [`push`](Self::push) on this thread (the decode done here, or replayed from a decode
    /// worker's tape).
    fn push_now(&mut self, ev: SessionEvent<'_>) {
        let placed = self.code.apply(&ev);
        match ev {
            SessionEvent::Aux { record, data } => {
                let plan = AuxPlan::new(&record, &[data], self.factory.is_some(), &mut self.track);
                self.push_aux(&record, &plan, &[data])
            }
            SessionEvent::Sample(s) => self.push_sample(s),
            SessionEvent::Sideband(s) => self.push_sideband(s, placed),
        }
    }

    /// The live driver drained every AUX buffer feeding `cpu` (all CPUs with `None`) after
    /// perf time `time`: pause samples of those CPUs before `time` are joined now instead of
    /// waiting for the CPU's next window (bounded latency for the live view on idle CPUs).
    pub fn trace_complete_until(&mut self, cpu: Option<i32>, time: u64) {
        if self.pool.is_some() {
            return self.defer_complete(cpu, time);
        }
        self.complete_now(cpu, time);
    }

    /// The CPUs whose trace [`trace_complete_until`](Self::trace_complete_until) completes.
    fn complete_cpus(&self, cpu: Option<i32>) -> Vec<i32> {
        match cpu {
            Some(c) => vec![c],
            None => self.cfg.cpus.iter().map(|c| c.cpu).collect(),
        }
    }

    fn complete_now(&mut self, cpu: Option<i32>, time: u64) {
        let cpus = self.complete_cpus(cpu);
        let Pipeline {
            aux,
            joiner,
            code,
            profile,
            resolver,
            trie,
            frames,
            frame_cache,
            callers,
            namer,
            stats,
            trace_cpu,
            pending_begin,
            cfg,
            scratch_frames,
            scratch_touched,
            observer,
            exact,
            tapes,
            ..
        } = self;
        let mut sink = Sink {
            profile,
            resolver,
            trie,
            frames,
            frame_cache,
            callers,
            namer: namer.as_mut(),
            code,
            stats,
            scratch_frames,
            observer,
            exact,
        };
        // The windows' last branches are complete: nothing more of them can arrive.
        for (&aux_cpu, st) in aux.iter_mut() {
            if !completes(aux_cpu, &cpus) {
                continue;
            }
            if let Some(t) = tapes.as_mut() {
                t.load(aux_cpu);
            }
            let mut ws = WinSink {
                aux_cpu: if st.raw { st.source } else { aux_cpu },
                aux_time: time,
                raw: st.raw,
                trace_cpu,
                pending_begin,
                clock: cfg.clock,
                use_ts: cfg.trace_timestamps,
                joiner,
                out: &mut sink,
                touched: {
                    scratch_touched.clear();
                    &mut *scratch_touched
                },
                fast: None,
            };
            st.decoder.complete_pending(code, &mut ws);
        }
        for c in cpus {
            joiner.trace_complete_until(c, time, code, &mut |j| sink.accept(j));
        }
    }

    /// End of stream: flush the decoders and resolve every pending sample.
    pub fn finish(&mut self) {
        if self.pool.is_some() {
            self.defer_finish();
        }
        self.finish_now();
    }

    fn finish_now(&mut self) {
        let Pipeline {
            aux,
            joiner,
            code,
            profile,
            resolver,
            trie,
            frames,
            frame_cache,
            callers,
            namer,
            stats,
            trace_cpu,
            pending_begin,
            cfg,
            scratch_frames,
            scratch_touched,
            observer,
            exact,
            tapes,
            ..
        } = self;
        let mut sink = Sink {
            profile,
            resolver,
            trie,
            frames,
            frame_cache,
            callers,
            namer: namer.as_mut(),
            code,
            stats,
            scratch_frames,
            observer,
            exact,
        };
        let mut cpus: Vec<i32> = aux.keys().copied().collect();
        cpus.sort_unstable();
        for c in cpus {
            let st = aux.get_mut(&c).expect("key from the map");
            if let Some(t) = tapes.as_mut() {
                t.load(c);
            }
            let mut ws = WinSink {
                aux_cpu: if st.raw { st.source } else { c },
                aux_time: u64::MAX,
                raw: st.raw,
                trace_cpu,
                pending_begin,
                clock: cfg.clock,
                use_ts: cfg.trace_timestamps,
                joiner,
                out: &mut sink,
                touched: {
                    scratch_touched.clear();
                    &mut *scratch_touched
                },
                fast: None,
            };
            st.decoder.finish(code, &mut ws);
        }
        joiner.flush(code, &mut |j| sink.accept(j));
        sink.exact.end_all();
    }

    /// [`push`](Self::push) with a decode pool: the pool's code map follows the event, an AUX
    /// record's decode goes to its buffer's worker, and the event waits in the queue until
    /// the events before it are joined.
    fn defer(&mut self, ev: SessionEvent<'_>) {
        // First, as the pipeline's own map when it reaches the event (`push_now`).
        if let Some(pool) = self.pool.as_mut() {
            pool.code.apply(&ev);
        }
        let item = match ev {
            SessionEvent::Aux { record, data } => return self.defer_aux(&record, &[data]),
            // Without its stack copy (for the binary's unwinder; the pipeline reads none).
            SessionEvent::Sample(s) => Deferred::Sample(PauseSample {
                stack: s.stack.clone(),
                branches: s.branches.clone(),
                branch_flags: s.branch_flags.clone(),
                user_stack: None,
                ..*s
            }),
            SessionEvent::Sideband(sb) => {
                let jobs = match sb {
                    Sideband::TraceComplete { cpu, .. } => self.send_complete(*cpu),
                    _ => Vec::new(),
                };
                Deferred::Sideband(sb.clone(), jobs)
            }
        };
        self.enqueue(item);
    }

    fn defer_aux(&mut self, rec: &AuxRecord, parts: &[&[u8]]) {
        let plan = AuxPlan::new(rec, parts, self.factory.is_some(), &mut self.track);
        let mut job = Vec::new();
        if plan.decoded {
            let work = crate::pool::Work::Aux(plan, parts.iter().map(|p| p.to_vec()).collect());
            self.send_job(rec.cpu, work, &mut job);
        }
        self.enqueue(Deferred::Aux(*rec, plan, job.pop()));
    }

    fn defer_complete(&mut self, cpu: Option<i32>, time: u64) {
        let jobs = self.send_complete(cpu);
        self.enqueue(Deferred::Complete(cpu, time, jobs));
    }

    /// Every buffer's decoder finishes on its worker, every event is joined.
    fn defer_finish(&mut self) {
        let mut keys: Vec<i32> = self.track.source.keys().copied().collect();
        keys.sort_unstable();
        let mut jobs = Vec::new();
        for k in keys {
            self.send_job(k, crate::pool::Work::Finish, &mut jobs);
        }
        self.enqueue(Deferred::Jobs(jobs));
        while self.join_oldest() {}
    }

    /// [`WindowDecoder::complete_pending`] for the buffers whose trace `cpu` completes.
    fn send_complete(&mut self, cpu: Option<i32>) -> Vec<crate::pool::Sent> {
        let cpus = self.complete_cpus(cpu);
        let keys: Vec<i32> = self.track.source.keys().copied().filter(|&k| completes(k, &cpus)).collect();
        let mut jobs = Vec::new();
        for k in keys {
            self.send_job(k, crate::pool::Work::Complete, &mut jobs);
        }
        jobs
    }

    /// Sends a job to buffer `key`'s worker and adds it to `batch` (the jobs of the event
    /// being queued), first joining the oldest events while the pool has all the jobs it
    /// allows in flight: so many never are, and no channel fills up. When every event before
    /// is joined, the jobs in flight are the batch's own: their tapes are taken then, to wait
    /// for their event in [`Tapes::ready`](crate::pool::Tapes).
    fn send_job(&mut self, key: i32, work: crate::pool::Work, batch: &mut Vec<crate::pool::Sent>) {
        while self.pool.as_ref().is_some_and(|p| p.in_flight >= p.capacity()) {
            if !self.join_oldest() {
                if batch.is_empty() {
                    break;
                }
                self.receive_ready(std::mem::take(batch));
            }
        }
        let pool = self.pool.as_mut().expect("only with a pool");
        let code = pool.snapshot();
        batch.push(pool.send(crate::pool::Job { key, code, work }));
    }

    fn enqueue(&mut self, item: Deferred) {
        self.queue.push_back(item);
        while self.queue.len() > crate::pool::MAX_QUEUED && self.join_oldest() {}
    }

    /// The tape of a job, failures counted.
    fn receive(&mut self, s: crate::pool::Sent) -> crate::pool::Tape {
        let tape = self.pool.as_mut().expect("only with a pool").receive(s);
        self.stats.decode_worker_failures += u64::from(tape.failed);
        tape
    }

    /// The tapes of jobs, ready for their buffers' decoders.
    fn receive_ready(&mut self, jobs: Vec<crate::pool::Sent>) {
        for s in jobs {
            let tape = self.receive(s);
            self.tapes.as_mut().expect("with the pool").ready.insert(s.key, tape);
        }
    }

    /// With a decode pool, joins every event pushed so far (a setting changed after this
    /// applies to the events pushed after it, as without a pool).
    fn join_queued(&mut self) {
        while self.join_oldest() {}
    }

    /// Joins the oldest queued event (waiting for its decode); false if none is queued.
    fn join_oldest(&mut self) -> bool {
        let Some(item) = self.queue.pop_front() else { return false };
        match item {
            Deferred::Aux(rec, plan, job) => {
                if let Some(s) = job {
                    let tape = self.receive(s);
                    *self.tapes.as_mut().expect("with the pool").current.borrow_mut() = tape;
                }
                self.push_aux(&rec, &plan, &[]);
            }
            Deferred::Sample(s) => self.push_now(SessionEvent::Sample(&s)),
            Deferred::Sideband(sb, jobs) => {
                self.receive_ready(jobs);
                self.push_now(SessionEvent::Sideband(&sb));
            }
            Deferred::Complete(cpu, time, jobs) => {
                self.receive_ready(jobs);
                self.complete_now(cpu, time);
            }
            Deferred::Jobs(jobs) => self.receive_ready(jobs),
        }
        true
    }

    /// Feed one AUX record whose bytes are in several pieces (the live driver's view of a
    /// wrapped AUX ring: the tail of the buffer, then its head), without copying them.
    pub fn push_aux_parts(&mut self, record: &AuxRecord, parts: &[&[u8]]) {
        if self.pool.is_some() {
            return self.defer_aux(record, parts);
        }
        let plan = AuxPlan::new(record, parts, self.factory.is_some(), &mut self.track);
        self.push_aux(record, &plan, parts);
    }

    /// An AUX record by its `plan`: counted, decoded (or its decode replayed: `parts` unused
    /// then), the windows it touches joined.
    fn push_aux(&mut self, rec: &AuxRecord, plan: &AuxPlan, parts: &[&[u8]]) {
        self.stats.aux_records += 1;
        self.stats.aux_bytes += plan.len;
        self.stats.aux_truncated += u64::from(plan.truncated);
        self.stats.aux_short += u64::from(plan.short);
        self.stats.aux_partial_collision += u64::from(plan.partial_collision);
        self.stats.aux_overwrite += u64::from(plan.overwrite);
        self.stats.aux_gaps += u64::from(plan.gap);
        let Some(factory) = self.factory.clone().filter(|_| plan.decoded) else {
            self.stats.aux_undecoded += 1;
            return;
        };
        let (raw, source) = (plan.raw, plan.source);
        let Pipeline {
            aux,
            joiner,
            code,
            profile,
            resolver,
            trie,
            frames,
            frame_cache,
            callers,
            namer,
            stats,
            trace_cpu,
            pending_begin,
            cfg,
            scratch_frames,
            scratch_touched,
            observer,
            exact,
            shared,
            tapes,
            ..
        } = self;
        let create = || match tapes.as_ref() {
            Some(t) => Box::new(crate::pool::TapeDecoder(t.current.clone())) as Box<dyn WindowDecoder>,
            None => factory.create(source, &cfg.cpus, raw, shared),
        };
        let st = aux.entry(rec.cpu).or_insert_with(|| AuxState { decoder: create(), raw, source });
        if plan.moved {
            stats.aux_cpu_changes += 1;
        }
        let mut out = Sink {
            profile,
            resolver,
            trie,
            frames,
            frame_cache,
            callers,
            namer: namer.as_mut(),
            code,
            stats,
            scratch_frames,
            observer,
            exact,
        };
        let mut ws = WinSink {
            aux_cpu: if raw { plan.prev_source } else { rec.cpu },
            aux_time: rec.time,
            raw,
            trace_cpu,
            pending_begin,
            clock: cfg.clock,
            use_ts: cfg.trace_timestamps,
            joiner,
            out: &mut out,
            touched: {
                scratch_touched.clear();
                &mut *scratch_touched
            },
            fast: None,
        };
        for step in plan.steps() {
            run_step(&mut st.decoder, step, parts, code, &mut ws, create);
            match step {
                AuxStep::Moved => {
                    // The previous CPU's stream ended (its last branches were completed).
                    ws.out.stats.decoder_resets += 1;
                    ws.break_cpus(false);
                    st.source = source;
                    ws.aux_cpu = source;
                }
                AuxStep::Restart => {
                    ws.out.stats.decoder_resets += 1;
                    ws.break_cpus(false);
                }
                AuxStep::Feed(_) => {}
                AuxStep::Cut => {
                    ws.out.stats.aux_collision_resets += u64::from(plan.collision);
                    ws.out.stats.decoder_resets += 1;
                    ws.break_cpus(true);
                }
            }
        }
    }

    fn push_sample(&mut self, s: &PauseSample) {
        self.stats.samples += 1;
        let Pipeline {
            joiner,
            code,
            profile,
            resolver,
            trie,
            frames,
            frame_cache,
            callers,
            namer,
            stats,
            cfg,
            scratch_frames,
            scratch_lbr,
            scratch_types,
            observer,
            exact,
            ..
        } = self;
        let mut sink = Sink {
            profile,
            resolver,
            trie,
            frames,
            frame_cache,
            callers,
            namer: namer.as_mut(),
            code,
            stats,
            scratch_frames,
            observer,
            exact,
        };
        match &s.branches {
            Some(b) => {
                sink.stats.lbr_samples += 1;
                if b.is_empty() {
                    sink.stats.lbr_empty += 1;
                }
                let (kept, types) = (&mut *scratch_lbr, &mut *scratch_types);
                lbr_entries(b, &s.branch_flags, kept, types, sink.stats);
                let depth = cfg.join.depth.min(kept.len());
                let (b, t) = (&kept[..depth], &types[..depth]);
                if joiner.validate_sample(s.pid, &s.stack, b, t, code).is_ok() {
                    sink.accept(&pause_joined(s, b));
                }
            }
            None if cfg.cpus.is_empty() => {
                sink.stats.stack_only_samples += 1;
                if !s.stack.is_empty() {
                    sink.accept(&pause_joined(s, &[]));
                }
            }
            None => joiner.sample(s.cpu, s.pid, s.tid, s.time, &s.stack, code, &mut |j| sink.accept(j)),
        }
    }

    /// A sideband record; `placed`: the image its MMAP2 placed in the code map.
    fn push_sideband(&mut self, sb: &Sideband, placed: Option<usize>) {
        self.stats.sideband += 1;
        match sb {
            Sideband::Mmap2 { addr, len, pgoff, .. } => {
                if let Some(img) = placed {
                    self.place_binary(img, *addr, *len, *pgoff)
                }
            }
            Sideband::Lost { lost, .. } => {
                // Lost data-ring records are samples and sideband; AUX bytes live in the AUX
                // ring, and missing AUX records show up as gaps in their offsets.
                self.stats.lost_records += 1;
                self.stats.lost_events += lost;
            }
            Sideband::AuxOutputHwId { hw_id, cpu: Some(cpu), .. } => {
                self.trace_cpu.insert((hw_id & 0xff) as u8, *cpu);
            }
            Sideband::Throttle { unthrottle, time, cpu, .. } => {
                self.stats.throttles += 1;
                if let (false, Some(c)) = (*unthrottle, *cpu) {
                    self.joiner.throttle(c, *time);
                }
            }
            Sideband::Switch { out, tid, next_prev, time, cpu: Some(cpu), .. } => {
                self.stats.switches += 1;
                let tid_in = match (*out, next_prev) {
                    (false, _) => Some(*tid),
                    (true, Some((_, t))) => Some(*t),
                    (true, None) => None,
                };
                if let Some(t) = tid_in {
                    self.joiner.switch_in(*cpu, *time, t);
                }
            }
            Sideband::WindowEnd { time, cpu, .. } => {
                self.stats.window_ends += 1;
                let Pipeline {
                    joiner,
                    code,
                    profile,
                    resolver,
                    trie,
                    frames,
                    frame_cache,
                    callers,
                    namer,
                    stats,
                    scratch_frames,
                    observer,
                    exact,
                    ..
                } = self;
                let mut sink = Sink {
                    profile,
                    resolver,
                    trie,
                    frames,
                    frame_cache,
                    callers,
                    namer: namer.as_mut(),
                    code,
                    stats,
                    scratch_frames,
                    observer,
                    exact,
                };
                joiner.window_end(*cpu, *time, code, &mut |j| sink.accept(j));
            }
            Sideband::TraceComplete { cpu, time } => {
                self.stats.trace_complete += 1;
                self.complete_now(*cpu, *time);
            }
            _ => {}
        }
    }

    /// The resolver's side of an MMAP2 of image `img`.
    fn place_binary(&mut self, img: usize, addr: u64, len: u64, pgoff: u64) {
        // Place the binary's exec segments for the resolver (runtime -> link-time bias).
        if let Some(bi) = self.resolver.binaries.iter().position(|(i, _)| *i == img) {
            let info = &self.resolver.binaries[bi].1;
            for s in &info.exec_segments {
                // File offset range of the segment inside this mapping.
                // (Wrapping arithmetic: MMAP2 records from a session file are untrusted.)
                let (fs, fe) = (s.offset, s.offset.saturating_add(s.memsz));
                let (ms, me) = (pgoff, pgoff.saturating_add(len));
                if fs < me && ms < fe {
                    let rs = addr.wrapping_add(fs.max(ms) - pgoff);
                    let re = addr.wrapping_add(fe.min(me) - pgoff);
                    if rs >= re {
                        continue;
                    }
                    let bias = s.vaddr.wrapping_sub(addr.wrapping_add(s.offset.wrapping_sub(pgoff)));
                    if self.resolver.placed.len() <= bi {
                        self.resolver.placed.resize(bi + 1, false);
                    }
                    self.resolver.placed[bi] = true;
                    let p = &mut self.resolver.places;
                    p.retain(|o| o.1 <= rs || o.0 >= re);
                    let i = p.partition_point(|o| o.0 < rs);
                    p.insert(i, (rs, re, bias, bi as u32));
                }
            }
        }
    }
}

/// A pause sample that carried its own branches (or none) as a joined sample.
fn pause_joined<'a>(s: &'a PauseSample, branches: &'a [BranchPair]) -> Joined<'a> {
    Joined { cpu: s.cpu, pid: s.pid, tid: s.tid, time: s.time, stack: &s.stack, branches, synth: 0 }
}

/// The root frame of a stack cut by the callers check (views, folded and pprof output).
pub const TRUNCATED_FRAME: &str = "[truncated]";

/// Where joined samples go: observer, profile, trie.
struct Sink<'a> {
    profile: &'a mut HybridProfile,
    resolver: &'a Resolver,
    trie: &'a mut ContextTrie,
    frames: &'a mut FrameTable,
    frame_cache: &'a mut crate::frame_cache::FrameCache,
    callers: &'a mut crate::code::CallerCache,
    namer: &'a mut dyn FrameNamer,
    code: &'a CodeMap,
    stats: &'a mut PipelineStats,
    scratch_frames: &'a mut Vec<FrameId>,
    observer: &'a mut Option<Observer>,
    exact: &'a mut ExactState,
}

impl Sink<'_> {
    fn accept(&mut self, j: &Joined<'_>) {
        if let Some(o) = self.observer.as_mut() {
            o(j);
        }
        // Callers checked: a return address not after a call ends the stack there.
        let keep = self.code.checked_depth_cached(j.pid, j.stack, self.callers);
        let stack = &j.stack[..keep];
        let truncated = keep < j.stack.len();
        let sample = HybridSample { stack, branches: j.branches };
        if j.synth > 0 {
            // Synthesized samples feed the PGO dumps only: the sampled stacks (trie, folded,
            // pprof, live view) stay one per pause, proportional to time.
            self.profile.add_synthesized(&sample, self.resolver, truncated);
            return;
        }
        if truncated {
            self.profile.add_cut(&sample, self.resolver)
        } else {
            self.profile.add(&sample, self.resolver)
        }
        self.stats.profiled += 1;
        if truncated {
            self.stats.stacks_truncated += 1;
        }
        // Context trie: a stack seen before goes to its node at once.
        let epoch = self.trie.compactions();
        if let Some(node) = self.frame_cache.stack_node(j.pid, truncated, stack, epoch) {
            self.trie.add_at(node, 1);
            return;
        }
        // Else its frames, root first.
        self.scratch_frames.clear();
        if truncated {
            self.scratch_frames.push(self.frames.intern(Frame::new(TRUNCATED_FRAME, None)));
        }
        let mut resolved = true;
        for (i, &a) in stack.iter().enumerate().rev() {
            // Return addresses point after the call: name the call site.
            let a2 = if i == 0 { a } else { a.saturating_sub(1) };
            // (cached by the address named: a return address and the same address as a leaf
            // name different instructions)
            match self.frame_cache.get(a2) {
                Some(ids) => self.scratch_frames.extend_from_slice(ids),
                None => {
                    let r = self.resolver.resolve(a2);
                    let bin = r.and_then(|(b, _)| self.resolver.binary(b));
                    let link = r.map(|(_, l)| l).unwrap_or(a2);
                    let sym = r.and_then(|(b, l)| {
                        let img = self.resolver.binaries.get(b.0 as usize)?.0;
                        self.code.symbols(img).lookup(l).map(|s| s.name.as_str())
                    });
                    let start = self.scratch_frames.len();
                    self.namer.frame_ids(bin, sym, link, a2, self.frames, self.scratch_frames);
                    if r.is_some() {
                        self.frame_cache.insert(a2, &self.scratch_frames[start..]);
                    } else {
                        // (named again when next seen: its mapping may arrive later)
                        resolved = false;
                    }
                }
            }
        }
        let node = self.trie.add(self.scratch_frames, 1);
        if resolved && self.trie.node(node).depth as usize == self.scratch_frames.len() {
            self.frame_cache.keep_stack(j.pid, truncated, stack, self.trie.compactions(), node);
        }
    }
}

impl crate::window::CallSink for WinSink<'_, '_> {}

/// Routes decoder output of one AUX buffer to the join.
struct WinSink<'a, 'b> {
    aux_cpu: i32,
    aux_time: u64,
    raw: bool,
    trace_cpu: &'a IntMap<u8, i32>,
    pending_begin: &'a mut CpuMap<bool>,
    clock: Option<ClockParams>,
    /// Trace timestamps date segments (else the AUX record times do).
    use_ts: bool,
    joiner: &'a mut Joiner,
    out: &'a mut Sink<'b>,
    /// CPUs whose open window received branches from this record.
    touched: &'a mut Vec<i32>,
    /// (trace ID, CPU) of the last branch, whose segment was begun and touched: the next
    /// branch of the same ID goes straight to the join (reset by every other event).
    fast: Option<(Option<u8>, i32)>,
}

impl WinSink<'_, '_> {
    fn cpu(&mut self, trace_id: Option<u8>) -> Option<i32> {
        match trace_id {
            None => Some(self.aux_cpu),
            Some(_) if self.raw => Some(self.aux_cpu),
            Some(id) => match self.trace_cpu.get(&id) {
                Some(&c) => Some(c),
                None if self.aux_cpu >= 0 && self.trace_cpu.is_empty() => Some(self.aux_cpu),
                None => {
                    self.out.stats.unknown_trace_id += 1;
                    None
                }
            },
        }
    }

    /// End (or, `broken`, break) the open segments of the CPUs whose trace goes to this
    /// buffer: a per-CPU buffer holds its CPU's trace, a per-thread buffer (-1) any CPU's.
    fn break_cpus(&mut self, broken: bool) {
        self.fast = None;
        let one = [self.aux_cpu];
        let all: Vec<i32>;
        let cpus: &[i32] = if self.aux_cpu >= 0 {
            &one
        } else {
            all = self.trace_cpu.values().copied().collect();
            &all
        };
        for &c in cpus {
            if broken {
                self.joiner.discontinuity(c);
            } else {
                self.joiner.end_segment(c);
            }
            *self.pending_begin.entry(c) = false;
        }
    }

    fn begin(&mut self, cpu: i32, time: u64, ts_known: bool) {
        self.fast = None;
        *self.pending_begin.entry(cpu) = false;
        self.touched.retain(|&c| c != cpu);
        let (code, out) = (self.out.code, &mut *self.out);
        self.joiner.begin_segment(cpu, time, ts_known, code, &mut |j| out.accept(j));
    }
}

impl WindowSink for WinSink<'_, '_> {
    fn trace_on(&mut self, trace_id: Option<u8>) {
        self.fast = None;
        // A trace-on begins a segment; a pause's window is every segment since the previous
        // pause (trace restarts inside a window after filtered-out exceptions).
        let Some(cpu) = self.cpu(trace_id) else { return };
        self.out.stats.trace_on += 1;
        self.joiner.end_segment(cpu);
        self.out.exact.end_segment(cpu);
        *self.pending_begin.entry(cpu) = true;
    }

    fn timestamp(&mut self, trace_id: Option<u8>, ts: u64) {
        self.fast = None;
        if !self.use_ts {
            return;
        }
        let Some(cpu) = self.cpu(trace_id) else { return };
        let t = match self.clock {
            Some(c) => c.to_perf_time(ts),
            None => ts,
        };
        if self.pending_begin.get(cpu).copied().unwrap_or(false) {
            self.begin(cpu, t, true);
        } else {
            self.joiner.segment_time(cpu, t);
        }
    }

    #[inline]
    fn branch(&mut self, trace_id: Option<u8>, from: u64, to: u64) {
        if let Some((id, cpu)) = self.fast
            && id == trace_id
        {
            self.out.stats.branches += 1;
            self.joiner.branch(cpu, BranchPair { from, to });
            return;
        }
        let Some(cpu) = self.cpu(trace_id) else { return };
        self.out.stats.branches += 1;
        if self.pending_begin.get(cpu).copied().unwrap_or(false) {
            self.begin(cpu, self.aux_time, false);
        }
        if !self.touched.contains(&cpu) {
            self.touched.push(cpu);
        }
        self.joiner.branch(cpu, BranchPair { from, to });
        self.fast = Some((trace_id, cpu));
    }

    fn ranges(&mut self, trace_id: Option<u8>, rs: &[crate::window::TraceRange]) {
        let Some(cpu) = self.cpu(trace_id) else { return };
        let out = &mut *self.out;
        out.exact.ranges(cpu, out.resolver, out.code, rs);
    }

    fn branches(&mut self, trace_id: Option<u8>, bs: &[BranchPair]) {
        let Some((first, rest)) = bs.split_first() else { return };
        // The first takes the full path (segment begin, bookkeeping), the rest go in one piece.
        self.branch(trace_id, first.from, first.to);
        if let Some((id, cpu)) = self.fast
            && id == trace_id
        {
            self.out.stats.branches += rest.len() as u64;
            self.joiner.branches(cpu, rest);
        } else {
            for b in rest {
                self.branch(trace_id, b.from, b.to);
            }
        }
    }

    fn trace_info(&mut self, trace_id: Option<u8>) {
        self.fast = None;
        let Some(cpu) = self.cpu(trace_id) else { return };
        self.joiner.trace_info(cpu);
        *self.pending_begin.entry(cpu) = false;
    }

    fn context(&mut self, trace_id: Option<u8>, context_id: u32) {
        self.fast = None;
        let Some(cpu) = self.cpu(trace_id) else { return };
        if self.pending_begin.get(cpu).copied().unwrap_or(false) {
            self.begin(cpu, self.aux_time, false);
        }
        let (code, out) = (self.out.code, &mut *self.out);
        self.joiner.context(cpu, context_id, code, &mut |j| out.accept(j));
    }

    fn discontinuity(&mut self, trace_id: Option<u8>, why: Discontinuity) {
        self.fast = None;
        let Some(cpu) = self.cpu(trace_id) else { return };
        self.out.exact.break_chain(cpu);
        match why {
            Discontinuity::Overflow => self.out.stats.decode_overflows += 1,
            Discontinuity::NoSync => self.out.stats.decode_nosync += 1,
            Discontinuity::Error => self.out.stats.decode_errors += 1,
            Discontinuity::NoCode => self.out.stats.decode_nocode += 1,
            Discontinuity::Foreign => {
                // Another process's code: its segment is marked by its context; nothing
                // broke for the target.
                self.out.stats.decode_foreign += 1;
                return;
            }
        }
        if self.touched.contains(&cpu) {
            // The window open in this record lost data: drop its branches.
            self.joiner.discontinuity(cpu);
        } else {
            // Trouble before any branch of this record: the open window's data all came from
            // earlier records, so it ended there (a per-pause record ends at its pause).
            self.joiner.end_segment(cpu);
        }
        *self.pending_begin.entry(cpu) = false;
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::collections::HashMap;
    use std::rc::Rc;

    use crate::session::{PERF_AUX_FLAG_COLLISION, PERF_AUX_FLAG_TRUNCATED};

    use super::*;
    use crate::decoder::toy::{ToyFactory, ToyWriter};
    use crate::join::RejectReason;
    use crate::session::PERF_AUX_FLAG_CORESIGHT_FORMAT_RAW;

    type Joins = (i32, u64, Vec<BranchPair>);
    type Got = Rc<RefCell<Vec<Joins>>>;

    fn pipeline(cpus: &[i32]) -> (Pipeline, Got) {
        let cfg = PipelineConfig {
            cpus: cpus.iter().map(|&c| CpuTraceConfig { cpu: c, trace_id: 0x10 + 2 * c as u8, ..Default::default() }).collect(),
            decoder: Some(Arc::new(ToyFactory)),
            ..Default::default()
        };
        let mut p = Pipeline::new(cfg);
        let got: Got = Rc::default();
        let g = got.clone();
        p.set_observer(Box::new(move |j| g.borrow_mut().push((j.cpu, j.time, j.branches.to_vec()))));
        (p, got)
    }

    fn base(c: i32, k: u64) -> u64 {
        0x10_0000 * (c as u64 + 1) + 0x1000 * k
    }

    /// Window k on CPU c: trace on at time 1000k+c, a consistent chain of 5 branches distinct
    /// per (c, k), ending at base + 0x50.
    fn window(c: i32, k: u64) -> (Vec<u8>, Vec<BranchPair>) {
        let mut w = ToyWriter::default();
        w.sync().trace_on().ts(1000 * k + c as u64);
        let mut brs = Vec::new();
        for i in 0..5u64 {
            let b = BranchPair { from: base(c, k) + 0x10 * i + 8, to: base(c, k) + 0x10 * (i + 1) };
            w.branch(b.from, b.to);
            brs.push(b);
        }
        brs.reverse();
        (w.0, brs)
    }

    thread_local! {
        static OFFSETS: RefCell<HashMap<i32, u64>> = RefCell::default();
    }

    /// An AUX record of `cpu`, its ring offset following the previous record of that CPU.
    fn aux(cpu: i32, time: u64, data: &[u8], flags: u64) -> (AuxRecord, Vec<u8>) {
        let off = OFFSETS.with(|o| {
            let mut o = o.borrow_mut();
            let e = o.entry(cpu).or_insert(0x1000);
            let off = *e;
            *e += data.len() as u64;
            off
        });
        (
            AuxRecord {
                cpu,
                flags: flags | PERF_AUX_FLAG_CORESIGHT_FORMAT_RAW,
                time,
                aux_offset: off,
                size: data.len() as u64,
                source_cpu: None,
            },
            data.to_vec(),
        )
    }

    /// The pause sample after window `time / 1000` of `cpu`: leaf just after its newest
    /// target (no code images: the code checks are skipped, counted as unverified).
    fn sample(cpu: i32, time: u64) -> PauseSample {
        let leaf = base(cpu, time / 1000) + 0x54;
        PauseSample {
            cpu,
            pid: 1,
            tid: 1,
            time,
            stack: vec![leaf, 0x1234],
            branches: None,
            branch_flags: Vec::new(),
            window_ns: None,
            user_stack: None,
        }
    }

    enum E {
        Aux(AuxRecord, Vec<u8>),
        S(PauseSample),
        Sb(Sideband),
    }

    fn feed(p: &mut Pipeline, evs: &[E]) {
        push_all(p, evs);
        p.finish();
    }

    fn push_all(p: &mut Pipeline, evs: &[E]) {
        for e in evs {
            match e {
                E::Aux(r, d) => p.push(SessionEvent::Aux { record: *r, data: d }),
                E::S(s) => p.push(SessionEvent::Sample(s)),
                E::Sb(s) => p.push(SessionEvent::Sideband(s)),
            }
        }
    }

    /// Per-pause AUX records on two CPUs, samples arriving after their AUX data: every sample
    /// gets its own window's branches, and the profile and trie count them.
    fn clean_session(n: u64) -> (Vec<E>, Vec<Joins>) {
        let mut evs = Vec::new();
        let mut expect = Vec::new();
        for k in 1..=n {
            for c in 0..2 {
                let (bytes, brs) = window(c, k);
                let (r, d) = aux(c, 1000 * k + 500 + c as u64, &bytes, 0);
                evs.push(E::Aux(r, d));
                evs.push(E::S(sample(c, 1000 * k + 600 + c as u64)));
                expect.push((c, 1000 * k + 600 + c as u64, brs));
            }
        }
        (evs, expect)
    }

    /// A clean two-CPU session joins every sample with exactly its window's branches.
    #[test]
    fn clean_two_cpu_session() {
        let (evs, mut expect) = clean_session(6);
        let (mut p, got) = pipeline(&[0, 1]);
        feed(&mut p, &evs);
        let mut got = got.borrow().clone();
        got.sort_by_key(|g| (g.0, g.1));
        expect.sort_by_key(|g| (g.0, g.1));
        assert_eq!(got, expect);
        let st = p.stats();
        assert_eq!((st.join.joined, st.join.rejected.total(), st.profiled), (12, 0, 12));
        assert_eq!(p.profile().total_samples(), 12);
        assert_eq!(p.trie().0.total_samples(), 12);
        assert_eq!((st.decode_errors, st.aux_truncated, st.decoder_resets), (0, 0, 0));
    }

    /// Injected faults (flipped byte, truncated record, lost record, missing sync, split
    /// records) are counted, and every other sample still joins with its own window.
    #[test]
    fn faults_are_counted_and_do_not_poison_others() {
        let (mut evs, expect) = clean_session(8);
        // evs index of window k on cpu c: 2 * (2 * (k-1) + c).
        let idx = |c: usize, k: usize| 2 * (2 * (k - 1) + c);
        // 1. Flip a byte (the opcode of the third branch) in window 2 of cpu 0.
        if let E::Aux(_, d) = &mut evs[idx(0, 2)] {
            d[2 + 1 + 9 + 2 * 17] = 0x77;
        }
        // 2. Truncate window 3 of cpu 1 in the middle of a branch, as the kernel reports it.
        if let E::Aux(r, d) = &mut evs[idx(1, 3)] {
            d.truncate(40);
            r.size = 40;
            r.flags |= PERF_AUX_FLAG_TRUNCATED;
        }
        // 3. Window 4 of cpu 0 has no sync marker.
        if let E::Aux(_, d) = &mut evs[idx(0, 4)] {
            d[0] = 0;
            d[1] = 0;
        }
        // 5. Window 6 of cpu 0 is cut short without the kernel knowing (record shorter than announced).
        if let E::Aux(r, d) = &mut evs[idx(0, 6)] {
            r.size = d.len() as u64;
            d.truncate(30);
        }
        // Ring offsets as the kernel would number these records.
        let mut next = HashMap::new();
        for e in evs.iter_mut() {
            if let E::Aux(r, _) = e {
                let o = next.entry(r.cpu).or_insert(0x1000u64);
                r.aux_offset = *o;
                *o += r.size;
            }
        }
        // 4. Window 5 of cpu 1 is lost (its AUX record is missing; a LOST record says so).
        evs[idx(1, 5)] = E::Sb(Sideband::Lost { id: 0, lost: 1, time: 5500, cpu: Some(1) });
        let (mut p, got) = pipeline(&[0, 1]);
        feed(&mut p, &evs);
        let faulty = [(0, 2), (1, 3), (0, 4), (1, 5), (0, 6)];
        let got = got.borrow().clone();
        // Every sample of an intact window is joined, with its own branches.
        for e in &expect {
            let k = ((e.1 - 600) / 1000) as usize;
            let is_faulty = faulty.contains(&(e.0 as usize, k));
            let joined = got.iter().find(|g| g.0 == e.0 && g.1 == e.1);
            if is_faulty {
                assert!(joined.is_none(), "faulty window {:?} joined", (e.0, k));
            } else {
                assert_eq!(joined, Some(e), "intact window {:?}", (e.0, k));
            }
        }
        let st = p.stats();
        assert_eq!(st.join.joined, 16 - 5);
        assert_eq!(st.join.rejected.total(), 5);
        assert!(st.decode_errors >= 1, "{st:?}");
        assert_eq!(st.aux_truncated, 1);
        assert_eq!(st.aux_short, 1);
        assert_eq!(st.lost_records, 1);
        assert_eq!(st.aux_gaps, 1);
        assert!(st.decode_nosync >= 1);
        assert!(st.join.rejected.get(RejectReason::NoWindow) >= 1);
    }

    /// A window split across two AUX records (TRBE: no per-pause record) decodes as one, and a
    /// sample that arrives before its window's data waits for it.
    #[test]
    fn split_records_and_early_samples() {
        let (bytes, brs) = window(0, 1);
        let (bytes2, brs2) = window(0, 2);
        let (mut p, got) = pipeline(&[0]);
        let (r1, d1) = aux(0, 1100, &bytes[..20], 0);
        let (r2, d2) = aux(0, 1200, &bytes[20..], 0);
        let (r3, d3) = aux(0, 2500, &bytes2, 0);
        let evs = vec![E::S(sample(0, 1600)), E::Aux(r1, d1), E::Aux(r2, d2), E::S(sample(0, 2600)), E::Aux(r3, d3)];
        feed(&mut p, &evs);
        assert_eq!(*got.borrow(), vec![(0, 1600, brs), (0, 2600, brs2)]);
    }

    /// A record fed in two pieces (a wrapped AUX ring) joins exactly like the whole record.
    #[test]
    fn record_in_parts() {
        let (bytes, brs) = window(0, 1);
        let (mut p, got) = pipeline(&[0]);
        let (r, d) = aux(0, 1100, &bytes, 0);
        p.push_aux_parts(&r, &[&d[..33], &d[33..]]);
        p.push(SessionEvent::Sample(&sample(0, 1600)));
        p.finish();
        assert_eq!(*got.borrow(), vec![(0, 1600, brs)]);
        assert_eq!(p.stats().aux_short, 0);
    }

    /// A pipeline of `cpus` on the toy decoder of `factory` with `threads` decode threads.
    fn pipeline_with(cpus: &[i32], factory: Arc<dyn DecoderFactory>, threads: usize) -> (Pipeline, Got) {
        let cfg = PipelineConfig {
            cpus: cpus.iter().map(|&c| CpuTraceConfig { cpu: c, trace_id: 0x10 + 2 * c as u8, ..Default::default() }).collect(),
            decoder: Some(factory),
            decode_threads: threads,
            ..Default::default()
        };
        let mut p = Pipeline::new(cfg);
        assert_eq!(p.pool.is_some(), threads > 1);
        let got: Got = Rc::default();
        let g = got.clone();
        p.set_observer(Box::new(move |j| g.borrow_mut().push((j.cpu, j.time, j.branches.to_vec()))));
        (p, got)
    }

    /// A four-CPU session with faults (a flipped byte, a truncated record, a short one, a
    /// lost one, records in two pieces) and trace-complete proofs.
    fn faulty_session() -> Vec<E> {
        let mut evs = Vec::new();
        for k in 1..=12u64 {
            for c in 0..4 {
                let (mut bytes, _) = window(c, k);
                let (mut r, _) = aux(c, 1000 * k + 500 + c as u64, &bytes, 0);
                match (c, k) {
                    (0, 2) => bytes[2 + 1 + 9 + 2 * 17] = 0x77,
                    (1, 3) => {
                        bytes.truncate(40);
                        r.flags |= PERF_AUX_FLAG_TRUNCATED;
                    }
                    (2, 6) => bytes.truncate(30),
                    (3, 5) => {
                        evs.push(E::Sb(Sideband::Lost { id: 0, lost: 1, time: 5500, cpu: Some(3) }));
                        continue;
                    }
                    _ => {}
                }
                evs.push(E::Aux(r, bytes));
                evs.push(E::S(sample(c, 1000 * k + 600 + c as u64)));
                if k % 4 == 0 {
                    evs.push(E::Sb(Sideband::TraceComplete { cpu: Some(c), time: 1000 * k + 700 }));
                }
            }
        }
        evs
    }

    /// Runs `evs` (AUX records of `split` in two pieces) and returns the joins in order and
    /// the counters.
    fn run_threads(evs: &[E], threads: usize, factory: Arc<dyn DecoderFactory>) -> (Vec<Joins>, PipelineStats) {
        let (mut p, got) = pipeline_with(&[0, 1, 2, 3], factory, threads);
        for (i, e) in evs.iter().enumerate() {
            match e {
                E::Aux(r, d) if i % 5 == 0 => p.push_aux_parts(r, &[&d[..d.len() / 2], &d[d.len() / 2..]]),
                E::Aux(r, d) => p.push(SessionEvent::Aux { record: *r, data: d }),
                E::S(s) => p.push(SessionEvent::Sample(s)),
                E::Sb(s) => p.push(SessionEvent::Sideband(s)),
            }
            if i % 7 == 0 {
                p.trace_complete_until(None, 1000 * (i as u64 / 8));
            }
        }
        p.finish();
        let st = p.stats();
        (got.take(), st)
    }

    /// Decoding on 2 or 3 worker threads joins the same samples with the same branches, in
    /// the same order, with the same counters, as decoding on the pipeline's thread.
    #[test]
    fn decode_threads_join_the_same() {
        let evs = faulty_session();
        let (one, st1) = run_threads(&evs, 1, Arc::new(ToyFactory));
        assert!(st1.join.joined > 30 && st1.join.rejected.total() >= 3 && st1.decode_errors >= 1, "{st1:?}");
        assert_eq!((st1.aux_truncated, st1.aux_short, st1.aux_gaps), (1, 2, 1));
        for threads in [2, 3] {
            let (n, stn) = run_threads(&evs, threads, Arc::new(ToyFactory));
            assert_eq!(n, one, "{threads} threads");
            assert_eq!(stn, st1, "{threads} threads");
        }
    }

    /// More buffers than the jobs a pool lets be in flight (a trace-complete proof and the
    /// finish ask a job of each): the same joins as on one thread, and no deadlock.
    #[test]
    fn more_buffers_than_jobs_in_flight() {
        let cpus: Vec<i32> = (0..3 * crate::pool::JOBS_PER_WORKER as i32).collect();
        let mut evs = Vec::new();
        for k in 1..=3 {
            for &c in &cpus {
                let (bytes, _) = window(c, k);
                let (r, d) = aux(c, 1000 * k + 500, &bytes, 0);
                evs.push(E::Aux(r, d));
                evs.push(E::S(sample(c, 1000 * k + 600 + c as u64)));
            }
            evs.push(E::Sb(Sideband::TraceComplete { cpu: None, time: 1000 * k + 700 }));
        }
        let run = |threads| {
            let (mut p, got) = pipeline_with(&cpus, Arc::new(ToyFactory), threads);
            feed(&mut p, &evs);
            (got.take(), p.stats())
        };
        let (one, st1) = run(1);
        assert_eq!(st1.join.joined, 3 * cpus.len() as u64, "{st1:?}");
        for threads in [1usize, 2] {
            assert_eq!(run(threads + 1), (one.clone(), st1), "{} threads", threads + 1);
        }
    }

    /// A decoder that panics on a record starting with 0xEE.
    struct PanicFactory;
    struct PanicDecoder(crate::decoder::toy::ToyDecoder);

    impl WindowDecoder for PanicDecoder {
        fn feed(&mut self, data: &[u8], code: &CodeMap, sink: &mut dyn WindowSink) {
            assert!(data.first() != Some(&0xEE), "injected decoder failure");
            self.0.feed(data, code, sink)
        }
        fn reset(&mut self) {
            self.0.reset()
        }
    }

    impl DecoderFactory for PanicFactory {
        fn create(&self, _: i32, _: &[CpuTraceConfig], _: bool, _: &DecoderShared) -> Box<dyn WindowDecoder> {
            Box::new(PanicDecoder(Default::default()))
        }
    }

    /// A decode worker that fails is counted, the window of the record it failed on is not
    /// joined, the run finishes, and every other sample joins as without the failure.
    #[test]
    fn failing_worker_is_counted() {
        let (mut evs, _) = clean_session(6);
        let mut clean = Vec::new();
        for e in &evs {
            if let E::Aux(r, d) = e {
                clean.push(E::Aux(*r, d.clone()));
            }
        }
        // Window 3 of cpu 1 (event index 2 * (2 * 2 + 1)).
        if let E::Aux(_, d) = &mut evs[10] {
            d[0] = 0xEE;
        }
        let mut p = pipeline_with(&[0, 1], Arc::new(PanicFactory), 2);
        feed(&mut p.0, &evs);
        let st = p.0.stats();
        assert_eq!(st.decode_worker_failures, 1);
        assert_eq!((st.join.joined, st.join.rejected.total()), (11, 1));
        let got = p.1.take();
        let (_, expect) = clean_session(6);
        let lost = expect.iter().position(|e| (e.0, e.1) == (1, 3601)).expect("window 3 of cpu 1");
        let others: Vec<_> = expect.iter().enumerate().filter(|&(i, _)| i != lost).map(|(_, e)| e.clone()).collect();
        let mut got_sorted = got.clone();
        got_sorted.sort_by_key(|g| (g.1, g.0));
        assert_eq!(got_sorted, others);
    }

    /// Samples carrying LBR records and stack-only samples (no ETM) reach the profile.
    #[test]
    fn lbr_and_stack_only() {
        let (mut p, got) = pipeline(&[]);
        let mut s = sample(0, 10);
        s.branches = Some(vec![BranchPair { from: 0x10, to: base(0, 0) }]);
        let s2 = sample(1, 11);
        feed(&mut p, &[E::S(s), E::S(s2)]);
        assert_eq!(got.borrow().len(), 2);
        let st = p.stats();
        assert_eq!((st.lbr_samples, st.stack_only_samples, st.profiled), (1, 1, 2));
    }

    /// Names frames like a symbolizer with inline chains (two frames at one address, one
    /// elsewhere) and records every address it is asked to name.
    struct InlineNamer(Rc<RefCell<Vec<u64>>>, u64);

    impl FrameNamer for InlineNamer {
        fn frame(&mut self, _: Option<&BinaryInfo>, _: Option<&str>, _: u64, addr: u64) -> Frame {
            Frame::new(format!("f{addr:x}"), None)
        }
        fn frame_ids(
            &mut self,
            _: Option<&BinaryInfo>,
            _: Option<&str>,
            _: u64,
            addr: u64,
            table: &mut FrameTable,
            out: &mut Vec<FrameId>,
        ) {
            self.0.borrow_mut().push(addr);
            out.push(table.intern(Frame::new(format!("f{addr:x}"), None)));
            if addr == self.1 {
                out.push(table.intern(Frame::new("inlined", None)));
            }
        }
    }

    /// Every stack address is named once, inline chains included, until the cache is cleared;
    /// the trie's contexts are the same as when every sample is named afresh. (The code: this
    /// test program's own ELF file, mapped as process 1's.)
    #[test]
    fn frames_named_once_per_address() {
        let exe = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let seg = BinaryInfo::from_elf("/t/exe", &exe).unwrap().exec_segments[0];
        let start = 0x5555_0000_0000 + (seg.vaddr & !0xfff);
        // The segment's first instruction at run time.
        let code = start + (seg.vaddr & 0xfff);
        let meta = SessionMeta { arch: Some(CodeArch::X86_64), ..Default::default() };
        let mut p = Pipeline::new(PipelineConfig::from_meta(&meta));
        p.add_image("/t/exe", Arc::new(exe));
        p.push(SessionEvent::Sideband(&Sideband::Mmap2 {
            pid: 1,
            tid: 1,
            addr: start,
            len: seg.memsz + (seg.vaddr & 0xfff),
            pgoff: seg.offset & !0xfff,
            prot: 5,
            flags: 2,
            filename: "/t/exe".into(),
            build_id: None,
            time: 0,
            cpu: None,
        }));
        let asked: Rc<RefCell<Vec<u64>>> = Rc::default();
        p.set_frame_namer(Box::new(InlineNamer(asked.clone(), code + 0x15)));
        let s = PauseSample { stack: vec![code + 0x15], pid: 1, tid: 1, ..Default::default() };
        let s2 = PauseSample { stack: vec![code + 0x40], pid: 1, tid: 1, ..Default::default() };
        for _ in 0..5 {
            p.push(SessionEvent::Sample(&s));
            p.push(SessionEvent::Sample(&s2));
        }
        p.finish();
        assert_eq!(*asked.borrow(), vec![code + 0x15, code + 0x40]);
        let paths = |p: &Pipeline| {
            let (trie, frames) = p.trie();
            let mut v: Vec<(u64, Vec<String>)> = trie
                .node_ids()
                .filter(|&n| trie.node(n).self_count > 0)
                .map(|n| (trie.node(n).self_count, trie.path(n).iter().map(|&f| frames.get(f).function.clone()).collect()))
                .collect();
            v.sort();
            v
        };
        let (leaf, other) = (format!("f{:x}", code + 0x15), format!("f{:x}", code + 0x40));
        assert_eq!(paths(&p), vec![(5, vec![leaf.clone(), "inlined".into()]), (5, vec![other.clone()])]);
        p.clear_frame_cache();
        p.push(SessionEvent::Sample(&s));
        p.finish();
        assert_eq!(asked.borrow().len(), 3, "named again after the clear: {:?}", asked.borrow());
        assert_eq!(paths(&p), vec![(5, vec![other.clone()]), (6, vec![leaf.clone(), "inlined".into()])]);
        // The same address as a return address names its call, the instruction before: named
        // apart from the address as a leaf, also when the leaf was named first. (x: the
        // address after the first call instruction of the segment.)
        let text = &std::fs::read(std::env::current_exe().unwrap()).unwrap()[seg.offset as usize..];
        let mut at = 0usize;
        let x = loop {
            let (kind, len) = crate::isa::x86_decode(&text[at..], code + at as u64).unwrap_or((InsnKind::Other, 1));
            at += len as usize;
            if kind == InsnKind::Call {
                break code + at as u64;
            }
        };
        let sx = PauseSample { stack: vec![x], pid: 1, tid: 1, ..Default::default() };
        let s3 = PauseSample { stack: vec![code + 0x40, x], pid: 1, tid: 1, ..Default::default() };
        asked.borrow_mut().clear();
        for ev in [&sx, &s3, &s3, &sx] {
            p.push(SessionEvent::Sample(ev));
        }
        p.finish();
        assert_eq!(*asked.borrow(), vec![x, x - 1, code + 0x40], "each named once");
        let ps = paths(&p);
        assert!(ps.contains(&(2, vec![format!("f{:x}", x - 1), other])), "{ps:?}");
        assert!(ps.contains(&(2, vec![format!("f{x:x}")])), "{ps:?}");
    }

    /// x86-64 code at 0x40_0000 of process 1: `call 0x400010` (5 bytes), nops; at 0x400010
    /// `mov rbx, rax; adc al, 0; nop`, at 0x400020 `ret; nop`. As A64 words the bytes at
    /// 0x400010 (48 89 c3 14) read as `B`.
    fn x86_pipeline(arch: Option<CodeArch>) -> (Pipeline, Got) {
        let mut code = vec![0x90u8; 0x40];
        code[0..5].copy_from_slice(&[0xe8, 0x0b, 0, 0, 0]);
        code[0x10..0x16].copy_from_slice(&[0x48, 0x89, 0xc3, 0x14, 0x00, 0x90]);
        code[0x20..0x22].copy_from_slice(&[0xc3, 0x90]);
        let meta = SessionMeta { arch, ..Default::default() };
        let mut p = Pipeline::new(PipelineConfig::from_meta(&meta));
        p.add_image("/bin/x86prog", Arc::new(code));
        p.push(SessionEvent::Sideband(&Sideband::Mmap2 {
            pid: 1,
            tid: 1,
            addr: 0x40_0000,
            len: 0x40,
            pgoff: 0,
            prot: 5,
            flags: 2,
            filename: "/bin/x86prog".into(),
            build_id: None,
            time: 0,
            cpu: None,
        }));
        let got: Got = Rc::default();
        let g = got.clone();
        p.set_observer(Box::new(move |j| g.borrow_mut().push((j.cpu, j.time, j.branches.to_vec()))));
        (p, got)
    }

    fn lbr_sample(leaf: u64, caller: u64, branches: &[(u64, u64)]) -> PauseSample {
        PauseSample {
            stack: vec![leaf, caller],
            branches: Some(branches.iter().map(|&(from, to)| BranchPair { from, to }).collect()),
            pid: 1,
            tid: 1,
            ..Default::default()
        }
    }

    /// A recording of x86 code is checked as x86 (the replay path: the pipeline configured
    /// from `session.json`): the call's return address is 5 bytes on, straight code is
    /// decoded by instruction, and a `ret` or a leaf inside an instruction breaks it. Read as
    /// A64 the same good sample is rejected.
    #[test]
    fn x86_recordings_are_checked_as_x86() {
        let good = lbr_sample(0x40_0015, 0x40_0005, &[(0x40_0000, 0x40_0010)]);
        let (mut p, got) = x86_pipeline(Some(CodeArch::X86_64));
        p.push(SessionEvent::Sample(&good));
        // Leaf after the `ret` at 0x400020; leaf inside `mov rbx, rax`.
        p.push(SessionEvent::Sample(&lbr_sample(0x40_0021, 0x40_0005, &[(0x40_0000, 0x40_0020)])));
        p.push(SessionEvent::Sample(&lbr_sample(0x40_0011, 0x40_0005, &[(0x40_0000, 0x40_0010)])));
        // Call, straight code to the `ret`, return to the call's end (from + 5) and on.
        p.push(SessionEvent::Sample(&lbr_sample(0x40_0006, 0x40_1000, &[(0x40_0020, 0x40_0005), (0x40_0000, 0x40_0010)])));
        // The same return landing at A64's from + 4.
        p.push(SessionEvent::Sample(&lbr_sample(0x40_0004, 0x40_1000, &[(0x40_0020, 0x40_0004), (0x40_0000, 0x40_0010)])));
        p.finish();
        let st = p.stats();
        assert_eq!((st.join.joined, st.join.unverified), (2, 0), "{st:?}");
        assert_eq!(got.borrow().len(), 2);
        assert_eq!(st.join.rejected.get(RejectReason::LeafNotReachable), 2, "{st:?}");
        assert_eq!(st.join.rejected.get(RejectReason::ReturnMismatch), 1, "{st:?}");

        let (mut a64, _) = x86_pipeline(Some(CodeArch::Aarch64));
        a64.push(SessionEvent::Sample(&good));
        a64.finish();
        assert_eq!(a64.stats().join.joined, 0, "A64 reads 48 89 c3 14 as B");
    }

    fn typed(ty: u8) -> u64 {
        u64::from(ty) << 20
    }

    /// AMD wrong-path entries are dropped (the path around them is whole again); a TSX abort
    /// and a BRBE half-record cut the chain there; flags that do not pair with the entries
    /// are ignored, counted.
    #[test]
    fn speculative_abort_and_partial_entries() {
        use crate::isa::br_type;
        let (mut p, got) = x86_pipeline(Some(CodeArch::X86_64));
        let ret_call = [(0x40_0020, 0x40_0005), (0x40_0030, 0x40_0038), (0x40_0000, 0x40_0010)];
        let mut s = lbr_sample(0x40_0006, 0x40_1000, &ret_call);
        s.branch_flags = vec![typed(br_type::RET), 1 << 24, typed(br_type::CALL)];
        p.push(SessionEvent::Sample(&s));
        // An abort inside the transaction at 0x400013, handler at 0x400018.
        let mut a = lbr_sample(0x40_0006, 0x40_1000, &[(0x40_0020, 0x40_0005), (0x40_0013, 0x40_0018), (0x40_0000, 0x40_0010)]);
        a.branch_flags = vec![typed(br_type::RET), (1 << 3) | (1 << 2), typed(br_type::CALL)];
        p.push(SessionEvent::Sample(&a));
        // A target-only record (from 0) in the middle.
        let z = lbr_sample(0x40_0006, 0x40_1000, &[(0x40_0020, 0x40_0005), (0, 0x40_0018), (0x40_0000, 0x40_0010)]);
        p.push(SessionEvent::Sample(&z));
        let mut m = lbr_sample(0x40_0006, 0x40_1000, &ret_call[..1]);
        m.branch_flags = vec![0, 0];
        p.push(SessionEvent::Sample(&m));
        p.finish();
        let st = p.stats();
        assert_eq!(st.join.joined, 4, "{st:?}");
        assert_eq!((st.lbr_wrong_path, st.lbr_tx_abort, st.lbr_partial_entries, st.lbr_cut_entries), (1, 1, 1, 2));
        assert_eq!(st.lbr_flags_mismatch, 1);
        let got = got.borrow();
        let pair = |f, t| BranchPair { from: f, to: t };
        assert_eq!(got[0].2, vec![pair(0x40_0020, 0x40_0005), pair(0x40_0000, 0x40_0010)]);
        assert_eq!(got[1].2, vec![pair(0x40_0020, 0x40_0005)]);
        assert_eq!(got[2].2, vec![pair(0x40_0020, 0x40_0005)]);
    }

    /// Without the drop, the wrong-path entry breaks the chain: the model is not vacuous.
    #[test]
    fn wrong_path_entry_kept_breaks_the_chain() {
        let (mut p, _) = x86_pipeline(Some(CodeArch::X86_64));
        p.push(SessionEvent::Sample(&lbr_sample(
            0x40_0006,
            0x40_1000,
            &[(0x40_0020, 0x40_0005), (0x40_0030, 0x40_0038), (0x40_0000, 0x40_0010)],
        )));
        p.finish();
        assert_eq!(p.stats().join.rejected.get(RejectReason::BrokenChain), 1);
    }

    /// The branch type must agree with the code about calls and returns; where the code is
    /// unknown (no image) it stands in for it, so calls and returns are still checked.
    #[test]
    fn branch_types_check_calls_and_returns() {
        use crate::isa::br_type;
        let (mut p, _) = x86_pipeline(Some(CodeArch::X86_64));
        let mut s = lbr_sample(0x40_0015, 0x40_0005, &[(0x40_0000, 0x40_0010)]);
        s.branch_flags = vec![typed(br_type::CALL)];
        p.push(SessionEvent::Sample(&s));
        s.branch_flags = vec![typed(br_type::RET)];
        p.push(SessionEvent::Sample(&s));
        s.branch_flags = vec![typed(br_type::COND)];
        p.push(SessionEvent::Sample(&s));
        p.finish();
        let st = p.stats();
        assert_eq!(st.join.joined, 1, "{st:?}");
        assert_eq!(st.join.rejected.get(RejectReason::BranchTypeMismatch), 2);

        // BRBE-typed A64 records without any code image: call at 0x1000, return to 0x1004.
        let mut a = Pipeline::new(PipelineConfig { arch: Some(CodeArch::Aarch64), ..Default::default() });
        let mut ok = lbr_sample(0x1008, 0x9000, &[(0x2000, 0x1004), (0x1000, 0x2000)]);
        ok.branch_flags = vec![typed(br_type::RET), typed(br_type::CALL)];
        a.push(SessionEvent::Sample(&ok));
        let mut bad = lbr_sample(0x100c, 0x9000, &[(0x2000, 0x1008), (0x1000, 0x2000)]);
        bad.branch_flags = ok.branch_flags.clone();
        a.push(SessionEvent::Sample(&bad));
        a.finish();
        let st = a.stats();
        assert_eq!((st.join.joined, st.join.rejected.get(RejectReason::ReturnMismatch)), (1, 1), "{st:?}");
    }

    /// Empty branch stacks are counted (not passed off as stack-only), and a warning says so
    /// when most samples are empty.
    #[test]
    fn empty_branch_stacks_are_counted_and_warned() {
        let (mut p, _) = x86_pipeline(Some(CodeArch::X86_64));
        for i in 0..30u64 {
            let mut s = lbr_sample(0x40_0015, 0x40_0005, &[]);
            s.time = i;
            p.push(SessionEvent::Sample(&s));
        }
        for _ in 0..5 {
            p.push(SessionEvent::Sample(&lbr_sample(0x40_0015, 0x40_0005, &[(0x40_0000, 0x40_0010)])));
        }
        p.finish();
        let st = p.stats();
        assert_eq!((st.lbr_samples, st.lbr_empty, st.stack_only_samples, st.profiled), (35, 30, 0, 35));
        assert!(st.branch_warning().is_some_and(|w| w.contains("30 of 35")), "{:?}", st.branch_warning());
        let few = PipelineStats { lbr_samples: 35, lbr_empty: 10, ..Default::default() };
        assert_eq!(few.branch_warning(), None);
    }

    /// A recording that does not say its architecture (and has no ETM) is not checked as
    /// A64: its branch samples are kept, counted unverified.
    #[test]
    fn recordings_without_arch_are_unverified() {
        let (mut p, _) = x86_pipeline(None);
        p.push(SessionEvent::Sample(&lbr_sample(0x40_0015, 0x40_0005, &[(0x40_0000, 0x40_0010)])));
        p.finish();
        let st = p.stats();
        assert_eq!((st.join.joined, st.join.unverified), (1, 1), "{st:?}");
        assert_eq!(p.code().arch(), None);
        let etm = Pipeline::new(PipelineConfig::from_meta(&SessionMeta {
            cpus: vec![CpuTraceConfig::default()],
            ..Default::default()
        }));
        assert_eq!(etm.code().arch(), Some(CodeArch::Aarch64));
    }

    /// `session.json` carries the architecture; older files without it read as `None`.
    #[test]
    fn meta_carries_arch() {
        let m = SessionMeta { arch: Some(CodeArch::X86_64), ..Default::default() };
        let j = serde_json::to_string(&m).unwrap();
        assert!(j.contains("\"arch\":\"x86_64\""), "{j}");
        assert_eq!(serde_json::from_str::<SessionMeta>(&j).unwrap().arch, Some(CodeArch::X86_64));
        let old = j.replace(",\"arch\":\"x86_64\"", "");
        assert_eq!(serde_json::from_str::<SessionMeta>(&old).unwrap().arch, None);
    }

    /// Random bytes, random records and hostile sideband through the real decoder never panic,
    /// and every sample is accounted for (joined or rejected by reason) after `finish`.
    #[test]
    fn garbage_never_panics_and_is_accounted() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut rnd = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for raw in [true, false] {
            let cfg = PipelineConfig {
                cpus: (0..2)
                    .map(|c| CpuTraceConfig {
                        cpu: c,
                        trace_id: 0x10 + 2 * c as u8,
                        trcidr0: 0x2880_06a1,
                        trcidr2: 0xc000_1088,
                        trcconfigr: 0x1840,
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            };
            let mut p = Pipeline::new(cfg);
            p.add_image("/not/an/elf", Arc::new(vec![0x7f, b'E', b'L', b'F', 2, 1, 1]));
            let mut samples = 0;
            for i in 0..400u64 {
                let cpu = (rnd() % 3) as i32 - 1;
                match rnd() % 4 {
                    0 | 1 => {
                        let n = (rnd() % 600) as usize;
                        let mut d: Vec<u8> = (0..n).map(|_| rnd() as u8).collect();
                        if rnd() % 3 == 0 {
                            // Sometimes a valid ETE prologue (A-sync, trace info, trace on).
                            let mut v = vec![0u8; 11];
                            v.extend_from_slice(&[0x80, 0x01, 0x00, 0x04]);
                            v.extend_from_slice(&d);
                            d = v;
                        }
                        let flags = (rnd() % 0x200) & 0x10f | if raw { PERF_AUX_FLAG_CORESIGHT_FORMAT_RAW } else { 0 };
                        let rec = AuxRecord {
                            cpu,
                            flags,
                            time: i * 100,
                            aux_offset: rnd() % 4096,
                            size: d.len() as u64 + rnd() % 3,
                            source_cpu: None,
                        };
                        p.push(SessionEvent::Aux { record: rec, data: &d });
                    }
                    2 => {
                        samples += 1;
                        let stack: Vec<u64> = (0..rnd() % 5).map(|_| rnd()).collect();
                        let s = PauseSample {
                            cpu,
                            pid: 1,
                            tid: 1,
                            time: i * 100 + rnd() % 200,
                            stack,
                            branches: None,
                            branch_flags: Vec::new(),
                            window_ns: None,
                            user_stack: None,
                        };
                        p.push(SessionEvent::Sample(&s));
                    }
                    _ => {
                        let sb = match rnd() % 3 {
                            0 => Sideband::Mmap2 {
                                pid: 1,
                                tid: 1,
                                addr: rnd(),
                                len: rnd(),
                                pgoff: rnd(),
                                prot: 5,
                                flags: 2,
                                filename: "/not/an/elf".into(),
                                build_id: None,
                                time: i,
                                cpu: None,
                            },
                            1 => Sideband::Lost { id: 0, lost: rnd() % 10, time: i, cpu: Some(cpu) },
                            _ => Sideband::AuxOutputHwId { hw_id: rnd(), time: i, cpu: Some(cpu) },
                        };
                        p.push(SessionEvent::Sideband(&sb));
                    }
                }
                if i % 50 == 0 {
                    p.trace_complete_until(Some(cpu), i * 100);
                }
            }
            p.finish();
            let st = p.stats();
            assert_eq!(st.samples, samples);
            assert_eq!(st.join.samples, st.join.joined + st.join.rejected.total(), "{st:?}");
        }
    }

    fn bps(base: u64, n: u64) -> Vec<BranchPair> {
        (0..n).map(|i| BranchPair { from: base + 0x10 * i + 8, to: base + 0x10 * (i + 1) }).collect()
    }

    fn newest_first(v: &[BranchPair]) -> Vec<BranchPair> {
        v.iter().rev().copied().collect()
    }

    /// A window as a resume starts it: sync, trace info, timestamp, trace on, [context], and
    /// the branches.
    fn win(ts: u64, ctx: Option<u32>, brs: &[BranchPair]) -> Vec<u8> {
        let mut w = ToyWriter::default();
        w.sync().trace_info().ts(ts).trace_on();
        if let Some(c) = ctx {
            w.context(c);
        }
        for b in brs {
            w.branch(b.from, b.to);
        }
        w.0
    }

    fn tid_sample(cpu: i32, tid: u32, time: u64) -> PauseSample {
        PauseSample {
            cpu,
            pid: 1,
            tid,
            time,
            stack: vec![0x9000],
            branches: None,
            branch_flags: Vec::new(),
            window_ns: None,
            user_stack: None,
        }
    }

    fn joined(got: &Got) -> Vec<(u64, Vec<BranchPair>)> {
        got.borrow().iter().map(|g| (g.1, g.2.clone())).collect()
    }

    /// COLLISION (a TRBE wrap: the ETE kept tracing while the buffer was off) ends the stream
    /// with its record: the window continuing in the next record, mid-stream without a sync,
    /// is never joined; the next window (with its sync) is.
    #[test]
    fn collision_breaks_the_window_that_goes_on() {
        let (mut p, got) = pipeline(&[0]);
        let a = bps(0x1000, 6);
        let b = bps(0x5000, 4);
        let mut rest = ToyWriter::default();
        for x in &a[3..] {
            rest.branch(x.from, x.to);
        }
        let (r1, d1) = aux(0, 1100, &win(1000, None, &a[..3]), PERF_AUX_FLAG_COLLISION);
        let (r2, d2) = aux(0, 1300, &rest.0, 0);
        let (r3, d3) = aux(0, 2100, &win(2000, None, &b), 0);
        feed(
            &mut p,
            &[E::Aux(r1, d1), E::Aux(r2, d2), E::S(tid_sample(0, 1, 1400)), E::Aux(r3, d3), E::S(tid_sample(0, 1, 2200))],
        );
        assert_eq!(joined(&got), vec![(2200, newest_first(&b))]);
        let st = p.stats();
        assert_eq!((st.aux_collision_resets, st.join.rejected.get(RejectReason::BrokenWindow)), (1, 1));
    }

    /// A window dated by its trace timestamp (after the trace-on, as the ETE adapter reports
    /// the one between sync and trace-on) with branches `a`.
    fn clock_window(ts: u64, a: &[BranchPair]) -> Vec<u8> {
        let mut w = ToyWriter::default();
        w.sync().trace_info().trace_on().ts(ts);
        for b in a {
            w.branch(b.from, b.to);
        }
        w.0
    }

    /// A new trace clock conversion (`set_clock`) dates the data pushed after it: the same
    /// trace timestamp, with `time_zero` moved on by 10,000 ns, dates a window after the
    /// previous pause, so its own pause joins it; without the new clock the window would date
    /// before that pause and no later pause could join it.
    #[test]
    fn set_clock_dates_the_data_pushed_after_it() {
        let a = bps(0x1000, 4);
        let win = |ts: u64| clock_window(ts, &a);
        for shift in [true, false] {
            let (mut p, got) = pipeline(&[0]);
            let (r1, d1) = aux(0, 1100, &win(1000), 0);
            feed(&mut p, &[E::Aux(r1, d1), E::S(tid_sample(0, 1, 1200))]);
            if shift {
                p.set_clock(Some(ClockParams { time_zero: 10_000, time_mult: 1, ..Default::default() }));
            }
            let (r2, d2) = aux(0, 11_100, &win(1000), 0);
            let (r3, d3) = aux(0, 21_100, &win(if shift { 11_000 } else { 21_000 }), 0);
            feed(&mut p, &[E::Aux(r2, d2), E::S(tid_sample(0, 1, 11_200)), E::Aux(r3, d3), E::S(tid_sample(0, 1, 21_200))]);
            p.finish();
            let times: Vec<u64> = joined(&got).iter().map(|j| j.0).collect();
            if shift {
                assert_eq!(times, vec![1200, 11_200, 21_200]);
            } else {
                assert_eq!(times, vec![1200, 21_200]);
            }
        }
    }

    /// With decode threads too, `set_clock` dates only the data pushed after it (the events
    /// queued for the join keep the clock they were pushed with).
    #[test]
    fn set_clock_with_decode_threads() {
        let a = bps(0x1000, 4);
        let win = |ts: u64| clock_window(ts, &a);
        for threads in [1, 2] {
            let (mut p, got) = pipeline_with(&[0], Arc::new(ToyFactory), threads);
            let (r1, d1) = aux(0, 1100, &win(1000), 0);
            push_all(&mut p, &[E::Aux(r1, d1), E::S(tid_sample(0, 1, 1200))]);
            p.set_clock(Some(ClockParams { time_zero: 10_000, time_mult: 1, ..Default::default() }));
            let (r2, d2) = aux(0, 11_100, &win(1000), 0);
            let (r3, d3) = aux(0, 21_100, &win(11_000), 0);
            feed(&mut p, &[E::Aux(r2, d2), E::S(tid_sample(0, 1, 11_200)), E::Aux(r3, d3), E::S(tid_sample(0, 1, 21_200))]);
            let times: Vec<u64> = joined(&got).iter().map(|j| j.0).collect();
            assert_eq!(times, vec![1200, 11_200, 21_200], "{threads} threads");
        }
    }

    /// Raw fragments of a per-thread buffer (AUX cpu -1) belong to the CPU in their
    /// sample_id: each CPU's samples join with that CPU's fragment, and a change of CPU
    /// restarts the stream.
    #[test]
    fn per_thread_fragments_follow_their_cpu() {
        let (mut p, got) = pipeline(&[1, 3]);
        let a = bps(0x1000, 4);
        let b = bps(0x7000, 5);
        let (mut r1, d1) = aux(-1, 1100, &win(1000, None, &a), 0);
        r1.source_cpu = Some(1);
        let (mut r2, d2) = aux(-1, 2100, &win(2000, None, &b), 0);
        r2.source_cpu = Some(3);
        feed(&mut p, &[E::Aux(r1, d1), E::S(tid_sample(1, 1, 1200)), E::Aux(r2, d2), E::S(tid_sample(3, 1, 2200))]);
        let mut g = got.borrow().clone();
        g.sort_by_key(|x| x.1);
        assert_eq!(g, vec![(1, 1200, newest_first(&a)), (3, 2200, newest_first(&b))]);
        assert_eq!(p.stats().aux_cpu_changes, 1);
    }

    /// A window closed in another process (its pause record) takes its trace with it: a
    /// target sample after it with no trace of its own is NoWindow, not the other
    /// process's branches.
    #[test]
    fn another_process_window_is_not_joined() {
        let (mut p, got) = pipeline(&[0]);
        let a = bps(0x1000, 4);
        let (r1, d1) = aux(0, 1100, &win(1000, None, &a), 0);
        let end = Sideband::WindowEnd { pid: 9, tid: 9, window_ns: None, time: 1200, cpu: 0 };
        feed(&mut p, &[E::Aux(r1, d1), E::Sb(end), E::S(tid_sample(0, 1, 1500))]);
        assert!(joined(&got).is_empty());
        let st = p.stats();
        assert_eq!((st.join.rejected.get(RejectReason::NoWindow), st.join.foreign_segments, st.window_ends), (1, 1, 1));
    }

    /// Context IDs in the trace: a window in which thread 100 ran, then (after a kernel
    /// excursion, Trace On) thread 200: a sample of 200 gets only 200's branches (the chain
    /// is cut at the switch), a sample of a third thread none (ForeignContext).
    #[test]
    fn traced_context_switch_cuts_the_chain() {
        for (tid, want) in [(200u32, true), (300, false)] {
            let (mut p, got) = pipeline(&[0]);
            let a = bps(0x1000, 3);
            let b = bps(0x4000, 2);
            let mut w = ToyWriter(win(1000, Some(100), &a));
            w.trace_on().context(200);
            for x in &b {
                w.branch(x.from, x.to);
            }
            let (r, d) = aux(0, 1100, &w.0, 0);
            feed(&mut p, &[E::Aux(r, d), E::S(tid_sample(0, tid, 1200))]);
            let st = p.stats();
            if want {
                assert_eq!(joined(&got), vec![(1200, newest_first(&b))]);
                assert_eq!(st.join.context_cut, 1);
            } else {
                assert!(joined(&got).is_empty());
                assert_eq!(st.join.rejected.get(RejectReason::ForeignContext), 1);
            }
        }
    }

    /// Without context IDs, the switch records place dated segments: the part of the window
    /// before the sample's thread switched in is not its trace.
    #[test]
    fn switch_records_cut_the_chain() {
        let (mut p, got) = pipeline(&[0]);
        let a = bps(0x1000, 3);
        let b = bps(0x4000, 2);
        let mut w = ToyWriter(win(1000, None, &a));
        w.trace_on().ts(1500);
        for x in &b {
            w.branch(x.from, x.to);
        }
        let sw = Sideband::Switch { out: false, pid: 1, tid: 7, next_prev: Some((5, 5)), time: 1200, cpu: Some(0) };
        let (r, d) = aux(0, 1600, &w.0, 0);
        feed(&mut p, &[E::Sb(sw), E::Aux(r, d), E::S(tid_sample(0, 7, 1700))]);
        assert_eq!(joined(&got), vec![(1700, newest_first(&b))]);
    }

    /// A throttle stops the group and drops the open trace: the window it cut is rejected as
    /// throttled, the next window joins.
    #[test]
    fn throttle_rejects_the_cut_window() {
        let (mut p, got) = pipeline(&[0]);
        let a = bps(0x1000, 3);
        let b = bps(0x6000, 3);
        let (r1, d1) = aux(0, 1050, &win(1000, None, &a), 0);
        let th = |un, t| Sideband::Throttle { id: 1, unthrottle: un, time: t, cpu: Some(0) };
        let (r2, d2) = aux(0, 2100, &win(2000, None, &b), 0);
        feed(
            &mut p,
            &[
                E::Aux(r1, d1),
                E::Sb(th(false, 1100)),
                E::S(tid_sample(0, 1, 1110)),
                E::Sb(th(true, 1900)),
                E::Aux(r2, d2),
                E::S(tid_sample(0, 1, 2200)),
            ],
        );
        assert_eq!(joined(&got), vec![(2200, newest_first(&b))]);
        assert_eq!(p.stats().join.rejected.get(RejectReason::Throttled), 1);
    }

    /// A TraceComplete from the driver resolves a sample whose CPU has no later trace,
    /// before the end of the stream; a sample after the proven time stays pending.
    #[test]
    fn trace_complete_resolves_pending_samples() {
        let (mut p, got) = pipeline(&[0]);
        let a = bps(0x1000, 3);
        let (r, d) = aux(0, 1050, &win(1000, None, &a), 0);
        p.push(SessionEvent::Aux { record: r, data: &d });
        p.push(SessionEvent::Sample(&tid_sample(0, 1, 1100)));
        p.push(SessionEvent::Sample(&tid_sample(0, 1, 3000)));
        assert!(joined(&got).is_empty(), "nothing proves the windows complete yet");
        p.push(SessionEvent::Sideband(&Sideband::TraceComplete { cpu: Some(0), time: 2000 }));
        assert_eq!(joined(&got), vec![(1100, newest_first(&a))]);
        assert_eq!(p.stats().join.by_watermark, 1);
    }
}
