//! `etm-write`: the dump writers, and the code analysis they need that the profile model
//! (`etm-profile`) and the pipeline do not: instruction decoding of whole binaries, DWARF.
//!
//! # PGO inputs
//!
//! From an [`etm_profile::HybridProfile`], one set per binary, each to an `impl Write` (the
//! binary does the atomic file handling):
//!
//! * [`pgo::write_perfscript_with`]: aggregated perf-script text, link-time addresses, no
//!   MMAP line; addresses outside the binary become one external address. Checked in CI to
//!   give llvm-profgen-22 byte-identical profiles to the original input for all 65 perf-script
//!   RUN lines of LLVM's own llvm-profgen tests. For static binaries, frames in code without
//!   DWARF (glibc) are written as external ([`elf::ElfCodeFacts`]), else llvm-profgen empties
//!   every context.
//! * [`pgo::write_unsymbolized`]: the *context-insensitive* unsymbolized profile, computed
//!   as llvm-profgen does (`computeCounterFromLBR`, with the prolog/epilog and
//!   call/return/jump facts of [`elf::ElfCodeFacts`]): for branch-only samples and
//!   pseudo-probe binaries (LLVM 22 crashes reading a CS unsymbolized profile for those).
//! * [`unwind::write_unsymbolized_cs`]: the *context-sensitive* unsymbolized profile of a DWARF
//!   binary with hybrid samples -- llvm-profgen's `VirtualUnwinder` replayed, contexts
//!   symbolized through a [`symbolize::Symbolizer`] ([`symbolize::DwarfSymbolizer`] reads the
//!   ELF bytes it is given). Checked in CI byte-identical to `llvm-profgen-22
//!   --skip-symbolization` on LLVM's DWARF CS test inputs and on a clang-22 binary.
//! * [`pgo::write_bolt_pa`]: `perf2bolt -pa` branches (`B`) and fall-throughs (`F`).
//!
//! # Profiles for people
//!
//! * [`pprof`]: an address-level `profile.proto` (gzip'd), for `go tool pprof`.
//! * [`flame`]: flame graphs and differential flame graphs (inferno) from folded stacks.

pub mod elf;
pub mod flame;
pub mod pgo;
pub mod pprof;
pub mod symbolize;
pub mod unwind;
