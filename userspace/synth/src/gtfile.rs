//! The ground-truth file `ground_truth.jsonl` written next to a synthetic session.
//!
//! One JSON object per line, tagged by `"type"`; addresses are plain JSON integers (runtime
//! = link-time addresses: the programs are static, non-PIE).
//!
//! 1. `{"type":"meta", ...}` ([`GtMeta`]): program, arguments, window/period, trace
//!    configuration, whole-path counters ([`crate::truth::PathStats`]).
//! 2. One `{"type":"window", ...}` per window, in time order ([`GtWindow`]):
//!    * `index`: window number; the same order as the `aux` records and `sample` lines of
//!      `events.jsonl` (window k = k-th AUX record of CPU `cpu` = k-th sample);
//!    * `start_index` / `pause_index`: instruction indices in the run; instructions
//!      `[start_index, pause_index)` were traced, the pause hit at `pause_index`;
//!    * `sample_time`: the sample's perf time; `aux_offset`/`aux_size`: the window's bytes in
//!      `aux/cpu<cpu>.bin`;
//!    * `stack`: the true call stack at the pause, leaf first (`stack[0]` = the sampled PC =
//!      the first instruction *not* traced), then return addresses innermost first — the
//!      same as the sample's `stack` in `events.jsonl`;
//!    * `branches`: **every** taken branch whose branch instruction was traced in the window,
//!      **newest first** (`{from, to, kind}`; kinds `cond`, `uncond`, `call`,
//!      `indirect_jump`, `indirect_call`, `return`); the last N branches before the pause are
//!      the first N entries. `branches[0].to` may equal `stack[0]` (a branch right before the
//!      pause). Exceptions (`SVC`) are not branches; they are listed in `exceptions`
//!      (addresses of the `SVC` instructions), and tracing restarts (Trace On) after each;
//!    * `ranges`: the instruction ranges a trace decoder reconstructs, **oldest first**
//!      (`{start, end, n_insns, last}`, `end` exclusive, `last` = `e` / `n` for the atom of
//!      the final waypoint, `exception` for a range ending with an `SVC`). Instructions after
//!      the last waypoint of the window are in no range (`untraced_tail` counts them);
//!    * `n_branches`, `n_ranges`, `insns` (instructions executed in the window), `gaps`
//!      (discontinuities other than exceptions; 0 for well-behaved programs);
//!    * `chain_len`: how many of the newest `branches` follow the window's last exception or
//!      gap, i.e. the chain a decoder sees unbroken up to the pause (= `n_branches` when the
//!      window has no `SVC`);
//!    * `final_target_implied`: the window's last waypoint is a return whose target was not
//!      sent (return-stack compression): a decoder knows `branches[0].to` only from its
//!      return stack;
//!    * `fault`: `null`, or the fault injected into this window's session data (`truncate`,
//!      `corrupt`, `no_sync`, `lost`; see [`crate::generate::Fault`]). `aux_offset`/`aux_size`
//!      describe the bytes as written (after the fault); with a `lost` fault the window has no `sample` line, so
//!      sample k of `events.jsonl` is the k-th window *without* a `lost` fault.
//! 3. `{"type":"totals", ...}` ([`GtTotals`]): sums over all windows.

use std::io::{BufRead, Write};

use serde::{Deserialize, Serialize};

use crate::generate::{Fault, Synthesis};
use crate::truth::{PathStats, TrueBranch, TrueRange};

/// First line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GtMeta {
    /// Program path as run.
    pub program: String,
    /// Arguments.
    pub args: Vec<String>,
    /// Exit code of the emulated run.
    pub exit_code: Option<i32>,
    /// Window length (instructions).
    pub window: u64,
    /// Period (instructions).
    pub period: u64,
    /// Return-stack compression on.
    pub retstack: bool,
    /// TRCCONFIGR written to the session.
    pub trcconfigr: u32,
    /// CPU, pid, tid of the samples.
    pub cpu: i32,
    /// Process id.
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// Number of windows.
    pub windows: u64,
    /// Injected faults: (window index, fault).
    #[serde(default)]
    pub faults: Vec<(u64, Fault)>,
    /// Whole-path counters.
    pub stats: PathStats,
}

/// One window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GtWindow {
    /// Window number.
    pub index: u64,
    /// First traced instruction index.
    pub start_index: u64,
    /// Pause instruction index.
    pub pause_index: u64,
    /// Sample perf time.
    pub sample_time: u64,
    /// Offset of the window's bytes in `aux/cpu<cpu>.bin`.
    pub aux_offset: u64,
    /// Size of the window's bytes.
    pub aux_size: u64,
    /// True stack, leaf first.
    pub stack: Vec<u64>,
    /// Taken branches, newest first.
    pub branches: Vec<TrueBranch>,
    /// Ranges, oldest first.
    pub ranges: Vec<TrueRange>,
    /// SVC addresses.
    pub exceptions: Vec<u64>,
    /// `branches.len()`.
    pub n_branches: u64,
    /// `ranges.len()`.
    pub n_ranges: u64,
    /// Instructions executed in the window.
    pub insns: u64,
    /// Instructions after the last waypoint.
    pub untraced_tail: u64,
    /// Discontinuities.
    pub gaps: u64,
    /// Fault injected into this window's session data, if any.
    #[serde(default)]
    pub fault: Option<Fault>,
    /// Number of newest branches after the window's last exception/gap (Trace On): the
    /// unbroken chain ending at the pause is `branches[..chain_len]`.
    #[serde(default)]
    pub chain_len: u64,
    /// The last branch is a return whose target the trace only implies through the return
    /// stack (no address packet follows it before the pause).
    #[serde(default)]
    pub final_target_implied: bool,
}

/// Last line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GtTotals {
    /// Windows.
    pub windows: u64,
    /// Sum of `n_branches`.
    pub branches: u64,
    /// Sum of `n_ranges`.
    pub ranges: u64,
    /// Sum of traced instructions (instructions in ranges).
    pub traced_insns: u64,
}

/// A parsed line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum GtLine {
    /// `meta`.
    Meta(GtMeta),
    /// `window`.
    Window(GtWindow),
    /// `totals`.
    Totals(GtTotals),
}

/// The whole file.
#[derive(Debug, Clone, PartialEq)]
pub struct GroundTruth {
    /// Meta line.
    pub meta: GtMeta,
    /// Windows.
    pub windows: Vec<GtWindow>,
    /// Totals.
    pub totals: GtTotals,
}

/// Write the ground truth of `syn` (`meta` filled by the caller; `aux` = offset and size of each
/// window's bytes as written in the AUX file).
pub fn write(mut w: impl Write, meta: &GtMeta, syn: &Synthesis, aux: &[(u64, u64)]) -> std::io::Result<()> {
    let line = |w: &mut dyn Write, l: &GtLine| -> std::io::Result<()> {
        serde_json::to_writer(&mut *w, l)?;
        w.write_all(b"\n")
    };
    line(&mut w, &GtLine::Meta(meta.clone()))?;
    let mut totals = GtTotals { windows: 0, branches: 0, ranges: 0, traced_insns: 0 };
    for (k, win) in syn.windows.iter().enumerate() {
        let mut branches = win.branches.clone();
        branches.reverse();
        totals.windows += 1;
        totals.branches += branches.len() as u64;
        totals.ranges += win.ranges.len() as u64;
        totals.traced_insns += win.ranges.iter().map(|r| r.n_insns).sum::<u64>();
        let g = GtWindow {
            index: k as u64,
            start_index: win.start_index,
            pause_index: win.pause_index,
            sample_time: win.sample_time,
            aux_offset: aux.get(k).map_or(0, |a| a.0),
            aux_size: aux.get(k).map_or(win.bytes.len() as u64, |a| a.1),
            stack: win.stack.clone(),
            n_branches: branches.len() as u64,
            branches,
            n_ranges: win.ranges.len() as u64,
            ranges: win.ranges.clone(),
            exceptions: win.exceptions.clone(),
            insns: win.insns,
            untraced_tail: win.untraced_tail,
            gaps: win.gaps,
            fault: syn.config.fault(k as u64),
            chain_len: win.chain_len,
            final_target_implied: win.final_target_implied,
        };
        line(&mut w, &GtLine::Window(g))?;
    }
    line(&mut w, &GtLine::Totals(totals))
}

/// Errors reading a ground-truth file.
#[derive(Debug, thiserror::Error)]
pub enum GtError {
    /// I/O.
    #[error("reading ground truth: {0}")]
    Io(#[from] std::io::Error),
    /// A line is not valid JSON of the expected shape.
    #[error("ground truth line {line}: {source}")]
    Json {
        /// 1-based line number.
        line: usize,
        /// Cause.
        source: serde_json::Error,
    },
    /// The meta or totals line is missing.
    #[error("ground truth is missing its {0} line")]
    Missing(&'static str),
}

/// Read a ground-truth file.
pub fn read(r: impl BufRead) -> Result<GroundTruth, GtError> {
    let (mut meta, mut totals, mut windows) = (None, None, Vec::new());
    for (n, l) in r.lines().enumerate() {
        let l = l?;
        if l.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<GtLine>(&l).map_err(|source| GtError::Json { line: n + 1, source })? {
            GtLine::Meta(m) => meta = Some(m),
            GtLine::Window(w) => windows.push(w),
            GtLine::Totals(t) => totals = Some(t),
        }
    }
    Ok(GroundTruth { meta: meta.ok_or(GtError::Missing("meta"))?, windows, totals: totals.ok_or(GtError::Missing("totals"))? })
}
