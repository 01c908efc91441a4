//! From an executed path to what the hardware and the eBPF program would have produced:
//! per window the ETE bytes (one raw `PERF_RECORD_AUX` each), the pause sample, and the
//! ground truth.

use crate::ete::{self, Context, Encoder, EncoderConfig};
use crate::image::CodeImage;
use crate::truth::{BranchKind, CallStack, Flow, PathStats, TrueBranch, TrueRange, WindowTruth, flow};

/// Trace configuration of the synthetic ETE (recorded in the session's `cpus[0]`).
/// The ID registers are those of a real ETE + TRBE system (the `perf_with_unformatted_trace`
/// capture in the shared test data): 64-bit addresses, 32-bit context ID and VMID, 64-bit
/// timestamps, return stack implemented, TRCIDR8.MAXSPEC = 0, TRCIDR2.WFXMODE = 1.
pub mod regs {
    /// TRCIDR0.
    pub const TRCIDR0: u32 = 0x2880_06a1;
    /// TRCIDR1.
    pub const TRCIDR1: u32 = 0x4100_fff0;
    /// TRCIDR2 (bit 31 WFXMODE: WFI/WFE are waypoints).
    pub const TRCIDR2: u32 = 0xc000_1088;
    /// TRCIDR8 (MAXSPEC = 0).
    pub const TRCIDR8: u32 = 0;
    /// TRCAUTHSTATUS.
    pub const TRCAUTHSTATUS: u32 = 0xcc;
    /// TRCDEVARCH: ETE (ARCHPART 0xA13, ARCHVER 5), revision 1.
    pub const TRCDEVARCH: u32 = 0x4771_5a13;
    /// TRCCONFIGR.CID (bit 6): context ID tracing.
    pub const CONFIGR_CID: u32 = 1 << 6;
    /// TRCCONFIGR.TS (bit 11): timestamps.
    pub const CONFIGR_TS: u32 = 1 << 11;
    /// TRCCONFIGR.RS (bit 12): return stack.
    pub const CONFIGR_RS: u32 = 1 << 12;
    /// Legacy trace ID of CPU 0 (`0x10 + 2*cpu`).
    pub const TRACE_ID: u8 = 0x10;
}

/// Clock model: the PE retires one instruction per nanosecond; the ETE timestamp is a
/// 100 MHz system counter; perf time = `time_zero + counter * 10` (perf's formula with
/// `time_mult = 10 << 24`, `time_shift = 24`).
pub mod clock {
    /// Instructions per counter tick.
    pub const INSNS_PER_TICK: u64 = 10;
    /// Counter value when the first instruction runs.
    pub const COUNTER_BASE: u64 = 0x1_0000_0000;
    /// perf `time_zero`.
    pub const TIME_ZERO: u64 = 1_000_000_000;
    /// perf `time_mult`.
    pub const TIME_MULT: u32 = 10 << 24;
    /// perf `time_shift`.
    pub const TIME_SHIFT: u16 = 24;
    /// Delay from the pause to the sample's perf timestamp (interrupt entry), ns.
    pub const PAUSE_LATENCY_NS: u64 = 150;

    /// Counter value when instruction `i` (0-based in the run) executes.
    pub fn counter(i: u64) -> u64 {
        COUNTER_BASE + i / INSNS_PER_TICK
    }

    /// perf-clock ns of counter value `c` (exactly what perf's `tsc_to_perf_time` gives).
    pub fn perf_time(c: u64) -> u64 {
        let quot = c >> TIME_SHIFT;
        let rem = c & ((1u64 << TIME_SHIFT) - 1);
        TIME_ZERO + quot * TIME_MULT as u64 + ((rem * TIME_MULT as u64) >> TIME_SHIFT)
    }
}

/// A fault injected into one window of the written session (the OpenCSD snapshot and the
/// in-memory [`Window`]s stay clean). The ground truth marks the window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Fault {
    /// Only the first half of the window's bytes is written, and the AUX record carries
    /// `PERF_AUX_FLAG_TRUNCATED`.
    Truncate,
    /// One byte in the middle of the window (after its sync packets) is XORed with 0x5A.
    Corrupt,
    /// The window's A-sync and Trace Info packets are removed (the bytes start at the first
    /// timestamp): the window has no sync point.
    NoSync,
    /// The window's pause sample is lost: no `sample` line, a `lost` record (1 lost) instead.
    /// Its AUX bytes are written normally.
    Lost,
}

impl std::str::FromStr for Fault {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "truncate" => Fault::Truncate,
            "corrupt" => Fault::Corrupt,
            "nosync" | "no_sync" => Fault::NoSync,
            "lost" => Fault::Lost,
            _ => return Err(format!("unknown fault {s:?} (truncate, corrupt, nosync, lost)")),
        })
    }
}

/// Parse `KIND@WINDOW` (e.g. `truncate@3`).
pub fn parse_fault(s: &str) -> Result<(u64, Fault), String> {
    let (kind, at) = s.split_once('@').ok_or_else(|| format!("fault {s:?} is not KIND@WINDOW"))?;
    let at = at.parse::<u64>().map_err(|e| format!("fault window {at:?}: {e}"))?;
    Ok((at, kind.parse()?))
}

/// Generator options.
#[derive(Debug, Clone)]
pub struct SynthConfig {
    /// Window length in executed instructions.
    pub window: u64,
    /// Period between window starts in executed instructions (>= `window`).
    pub period: u64,
    /// Return-stack compression (TRCCONFIGR.RS).
    pub retstack: bool,
    /// Emit a timestamp at the end of each window too (after the last atoms).
    pub end_timestamp: bool,
    /// CPU of the synthetic session.
    pub cpu: i32,
    /// Process id of the synthetic target.
    pub pid: u32,
    /// Thread id (also the CONTEXTIDR value traced).
    pub tid: u32,
    /// Faults to inject into the written session: (window index, fault).
    pub faults: Vec<(u64, Fault)>,
}

impl Default for SynthConfig {
    fn default() -> Self {
        SynthConfig {
            window: 1_000,
            period: 100_000,
            retstack: true,
            end_timestamp: true,
            cpu: 0,
            pid: 4242,
            tid: 4242,
            faults: Vec::new(),
        }
    }
}

impl SynthConfig {
    /// The fault injected into window `k`, if any.
    pub fn fault(&self, k: u64) -> Option<Fault> {
        self.faults.iter().find(|(w, _)| *w == k).map(|(_, f)| *f)
    }

    /// TRCCONFIGR for this configuration.
    pub fn trcconfigr(&self) -> u32 {
        regs::CONFIGR_CID | regs::CONFIGR_TS | if self.retstack { regs::CONFIGR_RS } else { 0 }
    }

    /// Windows `[start, pause)` in instruction indices for a run of `n` instructions: window k
    /// ends (the pause) at `(k+1)*period` and starts `window` instructions earlier. A window
    /// needs an instruction at its pause index (the sampled PC), so the last one ends before `n`.
    pub fn windows(&self, n: u64) -> Vec<(u64, u64)> {
        let mut v = Vec::new();
        if self.window == 0 || self.period < self.window {
            return v;
        }
        let mut k = 1u64;
        while k * self.period < n {
            v.push((k * self.period - self.window, k * self.period));
            k += 1;
        }
        v
    }
}

/// One generated window: its AUX bytes, the pause sample and the truth.
#[derive(Debug, Clone)]
pub struct Window {
    /// Index of the first traced instruction in the run.
    pub start_index: u64,
    /// Index of the instruction at which the pause hit (the sampled PC; not traced).
    pub pause_index: u64,
    /// ETE bytes of the window (one raw AUX record).
    pub bytes: Vec<u8>,
    /// Counter value at the window start (first timestamp packet).
    pub start_counter: u64,
    /// Counter value at the pause.
    pub pause_counter: u64,
    /// perf-clock time of the pause sample (and of the AUX record).
    pub sample_time: u64,
    /// The user stack the eBPF program reports: `[pause PC, return addresses innermost first]`.
    pub stack: Vec<u64>,
    /// True taken branches in the window, oldest first.
    pub branches: Vec<TrueBranch>,
    /// True instruction ranges in the window, oldest first.
    pub ranges: Vec<TrueRange>,
    /// `SVC` addresses in the window.
    pub exceptions: Vec<u64>,
    /// Discontinuities in the window.
    pub gaps: u64,
    /// Instructions executed in the window.
    pub insns: u64,
    /// Instructions after the last waypoint (not visible in the trace).
    pub untraced_tail: u64,
    /// Taken branches after the window's last exception or gap (the newest ones): the chain a
    /// decoder sees unbroken up to the pause.
    pub chain_len: u64,
    /// The window's last P0 element is a taken indirect branch whose target address was not
    /// sent (return-stack compression): the target is only implied by the return stack.
    pub final_target_implied: bool,
    /// Encoder counters.
    pub packets: ete::EncoderStats,
}

/// Everything generated from one run.
#[derive(Debug, Clone)]
pub struct Synthesis {
    /// Options used.
    pub config: SynthConfig,
    /// Windows in time order.
    pub windows: Vec<Window>,
    /// Counters over the whole path.
    pub stats: PathStats,
}

/// Walk the whole path once: track the call stack, and encode + account every window.
pub fn synthesize(image: &mut CodeImage, pcs: &[u64], cfg: &SynthConfig) -> Synthesis {
    let wfx = regs::TRCIDR2 >> 31 == 1;
    let ctx = Context { el: 0, ns: true, sf: true, context_id: Some(cfg.tid) };
    let enc_cfg = EncoderConfig { retstack: cfg.retstack, ..EncoderConfig::default() };
    let plan = cfg.windows(pcs.len() as u64);
    let mut stats = PathStats::default();
    let mut stack = CallStack::default();
    let mut windows = Vec::with_capacity(plan.len());
    let mut next_w = 0usize;
    let mut cur: Option<(Encoder, WindowTruth)> = None;
    let mut final_implied = false;
    for (i, &pc) in pcs.iter().enumerate() {
        let i64_ = i as u64;
        // Pause at this instruction: close the window (the instruction itself is not traced).
        if next_w < plan.len() && plan[next_w].1 == i64_ {
            if let Some((mut enc, mut wt)) = cur.take() {
                wt.finish();
                let pause_counter = clock::counter(i64_);
                if cfg.end_timestamp {
                    enc.timestamp(pause_counter);
                }
                let packets = enc.stats.clone();
                let (s, e) = plan[next_w];
                let chain_len = (wt.branches.len() - wt.chain_start) as u64;
                windows.push(Window {
                    start_index: s,
                    pause_index: e,
                    bytes: enc.finish(),
                    start_counter: clock::counter(s),
                    pause_counter,
                    sample_time: clock::perf_time(pause_counter) + clock::PAUSE_LATENCY_NS,
                    stack: stack.snapshot(pc),
                    branches: wt.branches,
                    ranges: wt.ranges,
                    exceptions: wt.exceptions,
                    gaps: wt.gaps,
                    insns: wt.insns,
                    untraced_tail: wt.untraced_tail,
                    chain_len,
                    final_target_implied: final_implied,
                    packets,
                });
            }
            next_w += 1;
        }
        // Resume at this instruction: sync, trace on, address with context.
        if next_w < plan.len() && plan[next_w].0 == i64_ {
            let mut enc = Encoder::new(enc_cfg);
            enc.a_sync();
            enc.trace_info();
            enc.timestamp(clock::counter(i64_));
            enc.trace_on();
            enc.address_with_context(pc, &ctx);
            cur = Some((enc, WindowTruth::default()));
            final_implied = false;
        }
        let class = image.class(pc);
        if class.is_none() {
            stats.outside_image += 1;
        }
        let f = flow(class, pc, pcs.get(i + 1).copied(), wfx);
        stats.insns += 1;
        match f {
            Flow::Atom { taken: true, kind, .. } if kind != BranchKind::Waypoint => stats.taken_branches += 1,
            Flow::Atom { taken: false, .. } => stats.not_taken += 1,
            Flow::Exception { .. } => stats.exceptions += 1,
            Flow::Gap { .. } => stats.gaps += 1,
            _ => {}
        }
        if let Some((enc, wt)) = cur.as_mut() {
            wt.step(pc, f);
            let last_in_window = next_w < plan.len() && plan[next_w].1 == i64_ + 1;
            let hits = enc.stats.retstack_hits;
            encode_step(enc, pc, f, last_in_window, &ctx);
            match f {
                Flow::Seq | Flow::End => {}
                _ => final_implied = enc.stats.retstack_hits > hits,
            }
        }
        stack.apply(pc, f, &mut stats);
    }
    Synthesis { config: cfg.clone(), windows, stats }
}

/// Encode one executed instruction.
fn encode_step(enc: &mut Encoder, pc: u64, f: Flow, last_in_window: bool, ctx: &Context) {
    match f {
        Flow::Seq | Flow::End => {}
        Flow::Atom { kind, taken, next } => match kind {
            BranchKind::Cond => enc.atom(taken),
            BranchKind::Uncond | BranchKind::Waypoint => enc.branch(false, false, pc, next),
            BranchKind::Call => enc.branch(false, true, pc, next),
            BranchKind::IndirectJump | BranchKind::Return | BranchKind::Eret => enc.branch(true, false, pc, next),
            BranchKind::IndirectCall => enc.branch(true, true, pc, next),
        },
        Flow::Exception { next } => {
            // The exception is taken from traced EL0 code to untraced EL1: an exception packet
            // with the preferred return address; tracing resumes (Trace On) back at EL0.
            enc.exception(ete::EXCEPTION_CALL, pc.wrapping_add(4));
            if !last_in_window {
                enc.trace_on();
                enc.address_with_context(next, ctx);
            }
        }
        Flow::Gap { next } => {
            if !last_in_window {
                enc.trace_on();
                enc.address_with_context(next, ctx);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Windows end at multiples of the period, start `window` earlier, and need a sampled PC.
    #[test]
    fn window_plan() {
        let c = SynthConfig { window: 10, period: 100, ..SynthConfig::default() };
        assert_eq!(c.windows(301), vec![(90, 100), (190, 200), (290, 300)]);
        assert_eq!(c.windows(300), vec![(90, 100), (190, 200)]);
        let bad = SynthConfig { window: 10, period: 5, ..SynthConfig::default() };
        assert!(bad.windows(1000).is_empty());
    }

    /// `KIND@WINDOW` parses; unknown kinds and missing windows are errors.
    #[test]
    fn fault_syntax() {
        assert_eq!(parse_fault("truncate@3"), Ok((3, Fault::Truncate)));
        assert_eq!(parse_fault("nosync@0"), Ok((0, Fault::NoSync)));
        assert!(parse_fault("zap@1").is_err());
        assert!(parse_fault("lost").is_err());
    }

    /// The clock helper is perf's `tsc_to_perf_time` with the chosen parameters: 10 ns/tick.
    #[test]
    fn clock_is_ten_ns_per_tick() {
        assert_eq!(clock::perf_time(0), clock::TIME_ZERO);
        assert_eq!(clock::perf_time(clock::COUNTER_BASE + 7) - clock::perf_time(clock::COUNTER_BASE), 70);
    }
}
