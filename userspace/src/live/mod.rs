//! Live collection: perf events, the eBPF sampler, the ring-buffer drain and the target's
//! process state. (`etm*` modules here belong to the live-ETM path.)

pub mod bpf;
pub mod perf_event;
pub mod collector;
pub mod etm;
