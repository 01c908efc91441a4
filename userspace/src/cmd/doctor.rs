//! `etm-bpf doctor`: what this machine (or a captured sysfs/proc tree, or a `run --record`
//! directory) offers for live ETM profiling, one finding per line with its fix, and the mode
//! `run --branches etm` would choose with its periods, interrupt rate and expected samples.

use std::io::Write as _;
use std::process::ExitCode;

use etm_perf::discovery::{AuxPauseSupport, CsEtmSystem, EVENT_SOURCE, TsSource};
use etm_perf::host::{CAP_BPF, CAP_PERFMON, CAP_SYS_ADMIN, HostFacts};

use crate::cmd::run::EtmArgs;
use crate::live::etm::{EtmSetup, cs_etm_present};

#[derive(clap::Args, Debug)]
#[command(after_help = "Examples:\n  \
    etm-bpf doctor\n  \
    etm-bpf doctor --json\n  \
    etm-bpf doctor --sysfs-root captured/sys --proc-root captured/proc\n  \
    etm-bpf doctor --sysfs-root rec/        # a `run --record` directory")]
pub struct DoctorArgs {
    /// One JSON object instead of lines.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub etm: EtmArgs,
}

/// One finding: what, and what to do about it (empty: nothing).
struct Finding {
    what: String,
    fix: String,
}

fn finding(what: impl Into<String>, fix: impl Into<String>) -> Finding {
    Finding { what: what.into(), fix: fix.into() }
}

pub fn main(args: DoctorArgs) -> anyhow::Result<ExitCode> {
    let cfg = args.etm.config();
    let live = cfg.sysfs_root == std::path::Path::new("/sys");
    let host = HostFacts::read(&cfg.proc_root, &cfg.sysfs_root);
    let mut f: Vec<Finding> = Vec::new();
    let mut json = serde_json::json!({});
    let kernel = host.kernel;
    match (&host.release, kernel) {
        (Some(rel), Some(k)) => {
            let pause = AuxPauseSupport::for_kernel(k);
            f.push(finding(
                format!(
                    "kernel {rel}: aux_action {} (6.13+), CoreSight AUX pause {} (6.16+)",
                    yes(pause.attr_bits),
                    if pause.cs_etm { "expected" } else { "no" }
                ),
                if pause.cs_etm {
                    ""
                } else {
                    "without AUX pause run uses the autofdo strobing preset; a 6.16+ kernel enables pause/resume windows"
                },
            ));
        }
        _ => f.push(finding(format!("kernel release unreadable under {}", cfg.proc_root.display()), "pass --proc-root")),
    }
    json["kernel"] = host.release.clone().into();
    f.push(finding("bpf_read_branch_records: available (5.7+, for LBR/BRBE samples)".to_string(), ""));
    let unit = host.branch_unit();
    let pmus = host
        .brbe
        .iter()
        .map(|(p, n)| format!("{p} {n}"))
        .chain(host.lbr.iter().map(|(p, n, name)| match name {
            Some(m) => format!("{p} ({m}) {n}"),
            None => format!("{p} {n}"),
        }))
        .collect::<Vec<_>>()
        .join(", ");
    match &unit {
        Some(u) => f.push(finding(
            format!(
                "branch-record unit: {} (caps/branches: {pmus}); all {} records are kept per sample",
                u.describe(),
                u.depth()
            ),
            "",
        )),
        None => f.push(finding(
            "branch-record unit: none (no core PMU shows caps/branches: no LBR/BRBE, or the kernel or firmware disabled it)",
            "",
        )),
    }
    json["brbe"] =
        serde_json::json!(host.brbe.iter().map(|(p, n)| serde_json::json!({"pmu": p, "records": n})).collect::<Vec<_>>());
    json["lbr"] = serde_json::json!(
        host.lbr.iter().map(|(p, n, m)| serde_json::json!({"pmu": p, "records": n, "pmu_name": m})).collect::<Vec<_>>()
    );
    json["branch_unit"] = match &unit {
        Some(u) => serde_json::json!({"kind": u.describe(), "records": u.depth()}),
        None => serde_json::Value::Null,
    };
    // Which kernel fixes the branch events' scope depends on (docs/lbr.md).
    let arm64 = if live {
        cfg!(target_arch = "aarch64")
    } else {
        !host.brbe.is_empty() || host.lbr.is_empty() && cs_etm_present(&cfg.sysfs_root)
    };
    let scope = etm_perf::host::branch_event_scope(kernel, arm64, None);
    f.push(finding(
        format!(
            "branch events (--branch-events auto): {}: {}",
            match scope.scope {
                etm_perf::host::BranchScope::PerThread => "per-thread",
                etm_perf::host::BranchScope::CpuWide => "CPU-wide",
            },
            scope.reason
        ),
        if scope.null_pmu_ctx_risk {
            "do not use --branch-events cpu on this kernel (NULL pmu_ctx in armv8pmu_sched_task)"
        } else {
            ""
        },
    ));
    json["branch_events"] = serde_json::json!({
        "scope": format!("{:?}", scope.scope),
        "reason": scope.reason,
        "null_pmu_ctx_risk": scope.null_pmu_ctx_risk,
        "stale_branch_risk": scope.stale_branch_risk,
    });
    let has_etm = cs_etm_present(&cfg.sysfs_root);
    json["cs_etm"] = has_etm.into();
    let mut warnings: Vec<String> = Vec::new();
    let mut notes: Vec<String> = Vec::new();
    if has_etm {
        let sys = CsEtmSystem::discover(&cfg.sysfs_root)?;
        for c in &sys.cpus {
            let ts = match c.ts_source {
                Some(TsSource::Virtual) => "virtual counter",
                Some(TsSource::Unknown) => "unknown (-1: no FEAT_TRF, the SoC's timestamp generator)",
                Some(TsSource::Physical) => "physical counter",
                Some(TsSource::GuestPhysical) => "guest physical counter",
                Some(TsSource::Other(_)) => "other",
                None => "not shown (kernel before ts_source)",
            };
            f.push(finding(format!("cpu {}: {}, ts_source {ts}", c.cpu, c.arch), ""));
        }
        json["cpus"] = serde_json::json!(
            sys.cpus.iter().map(|c| serde_json::json!({"cpu": c.cpu, "arch": c.arch.to_string(), "ts_source": c.ts_source.map(|t| match t {
                TsSource::Unknown => -1, TsSource::Virtual => 1, TsSource::GuestPhysical => 2, TsSource::Physical => 3, TsSource::Other(x) => x,
            })})).collect::<Vec<_>>()
        );
        let extout = sys.trcextout1_on(&sys.cpus.iter().map(|c| c.cpu).collect::<Vec<_>>());
        let pulse = sys.field("pmu_pulse").is_some();
        f.push(finding(
            format!("TRCEXTOUT1 PMU event: {}; cs_etm pmu_pulse: {}", yes(extout), yes(pulse)),
            if extout && pulse {
                ""
            } else {
                "without both, windows are free-running (more interrupts per window); see docs/live-etm.md"
            },
        ));
        match EtmSetup::decide(&cfg, live) {
            Ok(setup) => {
                f.push(finding(format!("sinks: {}", setup.sinks.summary()), ""));
                json["sinks"] = serde_json::json!(
                    setup
                        .sinks
                        .sinks
                        .iter()
                        .map(|s| serde_json::json!({"name": s.name, "kind": s.kind.name(), "per_cpu": s.per_cpu, "cpus": s.cpus}))
                        .collect::<Vec<_>>()
                );
                let p = &setup.plan;
                f.push(finding(format!("run would use: {}", setup.mode_line()), ""));
                json["window_mode"] = format!("{:?}", p.mode).to_lowercase().into();
                json["window_reason"] = setup.choice.reason.clone().into();
                json["pause_period"] = p.pause_period.into();
                json["resume_period"] = p.resume_period.into();
                json["cpu_hz"] = p.hz.into();
                json["cpu_hz_assumed"] = p.hz_assumed.into();
                json["pause_interrupts_per_s"] = p.pause_interrupts_per_s.round().into();
                json["resume_interrupts_per_s"] = p.resume_interrupts_per_s.round().into();
                json["windows_per_s"] = p.windows_per_s.round().into();
                json["mean_window_cycles"] = p.mean_window.round().into();
                json["duty"] = p.duty.into();
                json["hybrid_samples_per_s_per_cpu"] = p.windows_per_s.round().into();
                json["delivery"] = p.delivery.name().into();
                json["harvest_ms"] = p.harvest_ms.into();
                json["per_thread"] = p.per_thread.into();
                json["trace_timestamps"] = p.trace_timestamps.into();
                json["context_ids"] = p.context_ids.into();
                warnings.extend(p.warnings.iter().cloned());
                notes.extend(p.notes.iter().cloned());
            }
            Err(e) => {
                f.push(finding(
                    format!("no usable window mode: {e:#}"),
                    "a 6.13+ kernel (aux_action) or the autofdo configuration is needed",
                ));
                warnings.push(format!("{e:#}"));
                json["window_mode"] = serde_json::Value::Null;
            }
        }
        warnings.extend(sys.warnings.iter().cloned());
    } else {
        f.push(finding(
            format!(
                "no cs_etm PMU ({} missing): no CoreSight ETM/ETE trace",
                cfg.sysfs_root.join(EVENT_SOURCE).join("cs_etm").display()
            ),
            "run --branches none|lbr profiles stacks (and LBR/BRBE branches) without it",
        ));
        json["sinks"] = serde_json::json!([]);
        json["window_mode"] = serde_json::Value::Null;
    }
    // What run does with --branches auto: ETM when cs_etm is usable, else the sampling event
    // and branch source this machine offers (probed on this thread; from the tree's PMUs for
    // a captured tree).
    let etm_usable = has_etm && json["window_mode"] != serde_json::Value::Null;
    let (event, branches) = if live {
        let (e, b) = crate::cmd::run::probe_events();
        (e.name(), b)
    } else {
        let pmus: Vec<String> = std::fs::read_dir(cfg.sysfs_root.join(EVENT_SOURCE))
            .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        let core = pmus.iter().any(|p| p.starts_with("armv8_") || p.starts_with("armv9_") || p == "cpu" || p.starts_with("cpu_"));
        (if core { "cycles" } else { "cpu-clock" }, if unit.is_none() { "none" } else { "lbr" })
    };
    let branches = if etm_usable { "etm" } else { branches };
    let why = match branches {
        "etm" => "a usable cs_etm PMU comes first".to_string(),
        "lbr" => format!(
            "no usable cs_etm; the cycles event accepted a branch stack{}",
            unit.as_ref().map_or(String::new(), |u| format!(" ({})", u.describe()))
        ),
        _ if has_etm => "cs_etm has no usable window mode and no branch stack was accepted".to_string(),
        _ => "no cs_etm PMU and no event accepted a branch stack".to_string(),
    };
    json["run_branches_reason"] = why.clone().into();
    f.push(finding(
        format!(
            "run would sample: {event} with branches {} ({why})",
            match branches {
                "etm" => "etm (CoreSight trace windows)",
                "lbr" => "lbr (LBR/BRBE records)",
                _ => "none (stack-only samples: AutoFDO/CSSPGO need branches)",
            }
        ),
        if event == "cpu-clock" { "no hardware cycles event here (a VM without a PMU?): samples are timer-driven" } else { "" },
    ));
    json["run_event"] = event.into();
    json["run_branches"] = branches.into();
    let privileged = host.has_cap(CAP_SYS_ADMIN) == Some(true)
        || (host.has_cap(CAP_BPF) == Some(true) && host.has_cap(CAP_PERFMON) == Some(true));
    match host.paranoid {
        Some(p) => f.push(finding(
            format!("perf_event_paranoid {p}"),
            if p > 0 && !privileged { "CPU-wide events need CAP_PERFMON (or root), or perf_event_paranoid <= 0" } else { "" },
        )),
        None => f.push(finding("perf_event_paranoid unreadable", "")),
    }
    json["perf_event_paranoid"] = host.paranoid.into();
    match host.max_sample_rate {
        Some(r) => f.push(finding(
            format!("perf_event_max_sample_rate {r}: an event is throttled (with its group) past about {} overflows/s", r),
            if r < 100_000 { "raise kernel.perf_event_max_sample_rate, or the periods stay long" } else { "" },
        )),
        None => f.push(finding("perf_event_max_sample_rate unreadable", "")),
    }
    json["perf_event_max_sample_rate"] = host.max_sample_rate.into();
    let cpus_n = CsEtmSystem::discover(&cfg.sysfs_root).map(|s| s.cpus.len()).unwrap_or(0).max(1) as u64;
    // The leader's data ring as `run` sizes it with its default stack copies (--unwind auto).
    let data_bytes = crate::cmd::run::etm_data_bytes(cfg.data_bytes, etm_bpf_common::DEFAULT_STACK_BYTES as u32);
    let need_kb = cpus_n * (cfg.aux_bytes as u64 + data_bytes as u64 + 4096) / 1024;
    let can_lock = host.has_cap(CAP_SYS_ADMIN) == Some(true) || host.has_cap(CAP_PERFMON) == Some(true);
    match host.mlock_kb {
        Some(kb) if !has_etm => f.push(finding(format!("perf_event_mlock_kb {kb} KiB"), "")),
        Some(kb) => f.push(finding(
            format!(
                "perf_event_mlock_kb {kb} KiB; the rings need about {need_kb} KiB ({cpus_n} buffers, with {} KiB stack copies)",
                etm_bpf_common::DEFAULT_STACK_BYTES >> 10
            ),
            if kb < need_kb && !can_lock {
                "raise /proc/sys/kernel/perf_event_mlock_kb or run with CAP_IPC_LOCK/CAP_PERFMON"
            } else {
                ""
            },
        )),
        None => f.push(finding("perf_event_mlock_kb unreadable", "")),
    }
    json["perf_event_mlock_kb"] = host.mlock_kb.into();
    json["page_size"] = host.page_size.into();
    if let Some(ps) = host.page_size {
        f.push(finding(format!("page size {} KiB (ring sizes are set in bytes)", ps / 1024), ""));
    }
    f.push(finding(
        format!("privileges: {}", if privileged { "CAP_BPF + CAP_PERFMON (or CAP_SYS_ADMIN)" } else { "missing" }),
        if privileged { "" } else { "run as root, or with CAP_BPF and CAP_PERFMON" },
    ));
    json["privileged"] = privileged.into();
    let ctx = match (host.pid_in_contextidr, host.init_pid_ns) {
        (Some(true), Some(true)) => {
            finding("context IDs: CONFIG_PID_IN_CONTEXTIDR=y, initial PID namespace: traced thread ids", "")
        }
        (Some(false), _) => finding(
            "context IDs: CONFIG_PID_IN_CONTEXTIDR off",
            "windows are placed by context-switch records; a kernel with CONFIG_PID_IN_CONTEXTIDR=y marks them in the trace",
        ),
        (_, Some(false)) => finding(
            "context IDs: not in the initial PID namespace (the kernel will not trace them)",
            "run etm-bpf in the host's PID namespace",
        ),
        _ => finding("context IDs: kernel config not readable", ""),
    };
    f.push(ctx);
    json["warnings"] = serde_json::json!(warnings);
    json["notes"] = serde_json::json!(notes);
    let mut out = std::io::stdout().lock();
    if args.json {
        writeln!(out, "{}", serde_json::to_string_pretty(&json)?)?;
    } else {
        for x in &f {
            if x.fix.is_empty() {
                writeln!(out, "{}", x.what)?;
            } else {
                writeln!(out, "{}  -> {}", x.what, x.fix)?;
            }
        }
        for n in &notes {
            writeln!(out, "note: {n}")?;
        }
        for w in &warnings {
            writeln!(out, "warning: {w}")?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn yes(b: bool) -> &'static str {
    if b { "yes" } else { "no" }
}
