//! Code facts of an ELF image the PGO writers need beyond [`etm_profile::BinaryInfo`]:
//! what llvm-profgen derives by disassembling the binary and reading its DWARF ranges.

use etm_profile::ElfError;
use object::{Object, ObjectSection, SectionKind};

/// Whether the ELF image carries pseudo probes (a `.pseudo_probe` section): llvm-profgen then
/// keys contexts by probe addresses instead of DWARF inline frames.
pub fn has_pseudo_probes(data: &[u8]) -> bool {
    object::File::parse(data).is_ok_and(|f| f.section_by_name(".pseudo_probe").is_some())
}

/// Code facts llvm-profgen derives by disassembling the binary, needed to reproduce its
/// context-insensitive counters exactly: the prolog/epilog addresses (first two instructions
/// of each function, each return and the instruction before it) and the addresses of
/// llvm-profgen's "unconditional branches" -- calls, returns and direct jumps (a fall-through
/// range crossing one is bogus). x86-64 (iced-x86) and
/// AArch64 (fixed width) are decoded; other architectures give empty sets.
///
/// For a *static* binary (no `.interp`) it also records the code covered by DWARF compile
/// units: stack frames outside it (glibc's `__libc_start_main`, `_start`) are written as
/// external ([`etm_profile::CodeFacts::frame_is_external`]), as they would be with a shared libc --
/// llvm-profgen otherwise drops every context whose frames include code without debug info,
/// which leaves a static binary with an empty context-sensitive profile.
#[derive(Clone, Debug, Default)]
pub struct ElfCodeFacts {
    prolog_epilog: Vec<u64>,
    uncond_branches: Vec<u64>,
    /// Sorted, merged [start, end) ranges of DWARF-covered code; `None` unless static.
    debug_ranges: Option<Vec<(u64, u64)>>,
    /// Every decoded instruction address, sorted (llvm-profgen's `CodeAddrVecs`).
    insts: Vec<u64>,
    /// Call instructions, sorted.
    calls: Vec<u64>,
    /// Return instructions, sorted.
    rets: Vec<u64>,
    /// The image carries pseudo probes.
    probes: bool,
}

fn dwarf_ranges(file: &object::File<'_>) -> Option<Vec<(u64, u64)>> {
    let endian = if file.is_little_endian() { gimli::RunTimeEndian::Little } else { gimli::RunTimeEndian::Big };
    let load = |id: gimli::SectionId| -> Result<gimli::EndianSlice<'_, gimli::RunTimeEndian>, gimli::Error> {
        let data = file.section_by_name(id.name()).and_then(|s| s.data().ok()).unwrap_or(&[]);
        Ok(gimli::EndianSlice::new(data, endian))
    };
    let dwarf = gimli::Dwarf::load(load).ok()?;
    let mut out = Vec::new();
    let mut units = dwarf.units();
    while let Ok(Some(header)) = units.next() {
        let Ok(unit) = dwarf.unit(header) else { continue };
        let Ok(mut ranges) = dwarf.unit_ranges(&unit) else { continue };
        while let Ok(Some(r)) = ranges.next() {
            if r.begin < r.end {
                out.push((r.begin, r.end));
            }
        }
    }
    out.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::with_capacity(out.len());
    for (b, e) in out {
        match merged.last_mut() {
            Some(last) if b <= last.1 => last.1 = last.1.max(e),
            _ => merged.push((b, e)),
        }
    }
    Some(merged)
}

impl ElfCodeFacts {
    /// Disassemble the function symbols of an ELF image.
    pub fn from_elf(data: &[u8]) -> Result<Self, ElfError> {
        use object::{ObjectSymbol, SymbolKind};
        let file = object::File::parse(data)?;
        let arch = file.architecture();
        let mut out = ElfCodeFacts::default();
        let mut func_starts: Vec<u64> = Vec::new();
        for sec in file.sections().filter(|s| s.kind() == SectionKind::Text) {
            let Ok(bytes) = sec.data() else { continue };
            let (lo, hi) = (sec.address(), sec.address() + bytes.len() as u64);
            let mut starts: Vec<u64> = file
                .symbols()
                .filter(|s| s.kind() == SymbolKind::Text && s.address() >= lo && s.address() < hi)
                .map(|s| s.address())
                .collect();
            starts.sort_unstable();
            starts.dedup();
            for (i, &start) in starts.iter().enumerate() {
                let end = starts.get(i + 1).copied().unwrap_or(hi);
                let code = &bytes[(start - lo) as usize..(end - lo) as usize];
                let mut insts: Vec<(u64, Kind)> = Vec::new();
                decode(arch, start, code, &mut insts);
                func_starts.push(start);
                if let Some(&(a, _)) = insts.first() {
                    out.prolog_epilog.push(a);
                }
                if let Some(&(a, _)) = insts.get(1) {
                    out.prolog_epilog.push(a);
                }
                for (j, &(a, k)) in insts.iter().enumerate() {
                    out.insts.push(a);
                    match k {
                        Kind::Ret => {
                            out.rets.push(a);
                            out.uncond_branches.push(a);
                            out.prolog_epilog.push(a);
                            if j > 0 {
                                out.prolog_epilog.push(insts[j - 1].0);
                            }
                        }
                        Kind::Call => {
                            out.calls.push(a);
                            out.uncond_branches.push(a);
                        }
                        Kind::UncondBranch => out.uncond_branches.push(a),
                        Kind::Other => {}
                    }
                }
            }
        }
        if file.section_by_name(".interp").is_none() {
            out.debug_ranges = dwarf_ranges(&file);
        }
        out.probes = file.section_by_name(".pseudo_probe").is_some();
        out.prolog_epilog.sort_unstable();
        out.prolog_epilog.dedup();
        for v in [&mut out.uncond_branches, &mut out.insts, &mut out.calls, &mut out.rets] {
            v.sort_unstable();
            v.dedup();
        }
        Ok(out)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Ret,
    Call,
    UncondBranch,
    Other,
}

fn decode(arch: object::Architecture, start: u64, code: &[u8], out: &mut Vec<(u64, Kind)>) {
    match arch {
        object::Architecture::X86_64 => {
            use iced_x86::{Code, Decoder, DecoderOptions, FlowControl};
            let mut d = Decoder::with_ip(64, code, start, DecoderOptions::NONE);
            while d.can_decode() {
                let ins = d.decode();
                if ins.code() == Code::INVALID {
                    continue;
                }
                let k = match ins.flow_control() {
                    FlowControl::Return => Kind::Ret,
                    FlowControl::UnconditionalBranch => Kind::UncondBranch,
                    FlowControl::Call | FlowControl::IndirectCall => Kind::Call,
                    _ => Kind::Other,
                };
                out.push((ins.ip(), k));
            }
        }
        object::Architecture::Aarch64 => {
            // The one A64 classification (PAuth forms included: RETAA/RETAB are returns,
            // BLRAA/BLRAB calls, as LLVM's disassembler has them); llvm-profgen's direct
            // jumps are B only (`MCInstrDesc::isUnconditionalBranch` excludes indirect ones).
            use etm_decode::insn::{Flow, a64_flow};
            for (i, w) in code.chunks_exact(4).enumerate() {
                let k = match a64_flow(u32::from_le_bytes([w[0], w[1], w[2], w[3]])) {
                    Flow::Return => Kind::Ret,
                    Flow::Jump => Kind::UncondBranch,
                    f if f.is_call() => Kind::Call,
                    _ => Kind::Other,
                };
                out.push((start + 4 * i as u64, k));
            }
        }
        _ => {}
    }
}

impl ElfCodeFacts {
    /// Every decoded instruction address, sorted (llvm-profgen's `CodeAddressVec`).
    pub fn instructions(&self) -> &[u64] {
        &self.insts
    }
}

impl etm_profile::CodeFacts for ElfCodeFacts {
    fn is_inst(&self, addr: u64) -> bool {
        self.insts.binary_search(&addr).is_ok()
    }
    fn is_call(&self, addr: u64) -> bool {
        self.calls.binary_search(&addr).is_ok()
    }
    fn is_return(&self, addr: u64) -> bool {
        self.rets.binary_search(&addr).is_ok()
    }
    fn in_prolog_epilog(&self, addr: u64) -> bool {
        self.prolog_epilog.binary_search(&addr).is_ok()
    }
    fn prev_inst(&self, addr: u64) -> Option<u64> {
        let i = self.insts.partition_point(|&a| a < addr);
        i.checked_sub(1).map(|j| self.insts[j])
    }
    fn range_crosses_uncond_branch(&self, start: u64, end: u64) -> bool {
        if start >= end {
            return false;
        }
        let i = self.uncond_branches.partition_point(|&a| a < start);
        self.uncond_branches.get(i).is_some_and(|&a| a < end)
    }
    fn needs_samples(&self) -> bool {
        self.probes
    }
    fn frame_is_external(&self, addr: u64) -> bool {
        let Some(r) = &self.debug_ranges else { return false };
        let i = r.partition_point(|&(_, e)| e <= addr);
        !r.get(i).is_some_and(|&(b, e)| b <= addr && addr < e)
    }
}
