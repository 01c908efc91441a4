//! `etm-profile`: the hybrid-sample profile model shared by live collection, replay and
//! `convert`, and the exact instruction counts from decoded trace.
//!
//! A *hybrid sample* is a user call stack (leaf first: `[0]` is the sampled IP, the rest are
//! return addresses) plus the last taken branches at the same instant (newest first), all in
//! runtime addresses of the sampled process. [`HybridProfile::add`] resolves every address to
//! `(binary, link-time address)` through an [`AddressResolver`] and aggregates the sample.
//!
//! # Model: deduplicated raw samples
//!
//! The profile stores *raw aggregated samples*: each distinct (resolved stack, resolved
//! branch stack) is kept once with a repeat count, in a flat word arena with an open-addressing
//! index. We chose this over storing unwound ranges because
//! * the aggregated perf-script writer (what llvm-profgen reads for CSSPGO, DWARF and
//!   pseudo-probe binaries alike) is then *exact*: llvm-profgen unwinds our file the way it
//!   would unwind the original samples (it aggregates identical samples itself too), so it
//!   yields the same final profile, and
//! * the other outputs are derivable at dump time: range and branch counts
//!   (unsymbolized profile, BOLT `-pa`) come from consecutive branch pairs, and the per-context
//!   sample counts from the stacks ([`HybridProfile::context_counts`]).
//!
//! Aggregating an already-seen sample allocates nothing: the key is built in a reused scratch
//! buffer, hashed, and looked up in place.
//!
//! # Memory bound: cold-context policy
//!
//! [`ProfileLimits`] bounds the arena (in bytes), the stack depth and the branch depth.
//! Stacks deeper than `max_stack_depth` keep their leaf-most frames; branch stacks keep the
//! newest `max_branches`. When a *new* sample would push the arena past `max_bytes`, it is
//! folded to its base context: its stack is cut to the leaf frame (the IP), which llvm-profgen
//! treats as a context rooted at the leaf function, and the branch stack is kept. If even the
//! folded sample is new and the arena is past `max_bytes + max_bytes / 8` (the fold reserve),
//! the sample is dropped. Both are counted in [`ProfileStats`]; already-seen samples always
//! count exactly. Hot samples arrive first and often, so the policy mostly costs cold contexts.
//!
//! # Merge
//!
//! [`HybridProfile::merge`] adds another profile's samples (binaries matched by build-id and
//! path); without folding, the result equals a profile built from the union of the samples.
//!
//! # Writers
//!
//! The files the PGO tools read are written from this model by the `etm-write` crate, with the
//! code analysis they need (ELF code facts, DWARF symbolizer, llvm-profgen's unwinder); this
//! crate reads no DWARF and decodes no instructions.
//!
//! [`perfscript`] reads `perf script -F ip,brstack` text (hybrid or branch-only, plain or
//! aggregated, MMAP2 lines) into the same model, following llvm-profgen's parser.
//! Stack-only samples (no branches) are kept in the model but appear in none of these files.

pub mod elf;
pub mod exact;
mod model;
pub mod perfscript;
pub mod resolve;

pub use elf::ElfError;
pub use model::{HybridProfile, Loc, ProfileBinary, ProfileLimits, ProfileStats, SampleRef};
pub use resolve::{IdentityResolver, MmapResolver};

/// One taken branch, `from` the branch instruction `to` its target (runtime addresses in a
/// [`HybridSample`], link-time addresses inside the profile).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Branch {
    /// Address of the taken branch instruction.
    pub from: u64,
    /// Address of its target.
    pub to: u64,
}

/// A call stack and the last taken branches at the same instant, in runtime addresses.
#[derive(Clone, Copy, Debug)]
pub struct HybridSample<'a> {
    /// Leaf first: `[0]` is the sampled IP, the rest are return addresses.
    pub stack: &'a [u64],
    /// Last taken branches, newest first (perf/LBR order). May be empty (stack-only sample).
    pub branches: &'a [Branch],
}

/// Names a binary within one [`AddressResolver`]; stable for the resolver's lifetime.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BinaryId(pub u32);

/// One executable `PT_LOAD` segment of an ELF file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExecSegment {
    /// Link-time virtual address (`p_vaddr`).
    pub vaddr: u64,
    /// Size in memory (`p_memsz`).
    pub memsz: u64,
    /// File offset (`p_offset`).
    pub offset: u64,
}

/// What the writers need to know about a profiled binary.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BinaryInfo {
    /// Path of the binary (its file name names the dump files and is matched by
    /// llvm-profgen against MMAP lines).
    pub path: String,
    /// GNU build-id, if the binary has one.
    pub build_id: Option<Vec<u8>>,
    /// Executable `PT_LOAD` segments in file order (the first one is the base llvm-profgen
    /// and the unsymbolized profile use).
    pub exec_segments: Vec<ExecSegment>,
    /// Link-time address ranges of executable code (`SHF_EXECINSTR` sections, or the exec
    /// segments when there are no section headers), sorted: llvm-profgen treats addresses
    /// outside them as external.
    pub code_ranges: Vec<(u64, u64)>,
    /// `ET_DYN` (position-independent) rather than `ET_EXEC`.
    pub is_pie: bool,
}

impl BinaryInfo {
    /// File name of [`BinaryInfo::path`] (what dump file names start with).
    pub fn file_name(&self) -> &str {
        self.path.rsplit('/').next().unwrap_or(&self.path)
    }
    /// Link-time address of the first executable segment.
    pub fn first_exec_vaddr(&self) -> Option<u64> {
        self.exec_segments.first().map(|s| s.vaddr)
    }
    /// Whether the link-time address lies in executable code.
    pub fn is_code(&self, addr: u64) -> bool {
        let i = self.code_ranges.partition_point(|&(_, end)| end <= addr);
        self.code_ranges.get(i).is_some_and(|&(s, e)| s <= addr && addr < e)
    }
    /// Whether the link-time address lies in an executable segment.
    pub fn in_exec_segment(&self, addr: u64) -> bool {
        self.exec_segment(addr).is_some()
    }
    /// The executable segment holding the link-time address.
    pub fn exec_segment(&self, addr: u64) -> Option<&ExecSegment> {
        self.exec_segments.iter().find(|s| addr >= s.vaddr && addr - s.vaddr < s.memsz)
    }
    /// Build-id as lowercase hex (empty when absent).
    pub fn build_id_hex(&self) -> String {
        let mut s = String::new();
        for b in self.build_id.iter().flatten() {
            use std::fmt::Write;
            let _ = write!(s, "{b:02x}");
        }
        s
    }
}

/// Maps runtime addresses of the sampled process to `(binary, link-time address)`.
///
/// Implemented by the pipeline's code map (`etm_session`), [`IdentityResolver`] (static
/// non-PIE binaries) and [`MmapResolver`] (perf MMAP2 events, for `convert`).
pub trait AddressResolver {
    /// The binary and link-time address of a runtime address, or `None` if unmapped/unknown.
    fn resolve(&self, addr: u64) -> Option<(BinaryId, u64)>;
    /// [`resolve`](Self::resolve), with addresses around `addr` that resolve alike: every
    /// address of the range maps to the same binary at the same offset (`link - addr`), so a
    /// caller resolving many nearby addresses looks up one. The default: `addr` alone.
    fn resolve_span(&self, addr: u64) -> Option<(BinaryId, u64, std::ops::Range<u64>)> {
        self.resolve(addr).map(|(b, link)| (b, link, addr..addr.saturating_add(1)))
    }
    /// Information about a binary this resolver returned.
    fn binary(&self, id: BinaryId) -> Option<&BinaryInfo>;
}
