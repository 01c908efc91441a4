//! Live collection: perf events, the eBPF sampler, the target's executable mappings as MMAP2
//! sideband, and the live CoreSight ETM/ETE path (`etm`). Everything collected is fed to the
//! shared pipeline (`crate::engine`).

pub mod bpf;
pub mod etm;
pub mod maps;
pub mod perf_event;
