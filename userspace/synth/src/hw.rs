//! Sessions shaped like hardware: a model of the kernel's perf core and the CoreSight drivers,
//! written from their sources (Linux 7.1: `kernel/events/{core,ring_buffer}.c`,
//! `drivers/hwtracing/coresight/coresight-{etm-perf,etm4x-core,tmc-etr,trbe}.c`), function by
//! function, that runs real AArch64 program paths (from qemu-user) as processes and threads on
//! several CPUs and fills the same data and AUX rings ([`etm_live::ring::MemRing`]) that the
//! live collector drains. What the model does, and from where:
//!
//! * **Scheduling**: tasks (threads of processes) run for quanta of user instructions and
//!   migrate between CPUs through one run queue; a switch costs kernel time and writes
//!   PERF_RECORD_SWITCH_CPU_WIDE out and in records (`perf_event_switch`, the leader has
//!   `context_switch`); CONTEXTIDR holds the thread id of the task (`contextidr_thread_switch`,
//!   with `CONFIG_PID_IN_CONTEXTIDR`; without it the context packets carry no ID).
//! * **PMU**: the resume and pause events count user cycles (one instruction per ns on a CPU;
//!   `exclude_kernel`: nothing counts in kernel time). An overflow is a PMI: kernel time, and
//!   in `__perf_event_overflow` order: interrupt accounting (`__perf_event_account_interrupt`:
//!   at `max_samples_per_tick` per event and tick, `perf_event_throttle_group` stops every
//!   member with `pmu->stop(event, 0)` and writes PERF_RECORD_THROTTLE for the leader;
//!   `perf_adjust_freq_unthr_events` restarts them at the next tick with UNTHROTTLE), then the
//!   pause (`perf_event_aux_pause`), then the program, then the resume.
//! * **cs_etm** (`coresight-etm-perf.c`): `etm_event_start` begins the AUX transaction
//!   (`perf_aux_output_begin`: no space → `perf_event_disable_inatomic`), writes
//!   AUX_OUTPUT_HW_ID once per CPU, enables the sink and the trace unit unless paused
//!   (`etm4_enable_perf`: `drvdata->paused = hw.aux_paused`); `etm_event_pause` disables the
//!   trace unit and, for a sink that is not per-CPU, updates the buffer (one
//!   PERF_RECORD_AUX per pause if it copied something); `etm_event_stop` with
//!   `PERF_EF_UPDATE` updates the buffer and ends the transaction; **without** it (throttling)
//!   it leaves the transaction open, so every later `perf_aux_output_begin` fails
//!   (`WARN_ON_ONCE(nest)`): the CPU's trace is off until the group is opened anew.
//! * **Trace unit**: at enable A-sync, Trace Info, a timestamp; Trace On with the address and
//!   context when user code is traced again (after the enable, a kernel excursion or a task
//!   switch), preceded by a timestamp (the kernel sets the timestamp event to its maximum
//!   rate); an exception packet where user code is left for the kernel (`SVC`, the PMI, the
//!   tick that preempts). Written by [`crate::ete::Encoder`].
//! * **TRBE** (`coresight-trbe.c`): writes straight into the AUX pages up to a limit computed
//!   as `__trbe_normal_offset` does (head aligned with Ignore padding and
//!   `perf_aux_output_skip`, limit at the page after `aux_wakeup + aux_watermark`, never past
//!   the tail); reaching it stops the TRBE and raises the IRQ after a latency, trace produced
//!   meanwhile is lost; `trbe_handle_overflow` ends the transaction with COLLISION and starts a
//!   new one. `arm_trbe_update_buffer` at stop publishes what was written. Data is RAW.
//! * **ETR** (`coresight-tmc-etr.c`): the formatter ([`crate::formatter`]) interleaves the
//!   sources' bytes in frames in a circular buffer. Shared by all CPUs (CPU-wide, one owner:
//!   `get_perf_etr_buf_cpu_wide`), `tmc_update_etr_buffer` copies nothing while `refcnt != 1`:
//!   pauses publish nothing, and the last CPU to stop copies the newest
//!   `min(buffer, AUX space)` bytes into its own AUX ring, TRUNCATED with a 16-byte barrier
//!   (`tmc_etr_buf_insert_barrier_packet`) if the buffer wrapped or did not fit. A private ETR
//!   (one CPU) copies at every pause.
//! * **BPF**: the resume and pause programs of `ebpf/src/main.rs` (window slot per CPU), the
//!   pause record written through the CPU's bpf-output event into the leader's ring.
//!
//! The ground truth ([`TruthSample`]) is, for every pause record of the target, the branches
//! the sample's window holds for its thread — the newest first, from the trace unit's enable,
//! stopping where another thread ran — and whether every byte of that window reached the
//! AUX ring.

use std::collections::VecDeque;

use etm_bpf_common::{PAUSE_TARGET, PauseHeader};
use etm_live::collect::Groups;
use etm_live::ring::MemRing;
use etm_live::stream::{CpuStream, IdRole, pause_sample_record};
use etm_perf::attr::RING_SAMPLE_TYPE;
use etm_perf::records::{SampleFormat, SampleId, build, misc, sample, types};
use etm_session::session::{
    BranchPair, ClockParams, CpuTraceConfig, PERF_AUX_FLAG_COLLISION, PERF_AUX_FLAG_CORESIGHT_FORMAT_RAW,
    PERF_AUX_FLAG_TRUNCATED, TraceArch,
};

use crate::ete::{self, Context, Encoder, EncoderConfig};
use crate::formatter::Formatter;
use crate::generate::{clock, regs};
use crate::image::CodeImage;
use crate::truth::{BranchKind, CallStack, Flow, PathStats, flow};

/// A program to run as tasks: its executed path and each instruction's flow (the path loops:
/// its last instruction is followed by its first, a discontinuity).
pub struct Program {
    /// The file name MMAP2 records carry.
    pub file: String,
    /// Executable segments (for the MMAP2 records).
    pub image: CodeImage,
    /// The executed PCs.
    pub pcs: Vec<u64>,
    flows: Vec<Flow>,
}

impl Program {
    /// `pcs` is the path qemu-user reported for `image` (see [`crate::qemu::run`]).
    pub fn new(file: impl Into<String>, mut image: CodeImage, pcs: Vec<u64>) -> Program {
        let wfx = regs::TRCIDR2 >> 31 == 1;
        let n = pcs.len();
        let flows =
            (0..n)
                .map(|i| {
                    if i + 1 == n { Flow::Gap { next: pcs[0] } } else { flow(image.class(pcs[i]), pcs[i], Some(pcs[i + 1]), wfx) }
                })
                .collect();
        Program { file: file.into(), image, pcs, flows }
    }
}

/// A task to run: a thread `tid` of process `pid` running `program` from instruction `start`.
#[derive(Debug, Clone, Copy)]
pub struct TaskSpec {
    pub pid: u32,
    pub tid: u32,
    pub program: usize,
    pub start: usize,
}

/// Where the trace goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Topology {
    /// A TRBE per CPU (Neoverse V2 style).
    Trbe,
    /// One ETR for every CPU (Neoverse N1 style), CPU-wide session.
    SharedEtr,
    /// One ETR per CPU.
    PrivateEtr,
}

/// Model parameters (times in ns; one user instruction per ns).
#[derive(Debug, Clone)]
pub struct ModelConfig {
    pub cpus: u32,
    pub topology: Topology,
    /// Pause event period (user cycles).
    pub pause_period: u64,
    /// Resume event period (user cycles).
    pub resume_period: u64,
    /// Task quantum in user instructions (min, max).
    pub quantum: (u64, u64),
    /// Kernel time of a context switch.
    pub switch_ns: u64,
    /// Kernel time of a PMI.
    pub pmi_ns: u64,
    /// CONTEXTIDR carries the thread id (`CONFIG_PID_IN_CONTEXTIDR`).
    pub context_ids: bool,
    /// Return-stack compression.
    pub retstack: bool,
    /// Process the BPF programs capture stacks of.
    pub target_pid: u32,
    /// Branch records the join keeps (truth depth).
    pub depth: usize,
    /// Data ring bytes per CPU.
    pub data_bytes: usize,
    /// AUX ring bytes per CPU.
    pub aux_bytes: usize,
    /// TRBE: `attr.aux_watermark` (bytes).
    pub aux_watermark: u64,
    /// TRBE: time from reaching the limit to the IRQ handler (trace meanwhile is lost).
    pub trbe_irq_ns: u64,
    /// TRBE pointer alignment (TRBIDR.Align).
    pub trbe_align: u64,
    /// ETR buffer bytes.
    pub etr_bytes: u64,
    /// `max_samples_per_tick` (None: no throttling) and the tick length.
    pub throttle: Option<(u64, u64)>,
    /// Page size.
    pub page: u64,
    /// Seed of the scheduler's choices.
    pub seed: u64,
}

impl Default for ModelConfig {
    fn default() -> Self {
        ModelConfig {
            cpus: 4,
            topology: Topology::Trbe,
            pause_period: 4_001,
            resume_period: 40_009,
            quantum: (150_000, 600_000),
            switch_ns: 3_000,
            pmi_ns: 1_200,
            context_ids: true,
            retstack: true,
            target_pid: 100,
            depth: 32,
            data_bytes: 256 << 10,
            aux_bytes: 1 << 20,
            aux_watermark: 64 << 10,
            trbe_irq_ns: 2_000,
            trbe_align: 64,
            etr_bytes: 4 << 20,
            throttle: None,
            page: 4096,
            seed: 1,
        }
    }
}

/// The ground truth of one pause record of the target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TruthSample {
    pub cpu: i32,
    /// Perf-clock time of the pause record.
    pub time: u64,
    pub tid: u32,
    /// The thread's branches in the window, newest first (at most `depth`).
    pub branches: Vec<BranchPair>,
    /// Every byte of the window reached the AUX ring (and it was traced at all), and so did
    /// what shows where it ended.
    pub complete: bool,
    /// Why not complete.
    pub loss: Option<Loss>,
}

/// Why a window's trace did not all arrive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Loss {
    /// No trace unit was on at the pause (the AUX leader was stopped: throttled, disabled).
    NotTraced,
    /// The TRBE reached its limit: trace until the IRQ was lost (COLLISION).
    TrbeWrap,
    /// The ETR buffer wrapped or did not fit into the AUX ring (TRUNCATED).
    EtrLost,
    /// No AUX space: the kernel disabled the event.
    AuxFull,
    /// The group was throttled.
    Throttled,
    /// The thread's path jumped inside the window (the model's path restarted): its branches
    /// before the jump form no chain with those after it.
    Discontinuity,
    /// The window's trace arrived whole, but the start of the next window on its CPU (its
    /// Trace On, where a consumer's segment of this window ends) was cut by a TRBE wrap, and
    /// the COLLISION record ends there: nothing in the trace shows the window over.
    EndLost,
}

/// Counters of the model.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ModelStats {
    pub user_insns: u64,
    pub switches: u64,
    pub pmis: u64,
    pub windows: u64,
    pub target_windows: u64,
    pub foreign_windows: u64,
    pub trbe_irqs: u64,
    pub trbe_lost_bytes: u64,
    pub etr_publishes: u64,
    pub etr_truncated: u64,
    pub aux_records: u64,
    pub data_lost: u64,
    pub throttles: u64,
    pub aux_disables: u64,
    pub trace_bytes: u64,
}

struct Task {
    pid: u32,
    tid: u32,
    prog: usize,
    i: usize,
    stack: CallStack,
}

/// One piece of a window: a run of user code of one thread between kernel excursions.
struct Piece {
    tid: u32,
    branches: Vec<BranchPair>,
    /// The thread's path jumped to get here (the model's path restarting): no chain of
    /// branches continues across it.
    after_gap: bool,
}

/// The trace unit while enabled (a trace window).
struct TraceUnit {
    enc: Encoder,
    pieces: Vec<Piece>,
    /// The next traced instruction needs Trace On + address + context.
    need_trace_on: bool,
    /// ... and it follows a jump of the path.
    after_gap: bool,
    lost: Option<Loss>,
    /// Shared ETR: frame position of the window's first bytes (wrap accounting).
    etr_pos: Option<u64>,
    /// Some of its bytes reached the sink already (its start: sync, Trace Info, Trace On).
    wrote: bool,
}

/// The AUX transaction (`struct perf_output_handle` between `perf_aux_output_begin` and
/// `perf_aux_output_end`): `head` (ring position), `size` (space), `wakeup`.
#[derive(Debug, Clone, Copy, Default)]
struct Txn {
    head: u64,
    size: u64,
    wakeup: u64,
}

#[derive(Default)]
struct Trbe {
    enabled: bool,
    /// Write pointer and limit (ring positions).
    write: u64,
    limit: u64,
    /// IRQ pending at this time (the TRBE stopped at its limit).
    irq_at: Option<u64>,
}

#[derive(Default)]
struct Etr {
    fmt: Formatter,
    /// Frame bytes written since the sink was enabled (circular buffer of `etr_bytes`).
    buf: Vec<u8>,
    written: u64,
    /// Paths enabled into it (`csdev->refcnt`).
    refcnt: u32,
}

impl Etr {
    fn push(&mut self, id: u8, data: &[u8], size: u64) {
        self.fmt.push(id, data);
        self.store(size);
    }
    fn store(&mut self, size: u64) {
        for b in self.fmt.take_frames() {
            let at = (self.written % size) as usize;
            if self.buf.len() < size as usize {
                self.buf.push(b);
            } else {
                self.buf[at] = b;
            }
            self.written += 1;
        }
    }
    /// The newest bytes in order, and whether older ones were overwritten.
    fn contents(&mut self, size: u64) -> (Vec<u8>, bool) {
        self.fmt.flush();
        self.store(size);
        if self.written <= size {
            return (self.buf.clone(), false);
        }
        let at = (self.written % size) as usize;
        let mut v = self.buf[at..].to_vec();
        v.extend_from_slice(&self.buf[..at]);
        (v, true)
    }
    fn reset(&mut self) {
        self.fmt.reset();
        self.buf.clear();
        self.written = 0;
    }
}

struct Cpu {
    id: u32,
    ring: MemRing,
    leader_id: u64,
    out_id: u64,
    task: Option<usize>,
    slice_left: u64,
    busy_until: u64,
    /// Task switched in when the kernel time ends.
    switch_in: Option<usize>,
    // group state
    enabled: bool,
    kernel_off: bool,
    throttled: bool,
    stuck: bool,
    leader_running: bool,
    hwid_done: bool,
    pause_irqs: u64,
    resume_irqs: u64,
    pause_left: u64,
    resume_left: u64,
    aux_paused: bool,
    tu: Option<TraceUnit>,
    // BPF window slot
    bpf_open: bool,
    bpf_seq: u32,
    bpf_resume_t: u64,
    /// The open AUX transaction, if any.
    txn: Option<Txn>,
    // sinks
    trbe: Trbe,
    etr: Etr,
    // records not written (the data ring was full)
    pending_lost: u64,
    /// Truth samples whose windows' bytes are in the open TRBE transaction, not published yet.
    unpublished: Vec<usize>,
    /// The truth sample of the CPU's last closed window, if it was a target window.
    last_window: Option<usize>,
}

/// The model (module docs).
pub struct Model {
    cfg: ModelConfig,
    programs: Vec<Program>,
    tasks: Vec<Task>,
    runq: VecDeque<usize>,
    cpus: Vec<Cpu>,
    /// Shared ETR.
    etr: Etr,
    /// Shared ETR: truth samples whose windows are in the buffer, with their frame positions.
    etr_windows: Vec<(usize, u64)>,
    t: u64,
    rng: u64,
    next_tick: u64,
    /// Ground truth, in record order per CPU.
    pub truth: Vec<TruthSample>,
    pub stats: ModelStats,
}

const LEADER_FMT: SampleFormat =
    SampleFormat { sample_type: RING_SAMPLE_TYPE, sample_id_all: true, branch_hw_index: false, regs_user_mask: 0 };
const OUT_FMT: SampleFormat = SampleFormat { sample_type: RING_SAMPLE_TYPE | sample::RAW, ..LEADER_FMT };

/// Trace ID of a CPU (the legacy allocation `0x10 + 2 * cpu`).
pub fn trace_id(cpu: u32) -> u8 {
    // Beyond 48 CPUs the legacy IDs would leave the valid range (0x01-0x6f); the dynamic
    // allocator (coresight-trace-id.c) then hands out free ones: the odd IDs from 0x11.
    if cpu < 48 { 0x10 + 2 * cpu as u8 } else { 0x11 + 2 * (cpu - 48) as u8 }
}

impl Model {
    /// A model running `tasks` of `programs`; every group starts disabled (the collector's
    /// driver enables them, as `run` does).
    pub fn new(cfg: ModelConfig, programs: Vec<Program>, tasks: &[TaskSpec]) -> Model {
        let cpus = (0..cfg.cpus)
            .map(|c| Cpu {
                id: c,
                ring: MemRing::new(cfg.data_bytes, cfg.aux_bytes),
                leader_id: 1000 + c as u64,
                out_id: 2000 + c as u64,
                task: None,
                slice_left: 0,
                busy_until: 0,
                switch_in: None,
                enabled: false,
                kernel_off: false,
                throttled: false,
                stuck: false,
                leader_running: false,
                hwid_done: false,
                pause_irqs: 0,
                resume_irqs: 0,
                pause_left: cfg.pause_period,
                // Different phases per CPU.
                resume_left: cfg.resume_period / (c as u64 + 2) + 1,
                aux_paused: true,
                tu: None,
                bpf_open: false,
                bpf_seq: 0,
                bpf_resume_t: 0,
                txn: None,
                trbe: Trbe::default(),
                etr: Etr::default(),
                pending_lost: 0,
                unpublished: Vec::new(),
                last_window: None,
            })
            .collect();
        let tasks: Vec<Task> = tasks
            .iter()
            .map(|s| Task {
                pid: s.pid,
                tid: s.tid,
                prog: s.program,
                i: s.start % programs[s.program].pcs.len(),
                stack: CallStack::default(),
            })
            .collect();
        let runq = (0..tasks.len()).collect();
        let next_tick = cfg.throttle.map_or(u64::MAX, |(_, tick)| tick);
        let rng = cfg.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        Model {
            cfg,
            programs,
            tasks,
            runq,
            cpus,
            etr: Etr::default(),
            etr_windows: Vec::new(),
            t: 0,
            rng,
            next_tick,
            truth: Vec::new(),
            stats: ModelStats::default(),
        }
    }

    /// Model time (ns).
    pub fn now(&self) -> u64 {
        self.t
    }

    /// The perf-clock time of model time `t`: the synthetic clock of [`crate::generate::clock`]
    /// (a 100 MHz counter; ETE timestamps convert to exactly this, rounded down to 10 ns).
    pub fn perf_time(t: u64) -> u64 {
        clock::perf_time(clock::COUNTER_BASE) + t
    }

    fn counter(t: u64) -> u64 {
        clock::COUNTER_BASE + t / clock::INSNS_PER_TICK
    }

    /// The clock parameters of the session (perf's user-page conversion of the counter).
    pub fn clock_params() -> ClockParams {
        ClockParams {
            time_zero: clock::TIME_ZERO,
            time_mult: clock::TIME_MULT,
            time_shift: clock::TIME_SHIFT,
            ..Default::default()
        }
    }

    /// The trace configuration of every CPU (ETE, as in [`crate::generate::regs`]).
    pub fn cpu_configs(&self) -> Vec<CpuTraceConfig> {
        let rs = if self.cfg.retstack { regs::CONFIGR_RS } else { 0 };
        (0..self.cfg.cpus)
            .map(|c| CpuTraceConfig {
                cpu: c as i32,
                arch: TraceArch::Ete,
                trace_id: trace_id(c),
                sink_id: None,
                trcconfigr: regs::CONFIGR_CID | regs::CONFIGR_TS | rs,
                trcidr0: regs::TRCIDR0,
                trcidr1: regs::TRCIDR1,
                trcidr2: regs::TRCIDR2,
                trcidr8: regs::TRCIDR8,
                trcauthstatus: regs::TRCAUTHSTATUS,
                trcdevarch: regs::TRCDEVARCH,
                ts_source: 1,
            })
            .collect()
    }

    /// The streams that drain the CPUs' rings (the ids and formats `group::open` would give).
    pub fn streams(&self) -> Vec<CpuStream> {
        self.cpus.iter().map(|c| self.stream(c)).collect()
    }

    fn stream(&self, c: &Cpu) -> CpuStream {
        let ids = [(c.leader_id, IdRole::Etm, LEADER_FMT), (c.out_id, IdRole::BpfOutput, OUT_FMT)];
        let mut s = CpuStream::new(c.id as i32, LEADER_FMT, &ids, self.cfg.aux_bytes as u64);
        s.target = Some(self.cfg.target_pid);
        s
    }

    /// The programs.
    pub fn programs(&self) -> &[Program] {
        &self.programs
    }

    fn rand(&mut self) -> u64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }

    /// Runs the model until time `t`.
    pub fn run_until(&mut self, t: u64) {
        for c in 0..self.cpus.len() {
            if std::mem::take(&mut self.cpus[c].ring.reenable_pending) && self.cpus[c].enabled && self.cpus[c].kernel_off {
                self.cpus[c].kernel_off = false;
                self.start(c);
            }
        }
        while self.t < t {
            if self.t >= self.next_tick {
                self.tick();
            }
            for c in 0..self.cpus.len() {
                self.step(c);
            }
            self.t += 1;
        }
    }

    // ---- the tick: interrupt accounting and unthrottling --------------------------------

    /// `perf_event_task_tick` → `perf_adjust_freq_unthr_context`: a new interrupt count per
    /// tick, and throttled groups restarted with PERF_RECORD_UNTHROTTLE.
    fn tick(&mut self) {
        let tick = self.cfg.throttle.map_or(u64::MAX, |(_, t)| t);
        self.next_tick = self.next_tick.saturating_add(tick);
        for c in 0..self.cpus.len() {
            let cpu = &mut self.cpus[c];
            cpu.pause_irqs = 0;
            cpu.resume_irqs = 0;
            if cpu.throttled {
                cpu.throttled = false;
                self.throttle_record(c, true);
                // The leader's pmu->start: fails while the transaction is stuck.
                self.start(c);
            }
        }
    }

    fn throttle_record(&mut self, c: usize, unthrottle: bool) {
        let cpu = &self.cpus[c];
        let mut body = Vec::with_capacity(24);
        for v in [Self::perf_time(self.t), cpu.leader_id, cpu.leader_id] {
            body.extend_from_slice(&v.to_le_bytes());
        }
        let ty = if unthrottle { types::UNTHROTTLE } else { types::THROTTLE };
        let rec = build::record(ty, 0, &body, &LEADER_FMT, &self.sid(c, None));
        self.write_record(c, &rec);
    }

    // ---- records ------------------------------------------------------------------------

    fn sid(&self, c: usize, task: Option<usize>) -> SampleId {
        let (pid, tid) = task.map_or((0, 0), |i| (self.tasks[i].pid, self.tasks[i].tid));
        SampleId {
            pid: Some(pid),
            tid: Some(tid),
            time: Some(Self::perf_time(self.t)),
            id: Some(self.cpus[c].leader_id),
            stream_id: None,
            cpu: Some(c as u32),
        }
    }

    /// `perf_output_begin`: a record that does not fit is lost and counted; the next record
    /// that fits is preceded by PERF_RECORD_LOST (`perf_event_lost`/`rb->lost`).
    fn write_record(&mut self, c: usize, rec: &[u8]) {
        if self.cpus[c].pending_lost > 0 {
            let mut body = Vec::new();
            body.extend_from_slice(&self.cpus[c].leader_id.to_le_bytes());
            body.extend_from_slice(&self.cpus[c].pending_lost.to_le_bytes());
            let lost = build::record(types::LOST, 0, &body, &LEADER_FMT, &self.sid(c, None));
            if self.cpus[c].ring.data_space() >= (lost.len() + rec.len()) as u64 {
                self.cpus[c].ring.push_record(&lost);
                self.cpus[c].pending_lost = 0;
            }
        }
        if !self.cpus[c].ring.push_record(rec) {
            self.cpus[c].pending_lost += 1;
            self.stats.data_lost += 1;
        }
    }

    /// `perf_aux_output_end`: publishes `size` bytes written at the transaction head, writes
    /// PERF_RECORD_AUX unless there is nothing to say (`size || aux_flags & ~OVERWRITE`: a
    /// TRBE's RAW format flag alone is enough), and ends the transaction.
    fn aux_output_end(&mut self, c: usize, size: u64, flags: u64) {
        let Some(txn) = self.cpus[c].txn.take() else { return };
        let head = txn.head;
        self.cpus[c].ring.set_aux_head(head + size);
        // Every window that ended before now is in what this publishes.
        self.cpus[c].unpublished.clear();
        if size > 0 || flags != 0 {
            let mut body = Vec::with_capacity(24);
            for v in [head, size, flags] {
                body.extend_from_slice(&v.to_le_bytes());
            }
            let rec = build::record(types::AUX, 0, &body, &LEADER_FMT, &self.sid(c, self.cpus[c].task));
            self.write_record(c, &rec);
            self.stats.aux_records += 1;
        }
        if flags & PERF_AUX_FLAG_TRUNCATED != 0 {
            // perf_aux_output_end: a truncated output disables the event.
            self.cpus[c].kernel_off = true;
            self.stats.aux_disables += 1;
        }
    }

    /// `perf_aux_output_begin`: a transaction over the free AUX space, or none (no space: the
    /// event is disabled, `perf_event_disable_inatomic`).
    fn aux_output_begin(&mut self, c: usize) -> bool {
        let r = &self.cpus[c].ring;
        let (head, tail) = (r.aux_head(), r.aux_tail());
        let size = self.cfg.aux_bytes as u64;
        let space = size.saturating_sub(head - tail);
        if space == 0 {
            self.cpus[c].kernel_off = true;
            self.stats.aux_disables += 1;
            return false;
        }
        // handle->wakeup = rb->aux_wakeup + rb->aux_watermark (aux_wakeup: the last multiple of
        // the watermark passed, rb_need_aux_wakeup).
        let w = self.cfg.aux_watermark.max(1);
        self.cpus[c].txn = Some(Txn { head, size: space, wakeup: (head / w) * w + w });
        true
    }

    // ---- cs_etm start / stop --------------------------------------------------------------

    /// `etm_event_start(event, 0)` (enable, unthrottle, re-enable after the kernel disabled it).
    fn start(&mut self, c: usize) {
        let cpu = &self.cpus[c];
        if !cpu.enabled || cpu.kernel_off || cpu.throttled || cpu.leader_running {
            return;
        }
        if cpu.stuck {
            // perf_aux_output_begin: WARN_ON_ONCE(nest) -> the leader stays stopped.
            return;
        }
        if !self.aux_output_begin(c) {
            return;
        }
        if !self.cpus[c].hwid_done {
            self.cpus[c].hwid_done = true;
            let hw_id = (1u64 << 56) | u64::from(trace_id(c as u32));
            let rec = build::record(types::AUX_OUTPUT_HW_ID, 0, &hw_id.to_le_bytes(), &LEADER_FMT, &self.sid(c, None));
            self.write_record(c, &rec);
        }
        match self.cfg.topology {
            Topology::Trbe => self.trbe_enable(c),
            Topology::SharedEtr => {
                if self.etr.refcnt == 0 {
                    self.etr.reset();
                    self.etr_windows.clear();
                }
                self.etr.refcnt += 1;
            }
            Topology::PrivateEtr => self.cpus[c].etr.reset(),
        }
        self.cpus[c].leader_running = true;
        if !self.cpus[c].aux_paused {
            self.tu_start(c);
        }
    }

    /// `etm_event_stop(event, mode)`: the trace unit off; with `update` the sink publishes
    /// and the transaction ends, without it (throttling) the transaction stays open.
    fn stop(&mut self, c: usize, update: bool) {
        if !self.cpus[c].leader_running {
            return;
        }
        self.cpus[c].leader_running = false;
        self.tu_stop(c, if update { None } else { Some(Loss::Throttled) });
        match self.cfg.topology {
            Topology::Trbe => {
                let tb = &mut self.cpus[c].trbe;
                let was_on = std::mem::take(&mut tb.enabled);
                let pending_irq = tb.irq_at.take().is_some();
                if update && let Some(txn) = self.cpus[c].txn {
                    // arm_trbe_update_buffer: what was written (a disabled TRBE: 0, truncated);
                    // a pending wrap is reported as such.
                    let tb = &self.cpus[c].trbe;
                    let size = if was_on || pending_irq { tb.write - txn.head } else { 0 };
                    let flags = PERF_AUX_FLAG_CORESIGHT_FORMAT_RAW | if pending_irq { PERF_AUX_FLAG_COLLISION } else { 0 };
                    self.aux_output_end(c, size, flags);
                } else if !update {
                    // The transaction stays open: what the TRBE wrote in it is never published.
                    self.cpus[c].stuck = true;
                    for ti in std::mem::take(&mut self.cpus[c].unpublished) {
                        let t = &mut self.truth[ti];
                        t.complete = false;
                        t.loss.get_or_insert(Loss::Throttled);
                    }
                }
            }
            Topology::SharedEtr => {
                if update && self.etr.refcnt == 1 {
                    self.etr_publish(c);
                }
                if update {
                    // The other CPUs' stops publish nothing: perf_aux_output_end(handle, 0).
                    self.aux_output_end(c, 0, 0);
                } else {
                    self.cpus[c].stuck = true;
                }
                self.etr.refcnt -= 1;
            }
            Topology::PrivateEtr => {
                if update {
                    self.private_etr_update(c);
                    self.cpus[c].txn = None;
                } else {
                    self.cpus[c].stuck = true;
                }
            }
        }
    }

    // ---- the trace unit -------------------------------------------------------------------

    fn ctx(&self, task: usize) -> Context {
        Context { el: 0, ns: true, sf: true, context_id: self.cfg.context_ids.then_some(self.tasks[task].tid) }
    }

    /// The trace unit is enabled (`etm4_enable_trace_unit`): A-sync, Trace Info, timestamp.
    fn tu_start(&mut self, c: usize) {
        let mut enc = Encoder::new(EncoderConfig { retstack: self.cfg.retstack, ..EncoderConfig::default() });
        enc.a_sync();
        enc.trace_info();
        enc.timestamp(Self::counter(self.t));
        let etr_pos = (self.cfg.topology == Topology::SharedEtr)
            .then_some(self.etr.written + 16 * (self.etr.fmt.pending() as u64 / 15 + 2));
        self.cpus[c].tu =
            Some(TraceUnit { enc, pieces: Vec::new(), need_trace_on: true, after_gap: false, lost: None, etr_pos, wrote: false });
    }

    /// The trace unit is disabled (pause or stop): its bytes go to the sink.
    fn tu_stop(&mut self, c: usize, loss: Option<Loss>) -> Option<TraceUnit> {
        let mut tu = self.cpus[c].tu.take()?;
        tu.enc.timestamp(Self::counter(self.t));
        tu.enc.flush_atoms();
        let bytes = tu.enc.take_bytes();
        self.sink_bytes(c, &bytes, &mut tu);
        if tu.lost.is_none() {
            tu.lost = loss;
        }
        Some(tu)
    }

    /// Bytes of the trace unit of `c` reach its sink.
    fn sink_bytes(&mut self, c: usize, bytes: &[u8], tu: &mut TraceUnit) {
        self.stats.trace_bytes += bytes.len() as u64;
        match self.cfg.topology {
            Topology::Trbe => {
                let first = !std::mem::replace(&mut tu.wrote, true);
                match self.trbe_write(c, bytes) {
                    TrbeWrite::Whole => {}
                    TrbeWrite::Filled => {
                        tu.lost.get_or_insert(Loss::TrbeWrap);
                    }
                    TrbeWrite::Cut => {
                        tu.lost.get_or_insert(Loss::TrbeWrap);
                        // The window's start (its Trace On) may be gone: the previous
                        // window's end is then shown by nothing.
                        if first && let Some(ti) = self.cpus[c].last_window.take() {
                            let t = &mut self.truth[ti];
                            if t.complete {
                                t.complete = false;
                                t.loss = Some(Loss::EndLost);
                            }
                        }
                    }
                }
            }
            Topology::SharedEtr => {
                let size = self.cfg.etr_bytes;
                self.etr.push(trace_id(c as u32), bytes, size);
            }
            Topology::PrivateEtr => {
                let size = self.cfg.etr_bytes;
                self.cpus[c].etr.push(trace_id(c as u32), bytes, size);
            }
        }
    }

    /// Streams the encoder's output to the sink while the window goes on.
    fn tu_flush(&mut self, c: usize) {
        let Some(mut tu) = self.cpus[c].tu.take() else { return };
        if tu.enc.bytes().len() >= 64 {
            let bytes = tu.enc.take_bytes();
            self.sink_bytes(c, &bytes, &mut tu);
        }
        self.cpus[c].tu = Some(tu);
    }

    // ---- TRBE -------------------------------------------------------------------------------

    /// `__arm_trbe_enable` with the limit of `trbe_normal_offset` / `__trbe_normal_offset`.
    fn trbe_enable(&mut self, c: usize) {
        let bufsize = self.cfg.aux_bytes as u64;
        let page = self.cfg.page;
        let mut limit = 0;
        for _ in 0..8 {
            limit = self.trbe_normal_offset(c, bufsize, page);
            let head_off = self.cpus[c].txn.map_or(0, |t| t.head % bufsize);
            if limit == 0 || limit - head_off >= TRBE_MIN_BUF {
                break;
            }
            // Too short a run: pad it and start after it.
            self.trbe_pad(c, limit - head_off);
        }
        let Some(txn) = self.cpus[c].txn else { return };
        let tb = &mut self.cpus[c].trbe;
        if limit == 0 {
            // No room: trbe_stop_and_truncate_event.
            tb.enabled = false;
            self.aux_output_end(c, 0, PERF_AUX_FLAG_CORESIGHT_FORMAT_RAW | PERF_AUX_FLAG_TRUNCATED);
            return;
        }
        tb.write = txn.head;
        tb.limit = txn.head - txn.head % bufsize + limit;
        tb.enabled = true;
    }

    /// `__trbe_normal_offset`: the limit (an offset in the buffer) or 0.
    fn trbe_normal_offset(&mut self, c: usize, bufsize: u64, page: u64) -> u64 {
        let align = self.cfg.trbe_align;
        let Some(txn) = self.cpus[c].txn else { return 0 };
        let head_off = txn.head % bufsize;
        if !head_off.is_multiple_of(align) {
            let delta = (head_off.next_multiple_of(align) - head_off).min(txn.size);
            self.trbe_pad(c, delta);
        }
        let Some(txn) = self.cpus[c].txn else { return 0 };
        if txn.size == 0 {
            return 0;
        }
        let head = txn.head % bufsize;
        let tail = (txn.head + txn.size) % bufsize;
        let wakeup = txn.wakeup % bufsize;
        let mut limit = bufsize;
        if head < tail {
            limit = tail - tail % page;
        }
        if txn.wakeup < txn.head + txn.size && head <= wakeup {
            limit = limit.min(wakeup.next_multiple_of(page));
        }
        if limit > head {
            return limit;
        }
        self.trbe_pad(c, txn.size);
        0
    }

    /// `trbe_pad_buf`: Ignore packets, skipped with `perf_aux_output_skip` (the head is
    /// published, no record is written).
    fn trbe_pad(&mut self, c: usize, len: u64) {
        let Some(txn) = self.cpus[c].txn.as_mut() else { return };
        let len = len.min(txn.size);
        let head = txn.head;
        txn.head += len;
        txn.size -= len;
        let pad = vec![ete::hdr::IGNORE; len as usize];
        let ring = &mut self.cpus[c].ring;
        ring.write_aux_at(head, &pad);
        ring.set_aux_head(head + len);
    }

    /// The TRBE writes trace bytes: all of them, all reaching its limit (the window writing
    /// them cannot be known whole: the record ends with COLLISION at the IRQ, and whatever
    /// the window traced after the limit until its pause is lost — none of it, if the pause
    /// came first, but a consumer cannot tell: the pipeline breaks the window open at a
    /// COLLISION record's end), or some lost (stopped at its limit).
    fn trbe_write(&mut self, c: usize, bytes: &[u8]) -> TrbeWrite {
        let t = self.t;
        let irq_ns = self.cfg.trbe_irq_ns;
        let tb = &mut self.cpus[c].trbe;
        if !tb.enabled {
            self.stats.trbe_lost_bytes += bytes.len() as u64;
            return TrbeWrite::Cut;
        }
        let room = (tb.limit - tb.write) as usize;
        let n = room.min(bytes.len());
        let at = tb.write;
        tb.write += n as u64;
        let full = tb.write == tb.limit;
        if full {
            // Fill mode: the TRBE stops at its limit and raises its IRQ.
            tb.enabled = false;
            tb.irq_at = Some(t + irq_ns);
        }
        self.cpus[c].ring.write_aux_at(at, &bytes[..n]);
        if n < bytes.len() {
            self.stats.trbe_lost_bytes += (bytes.len() - n) as u64;
            return TrbeWrite::Cut;
        }
        if full { TrbeWrite::Filled } else { TrbeWrite::Whole }
    }

    /// `arm_trbe_irq_handler` → `trbe_handle_overflow`.
    fn trbe_irq(&mut self, c: usize) {
        self.stats.trbe_irqs += 1;
        self.cpus[c].trbe.irq_at = None;
        let Some(txn) = self.cpus[c].txn else { return };
        let size = self.cpus[c].trbe.write - txn.head;
        self.aux_output_end(c, size, PERF_AUX_FLAG_CORESIGHT_FORMAT_RAW | PERF_AUX_FLAG_COLLISION);
        match self.aux_output_begin(c) {
            true => self.trbe_enable(c),
            false => {
                // "We are unable to restart the trace collection": the TRBE stays off and the
                // event was disabled.
                self.cpus[c].trbe.enabled = false;
                self.cpus[c].leader_running = false;
                if let Some(mut tu) = self.cpus[c].tu.take() {
                    tu.lost.get_or_insert(Loss::AuxFull);
                    self.cpus[c].tu = Some(tu);
                }
            }
        }
        // The trace lost between the limit and the IRQ breaks the open window.
        if let Some(tu) = self.cpus[c].tu.as_mut() {
            tu.lost.get_or_insert(Loss::TrbeWrap);
        }
    }

    // ---- ETR --------------------------------------------------------------------------------

    /// `tmc_update_etr_buffer` for the last CPU of a shared ETR: the newest bytes that fit,
    /// TRUNCATED with a barrier if any were lost.
    fn etr_publish(&mut self, c: usize) {
        let size = self.cfg.etr_bytes;
        let (data, wrapped) = self.etr.contents(size);
        let cutoff = self.etr.written.saturating_sub(size);
        self.publish_frames(c, data, wrapped, cutoff, true);
        self.etr.reset();
    }

    /// `tmc_update_etr_buffer` of a private ETR (at every pause and stop).
    fn private_etr_update(&mut self, c: usize) {
        let size = self.cfg.etr_bytes;
        let (data, wrapped) = self.cpus[c].etr.contents(size);
        self.cpus[c].etr.reset();
        self.publish_frames(c, data, wrapped, 0, false);
    }

    fn publish_frames(&mut self, c: usize, mut data: Vec<u8>, mut lost: bool, cutoff: u64, shared: bool) {
        self.stats.etr_publishes += 1;
        let Some(txn) = self.cpus[c].txn else { return };
        let (head, space) = (txn.head, txn.size);
        let mut start_pos = cutoff;
        if data.len() as u64 > space {
            let keep = (space & !15) as usize;
            start_pos += (data.len() - keep) as u64;
            data.drain(..data.len() - keep);
            lost = true;
        }
        if lost && data.len() >= 16 {
            // tmc_etr_buf_insert_barrier_packet: four FSYNC words over the first frame.
            for k in 0..4 {
                data[4 * k..4 * k + 4].copy_from_slice(&0x7fff_ffffu32.to_le_bytes());
            }
            self.stats.etr_truncated += 1;
        }
        if shared {
            // Windows whose bytes start before what survived (and the barrier) are lost.
            let first_kept = start_pos + if lost { 16 } else { 0 };
            for &(ti, pos) in &self.etr_windows {
                if pos < first_kept + 32 && lost {
                    let t = &mut self.truth[ti];
                    t.complete = false;
                    t.loss.get_or_insert(Loss::EtrLost);
                }
            }
            self.etr_windows.clear();
        }
        let n = data.len() as u64;
        self.cpus[c].ring.write_aux_at(head, &data);
        let flags = if lost { PERF_AUX_FLAG_TRUNCATED } else { 0 };
        self.aux_output_end(c, n, flags);
        // etm_event_pause: perf_aux_output_begin again (a stop does not).
        if !shared && self.cpus[c].leader_running && !self.cpus[c].kernel_off {
            self.aux_output_begin(c);
        }
    }

    // ---- one ns of one CPU ----------------------------------------------------------------

    fn step(&mut self, c: usize) {
        if let Some(at) = self.cpus[c].trbe.irq_at
            && self.t >= at
        {
            self.trbe_irq(c);
        }
        if self.cpus[c].kernel_off && self.cpus[c].leader_running {
            // perf_event_disable_inatomic: the pending disable stops the event.
            self.stop(c, true);
        }
        if self.t < self.cpus[c].busy_until {
            return;
        }
        if let Some(next) = self.cpus[c].switch_in.take() {
            self.cpus[c].task = Some(next);
            let (lo, hi) = self.cfg.quantum;
            self.cpus[c].slice_left = lo + self.rand() % (hi - lo + 1);
        }
        let Some(ti) = self.cpus[c].task else {
            // Idle: take a task.
            if let Some(next) = self.runq.pop_front() {
                self.switch(c, None, next);
            }
            return;
        };
        let counting = self.cpus[c].enabled && !self.cpus[c].kernel_off && !self.cpus[c].throttled;
        if counting && self.cpus[c].pause_left == 0 {
            self.cpus[c].pause_left = self.cfg.pause_period;
            self.pmi(c, ti, true);
            return;
        }
        if counting && self.cpus[c].resume_left == 0 {
            self.cpus[c].resume_left = self.cfg.resume_period;
            self.pmi(c, ti, false);
            return;
        }
        self.execute(c, ti);
        if counting {
            self.cpus[c].pause_left -= 1;
            self.cpus[c].resume_left -= 1;
        }
        self.cpus[c].slice_left -= 1;
        if self.cpus[c].slice_left == 0
            && let Some(next) = self.runq.pop_front()
        {
            self.runq.push_back(ti);
            self.switch(c, Some(ti), next);
        } else if self.cpus[c].slice_left == 0 {
            let (lo, hi) = self.cfg.quantum;
            self.cpus[c].slice_left = lo + self.rand() % (hi - lo + 1);
        }
    }

    /// One user instruction of task `ti` on CPU `c`.
    fn execute(&mut self, c: usize, ti: usize) {
        self.stats.user_insns += 1;
        let task = &self.tasks[ti];
        let prog = &self.programs[task.prog];
        let (pc, f) = (prog.pcs[task.i], prog.flows[task.i]);
        let tid = task.tid;
        let counter = Self::counter(self.t);
        let ctx = self.ctx(ti);
        if let Some(tu) = self.cpus[c].tu.as_mut() {
            if tu.need_trace_on {
                tu.need_trace_on = false;
                tu.enc.timestamp(counter);
                tu.enc.trace_on();
                tu.enc.address_with_context(pc, &ctx);
                tu.pieces.push(Piece { tid, branches: Vec::new(), after_gap: std::mem::take(&mut tu.after_gap) });
            }
            match f {
                Flow::Seq => {}
                // The path's last instruction: the task starts its program again from the
                // entry point, a jump no branch explains (as an exec would be), so the trace
                // restarts there and a window across it is not complete.
                Flow::End => {
                    tu.need_trace_on = true;
                    tu.after_gap = true;
                }
                Flow::Atom { kind, taken, next } => {
                    match kind {
                        BranchKind::Cond => tu.enc.atom(taken),
                        BranchKind::Uncond | BranchKind::Waypoint => tu.enc.branch(false, false, pc, next),
                        BranchKind::Call => tu.enc.branch(false, true, pc, next),
                        BranchKind::IndirectJump | BranchKind::Return | BranchKind::Eret => tu.enc.branch(true, false, pc, next),
                        BranchKind::IndirectCall => tu.enc.branch(true, true, pc, next),
                    }
                    if taken && kind != BranchKind::Waypoint {
                        tu.pieces.last_mut().expect("a piece after trace on").branches.push(BranchPair { from: pc, to: next });
                    }
                }
                Flow::Exception { .. } => {
                    tu.enc.exception(ete::EXCEPTION_CALL, pc.wrapping_add(4));
                    tu.need_trace_on = true;
                }
                Flow::Gap { .. } => {
                    tu.need_trace_on = true;
                    tu.after_gap = true;
                }
            }
        }
        let task = &mut self.tasks[ti];
        let n = self.programs[task.prog].pcs.len();
        let mut stats = PathStats::default();
        if task.i + 1 == n {
            task.stack = CallStack::default();
        } else {
            task.stack.apply(pc, f, &mut stats);
        }
        task.i = (task.i + 1) % n;
        self.tu_flush(c);
    }

    /// User code of the current task is left for the kernel: an exception in the trace.
    fn enter_kernel(&mut self, c: usize, ti: usize) {
        let task = &self.tasks[ti];
        let ret = self.programs[task.prog].pcs[task.i];
        if let Some(tu) = self.cpus[c].tu.as_mut()
            && !tu.need_trace_on
        {
            tu.enc.exception(ete::EXCEPTION_IRQ, ret);
            tu.need_trace_on = true;
        }
    }

    /// A context switch on `c` from `prev` to `next`: kernel time, switch records.
    fn switch(&mut self, c: usize, prev: Option<usize>, next: usize) {
        self.stats.switches += 1;
        if let Some(p) = prev {
            self.enter_kernel(c, p);
        }
        let at = self.t + self.cfg.switch_ns / 2;
        let save = self.t;
        self.t = at;
        let (np, nt) = (self.tasks[next].pid, self.tasks[next].tid);
        if let Some(p) = prev {
            let (pp, pt) = (self.tasks[p].pid, self.tasks[p].tid);
            let mut body = Vec::new();
            body.extend_from_slice(&np.to_le_bytes());
            body.extend_from_slice(&nt.to_le_bytes());
            let rec = build::record(types::SWITCH_CPU_WIDE, misc::SWITCH_OUT, &body, &LEADER_FMT, &self.sid(c, Some(p)));
            self.write_record(c, &rec);
            let mut body = Vec::new();
            body.extend_from_slice(&pp.to_le_bytes());
            body.extend_from_slice(&pt.to_le_bytes());
            let rec = build::record(types::SWITCH_CPU_WIDE, 0, &body, &LEADER_FMT, &self.sid(c, Some(next)));
            self.write_record(c, &rec);
        }
        self.t = save;
        self.cpus[c].task = None;
        self.cpus[c].switch_in = Some(next);
        self.cpus[c].busy_until = self.t + self.cfg.switch_ns;
    }

    /// A PMI of the pause (`pause`) or resume event on `c`, task `ti` interrupted.
    fn pmi(&mut self, c: usize, ti: usize, pause: bool) {
        self.stats.pmis += 1;
        self.enter_kernel(c, ti);
        self.cpus[c].busy_until = self.t + self.cfg.pmi_ns;
        // __perf_event_account_interrupt.
        let n = if pause { &mut self.cpus[c].pause_irqs } else { &mut self.cpus[c].resume_irqs };
        *n += 1;
        let throttle = self.cfg.throttle.is_some_and(|(max, _)| *n >= max);
        if throttle {
            self.stats.throttles += 1;
            // perf_event_throttle_group: leader first (PERF_RECORD_THROTTLE), pmu->stop(0).
            self.throttle_record(c, false);
            self.stop(c, false);
            self.cpus[c].throttled = true;
        }
        if pause {
            // perf_event_aux_pause(.., true): etm_event_pause (only with the leader running).
            if !self.cpus[c].aux_paused {
                self.cpus[c].aux_paused = true;
                if self.cpus[c].leader_running {
                    let tu = self.tu_stop(c, None);
                    if self.cfg.topology == Topology::PrivateEtr {
                        self.private_etr_update(c);
                    }
                    self.window_closed(c, ti, tu);
                    return;
                }
            }
            self.window_closed(c, ti, None);
        } else {
            // The resume program runs before the resume.
            if !self.cpus[c].bpf_open {
                let cpu = &mut self.cpus[c];
                cpu.bpf_open = true;
                cpu.bpf_seq = cpu.bpf_seq.wrapping_add(1);
                cpu.bpf_resume_t = self.t;
            }
            if self.cpus[c].aux_paused {
                self.cpus[c].aux_paused = false;
                if self.cpus[c].leader_running {
                    self.tu_start(c);
                }
            }
        }
    }

    /// The pause program after a pause on `c` (trace unit `tu`, if one was on).
    fn window_closed(&mut self, c: usize, ti: usize, tu: Option<TraceUnit>) {
        if !self.cpus[c].bpf_open {
            return;
        }
        self.cpus[c].bpf_open = false;
        self.stats.windows += 1;
        let task = &self.tasks[ti];
        let (pid, tid) = (task.pid, task.tid);
        let target = pid == self.cfg.target_pid;
        let pc = self.programs[task.prog].pcs[task.i];
        let stack = task.stack.snapshot(pc);
        let h = PauseHeader {
            flags: if target { PAUSE_TARGET } else { 0 },
            pid,
            tid,
            window_ns: self.t - self.cpus[c].bpf_resume_t,
            seq: self.cpus[c].bpf_seq,
            stack_len: if target { stack.len().min(etm_bpf_common::MAX_STACK_DEPTH) as u32 } else { 0 },
        };
        // The record is stamped inside the handler.
        let save = self.t;
        self.t += self.cfg.pmi_ns / 2;
        let mut sid = self.sid(c, Some(ti));
        sid.id = Some(self.cpus[c].out_id);
        let rec = pause_sample_record(&OUT_FMT, &sid, &h, &stack);
        let time = Self::perf_time(self.t);
        self.t = save;
        self.write_record(c, &rec);
        if !target {
            self.stats.foreign_windows += 1;
            self.cpus[c].last_window = None;
            return;
        }
        self.stats.target_windows += 1;
        let (branches, complete, loss) = match &tu {
            None => (Vec::new(), false, Some(Loss::NotTraced)),
            Some(tu) => {
                let mut v = Vec::new();
                // A gap not yet followed by the trace-on (the pause came first) is between the
                // newest branch and the pause.
                let mut jump = tu.need_trace_on && tu.after_gap;
                for p in tu.pieces.iter().rev().take_while(|_| !jump) {
                    if p.tid != tid {
                        break;
                    }
                    v.extend(p.branches.iter().rev().take(self.cfg.depth - v.len().min(self.cfg.depth)));
                    if v.len() >= self.cfg.depth {
                        break;
                    }
                    if p.after_gap {
                        jump = true;
                        break;
                    }
                }
                let loss = tu.lost.or(jump.then_some(Loss::Discontinuity));
                (v, loss.is_none(), loss)
            }
        };
        let ti_truth = self.truth.len();
        self.truth.push(TruthSample { cpu: c as i32, time, tid, branches, complete, loss });
        self.cpus[c].last_window = Some(ti_truth);
        if let Some(pos) = tu.as_ref().and_then(|t| t.etr_pos) {
            self.etr_windows.push((ti_truth, pos));
        }
        if self.cfg.topology == Topology::Trbe && tu.is_some() {
            self.cpus[c].unpublished.push(ti_truth);
        }
    }
}

/// `TRBE_TRACE_MIN_BUF_SIZE`.
const TRBE_MIN_BUF: u64 = 64;

/// What became of bytes the TRBE was to write ([`Model::trbe_write`]).
enum TrbeWrite {
    Whole,
    Filled,
    Cut,
}

impl Groups for Model {
    type Ring = MemRing;

    fn count(&self) -> usize {
        self.cpus.len()
    }

    fn ring(&mut self, i: usize) -> &mut MemRing {
        &mut self.cpus[i].ring
    }

    /// `PERF_EVENT_IOC_DISABLE`: `etm_event_stop(PERF_EF_UPDATE)`.
    fn disable(&mut self, i: usize) -> std::io::Result<()> {
        self.stop(i, true);
        self.cpus[i].enabled = false;
        Ok(())
    }

    /// `PERF_EVENT_IOC_ENABLE`: clears a kernel disable and starts the group.
    fn enable(&mut self, i: usize) -> std::io::Result<()> {
        self.cpus[i].enabled = true;
        self.cpus[i].kernel_off = false;
        self.start(i);
        Ok(())
    }

    /// A new group on CPU `i`: new ids and rings, the transaction no longer stuck.
    fn reopen(&mut self, i: usize) -> std::io::Result<CpuStream> {
        self.stop(i, true);
        for ti in std::mem::take(&mut self.cpus[i].unpublished) {
            let t = &mut self.truth[ti];
            t.complete = false;
            t.loss.get_or_insert(Loss::Throttled);
        }
        let cpu = &mut self.cpus[i];
        cpu.enabled = false;
        cpu.kernel_off = false;
        cpu.stuck = false;
        cpu.hwid_done = false;
        cpu.leader_id += 100;
        cpu.out_id += 100;
        cpu.ring = MemRing::new(self.cfg.data_bytes, self.cfg.aux_bytes);
        cpu.trbe = Trbe::default();
        cpu.aux_paused = true;
        cpu.bpf_open = false;
        Ok(self.stream(&self.cpus[i]))
    }
}
