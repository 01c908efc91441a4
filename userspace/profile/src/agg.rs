//! One binary's counters, aggregated online: what llvm-profgen computes from the samples at
//! profile-generation time, kept per calling context instead of per sample, so that memory
//! grows with code and contexts, not with samples or run time.
//!
//! # What llvm-profgen computes from a hybrid sample
//!
//! (`PerfReader.cpp`; all addresses are the binary's link-time addresses, anything else is
//! [`EXTERNAL_ADDR`].)
//!
//! * `extractCallstack`: frames that are not code become one external frame (consecutive
//!   ones merged, a trailing one dropped), return addresses become the call before them
//!   (`getCallAddrFromFrameAddr`), and the stack ends at a return address after no call. The
//!   sample is dropped if its leaf lies in a prolog or epilog.
//! * `extractLBRStack`: branch ends that are not code become [`EXTERNAL_ADDR`]; a branch with
//!   both ends external is removed. The leaf becomes the newest branch's target.
//! * Context-free (`computeCounterFromLBR`, or `--ignore-stack-samples`): each branch counts
//!   when its target is code, and the fall-through from each branch's target to the next newer
//!   branch's source counts when it is a valid range (both ends code, start <= end, no call,
//!   return or direct jump inside).
//! * Context-sensitive (`VirtualUnwinder`): walking the branches newest first, the range before
//!   branch `i` (from its target to branch `i-1`'s source) is recorded in the current frame,
//!   split where the inline context changes; then a call pops a frame (if the parent frame is
//!   the call site), a return pushes the frame of the call before its target, other branches
//!   stay in the frame; an invalid range makes every later branch start a fresh stack. A
//!   branch is recorded in the frame it lands in, or on the trie root when its source is
//!   external. Each frame's counters go to the context of its address stack, cut below the
//!   last external frame.
//!
//! # What is kept
//!
//! The frame a counter lands in has the counter's own start as its address (a range's start,
//! a branch's source): `switchToFrame` puts it there before recording. So a counter's
//! context is *the stack of its parent frames* plus its own start, and the parent stack only
//! changes at calls and returns, never by the inline splitting of a range. Hence:
//!
//! * a *tuple* is one branch with the target of the branch before it: `(start, src, dst)`,
//!   `start` the older branch's target ([`NO_START`] for the oldest). It carries both the
//!   branch `src -> dst` and the range `start .. src` that ends at that branch, and its facts
//!   (source a call or return, the call before its target, the range valid or not), computed
//!   once when the tuple is first seen;
//! * a *context* is a parent-frame address stack (root first, cut below external frames),
//!   interned in a trie; id 0 is the empty stack;
//! * the counts are per (context, tuple). Walking a sample updates one count per branch: the
//!   range ending at branch `i` and branch `i` itself are recorded in the same parent stack
//!   (the one after branch `i` is unwound).
//!
//! At dump time a count expands to llvm-profgen's counters: the range split by inline context
//! (each piece in the context `parents + [piece start]`), the branch in `parents + [src]` (on
//! the root when `src` is external). That needs DWARF and is done by the writer; splitting is
//! a function of the range alone, so it commutes with summing the counts. The context-free
//! counters are the sums over contexts; BOLT's (`perf2bolt -pa`) read the same tuples with
//! the binary's own view (addresses of other binaries external, nothing else mapped).
//!
//! A sample some of whose branch ends are in the binary but are not code (PLT stubs, code
//! outside function symbols) gives BOLT and llvm-profgen different branch lists; its tuples
//! are then counted twice, once per list, each marked for its reader ([`Class`]). So are the
//! samples llvm-profgen drops (leaf in a prolog or epilog): BOLT still counts them.

use std::sync::Arc;

use hashbrown::HashTable;

use crate::facts::{CodeFacts, EXTERNAL_ADDR};
use crate::store::ADDR_MASK;

/// [`Tuple::start`] of the oldest branch of a sample: no older branch.
pub const NO_START: u64 = u64::MAX;

const SRC_CALL: u8 = 1;
const SRC_RET: u8 = 2;
/// Both branch ends are external or code: llvm-profgen's list equals BOLT's.
const CLEAN: u8 = 4;
const RANGE_VALID: u8 = 8;
const RANGE_INVALID: u8 = 16;

/// A branch with the target of the branch before it (module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tuple {
    /// Target of the next older branch of the sample, or [`NO_START`].
    pub start: u64,
    /// Branch source.
    pub src: u64,
    /// Branch target.
    pub dst: u64,
    /// `getCallAddrFromFrameAddr(dst)`.
    ret_call: u64,
    flags: u8,
    /// The count this tuple was last counted in: (class | context) and its index.
    memo_hi: u32,
    memo_idx: u32,
}

impl Tuple {
    /// The fall-through range `start ..= src` if llvm-profgen records it (both ends code,
    /// `start <= src`, no call, return or direct jump inside).
    pub fn range(&self) -> Option<(u64, u64)> {
        (self.flags & RANGE_VALID != 0).then_some((self.start, self.src))
    }
    /// The branch if llvm-profgen records it (its target is code).
    pub fn branch(&self) -> Option<(u64, u64)> {
        (self.dst != EXTERNAL_ADDR).then_some((self.src, self.dst))
    }
}

/// Who reads a count (module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    /// llvm-profgen (context-sensitive and context-free) and BOLT.
    All,
    /// llvm-profgen only (the branch list differs from BOLT's).
    Llvm,
    /// BOLT only (llvm-profgen drops the sample, or its branch list differs).
    Bolt,
    /// A branch-only sample whose IP lies in a prolog or epilog: llvm-profgen drops it when it
    /// reads it as a hybrid sample (the binary has hybrid samples), keeps it context-free
    /// otherwise; not BOLT (its BOLT tuples are counted as [`Class::Bolt`]).
    BranchOnlyProlog,
}

const CLASS_SHIFT: u32 = 30;
const CTX_MASK: u32 = (1 << CLASS_SHIFT) - 1;

fn class_bits(c: Class) -> u32 {
    (match c {
        Class::All => 0,
        Class::Llvm => 1,
        Class::Bolt => 2,
        Class::BranchOnlyProlog => 3,
    }) << CLASS_SHIFT
}

fn class_of(bits: u32) -> Class {
    match bits >> CLASS_SHIFT {
        0 => Class::All,
        1 => Class::Llvm,
        2 => Class::Bolt,
        _ => Class::BranchOnlyProlog,
    }
}

/// One count: a tuple seen `count` times in a context by one class of reader.
#[derive(Clone, Copy, Debug)]
pub struct Counted<'a> {
    /// The tuple.
    pub tuple: &'a Tuple,
    /// Times seen.
    pub count: u64,
    /// Its readers.
    pub class: Class,
    /// The parent-frame context (for [`Class::All`] and [`Class::Llvm`]; 0 otherwise).
    pub context: u32,
}

impl Counted<'_> {
    /// Counted by BOLT.
    pub fn in_bolt(&self) -> bool {
        matches!(self.class, Class::All | Class::Bolt)
    }
    /// Counted by llvm-profgen's context-free profile, given whether the binary has hybrid
    /// samples ([`BinaryAgg::has_hybrid`]).
    pub fn in_context_free(&self, has_hybrid: bool) -> bool {
        match self.class {
            Class::All | Class::Llvm => true,
            Class::Bolt => false,
            Class::BranchOnlyProlog => !has_hybrid,
        }
    }
    /// The context of the context-sensitive profile, if it is counted there.
    pub fn cs_context(&self) -> Option<u32> {
        matches!(self.class, Class::All | Class::Llvm).then_some(self.context)
    }
}

/// Bytes the aggregation accounts per tuple, context and count (entry and index).
const TUPLE_BYTES: usize = std::mem::size_of::<Tuple>() + 5;
const NODE_BYTES: usize = 16 + 5;
const COUNT_BYTES: usize = 16 + 5;
const FRAME_BYTES: usize = 16 + 1;

/// What an [`BinaryAgg::add`] may still take (bytes). Contexts and the counts in them take
/// at most three quarters of the budget ([`Budget::contexts`]): the rest is kept for what the
/// context-free and BOLT counters need (tuples, and each tuple's count in the empty context),
/// which may take the whole budget and an eighth more ([`Budget::reserve`]).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Budget {
    /// Bytes the rest of the profile holds.
    pub others: usize,
    /// The aggregation's budget ([`crate::ProfileLimits::max_bytes`]).
    pub max: usize,
}

impl Budget {
    /// The bound of contexts and of counts in a context.
    fn contexts(&self) -> usize {
        self.max / 4 * 3
    }
    /// The bound of tuples and of counts in the empty context.
    fn reserve(&self) -> usize {
        self.max + self.max / 8
    }
}

/// Counters of the aggregation's budget policy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AggStats {
    /// Samples not aggregated: a new branch tuple did not fit past the budget's reserve.
    pub samples_dropped: u64,
    /// Counts of a new (context, tuple) past the budget, counted in the empty context
    /// instead (the context-sensitive profile loses their context; the context-free and
    /// BOLT counters stay exact).
    pub counts_folded: u64,
    /// Counts dropped past the budget's reserve.
    pub counts_dropped: u64,
    /// New contexts past the budget, taken as the empty context.
    pub contexts_folded: u64,
}

/// A sample's branches (newest first) as one binary sees them.
pub(crate) trait Pairs {
    /// Number of branches.
    fn len(&self) -> usize;
    /// Branch `i`: its ends as the binary's link-time addresses or [`EXTERNAL_ADDR`].
    fn pair(&self, i: usize) -> (u64, u64);
    /// Whether [`pair`](Self::pair) of branch `i` is right: for [`InSpan`], both its ends lie
    /// in the span.
    fn in_view(&self, _i: usize) -> bool {
        true
    }
}

/// Encoded branch words (from, to; tagged), the binary's tag.
pub(crate) struct Words<'a> {
    pub words: &'a [u64],
    pub tag: u64,
}

impl Pairs for Words<'_> {
    #[inline(always)]
    fn len(&self) -> usize {
        self.words.len() / 2
    }
    #[inline(always)]
    fn pair(&self, i: usize) -> (u64, u64) {
        let p = |w: u64| {
            let x = w ^ self.tag;
            if x <= ADDR_MASK { x } else { EXTERNAL_ADDR }
        };
        (p(self.words[2 * i]), p(self.words[2 * i + 1]))
    }
}

/// Runtime branches whose ends lie in one span of the binary (`lo .. lo + len`): link =
/// runtime + `off`. A walk over them finds out whether they all do ([`Walk::OutOfView`]).
pub(crate) struct InSpan<'a> {
    pub branches: &'a [crate::Branch],
    pub off: u64,
    pub lo: u64,
    pub len: u64,
}

impl Pairs for InSpan<'_> {
    #[inline(always)]
    fn len(&self) -> usize {
        self.branches.len()
    }
    #[inline(always)]
    fn pair(&self, i: usize) -> (u64, u64) {
        let b = self.branches[i];
        (b.from.wrapping_add(self.off), b.to.wrapping_add(self.off))
    }
    #[inline(always)]
    fn in_view(&self, i: usize) -> bool {
        let b = self.branches[i];
        b.from.wrapping_sub(self.lo) < self.len && b.to.wrapping_sub(self.lo) < self.len
    }
}

/// How [`BinaryAgg::walk`] ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Walk {
    /// No branch in the binary's view.
    Empty,
    /// This many tuples counted (0: the sample did not fit the budget).
    Done(usize),
    /// A branch end in the binary is not code (nothing is left counted).
    Unclean,
    /// A branch end is not where the [`Pairs`] said (nothing is left counted).
    OutOfView,
}

/// Reused per-sample buffers.
#[derive(Clone, Debug, Default)]
pub(crate) struct Scratch {
    /// The previous walk's parent stack (root first) and its contexts, reused from the root
    /// for the next sample whose stack shares them.
    prev_tail: Vec<u64>,
    prev_chain: Vec<(u64, u32)>,
    prev_agg: usize,
    /// The previous sample's callers (raw words, in the binary `tail_agg` tagged `tail_tag`)
    /// and their canonical part (as after a code leaf).
    raw_tail: Vec<u64>,
    tail_canon: Vec<u64>,
    tail_agg: usize,
    tail_tag: u64,
    ids: Vec<u32>,
    ids2: Vec<u32>,
    stack: Vec<u64>,
    chain: Vec<(u64, u32)>,
}

#[inline(always)]
fn fold_mul(a: u64, b: u64) -> u64 {
    let m = (a as u128).wrapping_mul(b as u128);
    (m as u64) ^ ((m >> 64) as u64)
}

const K0: u64 = 0x243f_6a88_85a3_08d3;
const K1: u64 = 0x1319_8a2e_0370_7344;
const K2: u64 = 0xa409_3822_299f_31d0;

#[inline(always)]
fn hash_tuple(start: u64, src: u64, dst: u64) -> u64 {
    fold_mul(fold_mul(src ^ K0, dst ^ K1) ^ start, K2)
}

#[inline(always)]
fn hash_u64(k: u64) -> u64 {
    fold_mul(k ^ K0, K1)
}

#[inline(always)]
fn hash_node(parent: u32, addr: u64) -> u64 {
    fold_mul(addr ^ K2, u64::from(parent) ^ K1)
}

/// Frame facts cached per address: bit 62 code (an instruction, not external), bit 61 in a
/// prolog/epilog, low 48 bits the call before it.
const FRAME_CODE: u64 = 1 << 62;
const FRAME_PROLOG: u64 = 1 << 61;

/// A tuple cache slot: (start, src, dst), the tuple's id and flags. An empty slot has a
/// start no tuple has.
#[derive(Clone, Copy, Debug)]
struct TSlot {
    start: u64,
    src: u64,
    dst: u64,
    id: u32,
    flags: u8,
}

const EMPTY_TSLOT: TSlot = TSlot { start: u64::MAX - 1, src: 0, dst: 0, id: 0, flags: 0 };

/// A context cache slot: (parent, address) and the context's id (`u32::MAX`: empty).
#[derive(Clone, Copy, Debug)]
struct NSlot {
    addr: u64,
    parent: u32,
    id: u32,
}

const EMPTY_NSLOT: NSlot = NSlot { addr: 0, parent: 0, id: u32::MAX };

/// A step cache slot: a tuple (by its ends) met in a context, the context after unwinding its
/// branch and the index of its count there ([`BinaryAgg::walk_fast`]).
#[derive(Clone, Copy, Debug)]
struct SSlot {
    start: u64,
    src: u64,
    dst: u64,
    /// The context before (with [`INVALID_CTX`] once the walk is invalid).
    before: u32,
    /// `before` of the next (older) step: the context after this branch is unwound, or
    /// [`INVALID_CTX`] when this tuple's range is invalid or the walk already was.
    next: u32,
    /// Index of the tuple's count in the context after (`u32::MAX`: none, past the budget).
    count: u32,
}

const EMPTY_SSLOT: SSlot = SSlot { start: u64::MAX - 1, src: 0, dst: 0, before: 0, next: 0, count: 0 };
/// [`SSlot::before`] of a walk made invalid by an invalid range (every context is then 0).
const INVALID_CTX: u32 = u32::MAX;
const SCACHE_BITS: u32 = 12;

#[inline(always)]
fn sslot(before: u32, start: u64, src: u64, dst: u64) -> usize {
    (((src ^ dst.rotate_left(21) ^ start.rotate_left(42) ^ u64::from(before).rotate_left(11)).wrapping_mul(0x9e37_79b9_7f4a_7c15)
        >> (64 - SCACHE_BITS)) as usize)
        & ((1 << SCACHE_BITS) - 1)
}

const TCACHE_BITS: u32 = 11;
const FCACHE_BITS: u32 = 10;
const NCACHE_BITS: u32 = 10;

#[inline(always)]
fn tslot(start: u64, src: u64, dst: u64) -> usize {
    ((src ^ dst.rotate_left(21) ^ start.rotate_left(42)).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - TCACHE_BITS)) as usize
}

#[inline(always)]
fn fslot(a: u64) -> usize {
    (a.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - FCACHE_BITS)) as usize
}

#[inline(always)]
fn nslot(parent: u32, a: u64) -> usize {
    ((a ^ u64::from(parent).rotate_left(40)).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - NCACHE_BITS)) as usize
}

/// One binary's aggregated counters (module docs).
#[derive(Clone)]
pub struct BinaryAgg {
    facts: Arc<dyn CodeFacts>,
    tuples: Vec<Tuple>,
    tuple_index: HashTable<u32>,
    /// (parent, address); index 0 is the empty stack (its own parent).
    nodes: Vec<(u32, u64)>,
    node_index: HashTable<u32>,
    /// ((class | context) << 32 | tuple, count), and their index.
    counts: Vec<(u64, u64)>,
    count_index: HashTable<u32>,
    frames: HashTable<(u64, u64)>,
    /// Direct-mapped caches in front of the tuple, frame and context tables (hits need no
    /// hashing beyond one multiply).
    tcache: Box<[TSlot]>,
    fcache: Box<[(u64, u64)]>,
    ncache: Box<[NSlot]>,
    scache: Box<[SSlot; 1 << SCACHE_BITS]>,
    has_hybrid: bool,
    has_branch_only: bool,
    stats: AggStats,
    /// Names this binary within its profile (its index + 1) for [`Scratch`]'s memo.
    uid: usize,
}

impl std::fmt::Debug for BinaryAgg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BinaryAgg")
            .field("tuples", &self.tuples.len())
            .field("contexts", &self.nodes.len())
            .field("counts", &self.counts.len())
            .field("stats", &self.stats)
            .finish()
    }
}

impl BinaryAgg {
    pub(crate) fn new(facts: Arc<dyn CodeFacts>, uid: usize) -> Self {
        BinaryAgg {
            uid,
            facts,
            tuples: Vec::new(),
            tuple_index: HashTable::new(),
            nodes: vec![(0, 0)],
            node_index: HashTable::new(),
            counts: Vec::new(),
            count_index: HashTable::new(),
            frames: HashTable::new(),
            tcache: vec![EMPTY_TSLOT; 1 << TCACHE_BITS].into_boxed_slice(),
            fcache: vec![(0, 0); 1 << FCACHE_BITS].into_boxed_slice(),
            ncache: vec![EMPTY_NSLOT; 1 << NCACHE_BITS].into_boxed_slice(),
            scache: Box::new([EMPTY_SSLOT; 1 << SCACHE_BITS]),
            has_hybrid: false,
            has_branch_only: false,
            stats: AggStats::default(),
        }
    }

    /// The code facts the counters were computed with (the writers use the same).
    pub fn facts(&self) -> &dyn CodeFacts {
        &*self.facts
    }

    /// The code facts, shared.
    pub fn facts_arc(&self) -> Arc<dyn CodeFacts> {
        self.facts.clone()
    }

    /// Whether a hybrid sample (with a call stack) contributed branches.
    pub fn has_hybrid(&self) -> bool {
        self.has_hybrid
    }

    /// Whether a branch-only sample contributed branches.
    pub fn has_branch_only(&self) -> bool {
        self.has_branch_only
    }

    /// Whether anything was counted.
    pub fn is_empty(&self) -> bool {
        self.counts.is_empty()
    }

    /// The budget policy's counters.
    pub fn stats(&self) -> AggStats {
        self.stats
    }

    /// Distinct tuples.
    pub fn tuples(&self) -> &[Tuple] {
        &self.tuples
    }

    /// Distinct contexts (the empty one included).
    pub fn context_count(&self) -> usize {
        self.nodes.len()
    }

    /// Distinct (context, tuple) counts.
    pub fn count_entries(&self) -> usize {
        self.counts.len()
    }

    /// Every count, in no particular order.
    pub fn counts(&self) -> impl Iterator<Item = Counted<'_>> + '_ {
        self.counts.iter().filter(|e| e.1 > 0).map(|&(k, count)| {
            let hi = (k >> 32) as u32;
            let class = class_of(hi);
            Counted {
                tuple: &self.tuples[(k & 0xffff_ffff) as usize],
                count,
                class,
                context: if matches!(class, Class::All | Class::Llvm) { hi & CTX_MASK } else { 0 },
            }
        })
    }

    /// The parent-frame address stack of a context, root first.
    pub fn context(&self, id: u32) -> Vec<u64> {
        let mut v = Vec::new();
        let mut n = id;
        while n != 0 {
            let (p, a) = self.nodes[n as usize];
            v.push(a);
            n = p;
        }
        v.reverse();
        v
    }

    /// The parent of a context and its last address (`None` for the empty context).
    pub fn context_parent(&self, id: u32) -> Option<(u32, u64)> {
        (id != 0).then(|| self.nodes[id as usize])
    }

    pub(crate) fn accounted_bytes(&self) -> usize {
        self.tuples.len() * TUPLE_BYTES
            + self.nodes.len() * NODE_BYTES
            + self.counts.len() * COUNT_BYTES
            + self.frames.len() * FRAME_BYTES
    }

    pub(crate) fn bytes_used(&self) -> usize {
        self.tuples.capacity() * std::mem::size_of::<Tuple>()
            + self.tuple_index.capacity() * 5
            + self.nodes.capacity() * 16
            + self.node_index.capacity() * 5
            + self.counts.capacity() * 16
            + self.count_index.capacity() * 5
            + self.frames.capacity() * 17
            + std::mem::size_of_val(&*self.tcache)
            + std::mem::size_of_val(&*self.fcache)
            + std::mem::size_of_val(&*self.ncache)
            + std::mem::size_of_val(&*self.scache)
    }

    /// The frame facts of `a` (cached).
    #[inline]
    fn frame(&mut self, a: u64) -> u64 {
        if a == EXTERNAL_ADDR {
            return 0;
        }
        let slot = fslot(a);
        let c = self.fcache[slot];
        if c.0 == a {
            return c.1;
        }
        let v = self.frame_slow(a);
        self.fcache[slot] = (a, v);
        v
    }

    #[inline(never)]
    fn frame_slow(&mut self, a: u64) -> u64 {
        let h = hash_u64(a);
        if let Some(&(_, v)) = self.frames.find(h, |e| e.0 == a) {
            return v;
        }
        let f = &*self.facts;
        let mut v = f.call_addr_from_frame_addr(a) & ADDR_MASK;
        if f.is_inst(a) && !f.frame_is_external(a) {
            v |= FRAME_CODE;
        }
        if f.in_prolog_epilog(a) {
            v |= FRAME_PROLOG;
        }
        self.frames.insert_unique(h, (a, v), |e| hash_u64(e.0));
        v
    }

    /// The id of tuple `(start, src, dst)`, made if new and the budget's reserve allows.
    #[inline(always)]
    fn tuple(&mut self, start: u64, src: u64, dst: u64, budget: Budget) -> Option<(u32, u8)> {
        let slot = tslot(start, src, dst);
        let c = &self.tcache[slot];
        if c.src == src && c.dst == dst && c.start == start {
            return Some((c.id, c.flags));
        }
        self.tuple_fill(slot, start, src, dst, budget)
    }

    #[inline(never)]
    fn tuple_fill(&mut self, slot: usize, start: u64, src: u64, dst: u64, budget: Budget) -> Option<(u32, u8)> {
        let id = self.tuple_slow(start, src, dst, budget)?;
        let flags = self.tuples[id as usize].flags;
        self.tcache[slot] = TSlot { start, src, dst, id, flags };
        Some((id, flags))
    }

    #[inline(never)]
    fn tuple_slow(&mut self, start: u64, src: u64, dst: u64, budget: Budget) -> Option<u32> {
        let h = hash_tuple(start, src, dst);
        let tuples = &self.tuples;
        if let Some(&i) = self.tuple_index.find(h, |&i| {
            let t = &tuples[i as usize];
            t.src == src && t.dst == dst && t.start == start
        }) {
            return Some(i);
        }
        self.tuple_new(start, src, dst, h, budget)
    }

    #[inline(never)]
    fn tuple_new(&mut self, start: u64, src: u64, dst: u64, h: u64, budget: Budget) -> Option<u32> {
        if budget.others + self.accounted_bytes() + TUPLE_BYTES > budget.reserve() {
            return None;
        }
        let f = &*self.facts;
        let mut flags = 0;
        if (src == EXTERNAL_ADDR || f.is_inst(src)) && (dst == EXTERNAL_ADDR || f.is_inst(dst)) {
            flags |= CLEAN;
        }
        if src != EXTERNAL_ADDR {
            if f.is_call(src) {
                flags |= SRC_CALL;
            } else if f.is_return(src) {
                flags |= SRC_RET;
            }
        }
        let ret_call = f.call_addr_from_frame_addr(dst);
        if start != NO_START && !(start == EXTERNAL_ADDR && src == EXTERNAL_ADDR) {
            if start == EXTERNAL_ADDR || src == EXTERNAL_ADDR || start > src || f.range_crosses_uncond_branch(start, src) {
                flags |= RANGE_INVALID;
            } else {
                flags |= RANGE_VALID;
            }
        }
        let i = self.tuples.len() as u32;
        self.tuples.push(Tuple { start, src, dst, ret_call, flags, memo_hi: u32::MAX, memo_idx: 0 });
        let tuples = &self.tuples;
        self.tuple_index.insert_unique(h, i, |&j| {
            let t = &tuples[j as usize];
            hash_tuple(t.start, t.src, t.dst)
        });
        Some(i)
    }

    /// The context `parent + [addr]` (the empty one for an external frame, or past the
    /// budget).
    #[inline]
    fn child(&mut self, parent: u32, addr: u64, budget: Budget) -> u32 {
        if addr == EXTERNAL_ADDR {
            return 0;
        }
        let slot = nslot(parent, addr);
        let c = self.ncache[slot];
        if c.addr == addr && c.parent == parent && c.id != u32::MAX {
            return c.id;
        }
        let id = self.child_slow(parent, addr, budget);
        self.ncache[slot] = NSlot { addr, parent, id };
        id
    }

    #[inline(never)]
    fn child_slow(&mut self, parent: u32, addr: u64, budget: Budget) -> u32 {
        let h = hash_node(parent, addr);
        let nodes = &self.nodes;
        if let Some(&i) = self.node_index.find(h, |&i| nodes[i as usize] == (parent, addr)) {
            return i;
        }
        if budget.others + self.accounted_bytes() + NODE_BYTES > budget.contexts() {
            self.stats.contexts_folded += 1;
            return 0;
        }
        let i = self.nodes.len() as u32;
        self.nodes.push((parent, addr));
        let nodes = &self.nodes;
        self.node_index.insert_unique(h, i, |&j| {
            let (p, a) = nodes[j as usize];
            hash_node(p, a)
        });
        i
    }

    /// Add `count` to (class, context, tuple), folding a new count to the empty context past
    /// the budget.
    #[inline]
    fn bump(&mut self, class: Class, ctx: u32, tuple: u32, count: u64, budget: Budget) {
        let hi = class_bits(class) | ctx;
        let t = &self.tuples[tuple as usize];
        if t.memo_hi == hi {
            let e = &mut self.counts[t.memo_idx as usize];
            e.1 = e.1.wrapping_add(count);
            return;
        }
        self.bump_slow(hi, tuple, count, budget);
    }

    /// The index of count `key`, if it exists.
    fn find_count(&self, key: u64) -> Option<u32> {
        let counts = &self.counts;
        self.count_index.find(hash_u64(key), |&i| counts[i as usize].0 == key).copied()
    }

    fn insert_count(&mut self, key: u64, count: u64) -> u32 {
        let i = self.counts.len() as u32;
        self.counts.push((key, count));
        let counts = &self.counts;
        self.count_index.insert_unique(hash_u64(key), i, |&j| hash_u64(counts[j as usize].0));
        i
    }

    #[inline(never)]
    fn bump_slow(&mut self, hi: u32, tuple: u32, count: u64, budget: Budget) {
        let key = (u64::from(hi) << 32) | u64::from(tuple);
        let idx = match self.find_count(key) {
            Some(i) => {
                let e = &mut self.counts[i as usize];
                e.1 = e.1.wrapping_add(count);
                i
            }
            None => {
                let used = budget.others + self.accounted_bytes() + COUNT_BYTES;
                if used <= if hi & CTX_MASK != 0 { budget.contexts() } else { budget.reserve() } {
                    self.insert_count(key, count)
                } else {
                    // Past the budget: the empty context (a new count past the reserve is
                    // dropped).
                    let base = (u64::from(hi & !CTX_MASK) << 32) | u64::from(tuple);
                    match self.find_count(base) {
                        Some(i) => self.counts[i as usize].1 = self.counts[i as usize].1.wrapping_add(count),
                        None if used <= budget.reserve() => {
                            self.insert_count(base, count);
                        }
                        None => {
                            self.stats.counts_dropped += u64::from(count as i64 > 0);
                            return;
                        }
                    }
                    if hi & CTX_MASK != 0 {
                        self.stats.counts_folded += u64::from(count as i64 > 0);
                    }
                    return;
                }
            }
        };
        let t = &mut self.tuples[tuple as usize];
        t.memo_hi = hi;
        t.memo_idx = idx;
    }

    /// Aggregate one sample's view of this binary: `stack` (leaf first; for a branch-only
    /// sample its IP) as encoded words, this binary's tagged `tag` (the rest is external),
    /// and its branches. `all_in`: every branch end lies in this binary. Returns whether
    /// anything was counted; `Err` (nothing counted) if some branch end was not where the
    /// [`Pairs`] said ([`Pairs::in_view`]).
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub(crate) fn add<P: Pairs>(
        &mut self,
        stack: &[u64],
        tag: u64,
        pairs: &P,
        all_in: bool,
        branch_only: bool,
        count: u64,
        budget: Budget,
        sc: &mut Scratch,
    ) -> Result<bool, ()> {
        let dropped = self.canonical_stack(stack, tag, sc);
        // The common case in one pass: every branch end is external or code, so BOLT's and
        // llvm-profgen's lists are one; commonest, every end is in this binary.
        let done = match (dropped, all_in) {
            (true, _) => Walk::Unclean,
            (false, true) => self.walk_fast(pairs, usize::MAX, count, budget, sc),
            (false, false) => self.walk(pairs, usize::MAX, count, budget, sc),
        };
        Ok(match done {
            Walk::Empty => false,
            Walk::Done(n) => {
                if n > 0 {
                    self.note_kind(branch_only);
                }
                n > 0
            }
            // The slow path takes every pair as given: only where they are said to be.
            Walk::Unclean if (0..pairs.len()).all(|i| pairs.in_view(i)) => {
                self.add_slow(pairs, branch_only, dropped, count, budget, sc)
            }
            Walk::Unclean => return Err(()),
            Walk::OutOfView => return Err(()),
        })
    }

    /// llvm-profgen's `extractCallstack` of a stack (encoded words, this binary's tagged
    /// `tag`) into `sc.stack`; returns whether llvm-profgen drops the sample (no stack, or its
    /// leaf in a prolog or epilog).
    #[inline(never)]
    fn canonical_stack(&mut self, stack: &[u64], tag: u64, sc: &mut Scratch) -> bool {
        let proj = |w: u64| {
            let x = w ^ tag;
            if x <= ADDR_MASK { x } else { EXTERNAL_ADDR }
        };
        sc.stack.clear();
        let Some((&leaf, tail)) = stack.split_first() else { return true };
        // The callers' part as if after a code leaf, kept for the next sample with the same
        // callers (consecutive samples of a window mostly have them).
        if !(sc.tail_agg == self.uid && sc.tail_tag == tag && sc.raw_tail == tail) {
            sc.raw_tail.clear();
            sc.raw_tail.extend_from_slice(tail);
            sc.tail_canon.clear();
            let mut last_ext = false;
            for &w in tail {
                let f = self.frame(proj(w));
                if f & FRAME_CODE == 0 {
                    if !last_ext {
                        sc.tail_canon.push(EXTERNAL_ADDR);
                        last_ext = true;
                    }
                    continue;
                }
                let call = f & ADDR_MASK;
                if call == 0 {
                    break;
                }
                sc.tail_canon.push(call);
                last_ext = false;
            }
            sc.tail_agg = self.uid;
            sc.tail_tag = tag;
        }
        let a = proj(leaf);
        let f = self.frame(a);
        let leaf_ext = f & FRAME_CODE == 0;
        sc.stack.push(if leaf_ext { EXTERNAL_ADDR } else { a });
        let t = match sc.tail_canon.split_first() {
            Some((&EXTERNAL_ADDR, rest)) if leaf_ext => rest,
            _ => &sc.tail_canon[..],
        };
        sc.stack.extend_from_slice(t);
        if sc.stack.len() > 1 && sc.stack.last() == Some(&EXTERNAL_ADDR) {
            sc.stack.pop();
        }
        !leaf_ext && f & FRAME_PROLOG != 0
    }

    fn note_kind(&mut self, branch_only: bool) {
        if branch_only {
            self.has_branch_only = true;
        } else {
            self.has_hybrid = true;
        }
    }

    /// The virtual unwinder over the branches (newest first) from the canonical stack in
    /// `sc.stack`, counting each tuple as [`Class::All`] while every branch end is external
    /// or code; at the first tuple that is not, the counts made so far are taken back and
    /// [`Walk::Unclean`] returned. At most `limit` tuples.
    #[inline(never)]
    fn walk<P: Pairs>(&mut self, pairs: &P, limit: usize, count: u64, budget: Budget, sc: &mut Scratch) -> Walk {
        let n_pairs = pairs.len();
        // The next entry (not both ends external) at or after pair `j`.
        let next = |mut j: usize| {
            while j < n_pairs {
                let (s, d) = pairs.pair(j);
                if s != EXTERNAL_ADDR || d != EXTERNAL_ADDR {
                    return Some((j, s, d));
                }
                j += 1;
            }
            None
        };
        let Some(mut cur) = next(0) else { return Walk::Empty };
        let mut ctx = self.start_chain(budget, sc);
        let mut invalid = false;
        let mut prev = 0u8;
        let mut n = 0usize;
        loop {
            let older = next(cur.0 + 1);
            let start = older.map_or(NO_START, |o| o.2);
            let Some((id, flags)) = self.tuple(start, cur.1, cur.2, budget) else {
                self.stats.samples_dropped += 1;
                self.take_back(pairs, n, count, budget, sc);
                return Walk::Done(0);
            };
            if flags & CLEAN == 0 {
                self.take_back(pairs, n, count, budget, sc);
                return Walk::Unclean;
            }
            // The range before this branch (the newer tuple's) makes the rest invalid.
            if prev & RANGE_INVALID != 0 {
                invalid = true;
            }
            prev = flags;
            let src = cur.1;
            if invalid {
                sc.chain.clear();
                ctx = 0;
            } else if flags & (SRC_CALL | SRC_RET) != 0 || src == EXTERNAL_ADDR {
                let ret_call = self.tuples[id as usize].ret_call;
                if flags & SRC_CALL != 0 || (src == EXTERNAL_ADDR && ret_call == 0) {
                    if sc.chain.last().is_some_and(|&(top, _)| top == src) {
                        sc.chain.pop();
                        ctx = sc.chain.last().map_or(0, |c| c.1);
                    }
                } else {
                    ctx = self.child(ctx, ret_call, budget);
                    sc.chain.push((ret_call, ctx));
                }
            }
            self.bump(Class::All, ctx, id, count, budget);
            n += 1;
            match older {
                Some(o) if n < limit => cur = o,
                _ => return Walk::Done(n),
            }
        }
    }

    /// Takes back the first `n` tuples [`walk`](Self::walk) counted (the same walk with the
    /// count negated: the same tuples, contexts and counts).
    #[cold]
    fn take_back<P: Pairs>(&mut self, pairs: &P, n: usize, count: u64, budget: Budget, sc: &mut Scratch) {
        if n > 0 {
            self.walk(pairs, n, count.wrapping_neg(), budget, sc);
        }
    }

    /// The parent stack of the canonical stack in `sc.stack` as contexts into `sc.chain`
    /// (root first); returns the innermost context. The part shared from the root with the
    /// previous sample's stack (in this binary) is copied, not looked up again.
    #[inline]
    fn start_chain(&mut self, budget: Budget, sc: &mut Scratch) -> u32 {
        let me = self.uid;
        let n = sc.stack.len().saturating_sub(1);
        let mut k = 0;
        if sc.prev_agg == me {
            let m = sc.prev_tail.len().min(n);
            while k < m && sc.prev_tail[k] == sc.stack[n - k] {
                k += 1;
            }
        }
        sc.chain.clear();
        sc.chain.extend_from_slice(&sc.prev_chain[..k]);
        sc.prev_tail.truncate(k);
        let mut ctx = sc.chain.last().map_or(0, |c| c.1);
        for i in (1..=n - k).rev() {
            let a = sc.stack[i];
            ctx = self.child(ctx, a, budget);
            sc.chain.push((a, ctx));
            sc.prev_tail.push(a);
        }
        sc.prev_chain.clear();
        sc.prev_chain.extend_from_slice(&sc.chain);
        sc.prev_agg = me;
        ctx
    }

    /// [`walk`](Self::walk) of a sample whose branch ends all lie in this binary (none
    /// external, none skipped). No external frame can then be pushed or popped, so the parent
    /// stack needs no more than its context: a call pops when the context's own (innermost)
    /// address is its source, to the context's parent; a return pushes the call before its
    /// target; other branches keep it; once the walk is invalid every context is 0 (the empty
    /// context holds no frame a call could pop: it is empty or its top is external). Each
    /// step is thus a function of the context before it and the tuple, and goes through a
    /// direct-mapped cache keyed by both, holding the context of the next step and the index
    /// of the tuple's count.
    #[inline(never)]
    fn walk_fast<P: Pairs>(&mut self, pairs: &P, limit: usize, count: u64, budget: Budget, sc: &mut Scratch) -> Walk {
        self.walk_fast_inner(pairs, limit, count, budget, sc, true)
    }

    /// [`walk_fast`](Self::walk_fast); `check`: whether the pairs are checked for
    /// [`Pairs::in_view`] (not when taking a walk back).
    #[inline(always)]
    fn walk_fast_inner<P: Pairs>(
        &mut self,
        pairs: &P,
        limit: usize,
        count: u64,
        budget: Budget,
        sc: &mut Scratch,
        check: bool,
    ) -> Walk {
        let n_pairs = pairs.len();
        if n_pairs == 0 {
            return Walk::Empty;
        }
        let mut before = self.start_chain(budget, sc);
        let end = n_pairs.min(limit);
        let (mut src, mut dst) = pairs.pair(0);
        let mut in_view = true;
        for i in 0..end {
            let (osrc, odst) = if i + 1 < n_pairs { pairs.pair(i + 1) } else { (0, NO_START) };
            in_view &= pairs.in_view(i);
            let start = odst;
            let slot = sslot(before, start, src, dst);
            let c = &self.scache[slot];
            let (ci, next) = if c.src == src && c.dst == dst && c.start == start && c.before == before {
                (c.count, c.next)
            } else {
                // Made only from addresses where they are said to be.
                let r = if !check || (in_view && (i + 1 >= n_pairs || pairs.in_view(i + 1))) {
                    self.step_slow(slot, before, start, src, dst, budget)
                } else {
                    Err(Walk::OutOfView)
                };
                match r {
                    Ok(c) => (c.count, c.next),
                    Err(w) => return self.walk_failed(pairs, i, count, budget, sc, w),
                }
            };
            match self.counts.get_mut(ci as usize) {
                Some(e) => e.1 = e.1.wrapping_add(count),
                None => self.stats.counts_dropped += u64::from(count as i64 > 0),
            }
            before = next;
            (src, dst) = (osrc, odst);
        }
        if check && !in_view {
            return self.walk_failed(pairs, end, count, budget, sc, Walk::OutOfView);
        }
        Walk::Done(end)
    }

    /// A fast walk that met a tuple that is not clean or did not fit: takes back its first
    /// `i` steps and says why.
    #[cold]
    fn walk_failed<P: Pairs>(&mut self, pairs: &P, i: usize, count: u64, budget: Budget, sc: &mut Scratch, w: Walk) -> Walk {
        if i > 0 {
            self.walk_fast_inner(pairs, i, count.wrapping_neg(), budget, sc, false);
        }
        w
    }

    /// A [`walk_fast`](Self::walk_fast) step that missed the cache: the tuple, the unwind of
    /// its branch and its count, into the cache slot. `Err`: the tuple is not clean
    /// ([`Walk::Unclean`]) or did not fit the budget ([`Walk::Done`] of 0).
    #[inline(never)]
    fn step_slow(&mut self, slot: usize, before: u32, start: u64, src: u64, dst: u64, budget: Budget) -> Result<SSlot, Walk> {
        let Some((id, flags)) = self.tuple(start, src, dst, budget) else {
            self.stats.samples_dropped += 1;
            return Err(Walk::Done(0));
        };
        if flags & CLEAN == 0 {
            return Err(Walk::Unclean);
        }
        let after = if before == INVALID_CTX {
            0
        } else if flags & SRC_CALL != 0 {
            match self.nodes[before as usize] {
                (parent, top) if before != 0 && top == src => parent,
                _ => before,
            }
        } else if flags & SRC_RET != 0 {
            let ret_call = self.tuples[id as usize].ret_call;
            self.child(before, ret_call, budget)
        } else {
            before
        };
        let count = self.count_index(class_bits(Class::All) | after, id, budget).unwrap_or(u32::MAX);
        let next = if flags & RANGE_INVALID != 0 || before == INVALID_CTX { INVALID_CTX } else { after };
        let c = SSlot { start, src, dst, before, next, count };
        self.scache[slot] = c;
        Ok(c)
    }

    /// The index of count (class | context, tuple), made (at 0) if new; past the budget the
    /// empty context's, `None` past its reserve.
    fn count_index(&mut self, hi: u32, tuple: u32, budget: Budget) -> Option<u32> {
        let key = (u64::from(hi) << 32) | u64::from(tuple);
        if let Some(i) = self.find_count(key) {
            return Some(i);
        }
        let used = budget.others + self.accounted_bytes() + COUNT_BYTES;
        if used <= if hi & CTX_MASK != 0 { budget.contexts() } else { budget.reserve() } {
            return Some(self.insert_count(key, 0));
        }
        let base = (u64::from(hi & !CTX_MASK) << 32) | u64::from(tuple);
        if hi & CTX_MASK != 0 {
            self.stats.counts_folded += 1;
        }
        match self.find_count(base) {
            Some(i) => Some(i),
            None if used <= budget.reserve() => Some(self.insert_count(base, 0)),
            None => None,
        }
    }

    /// BOLT's and llvm-profgen's lists apart (a branch end in the binary that is not code),
    /// or a sample llvm-profgen drops (leaf in a prolog or epilog): BOLT's tuples as
    /// [`Class::Bolt`], llvm-profgen's unwound as [`Class::Llvm`] (or, dropped, a branch-only
    /// sample's as [`Class::BranchOnlyProlog`]).
    #[cold]
    fn add_slow<P: Pairs>(
        &mut self,
        pairs: &P,
        branch_only: bool,
        dropped: bool,
        count: u64,
        budget: Budget,
        sc: &mut Scratch,
    ) -> bool {
        let mut ids = std::mem::take(&mut sc.ids);
        ids.clear();
        let mut older = NO_START;
        for j in (0..pairs.len()).rev() {
            let (s, d) = pairs.pair(j);
            if s == EXTERNAL_ADDR && d == EXTERNAL_ADDR {
                continue;
            }
            let Some((id, _)) = self.tuple(older, s, d, budget) else {
                self.stats.samples_dropped += 1;
                sc.ids = ids;
                return false;
            };
            ids.push(id);
            older = d;
        }
        if ids.is_empty() {
            sc.ids = ids;
            return false;
        }
        self.note_kind(branch_only);
        for &id in &ids {
            self.bump(Class::Bolt, 0, id, count, budget);
        }
        self.add_llvm_list(&ids, branch_only, dropped, count, budget, sc);
        sc.ids = ids;
        true
    }

    /// The sample's branches as llvm-profgen lists them, when they differ from BOLT's
    /// (`l1`: BOLT's tuples, oldest first): ends that are not code become external, external
    /// pairs go; then unwound (or, dropped, counted for a branch-only sample's context-free
    /// profile only).
    #[inline(never)]
    fn add_llvm_list(&mut self, l1: &[u32], branch_only: bool, dropped: bool, count: u64, budget: Budget, sc: &mut Scratch) {
        let mut ids2 = std::mem::take(&mut sc.ids2);
        ids2.clear();
        let mut older = NO_START;
        for &id in l1 {
            let t = self.tuples[id as usize];
            let code = |a: u64| a != EXTERNAL_ADDR && self.facts.is_inst(a);
            let s = if code(t.src) { t.src } else { EXTERNAL_ADDR };
            let d = if code(t.dst) { t.dst } else { EXTERNAL_ADDR };
            if s == EXTERNAL_ADDR && d == EXTERNAL_ADDR {
                continue;
            }
            match self.tuple(older, s, d, budget) {
                Some((id, _)) => ids2.push(id),
                None => {
                    self.stats.samples_dropped += 1;
                    sc.ids2 = ids2;
                    return;
                }
            }
            older = d;
        }
        if dropped {
            if branch_only {
                for &id in &ids2 {
                    self.bump(Class::BranchOnlyProlog, 0, id, count, budget);
                }
            }
        } else if !ids2.is_empty() {
            self.unwind(&ids2, Class::Llvm, count, budget, sc);
        }
        sc.ids2 = ids2;
    }

    /// The virtual unwinder over llvm-profgen's branch list `ids` (tuples, oldest first),
    /// from the canonical stack in `sc.stack` (leaf first).
    #[inline]
    fn unwind(&mut self, ids: &[u32], class: Class, count: u64, budget: Budget, sc: &mut Scratch) {
        let mut ctx = self.start_chain(budget, sc);
        let mut invalid = false;
        let mut prev = 0u8;
        for &id in ids.iter().rev() {
            let t = &self.tuples[id as usize];
            let (flags, src, ret_call) = (t.flags, t.src, t.ret_call);
            // The range before this branch (the newer tuple's) makes the rest invalid.
            if prev & RANGE_INVALID != 0 {
                invalid = true;
            }
            prev = flags;
            if invalid {
                sc.chain.clear();
                ctx = 0;
            } else if flags & SRC_CALL != 0 || (src == EXTERNAL_ADDR && ret_call == 0) {
                if sc.chain.last().is_some_and(|&(top, _)| top == src) {
                    sc.chain.pop();
                    ctx = sc.chain.last().map_or(0, |c| c.1);
                }
            } else if flags & SRC_RET != 0 || (src == EXTERNAL_ADDR && ret_call != 0) {
                ctx = self.child(ctx, ret_call, budget);
                sc.chain.push((ret_call, ctx));
            }
            self.bump(class, ctx, id, count, budget);
        }
    }

    /// Add every count of `other` (the same binary in another profile).
    pub(crate) fn merge(&mut self, other: &BinaryAgg, budget: Budget) {
        self.has_hybrid |= other.has_hybrid;
        self.has_branch_only |= other.has_branch_only;
        let mut tmap = Vec::with_capacity(other.tuples.len());
        for t in &other.tuples {
            tmap.push(self.tuple(t.start, t.src, t.dst, budget).map(|x| x.0));
        }
        let mut nmap = vec![0u32; other.nodes.len()];
        for (i, &(p, a)) in other.nodes.iter().enumerate().skip(1) {
            nmap[i] = self.child(nmap[p as usize], a, budget);
        }
        for &(k, count) in &other.counts {
            let hi = (k >> 32) as u32;
            let class = class_of(hi);
            let Some(t) = tmap[(k & 0xffff_ffff) as usize] else {
                self.stats.counts_dropped += 1;
                continue;
            };
            let ctx = if matches!(class, Class::All | Class::Llvm) { nmap[(hi & CTX_MASK) as usize] } else { 0 };
            self.bump(class, ctx, t, count, budget);
        }
        let o = other.stats;
        self.stats.samples_dropped += o.samples_dropped;
        self.stats.counts_folded += o.counts_folded;
        self.stats.counts_dropped += o.counts_dropped;
        self.stats.contexts_folded += o.contexts_folded;
    }
}
