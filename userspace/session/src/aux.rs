//! What an AUX record asks of its buffer's decoder, planned once when the record is pushed
//! ([`AuxPlan`]: the one rule for what is counted, which calls are made and in what order),
//! and the calls of each step ([`run_step`]), the same on the pipeline's thread and on a
//! decode worker ([`crate::pool`]).

use etm_profile::exact::IntMap;

use crate::code::CodeMap;
use crate::session::{
    AuxRecord, PERF_AUX_FLAG_COLLISION, PERF_AUX_FLAG_CORESIGHT_FORMAT_RAW, PERF_AUX_FLAG_OVERWRITE, PERF_AUX_FLAG_PARTIAL,
    PERF_AUX_FLAG_TRUNCATED,
};
use crate::window::{CallSink, WindowDecoder};

/// Where each AUX buffer's records stand, for [`AuxPlan::new`]: the ring offset the next
/// record should start at, and the CPU that wrote the last one.
#[derive(Debug, Default)]
pub(crate) struct AuxTrack {
    pub(crate) next_offset: IntMap<i32, u64>,
    pub(crate) source: IntMap<i32, i32>,
}

/// What one AUX record asks of its buffer's decoder: the one rule for what is counted and
/// which decoder calls are made, planned when the record is pushed (so a decode worker can
/// make the calls while the pipeline makes the rest of them, [`crate::pool`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct AuxPlan {
    pub(crate) len: u64,
    pub(crate) short: bool,
    pub(crate) truncated: bool,
    pub(crate) overwrite: bool,
    pub(crate) gap: bool,
    pub(crate) partial_collision: bool,
    pub(crate) collision: bool,
    /// A decoder is available (else the record is counted undecoded).
    pub(crate) decoded: bool,
    pub(crate) raw: bool,
    /// The CPU whose trace it is.
    pub(crate) source: i32,
    /// The CPU that wrote the buffer's previous record.
    pub(crate) prev_source: i32,
    /// Raw data of a per-thread buffer written by another CPU than the previous record.
    pub(crate) moved: bool,
    /// Pieces of bytes.
    pub(crate) parts: usize,
}

/// One step of an AUX record's decode ([`AuxPlan::steps`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AuxStep {
    /// The stream of the previous CPU ends (finish), a decoder for the new CPU's begins.
    Moved,
    /// Data was lost before this record, or it is a fresh snapshot: finish, reset.
    Restart,
    /// Decode piece `i`.
    Feed(usize),
    /// Bytes at or after the end of the record are missing: reset.
    Cut,
}

impl AuxPlan {
    pub(crate) fn new(rec: &AuxRecord, parts: &[&[u8]], decodable: bool, track: &mut AuxTrack) -> AuxPlan {
        let len: u64 = parts.iter().map(|p| p.len() as u64).sum();
        let overwrite = rec.flags & PERF_AUX_FLAG_OVERWRITE != 0;
        // AUX ring offsets are monotonic: a record that does not start where the previous one
        // ended follows a gap (records lost or not recorded). 0 means "not provided".
        let expected = track.next_offset.insert(rec.cpu, rec.aux_offset.wrapping_add(rec.size.max(len)));
        let gap = !overwrite && rec.aux_offset != 0 && expected.is_some_and(|e| e != rec.aux_offset);
        let raw = rec.flags & PERF_AUX_FLAG_CORESIGHT_FORMAT_RAW != 0;
        // Raw (TRBE) data is the trace of the CPU that wrote it: in a per-thread buffer, the
        // CPU of each record's sample_id.
        let source = if raw { rec.source_cpu.unwrap_or(rec.cpu) } else { rec.cpu };
        let (mut prev_source, mut moved) = (source, false);
        if decodable {
            // A fragment written by another CPU than the previous one: that CPU's stream
            // ended with the previous record (its last branches are completed there), and
            // this one is a new stream with the new CPU's trace configuration.
            let prev = track.source.entry(rec.cpu).or_insert(source);
            prev_source = *prev;
            moved = raw && *prev != source;
            if moved {
                *prev = source;
            }
        }
        AuxPlan {
            len,
            short: len < rec.size,
            truncated: rec.flags & PERF_AUX_FLAG_TRUNCATED != 0,
            overwrite,
            gap,
            partial_collision: rec.flags & (PERF_AUX_FLAG_PARTIAL | PERF_AUX_FLAG_COLLISION) != 0,
            collision: rec.flags & PERF_AUX_FLAG_COLLISION != 0,
            decoded: decodable,
            raw,
            source,
            prev_source,
            moved,
            parts: parts.len(),
        }
    }

    /// The decode steps, in order.
    pub(crate) fn steps(&self) -> impl Iterator<Item = AuxStep> + use<> {
        let moved = self.moved.then_some(AuxStep::Moved);
        // The stream so far ends here (its last branches are completed, the window open at
        // the end of the previous record ended there) and this record is decoded afresh.
        let restart = (self.truncated || self.overwrite || self.gap).then_some(AuxStep::Restart);
        // Bytes at the end of this record are missing (TRUNCATED, short), or after it
        // (COLLISION: a TRBE wrap, the ETE kept tracing while the buffer was off): the
        // window open there is broken, and the next bytes start afresh.
        let cut = (self.truncated || self.short || self.collision).then_some(AuxStep::Cut);
        moved.into_iter().chain(restart).chain((0..self.parts).map(AuxStep::Feed)).chain(cut)
    }
}

/// The decoder calls of one step, the same on the pipeline's thread and on a decode worker
/// (`create` makes the decoder of the new stream; `parts`: the record's bytes).
pub(crate) fn run_step<S: CallSink>(
    dec: &mut Box<dyn WindowDecoder>,
    step: AuxStep,
    parts: &[&[u8]],
    code: &CodeMap,
    sink: &mut S,
    create: impl FnOnce() -> Box<dyn WindowDecoder>,
) {
    match step {
        AuxStep::Moved => {
            dec.finish(code, sink);
            sink.call_done();
            *dec = create();
        }
        AuxStep::Restart => {
            dec.finish(code, sink);
            sink.call_done();
            dec.reset();
        }
        AuxStep::Feed(i) => {
            dec.feed(parts.get(i).copied().unwrap_or_default(), code, sink);
            sink.call_done();
        }
        AuxStep::Cut => dec.reset(),
    }
}
