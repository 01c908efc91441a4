//! Ground truth from an executed path: what each executed instruction did to control flow,
//! the true call stack, and per trace window the true taken branches and the instruction
//! ranges a trace decoder must reconstruct.
//!
//! # Call stacks
//!
//! The call stack is tracked from the path itself: `BL`/`BLR` push `pc + 4`, a `RET` (or any
//! indirect branch) whose target is on the stack pops down to that entry. This is the *true*
//! stack (what a perfect unwinder gives). The eBPF program on a real system walks frame
//! pointers (`bpf_get_stack(BPF_F_USER_STACK)`: `pc`, then the saved LR of each frame record
//! from `x29`), which differs from the truth in two places: in a function that has not (yet)
//! pushed its frame record — leaf functions without a frame, and the first instructions of a
//! prologue / the last of an epilogue — the immediate caller is missing (its return address
//! is only in `x30`); and tail calls replace the caller's frame in both views alike.
//! Synthetic sessions carry the true stack, so joins are checked against exact truth.

use crate::a64::InsnClass;
use crate::image::CodeImage;

/// Kind of a P0 (waypoint) instruction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BranchKind {
    /// `B.cond`, `CBZ`, `TBZ`, ...
    Cond,
    /// `B`.
    Uncond,
    /// `BL`.
    Call,
    /// `BR`.
    IndirectJump,
    /// `BLR`.
    IndirectCall,
    /// `RET`.
    Return,
    /// `ERET`.
    Eret,
    /// `ISB` / `WFx` (waypoints that are not branches: always E, to the next instruction).
    Waypoint,
}

impl BranchKind {
    /// Indirect: the trace carries the target address (unless return-stack compression).
    pub fn is_indirect(self) -> bool {
        matches!(self, BranchKind::IndirectJump | BranchKind::IndirectCall | BranchKind::Return | BranchKind::Eret)
    }
    /// Pushes a return address (on the call stack and on the ETE return stack).
    pub fn is_link(self) -> bool {
        matches!(self, BranchKind::Call | BranchKind::IndirectCall)
    }
}

/// What one executed instruction did, given the next executed PC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    /// Not a waypoint; execution went on at `pc + 4`.
    Seq,
    /// A waypoint: atom E (`taken`) or N. `next` is where execution went on.
    Atom {
        /// Kind of waypoint.
        kind: BranchKind,
        /// E atom.
        taken: bool,
        /// Next executed PC.
        next: u64,
    },
    /// `SVC`/`HVC`/`SMC`: an exception with preferred return address `pc + 4`; user-space
    /// execution resumed at `next` (normally `pc + 4`; differs for `exit`, `rt_sigreturn`).
    Exception {
        /// Next executed (user-space) PC.
        next: u64,
    },
    /// Execution went somewhere this instruction cannot go (signal delivery, self-modifying
    /// code, an unknown instruction, code outside the image): a trace discontinuity.
    Gap {
        /// Next executed PC.
        next: u64,
    },
    /// Last instruction of the run.
    End,
}

/// Decide the [`Flow`] of the instruction `class` at `pc` followed by `next`.
pub fn flow(class: Option<InsnClass>, pc: u64, next: Option<u64>, wfx_waypoint: bool) -> Flow {
    let Some(next) = next else { return Flow::End };
    let seq = pc.wrapping_add(4);
    let Some(class) = class else {
        return if next == seq { Flow::Seq } else { Flow::Gap { next } };
    };
    match class {
        InsnClass::Other => {
            if next == seq {
                Flow::Seq
            } else {
                Flow::Gap { next }
            }
        }
        InsnClass::Wfx if !wfx_waypoint => {
            if next == seq {
                Flow::Seq
            } else {
                Flow::Gap { next }
            }
        }
        InsnClass::Wfx | InsnClass::Isb => {
            if next == seq {
                Flow::Atom { kind: BranchKind::Waypoint, taken: true, next }
            } else {
                Flow::Gap { next }
            }
        }
        InsnClass::DirectUncond { target, link } => {
            if next == target {
                Flow::Atom { kind: if link { BranchKind::Call } else { BranchKind::Uncond }, taken: true, next }
            } else {
                Flow::Gap { next }
            }
        }
        InsnClass::DirectCond { target } => {
            // A branch to the next instruction is taken (E): the PE cannot tell the difference
            // from the path, and hardware reports the condition; such code is not generated.
            if next == target {
                Flow::Atom { kind: BranchKind::Cond, taken: true, next }
            } else if next == seq {
                Flow::Atom { kind: BranchKind::Cond, taken: false, next }
            } else {
                Flow::Gap { next }
            }
        }
        InsnClass::Indirect { link, ret } => {
            let kind = if ret {
                BranchKind::Return
            } else if link {
                BranchKind::IndirectCall
            } else {
                BranchKind::IndirectJump
            };
            Flow::Atom { kind, taken: true, next }
        }
        InsnClass::Eret => Flow::Atom { kind: BranchKind::Eret, taken: true, next },
        InsnClass::ExceptionGen => Flow::Exception { next },
    }
}

/// A taken branch `{from, to}` with its kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TrueBranch {
    /// Address of the branch instruction.
    pub from: u64,
    /// Address of the next executed instruction.
    pub to: u64,
    /// Kind.
    pub kind: BranchKind,
}

/// How a traced instruction range ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RangeEnd {
    /// A waypoint with an E atom.
    E,
    /// A waypoint with an N atom.
    N,
    /// An exception-generating instruction (the range includes it).
    Exception,
}

/// An instruction range `[start, end)` as a trace decoder reconstructs it (OpenCSD
/// `OCSD_GEN_TRC_ELEM_INSTR_RANGE`): sequential instructions ending at a waypoint or an
/// exception. Instructions after the window's last waypoint are not in any range: hardware
/// emits nothing for them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TrueRange {
    /// First instruction.
    pub start: u64,
    /// Address after the last instruction.
    pub end: u64,
    /// Number of instructions.
    pub n_insns: u64,
    /// How it ended.
    pub last: RangeEnd,
}

/// Counters of the ground-truth pass.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PathStats {
    /// Executed instructions.
    pub insns: u64,
    /// Taken branches.
    pub taken_branches: u64,
    /// Not-taken conditional branches.
    pub not_taken: u64,
    /// `SVC`s.
    pub exceptions: u64,
    /// Discontinuities ([`Flow::Gap`]).
    pub gaps: u64,
    /// Executed PCs outside the program's executable segments.
    pub outside_image: u64,
    /// Returns whose target was not on the tracked call stack.
    pub unmatched_returns: u64,
    /// Maximum tracked call depth.
    pub max_depth: u64,
}

/// Maximum tracked call depth (deeper pushes drop the oldest entry; bounded memory).
pub const MAX_STACK: usize = 1 << 16;

/// The true call stack, maintained while walking the path.
#[derive(Debug, Clone, Default)]
pub struct CallStack {
    /// Return addresses, outermost first.
    pub returns: Vec<u64>,
}

impl CallStack {
    /// Apply the flow of the instruction at `pc`.
    pub fn apply(&mut self, pc: u64, f: Flow, stats: &mut PathStats) {
        if let Flow::Atom { kind, next, .. } = f {
            if kind.is_link() {
                if self.returns.len() >= MAX_STACK {
                    self.returns.remove(0);
                }
                self.returns.push(pc.wrapping_add(4));
                stats.max_depth = stats.max_depth.max(self.returns.len() as u64);
            } else if kind == BranchKind::Return {
                match self.returns.iter().rposition(|&r| r == next) {
                    Some(pos) => self.returns.truncate(pos),
                    None => stats.unmatched_returns += 1,
                }
            }
        }
    }

    /// The stack as the eBPF program reports it: `[leaf_ip, innermost return, ...]`.
    pub fn snapshot(&self, leaf_ip: u64) -> Vec<u64> {
        let mut v = Vec::with_capacity(self.returns.len() + 1);
        v.push(leaf_ip);
        v.extend(self.returns.iter().rev());
        v
    }
}

/// Accumulates the true branches and ranges of one window while its instructions are walked.
#[derive(Debug, Clone, Default)]
pub struct WindowTruth {
    /// Taken branches, oldest first.
    pub branches: Vec<TrueBranch>,
    /// Ranges, oldest first.
    pub ranges: Vec<TrueRange>,
    /// Exceptions (`SVC` addresses) in the window.
    pub exceptions: Vec<u64>,
    /// Discontinuities in the window (index of the instruction before the gap).
    pub gaps: u64,
    /// Instructions executed in the window.
    pub insns: u64,
    /// Instructions after the last waypoint (not visible in the trace).
    pub untraced_tail: u64,
    /// Index in `branches` of the first branch after the window's last exception or gap (where
    /// tracing restarted with Trace On): `branches[chain_start..]` is the unbroken chain that
    /// ends at the pause.
    pub chain_start: usize,
    cur_start: Option<u64>,
    cur_n: u64,
}

impl WindowTruth {
    /// Account the instruction at `pc` with flow `f`.
    pub fn step(&mut self, pc: u64, f: Flow) {
        self.insns += 1;
        let start = *self.cur_start.get_or_insert(pc);
        self.cur_n += 1;
        let end = pc.wrapping_add(4);
        match f {
            Flow::Seq | Flow::End => {}
            Flow::Atom { kind, taken, next } => {
                self.ranges.push(TrueRange {
                    start,
                    end,
                    n_insns: self.cur_n,
                    last: if taken { RangeEnd::E } else { RangeEnd::N },
                });
                if taken && kind != BranchKind::Waypoint {
                    self.branches.push(TrueBranch { from: pc, to: next, kind });
                }
                self.cur_start = None;
                self.cur_n = 0;
            }
            Flow::Exception { .. } => {
                self.ranges.push(TrueRange { start, end, n_insns: self.cur_n, last: RangeEnd::Exception });
                self.exceptions.push(pc);
                self.chain_start = self.branches.len();
                self.cur_start = None;
                self.cur_n = 0;
            }
            Flow::Gap { .. } => {
                // Hardware traces nothing for the instructions since the last waypoint.
                self.gaps += 1;
                self.chain_start = self.branches.len();
                self.untraced_tail += self.cur_n;
                self.cur_start = None;
                self.cur_n = 0;
            }
        }
    }

    /// Close the window: instructions after the last waypoint are not traced.
    pub fn finish(&mut self) {
        self.untraced_tail += self.cur_n;
        self.cur_start = None;
        self.cur_n = 0;
    }
}

/// Walk `pcs[s..e]` and return the window's truth (a convenience over [`WindowTruth::step`]).
pub fn window_truth(image: &mut CodeImage, pcs: &[u64], s: usize, e: usize, wfx_waypoint: bool) -> WindowTruth {
    let mut w = WindowTruth::default();
    for i in s..e.min(pcs.len()) {
        let f = flow(image.class(pcs[i]), pcs[i], pcs.get(i + 1).copied(), wfx_waypoint);
        w.step(pcs[i], f);
    }
    w.finish();
    w
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Conditional branches are E when the next PC is the target and N when it is pc+4;
    /// anything else is a discontinuity.
    #[test]
    fn conditional_flow() {
        let c = Some(InsnClass::DirectCond { target: 0x100 });
        assert_eq!(flow(c, 0x40, Some(0x100), false), Flow::Atom { kind: BranchKind::Cond, taken: true, next: 0x100 });
        assert_eq!(flow(c, 0x40, Some(0x44), false), Flow::Atom { kind: BranchKind::Cond, taken: false, next: 0x44 });
        assert_eq!(flow(c, 0x40, Some(0x80), false), Flow::Gap { next: 0x80 });
        assert_eq!(flow(Some(InsnClass::Other), 0x40, Some(0x80), false), Flow::Gap { next: 0x80 });
        assert_eq!(flow(Some(InsnClass::Other), 0x40, None, false), Flow::End);
    }

    /// Calls push pc+4, returns pop to their target, and the snapshot is leaf first.
    #[test]
    fn call_stack_tracks_calls_and_returns() {
        let mut st = PathStats::default();
        let mut cs = CallStack::default();
        cs.apply(0x100, Flow::Atom { kind: BranchKind::Call, taken: true, next: 0x500 }, &mut st);
        cs.apply(0x504, Flow::Atom { kind: BranchKind::IndirectCall, taken: true, next: 0x900 }, &mut st);
        assert_eq!(cs.snapshot(0x900), vec![0x900, 0x508, 0x104]);
        // A return straight to the outer frame (longjmp-like) pops both.
        cs.apply(0x904, Flow::Atom { kind: BranchKind::Return, taken: true, next: 0x104 }, &mut st);
        assert_eq!(cs.snapshot(0x104), vec![0x104]);
        cs.apply(0x108, Flow::Atom { kind: BranchKind::Return, taken: true, next: 0x4 }, &mut st);
        assert_eq!(st.unmatched_returns, 1);
        assert_eq!(st.max_depth, 2);
    }

    /// Ranges end at waypoints and exceptions; a gap and the window end leave untraced tails.
    #[test]
    fn window_ranges() {
        let mut w = WindowTruth::default();
        w.step(0x10, Flow::Seq);
        w.step(0x14, Flow::Atom { kind: BranchKind::Cond, taken: false, next: 0x18 });
        w.step(0x18, Flow::Atom { kind: BranchKind::Uncond, taken: true, next: 0x40 });
        w.step(0x40, Flow::Exception { next: 0x44 });
        w.step(0x44, Flow::Seq);
        w.finish();
        assert_eq!(
            w.ranges,
            vec![
                TrueRange { start: 0x10, end: 0x18, n_insns: 2, last: RangeEnd::N },
                TrueRange { start: 0x18, end: 0x1c, n_insns: 1, last: RangeEnd::E },
                TrueRange { start: 0x40, end: 0x44, n_insns: 1, last: RangeEnd::Exception },
            ]
        );
        assert_eq!(w.branches, vec![TrueBranch { from: 0x18, to: 0x40, kind: BranchKind::Uncond }]);
        assert_eq!(w.untraced_tail, 1);
        assert_eq!(w.insns, 5);
        // The exception breaks the chain: no branch follows it.
        assert_eq!(w.chain_start, 1);
    }
}
