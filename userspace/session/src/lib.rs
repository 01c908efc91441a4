//! `etm-session`: the one pipeline both drivers (live collection and replay) feed, the
//! per-CPU join of trace windows with pause samples, and the session directory format.
//!
//! * [`session`] — the on-disk session directory (read/write; the only module doing I/O).
//! * `join` — per CPU, attach to each pause sample the last branches of the window that pause
//!   closed, validate the hybrid sample, count rejects by reason.
//! * `pipeline` — AUX bytes -> decoder -> branch ring -> join -> profile, with per-stage stats.
//!
//! Design constraints: online (bounded memory, no per-element allocation on hot paths), best
//! effort on trace loss (a truncated record, lost records, corrupt bytes or a window without
//! sync are counted and resynced past; each window decodes afresh after a discontinuity).

pub mod decoder;
pub mod join;
pub mod pipeline;
pub mod session;

pub use join::{JoinConfig, JoinStats, Joined, RejectReason};
pub use pipeline::{Pipeline, PipelineConfig, PipelineStats};
pub use session::SessionEvent;
