//! The arm64 lab suite: cross builds the product and its kernel-facing test binaries, boots
//! Debian's arm64 kernel under `qemu-system-aarch64 -M virt -cpu max` (emulated PMUv3,
//! `-icount`), runs inside it
//!
//! * `etm-bpf doctor` (text and JSON): no cs_etm, and what `run` uses instead;
//! * the `etm-live` library tests (group open order, the data ring and clock on this kernel);
//! * the live tests of the binary (`live::`), with the ETM stand-in groups on **hardware
//!   cycles** (`ETM_BPF_STANDIN=hw`): resume/pause events at staggered periods with the
//!   window programs, CALLCHAIN, throttling at a high rate, switch records;
//! * `etm-bpf run --pid` on the `contexts` workload (frame pointers), whose calling contexts
//!   and shares are checked against the exact path of the same program under qemu-user
//!   (`crate::truth`); and on the same program built without frame pointers, with
//!   `--unwind dwarf` and `auto`, against that build's exact path;
//!
//! and checks what came back. Under `-icount shift=0` the guest executes one instruction per
//! ns of its clock and the emulated cycle counter runs at 1 GHz of that clock, so sampling on
//! cycles is sampling on instructions: the sampled shares are binomial draws from the exact
//! instruction shares, and the tolerance is stated from that.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

use crate::host::{self, Initramfs, KernelPin, MachineConfig, Results};
use crate::proto::Step;
use crate::truth;

/// The Rust target of the guest.
pub const TARGET: &str = "aarch64-unknown-linux-gnu";
/// The cross toolchain's sysroot (Debian's `libc6-arm64-cross`).
pub const SYSROOT: &str = "/usr/aarch64-linux-gnu";
/// Iterations of the workload in the guest (about 3e9 instructions: 3 s of guest time).
const WORKLOAD_ITERS: u64 = 60_000;
/// Iterations for its exact profile under qemu-user (the shares are the same for any count:
/// `lab/tests/truth.rs`).
const TRUTH_ITERS: u64 = 400;
/// Sampling frequency of the guest run (Hz).
const FREQ: u64 = 1_000;

/// Options of a lab run.
#[derive(Debug, Clone)]
pub struct Options {
    /// Repository root.
    pub root: PathBuf,
    /// Package cache (kept between runs).
    pub cache: PathBuf,
    /// Work and result directory.
    pub out: PathBuf,
    /// The kernel to boot.
    pub kernel: KernelPin,
    pub machine: MachineConfig,
}

/// What the run found.
#[derive(Debug, Default)]
pub struct Report {
    /// Lines for the log (what ran, on what, with which figures).
    pub lines: Vec<String>,
    /// Failed checks.
    pub failures: Vec<String>,
}

impl Report {
    fn check(&mut self, ok: bool, what: impl Into<String>) {
        let what = what.into();
        self.lines.push(format!("{} {what}", if ok { "ok  " } else { "FAIL" }));
        if !ok {
            self.failures.push(what);
        }
    }
    fn info(&mut self, what: impl Into<String>) {
        self.lines.push(format!("     {}", what.into()));
    }
}

struct Artifacts {
    etm_bpf: PathBuf,
    init: PathBuf,
    bpf_unit: PathBuf,
    live_unit: PathBuf,
}

fn cargo() -> Command {
    Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}

/// Cross builds the binary, the guest init and the two test binaries.
fn cross_build(root: &Path) -> anyhow::Result<Artifacts> {
    let st = cargo()
        .current_dir(root)
        .args(["build", "--release", "--locked", "--target", TARGET, "-p", "etm-bpf", "--bin", "etm-bpf"])
        .args(["-p", "etm-lab", "--bin", "etm-lab-init"])
        .status()
        .context("cargo build")?;
    if !st.success() {
        bail!("cross build for {TARGET} failed");
    }
    let out = cargo()
        .current_dir(root)
        .args(["test", "--release", "--locked", "--target", TARGET, "--no-run", "--message-format=json"])
        .args(["-p", "etm-bpf", "--bin", "etm-bpf", "-p", "etm-live", "--lib"])
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("cargo test --no-run")?;
    if !out.status.success() {
        bail!("cross build of the test binaries for {TARGET} failed");
    }
    let (mut bpf_unit, mut live_unit) = (None, None);
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else { continue };
        let (Some(exe), Some(name)) = (v["executable"].as_str(), v["target"]["name"].as_str()) else { continue };
        if v["profile"]["test"] != true {
            continue;
        }
        match name {
            "etm-bpf" => bpf_unit = Some(PathBuf::from(exe)),
            "etm_live" => live_unit = Some(PathBuf::from(exe)),
            _ => {}
        }
    }
    let dir = root.join("target").join(TARGET).join("release");
    Ok(Artifacts {
        etm_bpf: dir.join("etm-bpf"),
        init: dir.join("etm-lab-init"),
        bpf_unit: bpf_unit.context("no test executable for the etm-bpf binary")?,
        live_unit: live_unit.context("no test executable for etm-live")?,
    })
}

/// Strips a guest binary into `dir` (the initramfs stays small; symbols of the workload are
/// kept: `run` symbolizes it).
fn strip(src: &Path, dir: &Path) -> anyhow::Result<PathBuf> {
    let dst = dir.join(src.file_name().context("a file name")?);
    let st = Command::new("aarch64-linux-gnu-strip").arg("-o").arg(&dst).arg(src).status().context("aarch64-linux-gnu-strip")?;
    if !st.success() {
        bail!("strip {} failed", src.display());
    }
    Ok(dst)
}

fn step(name: &str, argv: &[&str]) -> Step {
    Step { name: name.into(), argv: argv.iter().map(|s| s.to_string()).collect(), timeout_s: 120, ..Default::default() }
}

/// `etm-bpf run --pid {pid:WORKLOAD} --headless` for the workload's whole run at [`FREQ`],
/// with `extra` options, dumping into `out` (whose folded profile and manifest come back).
fn profile_step(name: &str, workload: &str, out: &str, extra: &[&str]) -> Step {
    let (pid, freq) = (format!("{{pid:{workload}}}"), FREQ.to_string());
    let mut argv = vec!["/lab/bin/etm-bpf", "run", "--pid", &pid, "--headless", "--duration", "600", "--freq", &freq];
    argv.extend_from_slice(extra);
    argv.extend_from_slice(&["--dump-dir", out]);
    Step { timeout_s: 900, files: vec![format!("{out}/profile.folded"), format!("{out}/manifest.json")], ..step(name, &argv) }
}

/// Tests that passed (`test NAME ... ok`) in a libtest output.
fn passed_tests(out: &str) -> Vec<String> {
    out.lines().filter_map(|l| l.strip_prefix("test ")?.strip_suffix(" ... ok").map(String::from)).collect()
}

/// Runs the suite (module docs).
pub fn run(o: &Options) -> anyhow::Result<Report> {
    let mut rep = Report::default();
    std::fs::create_dir_all(&o.out).with_context(|| format!("create {}", o.out.display()))?;
    let qemu = host::emulator_available(&o.machine.qemu).map_err(anyhow::Error::msg)?;
    let art = cross_build(&o.root)?;
    let work = o.out.join("work");
    std::fs::create_dir_all(&work)?;
    let kernel = host::fetch_kernel(o.kernel, &o.cache)?;

    // The workload and its exact profile.
    let prog = etm_synth::testprogs::PROGRAMS.iter().find(|p| p.name == "contexts").expect("the contexts program");
    let workload = etm_synth::testprogs::build(prog, etm_synth::testprogs::Compiler::Gcc, &work)
        .map_err(|e| anyhow::anyhow!("building the workload: {e}"))?;
    let truth_counts = truth::program_counts(&workload, &[TRUTH_ITERS.to_string()], "main", 100_000_000)?;
    let truth = truth::shares(&truth_counts);
    // The same program without frame pointers, for `run --unwind dwarf`, and its own exact profile.
    let nofp =
        etm_synth::testprogs::build_with(prog, etm_synth::testprogs::Compiler::Gcc, &work, &["-fomit-frame-pointer"], "-nofp")
            .map_err(|e| anyhow::anyhow!("building the workload without frame pointers: {e}"))?;
    let truth_nofp = truth::shares(&truth::program_counts(&nofp, &[TRUTH_ITERS.to_string()], "main", 100_000_000)?);

    // chains.c without frame pointers, for the ETM stand-in's pause stack copies (its known
    // 2:1 call split is the truth: `live::etm::standin::pause_stack_copies_...`).
    let chains = work.join("chains-nofp");
    let built = std::process::Command::new("aarch64-linux-gnu-gcc")
        .args(["-O2", "-g", "-static", "-fomit-frame-pointer", "-fno-optimize-sibling-calls", "-pthread", "-o"])
        .arg(&chains)
        .arg(o.root.join("tests/workloads/chains.c"))
        .status()
        .map_err(|e| anyhow::anyhow!("aarch64-linux-gnu-gcc: {e}"))?;
    anyhow::ensure!(built.success(), "building chains.c without frame pointers for arm64 failed");

    // The initramfs.
    let mut img = Initramfs::default();
    for d in ["/proc", "/sys", "/dev", "/tmp", "/boot"] {
        img.dir(d);
    }
    img.copy("/init", &strip(&art.init, &work)?)?;
    for lib in ["ld-linux-aarch64.so.1", "libc.so.6", "libm.so.6", "libgcc_s.so.1"] {
        img.copy(&format!("/lib/{lib}"), &Path::new(SYSROOT).join("lib").join(lib))?;
    }
    img.copy("/lab/bin/etm-bpf", &strip(&art.etm_bpf, &work)?)?;
    img.copy("/lab/bin/etm-bpf-unit", &strip(&art.bpf_unit, &work)?)?;
    img.copy("/lab/bin/etm-live-unit", &strip(&art.live_unit, &work)?)?;
    img.copy("/lab/progs/contexts", &workload)?;
    img.copy("/lab/progs/contexts-nofp", &nofp)?;
    img.copy("/lab/progs/chains-nofp", &chains)?;
    // The unit tests find their fixtures at the path compiled into them.
    let fixtures = o.root.join("userspace/perf/tests/fixtures");
    img.copy_tree(&fixtures.to_string_lossy(), &fixtures)?;
    img.copy(&format!("/boot/config-{}", o.kernel.release), &kernel.config)?;
    let ci = ("CI".to_string(), "true".to_string());
    let mut steps = vec![
        step("doctor", &["/lab/bin/etm-bpf", "doctor"]),
        step("doctor-json", &["/lab/bin/etm-bpf", "doctor", "--json"]),
        Step { env: vec![ci.clone()], timeout_s: 600, ..step("live-unit", &["/lab/bin/etm-live-unit", "--test-threads=1"]) },
        Step {
            env: vec![
                ci.clone(),
                ("ETM_BPF_STANDIN".into(), "hw".into()),
                ("ETM_BPF_CHAINS_NOFP".into(), "/lab/progs/chains-nofp".into()),
            ],
            timeout_s: 900,
            ..step("bpf-unit", &["/lab/bin/etm-bpf-unit", "--test-threads=1", "live::"])
        },
        Step { spawn: true, ..step("workload", &["/lab/progs/contexts", &WORKLOAD_ITERS.to_string(), "3000"]) },
    ];
    steps.push(profile_step("run", "workload", "/tmp/out", &[]));
    // The first run's interrupts made the kernel lower perf_event_max_sample_rate below
    // --freq (the next open failed with EINVAL): back to the default first.
    steps.push(step("rate", &["/init", "write", "/proc/sys/kernel/perf_event_max_sample_rate", "100000"]));
    steps.push(Step { spawn: true, ..step("workload-nofp", &["/lab/progs/contexts-nofp", &WORKLOAD_ITERS.to_string(), "3000"]) });
    steps.push(profile_step("run-nofp", "workload-nofp", "/tmp/out-nofp", &["--unwind", "dwarf"]));
    // `--unwind auto` on the same build: its own code has no frame records but the static
    // libc's functions have (a binary judged as a whole would count as having frame pointers).
    steps.push(step("rate-auto", &["/init", "write", "/proc/sys/kernel/perf_event_max_sample_rate", "100000"]));
    steps.push(Step {
        spawn: true,
        ..step("workload-nofp-auto", &["/lab/progs/contexts-nofp", &WORKLOAD_ITERS.to_string(), "3000"])
    });
    steps.push(profile_step("run-nofp-auto", "workload-nofp-auto", "/tmp/out-auto", &[]));
    img.file("/lab/steps.json", serde_json::to_string_pretty(&steps)?.as_bytes(), false);
    let initrd = o.out.join("initrd.gz");
    std::fs::write(&initrd, img.finish())?;

    let log = o.out.join("console.log");
    let r = host::boot(&o.machine, &kernel.image, &initrd, &log)?;
    check_results(&mut rep, o, &qemu, &r, &truth, &truth_nofp);
    let _ = std::fs::write(o.out.join("report.txt"), rep.lines.join("\n") + "\n");
    Ok(rep)
}

fn check_results(
    rep: &mut Report,
    o: &Options,
    qemu: &str,
    r: &Results,
    truth: &BTreeMap<String, f64>,
    truth_nofp: &BTreeMap<String, f64>,
) {
    let boot = r.boot.clone().unwrap_or_default();
    rep.info(format!(
        "guest: Linux {} (Debian linux-binary {} {}), {qemu}, {} {} -smp {} -m {}M{}, {} s wall",
        boot.release,
        o.kernel.version,
        o.kernel.arch,
        o.machine.qemu,
        o.machine.machine.join(" "),
        o.machine.smp,
        o.machine.mem_mb,
        if o.machine.icount { " -icount shift=0" } else { "" },
        r.wall.as_secs()
    ));
    rep.check(boot.release == o.kernel.release, format!("guest kernel is {} (booted: {:?})", o.kernel.release, boot.release));
    rep.check(boot.machine == "aarch64", format!("guest machine aarch64 ({})", boot.machine));
    let pmu = boot.pmus.iter().find(|p| p.starts_with("armv8_pmuv3")).cloned();
    rep.check(pmu.is_some(), format!("guest PMU {} ({})", pmu.as_deref().unwrap_or("none"), boot.pmus.join(",")));
    rep.check(boot.btf, "guest has /sys/kernel/btf/vmlinux");
    rep.check(r.done, "guest ran every step and powered off");
    rep.check(r.corrupt.is_empty(), format!("console transfers intact ({:?})", r.corrupt));
    let get = |n: &str| r.steps.get(n).cloned().unwrap_or_default();

    // doctor
    let d = get("doctor");
    let text = d.text("stdout");
    rep.check(d.rc == "0" && text.contains("no cs_etm PMU"), format!("doctor: says there is no cs_etm (rc {})", d.rc));
    let dj = get("doctor-json");
    match serde_json::from_str::<serde_json::Value>(&dj.text("stdout")) {
        Ok(v) => {
            rep.check(
                v["cs_etm"] == false && v["kernel"] == boot.release.as_str(),
                format!("doctor --json: cs_etm {} kernel {}", v["cs_etm"], v["kernel"]),
            );
            rep.check(
                v["run_event"] == "cycles" && v["run_branches"] == "none",
                format!("doctor --json: run would sample {} with branches {}", v["run_event"], v["run_branches"]),
            );
        }
        Err(e) => rep.check(false, format!("doctor --json parses ({e}; rc {})", dj.rc)),
    }

    // The kernel-facing unit tests.
    for (name, must) in [
        (
            "live-unit",
            &[
                "group::kernel_tests::set_output_needs_the_leader_mapped",
                "group::kernel_tests::open_sequence_with_software_events",
                "sys::tests::live_kernel_data_ring",
                "sys::tests::live_kernel_rejects_misplaced_aux_action",
                "sys::tests::live_kernel_hw_cycles_overflow_at_their_period",
            ][..],
        ),
        (
            "bpf-unit",
            &[
                "live::etm::standin::windows_are_gated_and_stamped_in_the_perf_clock",
                "live::etm::standin::callchain_on_the_pause_event_puts_a_marker_first",
                "live::etm::standin::group_throttling_shows_in_the_ring",
                "live::etm::standin::cpu_wide_groups_see_other_processes",
                "live::etm::standin::pause_stack_copies_unwind_a_program_without_frame_pointers",
            ][..],
        ),
    ] {
        let s = get(name);
        let out = s.text("stdout");
        let passed = passed_tests(&out);
        let summary = out.lines().find(|l| l.starts_with("test result:")).unwrap_or("no test result line").to_string();
        rep.check(s.rc == "0", format!("{name}: {summary} ({:.0} s guest)", s.secs));
        for m in must {
            rep.check(passed.iter().any(|p| p == m), format!("{name}: {m}"));
        }
        if s.rc != "0" {
            let fails: Vec<&str> = out.lines().filter(|l| l.ends_with("FAILED")).collect();
            rep.info(format!("{name} failures: {fails:?}"));
            let _ = std::fs::write(o.out.join(format!("{name}.stdout")), &out);
        }
    }

    // run --pid on the workload, with frame pointers (auto) and without (--unwind dwarf).
    for (name, workload, file, truth) in [
        ("run", "workload", "/tmp/out", truth),
        ("run-nofp", "workload-nofp", "/tmp/out-nofp", truth_nofp),
        ("run-nofp-auto", "workload-nofp-auto", "/tmp/out-auto", truth_nofp),
    ] {
        check_run(rep, &get(name), &get(workload), name, file, truth);
    }
}

/// The checks of one `run --pid` step: the contexts of `DIR/profile.folded` against `truth`.
fn check_run(
    rep: &mut Report,
    run: &host::StepResult,
    wl: &host::StepResult,
    name: &str,
    dir: &str,
    truth: &BTreeMap<String, f64>,
) {
    rep.check(run.rc == "0", format!("{name} --pid: rc {} ({:.1} s guest); workload rc {}", run.rc, run.secs, wl.rc));
    if run.rc != "0" {
        rep.info(format!("{name} stderr: {}", run.text("stderr").lines().rev().take(5).collect::<Vec<_>>().join(" | ")));
    }
    let manifest: serde_json::Value = serde_json::from_str(&run.text(&format!("{dir}/manifest.json"))).unwrap_or_default();
    let event = manifest["event"].as_str().unwrap_or("?").to_string();
    rep.check(event == "cycles", format!("{name} sampled on {event} (the emulated PMU's cycles)"));
    let u = &manifest["counts"]["unwind"];
    rep.info(format!("{name}: counts.unwind {u}"));
    let folded = run.text(&format!("{dir}/profile.folded"));
    let counts = truth::folded_counts(&folded, "main");
    let n: u64 = counts.iter().filter(|(k, _)| *k != "(other)").map(|(_, v)| v).sum();
    let other = counts.get("(other)").copied().unwrap_or(0);
    let obs = truth::shares(&counts);
    rep.check(n >= 800, format!("{name}: {n} samples in the workload's contexts ({other} elsewhere)"));
    if name.starts_with("run-nofp") {
        let dwarf = u["dwarf_stacks"].as_u64().unwrap_or(0);
        rep.check(dwarf * 10 >= (n + other) * 9, format!("{name}: {dwarf} of {} stacks DWARF-unwound", n + other));
    }
    for (ctx, &p) in truth.iter().filter(|(_, p)| **p >= 0.02) {
        let q = obs.get(ctx).copied().unwrap_or(0.0);
        // Binomial: 4 standard deviations of a share from n samples, plus 1.5 points for what
        // is not a draw from the instruction shares (freq-mode period changes, the skid of
        // the emulated overflow to the end of a translation block).
        let tol = 4.0 * (p * (1.0 - p) / n.max(1) as f64).sqrt() + 0.015;
        rep.check((q - p).abs() <= tol, format!("{name}: context {ctx}: sampled {:.3}, exact {p:.3} (tolerance {tol:.3})", q));
    }
    for (ctx, &q) in obs.iter().filter(|(k, _)| !truth.contains_key(*k)) {
        rep.check(q < 0.01, format!("{name}: context {ctx} is not in the exact path but has {q:.3} of the samples"));
    }
}
