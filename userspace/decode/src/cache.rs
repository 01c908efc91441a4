//! Per-image decode cache: start address -> walked block (the run of instructions up to and
//! including the next waypoint). Hot code is then walked once; later atoms on the same block
//! cost one table lookup instead of one instruction decode per instruction.
//!
//! Two-way set-associative (a new block evicts the older of its set's two: blocks a multiple
//! of the cache's span apart share a set, and a large image's hot code has many such pairs),
//! fixed size (bounded memory, no allocation after construction). Entries are
//! tagged with the memory space and context ID that selected the code and with the decoder's
//! instruction-classification options, so different processes mapping different code at the
//! same address, or decoders with different options, do not collide.
//!
//! A cache belongs to a code image, not to a decoder: every decoder of one image (one per
//! trace ID and buffer) shares one ([`SharedBlockCache`], [`crate::decoder::Decoder::with_cache`]),
//! so memory does not grow with the number of trace IDs times buffers.

use std::cell::{Cell, OnceCell, Ref, RefCell};

use crate::branches::{BranchRecord, BranchRule, RangeEnd};
use crate::elements::{InstrRange, Range};
use crate::insn::{InstrInfo, InstrSubtype, InstrType, Isa};

/// A walked block: `[start, end)` holds `num_instr` instructions ending in a waypoint.
#[derive(Debug, Clone, Copy, Default)]
pub struct Block {
    /// Address after the waypoint instruction.
    pub end: u64,
    /// Instructions in the block (including the waypoint).
    pub num_instr: u32,
    /// The waypoint instruction's classification.
    pub last: InstrInfo,
}

/// A cache shared by the decoders of one code image (single-threaded: the entries are cells,
/// so lookups and stores need no borrow).
pub type SharedBlockCache = std::rc::Rc<BlockCache>;

/// Entries of the default cache (2^16: 65,536 blocks, about 3 MiB per code image). A large
/// image's trace (`bugfix-exact-match`: ~20,000 distinct blocks in 1 MiB) fits without
/// evicting much; see bench/README.md.
pub const DEFAULT_BITS: u32 = 16;

/// A new shared cache with `2^bits` entries.
pub fn shared(bits: u32) -> SharedBlockCache {
    std::rc::Rc::new(BlockCache::new(bits))
}

const VALID: u64 = 1 << 63;

/// The tag bit of the runs that go on through compressed returns ([`Run::pops`]): stored and
/// found only by a decoder whose sink takes branches, so a sink that takes ranges (and the
/// general path's rule, which stops at every taken indirect branch) never meets one.
pub(crate) const THROUGH_RETURNS: u64 = 1 << 62;

/// Entries pushed before a run that its compressed returns may pop ([`StackEffect::outer`]).
pub(crate) const OUTER_MAX: usize = 2;

/// An unused entry of [`StackEffect::outer`] (no A64 instruction is at an address with its
/// low bits set).
pub(crate) const NO_TOP: u64 = u64::MAX;

/// Pushes of a run that pops that [`StackEffect`] holds.
pub(crate) const KEPT_MAX: usize = 2;

/// What a run that pops ([`Run::pops`]) does to the return stack, summed up: the return
/// addresses its pops take from the entries pushed before it (top first, [`NO_TOP`] after
/// them; `popped` of them), the return addresses it pushes that are still on the stack after
/// it (`kept` of them, oldest first; the first [`KEPT_MAX`] here), and the most of its own
/// pushes on the stack at once. Where that many more entries fit and it keeps at most
/// [`KEPT_MAX`], the run pops `popped` entries and then pushes those it kept (`same`: the
/// ones it popped, as a loop that calls a function from one place does: the stack is left
/// as it was); elsewhere (a full stack drops its oldest entries on the way) the run's
/// operations are made one by one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StackEffect {
    pub(crate) outer: [u64; OUTER_MAX],
    pub(crate) pushes: [u64; KEPT_MAX],
    pub(crate) popped: u8,
    pub(crate) kept: u8,
    pub(crate) peak: u8,
    pub(crate) same: bool,
}

impl StackEffect {
    /// A run that pops nothing.
    pub(crate) const NONE: StackEffect =
        StackEffect { outer: [NO_TOP; OUTER_MAX], pushes: [0; KEPT_MAX], popped: 0, kept: 0, peak: 0, same: false };
}

/// A slot: key (start, tag with bit 63 set; 0 = empty) and block side by side, so a lookup
/// touches one place.
#[derive(Clone)]
struct Slot {
    key: Cell<(u64, u64)>,
    block: Cell<Block>,
}

impl Slot {
    /// An empty slot (its block never read): all zero bytes, which `vec!` writes in one go.
    /// (Only ever a fresh value to copy: a `const fn` instead is not written as one block.)
    #[allow(clippy::declare_interior_mutable_const)]
    const EMPTY: Slot = Slot {
        key: Cell::new((0, 0)),
        block: Cell::new(Block {
            end: 0,
            num_instr: 0,
            last: InstrInfo {
                ty: InstrType::Other,
                subtype: InstrSubtype::None,
                size: 0,
                is_link: false,
                is_cond: false,
                branch_addr: 0,
                next_isa: Isa::Arm,
            },
        }),
    };
}

/// Most atoms one [`Run`] covers.
pub const RUN_MAX: usize = 8;

/// Entries of the run cache (2^16, 64 bytes each with their taken branches' summary: 4 MiB),
/// whatever the size of the block cache: a constant, so a lookup needs no mask loaded and no
/// bounds check.
const RUN_BITS: u32 = 16;
pub(crate) const RUN_SLOTS: usize = 1 << RUN_BITS;

/// Ranges the run cache holds (2^16, ~2 MiB, and as many taken-branch records beside them, 1
/// MiB), in a ring shared by its slots: a run takes as many as it has atoms (~3.3 on average),
/// not [`RUN_MAX`], so the slots are many and small.
const ARENA: usize = 1 << 16;

/// An arena of `ARENA + RUN_MAX` copies of `unused` (on the heap: it is too large to build on
/// the stack): the ranges' and the records'.
fn arena<T: Clone>(unused: T) -> Box<[T; ARENA + RUN_MAX]> {
    let Ok(a) = vec![unused; ARENA + RUN_MAX].into_boxed_slice().try_into() else { unreachable!("ARENA + RUN_MAX entries") };
    a
}

/// An arena's range never read before a run is stored there: all zero bytes, which `vec!`
/// writes in one go.
const UNUSED: InstrRange = InstrRange {
    start: 0,
    end: 0,
    num_instr: 0,
    isa: Isa::Arm,
    last_size: 0,
    executed: false,
    last_type: InstrType::Other,
    last_subtype: InstrSubtype::None,
    last_cond: false,
};

/// [`RunCache::owner`] of an arena position no run starts at.
const NO_OWNER: u32 = u32::MAX;

/// What a run of atoms from a known A64 address did, all its blocks cached: the ranges in
/// order (their packet index to be filled in, see [`BlockCache::replay_run`]), which of them pushed
/// their end on the return stack, and where the run left the address. Replaying it has the
/// effects the atoms had, one block lookup each, in one lookup.
#[derive(Debug, Clone, Copy, Default)]
pub struct Run {
    /// Atoms consumed (= ranges).
    pub count: u8,
    /// The last atom was a taken indirect branch: the address comes from the trace next.
    pub indirect: bool,
    /// Bit `i`: range `i` ended in a taken branch with link (its end is pushed).
    pub links: u8,
    /// Bit `i`: range `i` ended in a taken indirect branch and the next range starts at the
    /// address popped from the return stack (a compressed return: an atom follows in the
    /// packet), after the push of bit `i` of `links`. Only in runs stored under
    /// [`THROUGH_RETURNS`], whose pops of entries pushed before the run are their slot's
    /// [`BlockCache::run_effect`].
    pub pops: u8,
    /// Instructions in the ranges (at most `RUN_MAX` walks of at most `walk::MAX_WALK` each).
    pub instructions: u32,
    /// The address after the run (after the indirect branch when `indirect`).
    pub next: u64,
}

/// The atoms of a run as the run cache keys them: the `count` atoms `bits` packed into one
/// word, and their part of the slot's hash. A function of the atoms alone, so an atom
/// packet's can be computed once per header byte ([`crate::packet::Lookahead::run_key`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RunKey {
    atoms: u64,
    mix: u64,
}

impl RunKey {
    /// The key of the `count` atoms `bits` (oldest in bit 0, no bits above `count`).
    #[inline]
    pub const fn new(bits: u32, count: u8) -> Self {
        RunKey { atoms: bits as u64 | (count as u64) << 32, mix: (bits as u64).wrapping_mul(0x9e37_79b9) ^ ((count as u64) << 7) }
    }

    /// The key of an atom packet's `count` atoms `bits` as one run: no stored run has it when
    /// they are more than one run holds ([`RUN_MAX`]).
    #[inline]
    pub const fn of_packet(bits: u32, count: u8) -> Self {
        if count as usize <= RUN_MAX { Self::new(bits, count) } else { RunKey { atoms: u64::MAX, mix: 0 } }
    }
}

/// A stored run: key (start, tag with bit 63 set, atom bits | count << 32), the run, where
/// its ranges are in the arena, and its taken branches by perf's rule ([`BranchRule`], ruled
/// from [`BranchRule::OPEN`]): how many after its first range's (in the arena's records at the
/// same place), and the chain after its last range.
#[derive(Clone, Default)]
pub(crate) struct RunSlot {
    start: Cell<u64>,
    tag: Cell<u64>,
    atoms: Cell<u64>,
    run: Cell<Run>,
    pos: Cell<u32>,
    inner: Cell<u8>,
    end: Cell<RangeEnd>,
}

impl RunSlot {
    /// The run.
    #[inline]
    pub(crate) fn run(&self) -> Run {
        self.run.get()
    }

    /// Its records after the first range's, and the chain after it (see [`RunSlot`]).
    #[inline(always)]
    pub(crate) fn branches(&self) -> (usize, RangeEnd) {
        (self.inner.get() as usize, self.end.get())
    }
}

/// Records a run's ranges make after its first range's: at most one per range after the
/// first.
pub(crate) const INNER_MAX: usize = RUN_MAX - 1;

/// The runs: slots indexed by a hash of the key, their ranges in a ring (`ranges`, written at
/// `head`; a run never wraps). A run whose ranges the ring overwrites is forgotten: `owner`
/// names, for each position a run's ranges start at, the slot that stored it there.
struct RunCache {
    slots: Box<[RunSlot; RUN_SLOTS]>,
    ranges: RefCell<Box<[InstrRange; ARENA + RUN_MAX]>>,
    /// The runs' records after their first range's (see [`RunSlot`]), where their ranges are.
    recs: RefCell<Box<[BranchRecord; ARENA + RUN_MAX]>>,
    owner: Box<[Cell<u32>]>,
    head: Cell<usize>,
    /// Runs are stored with their taken branches ([`BlockCache::rule_runs`]).
    ruled: Cell<bool>,
    /// By slot, for a run with [`Run::pops`]: its effect on the return stack. Beside the
    /// slots, not in them: only a run that pops reads it; made when the first such run is
    /// stored (2^16 x 40 bytes: a sink that takes ranges, or trace without compressed
    /// returns, never has one).
    effects: OnceCell<Box<[Cell<StackEffect>; RUN_SLOTS]>>,
}

/// The cache.
pub struct BlockCache {
    slots: Box<[Slot]>,
    mask: usize,
    runs: RunCache,
    hits: Cell<u64>,
    misses: Cell<u64>,
}

impl BlockCache {
    /// A cache with `2^bits` entries (at least 2: one set).
    pub fn new(bits: u32) -> Self {
        let n = 1usize << bits.clamp(1, 24);
        // (empty slots: all zero, which `vec!` writes in one go)
        let runs = vec![RunSlot::default(); RUN_SLOTS].into_boxed_slice();
        let Ok(slots) = runs.try_into() else { unreachable!("RUN_SLOTS slots") };
        let runs = RunCache {
            slots,
            ranges: RefCell::new(arena(UNUSED)),
            recs: RefCell::new(arena(BranchRecord::default())),
            owner: vec![Cell::new(NO_OWNER); ARENA].into_boxed_slice(),
            head: Cell::new(0),
            ruled: Cell::new(false),
            effects: OnceCell::new(),
        };
        BlockCache { slots: vec![Slot::EMPTY; n].into_boxed_slice(), mask: n - 1, runs, hits: Cell::new(0), misses: Cell::new(0) }
    }

    /// The two ways of `start`'s set: the more recently stored first.
    #[inline]
    fn set(&self, start: u64) -> [&Slot; 2] {
        let i = ((start >> 2) as usize & (self.mask >> 1)) << 1;
        let [a, b] = &self.slots[i..i + 2] else { unreachable!("an even index below an even length") };
        [a, b]
    }

    /// Looks up the block starting at `start` under `tag`.
    #[inline]
    pub fn get(&self, start: u64, tag: u64) -> Option<Block> {
        let b = self.lookup(start, tag);
        if b.is_some() {
            self.count_hits(1);
        }
        b
    }

    /// [`get`](Self::get) without counting the hit (for a caller that counts its hits with
    /// [`count_hits`](Self::count_hits) once per run of lookups).
    #[inline]
    pub fn lookup(&self, start: u64, tag: u64) -> Option<Block> {
        let [a, b] = self.set(start);
        let key = (start, tag | VALID);
        if a.key.get() == key {
            Some(a.block.get())
        } else if b.key.get() == key {
            Some(b.block.get())
        } else {
            None
        }
    }

    /// Adds `n` hits to the counter.
    #[inline]
    pub fn count_hits(&self, n: u64) {
        self.hits.set(self.hits.get() + n);
    }

    /// Stores a block.
    #[inline]
    pub fn put(&self, start: u64, tag: u64, block: Block) {
        let [a, b] = self.set(start);
        self.misses.set(self.misses.get() + 1);
        // the older way goes; the newer moves to its place
        b.key.set(a.key.get());
        b.block.set(a.block.get());
        a.key.set((start, tag | VALID));
        a.block.set(block);
    }

    #[inline]
    fn run_index(start: u64, key: RunKey) -> usize {
        ((start >> 2) ^ key.mix) as usize & (RUN_SLOTS - 1)
    }

    /// Replays the run of the `count` atoms `bits` (oldest in bit 0, no bits above `count`)
    /// from `start` under `tag`, if one was stored: appends its ranges to `out` with packet
    /// index `index` and returns the run.
    #[inline]
    pub fn replay_run(&self, start: u64, tag: u64, bits: u32, count: u8, out: &mut Vec<Range>, index: u64) -> Option<Run> {
        let s = self.find_run(start, tag, bits, count)?;
        let run = s.run.get();
        out.extend(self.run_ranges(s).iter().map(|&range| Range { index, range }));
        Some(run)
    }

    /// The slot holding the run of the `count` atoms `bits` from `start` under `tag` (see
    /// [`replay_run`](Self::replay_run)), if one was stored, for a caller that reads the run
    /// and its ranges ([`run_ranges`](Self::run_ranges)) itself.
    #[inline]
    pub(crate) fn find_run(&self, start: u64, tag: u64, bits: u32, count: u8) -> Option<&RunSlot> {
        Self::find_in(self.run_slots(), start, tag, RunKey::new(bits, count))
    }

    /// The run slots, for a loop of [`find_in`](Self::find_in) lookups that holds them in a
    /// register.
    #[inline]
    pub(crate) fn run_slots(&self) -> &[RunSlot; RUN_SLOTS] {
        &self.runs.slots
    }

    /// [`find_run`](Self::find_run) in `slots` ([`run_slots`](Self::run_slots)), with the atoms'
    /// key computed beforehand.
    #[inline]
    pub(crate) fn find_in(slots: &[RunSlot; RUN_SLOTS], start: u64, tag: u64, key: RunKey) -> Option<&RunSlot> {
        let s = &slots[Self::run_index(start, key)];
        if s.start.get() != start || s.atoms.get() != key.atoms || s.tag.get() != tag | VALID {
            return None;
        }
        Some(s)
    }

    /// The ranges of the run in `slot` (one [`find_run`](Self::find_run) or
    /// [`store_run`](Self::store_run) returned), borrowed: their packet index is the reader's.
    /// Runs are not stored while they are borrowed.
    #[inline]
    pub(crate) fn run_ranges(&self, slot: &RunSlot) -> Ref<'_, [InstrRange]> {
        // (masked and bounded, so the slice needs no check: the arena has `RUN_MAX` spare)
        let p = slot.pos.get() as usize & (ARENA - 1);
        let c = (slot.run.get().count as usize).min(RUN_MAX);
        Ref::map(self.runs.ranges.borrow(), |r| &r[p..][..c])
    }

    /// The records of the run in `slot` after its first range's, as many as
    /// [`RunSlot::branches`] says, then whatever follows them (a block of fixed size to copy),
    /// borrowed like [`run_ranges`](Self::run_ranges).
    #[inline(always)]
    pub(crate) fn run_inner(&self, slot: &RunSlot) -> Ref<'_, [BranchRecord; INNER_MAX]> {
        let p = slot.pos.get() as usize & (ARENA - 1);
        Ref::map(self.runs.recs.borrow(), |r| {
            let Some(a) = r[p..].first_chunk() else { unreachable!("RUN_MAX spare records") };
            a
        })
    }

    /// [`put_run`](Self::put_run) with the ranges as they are stored: the slot now holding
    /// the run, as [`find_run`](Self::find_run) returns it; `None` (not stored) while run
    /// ranges are being read.
    #[inline]
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn store_run(
        &self,
        start: u64,
        tag: u64,
        bits: u32,
        count: u8,
        run: Run,
        effect: StackEffect,
        ranges: &[InstrRange],
    ) -> Option<&RunSlot> {
        self.store_with(start, tag, bits, count, run, effect, ranges.len(), |cells| {
            for (c, r) in cells.iter_mut().zip(ranges) {
                *c = *r;
            }
        })
    }

    /// Stores a run and its ranges (`run.count` of them, their indexes ignored; see
    /// [`replay_run`](Self::replay_run)). Its blocks must be in this cache under `tag`: both
    /// are forgotten together by [`clear`](Self::clear). Not stored while run ranges are
    /// being read (by a sink they were handed to).
    #[inline]
    pub fn put_run(&self, start: u64, tag: u64, bits: u32, count: u8, run: Run, ranges: &[Range]) {
        self.store_with(start, tag, bits, count, run, StackEffect::NONE, ranges.len(), |cells| {
            for (c, r) in cells.iter_mut().zip(ranges) {
                *c = r.range;
            }
        });
    }

    /// The one rule for storing a run: `n` (= `run.count`) arena positions at the ring's
    /// head (from its start when they would pass its end), the runs whose ranges started
    /// there forgotten, `fill` writing the ranges, the slot keyed.
    #[inline]
    #[allow(clippy::too_many_arguments)]
    fn store_with(
        &self,
        start: u64,
        tag: u64,
        bits: u32,
        count: u8,
        run: Run,
        effect: StackEffect,
        n: usize,
        fill: impl FnOnce(&mut [InstrRange]),
    ) -> Option<&RunSlot> {
        let runs = &self.runs;
        let n = n.min(RUN_MAX).min(run.count as usize);
        let mut cells = runs.ranges.try_borrow_mut().ok()?;
        let mut p = runs.head.get();
        if p + n > ARENA {
            p = 0;
        }
        for (q, o) in runs.owner.iter().enumerate().skip(p).take(n) {
            let i = o.replace(NO_OWNER);
            if let Some(old) = runs.slots.get(i as usize)
                && old.pos.get() as usize == q
            {
                old.tag.set(0);
            }
        }
        fill(&mut cells[p..p + n]);
        let (inner, end) =
            if runs.ruled.get() { Self::rule_stored(&runs.recs, &cells[p..p + n], p)? } else { (0, RangeEnd::OPEN) };
        drop(cells);
        let key = RunKey::new(bits, count);
        let i = Self::run_index(start, key);
        let s = &runs.slots[i];
        if let Some(o) = runs.owner.get(p)
            && n > 0
        {
            o.set(i as u32);
        }
        runs.head.set(p + n);
        s.start.set(start);
        s.tag.set(tag | VALID);
        s.atoms.set(key.atoms);
        s.run.set(Run { count: n as u8, ..run });
        s.pos.set(p as u32);
        s.inner.set(inner as u8);
        s.end.set(end);
        if run.pops != 0 {
            let effects = runs.effects.get_or_init(|| {
                let Ok(e) = vec![Cell::new(StackEffect::NONE); RUN_SLOTS].into_boxed_slice().try_into() else {
                    unreachable!("RUN_SLOTS effects")
                };
                e
            });
            effects[i].set(effect);
        }
        Some(s)
    }

    /// perf's rule over a run's ranges `rs` from an open chain: the first range's record is
    /// the reader's to complete (`BranchRule::stored`); those after it go to the records at
    /// `p`. Returns how many, and the chain after the run; `None` while records are being
    /// read (the run is then not stored).
    #[inline(never)]
    fn rule_stored(
        recs: &RefCell<Box<[BranchRecord; ARENA + RUN_MAX]>>,
        rs: &[InstrRange],
        p: usize,
    ) -> Option<(usize, RangeEnd)> {
        let mut recs = recs.try_borrow_mut().ok()?;
        let mut rule = BranchRule::OPEN;
        let mut made = [BranchRecord::default(); RUN_MAX];
        let k = rule.ranges(rs, &mut made, |_, _| {});
        let inner = k.saturating_sub(1);
        recs[p..p + inner].copy_from_slice(&made[1..1 + inner]);
        Some((inner, rule.range_end().unwrap_or(RangeEnd::OPEN)))
    }

    /// The effect on the return stack of the run in `slot` (one this cache returned); only a
    /// run that pops ([`Run::pops`]) has one stored.
    #[inline]
    pub(crate) fn run_effect(&self, slot: &RunSlot) -> StackEffect {
        // (the slot's index: where it lies among the slots; a slot holds no index of its own)
        let i =
            (slot as *const RunSlot as usize).wrapping_sub(self.runs.slots.as_ptr() as usize) / std::mem::size_of::<RunSlot>();
        self.runs.effects.get().map_or(StackEffect::NONE, |e| e[i & (RUN_SLOTS - 1)].get())
    }

    /// From now on runs are stored with their taken branches, for a sink that takes branches
    /// (`ElementSink::takes_branches`; the decoder calls this before it reads them): the runs
    /// stored without them are forgotten, once. (A sink that takes ranges does not pay for
    /// ruling every run stored.)
    #[inline]
    pub(crate) fn rule_runs(&self) {
        if !self.runs.ruled.get() {
            self.runs.ruled.set(true);
            self.runs.slots.iter().for_each(|s| s.tag.set(0));
        }
    }

    /// Forgets everything (e.g. the code image changed).
    pub fn clear(&self) {
        self.slots.iter().for_each(|s| s.key.set((0, 0)));
        self.runs.slots.iter().for_each(|s| s.tag.set(0));
    }

    /// Lookups that hit.
    pub fn hits(&self) -> u64 {
        self.hits.get()
    }

    /// Blocks walked and stored (lookups that missed, then found a waypoint).
    pub fn misses(&self) -> u64 {
        self.misses.get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The run cache's size as [`RUN_BITS`] and [`ARENA`] state it: 64-byte slots (one cache
    /// line), 32-byte ranges and 16-byte records.
    #[test]
    fn run_cache_sizes() {
        assert_eq!(std::mem::size_of::<RunSlot>(), 64);
        assert_eq!(std::mem::size_of::<InstrRange>(), 32);
        assert_eq!(std::mem::size_of::<BranchRecord>(), 16);
        assert_eq!(std::mem::size_of::<StackEffect>(), 40);
    }

    /// A stored block is found only under the same start address and tag.
    #[test]
    fn get_put() {
        let c = BlockCache::new(4);
        let b = Block { end: 0x1010, num_instr: 4, last: InstrInfo::default() };
        c.put(0x1000, 7, b);
        assert_eq!(c.get(0x1000, 7).map(|b| b.end), Some(0x1010));
        assert!(BlockCache::new(4).get(0, 0).is_none()); // empty slots never match
        assert!(c.get(0x1000, 8).is_none());
        assert!(c.get(0x1004, 7).is_none());
        c.clear();
        assert!(c.get(0x1000, 7).is_none());
        assert_eq!((c.hits(), c.misses()), (1, 1));
    }

    /// Two blocks of one set both stay; a third evicts the older of them.
    #[test]
    fn two_ways() {
        let c = BlockCache::new(4); // 8 sets; addresses 0x20 apart share one
        let b = |end| Block { end, num_instr: 1, last: InstrInfo::default() };
        c.put(0x1000, 0, b(1));
        c.put(0x1020, 0, b(2));
        assert_eq!((c.get(0x1000, 0).map(|b| b.end), c.get(0x1020, 0).map(|b| b.end)), (Some(1), Some(2)));
        c.put(0x1040, 0, b(3));
        assert!(c.get(0x1000, 0).is_none());
        assert_eq!((c.get(0x1020, 0).map(|b| b.end), c.get(0x1040, 0).map(|b| b.end)), (Some(2), Some(3)));
        // a block of another set is untouched
        c.put(0x1004, 0, b(4));
        assert_eq!((c.get(0x1020, 0).map(|b| b.end), c.get(0x1040, 0).map(|b| b.end)), (Some(2), Some(3)));
    }

    /// A stored run replays its ranges (with the new packet index) only under the same start,
    /// tag, atom bits and count, and is forgotten with the blocks.
    #[test]
    fn runs() {
        let c = BlockCache::new(6);
        let r = |start: u64, end: u64| Range {
            index: 99,
            range: InstrRange { start, end, num_instr: ((end - start) / 4) as u32, ..Default::default() },
        };
        let run = Run { count: 2, indirect: true, links: 0b01, instructions: 6, next: 0x3008, pops: 0 };
        c.put_run(0x1000, 7, 0b11, 2, run, &[r(0x1000, 0x1010), r(0x2000, 0x2008)]);
        let mut out = vec![r(0, 4)];
        let got = c.replay_run(0x1000, 7, 0b11, 2, &mut out, 5).expect("stored run");
        assert_eq!((got.count, got.indirect, got.links, got.instructions, got.next), (2, true, 1, 6, 0x3008));
        assert_eq!(out.len(), 3);
        assert_eq!((out[1].index, out[1].range.start, out[1].range.end), (5, 0x1000, 0x1010));
        assert_eq!((out[2].index, out[2].range.start, out[2].range.end), (5, 0x2000, 0x2008));
        assert_eq!(out[0].index, 99); // what was there is untouched
        for (start, tag, bits, count) in [(0x1004, 7, 0b11, 2), (0x1000, 8, 0b11, 2), (0x1000, 7, 0b10, 2), (0x1000, 7, 0b11, 3)]
        {
            assert!(c.replay_run(start, tag, bits, count, &mut out, 5).is_none());
        }
        assert!(BlockCache::new(6).replay_run(0, 0, 0, 0, &mut out, 0).is_none()); // empty slots never match
        c.clear();
        assert!(c.replay_run(0x1000, 7, 0b11, 2, &mut out, 5).is_none());
        assert_eq!(out.len(), 3);
    }

    /// Runs share the ring of ranges: once the ring comes round to a run's ranges, the run is
    /// forgotten (never replayed with another run's ranges), and the runs written since are
    /// replayed whole, also the one that would have passed the ring's end.
    #[test]
    fn runs_in_the_ring() {
        let c = BlockCache::new(6);
        // run `i` from 0x10_0000 + 4 * i, `n(i)` ranges that name it (`end`)
        let r = |i: u64, j: u64| Range { index: 0, range: InstrRange { start: j, end: i, num_instr: 1, ..Default::default() } };
        let n = |i: u64| 1 + (i % RUN_MAX as u64) as u8;
        let start = |i: u64| 0x10_0000 + 4 * i;
        let put = |i: u64| {
            let rs: Vec<Range> = (0..n(i) as u64).map(|j| r(i, j)).collect();
            let run = Run { count: n(i), next: start(i) + 0x80, ..Run::default() };
            c.put_run(start(i), 1, 0, n(i), run, &rs);
        };
        let check = |i: u64| {
            let mut out = Vec::new();
            let run = c.replay_run(start(i), 1, 0, n(i), &mut out, 3)?;
            assert_eq!((run.count, run.next), (n(i), start(i) + 0x80));
            let want: Vec<(u64, u64)> = (0..n(i) as u64).map(|j| (j, i)).collect();
            assert_eq!(out.iter().map(|x| (x.range.start, x.range.end)).collect::<Vec<_>>(), want);
            Some(())
        };
        // (1 + ... + 8) / 8 = 4.5 ranges a run: 2 ARENA / 4.5 runs pass the ring twice
        let total = (2 * ARENA as u64 * 2) / 9;
        let mut forgotten = 0;
        for i in 0..total {
            put(i);
            assert!(check(i).is_some(), "run {i} just stored");
        }
        for i in 0..total {
            if check(i).is_none() {
                forgotten += 1;
            }
        }
        // the ring holds at most the last ARENA ranges' runs (fewer: slots are shared)
        let held = total - forgotten;
        assert!(held * 9 / 2 <= ARENA as u64 && held * 9 >= ARENA as u64, "held {held}");
        assert!(check(0).is_none());
        assert!(check(total - 1).is_some());
    }
}
