//! Address resolvers that need no process state: identity (static non-PIE binaries, or
//! addresses that are already link-time) and perf MMAP2 events the way llvm-profgen uses them.

use crate::{AddressResolver, BinaryId, BinaryInfo};

/// Runtime address == link-time address, for static non-PIE binaries (synthetic sessions)
/// and perf scripts without MMAP events.
#[derive(Clone, Debug, Default)]
pub struct IdentityResolver {
    binaries: Vec<BinaryInfo>,
}

impl IdentityResolver {
    /// Resolver over these binaries (an address belongs to the first binary whose executable
    /// segment contains it).
    pub fn new(binaries: Vec<BinaryInfo>) -> Self {
        Self { binaries }
    }
}

/// The runtime range of `seg` under `off` (runtime = link - `off`), if none of `earlier`'s
/// claims (runtime ranges) overlaps it; else just `addr`.
fn span_unless_claimed(addr: u64, lo: u64, hi: u64, earlier: impl Iterator<Item = (u64, u64)>) -> std::ops::Range<u64> {
    let mut earlier = earlier;
    if lo <= addr && addr < hi && !earlier.any(|(a, b)| a < hi && lo < b) { lo..hi } else { addr..addr.saturating_add(1) }
}

impl AddressResolver for IdentityResolver {
    fn resolve(&self, addr: u64) -> Option<(BinaryId, u64)> {
        let i = self.binaries.iter().position(|b| b.in_exec_segment(addr))?;
        Some((BinaryId(i as u32), addr))
    }
    /// The executable segment (no earlier binary's segment overlapping it).
    fn resolve_span(&self, addr: u64) -> Option<(BinaryId, u64, std::ops::Range<u64>)> {
        let i = self.binaries.iter().position(|b| b.in_exec_segment(addr))?;
        let seg = self.binaries[i].exec_segment(addr)?;
        let earlier =
            self.binaries[..i].iter().flat_map(|b| b.exec_segments.iter().map(|s| (s.vaddr, s.vaddr.saturating_add(s.memsz))));
        let span = span_unless_claimed(addr, seg.vaddr, seg.vaddr.saturating_add(seg.memsz), earlier);
        Some((BinaryId(i as u32), addr, span))
    }
    fn binary(&self, id: BinaryId) -> Option<&BinaryInfo> {
        self.binaries.get(id.0 as usize)
    }
}

/// Resolves addresses with perf MMAP2 events, with llvm-profgen's rules: an event whose file
/// name matches a binary and whose page offset equals the page-aligned file offset of the
/// binary's first executable segment sets the load base; an address `a` then maps to
/// `a - base + preferred_base` (preferred base = page-aligned vaddr of that segment). A binary
/// without such an event is taken as loaded at its preferred base (identity).
#[derive(Clone, Debug, Default)]
pub struct MmapResolver {
    binaries: Vec<BinaryInfo>,
    bases: Vec<Option<u64>>,
}

const PAGE: u64 = 0xfff;

impl MmapResolver {
    /// Resolver over these binaries, none loaded by an event yet.
    pub fn new(binaries: Vec<BinaryInfo>) -> Self {
        let n = binaries.len();
        Self { binaries, bases: vec![None; n] }
    }

    /// Apply one MMAP/MMAP2 event (`start` runtime address, `pgoff` file offset, `path` of the
    /// mapped file). Returns the binary whose base it set, if any.
    pub fn on_mmap(&mut self, start: u64, pgoff: u64, path: &str) -> Option<BinaryId> {
        let name = path.rsplit('/').next().unwrap_or(path);
        for (i, b) in self.binaries.iter().enumerate() {
            if b.file_name() != name {
                continue;
            }
            let Some(seg) = b.exec_segments.first() else { continue };
            if pgoff == seg.offset & !PAGE {
                self.bases[i] = Some(start);
                return Some(BinaryId(i as u32));
            }
        }
        None
    }

    /// Binaries known to this resolver.
    pub fn binaries(&self) -> &[BinaryInfo] {
        &self.binaries
    }
}

impl AddressResolver for MmapResolver {
    fn resolve(&self, addr: u64) -> Option<(BinaryId, u64)> {
        for (i, b) in self.binaries.iter().enumerate() {
            let Some(seg) = b.exec_segments.first() else { continue };
            let link = match self.bases[i] {
                Some(base) => addr.wrapping_sub(base).wrapping_add(seg.vaddr & !PAGE),
                None => addr,
            };
            if b.in_exec_segment(link) {
                return Some((BinaryId(i as u32), link));
            }
        }
        None
    }
    /// The runtime range of the executable segment holding the address (no earlier binary
    /// claiming any of it).
    fn resolve_span(&self, addr: u64) -> Option<(BinaryId, u64, std::ops::Range<u64>)> {
        let (id, link) = self.resolve(addr)?;
        let i = id.0 as usize;
        let seg = self.binaries[i].exec_segment(link)?;
        let off = link.wrapping_sub(addr);
        let (lo, hi) = (seg.vaddr.wrapping_sub(off), seg.vaddr.wrapping_add(seg.memsz).wrapping_sub(off));
        let claims = |j: usize| {
            let b = &self.binaries[j];
            let first = b.exec_segments.first().map_or(0, |s| s.vaddr & !PAGE);
            let off = match self.bases[j] {
                Some(base) => first.wrapping_sub(base),
                None => 0,
            };
            b.exec_segments
                .iter()
                .map(move |s| (s.vaddr.wrapping_sub(off), s.vaddr.wrapping_add(s.memsz).wrapping_sub(off)))
                .collect::<Vec<_>>()
        };
        let earlier: Vec<(u64, u64)> = (0..i).flat_map(claims).collect();
        let span = if lo < hi { span_unless_claimed(addr, lo, hi, earlier.into_iter()) } else { addr..addr.saturating_add(1) };
        Some((id, link, span))
    }
    fn binary(&self, id: BinaryId) -> Option<&BinaryInfo> {
        self.binaries.get(id.0 as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ExecSegment;

    fn pie() -> BinaryInfo {
        BinaryInfo {
            path: "/b/app".into(),
            exec_segments: vec![ExecSegment { vaddr: 0x1000, memsz: 0x2000, offset: 0x1000 }],
            code_ranges: vec![(0x1040, 0x2f00)],
            is_pie: true,
            ..Default::default()
        }
    }

    /// An MMAP2 event at the first exec segment's offset sets the base used to translate.
    #[test]
    fn mmap_sets_base() {
        let mut r = MmapResolver::new(vec![pie()]);
        assert_eq!(r.resolve(0x1500), Some((BinaryId(0), 0x1500)));
        assert_eq!(r.on_mmap(0x5555_5555_5000, 0x1000, "/other/dir/app"), Some(BinaryId(0)));
        assert_eq!(r.resolve(0x5555_5555_5500), Some((BinaryId(0), 0x1500)));
        assert_eq!(r.resolve(0x1500), None);
        assert_eq!(r.on_mmap(0x7000_0000, 0, "/lib/libc.so.6"), None);
    }

    /// Every address of a reported span resolves as the address it was asked for does (same
    /// binary, same offset), for both resolvers, with overlapping binaries and a moved base.
    #[test]
    fn spans_resolve_alike() {
        let other = BinaryInfo {
            path: "/b/lib".into(),
            exec_segments: vec![ExecSegment { vaddr: 0x2800, memsz: 0x1000, offset: 0x1000 }],
            ..Default::default()
        };
        let id = IdentityResolver::new(vec![pie(), other.clone()]);
        let mut mm = MmapResolver::new(vec![pie(), other]);
        mm.on_mmap(0x5000, 0x1000, "/x/lib");
        let check = |r: &dyn AddressResolver| {
            for a in (0..0x8000u64).step_by(0x40) {
                let Some((b, link, span)) = r.resolve_span(a) else { continue };
                assert!(span.contains(&a));
                for x in [span.start, span.end - 1, (span.start + span.end) / 2] {
                    assert_eq!(r.resolve(x), Some((b, x.wrapping_add(link.wrapping_sub(a)))), "{a:#x} span {span:x?} at {x:#x}");
                }
            }
        };
        check(&id);
        check(&mm);
        let s = id.resolve_span(0x1500).unwrap().2;
        assert!(s.end - s.start > 1, "{s:x?}");
    }

    /// Identity resolution only accepts addresses inside an executable segment.
    #[test]
    fn identity_bounds() {
        let r = IdentityResolver::new(vec![pie()]);
        assert_eq!(r.resolve(0x2fff), Some((BinaryId(0), 0x2fff)));
        assert_eq!(r.resolve(0x3000), None);
        assert_eq!(r.binary(BinaryId(0)).unwrap().file_name(), "app");
    }
}
