//! Per-image decode cache: start address -> walked block (the run of instructions up to and
//! including the next waypoint). Hot code is then walked once; later atoms on the same block
//! cost one table lookup instead of one instruction decode per instruction.
//!
//! Direct-mapped, fixed size (bounded memory, no allocation after construction). Entries are
//! tagged with the memory space and context ID that selected the code and with the decoder's
//! instruction-classification options, so different processes mapping different code at the
//! same address, or decoders with different options, do not collide.
//!
//! A cache belongs to a code image, not to a decoder: every decoder of one image (one per
//! trace ID and buffer) shares one ([`SharedBlockCache`], [`crate::decoder::Decoder::with_cache`]),
//! so memory does not grow with the number of trace IDs times buffers.

use std::cell::Cell;

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

/// Entries of the default cache (2^15: 32,768 blocks, about 1.5 MiB).
pub const DEFAULT_BITS: u32 = 15;

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

/// The cache.
pub struct BlockCache {
    slots: Box<[Slot]>,
    mask: usize,
    hits: Cell<u64>,
    misses: Cell<u64>,
}

impl BlockCache {
    /// A cache with `2^bits` entries.
    pub fn new(bits: u32) -> Self {
        let n = 1usize << bits.min(24);
        BlockCache {
            slots: (0..n).map(|_| Slot { key: Cell::new((0, 0)), block: Cell::new(Block::default()) }).collect(),
            mask: n - 1,
            hits: Cell::new(0),
            misses: Cell::new(0),
        }
    }

    #[inline]
    fn slot(&self, start: u64) -> &Slot {
        &self.slots[(start >> 2) as usize & self.mask]
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
        let s = self.slot(start);
        if s.key.get() == (start, tag | VALID) { Some(s.block.get()) } else { None }
    }

    /// Adds `n` hits to the counter.
    #[inline]
    pub fn count_hits(&self, n: u64) {
        self.hits.set(self.hits.get() + n);
    }

    /// Stores a block.
    #[inline]
    pub fn put(&self, start: u64, tag: u64, block: Block) {
        let s = self.slot(start);
        self.misses.set(self.misses.get() + 1);
        s.key.set((start, tag | VALID));
        s.block.set(block);
    }

    /// Forgets everything (e.g. the code image changed).
    pub fn clear(&self) {
        self.slots.iter().for_each(|s| s.key.set((0, 0)));
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
}
