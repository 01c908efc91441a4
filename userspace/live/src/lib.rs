//! The live CoreSight ETM/ETE collection of etm-bpf, between the syscalls and the one pipeline
//! (`etm_session::Pipeline`).
//!
//! * [`group`]: one event group per CPU (or per thread), opened in the order the kernel
//!   requires — open, mmap, `PERF_EVENT_IOC_SET_OUTPUT`, BPF attach, enable — whether its
//!   events are cs_etm + PMU events or software stand-ins (the real-kernel tests here run it
//!   with software events);
//! * [`stream`]: the drain of one buffer (data ring records + AUX bytes) into pipeline events;
//! * [`ring`]: the buffer view the drain works on, real ([`sys::PerfBuffer`]) or in memory
//!   ([`ring::MemRing`], the kernel side of tests and of the driver model in `etm-synth`);
//! * [`sys`]: `perf_event_open`, the perf ioctls and the mmaps; [`clock`]: the perf clock.
//!
//! What the kernel does at each step, with the function each rule comes from, is in
//! `docs/live-etm.md`; nothing here has run on Arm hardware with CoreSight.

pub mod clock;
pub mod collect;
pub mod group;
pub mod ring;
pub mod stream;
pub mod sys;
