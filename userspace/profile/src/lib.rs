//! `etm-profile`: the hybrid-sample profile model shared by live collection, replay and
//! `convert`, and the exact instruction counts from decoded trace.
//!
//! A *hybrid sample* is a user call stack (leaf first: `[0]` is the sampled IP, the rest are
//! return addresses) plus the last taken branches at the same instant (newest first), all in
//! runtime addresses of the sampled process. [`HybridProfile::add`] resolves every address to
//! `(binary, link-time address)` through an [`AddressResolver`] and counts the sample.
//!
//! # Model: counters per calling context, computed online
//!
//! What the PGO tools derive from samples is computed as the samples arrive and kept as
//! counters, so the profile's memory grows with code and calling contexts, not with samples
//! or run time ([`agg`] has the rules and why they are exact):
//!
//! * per binary, the *tuples* (a branch with the target of the branch before it: one taken
//!   branch and the fall-through range ending at it) with llvm-profgen's facts about them,
//!   the calling contexts llvm-profgen's virtual unwinder sees (address stacks), and a count
//!   per (context, tuple). The context-sensitive unsymbolized profile (what `llvm-profgen
//!   --skip-symbolization` writes), the context-free one (`--ignore-stack-samples`) and BOLT's
//!   `perf2bolt -pa` input are written from these counts; only the splitting of ranges by
//!   inline context and the naming of contexts (DWARF) are left to dump time, and both commute
//!   with the sums.
//! * the sampled stacks (`profile.pb.gz`): each distinct resolved stack with a count;
//!   synthesized samples ([`HybridProfile::add_synthesized`]) are not sampled instants and are
//!   not counted there.
//! * a bounded store of distinct hybrid samples for the aggregated perf-script dump, the one
//!   input llvm-profgen takes for context-sensitive profiles of pseudo-probe binaries (LLVM 22
//!   crashes on a context-sensitive unsymbolized profile for them). It holds the samples that
//!   fit its budget ([`ProfileLimits::max_sample_bytes`]); the counters hold them all.
//!
//! The aggregation needs llvm-profgen's facts about each binary's code (which addresses are
//! instructions, calls, returns, prologs and epilogs): a [`facts::CodeFacts`] per binary,
//! given by a [`FactsProvider`] when the binary is first met. This crate decodes no
//! instructions and reads no DWARF.
//!
//! # Memory bound
//!
//! [`ProfileLimits::max_bytes`] bounds the counters and the sampled stacks. Past it a new
//! calling context is counted in the empty context (its branches and ranges stay exact for
//! the context-free and BOLT outputs; the context-sensitive one loses that context), a new
//! sampled stack is cut to its leaf; past an eighth more, new entries are dropped. The sample
//! store has its own budget and the same fold-then-drop policy. All of it is counted in
//! [`ProfileStats`]; already-seen entries always count exactly. Stacks deeper than
//! `max_stack_depth` keep their leaf-most frames, branch stacks their newest `max_branches`.
//!
//! # Merge
//!
//! [`HybridProfile::merge`] adds another profile (binaries matched by build-id and path);
//! within the budgets the result equals a profile built from the union of the samples.
//!
//! # Writers
//!
//! The files the PGO tools read are written from this model by the `etm-write` crate, with
//! the DWARF symbolizer the context-sensitive profile needs; aggregating an already-seen
//! sample allocates nothing.
//!
//! [`perfscript`] reads `perf script -F ip,brstack` text (hybrid or branch-only, plain or
//! aggregated, MMAP2 lines) into the same model, following llvm-profgen's parser.
//! Stack-only samples (no branches) are counted in the sampled stacks only.

pub mod agg;
pub mod elf;
pub mod exact;
pub mod facts;
mod model;
pub mod perfscript;
pub mod resolve;
mod store;

pub use agg::{AggStats, BinaryAgg};
pub use elf::ElfError;
pub use facts::{CodeFacts, EXTERNAL_ADDR, SectionFacts};
pub use model::{FactsProvider, HybridProfile, KeepSamples, ProfileLimits, ProfileStats};
pub use resolve::{IdentityResolver, MmapResolver};
pub use store::{Loc, ProfileBinary, SampleRef};

/// One taken branch, `from` the branch instruction `to` its target (runtime addresses in a
/// [`HybridSample`], link-time addresses inside the profile): the one branch type of the
/// crates, `etm_decode::branches::BranchRecord`.
pub use etm_decode::branches::BranchRecord as Branch;

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
