//! The online counters against a per-sample reference: llvm-profgen's rules transcribed one
//! sample at a time from `PerfReader.cpp` (`extractCallstack`, `extractLBRStack`,
//! `computeCounterFromLBR`, `VirtualUnwinder` with its per-sample frame trie) and BOLT's
//! pre-aggregated input as the writer made it from stored samples (`B` per branch of the
//! binary's view, `F` between consecutive ones). Random samples over two binaries with random
//! code facts (calls, returns, jumps, prologs, addresses that are not instructions, frames
//! taken as external) reach every path of the aggregation: one binary or several, external
//! ends, branch ends that are not code, dropped samples, invalid ranges, branch-only samples;
//! the profile must give the reference's counters exactly. Inline splitting is left to the
//! writer (here every instruction is one inline context, so a range is one piece).

use std::collections::BTreeMap;
use std::sync::Arc;

use etm_profile::{
    BinaryInfo, Branch, CodeFacts, EXTERNAL_ADDR, ExecSegment, FactsProvider, HybridProfile, HybridSample, IdentityResolver,
    ProfileLimits,
};

/// xorshift64*: deterministic, no dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn chance(&mut self, pct: u64) -> bool {
        self.below(100) < pct
    }
}

const CALL: u8 = 1;
const RET: u8 = 2;
const JUMP: u8 = 4;
const PROLOG: u8 = 8;
const NOT_INST: u8 = 16;
const FRAME_EXT: u8 = 32;

/// Random facts over `[base, base + 4 * n)`, one entry per 4-byte slot.
#[derive(Debug)]
struct Facts {
    base: u64,
    kinds: Vec<u8>,
}

impl Facts {
    /// `holes`: percent of the slots that are not instructions.
    fn random(base: u64, n: usize, holes: u64, rng: &mut Rng) -> Facts {
        let kinds = (0..n)
            .map(|_| {
                let mut k = match rng.below(10) {
                    0 | 1 => CALL,
                    2 => RET,
                    3 => JUMP,
                    _ => 0,
                };
                if rng.chance(8) {
                    k |= PROLOG;
                }
                if rng.chance(holes) {
                    k = NOT_INST;
                }
                if rng.chance(5) {
                    k |= FRAME_EXT;
                }
                k
            })
            .collect();
        Facts { base, kinds }
    }
    fn kind(&self, a: u64) -> Option<u8> {
        if a < self.base || !(a - self.base).is_multiple_of(4) {
            return None;
        }
        self.kinds.get(((a - self.base) / 4) as usize).copied()
    }
    fn insts(&self) -> impl DoubleEndedIterator<Item = u64> + '_ {
        self.kinds.iter().enumerate().filter(|(_, k)| **k & NOT_INST == 0).map(|(i, _)| self.base + 4 * i as u64)
    }
}

impl CodeFacts for Facts {
    fn is_inst(&self, a: u64) -> bool {
        self.kind(a).is_some_and(|k| k & NOT_INST == 0)
    }
    fn is_call(&self, a: u64) -> bool {
        self.is_inst(a) && self.kind(a).unwrap() & CALL != 0
    }
    fn is_return(&self, a: u64) -> bool {
        self.is_inst(a) && self.kind(a).unwrap() & RET != 0
    }
    fn in_prolog_epilog(&self, a: u64) -> bool {
        self.is_inst(a) && self.kind(a).unwrap() & PROLOG != 0
    }
    fn prev_inst(&self, a: u64) -> Option<u64> {
        self.insts().rev().find(|&i| i < a)
    }
    fn range_crosses_uncond_branch(&self, s: u64, e: u64) -> bool {
        self.insts().any(|i| i >= s && i < e && self.kind(i).unwrap() & (CALL | RET | JUMP) != 0)
    }
    fn frame_is_external(&self, a: u64) -> bool {
        self.kind(a).is_some_and(|k| k & FRAME_EXT != 0)
    }
}

fn info(path: &str, base: u64) -> BinaryInfo {
    BinaryInfo {
        path: path.into(),
        build_id: Some(path.as_bytes().to_vec()),
        exec_segments: vec![ExecSegment { vaddr: base, memsz: 0x1000, offset: 0 }],
        code_ranges: vec![(base, base + 0x1000)],
        is_pie: false,
    }
}

struct Sample {
    stack: Vec<u64>,
    branches: Vec<Branch>,
    branch_only: bool,
    count: u64,
}

/// An address: mostly binary A's code, sometimes B's, an unmapped address, a return address
/// after a call.
fn addr(rng: &mut Rng, fa: &Facts) -> u64 {
    match rng.below(100) {
        0..=74 => fa.base + 4 * rng.below(64),
        75..=84 => 0x9000 + 4 * rng.below(64),
        85..=89 => 0x5_0000 + rng.below(0x100),
        _ => {
            // after a call, if there is one near
            let i = rng.below(64);
            fa.base + 4 * i + 4
        }
    }
}

fn random_sample(rng: &mut Rng, fa: &Facts) -> Sample {
    let one_binary = rng.chance(50);
    let pick = |rng: &mut Rng| if one_binary { fa.base + 4 * rng.below(64) } else { addr(rng, fa) };
    let depth = rng.below(8) as usize;
    let stack: Vec<u64> = (0..=depth).map(|_| pick(rng)).collect();
    let nb = rng.below(20) as usize;
    let mut branches = Vec::new();
    for _ in 0..nb {
        if !one_binary && rng.chance(30) {
            // A call out of the binary and the return back into it (oldest first), after the
            // call: the external pair keeps the unwinder valid.
            let i = rng.below(64);
            branches.push(Branch { from: fa.base + 4 * i, to: 0x5_0000 + rng.below(0x100) });
            branches.push(Branch { from: 0x5_0000 + rng.below(0x100), to: fa.base + 4 * i + 4 });
            continue;
        }
        // Consecutive branches usually make ranges forward (target <= next source).
        let to = pick(rng);
        let from = if rng.chance(70) { to + 4 * rng.below(6) } else { pick(rng) };
        branches.push(Branch { from, to });
    }
    branches.reverse();
    Sample { stack, branches, branch_only: rng.chance(5), count: 1 + rng.below(3) }
}

type Key = (Vec<u64>, u8, u64, u64);

#[derive(Default, Debug, PartialEq, Eq)]
struct Out {
    cs: BTreeMap<Key, u64>,
    cf_ranges: BTreeMap<(u64, u64), u64>,
    cf_brs: BTreeMap<(u64, u64), u64>,
    bolt_b: BTreeMap<(u64, u64), u64>,
    bolt_f: BTreeMap<(u64, u64), u64>,
}

/// The reference for one binary.
fn reference(samples: &[Sample], f: &Facts, lo: u64) -> Out {
    let mut out = Out::default();
    let proj = |a: u64| if a >= lo && a < lo + 0x1000 { a } else { EXTERNAL_ADDR };
    let code = |a: u64| a != EXTERNAL_ADDR && f.is_inst(a);
    let mut bo_prolog: Vec<(Vec<(u64, u64)>, u64)> = Vec::new();
    let mut has_hybrid = false;
    for s in samples {
        let l1: Vec<(u64, u64)> = s
            .branches
            .iter()
            .map(|b| (proj(b.from), proj(b.to)))
            .filter(|&(a, b)| !(a == EXTERNAL_ADDR && b == EXTERNAL_ADDR))
            .collect();
        if l1.is_empty() {
            continue;
        }
        has_hybrid |= !s.branch_only;
        for (i, &(a, b)) in l1.iter().enumerate() {
            *out.bolt_b.entry((a, b)).or_default() += s.count;
            if let Some(&(_, t)) = l1.get(i + 1)
                && t != EXTERNAL_ADDR
                && a != EXTERNAL_ADDR
                && t <= a
            {
                *out.bolt_f.entry((t, a)).or_default() += s.count;
            }
        }
        // extractCallstack
        let frames: Vec<u64> = if s.branch_only { vec![s.stack[0]] } else { s.stack.clone() };
        let mut stack: Vec<u64> = Vec::new();
        for &a in &frames {
            let a = proj(a);
            if !code(a) || f.frame_is_external(a) {
                if stack.last() != Some(&EXTERNAL_ADDR) {
                    stack.push(EXTERNAL_ADDR);
                }
                continue;
            }
            if stack.is_empty() {
                stack.push(a);
            } else {
                match f.call_addr_from_frame_addr(a) {
                    0 => break,
                    c => stack.push(c),
                }
            }
        }
        if stack.len() > 1 && stack.last() == Some(&EXTERNAL_ADDR) {
            stack.pop();
        }
        // extractLBRStack
        let l2: Vec<(u64, u64)> = l1
            .iter()
            .map(|&(a, b)| (if code(a) { a } else { EXTERNAL_ADDR }, if code(b) { b } else { EXTERNAL_ADDR }))
            .filter(|&(a, b)| !(a == EXTERNAL_ADDR && b == EXTERNAL_ADDR))
            .collect();
        let dropped = stack.is_empty() || f.in_prolog_epilog(stack[0]);
        if dropped {
            if s.branch_only {
                bo_prolog.push((l2, s.count));
            }
            continue;
        }
        cf(&l2, s.count, f, &mut out);
        if l2.is_empty() {
            continue;
        }
        stack[0] = l2[0].1;
        unwind(&stack, &l2, s.count, f, &mut out.cs);
    }
    if !has_hybrid {
        for (l2, c) in &bo_prolog {
            cf(l2, *c, f, &mut out);
        }
    }
    out
}

/// `computeCounterFromLBR` (addresses already external where not code).
fn cf(l2: &[(u64, u64)], count: u64, f: &Facts, out: &mut Out) {
    let mut end = 0u64;
    for &(src, dst) in l2 {
        if dst != EXTERNAL_ADDR {
            *out.cf_brs.entry((src, dst)).or_default() += count;
        }
        if dst != EXTERNAL_ADDR && end != EXTERNAL_ADDR && end != 0 && dst <= end && !f.range_crosses_uncond_branch(dst, end) {
            *out.cf_ranges.entry((dst, end)).or_default() += count;
        }
        end = src;
    }
}

/// `VirtualUnwinder::unwind` with its frame trie, one sample.
fn unwind(stack: &[u64], lbr: &[(u64, u64)], count: u64, f: &Facts, out: &mut BTreeMap<Key, u64>) {
    struct Node {
        addr: u64,
        parent: usize,
        kids: Vec<usize>,
        recs: Vec<(u8, u64, u64)>,
    }
    let mut nodes = vec![Node { addr: 0, parent: 0, kids: vec![], recs: vec![] }];
    let child = |nodes: &mut Vec<Node>, p: usize, a: u64| -> usize {
        if let Some(&k) = nodes[p].kids.iter().find(|&&k| nodes[k].addr == a) {
            return k;
        }
        nodes.push(Node { addr: a, parent: p, kids: vec![], recs: vec![] });
        let k = nodes.len() - 1;
        nodes[p].kids.push(k);
        k
    };
    let switch = |nodes: &mut Vec<Node>, leaf: &mut usize, a: u64| {
        if nodes[*leaf].addr != a || *leaf == 0 {
            let p = nodes[*leaf].parent;
            *leaf = child(nodes, p, a);
        }
    };
    let mut leaf = 0;
    for &a in stack.iter().rev() {
        leaf = child(&mut nodes, leaf, a);
    }
    let mut ip = stack[0];
    let mut invalid = false;
    for (i, &(src, dst)) in lbr.iter().enumerate() {
        if i > 0 {
            // unwindLinear (one inline context: one piece)
            let (target, end) = (dst, ip);
            if end == EXTERNAL_ADDR && target == EXTERNAL_ADDR {
            } else if end == EXTERNAL_ADDR
                || target == EXTERNAL_ADDR
                || target > end
                || f.range_crosses_uncond_branch(target, end)
            {
                invalid = true;
            } else {
                switch(&mut nodes, &mut leaf, target);
                nodes[leaf].recs.push((b'R', target, end));
            }
        }
        let ext = src == EXTERNAL_ADDR;
        if !invalid && (f.is_call(src) || (ext && f.call_addr_from_frame_addr(dst) == 0)) {
            let p = nodes[leaf].parent;
            if leaf == 0 || p == 0 || nodes[p].addr != src {
                switch(&mut nodes, &mut leaf, src);
            } else {
                leaf = p;
            }
        } else if !invalid && (f.is_return(src) || (ext && f.call_addr_from_frame_addr(dst) != 0)) {
            let call = f.call_addr_from_frame_addr(dst);
            switch(&mut nodes, &mut leaf, call);
            leaf = child(&mut nodes, leaf, src);
        } else if !invalid {
            switch(&mut nodes, &mut leaf, src);
        } else {
            leaf = child(&mut nodes, 0, src);
        }
        ip = src;
        if dst != EXTERNAL_ADDR {
            let at = if ext { 0 } else { leaf };
            nodes[at].recs.push((b'B', src, dst));
        }
    }
    // collectSamplesFromFrameTrie: contexts cut below external frames.
    fn collect(nodes: &[Node], n: usize, stack: &mut Vec<u64>, count: u64, out: &mut BTreeMap<Key, u64>) {
        if n != 0 && nodes[n].addr == EXTERNAL_ADDR {
            let mut empty = Vec::new();
            for &(k, a, b) in &nodes[n].recs {
                *out.entry((vec![], k, a, b)).or_default() += count;
            }
            for &c in &nodes[n].kids {
                collect(nodes, c, &mut empty, count, out);
            }
            return;
        }
        if n != 0 {
            stack.push(nodes[n].addr);
        }
        for &(k, a, b) in &nodes[n].recs {
            *out.entry((stack.clone(), k, a, b)).or_default() += count;
        }
        for &c in &nodes[n].kids {
            collect(nodes, c, stack, count, out);
        }
        if n != 0 {
            stack.pop();
        }
    }
    collect(&nodes, 0, &mut Vec::new(), count, out);
}

/// The same counters read from the profile.
fn from_profile(p: &HybridProfile, path: &str) -> Out {
    let mut out = Out::default();
    let Some(b) = p.binaries().iter().position(|i| i.path == path) else { return out };
    let agg = p.agg(b);
    for c in agg.counts() {
        let t = c.tuple;
        if c.in_bolt() {
            *out.bolt_b.entry((t.src, t.dst)).or_default() += c.count;
            if t.start != etm_profile::agg::NO_START && t.start != EXTERNAL_ADDR && t.src != EXTERNAL_ADDR && t.start <= t.src {
                *out.bolt_f.entry((t.start, t.src)).or_default() += c.count;
            }
        }
        if c.in_context_free(agg.has_hybrid()) {
            if let Some(r) = t.range() {
                *out.cf_ranges.entry(r).or_default() += c.count;
            }
            if let Some(br) = t.branch() {
                *out.cf_brs.entry(br).or_default() += c.count;
            }
        }
        if let Some(ctx) = c.cs_context() {
            let chain = agg.context(ctx);
            if let Some((s, e)) = t.range() {
                let mut k = chain.clone();
                k.push(s);
                *out.cs.entry((k, b'R', s, e)).or_default() += c.count;
            }
            if let Some((s, d)) = t.branch() {
                let k = if s == EXTERNAL_ADDR {
                    vec![]
                } else {
                    let mut k = chain.clone();
                    k.push(s);
                    k
                };
                *out.cs.entry((k, b'B', s, d)).or_default() += c.count;
            }
        }
    }
    out
}

fn profile_with(fa: Arc<Facts>, fb: Arc<Facts>, limits: ProfileLimits) -> HybridProfile {
    let mut p = HybridProfile::new(limits);
    let prov: FactsProvider = Arc::new(move |i: &BinaryInfo| {
        Some(if i.path == "/a" { fa.clone() as Arc<dyn CodeFacts> } else { fb.clone() as Arc<dyn CodeFacts> })
    });
    p.set_facts_provider(prov);
    p
}

fn add(p: &mut HybridProfile, r: &IdentityResolver, s: &Sample) {
    if s.branch_only {
        p.add_branch_only(s.stack[0], &s.branches, r, s.count);
    } else {
        p.add_counted(&HybridSample { stack: &s.stack, branches: &s.branches }, r, s.count);
    }
}

/// Random samples (module docs) give exactly the reference's counters, for each binary.
#[test]
fn counters_equal_the_per_sample_reference() {
    for seed in 1..=60u64 {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ seed.wrapping_mul(0x1234_5678_9abc_def1));
        // Half the seeds: every slot an instruction (external ends, no unclean tuples).
        let holes = if seed % 2 == 0 { 0 } else { 4 };
        let fa = Arc::new(Facts::random(0x1000, 64, holes, &mut rng));
        let fb = Arc::new(Facts::random(0x9000, 64, holes, &mut rng));
        let r = IdentityResolver::new(vec![info("/a", 0x1000), info("/b", 0x9000)]);
        let samples: Vec<Sample> = (0..300).map(|_| random_sample(&mut rng, &fa)).collect();
        let mut p = profile_with(fa.clone(), fb.clone(), ProfileLimits::default());
        for s in &samples {
            add(&mut p, &r, s);
        }
        for (path, f, lo) in [("/a", &*fa, 0x1000), ("/b", &*fb, 0x9000)] {
            let want = reference(&samples, f, lo);
            let got = from_profile(&p, path);
            assert_eq!(got.bolt_b, want.bolt_b, "seed {seed} {path}: BOLT branches");
            assert_eq!(got.bolt_f, want.bolt_f, "seed {seed} {path}: BOLT fall-throughs");
            assert_eq!(got.cf_brs, want.cf_brs, "seed {seed} {path}: context-free branches");
            assert_eq!(got.cf_ranges, want.cf_ranges, "seed {seed} {path}: context-free ranges");
            assert_eq!(got.cs, want.cs, "seed {seed} {path}: context-sensitive counters");
        }
        // The same samples again double every count (the caches answer as the tables).
        for s in &samples {
            add(&mut p, &r, s);
        }
        let want = reference(&samples, &fa, 0x1000);
        let got = from_profile(&p, "/a");
        let doubled = |m: &BTreeMap<Key, u64>| m.iter().map(|(k, v)| (k.clone(), 2 * v)).collect::<BTreeMap<_, _>>();
        assert_eq!(got.cs, doubled(&want.cs), "seed {seed}: twice");
    }
}

/// Merging two profiles gives the counters of one profile of both inputs.
#[test]
fn merge_equals_union() {
    let mut rng = Rng(77);
    let fa = Arc::new(Facts::random(0x1000, 64, 4, &mut rng));
    let fb = Arc::new(Facts::random(0x9000, 64, 4, &mut rng));
    let r = IdentityResolver::new(vec![info("/a", 0x1000), info("/b", 0x9000)]);
    let samples: Vec<Sample> = (0..400).map(|_| random_sample(&mut rng, &fa)).collect();
    let (mut x, mut y, mut u) = (
        profile_with(fa.clone(), fb.clone(), ProfileLimits::default()),
        profile_with(fa.clone(), fb.clone(), ProfileLimits::default()),
        profile_with(fa.clone(), fb.clone(), ProfileLimits::default()),
    );
    for (i, s) in samples.iter().enumerate() {
        add(if i % 3 == 0 { &mut x } else { &mut y }, &r, s);
        add(&mut u, &r, s);
    }
    x.merge(&y);
    for path in ["/a", "/b"] {
        assert_eq!(from_profile(&x, path), from_profile(&u, path), "{path}");
    }
    assert_eq!(x.total_samples(), u.total_samples());
}

/// Past the budget the context-sensitive counters lose contexts, the context-free and BOLT
/// ones stay exact (the tuples, bounded by the code, fit), and the counters' memory stays
/// within the budget and its reserve.
#[test]
fn budget_keeps_context_free_counters_exact() {
    let mut rng = Rng(5);
    let fa = Arc::new(Facts::random(0x1000, 64, 4, &mut rng));
    let fb = Arc::new(Facts::random(0x9000, 64, 4, &mut rng));
    let r = IdentityResolver::new(vec![info("/a", 0x1000), info("/b", 0x9000)]);
    // Few branch ends (few tuples), deep random stacks of return addresses (many contexts).
    let calls: Vec<u64> = fa.insts().filter(|&a| fa.is_call(a)).map(|a| a + 4).collect();
    let samples: Vec<Sample> = (0..3000)
        .map(|_| {
            let stack: Vec<u64> = (0..=rng.below(12)).map(|_| calls[rng.below(calls.len() as u64) as usize]).collect();
            let branches: Vec<Branch> =
                (0..8).map(|_| Branch { from: 0x1000 + 4 * rng.below(6), to: 0x1000 + 4 * rng.below(6) }).collect();
            Sample { stack, branches, branch_only: false, count: 1 }
        })
        .collect();
    let mut big = profile_with(fa.clone(), fb.clone(), ProfileLimits::default());
    for s in &samples {
        add(&mut big, &r, s);
    }
    let a = big.agg(0);
    assert!(a.count_entries() > 4 * a.tuples().len(), "{} counts of {} tuples", a.count_entries(), a.tuples().len());
    let max = big.accounted_bytes() / 2;
    let mut small = profile_with(fa.clone(), fb.clone(), ProfileLimits { max_bytes: max, ..Default::default() });
    for s in &samples {
        add(&mut small, &r, s);
    }
    let st = small.stats().agg;
    assert!(st.counts_folded + st.contexts_folded > 0, "{st:?}");
    assert_eq!((st.samples_dropped, st.counts_dropped), (0, 0), "{st:?}");
    let (s, b) = (from_profile(&small, "/a"), from_profile(&big, "/a"));
    assert_eq!((s.cf_ranges, s.cf_brs, s.bolt_b, s.bolt_f), (b.cf_ranges, b.cf_brs, b.bolt_b, b.bolt_f));
    assert_ne!(s.cs, b.cs);
    assert!(small.accounted_bytes() <= max + max / 8, "{} of {max}", small.accounted_bytes());
}
