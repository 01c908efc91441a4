//! Context-sensitive unsymbolized profile for DWARF binaries: what `llvm-profgen
//! --skip-symbolization` writes for hybrid samples (its "unwinder output"), from the profile's
//! per-context counts.
//!
//! llvm-profgen's `VirtualUnwinder` is run online by the profile ([`etm_profile::agg`]): each
//! count there is a branch tuple seen in a parent-frame context (an address stack). Here each
//! count becomes llvm-profgen's counters: the fall-through range is split where the inline
//! context changes (`unwindLinear`: walking back from its end, a piece ends wherever two
//! adjacent instructions differ in their inline frames but the leaf) and each piece is
//! recorded in the context `parents + [piece start]`; the branch in `parents + [source]`, or
//! on the root (the empty context) when its source is external.
//!
//! A context's name is its address stack symbolized through a [`Symbolizer`]
//! (`getExpandedContext`): inline frames appended root to leaf, discriminators reduced to
//! their base value, the leaf's location dropped, adjacent repeated sequences compressed
//! (`compressRecursionContext`, unlimited size), then printed `f:off[.disc] @ ... @ leaf`.
//! Contexts are written sorted by that string (counters of contexts with the same name
//! summed), each with its sorted range and branch counts, as offsets from the page-aligned
//! first executable segment -- byte for byte what llvm-profgen-22 writes with its default
//! options.
//!
//! Not for pseudo-probe binaries: their CS contexts are call-site addresses, and LLVM 22
//! crashes reading a CS unsymbolized profile for them; use the perf-script dump there.

use std::collections::{BTreeMap, HashMap};
use std::io::{self, Write};

use crate::pgo::{EXTERNAL_ADDR, WriteStats};
use crate::symbolize::{InlineFrame, Symbolizer};
use etm_profile::{CodeFacts, HybridProfile, ProfileBinary};

/// (ranges, branches) counters of one context.
type Counters = (BTreeMap<(u64, u64), u64>, BTreeMap<(u64, u64), u64>);

/// Dump-time expansion of the counts (module docs), with its caches.
struct Expander<'a> {
    facts: &'a dyn CodeFacts,
    sym: &'a dyn Symbolizer,
    frames: HashMap<u64, Vec<InlineFrame>>,
    /// (context, leaf) -> name; the root is (u32::MAX, 0).
    names: HashMap<(u32, u64), String>,
    /// range -> its pieces.
    pieces: HashMap<(u64, u64), Vec<(u64, u64)>>,
}

/// Base discriminator of a DWARF discriminator (`getBaseDiscriminatorFromDiscriminator`,
/// prefix encoding; pseudo-probe discriminators give their probe index).
fn base_discriminator(d: u32) -> u32 {
    if d & 0x7 == 0x7 {
        return (d >> 3) & 0xffff;
    }
    if d & 1 != 0 {
        return 0;
    }
    let u = d >> 1;
    if u & 0x20 != 0 { ((u >> 1) & 0xfe0) | (u & 0x1f) } else { u & 0x1f }
}

/// llvm-profgen's in-place `compressRecursionContext` with no size limit.
fn compress_recursion<T: PartialEq + Clone>(ctx: &mut Vec<T>) {
    let mut i: usize = 1;
    let mut max = ctx.len() / 2;
    while i <= max {
        let n = ctx.len() as isize;
        let ii = i as isize;
        let mut right: isize = ii - 1;
        let mut end: isize = ii;
        let mut left_boundary: isize = 0;
        while right + ii < n {
            let mut left = right;
            while left >= left_boundary && ctx[left as usize] == ctx[(left + ii) as usize] {
                left -= 1;
            }
            let dup = left < left_boundary;
            left_boundary = right + 1;
            if dup {
                right += ii;
            } else {
                for k in 0..(left + ii - right) {
                    ctx[(end + k) as usize] = ctx[(right + 1 + k) as usize].clone();
                }
                end += left + ii - right;
                right = left + ii;
            }
        }
        for k in 0..(n - right - 1) {
            ctx[(end + k) as usize] = ctx[(right + 1 + k) as usize].clone();
        }
        end += n - right - 1;
        i += 1;
        ctx.truncate(end as usize);
        max = max.min(end as usize / 2);
    }
}

impl Expander<'_> {
    fn frames_at(&mut self, addr: u64) -> &[InlineFrame] {
        let sym = self.sym;
        self.frames.entry(addr).or_insert_with(|| sym.inline_frames(addr))
    }

    /// `ProfiledBinary::inlineContextEqual`.
    fn inline_context_equal(&mut self, a: u64, b: u64) -> bool {
        let fa = self.frames_at(a).to_vec();
        let fb = self.frames_at(b);
        !fa.is_empty() && fa.len() == fb.len() && fa[..fa.len() - 1] == fb[..fb.len() - 1]
    }

    /// `unwindLinear`'s split of the valid range `target ..= end` (pieces from the end back).
    fn split(&mut self, target: u64, end: u64) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        let (mut ip, mut end) = (end, end);
        while ip > target {
            let prev = ip;
            ip = self.facts.prev_inst(ip).unwrap_or(0);
            if !self.inline_context_equal(prev, ip) {
                if prev <= end {
                    out.push((prev, end));
                }
                end = ip;
            }
        }
        if ip <= end {
            out.push((ip, end));
        }
        out
    }

    /// The name of context `parents + [leaf]` (`None` for the root).
    fn name(&mut self, agg: &etm_profile::BinaryAgg, leaf: Option<(u32, u64)>) -> String {
        let key = leaf.unwrap_or((u32::MAX, 0));
        if let Some(n) = self.names.get(&key) {
            return n.clone();
        }
        let stack = match leaf {
            Some((ctx, a)) => {
                let mut v = agg.context(ctx);
                v.push(a);
                v
            }
            None => Vec::new(),
        };
        let n = self.context_string(&stack);
        self.names.insert(key, n.clone());
        n
    }

    /// `getExpandedContext` + `SampleContext::getContextString`.
    fn context_string(&mut self, stack: &[u64]) -> String {
        let mut v: Vec<InlineFrame> = Vec::new();
        for &a in stack {
            let f = self.frames_at(a);
            if f.is_empty() {
                return String::new();
            }
            v.extend_from_slice(f);
        }
        let Some(mut leaf) = v.pop() else { return String::new() };
        for f in &mut v {
            f.discriminator = base_discriminator(f.discriminator);
        }
        leaf.line_offset = 0;
        leaf.discriminator = 0;
        compress_recursion(&mut v);
        v.push(leaf);
        let mut s = String::new();
        let last = v.len() - 1;
        for (i, f) in v.iter().enumerate() {
            use std::fmt::Write as _;
            if i > 0 {
                s.push_str(" @ ");
            }
            s.push_str(&f.func);
            if i != last {
                let _ = write!(s, ":{}", f.line_offset);
                if f.discriminator != 0 {
                    let _ = write!(s, ".{}", f.discriminator);
                }
            }
        }
        s
    }
}

/// Whether binary `b` has any hybrid sample with branches in it (then llvm-profgen builds a
/// context-sensitive profile from its samples).
pub fn has_stack_samples(p: &HybridProfile, b: ProfileBinary) -> bool {
    p.agg(b).has_hybrid()
}

/// Context-sensitive unsymbolized profile of binary `b` (see the module docs), from the
/// profile's counts with the code facts they were computed with. Branch-only samples count
/// as one-frame stacks, as in the perf-script dump.
pub fn write_unsymbolized_cs<W: Write>(
    p: &HybridProfile,
    b: ProfileBinary,
    sym: &dyn Symbolizer,
    w: W,
) -> io::Result<WriteStats> {
    let info = &p.binaries()[b];
    let agg = p.agg(b);
    let base = info.first_exec_vaddr().unwrap_or(0) & !0xfff;
    let mut x = Expander { facts: agg.facts(), sym, frames: HashMap::new(), names: HashMap::new(), pieces: HashMap::new() };
    let mut out: BTreeMap<String, Counters> = BTreeMap::new();
    for c in agg.counts() {
        let Some(ctx) = c.cs_context() else { continue };
        let t = c.tuple;
        if let Some(r) = t.range() {
            let pieces = match x.pieces.get(&r) {
                Some(p) => p.clone(),
                None => {
                    let p = x.split(r.0, r.1);
                    x.pieces.insert(r, p.clone());
                    p
                }
            };
            for (s, e) in pieces {
                let name = x.name(agg, Some((ctx, s)));
                *out.entry(name).or_default().0.entry((s, e)).or_insert(0) += c.count;
            }
        }
        if let Some((src, dst)) = t.branch() {
            let name = x.name(agg, (src != EXTERNAL_ADDR).then_some((ctx, src)));
            *out.entry(name).or_default().1.entry((src, dst)).or_insert(0) += c.count;
        }
    }
    let off = |a: u64| a.wrapping_sub(base);
    let mut w = io::BufWriter::new(w);
    for (ctx, (ranges, brs)) in &out {
        writeln!(w, "[{ctx}]")?;
        writeln!(w, "  {}", ranges.len())?;
        for ((s, e), c) in ranges {
            writeln!(w, "  {:x}-{:x}:{c}", off(*s), off(*e))?;
        }
        writeln!(w, "  {}", brs.len())?;
        for ((s, d), c) in brs {
            writeln!(w, "  {:x}->{:x}:{c}", off(*s), off(*d))?;
        }
    }
    w.flush()?;
    Ok(WriteStats { records: out.len() as u64, skipped: 0 })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Adjacent repeats of any length collapse to one copy, as in llvm-profgen.
    #[test]
    fn recursion_compression() {
        let mut v = vec!['a', 'a', 'b', 'b'];
        compress_recursion(&mut v);
        assert_eq!(v, vec!['a', 'b']);
        let mut v = vec!['m', 'a', 'b', 'c', 'a', 'b', 'c', 'd'];
        compress_recursion(&mut v);
        assert_eq!(v, vec!['m', 'a', 'b', 'c', 'd']);
        let mut v = vec!['x', 'y'];
        compress_recursion(&mut v);
        assert_eq!(v, vec!['x', 'y']);
    }

    /// Prefix-encoded discriminators decode to their base value (2 -> 1, odd -> 0).
    #[test]
    fn base_discriminators() {
        assert_eq!(base_discriminator(0), 0);
        assert_eq!(base_discriminator(2), 1);
        assert_eq!(base_discriminator(3), 0);
        assert_eq!(base_discriminator(4), 2);
    }
}
