//! `etm-session`: the one pipeline both drivers (live collection and replay) feed, the
//! per-CPU join of trace windows with pause samples, and the session directory format.
//!
//! * [`session`] — the on-disk session directory (read/write; with [`image`], the code images
//!   mapped from files, the only modules doing file I/O).
//! * [`join`] — per CPU, attach to each pause sample the last N branches of the window that
//!   pause closed, validate the hybrid sample against the code, count rejects by reason.
//! * [`pipeline`] — AUX bytes -> per-buffer trace decoder -> windows of branch records -> join
//!   -> `etm_profile::HybridProfile` + `etm_stacks::ContextTrie`, with per-stage stats.
//! * [`isa`] — per-architecture code facts for the checks (A64, x86-64) and the kernel's
//!   branch-entry flags.
//! * [`window`] — the decoder interface the pipeline drives ([`window::WindowDecoder`]); `aux`
//!   — what each AUX record asks of its decoder, planned once for the pipeline and the decode
//!   pool; [`code`] — the code images and their placement per process, read by the decoder,
//!   the checks and the exact counts, and the address resolver over them; `exact` — the exact
//!   per-function counts kept per segment. The modules depend one way: `pipeline` on the rest.
//! * [`decoder`] — the `etm_decode` adapter behind the pipeline's [`window::WindowDecoder`]
//!   trait, and a toy test double.
//!
//! Design constraints: online (bounded memory: pending samples and segments per CPU are
//! bounded, buffers are pooled; no per-branch allocation), best effort on trace loss (a
//! truncated record, a gap in the AUX ring offsets, corrupt bytes or a window without sync are
//! counted and resynced past; the decoder restarts after a gap, and a window that lost data is
//! never attached to a pause), deterministic (the result depends only on the event order).
//!
//! ```
//! use std::sync::Arc;
//! use etm_session::decoder::toy::{ToyFactory, ToyWriter};
//! use etm_session::session::{AuxRecord, CpuTraceConfig, PauseSample, SessionEvent};
//! use etm_session::{Pipeline, PipelineConfig};
//!
//! let cfg = PipelineConfig {
//!     cpus: vec![CpuTraceConfig { cpu: 0, trace_id: 0x10, ..Default::default() }],
//!     decoder: Some(Arc::new(ToyFactory)), // the real default is the etm_decode decoder
//!     ..Default::default()
//! };
//! let mut p = Pipeline::new(cfg);
//! // One window on CPU 0: trace on at t=100, two taken branches.
//! let mut w = ToyWriter::default();
//! w.sync().trace_on().ts(100).branch(0x1008, 0x2000).branch(0x2010, 0x3000);
//! let rec = AuxRecord { cpu: 0, flags: 0x100, time: 150, aux_offset: 0, size: w.0.len() as u64, source_cpu: None };
//! p.push(SessionEvent::Aux { record: rec, data: &w.0 });
//! // The pause sample that closed it (leaf just after the newest target).
//! let s = PauseSample { cpu: 0, pid: 1, tid: 1, time: 160, stack: vec![0x3008, 0x100c], branches: None, branch_flags: Vec::new(), window_ns: None, user_stack: None };
//! p.push(SessionEvent::Sample(&s));
//! p.finish();
//! assert_eq!(p.stats().join.joined, 1);
//! assert_eq!(p.profile().total_samples(), 1);
//! ```

mod aux;
pub mod code;
pub mod decoder;
mod exact;
mod frame_cache;
pub mod image;
pub mod isa;
pub mod join;
pub mod pipeline;
mod pool;
pub mod session;
mod shadow;
pub mod window;

pub use join::{JoinConfig, JoinStats, Joined, RejectReason};
pub use pipeline::{Pipeline, PipelineConfig, PipelineStats};
pub use pool::WORKER_THREAD_PREFIX;
pub use session::SessionEvent;
