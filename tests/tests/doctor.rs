//! `etm-bpf doctor` on captured trees: the fixture machines (Neoverse N1 with one shared ETR,
//! V2 with a TRBE per CPU) and variants of them (a 6.8 kernel without AUX pause, 64 KiB pages,
//! a lowered perf_event_max_sample_rate). Every expectation comes from the tree's files: the
//! CoreSight graph, ts_source, the proc settings (userspace/perf/tests/fixtures/README.md).

use std::path::{Path, PathBuf};
use std::process::Command;

use etm_bpf_tests::{etm_bpf_bin, repo_root};

fn fixture(name: &str) -> PathBuf {
    repo_root().join("userspace/perf/tests/fixtures").join(name)
}

/// A copy of a fixture (symlinks kept) to change files in.
fn variant(name: &str, tag: &str) -> tempfile::TempDir {
    fn copy(src: &Path, dst: &Path) {
        std::fs::create_dir_all(dst).unwrap();
        for e in std::fs::read_dir(src).unwrap() {
            let e = e.unwrap();
            let (s, d) = (e.path(), dst.join(e.file_name()));
            let ft = e.file_type().unwrap();
            if ft.is_symlink() {
                std::os::unix::fs::symlink(std::fs::read_link(&s).unwrap(), &d).unwrap();
            } else if ft.is_dir() {
                copy(&s, &d);
            } else {
                std::fs::copy(&s, &d).unwrap();
            }
        }
    }
    let dir = tempfile::Builder::new().prefix(&format!("doctor-{tag}-")).tempdir().unwrap();
    copy(&fixture(name), dir.path());
    dir
}

fn doctor(root: &Path, json: bool) -> (String, serde_json::Value) {
    let mut c = Command::new(etm_bpf_bin());
    c.arg("doctor").arg("--sysfs-root").arg(root).arg("--proc-root").arg(root.join("proc"));
    if json {
        c.arg("--json");
    }
    let o = c.output().expect("run etm-bpf doctor");
    let out = String::from_utf8(o.stdout).unwrap();
    assert!(o.status.success(), "doctor failed: {}", String::from_utf8_lossy(&o.stderr));
    let v = if json { serde_json::from_str(&out).expect("one JSON object") } else { serde_json::Value::Null };
    (out, v)
}

fn warnings(v: &serde_json::Value) -> Vec<String> {
    v["warnings"].as_array().unwrap().iter().map(|w| w.as_str().unwrap().to_string()).collect()
}

/// N1: one ETR shared by CPUs 0-3 (the graph: cluster funnels -> main funnel -> ETF ->
/// replicator -> ETR), free-running windows within the interrupt budget, and no FEAT_TRF
/// (ts_source -1), so per-thread tracing with per-pause records.
#[test]
fn n1_shared_etr() {
    let (_, v) = doctor(&fixture("n1-etr"), true);
    assert_eq!(v["kernel"], "6.16.0-n1-fixture");
    assert_eq!(v["cs_etm"], true);
    assert_eq!(v["sinks"], serde_json::json!([{"name": "tmc_etr0", "kind": "ETR", "per_cpu": false, "cpus": [0, 1, 2, 3]}]));
    assert_eq!(v["window_mode"], "free");
    // From the tree: a core PMU (armv8_pmuv3_0) and usable ETM.
    assert_eq!((v["run_event"].as_str(), v["run_branches"].as_str()), (Some("cycles"), Some("etm")));
    let (p, r) = (v["pause_period"].as_u64().unwrap(), v["resume_period"].as_u64().unwrap());
    assert!(r > p && p % 2 == 1, "{p} {r}");
    // 3.0 GHz from cpuinfo_max_freq: the rates follow from the periods.
    assert_eq!(v["cpu_hz"], 3_000_000_000u64);
    let pause_irqs = v["pause_interrupts_per_s"].as_f64().unwrap();
    assert!((pause_irqs - 3e9 / p as f64).abs() <= 1.0);
    assert!((v["windows_per_s"].as_f64().unwrap() - 3e9 / r as f64).abs() <= 1.0);
    assert!(pause_irqs + v["resume_interrupts_per_s"].as_f64().unwrap() <= 10_001.0);
    assert_eq!(
        (v["delivery"].as_str(), v["per_thread"].as_bool(), v["trace_timestamps"].as_bool()),
        (Some("per-pause"), Some(true), Some(false))
    );
    assert!(warnings(&v).iter().any(|w| w.contains("ts_source")), "{:?}", warnings(&v));
    // The default window raised to the budget is a note; the same window asked for is a warning.
    assert!(v["notes"].as_array().unwrap().iter().any(|n| n.as_str().unwrap().contains("mean window raised")), "{v}");
    assert!(!warnings(&v).iter().any(|w| w.contains("raised")));
    let o = Command::new(etm_bpf_bin())
        .args(["doctor", "--json", "--etm-window", "1000", "--sysfs-root"])
        .arg(fixture("n1-etr"))
        .arg("--proc-root")
        .arg(fixture("n1-etr").join("proc"))
        .output()
        .unwrap();
    let asked: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(warnings(&asked).iter().any(|w| w.contains("mean window raised")), "{asked}");
    assert_eq!(asked["pause_period"], v["pause_period"]);
    let (text, _) = doctor(&fixture("n1-etr"), false);
    assert!(text.lines().any(|l| l.starts_with("sinks: tmc_etr0 (ETR, cpus 0-3)")), "{text}");
    assert!(text.lines().any(|l| l.starts_with("run would use: window free")), "{text}");
}

/// V2: a TRBE per CPU, convertible timestamps: watermark delivery with harvests, CPU-wide.
#[test]
fn v2_trbe() {
    let (_, v) = doctor(&fixture("v2-trbe"), true);
    let sinks = v["sinks"].as_array().unwrap();
    assert_eq!(sinks.len(), 4);
    for (i, s) in sinks.iter().enumerate() {
        assert_eq!(s, &serde_json::json!({"name": format!("trbe{i}"), "kind": "TRBE", "per_cpu": true, "cpus": [i]}));
    }
    assert_eq!(v["cpu_hz"], 3_400_000_000u64);
    assert_eq!(
        (v["delivery"].as_str(), v["per_thread"].as_bool(), v["trace_timestamps"].as_bool()),
        (Some("watermark"), Some(false), Some(true))
    );
    assert_eq!(v["window_mode"], "free", "trcextout1 but no pmu_pulse");
}

/// A 6.8 kernel: no aux_action, so the autofdo strobing preset.
#[test]
fn kernel_without_aux_pause() {
    let d = variant("n1-etr", "k68");
    std::fs::write(d.path().join("proc/sys/kernel/osrelease"), "6.8.0-generic\n").unwrap();
    std::fs::rename(d.path().join("boot/config-6.16.0-n1-fixture"), d.path().join("boot/config-6.8.0-generic")).unwrap();
    let (_, v) = doctor(d.path(), true);
    assert_eq!(v["window_mode"], "strobe");
    assert!(v["window_reason"].as_str().unwrap().contains("6.8.0"));
    assert_eq!(v["pause_interrupts_per_s"], 0.0);
    let (text, _) = doctor(d.path(), false);
    assert!(text.contains("CoreSight AUX pause no (6.16+)  -> without AUX pause"), "{text}");
}

/// 64 KiB pages: said, and ring sizes stay in bytes.
#[test]
fn big_pages() {
    let d = variant("v2-trbe", "64k");
    std::fs::write(d.path().join("proc/self/smaps"), "KernelPageSize:       64 kB\n").unwrap();
    let (_, v) = doctor(d.path(), true);
    assert_eq!(v["page_size"], 65536);
    assert!(warnings(&v).iter().any(|w| w.starts_with("64 KiB pages")), "{:?}", warnings(&v));
}

/// A lowered perf_event_max_sample_rate (4000/s): each event stays at or below half of it.
#[test]
fn lowered_sample_rate() {
    let d = variant("v2-trbe", "rate");
    std::fs::write(d.path().join("proc/sys/kernel/perf_event_max_sample_rate"), "4000\n").unwrap();
    let (_, v) = doctor(d.path(), true);
    assert_eq!(v["perf_event_max_sample_rate"], 4000);
    assert!(v["pause_interrupts_per_s"].as_f64().unwrap() <= 2000.0 + 1.0);
    assert!(v["resume_interrupts_per_s"].as_f64().unwrap() <= 2000.0 + 1.0);
    assert!(warnings(&v).iter().any(|w| w.contains("4000")));
}

/// This machine (no cs_etm): doctor still reports what there is, with cs_etm false.
#[test]
fn this_machine() {
    let o = Command::new(etm_bpf_bin()).args(["doctor", "--json"]).output().unwrap();
    assert!(o.status.success());
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let has = Path::new("/sys/bus/event_source/devices/cs_etm").exists();
    assert_eq!(v["cs_etm"], has);
    assert_eq!(v["kernel"].as_str().unwrap(), std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap().trim());
    if !has {
        assert_eq!(v["window_mode"], serde_json::Value::Null);
        assert_eq!(v["sinks"], serde_json::json!([]));
    }
    // The event run would use, against an independent probe: hardware cycles open on this
    // thread exactly when the kernel has a PMU with them (this VM has none: cpu-clock).
    let attr_cycles = std::path::Path::new("/sys/bus/event_source/devices/cpu/type").exists()
        || std::fs::read_dir("/sys/bus/event_source/devices")
            .map(|d| d.flatten().any(|e| e.file_name().to_string_lossy().starts_with("armv8_pmuv3")))
            .unwrap_or(false);
    assert_eq!(v["run_event"], if attr_cycles { "cycles" } else { "cpu-clock" }, "{v}");
    if has {
        assert_eq!(v["run_branches"], "etm");
    }
}

/// An x86 tree (the N1 tree without cs_etm, with an Alder Lake-like hybrid PMU pair showing
/// `caps/branches` and `arch_lbr` in cpuinfo): doctor names the unit and its depth, says
/// `--branches auto` takes LBR and why, and that branch events are per-thread because no
/// kernel is known to have the sched_task fixes.
#[test]
fn x86_arch_lbr_tree() {
    let dir = variant("n1-etr", "lbr");
    let root = dir.path();
    let devices = root.join("bus/event_source/devices");
    std::fs::remove_file(devices.join("cs_etm")).or_else(|_| std::fs::remove_dir_all(devices.join("cs_etm"))).unwrap();
    for e in std::fs::read_dir(&devices).unwrap().flatten() {
        let n = e.file_name().to_string_lossy().into_owned();
        if n.starts_with("armv8_") || n.starts_with("armv9_") {
            let p = e.path();
            std::fs::remove_file(&p).or_else(|_| std::fs::remove_dir_all(&p)).unwrap();
        }
    }
    for (pmu, name) in [("cpu_core", Some("alderlake_hybrid")), ("cpu_atom", None)] {
        let caps = devices.join(pmu).join("caps");
        std::fs::create_dir_all(&caps).unwrap();
        std::fs::write(caps.join("branches"), "32\n").unwrap();
        if let Some(n) = name {
            std::fs::write(caps.join("pmu_name"), n).unwrap();
        }
    }
    std::fs::write(root.join("proc/cpuinfo"), "processor\t: 0\nflags\t\t: fpu pdcm arch_lbr\n").unwrap();
    let (_, v) = doctor(root, true);
    assert_eq!(v["branch_unit"], serde_json::json!({"kind": "Intel Arch LBR, depth 32 (CPUID 0x1C)", "records": 32}));
    assert_eq!((v["run_event"].as_str(), v["run_branches"].as_str()), (Some("cycles"), Some("lbr")), "{v}");
    assert!(v["run_branches_reason"].as_str().unwrap().contains("Arch LBR"), "{v}");
    assert_eq!(v["branch_events"]["scope"], "PerThread");
    assert_eq!(v["branch_events"]["null_pmu_ctx_risk"], false, "no arm64 PMU in the tree");
    let (text, _) = doctor(root, false);
    assert!(text.lines().any(|l| l.starts_with("branch-record unit: Intel Arch LBR, depth 32")), "{text}");
    assert!(text.lines().any(|l| l.starts_with("branch events (--branch-events auto): per-thread")), "{text}");
}
