//! Exact instruction counts per function from the decoded ranges, kept per segment (a
//! window's trace from its trace-on) and folded into [`etm_profile::exact::ExactCounts`]:
//! the function of each range (cached per range for the code map's generation), the shadow
//! call stack over the segment's calls and returns for the inclusive counts and contexts.

use etm_profile::exact::IntMap;

use etm_profile::AddressResolver;

use crate::code::{CodeMap, Resolver};
use crate::join::CpuMap;
use crate::window::TraceRange;

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
    names: Names,
    cache: Box<[CacheEntry; EXACT_CACHE]>,
    cache_gen: u64,
    /// [`PipelineConfig::exact`].
    enabled: bool,
}

/// The functions named so far: indices by (image, symbol start), and their (binary, name).
#[derive(Default)]
struct Names {
    index: IntMap<(usize, u64), u32>,
    names: Vec<(String, String)>,
}

/// A cache entry: a range's first instruction, its function, and the source of the last
/// taken branch to it recorded for coverage.
#[derive(Clone, Copy)]
struct CacheEntry {
    start: u64,
    f: u32,
    from: u64,
}

const EMPTY: CacheEntry = CacheEntry { start: u64::MAX, f: 0, from: u64::MAX };

const EXACT_CACHE: usize = 4096;

impl Names {
    fn intern(&mut self, key: (usize, u64), binary: &str, name: &str) -> u32 {
        if let Some(&i) = self.index.get(&key) {
            return i;
        }
        let i = self.names.len() as u32;
        self.names.push((binary.to_owned(), name.to_owned()));
        self.index.insert(key, i);
        i
    }

    /// The function of the code at runtime address `addr`.
    #[cold]
    #[inline(never)]
    fn function(&mut self, resolver: &Resolver, code: &CodeMap, addr: u64) -> u32 {
        match resolver.resolve(addr) {
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
        }
    }
}

impl ExactState {
    pub(crate) fn new(enabled: bool) -> Self {
        ExactState {
            enabled,
            counts: etm_profile::exact::ExactCounts::new(EXACT_MAX_FUNCTIONS),
            open: CpuMap::default(),
            names: Names::default(),
            cache: Box::new([EMPTY; EXACT_CACHE]),
            cache_gen: u64::MAX,
        }
    }

    /// The functions' (binary, name), by function index.
    pub(crate) fn names(&self) -> &[(String, String)] {
        &self.names.names
    }

    /// A batch of ranges of `cpu`'s open segment: each range's function (from the cache,
    /// valid for the code map's generation, checked once per batch; a range start seen for
    /// the first time is recorded for coverage), then the segment's walk.
    pub(crate) fn ranges(&mut self, cpu: i32, resolver: &Resolver, code: &CodeMap, rs: &[TraceRange]) {
        if !self.enabled {
            return;
        }
        if self.cache_gen != code.generation {
            self.cache.fill(EMPTY);
            self.cache_gen = code.generation;
        }
        let ExactState { counts, open, names, cache, .. } = self;
        let walk = open.entry(cpu);
        walk.ranges(
            rs,
            counts,
            &mut (&mut **cache, names),
            |(cache, names), counts, start| {
                let c = &mut cache[(start >> 2) as usize % EXACT_CACHE];
                if c.start != start {
                    let f = names.function(resolver, code, start);
                    *c = CacheEntry { start, f, from: u64::MAX };
                    counts.block(f, start);
                }
                (c.f, c.from)
            },
            |(cache, _), counts, from, ff, to| {
                // The cache entry of the target remembers its last recorded source.
                cache[(to >> 2) as usize % EXACT_CACHE].from = from;
                counts.branch(ff, from, to);
            },
        );
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
        if !open.end(&mut self.counts) {
            return;
        }
        let mut total = 0;
        for &(f, n) in open.own() {
            self.counts.add(f, n);
            total += n;
        }
        for &(f, n) in &open.inclusive {
            self.counts.add_inclusive(f, n);
        }
        for &(f, n) in open.calls() {
            self.counts.add_calls(f, n);
        }
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
