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

use std::cell::{Cell, Ref, RefCell};

use crate::elements::{InstrRange, Range};
use crate::insn::InstrInfo;

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

/// A slot: key (start, tag with bit 63 set; 0 = empty) and block side by side, so a lookup
/// touches one place.
struct Slot {
    key: Cell<(u64, u64)>,
    block: Cell<Block>,
}

/// Most atoms one [`Run`] covers.
pub const RUN_MAX: usize = 8;

/// Entries of the run cache (2^12), whatever the size of the block cache: a constant, so a
/// lookup needs no mask loaded and no bounds check.
const RUN_BITS: u32 = 12;
const RUN_SLOTS: usize = 1 << RUN_BITS;

/// What a run of atoms from a known A64 address did, all its blocks cached: the ranges in
/// order (their packet index to be filled in, see [`RunSlot::range`]), which of them pushed
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
    /// Instructions in the ranges (at most `RUN_MAX` walks of at most `walk::MAX_WALK` each).
    pub instructions: u32,
    /// The address after the run (after the indirect branch when `indirect`).
    pub next: u64,
}

/// A stored run: key (start, tag with bit 63 set, atom bits | count << 32), the run and its
/// ranges (in a `RefCell`, so a reader can hand them on as a slice without a copy).
pub(crate) struct RunSlot {
    start: Cell<u64>,
    tag: Cell<u64>,
    atoms: Cell<u64>,
    run: Cell<Run>,
    ranges: RefCell<[InstrRange; RUN_MAX]>,
}

impl RunSlot {
    #[inline]
    fn set_key(&self, start: u64, tag: u64, bits: u32, count: u8, run: Run) {
        self.start.set(start);
        self.tag.set(tag | VALID);
        self.atoms.set(bits as u64 | (count as u64) << 32);
        self.run.set(run);
    }

    /// The run.
    #[inline]
    pub(crate) fn run(&self) -> Run {
        self.run.get()
    }

    /// Its ranges (the first `run().count` of them), borrowed: their packet index is the
    /// reader's.
    #[inline]
    pub(crate) fn ranges(&self) -> Ref<'_, [InstrRange; RUN_MAX]> {
        self.ranges.borrow()
    }
}

/// The cache.
pub struct BlockCache {
    slots: Box<[Slot]>,
    mask: usize,
    runs: Box<[RunSlot; RUN_SLOTS]>,
    hits: Cell<u64>,
    misses: Cell<u64>,
}

impl BlockCache {
    /// A cache with `2^bits` entries (at least 2: one set).
    pub fn new(bits: u32) -> Self {
        let n = 1usize << bits.clamp(1, 24);
        let runs: Box<[RunSlot]> = (0..RUN_SLOTS)
            .map(|_| RunSlot {
                start: Cell::new(0),
                tag: Cell::new(0),
                atoms: Cell::new(0),
                run: Cell::new(Run::default()),
                ranges: Default::default(),
            })
            .collect();
        let Ok(runs) = runs.try_into() else { unreachable!("RUN_SLOTS slots") };
        BlockCache {
            slots: (0..n).map(|_| Slot { key: Cell::new((0, 0)), block: Cell::new(Block::default()) }).collect(),
            mask: n - 1,
            runs,
            hits: Cell::new(0),
            misses: Cell::new(0),
        }
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
    fn run_slot(&self, start: u64, bits: u32, count: u8) -> &RunSlot {
        let h = (start >> 2) ^ (bits as u64).wrapping_mul(0x9e37_79b9) ^ ((count as u64) << 7);
        &self.runs[h as usize & (RUN_SLOTS - 1)]
    }

    /// Replays the run of the `count` atoms `bits` (oldest in bit 0, no bits above `count`)
    /// from `start` under `tag`, if one was stored: appends its ranges to `out` with packet
    /// index `index` and returns the run.
    #[inline]
    pub fn replay_run(&self, start: u64, tag: u64, bits: u32, count: u8, out: &mut Vec<Range>, index: u64) -> Option<Run> {
        let s = self.find_run(start, tag, bits, count)?;
        let run = s.run.get();
        out.extend(s.ranges()[..run.count as usize].iter().map(|&range| Range { index, range }));
        Some(run)
    }

    /// The slot holding the run of the `count` atoms `bits` from `start` under `tag` (see
    /// [`replay_run`](Self::replay_run)), if one was stored, for a caller that reads the run
    /// and its ranges itself.
    #[inline]
    pub(crate) fn find_run(&self, start: u64, tag: u64, bits: u32, count: u8) -> Option<&RunSlot> {
        let s = self.run_slot(start, bits, count);
        if s.start.get() != start || s.tag.get() != tag | VALID || s.atoms.get() != bits as u64 | (count as u64) << 32 {
            return None;
        }
        Some(s)
    }

    /// [`put_run`](Self::put_run) with the ranges as they are stored: the slot now holding
    /// the run, as [`find_run`](Self::find_run) returns it; `None` (not stored) while the
    /// slot's ranges are being read.
    #[inline]
    pub(crate) fn store_run(
        &self,
        start: u64,
        tag: u64,
        bits: u32,
        count: u8,
        run: Run,
        ranges: &[InstrRange],
    ) -> Option<&RunSlot> {
        let s = self.run_slot(start, bits, count);
        let mut cells = s.ranges.try_borrow_mut().ok()?;
        for (c, r) in cells.iter_mut().zip(ranges) {
            *c = *r;
        }
        drop(cells);
        s.set_key(start, tag, bits, count, run);
        Some(s)
    }

    /// Stores a run and its ranges (`run.count` of them, their indexes ignored; see
    /// [`replay_run`](Self::replay_run)). Its blocks must be in this cache under `tag`: both
    /// are forgotten together by [`clear`](Self::clear). Not stored while the slot's ranges
    /// are being read (by a sink they were handed to).
    #[inline]
    pub fn put_run(&self, start: u64, tag: u64, bits: u32, count: u8, run: Run, ranges: &[Range]) {
        let s = self.run_slot(start, bits, count);
        let Ok(mut cells) = s.ranges.try_borrow_mut() else { return };
        for (c, r) in cells.iter_mut().zip(ranges) {
            *c = r.range;
        }
        drop(cells);
        s.set_key(start, tag, bits, count, run);
    }

    /// Forgets everything (e.g. the code image changed).
    pub fn clear(&self) {
        self.slots.iter().for_each(|s| s.key.set((0, 0)));
        self.runs.iter().for_each(|s| s.tag.set(0));
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
        let run = Run { count: 2, indirect: true, links: 0b01, instructions: 6, next: 0x3008 };
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
}
