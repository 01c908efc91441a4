//! Decode workers ([`PipelineConfig::decode_threads`](crate::PipelineConfig::decode_threads)):
//! the decode of the per-CPU AUX streams, the stage that dominates a replay's cost, on N
//! threads, the join and the profile on the pipeline's thread as with one.
//!
//! * Each AUX buffer (a CPU's stream, or the per-thread buffer) is hashed to one worker,
//!   which owns its decoder and one block cache for all its buffers: memory grows with the
//!   workers and the code, not with CPUs × CPUs.
//! * A worker reads a snapshot of the code map ([`CodeMap`], images shared read-only) taken
//!   when the record was pushed: the map the pipeline's own thread will have when it reaches
//!   that record, since both apply the same events to their maps in the same order.
//! * What a decoder call hands its sink is recorded on a [`Tape`]; the pipeline replays the
//!   tapes into the join in the order of the events, the same calls in the same order as a
//!   decoder called on its own thread: the profile is the same, byte for byte.
//! * The channels are bounded and sized for the jobs the pipeline lets be in flight (it
//!   waits for the oldest event's tape before sending more), so neither side blocks on a
//!   full channel while the other waits for it. A panic in a decoder, or a worker gone, gives
//!   a failed tape: counted ([`PipelineStats::decode_worker_failures`](crate::PipelineStats::decode_worker_failures)),
//!   the buffer's window broken, never a hang.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::thread::JoinHandle;

use crate::aux::{AuxPlan, run_step};
use crate::code::CodeMap;
use crate::session::{BranchPair, CpuTraceConfig};
use crate::window::{CallSink, DecoderFactory, DecoderShared, Discontinuity, TraceRange, WindowDecoder, WindowSink};

/// Jobs in flight per worker (the pipeline waits for the oldest before sending more).
pub(crate) const JOBS_PER_WORKER: usize = 4;
/// The names of the worker threads begin so (`etm-decode-0`, ...): a panic on one is caught
/// and counted, so a driver can keep its message out of a terminal view.
pub const WORKER_THREAD_PREFIX: &str = "etm-decode-";
/// Events queued for the join at most (AUX records, samples, sideband).
pub(crate) const MAX_QUEUED: usize = 4096;

/// One sink call of a decoder.
#[derive(Debug, Clone, Copy)]
enum Op {
    TraceOn(Option<u8>),
    Timestamp(Option<u8>, u64),
    Branch(Option<u8>, u64, u64),
    /// So many of [`Tape::branches`], in one call.
    Branches(Option<u8>, u32),
    /// So many of [`Tape::ranges`], in one call.
    Ranges(Option<u8>, u32),
    Discontinuity(Option<u8>, Discontinuity),
    TraceInfo(Option<u8>),
    Context(Option<u8>, u32),
    /// The end of one decoder call's output.
    End,
}

/// What a worker's decoder calls handed their sink, in order, for one job.
#[derive(Debug, Default)]
pub(crate) struct Tape {
    ops: Vec<Op>,
    branches: Vec<BranchPair>,
    ranges: Vec<TraceRange>,
    /// Replay position in `ops`, `branches`, `ranges`.
    at: (usize, usize, usize),
    /// The job failed (a decoder panic, the worker gone): its data is lost.
    pub(crate) failed: bool,
}

impl Tape {
    fn failed() -> Tape {
        Tape { failed: true, ..Default::default() }
    }

    /// Replays the output of the next decoder call into `sink`. A failed tape reports the
    /// loss once (an error discontinuity of the buffer: its open window is broken).
    pub(crate) fn replay_call(&mut self, sink: &mut dyn WindowSink) {
        if self.failed {
            if self.at.0 == 0 {
                sink.discontinuity(None, Discontinuity::Error);
                self.at.0 = 1;
            }
            return;
        }
        while let Some(&op) = self.ops.get(self.at.0) {
            self.at.0 += 1;
            match op {
                Op::TraceOn(id) => sink.trace_on(id),
                Op::Timestamp(id, ts) => sink.timestamp(id, ts),
                Op::Branch(id, from, to) => sink.branch(id, from, to),
                Op::Branches(id, n) => {
                    let (s, e) = (self.at.1, self.at.1 + n as usize);
                    self.at.1 = e;
                    sink.branches(id, &self.branches[s..e]);
                }
                Op::Ranges(id, n) => {
                    let (s, e) = (self.at.2, self.at.2 + n as usize);
                    self.at.2 = e;
                    sink.ranges(id, &self.ranges[s..e]);
                }
                Op::Discontinuity(id, why) => sink.discontinuity(id, why),
                Op::TraceInfo(id) => sink.trace_info(id),
                Op::Context(id, c) => sink.context(id, c),
                Op::End => return,
            }
        }
    }
}

impl WindowSink for Tape {
    fn trace_on(&mut self, trace_id: Option<u8>) {
        self.ops.push(Op::TraceOn(trace_id));
    }
    fn timestamp(&mut self, trace_id: Option<u8>, ts: u64) {
        self.ops.push(Op::Timestamp(trace_id, ts));
    }
    fn branch(&mut self, trace_id: Option<u8>, from: u64, to: u64) {
        self.ops.push(Op::Branch(trace_id, from, to));
    }
    fn branches(&mut self, trace_id: Option<u8>, bs: &[BranchPair]) {
        self.branches.extend_from_slice(bs);
        self.ops.push(Op::Branches(trace_id, bs.len() as u32));
    }
    fn ranges(&mut self, trace_id: Option<u8>, rs: &[TraceRange]) {
        self.ranges.extend_from_slice(rs);
        self.ops.push(Op::Ranges(trace_id, rs.len() as u32));
    }
    fn discontinuity(&mut self, trace_id: Option<u8>, why: Discontinuity) {
        self.ops.push(Op::Discontinuity(trace_id, why));
    }
    fn trace_info(&mut self, trace_id: Option<u8>) {
        self.ops.push(Op::TraceInfo(trace_id));
    }
    fn context(&mut self, trace_id: Option<u8>, context_id: u32) {
        self.ops.push(Op::Context(trace_id, context_id));
    }
}

impl CallSink for Tape {
    fn call_done(&mut self) {
        self.ops.push(Op::End);
    }
}

/// The decoder of a buffer on the pipeline's thread when a pool decodes: each call replays
/// the next call's output from the tape loaded for that buffer ([`Tapes::load`]).
pub(crate) struct TapeDecoder(pub(crate) std::rc::Rc<std::cell::RefCell<Tape>>);

impl WindowDecoder for TapeDecoder {
    fn feed(&mut self, _data: &[u8], _code: &CodeMap, sink: &mut dyn WindowSink) {
        self.0.borrow_mut().replay_call(sink);
    }
    fn reset(&mut self) {}
    fn finish(&mut self, _code: &CodeMap, sink: &mut dyn WindowSink) {
        self.0.borrow_mut().replay_call(sink);
    }
    fn complete_pending(&mut self, _code: &CodeMap, sink: &mut dyn WindowSink) {
        self.0.borrow_mut().replay_call(sink);
    }
}

/// The tapes received for the buffers, and the one the [`TapeDecoder`]s read.
#[derive(Default)]
pub(crate) struct Tapes {
    pub(crate) current: std::rc::Rc<std::cell::RefCell<Tape>>,
    pub(crate) ready: HashMap<i32, Tape>,
}

impl Tapes {
    /// Make the tape received for buffer `key` the one its decoder replays.
    pub(crate) fn load(&mut self, key: i32) {
        *self.current.borrow_mut() = self.ready.remove(&key).unwrap_or_default();
    }
}

/// What a worker is asked to do with a buffer's decoder.
pub(crate) enum Work {
    /// Decode an AUX record's pieces by its plan.
    Aux(AuxPlan, Vec<Vec<u8>>),
    /// [`WindowDecoder::complete_pending`].
    Complete,
    /// [`WindowDecoder::finish`].
    Finish,
}

pub(crate) struct Job {
    /// The AUX buffer (its CPU, -1 per-thread).
    pub(crate) key: i32,
    pub(crate) code: Arc<CodeMap>,
    pub(crate) work: Work,
}

/// A job sent (or not: its worker is gone) to a worker.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sent {
    pub(crate) key: i32,
    worker: usize,
    sent: bool,
}

/// The workers and the pipeline's side of their channels.
pub(crate) struct Pool {
    jobs: Vec<SyncSender<Job>>,
    results: Vec<Receiver<Tape>>,
    handles: Vec<JoinHandle<()>>,
    /// Jobs sent whose tape was not received yet.
    pub(crate) in_flight: usize,
    /// The code map as of the last event pushed (ahead of the pipeline's own).
    pub(crate) code: CodeMap,
    snapshot: Arc<CodeMap>,
}

impl Pool {
    /// `n` workers creating decoders with `factory`; `None` if a thread cannot be started.
    /// `ranges`: whether the pipeline takes the decoded ranges ([`DecoderShared::ranges`]).
    pub(crate) fn start(
        n: usize,
        factory: Arc<dyn DecoderFactory>,
        cpus: &[CpuTraceConfig],
        code: CodeMap,
        ranges: bool,
    ) -> Option<Pool> {
        let mut pool = Pool {
            jobs: Vec::new(),
            results: Vec::new(),
            handles: Vec::new(),
            in_flight: 0,
            snapshot: Arc::new(code.clone()),
            code,
        };
        // Any one worker may hold every job in flight: no send ever blocks.
        let cap = n * JOBS_PER_WORKER;
        for i in 0..n {
            let (jtx, jrx) = sync_channel::<Job>(cap);
            let (rtx, rrx) = sync_channel::<Tape>(cap);
            let (factory, cpus) = (factory.clone(), cpus.to_vec());
            let h = std::thread::Builder::new()
                .name(format!("{WORKER_THREAD_PREFIX}{i}"))
                .spawn(move || worker(factory.as_ref(), &cpus, ranges, jrx, rtx))
                .ok()?;
            pool.jobs.push(jtx);
            pool.results.push(rrx);
            pool.handles.push(h);
        }
        Some(pool)
    }

    /// Jobs the pool lets be in flight.
    pub(crate) fn capacity(&self) -> usize {
        self.jobs.len() * JOBS_PER_WORKER
    }

    /// The code map for a job: the current one, shared until it changes.
    pub(crate) fn snapshot(&mut self) -> Arc<CodeMap> {
        if self.snapshot.generation() != self.code.generation() {
            self.snapshot = Arc::new(self.code.clone());
        }
        self.snapshot.clone()
    }

    /// Send `job` to the worker of its buffer (the caller keeps in flight at most
    /// [`capacity`](Self::capacity)).
    pub(crate) fn send(&mut self, job: Job) -> Sent {
        let key = job.key;
        let worker = key.rem_euclid(self.jobs.len() as i32) as usize;
        let sent = self.jobs[worker].send(job).is_ok();
        self.in_flight += usize::from(sent);
        Sent { key, worker, sent }
    }

    /// The tape of a job sent, waiting for it (jobs of one worker come back in the order
    /// sent; the pipeline asks in that order). A worker gone gives a failed tape.
    pub(crate) fn receive(&mut self, s: Sent) -> Tape {
        if !s.sent {
            return Tape::failed();
        }
        self.in_flight -= 1;
        self.results[s.worker].recv().unwrap_or_else(|_| Tape::failed())
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        // Closing the job channels ends the workers.
        self.jobs.clear();
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}

/// A worker: the decoders of its buffers, one block cache, jobs in, tapes out.
fn worker(factory: &dyn DecoderFactory, cpus: &[CpuTraceConfig], ranges: bool, jobs: Receiver<Job>, results: SyncSender<Tape>) {
    let shared = DecoderShared::new(ranges);
    let mut decoders: HashMap<i32, Box<dyn WindowDecoder>> = HashMap::new();
    while let Ok(job) = jobs.recv() {
        let mut tape = Tape::default();
        let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let code = job.code.as_ref();
            match &job.work {
                Work::Aux(plan, parts) => {
                    let parts: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
                    let create = || factory.create(plan.source, cpus, plan.raw, &shared);
                    let dec = decoders.entry(job.key).or_insert_with(create);
                    for step in plan.steps() {
                        run_step(dec, step, &parts, code, &mut tape, create);
                    }
                }
                Work::Complete => {
                    if let Some(dec) = decoders.get_mut(&job.key) {
                        dec.complete_pending(code, &mut tape);
                    }
                    tape.call_done();
                }
                Work::Finish => {
                    if let Some(dec) = decoders.get_mut(&job.key) {
                        dec.finish(code, &mut tape);
                    }
                    tape.call_done();
                }
            }
        }));
        if run.is_err() {
            // The decoder's state is unknown: the buffer's next record starts afresh.
            decoders.remove(&job.key);
            tape = Tape::failed();
        }
        if results.send(tape).is_err() {
            return;
        }
    }
}
