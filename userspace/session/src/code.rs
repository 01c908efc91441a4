//! The code the trace ran: images and where each process maps them (from MMAP2 records and
//! the recording's images), read for the decoder ([`crate::window::WindowDecoder`]), the
//! join's validation ([`CodeOracle`]) and the exact counts.

use etm_profile::exact::IntMap;
use std::sync::Arc;

use etm_profile::{AddressResolver, BinaryId, BinaryInfo};

use crate::image::ImageBytes;
use crate::isa::{self, a64_kind};
use crate::join::{CodeOracle, InsnKind, Straight};
use crate::session::{CodeArch, SessionEvent, Sideband};

/// A code image: path, bytes and its ELF description.
#[derive(Debug)]
struct Image {
    path: String,
    data: ImageBytes,
    /// Function symbols (start, end, name), sorted by start: read at the first lookup,
    /// shared per build-id ([`etm_stacks::symtab::SymbolTable::of_binary_shared`]).
    symbols: std::sync::OnceLock<Arc<etm_stacks::symtab::SymbolTable>>,
    /// The architecture of its code (ELF `e_machine`), for the callers check.
    arch: Option<CodeArch>,
}

impl Image {
    fn symbols(&self) -> &etm_stacks::symtab::SymbolTable {
        self.symbols.get_or_init(|| etm_stacks::symtab::SymbolTable::of_binary_shared(&self.data))
    }
}

#[derive(Debug, Clone, Copy)]
struct Mapping {
    start: u64,
    end: u64,
    pgoff: u64,
    image: usize,
}

/// Whose code a traced context runs ([`CodeMap::context_code`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContextCode {
    /// The target's (no context traced, or the session knows no process mappings: static
    /// images serve any context).
    Target,
    /// This process's.
    Process(u32),
    /// A thread of no process with known code: another process, not decoded.
    Foreign,
}

/// Code images and where they are mapped, per process (from MMAP2 records); reads
/// instructions for the decoder and the join's validation. Cheap to clone (the images are
/// shared, read-only): decode workers ([`PipelineConfig::decode_threads`]) read a snapshot.
#[derive(Debug, Default, Clone)]
pub struct CodeMap {
    images: Vec<Arc<Image>>,
    /// Per process (few: a linear scan beats hashing on the per-instruction path).
    by_pid: Vec<(u32, Vec<Mapping>)>,
    /// Mappings of processes not seen in any MMAP2 (static images placed at their link-time
    /// addresses: synthetic sessions without sideband).
    any: Vec<Mapping>,
    /// The process the decoder reads code of (first process with an MMAP2 of a known image).
    target: Option<u32>,
    /// Thread id -> process id, from the sideband and the samples (a traced context is a
    /// thread id: CONTEXTIDR holds `task_pid_nr`, `contextidr_thread_switch`).
    tids: IntMap<u32, u32>,
    /// Bumped whenever which code a context sees may have changed (mappings, threads): the
    /// decoders' block-cache tags ([`MemoryAccess::code_id`](etm_decode::image::MemoryAccess::code_id)) are recomputed then.
    pub(crate) generation: u64,
    /// The instruction set of the code ([`PipelineConfig::arch`]).
    arch: Option<CodeArch>,
}

impl CodeMap {
    fn image_for(&self, path: &str) -> Option<usize> {
        let name = path.rsplit('/').next().unwrap_or(path);
        self.images
            .iter()
            .position(|i| i.path == path)
            .or_else(|| self.images.iter().position(|i| i.path.rsplit('/').next() == Some(name)))
    }

    /// The bytes of the image registered under `path`.
    pub fn image_bytes(&self, path: &str) -> Option<&[u8]> {
        self.images.iter().find(|i| i.path == path).map(|i| i.data.as_slice())
    }

    /// Images whose mapped file was changed in place since it was mapped
    /// ([`ImageBytes::changed`]: their bytes may no longer be the code the target runs).
    pub fn images_changed(&self) -> usize {
        self.images.iter().filter(|i| i.data.changed()).count()
    }

    /// [`image_bytes`](Self::image_bytes), shared (for a copy taken off the pipeline).
    pub fn image_arc(&self, path: &str) -> Option<ImageBytes> {
        self.images.iter().find(|i| i.path == path).map(|i| i.data.clone())
    }

    fn pid_maps(&self, pid: u32) -> Option<&Vec<Mapping>> {
        self.by_pid.iter().find(|(p, _)| *p == pid).map(|(_, m)| m)
    }

    fn mappings(&self, pid: u32) -> &[Mapping] {
        match self.by_pid.iter().find(|(p, _)| *p == pid).map(|(_, m)| m) {
            Some(m) if !m.is_empty() => m,
            _ => &self.any,
        }
    }

    /// Notes that thread `tid` belongs to process `pid`.
    pub fn note_thread(&mut self, pid: u32, tid: u32) {
        if tid != 0 && self.tids.insert(tid, pid) != Some(pid) {
            self.generation += 1;
        }
    }

    /// See the field.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// One id per distinct code view: the process whose mappings a context reads (all its
    /// threads share it), the target's for an untraced context, none for a foreign one.
    pub fn code_id(&self, context_id: Option<u32>) -> u64 {
        match self.context_code(context_id) {
            ContextCode::Target => u64::from(self.target.unwrap_or(0)),
            ContextCode::Process(pid) => u64::from(pid),
            ContextCode::Foreign => u64::from(u32::MAX),
        }
    }

    /// Whose code a trace context (a thread id) runs.
    pub fn context_code(&self, context_id: Option<u32>) -> ContextCode {
        let Some(tid) = context_id else { return ContextCode::Target };
        if self.by_pid.is_empty() {
            return ContextCode::Target;
        }
        let pid = self.tids.get(&tid).copied().unwrap_or(tid);
        if self.pid_maps(pid).is_some() { ContextCode::Process(pid) } else { ContextCode::Foreign }
    }

    /// The code bytes from runtime address `addr` of `pid` to the end of its mapping (`None`:
    /// unmapped). `pid` `None` means the target process (the first process with mappings).
    pub fn slice(&self, pid: Option<u32>, addr: u64) -> Option<&[u8]> {
        self.mapped_code(self.mapping(pid, addr)?, addr)
    }

    /// [`slice`](Self::slice) of `addr` in mapping `m` (which holds it).
    #[inline]
    fn mapped_code(&self, m: &Mapping, addr: u64) -> Option<&[u8]> {
        let off = (addr - m.start).checked_add(m.pgoff)? as usize;
        let end = ((m.end - m.start).checked_add(m.pgoff)? as usize).min(self.images[m.image].data.len());
        self.images[m.image].data.get(off..end).filter(|s| !s.is_empty())
    }

    /// The mapping holding runtime address `addr` of `pid` (as [`slice`](Self::slice)).
    #[inline]
    fn mapping(&self, pid: Option<u32>, addr: u64) -> Option<&Mapping> {
        let maps = match pid.or(self.target) {
            Some(p) => self.mappings(p),
            None => &self.any,
        };
        let i = maps.partition_point(|m| m.end <= addr);
        maps.get(i).filter(|m| m.start <= addr && addr < m.end)
    }

    /// Whether the instruction before return address `ret` of `pid` is a call (`None`: the
    /// code there is unknown, or of an architecture without the check), by the architecture
    /// of the image that holds it (its ELF header): A64 `BL`/`BLR` and the PAuth forms
    /// ([`a64_kind`]), x86-64 any call encoding ending exactly there ([`isa::x86_after_call`]).
    /// The one rule for the join's validation ([`CodeOracle::after_call`]) and the callers
    /// check ([`checked_depth`](Self::checked_depth)).
    pub fn call_before(&self, pid: u32, ret: u64) -> Option<bool> {
        let maps = self.mappings(pid);
        let last = ret.checked_sub(1)?;
        let i = maps.partition_point(|m| m.end <= last);
        let m = maps.get(i).filter(|m| m.start <= last)?;
        let img = &self.images[m.image];
        let arch = img.arch.or(self.arch)?;
        let max = match arch {
            CodeArch::Aarch64 => 4,
            CodeArch::X86_64 => isa::X86_MAX_INSN as u64,
        };
        let from = ret.saturating_sub(max).max(m.start);
        let lo = (from - m.start).checked_add(m.pgoff)? as usize;
        let hi = (ret - m.start).checked_add(m.pgoff)? as usize;
        let before = img.data.get(lo..hi)?;
        Some(match arch {
            CodeArch::Aarch64 => {
                let w = before.get(before.len().checked_sub(4)?..)?;
                a64_kind(u32::from_le_bytes([w[0], w[1], w[2], w[3]])) == InsnKind::Call
            }
            CodeArch::X86_64 => isa::x86_after_call(before, ret),
        })
    }

    /// How many frames of `stack` (leaf first) to keep: up to, not including, the first
    /// return address that cannot be one: outside user space (below 4096, the kernel's
    /// smallest `mmap_min_addr` (mm/Kconfig `DEFAULT_MMAP_MIN_ADDR`; distributions use 32 or
    /// 64 KiB), or at or above 2^56, beyond any user address: x86-64 5-level `TASK_SIZE_MAX`
    /// is 2^56 - 4096, arm64 `VA_BITS` at most 52), or whose preceding instruction is known
    /// and is not a call.
    pub fn checked_depth(&self, pid: u32, stack: &[u64]) -> usize {
        for (i, &ret) in stack.iter().enumerate().skip(1) {
            if !self.can_return_to(pid, ret) {
                return i;
            }
        }
        stack.len()
    }

    /// The check of one return address of [`checked_depth`](Self::checked_depth).
    fn can_return_to(&self, pid: u32, ret: u64) -> bool {
        (0x1000..1 << 56).contains(&ret) && self.call_before(pid, ret) != Some(false)
    }

    /// [`checked_depth`](Self::checked_depth), each return address's answer kept in `cache`
    /// for the map's generation (a profile's stacks pass through the same few hundred).
    #[inline]
    pub(crate) fn checked_depth_cached(&self, pid: u32, stack: &[u64], cache: &mut CallerCache) -> usize {
        if cache.generation != self.generation {
            cache.slots.fill((0, 0, false));
            cache.generation = self.generation;
        }
        for (i, &ret) in stack.iter().enumerate().skip(1) {
            let slot = &mut cache.slots[(ret.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - CALLER_BITS)) as usize];
            let ok = if slot.0 == pid && slot.1 == ret && ret != 0 {
                slot.2
            } else {
                let ok = self.can_return_to(pid, ret);
                *slot = (pid, ret, ok);
                ok
            };
            if !ok {
                return i;
            }
        }
        stack.len()
    }

    /// `len` bytes of code at runtime address `addr` of `pid` (`None` if unmapped or out of
    /// the file).
    pub fn read(&self, pid: Option<u32>, addr: u64, len: usize) -> Option<&[u8]> {
        self.slice(pid, addr)?.get(..len)
    }

    /// The 32-bit little-endian word at `addr` (one A64 instruction).
    pub fn read_u32(&self, pid: Option<u32>, addr: u64) -> Option<u32> {
        self.read(pid, addr, 4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// What `ev` changes in the code map (mappings, threads), the one place for it: the
    /// pipeline applies it to its map, a decode pool to the map its workers read ahead of
    /// the join. Returns the image an MMAP2 placed.
    pub(crate) fn apply(&mut self, ev: &SessionEvent<'_>) -> Option<usize> {
        let sb = match ev {
            SessionEvent::Sample(s) => {
                self.note_thread(s.pid, s.tid);
                return None;
            }
            SessionEvent::Aux { .. } => return None,
            SessionEvent::Sideband(sb) => sb,
        };
        let mut placed = None;
        match sb {
            Sideband::Mmap2 { pid, addr, len, pgoff, filename, .. } => placed = self.on_mmap(*pid, *addr, *len, *pgoff, filename),
            Sideband::Fork { pid, ppid, .. } => {
                if pid != ppid
                    && let Some(m) = self.pid_maps(*ppid).cloned()
                    && self.pid_maps(*pid).is_none()
                {
                    self.by_pid.push((*pid, m));
                    self.generation += 1;
                }
            }
            Sideband::Comm { pid, exec: true, .. } => {
                self.by_pid.retain(|(p, _)| p != pid);
                self.generation += 1;
            }
            Sideband::Switch { out, pid, tid, next_prev, cpu: Some(_), .. } => {
                self.note_thread(*pid, *tid);
                if let (true, Some((p, t))) = (*out, next_prev) {
                    self.note_thread(*p, *t);
                }
            }
            _ => {}
        }
        match sb {
            Sideband::Mmap2 { pid, tid, .. } | Sideband::Comm { pid, tid, .. } | Sideband::ItraceStart { pid, tid, .. } => {
                self.note_thread(*pid, *tid)
            }
            Sideband::Fork { pid, tid, .. } => self.note_thread(*pid, *tid),
            _ => {}
        }
        placed
    }

    /// An MMAP2 of a known image: its mapping in `pid`. Returns the image.
    fn on_mmap(&mut self, pid: u32, addr: u64, len: u64, pgoff: u64, filename: &str) -> Option<usize> {
        let img = self.image_for(filename)?;
        let m = Mapping { start: addr, end: addr.saturating_add(len), pgoff, image: img };
        if self.pid_maps(pid).is_none() {
            self.by_pid.push((pid, Vec::new()));
        }
        let list = &mut self.by_pid.iter_mut().find(|(p, _)| *p == pid).expect("just added").1;
        CodeMap::insert(list, m);
        self.target.get_or_insert(pid);
        self.generation += 1;
        Some(img)
    }

    fn insert(list: &mut Vec<Mapping>, m: Mapping) {
        // Later mappings replace overlapped parts of earlier ones (simplified: drop overlaps).
        list.retain(|o| o.end <= m.start || o.start >= m.end);
        let i = list.partition_point(|o| o.start < m.start);
        list.insert(i, m);
    }
}

impl CodeOracle for CodeMap {
    fn insn_kind(&self, pid: u32, addr: u64) -> Option<InsnKind> {
        match self.arch? {
            CodeArch::Aarch64 => self.read_u32(Some(pid), addr).map(a64_kind),
            // Bytes that are no instruction always break the flow (they fault).
            CodeArch::X86_64 => Some(self.x86_at(pid, addr)?.map_or(InsnKind::Flow, |(k, _)| k)),
        }
    }

    fn generation(&self) -> Option<u64> {
        Some(self.generation)
    }

    fn insn_len(&self, pid: u32, addr: u64) -> Option<u64> {
        match self.arch? {
            CodeArch::Aarch64 => Some(4),
            CodeArch::X86_64 => self.x86_at(pid, addr)?.map(|(_, n)| n),
        }
    }

    fn after_call(&self, pid: u32, addr: u64) -> Option<bool> {
        self.arch?;
        self.call_before(pid, addr)
    }

    /// One mapping lookup for the whole range (the per-instruction default looks each up);
    /// past the end of that mapping, the default's per-instruction lookups.
    fn straight_code(&self, pid: u32, from: u64, to: u64) -> Straight {
        match self.arch {
            None => Straight::Unknown,
            Some(CodeArch::Aarch64) => {
                let mut a = from;
                if let Some(code) = self.slice(Some(pid), from) {
                    for w in code.chunks_exact(4) {
                        if a >= to {
                            return Straight::Yes;
                        }
                        if !a64_kind(u32::from_le_bytes([w[0], w[1], w[2], w[3]])).is_straight() {
                            return Straight::Flow;
                        }
                        a += 4;
                    }
                }
                while a < to {
                    match self.insn_kind(pid, a) {
                        None => return Straight::Unknown,
                        Some(k) if k.is_straight() => {}
                        Some(_) => return Straight::Flow,
                    }
                    a += 4;
                }
                Straight::Yes
            }
            Some(CodeArch::X86_64) => {
                // Decoded forwards from `from` (a branch target: an instruction start); `to`
                // must be where an instruction starts, not inside one.
                let mut a = from;
                while a < to {
                    match self.x86_at(pid, a) {
                        None => return Straight::Unknown,
                        Some(None) => return Straight::Flow,
                        Some(Some((k, _))) if !k.is_straight() => return Straight::Flow,
                        Some(Some((_, n))) => a += n,
                    }
                }
                if a == to { Straight::Yes } else { Straight::Flow }
            }
        }
    }
}

impl CodeMap {
    /// The x86-64 instruction at `addr`: `None` if no code is known there, `Some(None)` if
    /// the bytes are no instruction.
    fn x86_at(&self, pid: u32, addr: u64) -> Option<Option<(InsnKind, u64)>> {
        let code = self.slice(Some(pid), addr)?;
        Some(isa::x86_decode(code, addr))
    }

    /// The instruction set the code checks decode (`None`: unknown, no checks).
    pub fn arch(&self) -> Option<CodeArch> {
        self.arch
    }
}

impl CodeMap {
    /// An empty code map whose checks decode `arch` (`None`: none).
    pub(crate) fn new(arch: Option<CodeArch>) -> CodeMap {
        CodeMap { arch, ..Default::default() }
    }

    /// Registers a code image (`info`: its ELF description, `None` if it has none: then it has
    /// no symbols either), placing its exec segments at their link-time addresses until an
    /// MMAP2 moves them. Returns its index.
    pub(crate) fn add_image(&mut self, path: &str, data: ImageBytes, info: Option<&etm_profile::BinaryInfo>) -> usize {
        let symbols = std::sync::OnceLock::new();
        if info.is_none() {
            let _ = symbols.set(Arc::default());
        }
        let idx = self.images.len();
        for s in info.iter().flat_map(|i| &i.exec_segments) {
            CodeMap::insert(
                &mut self.any,
                Mapping { start: s.vaddr, end: s.vaddr.saturating_add(s.memsz), pgoff: s.offset, image: idx },
            );
        }
        let arch = CodeArch::of_elf(&data);
        self.images.push(Arc::new(Image { path: path.to_string(), data, symbols, arch }));
        self.generation += 1;
        idx
    }

    /// The function symbols of image `img` (read at the first call).
    pub(crate) fn symbols(&self, img: usize) -> &etm_stacks::symtab::SymbolTable {
        self.images[img].symbols()
    }
}

/// Resolver over the code map's images, placed by MMAP2 records (or at link time).
#[derive(Debug, Default)]
pub(crate) struct Resolver {
    /// Images with ELF info: index into `CodeMap::images`, and the `BinaryInfo`.
    pub(crate) binaries: Vec<(usize, BinaryInfo)>,
    /// Runtime mapping of exec segments: (start, end, bias to add, binary index).
    pub(crate) places: Vec<(u64, u64, u64, u32)>,
    /// Per binary: an MMAP2 placed it (then its link-time addresses mean nothing at run time).
    pub(crate) placed: Vec<bool>,
}

impl AddressResolver for Resolver {
    fn resolve(&self, addr: u64) -> Option<(BinaryId, u64)> {
        self.resolve_span(addr).map(|(b, link, _)| (b, link))
    }
    fn resolve_span(&self, addr: u64) -> Option<(BinaryId, u64, std::ops::Range<u64>)> {
        let i = self.places.partition_point(|p| p.1 <= addr);
        if let Some(&(s, e, bias, b)) = self.places.get(i)
            && s <= addr
            && addr < e
        {
            return Some((BinaryId(b), addr.wrapping_add(bias), s..e));
        }
        // Binaries no MMAP2 placed: identity (static, non-PIE, synthetic sessions). A placed
        // one is not also at its link-time addresses: a small garbage value read as a
        // return address would otherwise resolve into a library linked at 0 (e.g. [vdso]).
        let unplaced = |i: usize| !self.placed.get(i).copied().unwrap_or(false);
        let (b, seg) = self
            .binaries
            .iter()
            .enumerate()
            .filter(|&(i, _)| unplaced(i))
            .find_map(|(i, (_, b))| Some((i, b.exec_segment(addr)?)))?;
        // Alike: the segment between the neighbouring placed mappings, if no binary found
        // before this one has code in it.
        let lo = seg.vaddr.max(i.checked_sub(1).map_or(0, |j| self.places[j].1));
        let hi = seg.vaddr.saturating_add(seg.memsz).min(self.places.get(i).map_or(u64::MAX, |p| p.0));
        let shadowed = self.binaries[..b].iter().enumerate().any(|(j, (_, o))| {
            unplaced(j) && o.exec_segments.iter().any(|s| s.vaddr < hi && lo < s.vaddr.saturating_add(s.memsz))
        });
        let span = if shadowed { addr..addr.saturating_add(1) } else { lo..hi };
        Some((BinaryId(b as u32), addr, span))
    }
    fn binary(&self, id: BinaryId) -> Option<&BinaryInfo> {
        self.binaries.get(id.0 as usize).map(|b| &b.1)
    }
}

const CALLER_BITS: u32 = 10;

/// [`CodeMap::checked_depth_cached`]'s answers: (process, return address, may be returned to)
/// by address, direct-mapped, for one generation of the map (address 0 never is one).
pub(crate) struct CallerCache {
    generation: u64,
    slots: Box<[(u32, u64, bool); 1 << CALLER_BITS]>,
}

impl Default for CallerCache {
    fn default() -> Self {
        CallerCache { generation: u64::MAX, slots: Box::new([(0, 0, false); 1 << CALLER_BITS]) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every address of a span resolves like its address by the rule written out (placed
    /// mappings first, then unplaced binaries at link time), with overlapping binaries.
    #[test]
    fn resolver_spans_resolve_alike() {
        let info = |segs: &[(u64, u64)]| BinaryInfo {
            exec_segments: segs.iter().map(|&(vaddr, memsz)| etm_profile::ExecSegment { vaddr, memsz, offset: 0 }).collect(),
            ..Default::default()
        };
        let r = Resolver {
            binaries: vec![
                (0, info(&[(0x1000, 0x1000)])),
                (1, info(&[(0x1800, 0x2000), (0x8000, 0x100)])),
                (2, info(&[(0x0, 0x10000)])),
                (3, info(&[(0x400, 0x400)])),
            ],
            places: vec![(0x2400, 0x2600, 0x100, 2), (0x9000, 0x9400, 0u64.wrapping_sub(0x9000), 2)],
            placed: vec![false, false, true, false],
        };
        let truth = |a: u64| -> Option<(BinaryId, u64)> {
            if let Some(&(_, _, bias, b)) = r.places.iter().find(|p| p.0 <= a && a < p.1) {
                return Some((BinaryId(b), a.wrapping_add(bias)));
            }
            (0..r.binaries.len()).find(|&i| !r.placed[i] && r.binaries[i].1.in_exec_segment(a)).map(|i| (BinaryId(i as u32), a))
        };
        let grid: Vec<u64> = (0..0xa000).step_by(0x80).flat_map(|a| [a, a + 4]).collect();
        let mut wide = 0;
        for &a in &grid {
            let got = r.resolve_span(a);
            assert_eq!(got.as_ref().map(|g| (g.0, g.1)), truth(a), "{a:#x}");
            let Some((b, link, span)) = got else { continue };
            assert!(span.contains(&a), "{a:#x} {span:x?}");
            wide += usize::from(span.end - span.start > 1);
            for &x in grid.iter().filter(|x| span.contains(x)) {
                assert_eq!(truth(x), Some((b, link.wrapping_add(x.wrapping_sub(a)))), "{a:#x} {x:#x} {span:x?}");
            }
        }
        assert!(wide > 100, "{wide}");
    }

    /// The code map's one-lookup straight-line scan gives the per-instruction default's answer
    /// for every range over two adjacent mappings, a gap and a partial word at an image end.
    #[test]
    fn straight_code_matches_per_instruction_default() {
        struct PerInsn<'a>(&'a CodeMap);
        impl CodeOracle for PerInsn<'_> {
            fn insn_kind(&self, pid: u32, addr: u64) -> Option<InsnKind> {
                self.0.insn_kind(pid, addr)
            }
        }
        const NOP: u32 = 0xD503_201F;
        const B: u32 = 0x1400_0010;
        const BEQ: u32 = 0x5400_0040;
        let words = |ws: &[u32], tail: usize| {
            let mut v: Vec<u8> = ws.iter().flat_map(|w| w.to_le_bytes()).collect();
            v.extend(std::iter::repeat_n(0u8, tail));
            Arc::new(v)
        };
        let mut code = CodeMap { arch: Some(CodeArch::Aarch64), ..Default::default() };
        for (i, data) in
            [words(&[NOP, BEQ, NOP, NOP], 0), words(&[NOP, NOP, B, NOP], 0), words(&[NOP], 2)].into_iter().enumerate()
        {
            code.images.push(Arc::new(Image {
                path: format!("img{i}"),
                data: data.into(),
                symbols: Default::default(),
                arch: None,
            }));
        }
        let maps = vec![
            Mapping { start: 0x1000, end: 0x1010, pgoff: 0, image: 0 },
            Mapping { start: 0x1010, end: 0x1020, pgoff: 0, image: 1 },
            Mapping { start: 0x1030, end: 0x1040, pgoff: 0, image: 2 },
        ];
        code.by_pid.push((7, maps));
        let mut seen = [0usize; 3];
        for from in (0xff8..0x1048).step_by(4) {
            for to in from..0x1048 {
                let want = PerInsn(&code).straight_code(7, from, to);
                assert_eq!(code.straight_code(7, from, to), want, "{from:#x}..{to:#x}");
                seen[want as usize] += 1;
            }
        }
        assert!(seen.iter().all(|&n| n > 0), "all three outcomes covered: {seen:?}");
    }

    /// The cached callers check gives `checked_depth`'s answer for random stacks over two
    /// processes' calls, non-calls, unmapped and kernel addresses, many more distinct return
    /// addresses than the cache has slots, and after the code changed (a new generation
    /// with other code at the same addresses).
    #[test]
    fn cached_callers_check_agrees() {
        const BL: u32 = 0x9400_0010;
        const NOP: u32 = 0xD503_201F;
        let image = |flip: bool| {
            let v: Vec<u8> = (0..8192u32).flat_map(|i| if (i % 3 == 0) != flip { BL } else { NOP }.to_le_bytes()).collect();
            Arc::new(Image { path: "img".into(), data: Arc::new(v).into(), symbols: Default::default(), arch: None })
        };
        let mut code = CodeMap { arch: Some(CodeArch::Aarch64), ..Default::default() };
        code.images.push(image(false));
        code.by_pid.push((7, vec![Mapping { start: 0x10000, end: 0x18000, pgoff: 0, image: 0 }]));
        code.by_pid.push((8, vec![Mapping { start: 0x20000, end: 0x28000, pgoff: 0, image: 0 }]));
        let mut cache = CallerCache::default();
        let mut x: u64 = 12345;
        let mut rnd = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let (mut cut, mut whole) = (0, 0);
        for round in 0..2 {
            if round == 1 {
                code.images[0] = image(true);
                code.generation += 1;
            }
            for _ in 0..20_000 {
                let pid = 7 + (rnd() % 2) as u32;
                let base = if pid == 7 { 0x10000 } else { 0x20000 };
                let n = 1 + (rnd() % 6) as usize;
                let stack: Vec<u64> = (0..n)
                    .map(|_| match rnd() % 40 {
                        0 => 0x800,
                        1 => 1 << 60,
                        2 => 0x30000 + 4 * (rnd() % 64),
                        _ => base + 4 + 4 * (rnd() % 0x1ffe),
                    })
                    .collect();
                let want = code.checked_depth(pid, &stack);
                assert_eq!(code.checked_depth_cached(pid, &stack, &mut cache), want, "{pid} {stack:x?}");
                if want < n { cut += 1 } else { whole += 1 }
            }
        }
        assert!(cut > 1000 && whole > 1000, "{cut} cut, {whole} whole");
    }
}
