//! Context-sensitive unsymbolized profile for DWARF binaries: what `llvm-profgen
//! --skip-symbolization` writes for hybrid samples (its "unwinder output").
//!
//! Each hybrid sample is replayed as llvm-profgen's `VirtualUnwinder` does: the call stack is
//! canonicalized (`extractCallstack`: return addresses become call addresses, frames outside
//! the binary collapse into one external frame, leaves in a prolog/epilog drop the sample),
//! the stack leaf becomes the newest branch target, then the branches are walked newest
//! first, popping a frame on a call, pushing one on a return, and splitting each
//! fall-through range where the inline context changes. Ranges and branches land on the
//! frame they executed in; frames under an external frame start a fresh context.
//!
//! A frame's context is its address stack symbolized through a [`Symbolizer`]
//! (`getExpandedContext`): inline frames appended root to leaf, discriminators reduced to
//! their base value, the leaf's location dropped, adjacent repeated sequences compressed
//! (`compressRecursionContext`, unlimited size), then printed `f:off[.disc] @ ... @ leaf`.
//! Contexts are written sorted by that string, each with its sorted range and branch counts,
//! as offsets from the page-aligned first executable segment -- byte for byte what
//! llvm-profgen-22 writes with its default options.
//!
//! Not for pseudo-probe binaries: their CS contexts are call-site addresses, and LLVM 22
//! crashes reading a CS unsymbolized profile for them; use the perf-script dump there.

use std::collections::{BTreeMap, HashMap};
use std::io::{self, Write};

use crate::pgo::{CodeFacts, EXTERNAL_ADDR, WriteStats};
use crate::symbolize::{InlineFrame, Symbolizer};
use etm_profile::{HybridProfile, ProfileBinary};

/// Instruction-level facts the unwinder needs beyond [`CodeFacts`].
pub trait InstFacts: CodeFacts {
    /// Whether a call instruction starts at `addr`.
    fn is_call(&self, addr: u64) -> bool;
    /// Whether a return instruction starts at `addr`.
    fn is_return(&self, addr: u64) -> bool;
    /// Index of the first instruction at or after `addr` (lower bound).
    fn inst_index(&self, addr: u64) -> usize;
    /// Address of the instruction with this index.
    fn inst_at(&self, index: usize) -> Option<u64>;
    /// Whether an instruction starts at `addr` (llvm-profgen's `addressIsCode`: only the
    /// disassembled function symbols count, so PLT stubs are external).
    fn is_inst(&self, addr: u64) -> bool {
        self.inst_at(self.inst_index(addr)) == Some(addr)
    }
}

const ROOT: usize = 0;

#[derive(Default)]
struct Node {
    addr: u64,
    parent: usize,
    children: Vec<(u64, usize)>,
    ranges: Vec<(u64, u64, u64)>,
    branches: Vec<(u64, u64, u64)>,
}

/// (ranges, branches) counters of one context.
type Counters = (BTreeMap<(u64, u64), u64>, BTreeMap<(u64, u64), u64>);

struct Unwinder<'a> {
    facts: &'a dyn InstFacts,
    sym: &'a dyn Symbolizer,
    is_code: &'a dyn Fn(u64) -> bool,
    frames: HashMap<u64, Vec<InlineFrame>>,
    contexts: HashMap<Vec<u64>, String>,
    out: BTreeMap<String, Counters>,
    nodes: Vec<Node>,
}

struct State<'s> {
    leaf: usize,
    idx: usize,
    lbr: &'s [(u64, u64)],
    ip: u64,
    ip_index: usize,
    invalid: bool,
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

impl<'a> Unwinder<'a> {
    fn frames_at(&mut self, addr: u64) -> &[InlineFrame] {
        let sym = self.sym;
        self.frames.entry(addr).or_insert_with(|| sym.inline_frames(addr))
    }

    fn inline_context_equal(&mut self, a: u64, b: u64) -> bool {
        let fa = self.frames_at(a).to_vec();
        let fb = self.frames_at(b);
        !fa.is_empty() && fa.len() == fb.len() && fa[..fa.len() - 1] == fb[..fb.len() - 1]
    }

    fn call_addr_from_frame_addr(&self, a: u64) -> u64 {
        if a == EXTERNAL_ADDR {
            return EXTERNAL_ADDR;
        }
        let i = self.facts.inst_index(a);
        match i.checked_sub(1).and_then(|j| self.facts.inst_at(j)) {
            Some(p) if p != 0 && self.facts.is_call(p) => p,
            _ => 0,
        }
    }

    fn child(&mut self, parent: usize, addr: u64) -> usize {
        if let Some(&(_, c)) = self.nodes[parent].children.iter().find(|&&(a, _)| a == addr) {
            return c;
        }
        let c = self.nodes.len();
        self.nodes.push(Node { addr, parent, ..Default::default() });
        self.nodes[parent].children.push((addr, c));
        c
    }

    fn switch_to(&mut self, st: &mut State<'_>, addr: u64) {
        if self.nodes[st.leaf].addr == addr && st.leaf != ROOT {
            return;
        }
        let p = self.nodes[st.leaf].parent;
        st.leaf = self.child(p, addr);
    }

    fn update_ip(&self, st: &mut State<'_>, addr: u64) {
        st.ip = addr;
        st.ip_index = self.facts.inst_index(addr);
    }

    fn unwind_linear(&mut self, st: &mut State<'_>, repeat: u64) {
        let target = st.lbr[st.idx].1;
        let mut end = st.ip;
        if end == EXTERNAL_ADDR && target == EXTERNAL_ADDR {
            return;
        }
        if end == EXTERNAL_ADDR || target == EXTERNAL_ADDR {
            st.invalid = true;
            return;
        }
        if target > end || self.facts.range_crosses_uncond_branch(target, end) {
            st.invalid = true;
            return;
        }
        while st.ip > target {
            let prev = st.ip;
            st.ip_index = st.ip_index.wrapping_sub(1);
            st.ip = self.facts.inst_at(st.ip_index).unwrap_or(0);
            if !self.inline_context_equal(prev, st.ip) {
                self.switch_to(st, prev);
                if prev <= end {
                    self.nodes[st.leaf].ranges.push((prev, end, repeat));
                }
                end = st.ip;
            }
        }
        let ip = st.ip;
        self.switch_to(st, ip);
        if ip <= end {
            self.nodes[st.leaf].ranges.push((ip, end, repeat));
        }
    }

    fn unwind(&mut self, stack: &[u64], lbr: &[(u64, u64)], repeat: u64) {
        self.nodes.clear();
        self.nodes.push(Node { addr: 0, parent: ROOT, ..Default::default() });
        let mut cur = ROOT;
        for &a in stack.iter().rev() {
            cur = self.child(cur, a);
        }
        let mut st = State { leaf: cur, idx: 0, lbr, ip: 0, ip_index: 0, invalid: false };
        self.update_ip(&mut st, stack[0]);
        while st.idx < lbr.len() {
            if st.idx != 0 {
                self.unwind_linear(&mut st, repeat);
            }
            let (src, dst) = lbr[st.idx];
            let valid = !st.invalid;
            let ext_src = src == EXTERNAL_ADDR;
            if valid && (self.facts.is_call(src) || (ext_src && self.call_addr_from_frame_addr(dst) == 0)) {
                let parent = self.nodes[st.leaf].parent;
                if st.leaf == ROOT || parent == ROOT || self.nodes[parent].addr != src {
                    self.switch_to(&mut st, src);
                } else {
                    st.leaf = parent;
                }
                self.update_ip(&mut st, src);
            } else if valid && (self.facts.is_return(src) || (ext_src && self.call_addr_from_frame_addr(dst) != 0)) {
                let call = self.call_addr_from_frame_addr(dst);
                self.switch_to(&mut st, call);
                st.leaf = self.child(st.leaf, src);
                self.update_ip(&mut st, src);
            } else if valid {
                self.switch_to(&mut st, src);
                self.update_ip(&mut st, src);
            } else {
                self.update_ip(&mut st, src);
                st.leaf = self.child(ROOT, src);
            }
            st.idx += 1;
            if dst == EXTERNAL_ADDR {
                continue;
            }
            let at = if ext_src { ROOT } else { st.leaf };
            self.nodes[at].branches.push((src, dst, repeat));
        }
        let mut fs = Vec::new();
        self.collect(ROOT, &mut fs);
    }

    fn collect(&mut self, n: usize, stack: &mut Vec<u64>) {
        if n != ROOT {
            if self.nodes[n].addr == EXTERNAL_ADDR {
                let mut empty = Vec::new();
                self.collect_frame(n, &empty);
                let kids: Vec<usize> = self.nodes[n].children.iter().map(|c| c.1).collect();
                for c in kids {
                    self.collect(c, &mut empty);
                }
                return;
            }
            stack.push(self.nodes[n].addr);
        }
        self.collect_frame(n, stack);
        let kids: Vec<usize> = self.nodes[n].children.iter().map(|c| c.1).collect();
        for c in kids {
            self.collect(c, stack);
        }
        stack.pop();
    }

    fn collect_frame(&mut self, n: usize, stack: &[u64]) {
        if self.nodes[n].ranges.is_empty() && self.nodes[n].branches.is_empty() {
            return;
        }
        let ctx = match self.contexts.get(stack) {
            Some(c) => c.clone(),
            None => {
                let c = self.context_string(stack);
                self.contexts.insert(stack.to_vec(), c.clone());
                c
            }
        };
        let entry = self.out.entry(ctx).or_default();
        for &(s, e, c) in &self.nodes[n].ranges {
            *entry.0.entry((s, e)).or_insert(0) += c;
        }
        for &(s, d, c) in &self.nodes[n].branches {
            *entry.1.entry((s, d)).or_insert(0) += c;
        }
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

/// Whether binary `b` has any sample with a call stack (then llvm-profgen builds a
/// context-sensitive profile from it).
pub fn has_stack_samples(p: &HybridProfile, b: ProfileBinary) -> bool {
    p.samples().any(|s| s.touches(b) && !s.is_branch_only() && s.branches().len() > 0)
}

/// Context-sensitive unsymbolized profile of binary `b` (see the module docs). Samples
/// without a call stack are treated as one-frame stacks, as in the perf-script dump.
pub fn write_unsymbolized_cs<W: Write>(
    p: &HybridProfile,
    b: ProfileBinary,
    facts: &dyn InstFacts,
    sym: &dyn Symbolizer,
    w: W,
) -> io::Result<WriteStats> {
    let info = &p.binaries()[b];
    let base = info.first_exec_vaddr().unwrap_or(0) & !0xfff;
    let is_code = |a: u64| facts.is_inst(a);
    let (views, skipped) = crate::pgo::views(p, b, None);
    let mut u = Unwinder {
        facts,
        sym,
        is_code: &is_code,
        frames: HashMap::new(),
        contexts: HashMap::new(),
        out: BTreeMap::new(),
        nodes: Vec::new(),
    };
    let mut stack: Vec<u64> = Vec::new();
    let mut lbr: Vec<(u64, u64)> = Vec::new();
    let mut unwound = 0u64;
    for ((_, frames, branches), count) in &views {
        // extractCallstack
        stack.clear();
        for &a in frames {
            if !(u.is_code)(a) {
                if stack.last() != Some(&EXTERNAL_ADDR) {
                    stack.push(EXTERNAL_ADDR);
                }
                continue;
            }
            let a = if stack.is_empty() {
                a
            } else {
                match u.call_addr_from_frame_addr(a) {
                    0 => break,
                    c => c,
                }
            };
            stack.push(a);
        }
        if stack.len() > 1 && stack.last() == Some(&EXTERNAL_ADDR) {
            stack.pop();
        }
        if stack.is_empty() || facts.in_prolog_epilog(stack[0]) {
            continue;
        }
        // extractLBRStack
        lbr.clear();
        for &(s, d) in branches {
            let (si, di) = ((u.is_code)(s), (u.is_code)(d));
            if !si && !di {
                continue;
            }
            lbr.push((if si { s } else { EXTERNAL_ADDR }, if di { d } else { EXTERNAL_ADDR }));
        }
        if lbr.is_empty() {
            continue;
        }
        stack[0] = lbr[0].1;
        u.unwind(&stack, &lbr, *count);
        unwound += 1;
    }
    let off = |a: u64| a.wrapping_sub(base);
    let mut w = io::BufWriter::new(w);
    for (ctx, (ranges, brs)) in &u.out {
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
    Ok(WriteStats { records: unwound, skipped })
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
