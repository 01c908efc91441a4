//! End-to-end: `etm-bpf run --unwind fp|dwarf|auto` on the chains workload built the way
//! distributions build code, `-O2 -fomit-frame-pointer` (tests/workloads/chains.c; tail calls
//! off so every caller stays on the stack, as in run_e2e). Needs root; skips otherwise.
//!
//! Truth (from the workload's code, as in run_e2e): main->a->hot1->spin runs twice as often
//! as main->b->hot2->spin; a thread started after profiling began runs worker->c->hot3->spin.
//! * `--unwind fp`: frame-pointer walks through code without frame pointers lose the callers:
//!   fewer than 10% of the samples in `spin` carry a full chain (this shows the test can fail).
//! * `--unwind dwarf` and `auto`: at least 90% of the samples in each hot path carry the full
//!   chain, and hot1 / (hot1 + hot2) = 0.667 within run_e2e's tolerance.
//! * Peer: `perf record --call-graph dwarf` on the same process gives the same proportion
//!   within the sum of both tolerances (skipped if perf cannot record).

use std::collections::BTreeMap;

use etm_bpf_tests::peer::{
    containing, ending_with, etm_bpf_contexts, largest_differences, perf_record, perf_script_contexts, total_variation, tv_bound,
};
use etm_bpf_tests::{build_with, build_workload_with, parse_folded, run_pid_dump, send_signal, spawn_ready};

const NO_FP: &[&str] = &["-O2", "-g", "-fomit-frame-pointer", "-fno-optimize-sibling-calls", "-pthread"];

/// run_e2e's tolerance for the 2:1 proportion over `n` samples.
fn tolerance(n: f64) -> f64 {
    4.0 * (2.0 / 9.0 / n).sqrt() + 0.02
}

/// `--stack-size` bounds what DWARF unwinding sees: on tests/workloads/deep.c (main, 61 `rec`
/// frames of more than 256 bytes each, spin: more than 15 KiB of stack) a 4 KiB copy cuts
/// every stack (counted as truncated, never reaching main), a 32 KiB copy unwinds all 63
/// frames to main.
#[test]
fn stack_size_bounds_the_unwind_and_truncation_is_counted() {
    if etm_bpf_tests::skip_unless_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let Some(exe) = build_workload_with("deep", dir.path(), NO_FP, "deep") else { return };
    let (_workload, ready) = spawn_ready(&exe, &["60"]);
    let pid: u32 = ready.trim().strip_prefix("ready ").and_then(|p| p.parse().ok()).expect("ready PID");
    let chain: Vec<&str> = std::iter::once("main").chain(std::iter::repeat_n("rec", 61)).chain(std::iter::once("spin")).collect();
    for (size, full_expected) in [("4096", false), ("32768", true)] {
        let (folded, m) = profile_with(pid, "dwarf", dir.path(), false, &["--stack-size", size]);
        let spin = containing(&folded, "spin");
        let full = ending_with(&folded, &chain);
        let with_main = containing(&folded, "main");
        let u = &m["counts"]["unwind"];
        eprintln!("--stack-size {size}: spin {spin}, full chain {full}, with main {with_main}, unwind {u}");
        assert!(spin >= 300, "too few samples: {spin}");
        let truncated = u["dwarf_truncated"].as_u64().unwrap();
        if full_expected {
            assert!(full * 10 >= spin * 9, "--stack-size {size}: only {full} of {spin} with the full chain");
            assert!(truncated * 10 <= spin, "--stack-size {size}: {truncated} truncated");
        } else {
            assert_eq!(with_main, 0, "--stack-size {size}: a 4 KiB copy cannot reach main");
            assert!(truncated * 10 >= spin * 9, "--stack-size {size}: only {truncated} of {spin} counted as truncated");
        }
        assert_eq!(u["dwarf_failed"], 0, "{u}");
    }
}

/// Profiles `pid` for 3 s with `--unwind mode` (SIGUSR1 to the workload after the first
/// line: a thread started while profiling); returns the folded profile and the manifest.
fn profile(pid: u32, mode: &str, dir: &std::path::Path, signal: bool) -> (BTreeMap<Vec<String>, u64>, serde_json::Value) {
    profile_with(pid, mode, dir, signal, &[])
}

fn profile_with(
    pid: u32,
    mode: &str,
    dir: &std::path::Path,
    signal: bool,
    extra: &[&str],
) -> (BTreeMap<Vec<String>, u64>, serde_json::Value) {
    let dump = dir.join(format!("dump-{mode}-{}", extra.join("")));
    let args: Vec<&str> = ["--unwind", mode].into_iter().chain(extra.iter().copied()).collect();
    let m = run_pid_dump(pid, 3, &args, &dump, || {
        if signal {
            send_signal(pid, "USR1");
        }
    });
    let folded = parse_folded(&std::fs::read_to_string(dump.join("profile.folded")).unwrap());
    (folded, m)
}

const CHAINS: [(&str, &[&str]); 3] = [
    ("hot1", &["main", "a", "hot1", "spin"]),
    ("hot2", &["main", "b", "hot2", "spin"]),
    ("hot3", &["worker", "c", "hot3", "spin"]),
];

#[test]
fn dwarf_unwinding_recovers_chains_without_frame_pointers() {
    if etm_bpf_tests::skip_unless_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let Some(exe) = build_workload_with("chains", dir.path(), NO_FP, "chains-nofp") else { return };
    let (_workload, ready) = spawn_ready(&exe, &["120"]);
    let pid: u32 = ready.trim().strip_prefix("ready ").and_then(|p| p.parse().ok()).expect("ready PID");

    // Frame pointers: the chains are broken.
    let (fp, _) = profile(pid, "fp", dir.path(), false);
    let spin = containing(&fp, "spin");
    let full: u64 = CHAINS[..2].iter().map(|(_, c)| ending_with(&fp, c)).sum();
    eprintln!("fp: spin {spin}, full chains {full}\n{fp:#?}");
    assert!(spin >= 300, "too few samples in spin: {spin}");
    assert!(full * 10 < spin, "--unwind fp: {full} of {spin} spin samples carry a full chain; the workload has frame pointers?");

    // DWARF (the main thread first, then the late thread joins during the run).
    for (mode, signal) in [("dwarf", true), ("auto", false)] {
        let (folded, m) = profile(pid, mode, dir.path(), signal);
        let total: u64 = folded.values().sum();
        eprintln!("{mode}: total {total}\n{folded:#?}\nunwind {}", m["counts"]["unwind"]);
        assert!(total >= 300, "too few samples: {total}");
        for (f, chain) in CHAINS {
            let n = containing(&folded, f);
            let full = ending_with(&folded, chain);
            eprintln!("{mode}: {f} {n}, full chain {full}");
            assert!(full * 10 >= n * 9, "--unwind {mode}: {f}: only {full} of {n} samples with the full chain");
        }
        let (hot1, hot2, hot3) = (containing(&folded, "hot1"), containing(&folded, "hot2"), containing(&folded, "hot3"));
        // Every sample in spin is one of the known chains, within 10%.
        let spin = containing(&folded, "spin");
        assert!((hot1 + hot2 + hot3) * 10 >= spin * 9, "--unwind {mode}: {spin} in spin, {} under hot1/2/3", hot1 + hot2 + hot3);
        let n = (hot1 + hot2) as f64;
        assert!(n >= 200.0, "too few main-thread samples: {n}");
        let ratio = hot1 as f64 / n;
        let tol = tolerance(n);
        assert!((ratio - 2.0 / 3.0).abs() <= tol, "--unwind {mode}: hot1/(hot1+hot2) = {ratio:.3}, expected 0.667 +- {tol:.3}");
        if signal {
            assert!(hot3 > 0, "the thread started while profiling was not sampled");
        }
        let u = &m["counts"]["unwind"];
        assert_eq!(u["enabled"], true);
        assert!(u["dwarf_stacks"].as_u64().unwrap() * 10 >= total * 9, "{u}");
        assert_eq!(m["dropped"], 0, "samples dropped: {}", m["counts"]);
    }

    // Peer: perf's own DWARF unwinding of the same process (the late thread runs in both).
    let Some(data) = perf_record(pid, dir.path(), "perf.data", &["--call-graph", "dwarf,16384"], 3) else { return };
    let perf = perf_script_contexts(&data);
    let (hot1, hot2) = (containing(&perf, "hot1"), containing(&perf, "hot2"));
    let full: u64 = CHAINS[..2].iter().map(|(_, c)| ending_with(&perf, c)).sum();
    eprintln!("perf --call-graph dwarf: hot1 {hot1} hot2 {hot2} full {full}");
    let n = (hot1 + hot2) as f64;
    assert!(n >= 200.0, "perf: too few main-thread samples: {n}");
    assert!(full as f64 >= 0.9 * n, "perf: only {full} of {n} with the full chain");
    let ratio = hot1 as f64 / n;
    assert!((ratio - 2.0 / 3.0).abs() <= tolerance(n), "perf: hot1/(hot1+hot2) = {ratio:.3}");
    let ours = etm_bpf_contexts(&dir.path().join("dump-auto-/profile.pb.gz"));
    let (tv, bound) = (total_variation(&ours, &perf), tv_bound(&ours, &perf));
    eprintln!("--unwind auto against perf --call-graph dwarf: TV {tv:.3} (bound {bound:.3})");
    assert!(tv <= bound, "TV {tv:.3} > {bound:.3}; largest differences (ours - perf):\n{}", largest_differences(&ours, &perf, 8));
}

/// `--unwind auto` decides per binary: tests/workloads/mixed.c is built with frame pointers
/// and calls into tests/workloads/mixedlib.c, a shared library built without (truth from the
/// code: main->fa->lib_work->lib_inner and main->fb->spin run the same loop, held at 1:1 of
/// its CPU time by tests/workloads/share.h).
/// * `--unwind fp` loses the library path's callers (fewer than 10% of lib_inner's samples
///   with the full chain: the check below can fail).
/// * `--unwind auto`: at least 90% of each path's samples carry the full chain, the split is
///   1:1 within 4 binomial deviations + 0.02, both kinds of binary are counted, and the
///   whole contexts equal `perf record --call-graph dwarf`'s within `peer::tv_bound`. That
///   includes the root frames below main: every stack here ends in the system libc
///   (`__libc_start_call_main`, `start_thread`), which on Debian 12 has no frame pointers, so
///   no frame-pointer stack may be taken as it is (`fp_stacks_trusted` = 0 unless that libc
///   keeps them); with the rule that allowed a last frame without frame pointers, spin's
///   stacks lacked `__libc_start_main_impl` and `_start` and this comparison failed (TV 0.52).
#[test]
fn auto_trusts_frame_pointers_only_through_binaries_that_keep_them() {
    if etm_bpf_tests::skip_unless_root() {
        return;
    }
    let Some(cc) = etm_bpf_tests::c_compiler() else {
        etm_testutil::skip("no C compiler");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let lib_flags = ["-O2", "-g", "-fomit-frame-pointer", "-fno-optimize-sibling-calls", "-fPIC", "-shared"];
    if build_with(cc, "mixedlib.c", &lib_flags, &[], dir.path(), "libmixed.so").is_none() {
        return;
    }
    let exe_flags = ["-O2", "-g", "-fno-omit-frame-pointer", "-mno-omit-leaf-frame-pointer", "-fno-optimize-sibling-calls"];
    let link = [format!("-L{d}"), "-lmixed".into(), format!("-Wl,-rpath,{d}")];
    let link: Vec<&str> = link.iter().map(String::as_str).collect();
    let Some(exe) = build_with(cc, "mixed.c", &exe_flags, &link, dir.path(), "mixed") else { return };
    let (_workload, ready) = spawn_ready(&exe, &["120"]);
    let pid: u32 = ready.trim().strip_prefix("ready ").and_then(|p| p.parse().ok()).expect("ready PID");
    const LIB: &[&str] = &["main", "fa", "lib_work", "lib_inner"];
    const EXE: &[&str] = &["main", "fb", "spin"];

    let (fp, _) = profile(pid, "fp", dir.path(), false);
    let lib_n = containing(&fp, "lib_inner");
    eprintln!("fp: lib_inner {lib_n}, full chain {}", ending_with(&fp, LIB));
    assert!(lib_n >= 200, "too few samples in lib_inner: {lib_n}");
    assert!(ending_with(&fp, LIB) * 10 < lib_n, "--unwind fp: the library's chain is whole; it has frame pointers?");

    let (auto, m) = profile(pid, "auto", dir.path(), false);
    let total: u64 = auto.values().sum();
    let (lib_n, exe_n) = (containing(&auto, "lib_inner"), containing(&auto, "spin"));
    let u = &m["counts"]["unwind"];
    eprintln!("auto: total {total}, lib_inner {lib_n}, spin {exe_n}, unwind {u}\n{auto:#?}");
    for (chain, n) in [(LIB, lib_n), (EXE, exe_n)] {
        let full = ending_with(&auto, chain);
        assert!(full * 10 >= n * 9, "--unwind auto: only {full} of {n} samples with the full chain {chain:?}");
    }
    let n = (lib_n + exe_n) as f64;
    assert!(n >= 400.0, "too few samples: {n}");
    let share = lib_n as f64 / n;
    let tol = 4.0 * (0.25 / n).sqrt() + 0.02;
    assert!((share - 0.5).abs() <= tol, "lib_inner's share {share:.3}, expected 0.5 +- {tol:.3}");
    let trusted = u["fp_stacks_trusted"].as_u64().unwrap();
    assert!(
        trusted <= total - lib_n,
        "{trusted} frame-pointer stacks taken, more than the {} samples outside lib_inner",
        total - lib_n
    );
    if u["binaries_with_frame_pointers"].as_u64().unwrap() < 2 {
        assert_eq!(trusted, 0, "frame-pointer stacks taken though the libc has no frame pointers: {u}");
    }
    assert!(u["dwarf_stacks"].as_u64().unwrap() * 10 >= (total - trusted) * 9, "{u}");
    assert!(u["binaries_with_frame_pointers"].as_u64().unwrap() >= 1, "{u}");
    assert!(u["binaries_without_frame_pointers"].as_u64().unwrap() >= 1, "{u}");

    let Some(data) = perf_record(pid, dir.path(), "perf-mixed.data", &["--call-graph", "dwarf,16384"], 3) else { return };
    let perf = perf_script_contexts(&data);
    let ours = etm_bpf_contexts(&dir.path().join("dump-auto-/profile.pb.gz"));
    let (tv, bound) = (total_variation(&ours, &perf), tv_bound(&ours, &perf));
    eprintln!("--unwind auto against perf --call-graph dwarf: TV {tv:.3} (bound {bound:.3})");
    assert!(tv <= bound, "TV {tv:.3} > {bound:.3}; largest differences (ours - perf):\n{}", largest_differences(&ours, &perf, 8));
}
