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

/// Frames kept; a deeper stack breaks the chain (its frames end there), so memory is bounded.
const MAX_DEPTH: usize = 4096;

#[derive(Debug, Clone, Copy)]
struct Frame {
    f: u32,
    /// Segment instruction count when the frame was first seen.
    seen: u64,
    /// No frame of the same function below it.
    outermost: bool,
    /// Entered by a call in this chain, and its own instructions so far.
    by_call: bool,
    own: u64,
    /// Its calling context (the path of the frames below it).
    node: ContextIndex,
}

/// One CPU's open segment: its counts so far and its call stack.
#[derive(Debug, Default)]
pub(crate) struct SegmentWalk {
    /// Instructions by function (in order, consecutive ranges of one function summed).
    pub(crate) own: Vec<(u32, u64)>,
    /// Inclusive instructions by function of the frames ended so far.
    pub(crate) inclusive: Vec<(u32, u64)>,
    /// The functions entered by a call.
    pub(crate) calls: Vec<u32>,
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
    /// The last range's last instruction, its kind and function.
    prev: Option<(u64, InsnKind, u32)>,
}

impl SegmentWalk {
    /// The next range: `n` instructions from `start`, in function `f`, the last of kind
    /// `last`; its instructions go to their calling context in `ctx`. Returns the source of the
    /// taken branch that led here and its function, if one did.
    #[inline]
    pub(crate) fn range(&mut self, f: u32, start: u64, n: u32, last: InsnKind, ctx: &mut ExactCounts) -> Option<(u64, u32)> {
        let mut taken = None;
        match self.prev {
            None => self.push(f, self.t, false, ctx),
            Some((from, kind, from_f)) => {
                if start != from.wrapping_add(4) {
                    taken = Some((from, from_f));
                }
                match kind {
                    InsnKind::Call => {
                        self.push(f, self.t, true, ctx);
                        self.calls.push(f);
                        if let Some(fr) = self.stack.last() {
                            ctx.add_context_call(fr.node);
                        }
                    }
                    InsnKind::Return => {
                        if let Some(fr) = self.pop(ctx)
                            && fr.by_call
                        {
                            self.complete.push((fr.f, fr.node, fr.own, self.t - fr.seen));
                        }
                        if self.stack.is_empty() {
                            self.push(f, self.chain_start, false, ctx);
                        } else if self.top() != Some(f) {
                            self.replace(f, ctx);
                        }
                    }
                    _ if self.top() != Some(f) => self.replace(f, ctx),
                    _ => {}
                }
            }
        }
        match self.own.last_mut() {
            Some(o) if o.0 == f => o.1 += u64::from(n),
            _ => self.own.push((f, u64::from(n))),
        }
        self.t += u64::from(n);
        if let Some(fr) = self.stack.last_mut() {
            // its context gets them when the frame ends (`pop`)
            fr.own += u64::from(n);
        }
        self.prev = Some((start.wrapping_add(4 * u64::from(n.max(1) - 1)), last, f));
        taken
    }

    fn top(&self) -> Option<u32> {
        self.stack.last().map(|fr| fr.f)
    }

    #[inline]
    fn push(&mut self, f: u32, seen: u64, by_call: bool, ctx: &mut ExactCounts) {
        if self.stack.len() >= MAX_DEPTH {
            self.break_chain(ctx);
        }
        let node = ctx.context(self.stack.last().map_or(ROOT_CONTEXT, |fr| fr.node), f);
        // A scan, no map: the stack holds the frames seen since the chain began.
        let outermost = !self.stack.iter().any(|fr| fr.f == f);
        self.stack.push(Frame { f, seen, outermost, by_call, own: 0, node });
    }

    #[inline]
    fn pop(&mut self, ctx: &mut ExactCounts) -> Option<Frame> {
        let fr = self.stack.pop()?;
        ctx.add_context(fr.node, fr.own);
        if fr.outermost {
            // Frames seen later than the chain's start begin after every earlier frame of
            // their function ended: nothing of theirs was credited yet.
            let done: u64 = if fr.seen == self.chain_start {
                self.inclusive[self.chain_inclusive..].iter().filter(|e| e.0 == fr.f).map(|e| e.1).sum()
            } else {
                0
            };
            let n = (self.t - fr.seen).saturating_sub(done);
            if n > 0 {
                self.inclusive.push((fr.f, n));
            }
        }
        Some(fr)
    }

    #[inline]
    fn replace(&mut self, f: u32, ctx: &mut ExactCounts) {
        self.pop(ctx);
        self.push(f, self.t, false, ctx);
    }

    /// The chain broke (trace lost): every frame ends here; what follows is seen afresh.
    pub(crate) fn break_chain(&mut self, ctx: &mut ExactCounts) {
        while !self.stack.is_empty() {
            self.pop(ctx);
        }
        self.prev = None;
        self.chain_start = self.t;
        self.chain_inclusive = self.inclusive.len();
    }

    /// The segment ends: every frame ends; the counts are left for the caller to take.
    pub(crate) fn end(&mut self, ctx: &mut ExactCounts) {
        self.break_chain(ctx);
        self.t = 0;
        self.chain_start = 0;
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
        w.end(&mut c);
        assert_eq!(sums(&w.own), [(1, 3), (2, 3), (3, 4), (4, 5)].into());
        assert_eq!(sums(&w.inclusive), [(1, 3), (2, 10), (3, 4), (4, 15)].into());
        assert_eq!(w.calls, [3]);
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
        w.end(&mut c);
        // Consecutive ranges of one function: one entry.
        assert_eq!(w.own, [(1, 7), (2, 4), (1, 2)]);
        // r: every instruction (13) once; t: 4; calls: r, r.
        assert_eq!(sums(&w.inclusive), [(1, 13), (2, 4)].into());
        assert_eq!(w.calls, [1, 1]);
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
        w.end(&mut c);
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
        w.end(&mut c);
        // f1: 2 + 3 before the break, then seen again from the break: 4 + 1.
        assert_eq!(sums(&w.inclusive), [(1, 10), (2, 3), (3, 4)].into());
    }
}
