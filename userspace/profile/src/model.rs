//! The aggregated sample store behind [`HybridProfile`].

use hashbrown::HashTable;

use crate::{AddressResolver, BinaryId, BinaryInfo, Branch, HybridSample};

/// Bits of an encoded address holding the link-time address.
const ADDR_BITS: u32 = 48;
const ADDR_MASK: u64 = (1 << ADDR_BITS) - 1;
/// Header flag: the sample has no call stack (branch-only / LBR-only sample); `stack[0]` is
/// the leading IP.
const FLAG_BRANCH_ONLY: u64 = 1 << 32;
const FLAG_CUT: u64 = 1 << 33;

/// Bounds on what one profile may hold (see the crate docs for the policy).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProfileLimits {
    /// Soft bound on the sample store in bytes; new samples past it are folded.
    pub max_bytes: usize,
    /// Frames kept per stack (leaf-most).
    pub max_stack_depth: usize,
    /// Branches kept per sample (newest).
    pub max_branches: usize,
}

impl Default for ProfileLimits {
    fn default() -> Self {
        Self { max_bytes: 512 << 20, max_stack_depth: 256, max_branches: 64 }
    }
}

/// Counters of what [`HybridProfile`] did with its input.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProfileStats {
    /// Samples accepted (including their repeat counts), folded ones included.
    pub samples: u64,
    /// Samples whose stack was cut to the leaf frame because the store was full.
    pub folded: u64,
    /// Samples dropped because even the folded sample did not fit.
    pub dropped: u64,
    /// Samples with an empty stack and no branches (nothing to record).
    pub empty: u64,
    /// Samples whose stack was deeper than `max_stack_depth`.
    pub stack_truncated: u64,
    /// Samples with more than `max_branches` branches.
    pub branches_truncated: u64,
    /// Addresses the resolver did not map to a binary.
    pub unresolved_addresses: u64,
}

/// Index of a binary inside one [`HybridProfile`] (see [`HybridProfile::binaries`]).
pub type ProfileBinary = usize;

/// A resolved address: the binary (index into [`HybridProfile::binaries`]) and link-time
/// address, or `None` and the low 48 bits of the runtime address when unresolved.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Loc {
    /// Binary index, or `None` when the address was not mapped.
    pub binary: Option<ProfileBinary>,
    /// Link-time address (or truncated runtime address when unresolved).
    pub addr: u64,
}

impl Loc {
    fn decode(w: u64) -> Self {
        let tag = (w >> ADDR_BITS) as usize;
        Loc { binary: tag.checked_sub(1), addr: w & ADDR_MASK }
    }
    /// Link-time address if this location is in binary `b`.
    pub fn in_binary(&self, b: ProfileBinary) -> Option<u64> {
        (self.binary == Some(b)).then_some(self.addr)
    }
}

/// One aggregated sample as stored in the profile.
#[derive(Clone, Copy, Debug)]
pub struct SampleRef<'a> {
    words: &'a [u64],
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

/// Runtime addresses that resolve alike, the offset to their link-time address and the
/// binary's tag (see [`HybridProfile::encode`]).
type Span = (std::ops::Range<u64>, u64, u64);

/// Per-binary, per-context aggregated hybrid samples. See the crate docs.
#[derive(Debug, Clone)]
pub struct HybridProfile {
    limits: ProfileLimits,
    binaries: Vec<BinaryInfo>,
    arena: Vec<u64>,
    entries: Vec<Entry>,
    index: HashTable<u32>,
    stats: ProfileStats,
    scratch: Vec<u64>,
    /// Resolver BinaryId -> our index + 1 (0 = not interned yet), for the last resolver.
    id_cache: Vec<u32>,
    last_resolver: usize,
}

impl Default for HybridProfile {
    fn default() -> Self {
        Self::new(ProfileLimits::default())
    }
}

fn hash_words(words: &[u64]) -> u64 {
    let mut h: u64 = 0x243f_6a88_85a3_08d3;
    for &w in words {
        h = (h.rotate_left(5) ^ w).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
    h ^ (h >> 29)
}

impl HybridProfile {
    /// An empty profile with the given limits.
    pub fn new(limits: ProfileLimits) -> Self {
        Self {
            limits,
            binaries: Vec::new(),
            arena: Vec::new(),
            entries: Vec::new(),
            index: HashTable::new(),
            stats: ProfileStats::default(),
            scratch: Vec::with_capacity(256),
            id_cache: Vec::new(),
            last_resolver: 0,
        }
    }

    /// The limits this profile enforces.
    pub fn limits(&self) -> ProfileLimits {
        self.limits
    }

    /// What happened to the input so far.
    pub fn stats(&self) -> ProfileStats {
        self.stats
    }

    /// Binaries seen so far; a [`Loc::binary`] indexes this slice.
    pub fn binaries(&self) -> &[BinaryInfo] {
        &self.binaries
    }

    /// Number of distinct stored samples.
    pub fn distinct_samples(&self) -> usize {
        self.entries.len()
    }

    /// Total sample count (sum of repeat counts).
    pub fn total_samples(&self) -> u64 {
        self.entries.iter().map(|e| e.count).sum()
    }

    /// Approximate bytes used by the sample store.
    pub fn bytes_used(&self) -> usize {
        self.arena.capacity() * 8
            + self.entries.capacity() * std::mem::size_of::<Entry>()
            + self.index.capacity() * (std::mem::size_of::<u32>() + 1)
    }

    /// Bytes the budget policy accounts for (stored words and entries, not spare capacity).
    pub fn accounted_bytes(&self) -> usize {
        self.arena.len() * 8 + self.entries.len() * (std::mem::size_of::<Entry>() + 2 * std::mem::size_of::<u32>())
    }

    /// Iterate over the stored samples, in first-seen order.
    pub fn samples(&self) -> impl Iterator<Item = SampleRef<'_>> + '_ {
        self.entries.iter().map(|e| SampleRef { words: &self.arena[e.off..e.off + e.len as usize], count: e.count })
    }

    /// Index of a binary, adding it if new (matched by build-id when both have one, else by
    /// path).
    pub fn intern_binary(&mut self, info: &BinaryInfo) -> ProfileBinary {
        let found = self.binaries.iter().position(|b| match (&b.build_id, &info.build_id) {
            (Some(x), Some(y)) => x == y,
            _ => b.path == info.path,
        });
        match found {
            Some(i) => i,
            None => {
                self.binaries.push(info.clone());
                self.binaries.len() - 1
            }
        }
    }

    /// The encoded word of a runtime address; `span` is the last resolved span of this
    /// sample's addresses ([`AddressResolver::resolve_span`]: runtime range, offset to the
    /// link-time address, our binary tag), tried before the resolver.
    #[inline(always)]
    fn encode(&mut self, addr: u64, r: &dyn AddressResolver, span: &mut Span) -> u64 {
        if span.0.contains(&addr) {
            let link = addr.wrapping_add(span.1);
            if link <= ADDR_MASK {
                return span.2 | link;
            }
        }
        self.encode_new_span(addr, r, span)
    }

    /// [`encode`](Self::encode) of an address outside the span: the resolver's answer.
    #[inline(never)]
    fn encode_new_span(&mut self, addr: u64, r: &dyn AddressResolver, span: &mut Span) -> u64 {
        match r.resolve_span(addr) {
            Some((BinaryId(id), link, range)) if link <= ADDR_MASK => {
                let id = id as usize;
                let cached = self.id_cache.get(id).copied().unwrap_or(0);
                let ours = if cached != 0 {
                    cached as u64
                } else if let Some(info) = r.binary(BinaryId(id as u32)) {
                    let idx = self.intern_binary(info) as u32 + 1;
                    if self.id_cache.len() <= id {
                        self.id_cache.resize(id + 1, 0);
                    }
                    self.id_cache[id] = idx;
                    idx as u64
                } else {
                    self.stats.unresolved_addresses += 1;
                    return addr & ADDR_MASK;
                };
                *span = (range, link.wrapping_sub(addr), ours << ADDR_BITS);
                (ours << ADDR_BITS) | link
            }
            _ => {
                self.stats.unresolved_addresses += 1;
                addr & ADDR_MASK
            }
        }
    }

    fn check_resolver(&mut self, r: &dyn AddressResolver) {
        let p = r as *const dyn AddressResolver as *const () as usize;
        if p != self.last_resolver {
            self.last_resolver = p;
            self.id_cache.clear();
        }
    }

    /// Forget the resolver-to-profile binary id cache. The cache is keyed by the resolver's
    /// address and cleared when a different resolver is passed; call this if a resolver is
    /// dropped and a new one (with other `BinaryId`s) may be created at the same address.
    pub fn forget_resolver(&mut self) {
        self.last_resolver = 0;
        self.id_cache.clear();
    }

    /// Aggregate one hybrid sample (runtime addresses) once. The resolver's `BinaryId`s must be
    /// stable while it is used with this profile (see [`HybridProfile::forget_resolver`]).
    pub fn add(&mut self, sample: &HybridSample<'_>, resolver: &dyn AddressResolver) {
        self.add_counted(sample, resolver, 1)
    }

    /// Aggregate one hybrid sample seen `count` times.
    pub fn add_counted(&mut self, sample: &HybridSample<'_>, resolver: &dyn AddressResolver, count: u64) {
        self.add_inner(sample.stack, sample.branches, 0, resolver, count)
    }

    /// [`add`](Self::add) of a sample whose stack was cut at a return address that follows no
    /// call ([`SampleRef::is_cut`]).
    pub fn add_cut(&mut self, sample: &HybridSample<'_>, resolver: &dyn AddressResolver) {
        self.add_inner(sample.stack, sample.branches, FLAG_CUT, resolver, 1)
    }

    /// Aggregate a branch-only sample (no call stack: LBR/BRBE without stacks, perf script
    /// `-F ip,brstack`), `ip` being the sampled IP, seen `count` times.
    pub fn add_branch_only(&mut self, ip: u64, branches: &[Branch], resolver: &dyn AddressResolver, count: u64) {
        self.add_inner(&[ip], branches, FLAG_BRANCH_ONLY, resolver, count)
    }

    fn add_inner(&mut self, stack: &[u64], branches: &[Branch], flags: u64, r: &dyn AddressResolver, count: u64) {
        if count == 0 {
            return;
        }
        if stack.is_empty() && branches.is_empty() {
            self.stats.empty += count;
            return;
        }
        self.check_resolver(r);
        let ns = stack.len().min(self.limits.max_stack_depth).min(0xffff);
        let nb = branches.len().min(self.limits.max_branches).min(0xffff);
        if ns < stack.len() {
            self.stats.stack_truncated += count;
        }
        if nb < branches.len() {
            self.stats.branches_truncated += count;
        }
        let mut key = std::mem::take(&mut self.scratch);
        key.clear();
        key.push(ns as u64 | (nb as u64) << 16 | flags);
        let mut span: Span = (0..0, 0, 0);
        for &a in &stack[..ns] {
            let w = self.encode(a, r, &mut span);
            key.push(w);
        }
        for b in &branches[..nb] {
            let f = self.encode(b.from, r, &mut span);
            let t = self.encode(b.to, r, &mut span);
            key.push(f);
            key.push(t);
        }
        self.insert_key(&mut key, count);
        self.scratch = key;
    }

    /// Insert an encoded key with the budget policy; may rewrite `key` when folding.
    fn insert_key(&mut self, key: &mut Vec<u64>, count: u64) {
        self.stats.samples += count;
        let hash = hash_words(key);
        if self.bump(hash, key, count) {
            return;
        }
        let max = self.limits.max_bytes;
        if self.accounted_bytes() + key.len() * 8 <= max {
            self.push_new(hash, key, count);
            return;
        }
        // Fold to the base context: keep the leaf frame only.
        let ns = (key[0] & 0xffff) as usize;
        if ns > 1 {
            key.drain(2..1 + ns);
            key[0] = (key[0] & !0xffff) | 1;
        }
        self.stats.folded += count;
        let hash = hash_words(key);
        if self.bump(hash, key, count) {
            return;
        }
        if self.accounted_bytes() + key.len() * 8 <= max + max / 8 {
            self.push_new(hash, key, count);
        } else {
            self.stats.dropped += count;
            self.stats.samples -= count;
            self.stats.folded -= count;
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

    /// Add every sample of `other` (binaries matched by build-id/path). Without folding the
    /// result equals the profile of the union of both inputs.
    pub fn merge(&mut self, other: &HybridProfile) {
        let map: Vec<u64> = other.binaries.iter().map(|b| self.intern_binary(b) as u64 + 1).collect();
        let mut key = std::mem::take(&mut self.scratch);
        for s in other.samples() {
            key.clear();
            key.push(s.words[0]);
            for &w in &s.words[1..] {
                let tag = (w >> ADDR_BITS) as usize;
                key.push(if tag == 0 { w } else { (map[tag - 1] << ADDR_BITS) | (w & ADDR_MASK) });
            }
            self.insert_key(&mut key, s.count);
        }
        self.scratch = key;
        let o = other.stats;
        self.stats.empty += o.empty;
        self.stats.dropped += o.dropped;
        self.stats.folded += o.folded;
        self.stats.stack_truncated += o.stack_truncated;
        self.stats.branches_truncated += o.branches_truncated;
        self.stats.unresolved_addresses += o.unresolved_addresses;
    }

    /// Sample count per calling context of binary `b`: the context is the sample's stack
    /// (root first, leaf last) as locations; branch-only samples count under their IP alone.
    pub fn context_counts(&self, b: ProfileBinary) -> std::collections::BTreeMap<Vec<Loc>, u64> {
        let mut out = std::collections::BTreeMap::new();
        for s in self.samples().filter(|s| s.touches(b)) {
            let mut ctx: Vec<Loc> = s.stack().collect();
            ctx.reverse();
            *out.entry(ctx).or_insert(0) += s.count;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::IdentityResolver;

    fn bin() -> IdentityResolver {
        IdentityResolver::new(vec![BinaryInfo {
            path: "/x/app".into(),
            build_id: Some(vec![1, 2]),
            exec_segments: vec![crate::ExecSegment { vaddr: 0x1000, memsz: 0x1000, offset: 0x1000 }],
            code_ranges: vec![(0x1000, 0x2000)],
            is_pie: false,
        }])
    }

    /// Repeated identical samples aggregate into one entry whose count is the repeat count.
    #[test]
    fn dedups_identical_samples() {
        let r = bin();
        let mut p = HybridProfile::default();
        let br = [Branch { from: 0x1010, to: 0x1100 }];
        for _ in 0..3 {
            p.add(&HybridSample { stack: &[0x1104, 0x1014], branches: &br }, &r);
        }
        p.add(&HybridSample { stack: &[0x1108, 0x1014], branches: &br }, &r);
        assert_eq!(p.distinct_samples(), 2);
        assert_eq!(p.total_samples(), 4);
        let s = p.samples().next().unwrap();
        assert_eq!(s.count, 3);
        assert_eq!(s.stack().map(|l| l.addr).collect::<Vec<_>>(), vec![0x1104, 0x1014]);
        assert_eq!(s.branches().next().unwrap().1, Loc { binary: Some(0), addr: 0x1100 });
    }

    /// A resolver reporting spans ([`AddressResolver::resolve_span`]) gives the profile the
    /// same words and counts as one resolving each address alone: two binaries, one at a bias
    /// that takes part of its span past the 48 address bits, and unmapped addresses.
    #[test]
    fn spans_encode_like_single_addresses() {
        struct Spans(bool, Vec<BinaryInfo>);
        impl AddressResolver for Spans {
            fn resolve(&self, a: u64) -> Option<(BinaryId, u64)> {
                self.resolve_span(a).map(|(b, l, _)| (b, l))
            }
            fn resolve_span(&self, a: u64) -> Option<(BinaryId, u64, std::ops::Range<u64>)> {
                let (b, lo, hi, bias) = match a {
                    0x1000..0x2000 => (0, 0x1000, 0x2000, 0u64),
                    0x5000..0x6000 => (1, 0x5000, 0x6000, ADDR_MASK - 0x5800),
                    _ => return None,
                };
                let span = if self.0 { lo..hi } else { a..a + 1 };
                Some((BinaryId(b), a.wrapping_add(bias), span))
            }
            fn binary(&self, id: BinaryId) -> Option<&BinaryInfo> {
                self.1.get(id.0 as usize)
            }
        }
        let infos = vec![bin().binary(BinaryId(0)).unwrap().clone(), BinaryInfo { path: "/x/lib".into(), ..Default::default() }];
        let (wide, alone) = (Spans(true, infos.clone()), Spans(false, infos));
        let (mut p, mut q) = (HybridProfile::default(), HybridProfile::default());
        let addrs = [0x1100, 0x5100, 0x5900, 0x1200, 0x9000, 0x57fc, 0x5800, 0x1ffc, 0x5804, 0x2000];
        for i in 0..addrs.len() {
            let br: Vec<Branch> = addrs.windows(2).skip(i).map(|w| Branch { from: w[0], to: w[1] }).collect();
            let sample = HybridSample { stack: &addrs[i..], branches: &br };
            p.add(&sample, &wide);
            q.add(&sample, &alone);
        }
        let words = |p: &HybridProfile| p.samples().map(|s| (s.words.to_vec(), s.count)).collect::<Vec<_>>();
        assert_eq!(words(&p), words(&q));
        assert_eq!(p.stats(), q.stats());
        assert!(p.stats().unresolved_addresses > 10, "{:?}", p.stats());
    }

    /// Unmapped addresses are kept as unresolved and counted.
    #[test]
    fn unresolved_addresses_are_counted() {
        let r = bin();
        let mut p = HybridProfile::default();
        p.add(&HybridSample { stack: &[0x1104, 0x7f00_0000_1234], branches: &[] }, &r);
        assert_eq!(p.stats().unresolved_addresses, 1);
        let s = p.samples().next().unwrap();
        assert_eq!(s.stack().nth(1).unwrap().binary, None);
    }

    /// Past the byte budget new samples fold to their leaf frame, and are dropped past the
    /// reserve, while seen samples keep counting exactly.
    #[test]
    fn budget_folds_then_drops() {
        let r = bin();
        let mut p = HybridProfile::new(ProfileLimits { max_bytes: 4096, ..Default::default() });
        let mut i = 0u64;
        while p.stats().folded == 0 {
            p.add(&HybridSample { stack: &[0x1100, 0x1000 + i % 0x1000, 0x1000 + i / 0x1000], branches: &[] }, &r);
            i += 1;
        }
        let folded = p.samples().last().unwrap();
        assert_eq!(folded.stack().len(), 1);
        let first = HybridSample { stack: &[0x1100, 0x1000, 0x1000], branches: &[] };
        let before = p.samples().next().unwrap().count;
        p.add(&first, &r);
        assert_eq!(p.samples().next().unwrap().count, before + 1);
        for j in 0..10_000u64 {
            p.add(&HybridSample { stack: &[0x1000 + j % 0x1000, 0x1000 + j / 0x1000 + 7], branches: &[] }, &r);
        }
        assert!(p.stats().dropped > 0);
        assert!(p.accounted_bytes() <= 4096 + 4096 / 8, "bytes {}", p.accounted_bytes());
        assert_eq!(p.stats().samples, p.total_samples());
    }

    /// Merging two profiles gives the same samples and counts as adding both inputs to one.
    #[test]
    fn merge_equals_union() {
        let r = bin();
        let s1 = HybridSample { stack: &[0x1100, 0x1010], branches: &[Branch { from: 0x1010, to: 0x1100 }] };
        let s2 = HybridSample { stack: &[0x1200], branches: &[] };
        let (mut a, mut b, mut u) = (HybridProfile::default(), HybridProfile::default(), HybridProfile::default());
        a.add(&s1, &r);
        b.add(&s1, &r);
        b.add(&s2, &r);
        for s in [&s1, &s1, &s2] {
            u.add(s, &r);
        }
        a.merge(&b);
        let dump = |p: &HybridProfile| {
            let mut v: Vec<_> = p.samples().map(|s| (s.words.to_vec(), s.count)).collect();
            v.sort();
            v
        };
        assert_eq!(dump(&a), dump(&u));
    }
}
