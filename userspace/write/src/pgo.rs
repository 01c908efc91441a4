//! Writers, one file per binary: aggregated perf-script text for llvm-profgen, the
//! context-insensitive unsymbolized profile (the context-sensitive one is in
//! [`crate::unwind`]), and BOLT's `perf2bolt -pa` input.
//!
//! All take link-time addresses from the profile. Addresses in other binaries or unresolved
//! are written as [`EXTERNAL_ADDR`], which llvm-profgen classifies as external exactly as it
//! would the original address (anything outside the binary's code is external to it).

use std::collections::BTreeMap;
use std::io::{self, Write};

use etm_profile::{HybridProfile, Loc, ProfileBinary};

/// Link-time address used for locations outside the written binary (never code: page 0).
pub const EXTERNAL_ADDR: u64 = 0x1;

/// What a writer wrote.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriteStats {
    /// Distinct samples (perfscript) or records (other formats) written.
    pub records: u64,
    /// Samples skipped because they had no branch in this binary's view.
    pub skipped: u64,
}

/// Facts about the code the unsymbolized writer needs to drop the samples llvm-profgen drops.
pub trait CodeFacts {
    /// Whether a hybrid sample whose leaf is at this link-time address is dropped by
    /// llvm-profgen (function entry or return instruction: "prolog/epilog").
    fn in_prolog_epilog(&self, addr: u64) -> bool;
    /// Whether a call, return or direct jump lies in `[start, end)` (llvm-profgen's
    /// `rangeCrossUncondBranch`: such a fall-through range is bogus).
    fn range_crosses_uncond_branch(&self, start: u64, end: u64) -> bool;
    /// Whether a stack frame at this address is to be written as external (code of a static
    /// binary without debug info, see [`crate::elf::ElfCodeFacts`]). Default: never.
    fn frame_is_external(&self, _addr: u64) -> bool {
        false
    }
}

/// One sample as seen from one binary.
struct View {
    branch_only: bool,
    stack: Vec<u64>,
    branches: Vec<(u64, u64)>,
}

fn loc(l: Loc, b: ProfileBinary) -> u64 {
    l.in_binary(b).unwrap_or(EXTERNAL_ADDR)
}

/// (branch-only, stack, branches) -> count, for one binary.
pub(crate) type ViewMap = BTreeMap<(bool, Vec<u64>, Vec<(u64, u64)>), u64>;

/// Samples touching `b`, translated to b's view (externals collapsed, external-to-external
/// branches dropped as llvm-profgen does), aggregated and sorted for deterministic output.
pub(crate) fn views(p: &HybridProfile, b: ProfileBinary, facts: Option<&dyn CodeFacts>) -> (ViewMap, u64) {
    let frame = |l: Loc| match (loc(l, b), facts) {
        (a, Some(f)) if a != EXTERNAL_ADDR && f.frame_is_external(a) => EXTERNAL_ADDR,
        (a, _) => a,
    };
    let mut out = BTreeMap::new();
    let mut skipped = 0;
    for s in p.samples().filter(|s| s.touches(b)) {
        let v = View {
            branch_only: s.is_branch_only(),
            stack: s.stack().map(frame).collect(),
            branches: s
                .branches()
                .map(|(f, t)| (loc(f, b), loc(t, b)))
                .filter(|&(f, t)| !(f == EXTERNAL_ADDR && t == EXTERNAL_ADDR))
                .collect(),
        };
        if v.branches.is_empty() {
            skipped += 1;
            continue;
        }
        *out.entry((v.branch_only, v.stack, v.branches)).or_insert(0) += s.count;
    }
    (out, skipped)
}

/// Aggregated perf-script text for `llvm-profgen --perfscript` (link-time addresses, no MMAP
/// line). Hybrid layout when the binary has any sample with a stack, else branch-only layout;
/// in hybrid layout branch-only samples appear with their IP as a one-frame stack.
/// Stack-only samples (no branches) cannot be expressed and are skipped.
pub fn write_perfscript<W: Write>(p: &HybridProfile, b: ProfileBinary, w: W) -> io::Result<WriteStats> {
    write_perfscript_with(p, b, None, w)
}

/// [`write_perfscript`] with code facts: stack frames `facts` calls external are written as
/// external (static binaries: see [`crate::elf::ElfCodeFacts`]).
pub fn write_perfscript_with<W: Write>(
    p: &HybridProfile,
    b: ProfileBinary,
    facts: Option<&dyn CodeFacts>,
    mut w: W,
) -> io::Result<WriteStats> {
    let (views, skipped) = views(p, b, facts);
    let hybrid = views.keys().any(|(bo, _, _)| !bo);
    let mut st = WriteStats { records: 0, skipped };
    let mut line = String::with_capacity(1024);
    for ((_, stack, branches), count) in &views {
        use std::fmt::Write as _;
        line.clear();
        let _ = writeln!(line, "{count}");
        if hybrid {
            for a in stack {
                let _ = writeln!(line, "\t{a:>16x}");
            }
        } else {
            let _ = write!(line, "  {:x}", stack.first().copied().unwrap_or(branches[0].1));
        }
        for (f, t) in branches {
            let _ = write!(line, " 0x{f:x}/0x{t:x}/P/-/-/0 ");
        }
        line.pop();
        line.push('\n');
        w.write_all(line.as_bytes())?;
        st.records += 1;
    }
    w.flush()?;
    Ok(st)
}

/// (start, end) -> count; hashed while aggregating, sorted when written.
type Counter = hashbrown::HashMap<(u64, u64), u64>;

fn sorted(c: Counter) -> Vec<((u64, u64), u64)> {
    let mut v: Vec<_> = c.into_iter().collect();
    v.sort_unstable();
    v
}

/// Range and branch counts llvm-profgen derives from one LBR stack without context
/// (`PerfScriptReader::computeCounterFromLBR`): a branch counts if its target is code; the
/// fall-through from one branch's target to the next newer branch's source counts when both
/// ends are code, start <= end and no call, return or direct jump lies inside.
fn counters_from_lbr(
    branches: &[(u64, u64)],
    count: u64,
    is_code: &dyn Fn(u64) -> bool,
    facts: Option<&dyn CodeFacts>,
    ranges: &mut Counter,
    brs: &mut Counter,
) {
    let mut end = 0u64;
    for &(src, dst) in branches {
        if is_code(dst) {
            *brs.entry((src, dst)).or_insert(0) += count;
        }
        if is_code(dst) && is_code(end) && dst <= end && !facts.is_some_and(|f| f.range_crosses_uncond_branch(dst, end)) {
            *ranges.entry((dst, end)).or_insert(0) += count;
        }
        end = src;
    }
}

/// Context-insensitive unsymbolized profile (`llvm-profgen --unsymbolized-profile`): what
/// llvm-profgen computes from the same samples with `--ignore-stack-samples` (or from
/// branch-only samples). Offsets are from the page-aligned first executable segment. Hybrid
/// samples whose leaf `facts` says is in a prolog/epilog are dropped, as llvm-profgen does.
///
/// The context-sensitive form (DWARF binaries with hybrid samples) is
/// [`crate::unwind::write_unsymbolized_cs`]; for pseudo-probe binaries LLVM 22 crashes reading
/// it, so they get this form and the perf-script dump carries their contexts.
pub fn write_unsymbolized<W: Write>(
    p: &HybridProfile,
    b: ProfileBinary,
    facts: Option<&dyn CodeFacts>,
    w: W,
) -> io::Result<WriteStats> {
    let info = &p.binaries()[b];
    let base = info.first_exec_vaddr().unwrap_or(0) & !0xfff;
    let is_code = |a: u64| info.is_code(a);
    let (views, skipped) = views(p, b, None);
    let mut ranges = Counter::new();
    let mut brs = Counter::new();
    for ((branch_only, stack, branches), count) in &views {
        if !branch_only
            && let (Some(f), Some(&leaf)) = (facts, stack.first())
            && leaf != EXTERNAL_ADDR
            && f.in_prolog_epilog(leaf)
        {
            continue;
        }
        counters_from_lbr(branches, *count, &is_code, facts, &mut ranges, &mut brs);
    }
    let (ranges, brs) = (sorted(ranges), sorted(brs));
    let off = |a: u64| a.wrapping_sub(base);
    let mut w = io::BufWriter::new(w);
    writeln!(w, "{}", ranges.len())?;
    for ((s, e), c) in &ranges {
        writeln!(w, "{:x}-{:x}:{c}", off(*s), off(*e))?;
    }
    writeln!(w, "{}", brs.len())?;
    for ((s, d), c) in &brs {
        writeln!(w, "{:x}->{:x}:{c}", off(*s), off(*d))?;
    }
    w.flush()?;
    Ok(WriteStats { records: (ranges.len() + brs.len()) as u64, skipped })
}

/// BOLT pre-aggregated profile (`perf2bolt -pa`): `B from to count 0` per taken branch with
/// at least one end in the binary (the other as `X:0`), and `F start end count` per
/// fall-through between consecutive branches inside the binary (start <= end).
pub fn write_bolt_pa<W: Write>(p: &HybridProfile, b: ProfileBinary, w: W) -> io::Result<WriteStats> {
    let (views, skipped) = views(p, b, None);
    let mut brs = Counter::new();
    let mut fts = Counter::new();
    for ((_, _, branches), count) in &views {
        let mut newer: Option<u64> = None;
        for &(f, t) in branches {
            *brs.entry((f, t)).or_insert(0) += count;
            if let Some(end) = newer
                && t != EXTERNAL_ADDR
                && end != EXTERNAL_ADDR
                && t <= end
            {
                *fts.entry((t, end)).or_insert(0) += count;
            }
            newer = Some(f);
        }
    }
    let (brs, fts) = (sorted(brs), sorted(fts));
    let mut w = io::BufWriter::new(w);
    for ((f, t), c) in &brs {
        match (*f == EXTERNAL_ADDR, *t == EXTERNAL_ADDR) {
            (false, false) => writeln!(w, "B {f:x} {t:x} {c} 0")?,
            (true, false) => writeln!(w, "B X:0 {t:x} {c} 0")?,
            (false, true) => writeln!(w, "B {f:x} X:0 {c} 0")?,
            (true, true) => {}
        }
    }
    for ((s, e), c) in &fts {
        writeln!(w, "F {s:x} {e:x} {c}")?;
    }
    w.flush()?;
    Ok(WriteStats { records: (brs.len() + fts.len()) as u64, skipped })
}

/// File names of the dumps for a binary, in the order [perfscript, unsymbolized, bolt].
pub fn dump_file_names(file_name: &str) -> [String; 3] {
    [format!("{file_name}.perfscript"), format!("{file_name}.unsym.txt"), format!("{file_name}.bolt.pa")]
}

#[cfg(test)]
mod tests {
    use super::*;
    use etm_profile::{BinaryInfo, Branch, ExecSegment, HybridSample, IdentityResolver};

    fn profile() -> HybridProfile {
        let r = IdentityResolver::new(vec![BinaryInfo {
            path: "/x/app".into(),
            exec_segments: vec![ExecSegment { vaddr: 0x401000, memsz: 0x1000, offset: 0x1000 }],
            code_ranges: vec![(0x401000, 0x402000)],
            ..Default::default()
        }]);
        let mut p = HybridProfile::default();
        let br = [Branch { from: 0x401010, to: 0x401100 }, Branch { from: 0x7f00_0000_0000, to: 0x401000 }];
        p.add(&HybridSample { stack: &[0x401104, 0x7f00_0000_0010], branches: &br }, &r);
        p.add(&HybridSample { stack: &[0x401104, 0x7f00_0000_0010], branches: &br }, &r);
        p
    }

    /// The perf-script dump is aggregated hybrid text with externals collapsed.
    #[test]
    fn perfscript_text() {
        let mut out = Vec::new();
        write_perfscript(&profile(), 0, &mut out).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "2\n\t          401104\n\t               1\n 0x401010/0x401100/P/-/-/0  0x1/0x401000/P/-/-/0\n"
        );
    }

    struct NoDebugAbove(u64);
    impl CodeFacts for NoDebugAbove {
        fn in_prolog_epilog(&self, _: u64) -> bool {
            false
        }
        fn range_crosses_uncond_branch(&self, _: u64, _: u64) -> bool {
            false
        }
        fn frame_is_external(&self, a: u64) -> bool {
            a >= self.0
        }
    }

    /// Frames the code facts call external are written as the external address.
    #[test]
    fn perfscript_external_frames() {
        let mut out = Vec::new();
        write_perfscript_with(&profile(), 0, Some(&NoDebugAbove(0x401100)), &mut out).unwrap();
        assert!(String::from_utf8(out).unwrap().starts_with("2\n\t               1\n\t               1\n"));
    }

    /// The unsymbolized dump counts the fall-through between the two branches and both
    /// branches, as offsets from the exec segment base.
    #[test]
    fn unsymbolized_text() {
        let mut out = Vec::new();
        write_unsymbolized(&profile(), 0, None, &mut out).unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), "1\n0-10:2\n2\nffffffffffbff001->0:2\n10->100:2\n");
    }

    /// The BOLT dump has B lines (external as X:0) and the fall-through F line.
    #[test]
    fn bolt_text() {
        let mut out = Vec::new();
        write_bolt_pa(&profile(), 0, &mut out).unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), "B X:0 401000 2 0\nB 401010 401100 2 0\nF 401000 401010 2\n");
    }
}
