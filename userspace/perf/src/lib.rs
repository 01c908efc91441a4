//! `etm-perf`: the perf_event side of CoreSight ETM/ETE collection, as pure logic.
//!
//! Everything here works on bytes, plain structs and explicit sysfs root paths, so it is
//! testable without Arm hardware and without syscalls. The live driver in the `etm-bpf`
//! binary (`userspace/src/live/etm.rs`) does the `perf_event_open`/`mmap`/`ioctl` calls and
//! hands the mapped memory to the types in this crate.
//!
//! * [`discovery`]: `cs_etm` sysfs discovery (format fields, sinks, configurations, per-CPU
//!   ETM ID registers, ETE detection, the `armv8_pmuv3*` PMUs and their `trcextout*` events)
//!   and the kernel version -> AUX pause support check.
//! * [`format`]: `format/*` field specifications (`config:0-3`, `config2:32-63`, ...).
//! * [`attr`]: `perf_event_attr` as a plain struct serialised to the uapi byte layout, and
//!   the builders for the cs_etm event group in the three window modes.
//! * [`records`]: the perf data ring record parser (AUX, ITRACE_START, AUX_OUTPUT_HW_ID,
//!   MMAP2, COMM, FORK, EXIT, LOST, SAMPLE, ...) with wrap-around handling.
//! * [`ring`]: the data ring and AUX ring head/tail protocol over a byte view.
//! * [`clock`]: `time_zero/time_mult/time_shift` conversion of counter values to perf time.
//!
//! Design constraints: corrupt input is counted in stats structs and skipped, never a panic;
//! memory is bounded (a record is at most 64 KiB; the AUX copy-out is bounded by the AUX size).
//! Multi-byte values are little-endian (arm64 and x86_64 hosts).
//!
//! ```
//! use etm_perf::clock::ClockConv;
//! let c = ClockConv { time_zero: 1000, time_mult: 1 << 31, time_shift: 31, ..Default::default() };
//! assert_eq!(c.to_perf_time(5), 1005);
//! ```

pub mod attr;
pub mod clock;
pub mod discovery;
pub mod format;
pub mod host;
pub mod perf_data;
pub mod plan;
pub mod records;
pub mod ring;
pub mod topology;

pub(crate) mod bytes;
