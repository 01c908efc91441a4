//! [`HybridProfile`]: resolves each sample's addresses once, then counts it in the per-binary
//! aggregation ([`crate::agg`]), the sampled-stack store (`profile.pb.gz`) and the bounded
//! sample store (the perf-script dump).

use std::sync::Arc;

use crate::agg::{AggStats, BinaryAgg, Budget, Scratch};
use crate::facts::{CodeFacts, SectionFacts};
use crate::store::{ADDR_BITS, ADDR_MASK, FLAG_BRANCH_ONLY, FLAG_CUT, ProfileBinary, SampleRef, Store, Stored};
use crate::{AddressResolver, BinaryId, BinaryInfo, Branch, HybridSample};

/// Which samples the sample store (the perf-script dump) keeps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KeepSamples {
    /// Samples touching a binary whose code facts say it needs them
    /// ([`CodeFacts::needs_samples`]: pseudo-probe binaries, binaries without code facts).
    #[default]
    Needed,
    /// Every sample with branches.
    All,
}

/// Bounds on what one profile may hold (see the crate docs for the policy).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProfileLimits {
    /// Budget in bytes of the aggregated counters, and separately of the sampled stacks (see
    /// the crate docs for what happens past it; all counted in [`ProfileStats`]).
    pub max_bytes: usize,
    /// Budget in bytes of the store of distinct hybrid samples the perf-script dump is written
    /// from: past it, new samples fold to their leaf frame, then are dropped. 0 keeps none.
    pub max_sample_bytes: usize,
    /// Which samples the sample store keeps.
    pub keep_samples: KeepSamples,
    /// Frames kept per stack (leaf-most).
    pub max_stack_depth: usize,
    /// Branches kept per sample (newest).
    pub max_branches: usize,
}

impl Default for ProfileLimits {
    fn default() -> Self {
        Self {
            max_bytes: 512 << 20,
            max_sample_bytes: 512 << 20,
            keep_samples: KeepSamples::Needed,
            max_stack_depth: 256,
            max_branches: 64,
        }
    }
}

/// Counters of what [`HybridProfile`] did with its input.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProfileStats {
    /// Samples accepted (including their repeat counts).
    pub samples: u64,
    /// Samples the sample store (perf-script dump) keeps with their stack cut to the leaf
    /// frame because it was full.
    pub folded: u64,
    /// Samples the sample store does not keep because even the folded sample did not fit (or
    /// it keeps none: [`ProfileLimits::max_sample_bytes`] 0). The counters have them.
    pub dropped: u64,
    /// Samples with branches the sample store does not keep because no binary of theirs
    /// needs them ([`KeepSamples::Needed`]).
    pub not_kept: u64,
    /// Sampled stacks kept cut to their leaf frame (budget).
    pub stacks_folded: u64,
    /// Sampled stacks not kept (budget).
    pub stacks_dropped: u64,
    /// Samples with an empty stack and no branches (nothing to record).
    pub empty: u64,
    /// Samples whose stack was deeper than `max_stack_depth`.
    pub stack_truncated: u64,
    /// Samples with more than `max_branches` branches.
    pub branches_truncated: u64,
    /// Addresses the resolver did not map to a binary.
    pub unresolved_addresses: u64,
    /// The aggregation's budget counters, summed over binaries.
    pub agg: AggStats,
}

/// Code facts for a binary the profile meets for the first time (`None`: only its sections
/// are known, [`SectionFacts`]).
pub type FactsProvider = Arc<dyn Fn(&BinaryInfo) -> Option<Arc<dyn CodeFacts>> + Send + Sync>;

/// Runtime addresses that resolve alike (`lo .. lo + len`, every one of them within the 48
/// link-time address bits), the offset to their link-time address and the binary's tag (see
/// [`HybridProfile::encode`]).
#[derive(Clone, Copy, Default)]
struct Span {
    lo: u64,
    len: u64,
    off: u64,
    tag: u64,
}

/// The profile (crate docs).
#[derive(Clone)]
pub struct HybridProfile {
    limits: ProfileLimits,
    binaries: Vec<BinaryInfo>,
    aggs: Vec<BinaryAgg>,
    samples: Store,
    stacks: Store,
    stats: ProfileStats,
    provider: Option<FactsProvider>,
    scratch: Vec<u64>,
    stack_key: Vec<u64>,
    tags: Vec<u64>,
    agg_scratch: Scratch,
    /// Resolver BinaryId -> our index + 1 (0 = not interned yet), for the last resolver.
    id_cache: Vec<u32>,
    last_resolver: usize,
}

impl std::fmt::Debug for HybridProfile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HybridProfile")
            .field("limits", &self.limits)
            .field("binaries", &self.binaries)
            .field("aggs", &self.aggs)
            .field("samples", &self.samples.len())
            .field("stacks", &self.stacks.len())
            .field("stats", &self.stats)
            .finish()
    }
}

impl Default for HybridProfile {
    fn default() -> Self {
        Self::new(ProfileLimits::default())
    }
}

impl HybridProfile {
    /// An empty profile with the given limits.
    pub fn new(limits: ProfileLimits) -> Self {
        Self {
            limits,
            binaries: Vec::new(),
            aggs: Vec::new(),
            samples: Store::new(limits.max_sample_bytes),
            stacks: Store::new(limits.max_bytes),
            stats: ProfileStats::default(),
            provider: None,
            scratch: Vec::with_capacity(256),
            stack_key: Vec::with_capacity(256),
            tags: Vec::with_capacity(8),
            agg_scratch: Scratch::default(),
            id_cache: Vec::new(),
            last_resolver: 0,
        }
    }

    /// Where the code facts of binaries met from now on come from (the aggregation needs them
    /// online; without, a binary gets [`SectionFacts`]).
    pub fn set_facts_provider(&mut self, p: FactsProvider) {
        self.provider = Some(p);
    }

    /// The limits this profile enforces.
    pub fn limits(&self) -> ProfileLimits {
        self.limits
    }

    /// What happened to the input so far.
    pub fn stats(&self) -> ProfileStats {
        let mut s = self.stats;
        for a in &self.aggs {
            let o = a.stats();
            s.agg.samples_dropped += o.samples_dropped;
            s.agg.counts_folded += o.counts_folded;
            s.agg.counts_dropped += o.counts_dropped;
            s.agg.contexts_folded += o.contexts_folded;
        }
        s
    }

    /// Binaries seen so far; a [`crate::Loc::binary`] indexes this slice.
    pub fn binaries(&self) -> &[BinaryInfo] {
        &self.binaries
    }

    /// The aggregated counters of binary `b`.
    pub fn agg(&self, b: ProfileBinary) -> &BinaryAgg {
        &self.aggs[b]
    }

    /// Number of distinct samples in the sample store.
    pub fn distinct_samples(&self) -> usize {
        self.samples.len()
    }

    /// Distinct entries of the aggregation (tuples, contexts and counts of every binary) and
    /// of the sampled-stack store: what the profile grows by.
    pub fn distinct_entries(&self) -> usize {
        self.stacks.len() + self.aggs.iter().map(|a| a.tuples().len() + a.context_count() + a.count_entries()).sum::<usize>()
    }

    /// Samples accepted (sum of repeat counts).
    pub fn total_samples(&self) -> u64 {
        self.stats.samples
    }

    /// Approximate bytes allocated by the profile.
    pub fn bytes_used(&self) -> usize {
        self.samples.bytes_used() + self.stacks.bytes_used() + self.aggs.iter().map(BinaryAgg::bytes_used).sum::<usize>()
    }

    /// Bytes the counters' budget accounts for.
    pub fn accounted_bytes(&self) -> usize {
        self.aggs.iter().map(BinaryAgg::accounted_bytes).sum::<usize>()
    }

    /// Bytes the sampled stacks' budget accounts for.
    pub fn stack_bytes(&self) -> usize {
        self.stacks.accounted_bytes()
    }

    /// Bytes the sample store accounts for.
    pub fn sample_bytes(&self) -> usize {
        self.samples.accounted_bytes()
    }

    /// The stored hybrid samples (the perf-script dump's), in first-seen order.
    pub fn samples(&self) -> impl Iterator<Item = SampleRef<'_>> + '_ {
        self.samples.samples()
    }

    /// The sampled stacks (no branches; synthesized samples not included), in first-seen
    /// order.
    pub fn stacks(&self) -> impl Iterator<Item = SampleRef<'_>> + '_ {
        self.stacks.samples()
    }

    /// Index of a binary, adding it if new (matched by build-id when both have one, else by
    /// path).
    pub fn intern_binary(&mut self, info: &BinaryInfo) -> ProfileBinary {
        self.intern_binary_with(info, None)
    }

    fn intern_binary_with(&mut self, info: &BinaryInfo, facts: Option<Arc<dyn CodeFacts>>) -> ProfileBinary {
        let found = self.binaries.iter().position(|b| match (&b.build_id, &info.build_id) {
            (Some(x), Some(y)) => x == y,
            _ => b.path == info.path,
        });
        match found {
            Some(i) => i,
            None => {
                let facts = facts
                    .or_else(|| self.provider.as_ref().and_then(|p| p(info)))
                    .unwrap_or_else(|| Arc::new(SectionFacts::new(info)));
                self.binaries.push(info.clone());
                self.aggs.push(BinaryAgg::new(facts, self.binaries.len()));
                self.binaries.len() - 1
            }
        }
    }

    /// The encoded word of a runtime address; `span` is the last resolved span of this
    /// sample's addresses ([`AddressResolver::resolve_span`]: runtime range, offset to the
    /// link-time address, our binary tag), tried before the resolver.
    #[inline(always)]
    fn encode(&mut self, addr: u64, r: &dyn AddressResolver, span: &mut Span) -> u64 {
        if addr.wrapping_sub(span.lo) < span.len {
            return span.tag | addr.wrapping_add(span.off);
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
                // The span's part whose link-time addresses fit 48 bits (the address is in it):
                // a maps to a - addr + link.
                let off = link.wrapping_sub(addr);
                let mut lo = range.start.max(addr.saturating_sub(link));
                let mut hi = range.end.min(addr.saturating_add(ADDR_MASK - link).saturating_add(1));
                if !(lo <= addr && addr < hi) {
                    (lo, hi) = (addr, addr + 1);
                }
                *span = Span { lo, len: hi - lo, off, tag: ours << ADDR_BITS };
                if !self.tags.contains(&(ours << ADDR_BITS)) {
                    self.tags.push(ours << ADDR_BITS);
                }
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
        self.add_inner(sample.stack, sample.branches, 0, resolver, 1, false)
    }

    /// Aggregate one hybrid sample seen `count` times.
    pub fn add_counted(&mut self, sample: &HybridSample<'_>, resolver: &dyn AddressResolver, count: u64) {
        self.add_inner(sample.stack, sample.branches, 0, resolver, count, false)
    }

    /// [`add`](Self::add) of a sample whose stack was cut at a return address that follows no
    /// call ([`SampleRef::is_cut`]).
    pub fn add_cut(&mut self, sample: &HybridSample<'_>, resolver: &dyn AddressResolver) {
        self.add_inner(sample.stack, sample.branches, FLAG_CUT, resolver, 1, false)
    }

    /// [`add`](Self::add) (`cut`: [`add_cut`](Self::add_cut)) of a sample that stands for a
    /// point inside a trace window rather than a sampled instant (ETM's synthesized samples):
    /// counted for the PGO dumps, not in the sampled stacks.
    pub fn add_synthesized(&mut self, sample: &HybridSample<'_>, resolver: &dyn AddressResolver, cut: bool) {
        self.add_inner(sample.stack, sample.branches, if cut { FLAG_CUT } else { 0 }, resolver, 1, true)
    }

    /// Aggregate a branch-only sample (no call stack: LBR/BRBE without stacks, perf script
    /// `-F ip,brstack`), `ip` being the sampled IP, seen `count` times.
    pub fn add_branch_only(&mut self, ip: u64, branches: &[Branch], resolver: &dyn AddressResolver, count: u64) {
        self.add_inner(&[ip], branches, FLAG_BRANCH_ONLY, resolver, count, false)
    }

    /// Every sample goes through here (one function for the benchmarks' breakdown).
    #[inline(never)]
    fn add_inner(
        &mut self,
        stack: &[u64],
        branches: &[Branch],
        flags: u64,
        r: &dyn AddressResolver,
        count: u64,
        synthesized: bool,
    ) {
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
        self.stats.samples += count;
        self.tags.clear();
        let mut key = std::mem::take(&mut self.scratch);
        key.clear();
        key.resize(1 + ns, 0);
        key[0] = ns as u64 | (nb as u64) << 16 | flags;
        let mut span = Span::default();
        for (k, &a) in key[1..].iter_mut().zip(&stack[..ns]) {
            *k = self.encode(a, r, &mut span);
        }
        let branches = &branches[..nb];
        let branch_only = flags & FLAG_BRANCH_ONLY != 0;
        // Commonest: every branch end in the span of the first one (one binary, one offset).
        let first = branches.first().map(|b| self.encode(b.from, r, &mut span) & !ADDR_MASK);
        let in_span = first.is_some_and(|t| t != 0);
        let mut encoded = false;
        let done = in_span && {
            let b = (span.tag >> ADDR_BITS) as usize - 1;
            let budget = self.budget(b);
            let pairs = crate::agg::InSpan { branches, off: span.off, lo: span.lo, len: span.len };
            let stack = &key[1..1 + ns];
            self.aggs[b].add(stack, span.tag, &pairs, true, branch_only, count, budget, &mut self.agg_scratch).is_ok()
        };
        if !done && !branches.is_empty() {
            self.encode_branches(&mut key, branches, r);
            encoded = true;
            self.aggregate(&key, ns, branch_only, count);
        }
        if !synthesized {
            let mut sk = std::mem::take(&mut self.stack_key);
            sk.clear();
            sk.push(ns as u64 | flags);
            sk.extend_from_slice(&key[1..1 + ns]);
            match self.stacks.insert(&mut sk, count) {
                Stored::Exact => {}
                Stored::Folded => self.stats.stacks_folded += count,
                Stored::Dropped => self.stats.stacks_dropped += count,
            }
            self.stack_key = sk;
        }
        if !branches.is_empty() {
            let keep = match self.limits.keep_samples {
                KeepSamples::All => true,
                KeepSamples::Needed => {
                    self.tags.iter().any(|&t| self.aggs[(t >> ADDR_BITS) as usize - 1].facts().needs_samples())
                }
            };
            if !keep {
                self.stats.not_kept += count;
            } else if self.limits.max_sample_bytes == 0 {
                self.stats.dropped += count;
            } else {
                if !encoded {
                    self.encode_branches(&mut key, branches, r);
                }
                match self.samples.insert(&mut key, count) {
                    Stored::Exact => {}
                    Stored::Folded => self.stats.folded += count,
                    Stored::Dropped => self.stats.dropped += count,
                }
            }
        }
        self.scratch = key;
    }

    /// Appends the encoded branch words to `key` (header and stack words already in it).
    fn encode_branches(&mut self, key: &mut Vec<u64>, branches: &[Branch], r: &dyn AddressResolver) {
        let at = key.len();
        key.resize(at + 2 * branches.len(), 0);
        let mut span = Span::default();
        for (k, b) in key[at..].chunks_exact_mut(2).zip(branches) {
            k[0] = self.encode(b.from, r, &mut span);
            k[1] = self.encode(b.to, r, &mut span);
        }
    }

    /// The budget left to binary `b`'s counters.
    fn budget(&self, b: usize) -> Budget {
        let others = self.aggs.iter().enumerate().filter(|&(i, _)| i != b).map(|(_, a)| a.accounted_bytes()).sum::<usize>();
        Budget { others, max: self.limits.max_bytes }
    }

    /// The per-binary aggregation of an encoded sample (`key`: header, `ns` stack words,
    /// branch word pairs), for every binary one of its addresses lies in (`self.tags`,
    /// collected while encoding).
    fn aggregate(&mut self, key: &[u64], ns: usize, branch_only: bool, count: u64) {
        let (stack, branches) = (&key[1..1 + ns], &key[1 + ns..]);
        let tags = std::mem::take(&mut self.tags);
        for &t in &tags {
            let b = (t >> ADDR_BITS) as usize - 1;
            let budget = self.budget(b);
            let all_in = branches.iter().all(|&w| w & !ADDR_MASK == t);
            let pairs = crate::agg::Words { words: branches, tag: t };
            // Words are always in view.
            let _ = self.aggs[b].add(stack, t, &pairs, all_in, branch_only, count, budget, &mut self.agg_scratch);
        }
        self.tags = tags;
    }

    /// Add another profile (binaries matched by build-id and path). The result equals a
    /// profile built from the union of both inputs (within the budgets).
    pub fn merge(&mut self, other: &HybridProfile) {
        let map: Vec<u64> = other
            .binaries
            .iter()
            .zip(&other.aggs)
            .map(|(b, a)| self.intern_binary_with(b, Some(a.facts_arc())) as u64 + 1)
            .collect();
        for (i, a) in other.aggs.iter().enumerate() {
            let b = map[i] as usize - 1;
            let budget = self.budget(b);
            self.aggs[b].merge(a, budget);
        }
        let remap = |w: u64| {
            let tag = (w >> ADDR_BITS) as usize;
            if tag == 0 { w } else { (map[tag - 1] << ADDR_BITS) | (w & ADDR_MASK) }
        };
        let mut key = std::mem::take(&mut self.scratch);
        for s in other.samples.samples() {
            key.clear();
            key.push(s.words[0]);
            key.extend(s.words[1..].iter().map(|&w| remap(w)));
            match self.samples.insert(&mut key, s.count) {
                Stored::Exact => {}
                Stored::Folded => self.stats.folded += s.count,
                Stored::Dropped => self.stats.dropped += s.count,
            }
        }
        for s in other.stacks.samples() {
            key.clear();
            key.push(s.words[0]);
            key.extend(s.words[1..].iter().map(|&w| remap(w)));
            match self.stacks.insert(&mut key, s.count) {
                Stored::Exact => {}
                Stored::Folded => self.stats.stacks_folded += s.count,
                Stored::Dropped => self.stats.stacks_dropped += s.count,
            }
        }
        self.scratch = key;
        let o = other.stats;
        self.stats.samples += o.samples;
        self.stats.empty += o.empty;
        self.stats.dropped += o.dropped;
        self.stats.not_kept += o.not_kept;
        self.stats.folded += o.folded;
        self.stats.stacks_dropped += o.stacks_dropped;
        self.stats.stacks_folded += o.stacks_folded;
        self.stats.stack_truncated += o.stack_truncated;
        self.stats.branches_truncated += o.branches_truncated;
        self.stats.unresolved_addresses += o.unresolved_addresses;
    }
}
