//! Write a [`Synthesis`] as a session directory through [`etm_session::session::SessionWriter`],
//! plus `ground_truth.jsonl` ([`crate::gtfile`]).
//!
//! Events, in order: `comm` (exec), one `mmap2` per executable segment of the program,
//! `itrace_start`, `aux_output_hw_id` (trace ID, hw_id version 0.1), then per window one `aux`
//! record (flags = `PERF_AUX_FLAG_CORESIGHT_FORMAT_RAW`: unformatted ETE as TRBE writes it,
//! time = the pause) followed by its pause `sample` (cpu, pid, tid, time, true stack, no branch
//! records), and finally `exit`. Faults ([`crate::generate::Fault`]) alter the written window
//! (bytes, flags, or the sample replaced by a `lost` record); the ground truth marks them.

use std::collections::HashMap;
use std::io::BufWriter;
use std::path::Path;

use etm_session::session::{
    AuxRecord, ClockParams, CpuTraceConfig, PERF_AUX_FLAG_CORESIGHT_FORMAT_RAW, PERF_AUX_FLAG_TRUNCATED, PauseSample,
    SessionMeta, SessionSource, SessionWriter, Sideband, TargetInfo, TraceArch, WindowParams,
};

use crate::SynthError;
use crate::ete::A_SYNC;
use crate::generate::{Fault, Synthesis, clock, regs};
use crate::gtfile::{self, GtMeta};
use crate::image::CodeImage;

/// Name of the ground-truth file in the session directory.
pub const GROUND_TRUTH_FILE: &str = "ground_truth.jsonl";

/// What was written.
#[derive(Debug, Clone, Default)]
pub struct WriteSummary {
    /// Windows (AUX records and samples).
    pub windows: u64,
    /// AUX bytes.
    pub aux_bytes: u64,
}

/// Write the session for `syn`, generated from `program args` run with `exit_code`.
// `..Default::default()` keeps this compiling when the session format gains fields.
#[allow(clippy::needless_update)]
pub fn write_session(
    dir: &Path,
    program: &Path,
    args: &[String],
    exit_code: Option<i32>,
    image: &CodeImage,
    syn: &Synthesis,
) -> Result<WriteSummary, SynthError> {
    let cfg = &syn.config;
    let program_abs = std::fs::canonicalize(program).unwrap_or_else(|_| program.to_path_buf());
    let program_name = program_abs.to_string_lossy().into_owned();
    let mut command = vec![program_name.clone()];
    command.extend(args.iter().cloned());
    let mut notes = HashMap::new();
    notes.insert("generator".to_string(), format!("etm-synth {}", env!("CARGO_PKG_VERSION")));
    notes.insert("ground_truth".to_string(), GROUND_TRUTH_FILE.to_string());
    notes.insert("clock_model".to_string(), format!("1 instruction/ns, {} instructions per counter tick", clock::INSNS_PER_TICK));
    let meta = SessionMeta {
        version: 0,
        source: SessionSource::Synthetic,
        target: TargetInfo { pid: cfg.pid as i64, command: command.clone(), ..Default::default() },
        cpus: vec![CpuTraceConfig {
            cpu: cfg.cpu,
            arch: TraceArch::Ete,
            trace_id: regs::TRACE_ID,
            sink_id: None,
            trcconfigr: cfg.trcconfigr(),
            trcidr0: regs::TRCIDR0,
            trcidr1: regs::TRCIDR1,
            trcidr2: regs::TRCIDR2,
            trcidr8: regs::TRCIDR8,
            trcauthstatus: regs::TRCAUTHSTATUS,
            trcdevarch: regs::TRCDEVARCH,
            ts_source: 1,
        }],
        clock: Some(ClockParams {
            time_zero: clock::TIME_ZERO,
            time_mult: clock::TIME_MULT,
            time_shift: clock::TIME_SHIFT,
            ..Default::default()
        }),
        branch_depth: 32,
        window: WindowParams {
            mode: "synthetic".into(),
            unit: "instructions".into(),
            window: cfg.window,
            period: cfg.period,
            ..Default::default()
        },
        images: Vec::new(),
        notes,
        arch: Some(etm_session::session::CodeArch::Aarch64),
    };
    let sess = |e: etm_session::session::SessionError| SynthError::Session(e);
    let mut w = SessionWriter::create(dir, meta).map_err(sess)?;
    w.add_image(&program_abs, None, true).map_err(sess)?;

    let (pid, tid, cpu) = (cfg.pid, cfg.tid, Some(cfg.cpu));
    let t0 = clock::perf_time(clock::COUNTER_BASE);
    let comm = program_abs.file_name().map(|n| n.to_string_lossy().chars().take(15).collect()).unwrap_or_default();
    w.write_sideband(&Sideband::Comm { pid, tid, comm, exec: true, time: t0, cpu }).map_err(sess)?;
    for seg in &image.segments {
        let page = seg.vaddr & !0xFFF;
        w.write_sideband(&Sideband::Mmap2 {
            pid,
            tid,
            addr: page,
            len: (seg.vaddr + seg.data.len() as u64 - page + 0xFFF) & !0xFFF,
            pgoff: seg.file_offset & !0xFFF,
            prot: 5,
            flags: 2,
            filename: program_name.clone(),
            build_id: None,
            time: t0,
            cpu,
        })
        .map_err(sess)?;
    }
    w.write_sideband(&Sideband::ItraceStart { pid, tid, time: t0, cpu }).map_err(sess)?;
    w.write_sideband(&Sideband::AuxOutputHwId { hw_id: (1u64 << 56) | regs::TRACE_ID as u64, time: t0, cpu }).map_err(sess)?;

    let mut summary = WriteSummary::default();
    let mut offsets = Vec::with_capacity(syn.windows.len());
    let mut ring = 0u64;
    for (k, win) in syn.windows.iter().enumerate() {
        let fault = cfg.fault(k as u64);
        let mut flags = PERF_AUX_FLAG_CORESIGHT_FORMAT_RAW;
        let mut bytes: std::borrow::Cow<'_, [u8]> = (&win.bytes[..]).into();
        // Sync packets at the start of every window: A-sync (12 bytes) + Trace Info (2 bytes).
        let sync_len = A_SYNC.len() + 2;
        match fault {
            Some(Fault::Truncate) => {
                bytes = (&win.bytes[..win.bytes.len() / 2]).into();
                flags |= PERF_AUX_FLAG_TRUNCATED;
            }
            Some(Fault::Corrupt) => {
                let mut v = win.bytes.clone();
                let at = (sync_len + (v.len() - sync_len) / 2).min(v.len() - 1);
                v[at] ^= 0x5A;
                bytes = v.into();
            }
            Some(Fault::NoSync) => bytes = (&win.bytes[sync_len.min(win.bytes.len())..]).into(),
            Some(Fault::Lost) | None => {}
        }
        offsets.push((summary.aux_bytes, bytes.len() as u64));
        let rec = AuxRecord {
            cpu: cfg.cpu,
            flags,
            time: win.sample_time,
            aux_offset: ring,
            size: win.bytes.len() as u64,
            source_cpu: None,
        };
        w.write_aux(&rec, &bytes).map_err(sess)?;
        ring += win.bytes.len() as u64;
        if fault == Some(Fault::Lost) {
            w.write_sideband(&Sideband::Lost { id: 0, lost: 1, time: win.sample_time, cpu }).map_err(sess)?;
        } else {
            let sample = PauseSample {
                cpu: cfg.cpu,
                pid,
                tid,
                time: win.sample_time,
                stack: win.stack.clone(),
                branches: None,
                branch_flags: Vec::new(),
                window_ns: None,
                user_stack: None,
            };
            w.write_sample(&sample).map_err(sess)?;
        }
        summary.windows += 1;
        summary.aux_bytes += bytes.len() as u64;
    }
    let t_end = clock::perf_time(clock::counter(syn.stats.insns));
    w.write_sideband(&Sideband::Exit { pid, ppid: 1, tid, ptid: 1, time: t_end, cpu }).map_err(sess)?;
    w.finish().map_err(sess)?;

    let gmeta = GtMeta {
        program: program_name,
        args: args.to_vec(),
        exit_code,
        window: cfg.window,
        period: cfg.period,
        retstack: cfg.retstack,
        trcconfigr: cfg.trcconfigr(),
        cpu: cfg.cpu,
        pid,
        tid,
        windows: syn.windows.len() as u64,
        faults: cfg.faults.clone(),
        stats: syn.stats.clone(),
    };
    let path = dir.join(GROUND_TRUTH_FILE);
    let f = std::fs::File::create(&path).map_err(|source| SynthError::Io { path: path.clone(), source })?;
    let mut bw = BufWriter::new(f);
    gtfile::write(&mut bw, &gmeta, syn, &offsets).map_err(|source| SynthError::Io { path: path.clone(), source })?;
    std::io::Write::flush(&mut bw).map_err(|source| SynthError::Io { path, source })?;
    Ok(summary)
}
