//! A shadow call stack over one segment's decoded instruction ranges (A64: 4-byte
//! instructions), for the inclusive counts and calls of `etm_profile::exact`.
//!
//! What "inside the segment" means: the stack holds the frames the segment *sees*, i.e. that
//! execute at least one of its instructions. A frame entered by a call in the segment is seen
//! from its first instruction; the frame running when the segment begins, and every frame a
//! return below the bottom of the stack lands in, were entered before the segment began and are
//! seen from the segment's start (all the segment's instructions so far ran above them). A
//! frame's inclusive count is the segment's instructions from the point it is seen until it
//! returns or the segment ends; the outermost frame of a function only, so a recursive function
//! counts each instruction once (also when a return below the bottom lands in another frame of a
//! function already counted from the start). Frames below the lowest one seen are unknown and get nothing.
//! A branch to another function that is neither a call nor a return (a tail call) replaces the
//! top frame. A break in the chain (trace loss) ends every frame, as the end of the segment
//! does; the frames after it are seen from there. Calls: entries by a call instruction (BL,
//! BLR) inside the segment, counted for the function the call landed in; a call is *complete*
//! when its frame also returned in the segment (not ended by a tail call or a break): its own
//! and inclusive instructions are then that call's exactly.

use etm_profile::exact::{ContextIndex, ExactCounts, ROOT_CONTEXT};

use crate::join::InsnKind;
use crate::window::TraceRange;

/// Frames kept; a deeper stack breaks the chain (its frames end there), so memory is bounded.
const MAX_DEPTH: usize = 4096;

#[derive(Debug, Clone, Copy)]
struct Frame {
    f: u32,
    /// Segment instruction count when the frame was first seen.
    seen: u64,
    /// No frame of the same function below it.
    outermost: bool,
    /// Entered by a call in this chain.
    by_call: bool,
    /// Instructions since `seen` that ran above it (in the frames it called, or before it
    /// was seen on the stack): its own instructions are the rest.
    above: u64,
    /// Its calling context (the path of the frames below it).
    node: ContextIndex,
}

/// Counts by function, summed through a small direct-mapped index of the entries (a segment
/// usually touches a few functions, again and again); a function whose slot another one
/// took gets another entry (the entries' sums stay right).
#[derive(Debug)]
struct Sums {
    entries: Vec<(u32, u64)>,
    slots: [u32; SUM_SLOTS],
}

const SUM_SLOTS: usize = 64;

impl Default for Sums {
    fn default() -> Self {
        Sums { entries: Vec::new(), slots: [0; SUM_SLOTS] }
    }
}

impl Sums {
    #[inline]
    fn add(&mut self, f: u32, n: u64) {
        let s = &mut self.slots[f as usize % SUM_SLOTS];
        match self.entries.get_mut(*s as usize) {
            Some(e) if e.0 == f => e.1 += n,
            _ => {
                *s = self.entries.len() as u32;
                self.entries.push((f, n));
            }
        }
    }

    fn clear(&mut self) {
        self.entries.clear();
    }
}

/// One CPU's open segment: its counts so far and its call stack.
///
/// The per-range work is kept to the common case, a range in the function of the range
/// before: the instruction count moves on (`t`) and the rest waits. A frame's own
/// instructions are settled when it ends: what ran since it was seen, less what ran above it
/// (each frame that ends adds its duration to the frame below); every instruction runs in the
/// top frame, so a function's own instructions are its frames'.
#[derive(Debug, Default)]
pub(crate) struct SegmentWalk {
    /// Instructions by function.
    own: Sums,
    /// Inclusive instructions by function of the frames ended so far.
    pub(crate) inclusive: Vec<(u32, u64)>,
    /// Calls by the function they entered.
    calls: Sums,
    /// Calls entered and returned in the segment: (function, its calling context, its own
    /// instructions, its inclusive instructions).
    pub(crate) complete: Vec<(u32, ContextIndex, u64, u64)>,
    stack: Vec<Frame>,
    /// Where the current chain's entries of `inclusive` begin: a frame seen from the chain's
    /// start (returned into) covers what earlier frames of its function in the chain were
    /// already credited for (a recursive function's frames), which is subtracted.
    chain_inclusive: usize,
    /// Instructions so far, and when the current chain began.
    t: u64,
    chain_start: u64,
    /// A range came since the chain began; then the last one's last instruction and its
    /// kind.
    has_prev: bool,
    prev_from: u64,
    prev_kind: InsnKind,
    /// The function of the last range (the top frame's, when there is one).
    cur_f: u32,
    /// A range came in the segment.
    any: bool,
}

impl SegmentWalk {
    /// The next range: `n` instructions from `start`, in function `f`, the last of kind
    /// `last`; its instructions go to their calling context in `ctx`. Returns the source of the
    /// taken branch that led here and its function, if one did. (The one rule per range:
    /// [`ranges`](Self::ranges) is this over a batch, with the walk's state in locals.)
    #[cfg(test)]
    pub(crate) fn range(&mut self, f: u32, start: u64, n: u32, last: InsnKind, ctx: &mut ExactCounts) -> Option<(u64, u32)> {
        let mut taken = None;
        self.ranges(
            &[TraceRange { start, n, kind: last }],
            ctx,
            &mut (),
            |_, _, _| (f, u64::MAX),
            |_, _, from, from_f, _| taken = Some((from, from_f)),
        );
        taken
    }

    /// A batch of ranges: each range's function and the source of the last taken branch to
    /// it recorded for coverage from `function` (once per range, in order: it may keep that
    /// source and be asked again); the instructions go to their calling context in `ctx`;
    /// `taken(env, ctx, from, from_f, to)` for each range a taken branch led to whose source is
    /// not the one `function` gave. Both get `env`.
    ///
    /// The common case, a range after a branch that is neither a call nor a return in the
    /// same function, only moves the count on; the rest is the frame operations (inlined:
    /// out of line, their calls cost more than the registers they spare the loop).
    #[inline(always)]
    pub(crate) fn ranges<E, F, T>(&mut self, rs: &[TraceRange], ctx: &mut ExactCounts, env: &mut E, mut function: F, mut taken: T)
    where
        F: FnMut(&mut E, &mut ExactCounts, u64) -> (u32, u64),
        T: FnMut(&mut E, &mut ExactCounts, u64, u32, u64),
    {
        let mut t = self.t;
        let mut prev_from = self.prev_from;
        let mut prev_kind = self.prev_kind;
        let mut cur_f = self.cur_f;
        for r in rs {
            let (f, seen_from) = function(env, ctx, r.start);
            if self.has_prev {
                if r.start != prev_from.wrapping_add(4) && seen_from != prev_from {
                    taken(env, ctx, prev_from, cur_f, r.start);
                }
                if matches!(prev_kind, InsnKind::Call | InsnKind::Return) || f != cur_f {
                    self.t = t;
                    self.frame_op(f, prev_kind, ctx);
                    cur_f = f;
                }
            } else {
                self.t = t;
                self.first(f, ctx);
                cur_f = f;
            }
            t += u64::from(r.n);
            prev_from = r.start.wrapping_add(4 * u64::from(r.n.max(1) - 1));
            prev_kind = r.kind;
        }
        self.t = t;
        self.prev_from = prev_from;
        self.prev_kind = prev_kind;
        debug_assert!(rs.is_empty() || self.cur_f == cur_f);
    }

    /// The branch after a range whose last instruction was of kind `kind` led to another
    /// function `f`, or was a call or a return.
    #[inline]
    fn frame_op(&mut self, f: u32, kind: InsnKind, ctx: &mut ExactCounts) {
        match kind {
            InsnKind::Call => self.call(f, ctx),
            InsnKind::Return => self.ret(f, ctx),
            _ => self.replace(f, ctx),
        }
    }

    /// The first range of a chain, in `f`.
    #[inline(always)]
    fn first(&mut self, f: u32, ctx: &mut ExactCounts) {
        self.cur_f = f;
        self.push(f, self.t, false, ctx);
        self.has_prev = true;
        self.any = true;
    }

    /// A call landed in `f`.
    #[inline(always)]
    fn call(&mut self, f: u32, ctx: &mut ExactCounts) {
        self.cur_f = f;
        self.push(f, self.t, true, ctx);
        self.calls.add(f, 1);
        if let Some(fr) = self.stack.last() {
            ctx.add_context_call(fr.node);
        }
    }

    /// A return landed in `f`.
    #[inline(always)]
    fn ret(&mut self, f: u32, ctx: &mut ExactCounts) {
        self.cur_f = f;
        if let Some((fr, own)) = self.pop(ctx)
            && fr.by_call
        {
            self.complete.push((fr.f, fr.node, own, self.t - fr.seen));
        }
        match self.stack.last() {
            None => self.push(f, self.chain_start, false, ctx),
            Some(fr) if fr.f != f => {
                self.pop(ctx);
                self.push(f, self.t, false, ctx);
            }
            Some(_) => {}
        }
    }

    /// A branch that is neither a call nor a return went to another function `f` (a tail
    /// call): its frame replaces the top one.
    #[inline(always)]
    fn replace(&mut self, f: u32, ctx: &mut ExactCounts) {
        self.cur_f = f;
        let Some(&top) = self.stack.last() else {
            self.push(f, self.t, false, ctx);
            return;
        };
        // The top frame ends and the new one takes its place (its slot, its caller).
        let at = self.stack.len() - 1;
        self.end_frame(top, at.checked_sub(1), ctx);
        let node = ctx.context(at.checked_sub(1).map_or(ROOT_CONTEXT, |i| self.stack[i].node), f);
        let outermost = !self.stack[..at].iter().any(|fr| fr.f == f);
        self.stack[at] = Frame { f, seen: self.t, outermost, by_call: false, above: 0, node };
    }

    #[inline(always)]
    fn push(&mut self, f: u32, seen: u64, by_call: bool, ctx: &mut ExactCounts) {
        if self.stack.len() >= MAX_DEPTH {
            self.break_chain(ctx);
        }
        let node = ctx.context(self.stack.last().map_or(ROOT_CONTEXT, |fr| fr.node), f);
        // A scan, no map: the stack holds the frames seen since the chain began.
        let outermost = !self.stack.iter().any(|fr| fr.f == f);
        self.stack.push(Frame { f, seen, outermost, by_call, above: self.t - seen, node });
    }

    /// The top frame ends: its own instructions to its context, its inclusive ones to its
    /// function if it is the outermost frame of it. Returns it and its own instructions.
    #[inline(always)]
    fn pop(&mut self, ctx: &mut ExactCounts) -> Option<(Frame, u64)> {
        let fr = self.stack.pop()?;
        let below = self.stack.len().checked_sub(1);
        Some((fr, self.end_frame(fr, below, ctx)))
    }

    /// Frame `fr` ends, the one at `below` in the stack under it: what [`pop`](Self::pop)
    /// counts of it. Returns its own instructions.
    #[inline(always)]
    fn end_frame(&mut self, fr: Frame, below: Option<usize>, ctx: &mut ExactCounts) -> u64 {
        let ran = self.t - fr.seen;
        let own = ran - fr.above;
        if let Some(i) = below {
            self.stack[i].above += ran;
        }
        self.own.add(fr.f, own);
        ctx.add_context(fr.node, own);
        if fr.outermost {
            // Frames seen later than the chain's start begin after every earlier frame of
            // their function ended: nothing of theirs was credited yet.
            let done: u64 = if fr.seen == self.chain_start {
                self.inclusive[self.chain_inclusive..].iter().filter(|e| e.0 == fr.f).map(|e| e.1).sum()
            } else {
                0
            };
            let n = ran.saturating_sub(done);
            if n > 0 {
                self.inclusive.push((fr.f, n));
            }
        }
        own
    }

    /// The chain broke (trace lost): every frame ends here; what follows is seen afresh.
    #[inline(never)]
    pub(crate) fn break_chain(&mut self, ctx: &mut ExactCounts) {
        while !self.stack.is_empty() {
            self.pop(ctx);
        }
        self.has_prev = false;
        self.chain_start = self.t;
        self.chain_inclusive = self.inclusive.len();
    }

    /// The segment ends: every frame ends; the counts are left for the caller to take
    /// ([`own`](Self::own) and the public fields). False if no range came in the segment.
    pub(crate) fn end(&mut self, ctx: &mut ExactCounts) -> bool {
        if !self.any {
            return false;
        }
        self.break_chain(ctx);
        self.any = false;
        self.t = 0;
        self.chain_start = 0;
        true
    }

    /// Instructions by function, after [`end`](Self::end).
    pub(crate) fn own(&self) -> &[(u32, u64)] {
        &self.own.entries
    }

    /// Calls by the function they entered.
    pub(crate) fn calls(&self) -> &[(u32, u64)] {
        &self.calls.entries
    }

    /// The caller took the counts: the next segment begins.
    pub(crate) fn clear(&mut self) {
        self.own.clear();
        self.inclusive.clear();
        self.calls.clear();
        self.complete.clear();
        self.chain_inclusive = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use InsnKind::*;

    fn sums(v: &[(u32, u64)]) -> std::collections::BTreeMap<u32, u64> {
        let mut m = std::collections::BTreeMap::new();
        for &(f, n) in v {
            *m.entry(f).or_default() += n;
        }
        m
    }

    /// The segment begins inside g (called by f before it began, f called by m): g runs 3,
    /// returns to f, f runs 2 and calls h (4, returns), f runs 1 more and returns to m, which
    /// runs 5. Seen frames: g from the start, f from the start (all so far ran above it), h from
    /// its call, m from the start. By hand: self g 3, f 3, h 4, m 5 (15); inclusive g 3,
    /// f 3 + 2 + 4 + 1 = 10, h 4, m 15; one call (h).
    #[test]
    fn frames_entered_before_the_segment() {
        let mut w = SegmentWalk::default();
        let mut c = ExactCounts::new(16);
        assert_eq!(w.range(1, 0x100, 3, Return, &mut c), None); // g: ..., ret
        assert_eq!(w.range(2, 0x208, 2, Call, &mut c), Some((0x108, 1))); // f after its call of g, bl h
        w.range(3, 0x300, 4, Return, &mut c); // h
        w.range(2, 0x20c, 1, Return, &mut c); // f after the bl
        w.range(4, 0x404, 5, Other, &mut c); // m
        assert!(w.end(&mut c));
        assert_eq!(sums(w.own()), [(1, 3), (2, 3), (3, 4), (4, 5)].into());
        assert_eq!(sums(&w.inclusive), [(1, 3), (2, 10), (3, 4), (4, 15)].into());
        assert_eq!(w.calls(), [(3, 1)]);
        assert_eq!(w.complete.iter().map(|c| (c.0, c.2, c.3)).collect::<Vec<_>>(), [(3, 4, 4)]);
        // h's call in its context f;h.
        assert_eq!(c.context_calls().iter().map(|x| (x.path.clone(), x.calls)).collect::<Vec<_>>(), [(vec![2, 3], 1)]);
        // Contexts as the frames were seen: g alone, then f (returned into), f;h, then m.
        let mut p = c.context_paths();
        p.sort();
        assert_eq!(p, [(vec![1], 3), (vec![2], 3), (vec![2, 3], 4), (vec![4], 5)]);
    }

    /// Recursion counts each instruction once per function; a tail call replaces the frame.
    #[test]
    fn recursion_and_tail_call() {
        let mut w = SegmentWalk::default();
        let mut c = ExactCounts::new(16);
        w.range(1, 0x100, 2, Call, &mut c); // r
        w.range(1, 0x100, 2, Call, &mut c); // r again (recursive call)
        w.range(1, 0x100, 3, Jump, &mut c); // r tail-calls t
        w.range(2, 0x200, 4, Return, &mut c); // t returns into r
        w.range(1, 0x108, 1, Return, &mut c); // r returns into r
        w.range(1, 0x108, 1, Other, &mut c);
        assert!(w.end(&mut c));
        // One entry per function.
        assert_eq!(w.own(), [(1, 9), (2, 4)]);
        // r: every instruction (13) once; t: 4; calls: r, r.
        assert_eq!(sums(&w.inclusive), [(1, 13), (2, 4)].into());
        assert_eq!(w.calls(), [(1, 2)]);
        // The innermost call of r ended by its tail call (not complete), the tail-called t was
        // entered by a jump (not a call); the middle call of r returned: own 2 + 1, inclusive
        // 2 + 3 + 4 + 1. The bottom frame was entered before the segment.
        assert_eq!(w.complete.iter().map(|c| (c.0, c.2, c.3)).collect::<Vec<_>>(), [(1, 3, 10)]);
    }

    /// The segment begins deep in a recursion: each return below the bottom lands in another
    /// frame of the same function, seen from the start; every instruction counts once.
    #[test]
    fn returns_below_the_bottom_into_the_same_function() {
        let mut w = SegmentWalk::default();
        let mut c = ExactCounts::new(16);
        w.range(1, 0x100, 3, Return, &mut c);
        w.range(1, 0x108, 2, Return, &mut c);
        w.range(1, 0x108, 2, Call, &mut c);
        w.range(2, 0x200, 1, Return, &mut c);
        w.range(1, 0x10c, 4, Other, &mut c);
        assert!(w.end(&mut c));
        assert_eq!(sums(&w.inclusive), [(1, 12), (2, 1)].into());
    }

    /// A break ends the frames; the next frames are seen from there.
    #[test]
    fn broken_chain() {
        let mut w = SegmentWalk::default();
        let mut c = ExactCounts::new(16);
        w.range(1, 0x100, 2, Call, &mut c);
        w.range(2, 0x200, 3, Other, &mut c);
        w.break_chain(&mut c);
        w.range(3, 0x300, 4, Return, &mut c);
        w.range(1, 0x104, 1, Other, &mut c);
        assert!(w.end(&mut c));
        // f1: 2 + 3 before the break, then seen again from the break: 4 + 1.
        assert_eq!(sums(&w.inclusive), [(1, 10), (2, 3), (3, 4)].into());
    }
}
