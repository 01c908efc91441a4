//! Exact instruction counts per function from decoded trace, with confidence.
//!
//! A decoded trace segment (one window's trace, from its trace-on) is the exact path over
//! thousands of instructions: every instruction it executed is counted for the function it
//! lies in, with no skid. The segments are the *sampling unit*: the share of all traced
//! instructions that a function has is the ratio estimator `R = sum_i x_i / sum_i t_i` (x_i its
//! instructions in segment i, t_i the segment's), and its 95% interval `R ± 1.96 sqrt(V)` with
//! the cluster-sampling variance `V = n / (n - 1) · sum_i (x_i - R t_i)^2 / (sum_i t_i)^2`
//! (delta method, `n` segments).
//!
//! Per function also: instructions *inclusive* of its callees inside the segment (the caller
//! reports them: a shadow call stack over the segment's calls and returns), *calls* (entries by
//! a call instruction in the segment), and instructions per call, self and inclusive, from the
//! *complete* calls (entered and returned inside a segment: their counts are exact). A call
//! spanning `L` instructions lies whole inside a segment of `T` with a chance proportional to
//! `T - L + 1`, so each complete call is weighted `w = T / (T - L + 1)` (Horvitz–Thompson:
//! long calls are not under-represented); the mean per call is the ratio estimator
//! `sum_i a_i / sum_i b_i` with `a_i = sum w x` and `b_i = sum w` over the complete calls of
//! segment `i`, its interval from the same cluster variance. Calls longer than a segment are
//! never complete: they have no figure (`None`). The partial calls at a segment's edges are
//! left out on purpose: the trace after a segment's last branch is not decoded, so they are
//! cut unevenly and would bias the mean.
//! Coverage: distinct blocks (decoded ranges, by first instruction) and distinct taken
//! branches (from, to) per function, each set bounded by `max_coverage` entries.
//!
//! Calling contexts: the instructions of each path of the segments' visible call stacks (root
//! first, as the caller's shadow stack sees them), bounded by `max_contexts` nodes (beyond,
//! instructions are counted apart): the instruction-weighted flame graph. Per context also the
//! calls into its innermost function and, from the complete ones, its instructions per call,
//! self and inclusive, by the same estimator as per function (the segments as the sampling
//! unit); at most [`MAX_CALL_CONTEXTS`] contexts keep per-call sums (complete calls in further
//! contexts, or in contexts beyond the node bound, are counted in
//! [`ExactCounts::context_calls_beyond_bound`], still in their function's figures).
//!
//! Memory: a dozen numbers per function seen, a per-segment list of the functions it touched;
//! bounded by `max_functions` (beyond it, instructions go to one `other` bucket, counted).

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

/// A fast hasher for integer keys (addresses, indices): multiply-rotate (FxHash's mix), no
/// protection against adversarial keys, which trace addresses are not.
#[derive(Default, Clone, Copy)]
pub struct IntHasher(u64);

impl Hasher for IntHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }
    #[inline]
    fn write_u64(&mut self, x: u64) {
        self.0 = (self.0.rotate_left(5) ^ x).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
    #[inline]
    fn write_u32(&mut self, x: u32) {
        self.write_u64(u64::from(x));
    }
    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
}

/// A map with [`IntHasher`].
pub type IntMap<K, V> = HashMap<K, V, BuildHasherDefault<IntHasher>>;
type IntSet<K> = HashSet<K, BuildHasherDefault<IntHasher>>;

/// Index of a function in an [`ExactCounts`] (the caller names them).
pub type FunctionIndex = u32;

/// A calling context: a node of the tree of visible call paths.
pub type ContextIndex = u32;

/// The parent of the outermost frames.
pub const ROOT_CONTEXT: ContextIndex = u32::MAX;

/// The context of frames beyond the node bound.
const OVERFLOW_CONTEXT: ContextIndex = u32::MAX - 1;

#[derive(Debug, Clone, Copy, Default)]
struct Acc {
    /// sum x_i, sum x_i^2, sum x_i t_i, segments with x_i > 0.
    x: u64,
    xx: f64,
    xt: f64,
    segments: u64,
    /// Inclusive instructions and calls.
    y: u64,
    c: u64,
    /// Complete calls.
    calls: CallSums,
    /// Distinct blocks and taken branches.
    blocks: u32,
    branches: u32,
}

/// Complete calls over the closed segments: their number; per segment the weighted own (`a`)
/// and inclusive (`ai`) instructions and the weights (`b`): sum a, sum a^2, sum a b, sum ai,
/// sum ai^2, sum ai b, sum b, sum b^2.
#[derive(Debug, Clone, Copy, Default)]
struct CallSums {
    complete: u64,
    a: f64,
    aa: f64,
    ab: f64,
    ai: f64,
    aai: f64,
    aib: f64,
    b: f64,
    bb: f64,
}

impl CallSums {
    /// One segment's complete calls (`k` of them; their sums, [`SegmentCalls`]).
    fn add_segment(&mut self, s: &SegmentCalls) {
        self.complete += s.k;
        self.a += s.a;
        self.aa += s.a * s.a;
        self.ab += s.a * s.b;
        self.ai += s.ai;
        self.aai += s.ai * s.ai;
        self.aib += s.ai * s.b;
        self.b += s.b;
        self.bb += s.b * s.b;
    }

    /// Instructions per call, self and inclusive, over `n` segments.
    fn per_call(&self, n: u64) -> (Option<Ratio>, Option<Ratio>) {
        (Ratio::of(n, self.a, self.aa, self.ab, self.b, self.bb), Ratio::of(n, self.ai, self.aai, self.aib, self.b, self.bb))
    }
}

/// The open segment's complete calls of one function or context: their number, weighted own
/// and inclusive instructions, weights (module docs).
#[derive(Debug, Clone, Copy, Default)]
struct SegmentCalls {
    k: u64,
    a: f64,
    ai: f64,
    b: f64,
}

impl SegmentCalls {
    fn add(&mut self, w: f64, own: u64, inclusive: u64) {
        self.k += 1;
        self.a += w * own as f64;
        self.ai += w * inclusive as f64;
        self.b += w;
    }
}

/// A ratio estimate `sum a_i / sum b_i` over the segments, its standard error and 95% interval.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ratio {
    pub value: f64,
    pub stderr: f64,
    pub ci: (f64, f64),
}

impl Ratio {
    /// From the sums over `n` segments: `a = sum a_i`, `aa = sum a_i^2`, `ab = sum a_i b_i`,
    /// `b = sum b_i`, `bb = sum b_i^2` (`None` when `b` is 0).
    fn of(n: u64, a: f64, aa: f64, ab: f64, b: f64, bb: f64) -> Option<Ratio> {
        if b <= 0.0 {
            return None;
        }
        let r = a / b;
        // sum (a_i - r b_i)^2 = sum a^2 - 2 r sum a b + r^2 sum b^2
        let ss = (aa - 2.0 * r * ab + r * r * bb).max(0.0);
        let nf = n as f64;
        let v = if n > 1 { nf / (nf - 1.0) * ss / (b * b) } else { f64::INFINITY };
        let h = 1.96 * v.sqrt();
        Some(Ratio { value: r, stderr: v.sqrt(), ci: (r - h, r + h) })
    }
}

/// One function's figures.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FunctionCount {
    pub function: FunctionIndex,
    /// Instructions executed in it, over all segments.
    pub instructions: u64,
    /// Segments in which it executed.
    pub segments: u64,
    /// Share of all traced instructions, its standard error and 95% interval.
    pub share: f64,
    pub stderr: f64,
    pub ci: (f64, f64),
    /// Instructions executed while it was on the segment's call stack (module docs).
    pub inclusive: u64,
    /// Entries by a call instruction inside the segments.
    pub calls: u64,
    /// Calls entered and returned inside a segment.
    pub complete_calls: u64,
    /// Instructions per call, self and inclusive (`None` without complete calls).
    pub self_per_call: Option<Ratio>,
    pub inclusive_per_call: Option<Ratio>,
    /// Distinct blocks and taken branches (sources in this function) covered.
    pub blocks: u32,
    pub branches: u32,
}

#[derive(Debug, Clone, Copy)]
struct Cur {
    f: FunctionIndex,
    x: u64,
    y: u64,
    c: u64,
    calls: SegmentCalls,
}

/// One calling context's calls: how many entered its innermost function by a call, and (from
/// the complete ones) its instructions per call ([`ExactCounts::context_calls`]).
#[derive(Debug, Clone, PartialEq)]
pub struct ContextCalls {
    /// The context's path, outermost first (its innermost function is the one called).
    pub path: Vec<FunctionIndex>,
    /// Instructions its innermost function executed in this context.
    pub instructions: u64,
    /// Entries by a call instruction inside the segments, and those also returned inside.
    pub calls: u64,
    pub complete_calls: u64,
    /// Instructions per call, self and inclusive (`None` without complete calls, or when the
    /// context was beyond [`MAX_CALL_CONTEXTS`]).
    pub self_per_call: Option<Ratio>,
    pub inclusive_per_call: Option<Ratio>,
}

/// The counts (module docs).
#[derive(Debug, Clone)]
pub struct ExactCounts {
    acc: Vec<Acc>,
    /// The open segment: functions touched (with their counts so far) and its total.
    cur: Vec<Cur>,
    cur_pos: Vec<u32>,
    cur_t: u64,
    n: u64,
    t: u64,
    tt: f64,
    max_functions: usize,
    /// Instructions of functions beyond `max_functions`.
    pub overflow_instructions: u64,
    blocks: IntSet<u64>,
    branches: IntSet<(u64, u64)>,
    /// A direct-mapped cache of pairs in `branches`.
    branch_cache: Vec<(u64, u64)>,
    max_coverage: usize,
    /// Blocks and branches not recorded: the coverage sets were full.
    pub coverage_overflow: u64,
    /// Context nodes: (parent, function, instructions, calls).
    contexts: Vec<(ContextIndex, FunctionIndex, u64, u64)>,
    context_index: IntMap<(ContextIndex, FunctionIndex), ContextIndex>,
    /// A direct-mapped cache of `context_index` (parent, function, context; nodes are never
    /// removed, so an entry stays true).
    context_cache: Vec<(ContextIndex, FunctionIndex, ContextIndex)>,
    /// Instructions in contexts beyond the node bound.
    pub context_overflow_instructions: u64,
    /// Complete calls per context: over the closed segments, and the open segment's.
    context_sums: IntMap<ContextIndex, CallSums>,
    context_cur: IntMap<ContextIndex, SegmentCalls>,
    /// Complete calls not kept per context: in contexts beyond the node bound or beyond
    /// [`MAX_CALL_CONTEXTS`] (module docs).
    pub context_calls_beyond_bound: u64,
    max_call_contexts: usize,
}

/// Context nodes kept.
const MAX_CONTEXTS: usize = 1 << 18;

/// Contexts that keep per-call sums (~80 bytes each).
pub const MAX_CALL_CONTEXTS: usize = 1 << 16;

const NONE: u32 = u32::MAX;

/// Entries of the context and branch caches (powers of two).
const CONTEXT_CACHE: usize = 1024;
const BRANCH_CACHE: usize = 4096;

/// The cache slot of an integer pair (`bits` bits).
#[inline]
fn slot(a: u64, b: u64, bits: u32) -> usize {
    ((a ^ b.rotate_left(17)).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - bits)) as usize
}

impl ExactCounts {
    /// Counts for at most `max_functions` functions.
    pub fn new(max_functions: usize) -> Self {
        Self::with_coverage(max_functions, 1 << 20)
    }

    /// Counts for at most `max_functions` functions, at most `max_coverage` distinct blocks
    /// and as many distinct branches.
    pub fn with_coverage(max_functions: usize, max_coverage: usize) -> Self {
        ExactCounts {
            acc: Vec::new(),
            cur: Vec::new(),
            cur_pos: Vec::new(),
            cur_t: 0,
            n: 0,
            t: 0,
            tt: 0.0,
            max_functions,
            overflow_instructions: 0,
            blocks: IntSet::default(),
            branches: IntSet::default(),
            // (instructions are aligned: no branch is from u64::MAX)
            branch_cache: vec![(u64::MAX, u64::MAX); BRANCH_CACHE],
            max_coverage,
            coverage_overflow: 0,
            contexts: Vec::new(),
            context_index: IntMap::default(),
            // empty: the overflow context's child of function 0 (the overflow context)
            context_cache: vec![(OVERFLOW_CONTEXT, 0, OVERFLOW_CONTEXT); CONTEXT_CACHE],
            context_overflow_instructions: 0,
            context_sums: IntMap::default(),
            context_cur: IntMap::default(),
            context_calls_beyond_bound: 0,
            max_call_contexts: MAX_CALL_CONTEXTS,
        }
    }

    /// At most `n` contexts keep per-call sums (default [`MAX_CALL_CONTEXTS`]).
    pub fn with_call_context_bound(mut self, n: usize) -> Self {
        self.max_call_contexts = n;
        self
    }

    /// The context of a frame of `f` called from context `parent` ([`ROOT_CONTEXT`]: none).
    #[inline]
    pub fn context(&mut self, parent: ContextIndex, f: FunctionIndex) -> ContextIndex {
        let e = self.context_cache[Self::context_slot(parent, f)];
        // (an empty entry's parent is the overflow context, and so is its answer: right)
        if e.0 == parent && e.1 == f {
            return e.2;
        }
        self.context_miss(parent, f)
    }

    #[inline]
    fn context_slot(parent: ContextIndex, f: FunctionIndex) -> usize {
        slot(u64::from(parent), u64::from(f), CONTEXT_CACHE.trailing_zeros())
    }

    #[cold]
    #[inline(never)]
    fn context_miss(&mut self, parent: ContextIndex, f: FunctionIndex) -> ContextIndex {
        if parent == OVERFLOW_CONTEXT {
            return OVERFLOW_CONTEXT;
        }
        let c = match self.context_index.get(&(parent, f)) {
            Some(&c) => c,
            None if self.contexts.len() >= MAX_CONTEXTS => return OVERFLOW_CONTEXT,
            None => {
                let c = self.contexts.len() as ContextIndex;
                self.contexts.push((parent, f, 0, 0));
                self.context_index.insert((parent, f), c);
                c
            }
        };
        self.context_cache[Self::context_slot(parent, f)] = (parent, f, c);
        c
    }

    /// `n` instructions executed in context `c` (by its innermost function).
    #[inline]
    pub fn add_context(&mut self, c: ContextIndex, n: u64) {
        match self.contexts.get_mut(c as usize) {
            Some(node) => node.2 += n,
            None => self.context_overflow_instructions += n,
        }
    }

    /// A call entered context `c`'s innermost function.
    #[inline]
    pub fn add_context_call(&mut self, c: ContextIndex) {
        if let Some(node) = self.contexts.get_mut(c as usize) {
            node.3 += 1;
        }
    }

    /// The path of context `c`, outermost first.
    fn path(&self, c: ContextIndex) -> Vec<FunctionIndex> {
        let mut path = Vec::new();
        let mut at = c;
        while let Some(&(p, g, _, _)) = self.contexts.get(at as usize) {
            path.push(g);
            at = p;
        }
        path.reverse();
        path
    }

    /// The contexts entered by a call: their path, instructions, calls and instructions per
    /// call (module docs), most calls first.
    pub fn context_calls(&self) -> Vec<ContextCalls> {
        let mut v: Vec<ContextCalls> = (0..self.contexts.len() as ContextIndex)
            .filter(|&c| self.contexts[c as usize].3 > 0 || self.context_sums.contains_key(&c))
            .map(|c| {
                let s = self.context_sums.get(&c).copied().unwrap_or_default();
                let (self_per_call, inclusive_per_call) = s.per_call(self.n);
                ContextCalls {
                    path: self.path(c),
                    instructions: self.contexts[c as usize].2,
                    calls: self.contexts[c as usize].3,
                    complete_calls: s.complete,
                    self_per_call,
                    inclusive_per_call,
                }
            })
            .collect();
        v.sort_by(|a, b| b.calls.cmp(&a.calls).then_with(|| a.path.cmp(&b.path)));
        v
    }

    /// The contexts with instructions: their path (outermost first) and instructions.
    pub fn context_paths(&self) -> Vec<(Vec<FunctionIndex>, u64)> {
        self.contexts
            .iter()
            .enumerate()
            .filter(|(_, node)| node.2 > 0)
            .map(|(c, node)| (self.path(c as ContextIndex), node.2))
            .collect()
    }

    /// The open segment's entry of `f` (`None` beyond the bound).
    #[inline]
    fn cur(&mut self, f: FunctionIndex) -> Option<&mut Cur> {
        // (`cur_pos` never reaches beyond the bound)
        let p = match self.cur_pos.get(f as usize) {
            Some(&p) if p != NONE => p as usize,
            _ => self.cur_new(f)?,
        };
        Some(&mut self.cur[p])
    }

    /// [`cur`](Self::cur) of a function not in the open segment yet: its new entry.
    #[cold]
    #[inline(never)]
    fn cur_new(&mut self, f: FunctionIndex) -> Option<usize> {
        let i = f as usize;
        if i >= self.max_functions {
            return None;
        }
        if i >= self.cur_pos.len() {
            self.cur_pos.resize(i + 1, NONE);
        }
        self.cur_pos[i] = self.cur.len() as u32;
        self.cur.push(Cur { f, x: 0, y: 0, c: 0, calls: SegmentCalls::default() });
        Some(self.cur.len() - 1)
    }

    /// Adds `n` instructions of function `f` to the open segment.
    #[inline]
    pub fn add(&mut self, f: FunctionIndex, n: u64) {
        self.cur_t += n;
        match self.cur(f) {
            Some(c) => c.x += n,
            None => self.overflow_instructions += n,
        }
    }

    /// Adds `n` instructions executed while `f` was on the call stack to the open segment.
    #[inline]
    pub fn add_inclusive(&mut self, f: FunctionIndex, n: u64) {
        if let Some(c) = self.cur(f) {
            c.y += n;
        }
    }

    /// A call of `f` began in the open segment.
    #[inline]
    pub fn add_call(&mut self, f: FunctionIndex) {
        self.add_calls(f, 1);
    }

    /// `n` calls of `f` began in the open segment.
    #[inline]
    pub fn add_calls(&mut self, f: FunctionIndex, n: u64) {
        if let Some(c) = self.cur(f) {
            c.c += n;
        }
    }

    /// A call of `f` in context `ctx` (whose innermost function is `f`) entered and returned in
    /// the open segment, which has `segment` instructions in all: its own and its inclusive
    /// instructions (module docs).
    #[inline]
    pub fn add_complete_call(&mut self, f: FunctionIndex, ctx: ContextIndex, own: u64, inclusive: u64, segment: u64) {
        let w = segment as f64 / (segment as f64 - inclusive as f64 + 1.0).max(1.0);
        if let Some(c) = self.cur(f) {
            c.calls.add(w, own, inclusive);
        }
        let kept = (ctx as usize) < self.contexts.len()
            && (self.context_cur.contains_key(&ctx)
                || self.context_sums.contains_key(&ctx)
                || self.context_sums.len() + self.context_cur.len() < self.max_call_contexts);
        if kept {
            self.context_cur.entry(ctx).or_default().add(w, own, inclusive);
        } else {
            self.context_calls_beyond_bound += 1;
        }
    }

    fn acc(&mut self, f: FunctionIndex) -> Option<&mut Acc> {
        let i = f as usize;
        if i >= self.max_functions {
            return None;
        }
        if i >= self.acc.len() {
            self.acc.resize(i + 1, Acc::default());
        }
        Some(&mut self.acc[i])
    }

    /// A block of `f` (decoded range) starting at `addr` ran: counted once per address.
    pub fn block(&mut self, f: FunctionIndex, addr: u64) {
        if self.blocks.len() >= self.max_coverage {
            if !self.blocks.contains(&addr) {
                self.coverage_overflow += 1;
            }
            return;
        }
        if !self.blocks.insert(addr) {
            return;
        }
        if let Some(a) = self.acc(f) {
            a.blocks += 1;
        }
    }

    /// A taken branch from `from` (in `f`) to `to`: counted once per pair.
    pub fn branch(&mut self, f: FunctionIndex, from: u64, to: u64) {
        let i = slot(from, to, BRANCH_CACHE.trailing_zeros());
        if self.branch_cache[i] == (from, to) {
            return;
        }
        if self.branches.len() >= self.max_coverage {
            if !self.branches.contains(&(from, to)) {
                self.coverage_overflow += 1;
            }
            return;
        }
        self.branch_cache[i] = (from, to);
        if !self.branches.insert((from, to)) {
            return;
        }
        if let Some(a) = self.acc(f) {
            a.branches += 1;
        }
    }

    /// Distinct blocks and taken branches covered.
    pub fn coverage(&self) -> (usize, usize) {
        (self.blocks.len(), self.branches.len())
    }

    /// Closes the open segment (a no-op if it counted nothing).
    pub fn end_segment(&mut self) {
        if self.cur_t == 0 && self.cur.is_empty() {
            return;
        }
        let t = self.cur_t as f64;
        let cur = std::mem::take(&mut self.cur);
        for k in &cur {
            self.cur_pos[k.f as usize] = NONE;
            let a = self.acc(k.f).expect("bounded in cur");
            let x = k.x as f64;
            a.x += k.x;
            a.xx += x * x;
            a.xt += x * t;
            a.segments += u64::from(k.x > 0);
            a.y += k.y;
            a.c += k.c;
            a.calls.add_segment(&k.calls);
        }
        self.cur = cur;
        self.cur.clear();
        for (c, k) in self.context_cur.drain() {
            self.context_sums.entry(c).or_default().add_segment(&k);
        }
        if self.cur_t == 0 {
            return;
        }
        self.n += 1;
        self.t += self.cur_t;
        self.tt += t * t;
        self.cur_t = 0;
    }

    /// Segments closed.
    pub fn segments(&self) -> u64 {
        self.n
    }

    /// Instructions in closed segments.
    pub fn instructions(&self) -> u64 {
        self.t
    }

    /// How many functions have instructions (without building [`functions`](Self::functions)).
    pub fn functions_seen(&self) -> usize {
        self.acc.iter().filter(|a| a.x > 0).count()
    }

    /// Functions with instructions, most instructions first.
    pub fn functions(&self) -> Vec<FunctionCount> {
        let t = self.t as f64;
        let mut v: Vec<FunctionCount> = self
            .acc
            .iter()
            .enumerate()
            .filter(|(_, a)| a.x > 0)
            .map(|(i, a)| {
                let share = Ratio::of(self.n, a.x as f64, a.xx, a.xt, t, self.tt).expect("instructions counted");
                let (self_per_call, inclusive_per_call) = a.calls.per_call(self.n);
                FunctionCount {
                    function: i as FunctionIndex,
                    instructions: a.x,
                    segments: a.segments,
                    share: share.value,
                    stderr: share.stderr,
                    ci: (share.ci.0.max(0.0), share.ci.1.min(1.0)),
                    inclusive: a.y,
                    calls: a.c,
                    complete_calls: a.calls.complete,
                    self_per_call,
                    inclusive_per_call,
                    blocks: a.blocks,
                    branches: a.branches,
                }
            })
            .collect();
        v.sort_by(|a, b| b.instructions.cmp(&a.instructions).then(a.function.cmp(&b.function)));
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The context and branch caches in front of the maps: many more pairs than cache slots,
    /// revisited in a scrambled order, get the indices and counts a plain map gives (contexts
    /// numbered in order of first use, each distinct branch counted once, the coverage bound
    /// counting each unrecorded pair on every visit).
    #[test]
    fn cached_lookups_agree_with_maps() {
        let mut c = ExactCounts::with_coverage(64, 3000);
        let mut ids: HashMap<(ContextIndex, FunctionIndex), ContextIndex> = HashMap::new();
        let mut seen: HashSet<(u64, u64)> = HashSet::new();
        let (mut x, mut overflow, mut per_f) = (1u64, 0u64, [0u32; 64]);
        for _ in 0..40_000 {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            let parent = match (x >> 60) as u32 {
                0 => ROOT_CONTEXT,
                p => (p * 97 + (x >> 40) as u32 % 50) % ids.len().max(1) as u32,
            };
            let f = (x >> 20) as u32 % 64;
            let next = ids.len() as ContextIndex;
            let want = if parent != ROOT_CONTEXT && parent >= next { continue } else { *ids.entry((parent, f)).or_insert(next) };
            assert_eq!(c.context(parent, f), want);
            let (from, to) = (4 * ((x >> 8) % 4000), 4 * ((x >> 30) % 2));
            if seen.len() < 3000 {
                if seen.insert((from, to)) {
                    per_f[f as usize] += 1;
                }
            } else if !seen.contains(&(from, to)) {
                overflow += 1;
            }
            c.branch(f, from, to);
        }
        assert!(ids.len() > 4 * CONTEXT_CACHE && seen.len() == 3000 && overflow > 0);
        assert_eq!(c.coverage().1, seen.len());
        assert_eq!(c.coverage_overflow, overflow);
        for f in 0..64u32 {
            c.add(f, 1);
        }
        c.end_segment();
        for k in c.functions() {
            assert_eq!(k.branches, per_f[k.function as usize]);
        }
    }

    /// Exact sums; the interval by hand for three segments:
    /// f: x = (10, 0, 30), t = (100, 100, 100): R = 40/300; residuals (10-13.33, -13.33,
    /// 30-13.33) -> ss = 11.11 + 177.78 + 277.78 = 466.67; V = 3/2 * 466.67 / 90000.
    #[test]
    fn ratio_estimator() {
        let mut c = ExactCounts::new(10);
        for (x, rest) in [(10, 90), (0, 100), (30, 70)] {
            if x > 0 {
                c.add(1, x);
            }
            c.add(2, rest / 2);
            c.add(2, rest - rest / 2);
            c.end_segment();
        }
        c.end_segment(); // empty: no segment
        assert_eq!((c.segments(), c.instructions()), (3, 300));
        let fs = c.functions();
        assert_eq!(fs.iter().map(|f| (f.function, f.instructions, f.segments)).collect::<Vec<_>>(), [(2, 260, 3), (1, 40, 2)]);
        let f = fs[1];
        let v: f64 = 1.5 * 466.666_666_7 / 90_000.0;
        assert!((f.share - 40.0 / 300.0).abs() < 1e-12);
        assert!((f.ci.1 - (40.0 / 300.0 + 1.96 * v.sqrt())).abs() < 1e-9, "{f:?}");
        // The two functions' shares add up to 1, intervals of the same width.
        assert!((fs[0].share + fs[1].share - 1.0).abs() < 1e-12);
        assert!(((fs[0].ci.1 - fs[0].ci.0) - (f.ci.1 - f.ci.0)).abs() < 1e-9);
        assert_eq!((f.calls, f.self_per_call), (0, None));
    }

    /// Instructions per call by hand. Segments of 100 instructions; f's complete calls
    /// (own, inclusive): segment 1 (10, 20) and (10, 10), segment 2 (21, 51), segment 3 none
    /// (only calls it saw begin). Weights 100/81, 100/91, 100/50 (2). Self: a = (1000/81 +
    /// 1000/91, 42, 0), b = (100/81 + 100/91, 2, 0).
    #[test]
    fn per_call() {
        let mut c = ExactCounts::new(10);
        for (calls, seg) in [(&[(10, 20), (10, 10)][..], 2), (&[(21, 51)][..], 1), (&[][..], 3)] {
            c.add(1, 40);
            c.add_inclusive(1, 60);
            for _ in 0..seg {
                c.add_call(1);
            }
            for &(own, incl) in calls {
                c.add_complete_call(1, ROOT_CONTEXT, own, incl, 100);
            }
            c.add(2, 60);
            c.end_segment();
        }
        let f = *c.functions().iter().find(|f| f.function == 1).unwrap();
        assert_eq!((f.instructions, f.inclusive, f.calls, f.complete_calls), (120, 180, 6, 3));
        let (w1, w2, w3): (f64, f64, f64) = (100.0 / 81.0, 100.0 / 91.0, 2.0);
        let (a, b): ([f64; 3], [f64; 3]) = ([10.0 * (w1 + w2), 21.0 * w3, 0.0], [w1 + w2, w3, 0.0]);
        let r = (a[0] + a[1]) / (b[0] + b[1]);
        let ss: f64 = (0..3).map(|i| (a[i] - r * b[i]).powi(2)).sum();
        let s = f.self_per_call.unwrap();
        assert!((s.value - r).abs() < 1e-12, "{s:?}");
        assert!((s.stderr - (1.5f64 * ss).sqrt() / (b[0] + b[1])).abs() < 1e-12, "{s:?}");
        let i = f.inclusive_per_call.unwrap();
        let ri = (20.0 * w1 + 10.0 * w2 + 51.0 * w3) / (b[0] + b[1]);
        assert!((i.value - ri).abs() < 1e-12, "{i:?}");
        // A function whose calls never completed has no figure.
        assert_eq!(c.functions().iter().find(|f| f.function == 2).unwrap().self_per_call, None);
    }

    /// Coverage: distinct addresses once, bounded.
    #[test]
    fn coverage_distinct_and_bounded() {
        let mut c = ExactCounts::with_coverage(10, 2);
        c.block(1, 0x100);
        c.block(1, 0x100);
        c.block(2, 0x200);
        c.block(2, 0x300);
        c.branch(1, 0x10c, 0x200);
        c.branch(1, 0x10c, 0x200);
        c.add(1, 4);
        c.add(2, 4);
        c.end_segment();
        assert_eq!((c.coverage(), c.coverage_overflow), ((2, 1), 1));
        let fs = c.functions();
        let by = |f| fs.iter().find(|x| x.function == f).map(|x| (x.blocks, x.branches)).unwrap();
        assert_eq!((by(1), by(2)), ((1, 1), (1, 0)));
    }

    /// Contexts: paths outermost first, instructions by innermost function.
    #[test]
    fn context_paths() {
        let mut c = ExactCounts::new(10);
        let m = c.context(ROOT_CONTEXT, 0);
        let f = c.context(m, 1);
        assert_eq!(c.context(m, 1), f);
        let g = c.context(f, 2);
        c.add_context(m, 3);
        c.add_context(g, 4);
        c.add_context(m, 1);
        let mut p = c.context_paths();
        p.sort();
        assert_eq!(p, [(vec![0], 4), (vec![0, 1, 2], 4)]);
    }

    /// Per context: the same estimator as per function over the calls of that context alone
    /// (a second count fed only them), calls per context; beyond the bound of call contexts
    /// the complete calls are counted apart and still in their function's figures.
    #[test]
    fn per_call_by_context() {
        // f called from m (context mf) and from n (nf); segments of 100 instructions with
        // complete calls (context, own, inclusive).
        let segs: [&[(bool, u64, u64)]; 3] =
            [&[(true, 10, 12), (false, 30, 30)], &[(true, 14, 20), (true, 6, 6)], &[(false, 31, 40)]];
        let mut c = ExactCounts::new(10).with_call_context_bound(2);
        let m = c.context(ROOT_CONTEXT, 0);
        let n = c.context(ROOT_CONTEXT, 2);
        let (mf, nf) = (c.context(m, 1), c.context(n, 1));
        let o = c.context(ROOT_CONTEXT, 3);
        let other = c.context(o, 1);
        let (mut om, mut on) = (ExactCounts::new(10), ExactCounts::new(10));
        for s in segs {
            for e in [&mut c, &mut om, &mut on] {
                e.add(0, 99);
                e.add(1, 1);
            }
            for &(from_m, own, incl) in s {
                let ctx = if from_m { mf } else { nf };
                c.add_context_call(ctx);
                c.add_complete_call(1, ctx, own, incl, 100);
                if from_m { &mut om } else { &mut on }.add_complete_call(1, ROOT_CONTEXT, own, incl, 100);
            }
            c.add_complete_call(1, other, 5, 5, 100); // a third context: beyond the bound of 2
            for e in [&mut c, &mut om, &mut on] {
                e.end_segment();
            }
        }
        assert_eq!(c.context_calls_beyond_bound, 3);
        let cc = c.context_calls();
        assert_eq!(
            cc.iter().map(|x| (x.path.clone(), x.calls, x.complete_calls)).collect::<Vec<_>>(),
            [(vec![0, 1], 3, 3), (vec![2, 1], 2, 2)]
        );
        for (x, o) in cc.iter().zip([&om, &on]) {
            let f = o.functions().into_iter().find(|f| f.function == 1).unwrap();
            assert_eq!((x.self_per_call, x.inclusive_per_call), (f.self_per_call, f.inclusive_per_call));
            assert!(x.self_per_call.unwrap().stderr > 0.0);
        }
        // The function's own figure holds all its complete calls, the third context's too.
        assert_eq!(c.functions().iter().find(|f| f.function == 1).unwrap().complete_calls, 8);
    }

    /// Beyond the bound, instructions are counted apart, still in the totals.
    #[test]
    fn bounded() {
        let mut c = ExactCounts::new(2);
        c.add(0, 5);
        c.add(7, 3);
        c.end_segment();
        assert_eq!((c.instructions(), c.overflow_instructions, c.functions().len()), (8, 3, 1));
    }
}
