//! DWARF unwinding of the user-stack copies the eBPF program writes (`run --unwind dwarf|auto`):
//! the sampled registers and the top of the stack go through `framehop` with the
//! `.eh_frame`/`.eh_frame_hdr`/`.debug_frame` of the images the engine has registered, one
//! framehop module per executable mapping. The result is a stack in the form
//! `bpf_get_stack` gives (the sampled pc, then return addresses), for the same pipeline.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ops::{Deref, Range};
use std::sync::Arc;

use addr2line::gimli::UnwindSection as _;
use etm_session::image::ImageBytes;
use framehop::{FrameAddress, ModuleSectionInfo, Unwinder};
use object::{Object, ObjectSection, ObjectSegment};

#[cfg(target_arch = "aarch64")]
use framehop::aarch64::{CacheAarch64 as Cache, UnwindRegsAarch64 as Regs, UnwinderAarch64 as Arch};
#[cfg(not(target_arch = "aarch64"))]
use framehop::x86_64::{CacheX86_64 as Cache, UnwindRegsX86_64 as Regs, UnwinderX86_64 as Arch};

/// How user stacks are unwound (`run --unwind`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum UnwindMode {
    /// Frame pointers only (`bpf_get_stack`): no stack copy.
    Fp,
    /// DWARF CFI from the copied stack; frame pointers only where no copy was taken.
    Dwarf,
    /// Per sample: the frame-pointer stack when every function it passes through sets up a
    /// frame record ([`DwarfUnwinder::fp_chain_trusted`]), else DWARF from the copied stack
    /// when that unwinds past the leaf, else frame pointers.
    Auto,
}

/// A section of an image: a range of the shared image bytes.
#[derive(Clone)]
pub struct Section {
    data: ImageBytes,
    range: Range<usize>,
}

impl Deref for Section {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.data.get(self.range.clone()).unwrap_or(&[])
    }
}

/// The sections of one ELF image, for framehop.
struct ElfSections<'a> {
    file: object::File<'a>,
    data: ImageBytes,
}

impl ElfSections<'_> {
    fn section(&self, name: &[u8]) -> Option<object::Section<'_, '_>> {
        let name = std::str::from_utf8(name).ok()?;
        self.file.section_by_name(name)
    }
}

impl ModuleSectionInfo<Section> for ElfSections<'_> {
    fn base_svma(&self) -> u64 {
        0
    }

    fn section_svma_range(&mut self, name: &[u8]) -> Option<Range<u64>> {
        let s = self.section(name)?;
        Some(s.address()..s.address() + s.size())
    }

    fn section_data(&mut self, name: &[u8]) -> Option<Section> {
        let s = self.section(name)?;
        // Compressed sections (`SHF_COMPRESSED` .debug_frame) are left out: framehop then
        // uses the other unwind sections.
        if s.compressed_file_range().ok()?.format != object::CompressionFormat::None {
            return None;
        }
        let (off, size) = s.file_range()?;
        let start = usize::try_from(off).ok()?;
        let end = start.checked_add(usize::try_from(size).ok()?)?;
        (end <= self.data.len()).then(|| Section { data: self.data.clone(), range: start..end })
    }

    fn segment_svma_range(&mut self, _name: &[u8]) -> Option<Range<u64>> {
        None
    }

    fn segment_data(&mut self, _name: &[u8]) -> Option<Section> {
        None
    }
}

/// Unwinding counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UnwindStats {
    /// Samples whose stack came from the DWARF unwinder.
    pub dwarf: u64,
    /// Samples that kept the frame-pointer stack (no copy, or `auto` chose it).
    pub fp: u64,
    /// DWARF unwinds that ended at the end of the stack copy or at [`MAX_FRAMES`] (the stack
    /// was deeper).
    pub truncated: u64,
    /// DWARF unwinds that stopped on an error (no unwind info for an address, a bad rule,
    /// an address in no registered image): the stack ends there.
    pub failed: u64,
    /// Records without a usable copy (kernel-mode sample, copy failed, garbage registers).
    pub no_copy: u64,
    /// Wall time spent in [`DwarfUnwinder::unwind`], ns.
    pub unwind_ns: u64,
    /// Calls of [`DwarfUnwinder::unwind`].
    pub unwinds: u64,
    /// Stack bytes the unwinds were given.
    pub copied_bytes: u64,
    /// `auto`: samples whose frame-pointer stack was taken without a DWARF unwind, every
    /// binary on it keeping frame pointers (also counted in `fp`).
    pub fp_trusted: u64,
    /// Binaries registered whose code keeps frame pointers, and whose code does not
    /// ([`FrameRecords::has_frame_pointers`]).
    pub fp_binaries: u64,
    pub no_fp_binaries: u64,
}

/// One function of an image: `(start, end, sets up a frame record, declares itself the
/// outermost frame)` ([`frame_records`]).
pub type FrameRecord = (u64, u64, bool, bool);

/// The functions of an image by their `.eh_frame` FDEs: `(start, end, frame record)` in
/// link-time addresses, sorted by start. A function sets up a frame record when on x86-64 its
/// CFA is computed from rbp at some row (`push %rbp; mov %rsp,%rbp` gives
/// `DW_CFA_def_cfa_register rbp`; code built without frame pointers computes it from rsp,
/// except in functions with variable-size frames), on AArch64 when it saves x29 and x30 as a
/// pair (x30 8 bytes above x29: `stp x29, x30`; code without frame pointers saves x30 alone,
/// or x29 only as a callee-saved register). A function declares itself the outermost frame
/// when its return address is undefined at some row (`.cfi_undefined`, as glibc's `_start`
/// and the child side of `clone3` do). `None` without a readable `.eh_frame`.
pub fn frame_records(file: &object::File<'_>) -> Option<Vec<FrameRecord>> {
    use addr2line::gimli::{self, UnwindSection};
    let sec = file.section_by_name(".eh_frame")?;
    let data = sec.uncompressed_data().ok()?;
    let endian = if file.is_little_endian() { gimli::RunTimeEndian::Little } else { gimli::RunTimeEndian::Big };
    let mut eh = gimli::EhFrame::new(&data, endian);
    eh.set_address_size(8);
    let mut bases = gimli::BaseAddresses::default().set_eh_frame(sec.address());
    if let Some(text) = file.section_by_name(".text") {
        bases = bases.set_text(text.address());
    }
    let mut ctx = gimli::UnwindContext::new();
    let mut entries = eh.entries(&bases);
    let mut out = Vec::new();
    while let Ok(Some(entry)) = entries.next() {
        let gimli::CieOrFde::Fde(partial) = entry else { continue };
        let Ok(fde) = partial.parse(gimli::EhFrame::cie_from_offset) else { continue };
        if let Some(r) = fde_record(&fde, &eh, &bases, &mut ctx) {
            out.push(r);
        }
    }
    out.sort_unstable();
    Some(out)
}

type EhReader<'a> = addr2line::gimli::EndianSlice<'a, addr2line::gimli::RunTimeEndian>;

/// [`frame_records`]' judgement of one FDE (its rows evaluated).
fn fde_record(
    fde: &addr2line::gimli::FrameDescriptionEntry<EhReader<'_>>,
    eh: &addr2line::gimli::EhFrame<EhReader<'_>>,
    bases: &addr2line::gimli::BaseAddresses,
    ctx: &mut addr2line::gimli::UnwindContext<usize>,
) -> Option<FrameRecord> {
    use addr2line::gimli;
    let mut rows = fde.rows(eh, bases, ctx).ok()?;
    let ra = fde.cie().return_address_register();
    let (mut record, mut root) = (false, false);
    while let Ok(Some(row)) = rows.next_row() {
        // `.cfi_undefined rip` / `x30`: the entry point or a new thread's first frame.
        root |= matches!(row.register(ra), gimli::RegisterRule::Undefined);
        record = record
            || if cfg!(target_arch = "aarch64") {
                match (row.register(gimli::AArch64::X29), row.register(gimli::AArch64::X30)) {
                    (gimli::RegisterRule::Offset(fp), gimli::RegisterRule::Offset(lr)) => lr == fp + 8,
                    _ => false,
                }
            } else {
                matches!(row.cfa(), gimli::CfaRule::RegisterAndOffset { register, .. } if *register == gimli::X86_64::RBP)
            };
    }
    Some((fde.initial_address(), fde.end_address(), record, root))
}

/// Functions whose [`FrameRecords`] judgement is kept, beyond which the cache is cleared.
const RECORD_CACHE_LIMIT: usize = 1 << 18;
/// FDEs [`FrameRecords::has_frame_pointers`] judges a binary with a search table by.
const FP_SAMPLE: u64 = 256;

/// The [`frame_records`] of one image, read on demand: with an `.eh_frame_hdr` search table
/// (what every linker writes for a binary with `.eh_frame`) the FDE of an address is found by
/// binary search and judged when first asked for, so registering a library with 150,000 FDEs
/// reads none of them; without one, all are read at registration.
pub struct FrameRecords {
    data: ImageBytes,
    little: bool,
    /// `.eh_frame` and `.eh_frame_hdr`: file range and address.
    eh_frame: (Range<usize>, u64),
    hdr: Option<(Range<usize>, u64)>,
    text: Option<u64>,
    /// Without a search table: every function, read at registration.
    all: Option<Vec<FrameRecord>>,
    /// By an FDE's start address: its judgement.
    cache: std::cell::RefCell<HashMap<u64, FrameRecord>>,
}

impl FrameRecords {
    /// The records of the image `data` parsed as `file`; `None` without a readable
    /// `.eh_frame`.
    fn new(file: &object::File<'_>, data: &ImageBytes) -> Option<FrameRecords> {
        let range = |name: &str| -> Option<(Range<usize>, u64)> {
            let s = file.section_by_name(name)?;
            let (off, size) = s.file_range()?;
            let start = usize::try_from(off).ok()?;
            let end = start.checked_add(usize::try_from(size).ok()?)?;
            (end <= data.len()).then_some((start..end, s.address()))
        };
        let eh_frame = range(".eh_frame")?;
        let mut r = FrameRecords {
            data: data.clone(),
            little: file.is_little_endian(),
            eh_frame,
            hdr: range(".eh_frame_hdr"),
            text: file.section_by_name(".text").map(|t| t.address()),
            all: None,
            cache: Default::default(),
        };
        if r.with_table(|_, _, _| Some(())).is_none() {
            r.all = Some(frame_records(file)?);
        }
        Some(r)
    }

    /// Calls `f` with the `.eh_frame`, its bases and the parsed `.eh_frame_hdr` (with a search
    /// table); `None` without one.
    fn with_table<T>(
        &self,
        f: impl FnOnce(
            &addr2line::gimli::EhFrame<EhReader<'_>>,
            &addr2line::gimli::BaseAddresses,
            &addr2line::gimli::EhHdrTable<'_, EhReader<'_>>,
        ) -> Option<T>,
    ) -> Option<T> {
        use addr2line::gimli;
        let (hdr_range, hdr_addr) = self.hdr.clone()?;
        let endian = if self.little { gimli::RunTimeEndian::Little } else { gimli::RunTimeEndian::Big };
        let mut eh = gimli::EhFrame::new(self.data.get(self.eh_frame.0.clone())?, endian);
        eh.set_address_size(8);
        let mut bases = gimli::BaseAddresses::default().set_eh_frame(self.eh_frame.1).set_eh_frame_hdr(hdr_addr);
        if let Some(t) = self.text {
            bases = bases.set_text(t);
        }
        let hdr = gimli::EhFrameHdr::new(self.data.get(hdr_range)?, endian).parse(&bases, 8).ok()?;
        let table = hdr.table()?;
        f(&eh, &bases, &table)
    }

    /// The function holding link-time address `svma`; `None` outside every FDE.
    fn at(&self, svma: u64) -> Option<FrameRecord> {
        if let Some(all) = &self.all {
            return record_at(all, svma);
        }
        self.with_table(|eh, bases, table| {
            let fde = table.fde_for_address(eh, bases, svma, addr2line::gimli::EhFrame::cie_from_offset).ok()?;
            let start = fde.initial_address();
            if let Some(r) = self.cache.borrow().get(&start) {
                return Some(*r);
            }
            let r = fde_record(&fde, eh, bases, &mut addr2line::gimli::UnwindContext::new())?;
            let mut c = self.cache.borrow_mut();
            if c.len() >= RECORD_CACHE_LIMIT {
                c.clear();
            }
            c.insert(start, r);
            Some(r)
        })
    }

    /// Whether the image's code keeps frame pointers as a whole ([`has_frame_pointers`]):
    /// judged on all its functions without a search table, else on [`FP_SAMPLE`] FDEs evenly
    /// spread over the table (all of them in a smaller binary).
    fn has_frame_pointers(&self) -> bool {
        if let Some(all) = &self.all {
            return has_frame_pointers(all);
        }
        let sample = self.with_table(|eh, bases, table| {
            let mut it = table.iter(bases);
            let mut entries = Vec::new();
            while let Ok(Some((_, fde))) = it.next() {
                entries.push(fde);
            }
            let n = entries.len() as u64;
            let step = n.div_ceil(FP_SAMPLE).max(1);
            let mut ctx = addr2line::gimli::UnwindContext::new();
            let mut out = Vec::new();
            for &p in entries.iter().step_by(step as usize) {
                let Ok(off) = table.pointer_to_offset(p) else { continue };
                let Ok(fde) = eh.fde_from_offset(bases, off, addr2line::gimli::EhFrame::cie_from_offset) else { continue };
                out.extend(fde_record(&fde, eh, bases, &mut ctx));
            }
            Some(out)
        });
        sample.is_some_and(|s| has_frame_pointers(&s))
    }
}

/// Whether an image's code keeps frame pointers as a whole (counted in the manifest): at
/// least half of its functions ([`frame_records`]) set up a frame record.
pub fn has_frame_pointers(records: &[FrameRecord]) -> bool {
    !records.is_empty() && records.iter().filter(|r| r.2).count() * 2 >= records.len()
}

/// The function of `fdes` ([`frame_records`]) holding link-time address `svma`; `None`
/// outside every FDE.
fn record_at(fdes: &[FrameRecord], svma: u64) -> Option<FrameRecord> {
    let i = fdes.partition_point(|f| f.0 <= svma).checked_sub(1)?;
    let f = fdes[i];
    (f.0 <= svma && svma < f.1).then_some(f)
}

/// The unwinder of one target process.
pub struct DwarfUnwinder {
    unwinder: Arch<Section>,
    cache: Cache,
    /// Start addresses of the mappings registered as modules.
    mapped: HashSet<u64>,
    /// Registered mappings: start -> (end, load bias, their binary's [`FrameRecords`]).
    ranges: BTreeMap<u64, (u64, u64, Option<Arc<FrameRecords>>)>,
    /// [`FrameRecords`] per binary name.
    records_by_binary: HashMap<String, Option<Arc<FrameRecords>>>,
    pub stats: UnwindStats,
}

impl Default for DwarfUnwinder {
    fn default() -> Self {
        DwarfUnwinder {
            unwinder: Arch::new(),
            cache: Cache::new(),
            mapped: HashSet::new(),
            ranges: BTreeMap::new(),
            records_by_binary: HashMap::new(),
            stats: UnwindStats::default(),
        }
    }
}

/// Largest number of frames one unwind produces (as deep as `bpf_get_stack` goes).
pub const MAX_FRAMES: usize = etm_bpf_common::MAX_STACK_DEPTH;

impl DwarfUnwinder {
    /// Registers the executable mapping `addr..addr+len` of file offset `pgoff` of the image
    /// `data` (once per mapping start).
    pub fn add_mapping(
        &mut self,
        name: &str,
        data: impl Into<ImageBytes>,
        addr: u64,
        len: u64,
        pgoff: u64,
    ) -> anyhow::Result<()> {
        if self.mapped.contains(&addr) || len == 0 {
            return Ok(());
        }
        let data: ImageBytes = data.into();
        let file = object::File::parse(&data[..])?;
        // The load bias: where the segment holding `pgoff` puts that offset.
        let seg = file
            .segments()
            .find(|s| {
                let (o, sz) = s.file_range();
                o <= pgoff && pgoff < o.saturating_add(sz)
            })
            .ok_or_else(|| anyhow::anyhow!("no load segment holds file offset {pgoff:#x}"))?;
        let svma = seg.address().wrapping_add(pgoff - seg.file_range().0);
        let bias = addr.wrapping_sub(svma);
        let records = match self.records_by_binary.get(name) {
            Some(r) => r.clone(),
            None => {
                let r = FrameRecords::new(&file, &data).map(Arc::new);
                if r.as_ref().is_some_and(|r| r.has_frame_pointers()) {
                    self.stats.fp_binaries += 1;
                } else {
                    self.stats.no_fp_binaries += 1;
                }
                self.records_by_binary.insert(name.to_string(), r.clone());
                r
            }
        };
        self.ranges.insert(addr, (addr.saturating_add(len), bias, records));
        let info = ElfSections { file, data: data.clone() };
        let module = framehop::Module::new(name.to_string(), addr..addr.saturating_add(len), bias, info);
        self.unwinder.add_module(module);
        self.mapped.insert(addr);
        Ok(())
    }

    /// The function holding `addr` in a registered mapping ([`frame_records`]); `None` outside
    /// every mapping or FDE.
    fn function_at(&self, addr: u64) -> Option<FrameRecord> {
        let (_, (end, bias, records)) = self.ranges.range(..=addr).next_back()?;
        if addr >= *end {
            return None;
        }
        records.as_ref()?.at(addr.wrapping_sub(*bias))
    }

    /// Whether the function holding `addr` sets up a frame record; `None` outside every
    /// mapping or FDE.
    fn keeps_frame_pointers(&self, addr: u64) -> Option<bool> {
        self.function_at(addr).map(|f| f.2)
    }

    /// `auto`'s rule for taking a frame-pointer stack (`bpf_get_stack`'s: the sampled pc, then
    /// return addresses) as it is: the function of the pc and of every return address sets up
    /// a frame record ([`frame_records`]), except that the outermost may instead declare
    /// itself the outermost frame (`_start`, a new thread's first function, which end the
    /// chain by zeroing the frame pointer). Judged per function, as a binary can mix both
    /// kinds (a static program's own code without frame pointers over a libc with them). The
    /// walk reads each next frame through the frame pointer of the function a return address
    /// leads to; past a function without frame pointers it reads whatever that register held,
    /// and where it stops there (as at `__libc_start_call_main` or `start_thread` of a glibc
    /// built without frame pointers) the root frames DWARF finds are missing. So on a
    /// distribution whose libc has no frame pointers (Debian 12's x86-64 one) every stack is
    /// DWARF-unwound.
    pub fn fp_chain_trusted(&mut self, fp_stack: &[u64]) -> bool {
        let Some((&last, inner)) = fp_stack.split_last() else { return false };
        let trusted = fp_stack.len() >= 2
            && self.keeps_frame_pointers(fp_stack[0]) == Some(true)
            && inner.get(1..).unwrap_or(&[]).iter().all(|&r| self.keeps_frame_pointers(r.wrapping_sub(1)) == Some(true))
            && self.function_at(last.wrapping_sub(1)).is_some_and(|f| f.2 || f.3);
        if trusted {
            self.stats.fp_trusted += 1;
            self.stats.fp += 1;
        }
        trusted
    }

    /// Which stack a record contributes under `mode` (`--unwind`), the one rule for samples
    /// and pause records: `true` with the DWARF unwind of its copy in `out` (`dwarf`, or
    /// `auto` when the frame-pointer stack is not to be trusted as it is
    /// ([`DwarfUnwinder::fp_chain_trusted`]) and the unwind got past the sampled function, or
    /// the frame pointers did not), `false` for the frame-pointer stack `fp_stack` (`fp`, a
    /// record without a usable copy: kernel-mode registers, a failed copy). Counts either way.
    pub fn choose(
        &mut self,
        mode: UnwindMode,
        copy: Option<(etm_bpf_common::UserRegs, &[u8])>,
        fp_stack: &[u64],
        out: &mut Vec<u64>,
    ) -> bool {
        if mode == UnwindMode::Fp {
            return false;
        }
        if mode == UnwindMode::Auto && self.fp_chain_trusted(fp_stack) {
            return false;
        }
        let Some((regs, copy)) = copy.filter(|(r, c)| r.flags & etm_bpf_common::USTACK_REGS != 0 && !c.is_empty()) else {
            self.stats.no_copy += 1;
            self.stats.fp += 1;
            return false;
        };
        self.unwind(&regs, copy, out);
        // auto: the DWARF stack unless it stopped at the sampled function while the frame
        // pointers went further.
        let use_dwarf = mode == UnwindMode::Dwarf || out.len() > 1 || fp_stack.len() <= 1;
        if use_dwarf {
            self.stats.dwarf += 1;
        } else {
            self.stats.fp += 1;
        }
        use_dwarf
    }

    /// Unwinds from `regs` over the stack copy `stack` (the bytes from `regs.sp` up) into
    /// `out` (cleared first): the pc, then return addresses. Returns whether the unwind
    /// reached the outermost frame (no truncation, no error); counts either way.
    pub fn unwind(&mut self, regs: &etm_bpf_common::UserRegs, stack: &[u8], out: &mut Vec<u64>) -> bool {
        out.clear();
        let t0 = std::time::Instant::now();
        let sp = regs.sp;
        let mut ran_out = false;
        let mut depth_cut = false;
        let mut read = |addr: u64| -> Result<u64, ()> {
            let off = addr.checked_sub(sp).and_then(|o| usize::try_from(o).ok()).ok_or(())?;
            match stack.get(off..off.checked_add(8).ok_or(())?) {
                Some(b) => Ok(u64::from_ne_bytes(b.try_into().map_err(|_| ())?)),
                None => {
                    ran_out = true;
                    Err(())
                }
            }
        };
        #[cfg(target_arch = "aarch64")]
        let mut r = Regs::new(regs.lr, regs.sp, regs.fp);
        #[cfg(not(target_arch = "aarch64"))]
        let mut r = Regs::new(regs.pc, regs.sp, regs.fp);
        out.push(regs.pc);
        let mut addr = FrameAddress::from_instruction_pointer(regs.pc);
        let complete = loop {
            if out.len() >= MAX_FRAMES {
                // As deep as a frame-pointer stack goes: cut like the copy's end.
                depth_cut = true;
                break false;
            }
            match self.unwinder.unwind_frame(addr, &mut r, &mut self.cache, &mut read) {
                Ok(Some(ret)) => match FrameAddress::from_return_address(ret) {
                    Some(a) => {
                        out.push(ret);
                        addr = a;
                    }
                    None => break true,
                },
                Ok(None) => break true,
                Err(_) => break false,
            }
        };
        self.stats.unwinds += 1;
        self.stats.copied_bytes += stack.len() as u64;
        self.stats.unwind_ns += t0.elapsed().as_nanos() as u64;
        if !complete {
            if ran_out || depth_cut {
                self.stats.truncated += 1;
            } else {
                self.stats.failed += 1;
            }
        }
        complete
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn regs(pc: u64, sp: u64, fp: u64) -> etm_bpf_common::UserRegs {
        etm_bpf_common::UserRegs { magic: etm_bpf_common::USTACK_MAGIC, flags: 1, pc, sp, fp, lr: 0, copied: 0, size: 0 }
    }

    /// Garbage registers and stack bytes, without any module, end the unwind at the leaf and
    /// are counted; nothing panics.
    #[test]
    fn garbage_is_counted_not_fatal() {
        let mut u = DwarfUnwinder::default();
        let mut out = Vec::new();
        let junk: Vec<u8> = (0..4096u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
        for (pc, sp, fp) in [(0, 0, 0), (u64::MAX, u64::MAX, u64::MAX), (0x401000, 0x7ffd_0000_0000, 0x7ffd_0000_0010)] {
            u.unwind(&regs(pc, sp, fp), &junk, &mut out);
            assert!(!out.is_empty() && out.len() <= MAX_FRAMES);
            assert_eq!(out[0], pc);
            u.unwind(&regs(pc, sp, fp), &[], &mut out);
        }
        assert!(u.stats.failed + u.stats.truncated > 0);
    }

    /// A mapping whose offset no segment holds, or bytes that are no ELF, are refused.
    #[test]
    fn bad_images_are_refused() {
        let mut u = DwarfUnwinder::default();
        assert!(u.add_mapping("x", Arc::new(vec![0u8; 64]), 0x1000, 0x1000, 0).is_err());
        let me = Arc::new(std::fs::read(std::env::current_exe().unwrap()).unwrap());
        assert!(u.add_mapping("me", &me, 0x1000, 0x1000, 1 << 40).is_err());
        assert!(u.add_mapping("me", &me, 0x1000, 0x1000, 0).is_ok());
    }

    /// Builds a small C program (several functions calling each other) with `flags`; `None`
    /// (after saying why) without a C compiler.
    fn build(dir: &std::path::Path, name: &str, flags: &[&str]) -> Option<Arc<Vec<u8>>> {
        use std::process::Command;
        let Some(cc) = ["gcc", "clang-22", "clang", "cc"].into_iter().find(|c| Command::new(c).arg("--version").output().is_ok())
        else {
            etm_testutil::skip("no C compiler");
            return None;
        };
        let src = dir.join("f.c");
        let mut code = String::from("volatile int sink;\n");
        for i in 0..20 {
            code += &format!(
                "__attribute__((noinline)) int f{i}(int x) {{ int a[8]; for (int j = 0; j < 8; j++) a[j] = x + j + sink; sink = a[x & 7]; return {} + a[3]; }}\n",
                if i == 0 { "x".to_string() } else { format!("f{}(x + 1)", i - 1) }
            );
        }
        code += "int main(int c, char **v) { (void)v; return f19(c); }\n";
        std::fs::write(&src, code).unwrap();
        let exe = dir.join(name);
        let st = Command::new(cc).args(flags).arg("-o").arg(&exe).arg(&src).status().unwrap();
        assert!(st.success(), "{cc} {flags:?} failed");
        Some(Arc::new(std::fs::read(&exe).unwrap()))
    }

    /// The frame-pointer rule against the compiler flags that decide it, with gcc's or clang's
    /// defaults otherwise; and `auto`'s trust in a chain through the two binaries.
    #[test]
    fn frame_pointers_are_told_from_the_call_frame_rules() {
        let dir = tempfile::tempdir().unwrap();
        let Some(fp) = build(dir.path(), "fp", &["-O2", "-fno-omit-frame-pointer"]) else { return };
        let Some(nofp) = build(dir.path(), "nofp", &["-O2", "-fomit-frame-pointer"]) else { return };
        let Some(default) = build(dir.path(), "default", &["-O2"]) else { return };
        for (bin, want) in [(&fp, true), (&nofp, false), (&default, false)] {
            assert_eq!(has_frame_pointers(&frame_records(&object::File::parse(&bin[..]).unwrap()).unwrap()), want);
        }
        use object::ObjectSymbol;
        // Each binary's code segment mapped at `base + p_vaddr`; functions found by name.
        let mut u = DwarfUnwinder::default();
        let mut map = |name: &str, bin: &Arc<Vec<u8>>, base: u64| {
            let f = object::File::parse(&bin[..]).unwrap();
            let text = f.section_by_name(".text").unwrap().address();
            let seg = f.segments().find(|s| s.address() <= text && text < s.address() + s.size()).unwrap();
            u.add_mapping(name, bin, base + seg.address(), seg.size(), seg.file_range().0).unwrap();
            let syms: HashMap<String, u64> =
                f.symbols().filter_map(|s| Some((s.name().ok()?.to_string(), base + s.address()))).collect();
            move |func: &str, off: u64| syms[func] + off
        };
        let fp_at = map("fp", &fp, 0x100000);
        let nofp_at = map("nofp", &nofp, 0x800000);
        assert_eq!((u.stats.fp_binaries, u.stats.no_fp_binaries), (1, 1));
        // The pc and every caller (a return address follows its call: +1 of r - 1) in
        // functions with frame records.
        let (pc, r1, r2) = (fp_at("f3", 4), fp_at("f4", 9), fp_at("f5", 9));
        assert!(u.fp_chain_trusted(&[pc, r1, r2]));
        assert!(!u.fp_chain_trusted(&[pc, r1, nofp_at("f5", 9)]), "outermost without frame pointers");
        assert!(!u.fp_chain_trusted(&[nofp_at("f3", 4), r1, r2]), "pc without frame pointers");
        assert!(!u.fp_chain_trusted(&[pc, nofp_at("f4", 9), r2]), "walked on through a function without them");
        assert!(!u.fp_chain_trusted(&[pc, r1, 0x90_0000_0000]), "outermost in no image");
        assert!(!u.fp_chain_trusted(&[pc]), "only the pc");
        assert!(!u.fp_chain_trusted(&[]));
        assert_eq!(u.stats.fp_trusted, 1, "before the _start case");
        // Per function: the frame-pointer binary's own startup code (`_start`, from crt1.o,
        // built without) has no frame record though its binary counts as having them.
        assert_eq!(u.keeps_frame_pointers(fp_at("_start", 1)), Some(false));
        // ... but declares itself the outermost frame, so a chain may end there.
        assert!(u.function_at(fp_at("_start", 1)).unwrap().3);
        assert!(!u.function_at(nofp_at("f5", 4)).unwrap().3);
        assert!(u.fp_chain_trusted(&[pc, r1, fp_at("_start", 9)]));
        assert_eq!(u.keeps_frame_pointers(fp_at("f7", 4)), Some(true));
    }

    /// The records read on demand through `.eh_frame_hdr` are the full scan's: at the start,
    /// the middle and the last byte of every FDE and just past it, in the system's libc and
    /// libstdc++ (thousands of FDEs) and a small test program; and the sampled frame-pointer
    /// judgement is the one over all functions.
    #[test]
    fn records_on_demand_equal_the_full_scan() {
        let dir = tempfile::tempdir().unwrap();
        let Some(small) = build(dir.path(), "fp", &["-O2", "-fno-omit-frame-pointer"]) else { return };
        let mut images = vec![("fp".to_string(), ImageBytes::from(small))];
        for lib in ["/lib/x86_64-linux-gnu/libc.so.6", "/lib/x86_64-linux-gnu/libstdc++.so.6", "/lib/aarch64-linux-gnu/libc.so.6"]
        {
            if let Ok(b) = ImageBytes::map(std::path::Path::new(lib)) {
                images.push((lib.to_string(), b));
            }
        }
        assert!(images.len() >= 2, "no system libc found");
        for (name, data) in &images {
            let file = object::File::parse(&data[..]).unwrap();
            let all = frame_records(&file).unwrap();
            let lazy = FrameRecords::new(&file, data).unwrap();
            assert!(lazy.all.is_none(), "{name}: has a search table");
            assert!(all.len() > 10, "{name}: {} FDEs", all.len());
            for f in &all {
                for a in [f.0, f.0 + (f.1 - f.0) / 2, f.1.saturating_sub(1)] {
                    assert_eq!(lazy.at(a), record_at(&all, a), "{name}: at {a:#x}");
                }
                assert_eq!(lazy.at(f.1), record_at(&all, f.1), "{name}: past {f:?}");
            }
            assert_eq!(lazy.has_frame_pointers(), has_frame_pointers(&all), "{name}");
            eprintln!("{name}: {} FDEs", all.len());
        }
    }
}
