//! Exact instruction counts per function from the decoded ranges, kept per segment (a
//! window's trace from its trace-on) and folded into [`etm_profile::exact::ExactCounts`]:
//! the function of each range (cached per range for the code map's generation), the shadow
//! call stack over the segment's calls and returns for the inclusive counts and contexts.

use std::collections::HashMap;

use etm_profile::AddressResolver;

use crate::code::{CodeMap, Resolver};
use crate::isa::a64_kind;
use crate::join::{CpuMap, InsnKind};

/// A function's exact count, named.
#[derive(Debug, Clone, PartialEq)]
pub struct ExactFunction {
    /// The binary's path (empty: unresolved addresses).
    pub binary: String,
    /// The function's symbol (`[binary]` for code outside every symbol).
    pub function: String,
    pub count: etm_profile::exact::FunctionCount,
}

/// Functions counted apart (`etm_profile::exact`): beyond them, an `other` bucket.
const EXACT_MAX_FUNCTIONS: usize = 1 << 18;

/// The exact per-function counts (`etm_profile::exact`) and what feeds them: per CPU the
/// open segment's ranges by function, function indices by (image, symbol start), and a
/// direct-mapped cache from a range's first instruction to its function (the resolver and
/// symbol lookups are per distinct block, not per range).
pub(crate) struct ExactState {
    pub(crate) counts: etm_profile::exact::ExactCounts,
    open: CpuMap<crate::shadow::SegmentWalk>,
    index: HashMap<(usize, u64), u32>,
    pub(crate) names: Vec<(String, String)>,
    /// (range start, its instructions, function, kind of its last instruction, the source of
    /// the last taken branch to it recorded for coverage).
    cache: Vec<(u64, u32, u32, InsnKind, u64)>,
    cache_gen: u64,
    /// [`PipelineConfig::exact`].
    enabled: bool,
}

const EXACT_CACHE: usize = 4096;

impl ExactState {
    pub(crate) fn new(enabled: bool) -> Self {
        ExactState {
            enabled,
            counts: etm_profile::exact::ExactCounts::new(EXACT_MAX_FUNCTIONS),
            open: CpuMap::default(),
            index: HashMap::new(),
            names: Vec::new(),
            cache: vec![(u64::MAX, 0, 0, InsnKind::Other, u64::MAX); EXACT_CACHE],
            cache_gen: u64::MAX,
        }
    }

    fn intern(&mut self, key: (usize, u64), binary: &str, name: &str) -> u32 {
        if let Some(&i) = self.index.get(&key) {
            return i;
        }
        let i = self.names.len() as u32;
        self.names.push((binary.to_owned(), name.to_owned()));
        self.index.insert(key, i);
        i
    }

    /// The function of the range of `n` instructions at runtime address `addr`, and the kind
    /// of its last instruction; a range seen for the first time (not in the cache) is recorded
    /// for coverage. The cache is valid for the code map's generation (`ranges` checks it once
    /// per batch).
    #[inline]
    fn function(&mut self, resolver: &Resolver, code: &CodeMap, addr: u64, n: u32) -> (u32, InsnKind) {
        let c = self.cache[(addr >> 2) as usize % EXACT_CACHE];
        if c.0 == addr && c.1 == n {
            return (c.2, c.3);
        }
        self.function_miss(resolver, code, addr, n)
    }

    /// [`function`](Self::function) when the cache does not have the range.
    #[cold]
    #[inline(never)]
    fn function_miss(&mut self, resolver: &Resolver, code: &CodeMap, addr: u64, n: u32) -> (u32, InsnKind) {
        let slot = (addr >> 2) as usize % EXACT_CACHE;
        let k = code.read_u32(None, addr + 4 * u64::from(n.max(1) - 1)).map_or(InsnKind::Other, a64_kind);
        let c = self.cache[slot];
        if c.0 == addr {
            self.cache[slot] = (addr, n, c.2, k, c.4);
            return (c.2, k);
        }
        let f = match resolver.resolve(addr) {
            Some((b, link)) => {
                let (img, info) = &resolver.binaries[b.0 as usize];
                match code.symbols(*img).lookup(link) {
                    Some(sym) => {
                        let (start, name) = (sym.start, sym.name.clone());
                        self.intern((*img, start), &info.path, &name)
                    }
                    None => self.intern((*img, u64::MAX), &info.path, &format!("[{}]", info.file_name())),
                }
            }
            None => self.intern((usize::MAX, 0), "", "[unknown]"),
        };
        self.cache[slot] = (addr, n, f, k, u64::MAX);
        self.counts.block(f, addr);
        (f, k)
    }

    pub(crate) fn ranges(&mut self, cpu: i32, resolver: &Resolver, code: &CodeMap, rs: &[(u64, u32)]) {
        if !self.enabled {
            return;
        }
        if self.cache_gen != code.generation {
            self.cache.iter_mut().for_each(|c| c.0 = u64::MAX);
            self.cache_gen = code.generation;
        }
        let mut open = std::mem::take(self.open.entry(cpu));
        for &(start, n) in rs {
            let (f, last) = self.function(resolver, code, start, n);
            if let Some((from, ff)) = open.range(f, start, n, last, &mut self.counts) {
                // The cache entry of the target remembers its last recorded source.
                let slot = &mut self.cache[(start >> 2) as usize % EXACT_CACHE];
                if slot.4 != from {
                    slot.4 = from;
                    self.counts.branch(ff, from, start);
                }
            }
        }
        *self.open.entry(cpu) = open;
    }

    /// The branch chain of `cpu` broke inside its segment (trace lost).
    pub(crate) fn break_chain(&mut self, cpu: i32) {
        if let Some(open) = self.open.get_mut(cpu) {
            open.break_chain(&mut self.counts);
        }
    }

    /// The segment of `cpu` ended: one sampling unit.
    pub(crate) fn end_segment(&mut self, cpu: i32) {
        let Some(open) = self.open.get_mut(cpu) else { return };
        if open.own.is_empty() {
            return;
        }
        open.end(&mut self.counts);
        for &(f, n) in &open.own {
            self.counts.add(f, n);
        }
        for &(f, n) in &open.inclusive {
            self.counts.add_inclusive(f, n);
        }
        for &f in &open.calls {
            self.counts.add_call(f);
        }
        let total = open.own.iter().map(|o| o.1).sum();
        for &(f, ctx, own, inclusive) in &open.complete {
            self.counts.add_complete_call(f, ctx, own, inclusive, total);
        }
        open.clear();
        self.counts.end_segment();
    }

    pub(crate) fn end_all(&mut self) {
        let cpus: Vec<i32> = self.open.keys().collect();
        for c in cpus {
            self.end_segment(c);
        }
    }
}
