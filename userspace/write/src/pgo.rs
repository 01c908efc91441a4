//! Writers, one file per binary: aggregated perf-script text for llvm-profgen (from the
//! profile's sample store), the context-insensitive unsymbolized profile and BOLT's `perf2bolt
//! -pa` input (from the profile's counters; the context-sensitive unsymbolized profile is in
//! [`crate::unwind`]).
//!
//! All take link-time addresses from the profile. Addresses in other binaries or unresolved
//! are written as [`EXTERNAL_ADDR`], which llvm-profgen classifies as external exactly as it
//! would the original address (anything outside the binary's code is external to it).

use std::collections::BTreeMap;
use std::io::{self, Write};

pub use etm_profile::EXTERNAL_ADDR;
use etm_profile::agg::NO_START;
use etm_profile::{CodeFacts, HybridProfile, Loc, ProfileBinary};

/// What a writer wrote.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriteStats {
    /// Distinct samples (perfscript) or records (other formats) written.
    pub records: u64,
    /// Samples skipped because they had no branch in this binary's view.
    pub skipped: u64,
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
/// line) of the samples in the profile's sample store. Hybrid layout when the binary has any
/// sample with a stack, else branch-only layout; in hybrid layout branch-only samples appear
/// with their IP as a one-frame stack. Stack-only samples (no branches) cannot be expressed
/// and are skipped. Stack frames the binary's code facts call external are written as
/// external (static binaries: see [`crate::elf::ElfCodeFacts`]).
pub fn write_perfscript<W: Write>(p: &HybridProfile, b: ProfileBinary, mut w: W) -> io::Result<WriteStats> {
    let (views, skipped) = views(p, b, Some(p.agg(b).facts()));
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

/// (start, end) -> count; hashed while summing, sorted when written.
type Counter = hashbrown::HashMap<(u64, u64), u64>;

/// ((start, end), count) sorted.
pub type Sorted = Vec<((u64, u64), u64)>;

fn sorted(c: Counter) -> Sorted {
    let mut v: Vec<_> = c.into_iter().collect();
    v.sort_unstable();
    v
}

/// The context-free counters of binary `b` (`computeCounterFromLBR` over every sample
/// llvm-profgen keeps): the profile's per-context counts summed over contexts (see
/// [`etm_profile::agg`]).
pub fn context_free_counters(p: &HybridProfile, b: ProfileBinary) -> (Sorted, Sorted) {
    let agg = p.agg(b);
    let hybrid = agg.has_hybrid();
    let mut ranges = Counter::new();
    let mut brs = Counter::new();
    for c in agg.counts().filter(|c| c.in_context_free(hybrid)) {
        if let Some(r) = c.tuple.range() {
            *ranges.entry(r).or_insert(0) += c.count;
        }
        if let Some(br) = c.tuple.branch() {
            *brs.entry(br).or_insert(0) += c.count;
        }
    }
    (sorted(ranges), sorted(brs))
}

/// Context-insensitive unsymbolized profile (`llvm-profgen --unsymbolized-profile`): what
/// llvm-profgen computes from the same samples with `--ignore-stack-samples` (or from
/// branch-only samples), written from the profile's counters. Offsets are from the
/// page-aligned first executable segment.
///
/// The context-sensitive form (DWARF binaries with hybrid samples) is
/// [`crate::unwind::write_unsymbolized_cs`]; for pseudo-probe binaries LLVM 22 crashes reading
/// it, so they get this form and the perf-script dump carries their contexts.
pub fn write_unsymbolized<W: Write>(p: &HybridProfile, b: ProfileBinary, w: W) -> io::Result<WriteStats> {
    let info = &p.binaries()[b];
    let base = info.first_exec_vaddr().unwrap_or(0) & !0xfff;
    let (ranges, brs) = context_free_counters(p, b);
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
    Ok(WriteStats { records: (ranges.len() + brs.len()) as u64, skipped: 0 })
}

/// BOLT pre-aggregated profile (`perf2bolt -pa`): `B from to count 0` per taken branch with
/// at least one end in the binary (the other as `X:0`), and `F start end count` per
/// fall-through between consecutive branches inside the binary (start <= end), from every
/// sample (the ones llvm-profgen drops included), read from the profile's counters.
pub fn write_bolt_pa<W: Write>(p: &HybridProfile, b: ProfileBinary, w: W) -> io::Result<WriteStats> {
    let mut brs = Counter::new();
    let mut fts = Counter::new();
    for c in p.agg(b).counts().filter(|c| c.in_bolt()) {
        let t = c.tuple;
        *brs.entry((t.src, t.dst)).or_insert(0) += c.count;
        if t.start != NO_START && t.start != EXTERNAL_ADDR && t.src != EXTERNAL_ADDR && t.start <= t.src {
            *fts.entry((t.start, t.src)).or_insert(0) += c.count;
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
    Ok(WriteStats { records: (brs.len() + fts.len()) as u64, skipped: 0 })
}

/// File names of the dumps for a binary, in the order [perfscript, unsymbolized, bolt].
pub fn dump_file_names(file_name: &str) -> [String; 3] {
    [format!("{file_name}.perfscript"), format!("{file_name}.unsym.txt"), format!("{file_name}.bolt.pa")]
}

/// File name of the context-free unsymbolized profile written beside a context-sensitive
/// `.unsym.txt` (AutoFDO input).
pub fn autofdo_file_name(file_name: &str) -> String {
    format!("{file_name}.autofdo.unsym.txt")
}

#[cfg(test)]
mod tests {
    use super::*;
    use etm_profile::{BinaryInfo, Branch, ExecSegment, HybridSample, IdentityResolver};

    fn profile() -> HybridProfile {
        profile_with(None)
    }

    fn profile_with(facts: Option<etm_profile::FactsProvider>) -> HybridProfile {
        let r = IdentityResolver::new(vec![BinaryInfo {
            path: "/x/app".into(),
            exec_segments: vec![ExecSegment { vaddr: 0x401000, memsz: 0x1000, offset: 0x1000 }],
            code_ranges: vec![(0x401000, 0x402000)],
            ..Default::default()
        }]);
        let limits = etm_profile::ProfileLimits { keep_samples: etm_profile::KeepSamples::All, ..Default::default() };
        let mut p = HybridProfile::new(limits);
        if let Some(f) = facts {
            p.set_facts_provider(f);
        }
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
        fn is_inst(&self, a: u64) -> bool {
            (0x401000..0x402000).contains(&a)
        }
        fn is_call(&self, _: u64) -> bool {
            false
        }
        fn is_return(&self, _: u64) -> bool {
            false
        }
        fn in_prolog_epilog(&self, _: u64) -> bool {
            false
        }
        fn prev_inst(&self, _: u64) -> Option<u64> {
            None
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
        let facts: etm_profile::FactsProvider = std::sync::Arc::new(|_: &BinaryInfo| {
            Some(std::sync::Arc::new(NoDebugAbove(0x401100)) as std::sync::Arc<dyn CodeFacts>)
        });
        write_perfscript(&profile_with(Some(facts)), 0, &mut out).unwrap();
        assert!(String::from_utf8(out).unwrap().starts_with("2\n\t               1\n\t               1\n"));
    }

    /// The unsymbolized dump counts the fall-through between the two branches and both
    /// branches, as offsets from the exec segment base.
    #[test]
    fn unsymbolized_text() {
        let mut out = Vec::new();
        write_unsymbolized(&profile(), 0, &mut out).unwrap();
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
