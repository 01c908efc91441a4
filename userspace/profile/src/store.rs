//! A bounded store of distinct encoded samples with repeat counts: a flat word arena with an
//! open-addressing index. [`crate::HybridProfile`] keeps two: the hybrid samples the
//! perf-script dump is written from, and the sampled stacks of `profile.pb.gz`.
//!
//! A key is a header word (stack depth, branch count, flags) followed by the encoded stack and
//! branch words. When a *new* key would push the store past its byte budget, its stack is cut
//! to the leaf frame (folded to its base context); if even that is new and the store is past
//! the budget plus an eighth (the fold reserve), the sample is dropped. Already-seen keys
//! always count exactly.

use hashbrown::HashTable;

/// Bits of an encoded address holding the link-time address.
pub(crate) const ADDR_BITS: u32 = 48;
pub(crate) const ADDR_MASK: u64 = (1 << ADDR_BITS) - 1;
/// Header flag: the sample has no call stack (branch-only / LBR-only sample); `stack[0]` is
/// the leading IP.
pub(crate) const FLAG_BRANCH_ONLY: u64 = 1 << 32;
/// Header flag: the stack was cut at a return address that follows no call.
pub(crate) const FLAG_CUT: u64 = 1 << 33;

/// Index of a binary inside one [`crate::HybridProfile`] (see
/// [`crate::HybridProfile::binaries`]).
pub type ProfileBinary = usize;

/// A resolved address: the binary (index into [`crate::HybridProfile::binaries`]) and
/// link-time address, or `None` and the low 48 bits of the runtime address when unresolved.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Loc {
    /// Binary index, or `None` when the address was not mapped.
    pub binary: Option<ProfileBinary>,
    /// Link-time address (or truncated runtime address when unresolved).
    pub addr: u64,
}

impl Loc {
    pub(crate) fn decode(w: u64) -> Self {
        let tag = (w >> ADDR_BITS) as usize;
        Loc { binary: tag.checked_sub(1), addr: w & ADDR_MASK }
    }
    /// Link-time address if this location is in binary `b`.
    pub fn in_binary(&self, b: ProfileBinary) -> Option<u64> {
        (self.binary == Some(b)).then_some(self.addr)
    }
}

/// One aggregated sample as stored.
#[derive(Clone, Copy, Debug)]
pub struct SampleRef<'a> {
    pub(crate) words: &'a [u64],
    /// How many times this exact sample was seen.
    pub count: u64,
}

impl<'a> SampleRef<'a> {
    fn n_stack(&self) -> usize {
        (self.words[0] & 0xffff) as usize
    }
    fn n_br(&self) -> usize {
        ((self.words[0] >> 16) & 0xffff) as usize
    }
    /// True for a branch-only (LBR-only, no call stack) sample: [`SampleRef::stack`] then
    /// holds just the leading IP.
    pub fn is_branch_only(&self) -> bool {
        self.words[0] & FLAG_BRANCH_ONLY != 0
    }
    /// True when the stack was cut at a return address that follows no call (its real
    /// callers are unknown): viewers mark such stacks `[truncated]`.
    pub fn is_cut(&self) -> bool {
        self.words[0] & FLAG_CUT != 0
    }
    /// Stack, leaf first (`[0]` the IP, then return addresses).
    pub fn stack(&self) -> impl ExactSizeIterator<Item = Loc> + 'a {
        let n = self.n_stack();
        self.words[1..1 + n].iter().map(|&w| Loc::decode(w))
    }
    /// Branches newest first, as (from, to).
    pub fn branches(&self) -> impl ExactSizeIterator<Item = (Loc, Loc)> + 'a {
        let s = 1 + self.n_stack();
        self.words[s..s + 2 * self.n_br()].chunks_exact(2).map(|p| (Loc::decode(p[0]), Loc::decode(p[1])))
    }
    /// Whether any address of this sample lies in binary `b`.
    pub fn touches(&self, b: ProfileBinary) -> bool {
        let tag = (b as u64 + 1) << ADDR_BITS;
        self.words[1..].iter().any(|&w| w & !ADDR_MASK == tag)
    }
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    off: usize,
    len: u32,
    hash: u64,
    count: u64,
}

/// What [`Store::insert`] did with a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stored {
    /// Counted as given (new or seen).
    Exact,
    /// Counted with its stack cut to the leaf.
    Folded,
    /// Not counted: the store is full.
    Dropped,
}

/// The store (module docs).
#[derive(Clone, Debug, Default)]
pub(crate) struct Store {
    max_bytes: usize,
    arena: Vec<u64>,
    entries: Vec<Entry>,
    index: HashTable<u32>,
}

pub(crate) fn hash_words(words: &[u64]) -> u64 {
    let mut h: u64 = 0x243f_6a88_85a3_08d3;
    for &w in words {
        h = (h.rotate_left(5) ^ w).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
    h ^ (h >> 29)
}

impl Store {
    pub(crate) fn new(max_bytes: usize) -> Self {
        Store { max_bytes, ..Default::default() }
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Allocated bytes.
    pub(crate) fn bytes_used(&self) -> usize {
        self.arena.capacity() * 8
            + self.entries.capacity() * std::mem::size_of::<Entry>()
            + self.index.capacity() * (std::mem::size_of::<u32>() + 1)
    }

    /// Bytes the budget policy accounts for (stored words and entries, not spare capacity).
    pub(crate) fn accounted_bytes(&self) -> usize {
        self.arena.len() * 8 + self.entries.len() * (std::mem::size_of::<Entry>() + 2 * std::mem::size_of::<u32>())
    }

    pub(crate) fn samples(&self) -> impl Iterator<Item = SampleRef<'_>> + '_ {
        self.entries.iter().map(|e| SampleRef { words: &self.arena[e.off..e.off + e.len as usize], count: e.count })
    }

    /// Count `key` `count` times with the budget policy; may rewrite `key` when folding.
    pub(crate) fn insert(&mut self, key: &mut Vec<u64>, count: u64) -> Stored {
        let hash = hash_words(key);
        if self.bump(hash, key, count) {
            return Stored::Exact;
        }
        let max = self.max_bytes;
        if self.accounted_bytes() + key.len() * 8 <= max {
            self.push_new(hash, key, count);
            return Stored::Exact;
        }
        // Fold to the base context: keep the leaf frame only.
        let ns = (key[0] & 0xffff) as usize;
        if ns > 1 {
            key.drain(2..1 + ns);
            key[0] = (key[0] & !0xffff) | 1;
        }
        let hash = hash_words(key);
        if self.bump(hash, key, count) {
            return Stored::Folded;
        }
        if self.accounted_bytes() + key.len() * 8 <= max + max / 8 {
            self.push_new(hash, key, count);
            Stored::Folded
        } else {
            Stored::Dropped
        }
    }

    fn bump(&mut self, hash: u64, key: &[u64], count: u64) -> bool {
        let (arena, entries) = (&self.arena, &self.entries);
        let hit = self.index.find(hash, |&i| {
            let e = &entries[i as usize];
            e.hash == hash && &arena[e.off..e.off + e.len as usize] == key
        });
        match hit {
            Some(&i) => {
                let e = &mut self.entries[i as usize];
                e.count = e.count.saturating_add(count);
                true
            }
            None => false,
        }
    }

    fn push_new(&mut self, hash: u64, key: &[u64], count: u64) {
        let off = self.arena.len();
        self.arena.extend_from_slice(key);
        let idx = self.entries.len() as u32;
        self.entries.push(Entry { off, len: key.len() as u32, hash, count });
        let entries = &self.entries;
        self.index.insert_unique(hash, idx, |&i| entries[i as usize].hash);
    }
}
