//! What llvm-profgen knows about a binary's code, as the online aggregation asks it.
//!
//! llvm-profgen turns samples into counters with facts it gets by disassembling the binary
//! (`ProfiledBinary`): which addresses start an instruction inside a function symbol
//! (`addressIsCode`), which instructions are calls and returns, the prolog/epilog addresses
//! (a sample whose leaf lies there is dropped), whether a fall-through range crosses a call,
//! return or direct jump (`rangeCrossUncondBranch`), and the call before a return address
//! (`getCallAddrFromFrameAddr`). [`crate::HybridProfile`] needs the same facts while it
//! aggregates, so it asks a [`CodeFacts`] per binary; this crate decodes no instructions
//! itself: `etm_write::elf::ElfCodeFacts` implements the trait from the ELF image, and the
//! dump writers read the same object, so the online counters and the dump-time steps see one
//! set of facts. Without an image, [`SectionFacts`] knows only the code sections.
//!
//! Every address is a link-time address of the binary the facts describe.

use crate::BinaryInfo;

/// llvm-profgen's `ExternalAddr`: an address outside the binary's code.
pub const EXTERNAL_ADDR: u64 = 1;

/// llvm-profgen's facts about one binary's code (module docs).
pub trait CodeFacts: Send + Sync {
    /// Whether an instruction llvm-profgen decoded starts at `addr` (`addressIsCode`: only the
    /// code of function symbols is decoded).
    fn is_inst(&self, addr: u64) -> bool;
    /// Whether the instruction at `addr` is a call.
    fn is_call(&self, addr: u64) -> bool;
    /// Whether the instruction at `addr` is a return.
    fn is_return(&self, addr: u64) -> bool;
    /// Whether a sample whose leaf is at `addr` is dropped (`addressInPrologEpilog`).
    fn in_prolog_epilog(&self, addr: u64) -> bool;
    /// The last decoded instruction before `addr` (`InstructionPointer::backward` from the
    /// lower bound of `addr`).
    fn prev_inst(&self, addr: u64) -> Option<u64>;
    /// Whether a call, return or direct jump lies in `[start, end)` (`rangeCrossUncondBranch`).
    fn range_crosses_uncond_branch(&self, start: u64, end: u64) -> bool;
    /// Whether a stack frame at `addr` is taken as external although it is code of the binary
    /// (static binaries: code without DWARF, such as glibc's, is treated as a shared libc's
    /// would be; see `etm_write::elf::ElfCodeFacts`). Default: never.
    fn frame_is_external(&self, _addr: u64) -> bool {
        false
    }
    /// Whether the binary's context-sensitive profile needs the samples themselves (the
    /// perf-script dump): pseudo-probe binaries, whose context-sensitive unsymbolized profile
    /// LLVM 22 cannot read. Default: no.
    fn needs_samples(&self) -> bool {
        false
    }
    /// `getCallAddrFromFrameAddr`: for a return address, the call before it; 0 when the
    /// instruction before it is not a call; [`EXTERNAL_ADDR`] for itself.
    fn call_addr_from_frame_addr(&self, addr: u64) -> u64 {
        if addr == EXTERNAL_ADDR {
            return EXTERNAL_ADDR;
        }
        match self.prev_inst(addr) {
            Some(p) if p != 0 && self.is_call(p) => p,
            _ => 0,
        }
    }
}

/// Facts of a binary whose image is not at hand: every address of a code section is code,
/// nothing is a call, return, prolog or epilog (what the context-free writers assumed without
/// code facts).
#[derive(Clone, Debug, Default)]
pub struct SectionFacts {
    code_ranges: Vec<(u64, u64)>,
}

impl SectionFacts {
    /// The code ranges of `info`.
    pub fn new(info: &BinaryInfo) -> Self {
        SectionFacts { code_ranges: info.code_ranges.clone() }
    }
}

impl CodeFacts for SectionFacts {
    fn is_inst(&self, addr: u64) -> bool {
        let i = self.code_ranges.partition_point(|&(_, end)| end <= addr);
        self.code_ranges.get(i).is_some_and(|&(s, e)| s <= addr && addr < e)
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
    /// Without code facts only the samples give a context-sensitive profile.
    fn needs_samples(&self) -> bool {
        true
    }
}
