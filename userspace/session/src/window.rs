//! The interface between the pipeline and a trace decoder: a [`WindowDecoder`] per AUX buffer
//! (made by a [`DecoderFactory`]) decodes its bytes against the [`CodeMap`] and tells a
//! [`WindowSink`] what it finds: trace on, timestamps, taken branches and ranges,
//! discontinuities. The `etm_decode` adapter ([`crate::decoder`]) and test doubles implement
//! it; the pipeline, and the decode pool's workers, drive it.

use crate::code::CodeMap;
use crate::join::InsnKind;
use crate::session::{BranchPair, CpuTraceConfig};

/// A decoded instruction range as the exact counts take it: its first instruction, how many
/// instructions it holds, and what its last instruction did to the call stack as the
/// decoder's walk classified it ([`InsnKind::Call`], [`InsnKind::Return`], else
/// [`InsnKind::Other`]: only calls and returns move the shadow call stack).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TraceRange {
    /// First instruction.
    pub start: u64,
    /// Instructions.
    pub n: u32,
    /// The last instruction: call, return or other.
    pub kind: InsnKind,
}

/// Why a decoder reported a discontinuity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Discontinuity {
    /// Trace unit overflow: trace was lost.
    Overflow,
    /// The decoder lost (or never had) sync: bytes until the next sync point are skipped.
    NoSync,
    /// A packet or instruction walk was inconsistent (corrupt byte, bad image).
    Error,
    /// Code needed to follow the trace was not available.
    NoCode,
    /// The trace is in another process's context (its code is not followed).
    Foreign,
}

/// Receives what a [`WindowDecoder`] finds in the trace. `trace_id` is `None` for raw
/// (unformatted, TRBE) data, where the AUX buffer's CPU is the source.
pub trait WindowSink {
    /// Trace started (after a resume): a new window begins.
    fn trace_on(&mut self, trace_id: Option<u8>);
    /// A trace timestamp (raw counter value).
    fn timestamp(&mut self, trace_id: Option<u8>, ts: u64);
    /// A taken branch, in execution order (perf's rules: from = last instruction of the
    /// previous range, to = first instruction of the next).
    fn branch(&mut self, trace_id: Option<u8>, from: u64, to: u64);
    /// Consecutive taken branches of one trace ID, oldest first (same as [`branch`] for each).
    ///
    /// [`branch`]: WindowSink::branch
    fn branches(&mut self, trace_id: Option<u8>, bs: &[BranchPair]) {
        for b in bs {
            self.branch(trace_id, b.from, b.to);
        }
    }
    /// Decoded instruction ranges of one trace ID, oldest first. For the exact per-function
    /// counts; handed over in batches at the same points as the branches.
    fn ranges(&mut self, _trace_id: Option<u8>, _rs: &[TraceRange]) {}
    /// The branch chain broke.
    fn discontinuity(&mut self, trace_id: Option<u8>, why: Discontinuity);
    /// The trace unit resynchronised (Trace Info): it was enabled, i.e. a window begins.
    fn trace_info(&mut self, _trace_id: Option<u8>) {}
    /// The trace reported the context (CONTEXTIDR value: a thread id) of what follows.
    fn context(&mut self, _trace_id: Option<u8>, _context_id: u32) {}
}

/// A resumable trace decoder for one AUX buffer (all the trace IDs in it).
pub trait WindowDecoder {
    /// Decode the next chunk of the buffer's bytes.
    fn feed(&mut self, data: &[u8], code: &CodeMap, sink: &mut dyn WindowSink);
    /// Forget all state: the next bytes follow a gap and must be synchronised afresh.
    fn reset(&mut self);
    /// End of the stream: emit what is still buffered.
    fn finish(&mut self, _code: &CodeMap, _sink: &mut dyn WindowSink) {}
    /// Emit the last taken branch of the trace so far if its record is still pending (it is
    /// normally emitted when the next range starts), without changing the decode state; the
    /// record is not emitted a second time when the trace continues.
    fn complete_pending(&mut self, _code: &CodeMap, _sink: &mut dyn WindowSink) {}
}

/// State every decoder of one pipeline shares: the decode block cache of the code (one per
/// pipeline, not per buffer and trace ID, so memory grows with the code, not with CPUs²), and
/// what the pipeline takes from the decoders.
#[derive(Clone)]
pub struct DecoderShared {
    pub block_cache: etm_decode::cache::SharedBlockCache,
    /// A stage takes the decoded instruction ranges ([`WindowSink::ranges`]: the exact
    /// counts); without one, a decoder need not make them.
    pub ranges: bool,
}

impl DecoderShared {
    /// A block cache of its own; `ranges` as [`DecoderShared::ranges`].
    pub fn new(ranges: bool) -> Self {
        DecoderShared { block_cache: etm_decode::cache::shared(etm_decode::cache::DEFAULT_BITS), ranges }
    }
}

impl Default for DecoderShared {
    fn default() -> Self {
        DecoderShared::new(true)
    }
}

/// Creates the decoder of an AUX buffer.
pub trait DecoderFactory: Send + Sync {
    /// A decoder for the AUX buffer of `aux_cpu` (`-1` per-thread), given all CPUs' trace
    /// configurations and whether the data is raw (no frame formatter), using the pipeline's
    /// `shared` state.
    fn create(&self, aux_cpu: i32, cpus: &[CpuTraceConfig], raw: bool, shared: &DecoderShared) -> Box<dyn WindowDecoder>;
}

/// A sink that marks the end of each decoder call's output (a decode worker's tape records the calls, [`crate::pool`]).
pub(crate) trait CallSink: WindowSink {
    /// The decoder call that fed this sink returned.
    fn call_done(&mut self) {}
}
