//! End-to-end: `etm-bpf run` against perf on three different programs built the way users get
//! them (no frame pointers): a C++ thread pool (tests/workloads/pool.cpp, libstdc++ containers,
//! algorithms, std::function and lambdas) built by `g++ -O2` and by `clang++-22 -O2`, and the
//! system `/usr/bin/python3` running tests/workloads/hot.py; plus a frame-pointer build of
//! tests/workloads/chains.c against `perf record -g`. (The C no-frame-pointer build is in
//! run_unwind.rs, checked the same way.) Needs root; skips otherwise.
//!
//! Truth, for every program: the distribution of whole user-space calling contexts (physical
//! frames named as `perf script --no-inline` names them, see `etm_bpf_tests::peer`) from
//! `run --unwind dwarf` and `--unwind auto` equals that of `perf record --call-graph dwarf` on
//! the same process: the total-variation distance is at most twice what sampling alone gives
//! plus 0.05 (`peer::tv_bound`). And the workload's known ratio (from its code, or for Python
//! from its own CPU clock) holds in both profiles within 4 binomial standard deviations + 0.02.
//! Systematic naming differences are removed by `peer::normalize`, on both sides alike: perf
//! names addresses outside every symbol `[unknown]` where etm-bpf writes `[binary+0xOFFSET]`
//! (python3.11's static functions, libstdc++'s thread start routine), perf keeps symbol versions
//! (`cfree@GLIBC_2.2.5`), and the two demangle with and without parameter lists.

use std::path::Path;

use etm_bpf_tests::peer::{
    Contexts, containing, etm_bpf_contexts, largest_differences, normalize, perf_record, perf_script_contexts, total,
    total_variation, tv_bound,
};
use etm_bpf_tests::{build_with, run_pid_dump, skip_unless_root, spawn_ready};

/// 4 binomial standard deviations of a proportion `p` over `n` samples, plus 0.02.
fn tolerance(p: f64, n: f64) -> f64 {
    4.0 * (p * (1.0 - p) / n).sqrt() + 0.02
}

/// `part / (part + rest)` from the samples containing each frame, checked against `want`.
fn check_ratio(who: &str, m: &Contexts, part: &str, whole: &[&str], want: f64) {
    let p = containing(m, part) as f64;
    let n: f64 = whole.iter().map(|f| containing(m, f) as f64).sum();
    assert!(n >= 300.0, "{who}: only {n} samples in {whole:?}");
    let r = p / n;
    let tol = tolerance(want, n);
    eprintln!("{who}: {part} share {r:.3} of {n} (expected {want:.3} +- {tol:.3})");
    assert!((r - want).abs() <= tol, "{who}: {part} share {r:.3} of {n} samples, expected {want:.3} +- {tol:.3}");
}

/// Profiles the running workload `pid` with `run --unwind dwarf` and `--unwind auto` (3 s
/// each) and with `perf record --call-graph dwarf` (3 s); checks each of ours against perf's
/// contexts and `ratio(who, contexts)` on all three; and that `--unwind fp` does *not* match
/// perf (the workload has no frame pointers). Returns false if perf could not record.
fn against_perf_dwarf(pid: u32, dir: &Path, ratio: impl Fn(&str, &Contexts)) -> bool {
    let Some(data) = perf_record(pid, dir, "perf.data", &["--call-graph", "dwarf,16384"], 3) else { return false };
    let perf = perf_script_contexts(&data);
    eprintln!("perf: {} samples, {} contexts", total(&perf), perf.len());
    ratio("perf --call-graph dwarf", &perf);
    for mode in ["dwarf", "auto"] {
        let dump = dir.join(format!("dump-{mode}"));
        let m = run_pid_dump(pid, 3, &["--unwind", mode], &dump, || {});
        let ours = etm_bpf_contexts(&dump.join("profile.pb.gz"));
        eprintln!("--unwind {mode}: {} samples, {} contexts; unwind {}", total(&ours), ours.len(), m["counts"]["unwind"]);
        ratio(&format!("--unwind {mode}"), &ours);
        let (tv, bound) = (total_variation(&ours, &perf), tv_bound(&ours, &perf));
        eprintln!("--unwind {mode} against perf: TV {tv:.3} (bound {bound:.3})\n{}", largest_differences(&ours, &perf, 6));
        assert!(
            tv <= bound,
            "--unwind {mode}: total-variation distance to perf {tv:.3} > {bound:.3}; largest differences (ours - perf):\n{}",
            largest_differences(&ours, &perf, 10)
        );
        // The ring may overflow when the shared machine stalls the reader; a few are harmless.
        let dropped = m["dropped"].as_u64().unwrap_or(u64::MAX);
        assert!(dropped * 100 <= total(&ours), "{dropped} samples dropped: {}", m["counts"]);
    }
    // The comparison can fail: frame-pointer walks through this code are far from perf's.
    let dump = dir.join("dump-fp");
    run_pid_dump(pid, 3, &["--unwind", "fp"], &dump, || {});
    let fp = etm_bpf_contexts(&dump.join("profile.pb.gz"));
    let (tv, bound) = (total_variation(&fp, &perf), tv_bound(&fp, &perf));
    eprintln!("--unwind fp against perf --call-graph dwarf: TV {tv:.3} (bound {bound:.3})");
    assert!(tv > bound, "--unwind fp matches perf's DWARF stacks (TV {tv:.3}): the workload has frame pointers?");
    true
}

/// job_a runs crunch() twice as often as job_b (pool.cpp).
fn pool_ratio(who: &str, m: &Contexts) {
    check_ratio(who, m, "job_a", &["job_a", "job_b"], 2.0 / 3.0);
}

/// Fractions of the locations `names_equal_llvm_addr2line` lets differ from llvm-addr2line-22:
/// beyond the parameter lists, and in the parameter lists only.
struct NameBounds {
    names: f64,
    params: f64,
}

fn cpp_pool(cxx: &str, bounds: NameBounds) {
    if skip_unless_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let Some(exe) = build_with(cxx, "pool.cpp", &["-O2", "-g", "-pthread"], &[], dir.path(), &format!("pool-{cxx}")) else {
        return;
    };
    let (_w, ready) = spawn_ready(&exe, &["120", "2"]);
    let pid: u32 = ready.trim().strip_prefix("ready ").and_then(|p| p.parse().ok()).expect("ready PID");
    if against_perf_dwarf(pid, dir.path(), pool_ratio) {
        names_equal_llvm_addr2line(&dir.path().join("dump-dwarf/profile.pb.gz"), &exe, &bounds);
    }
}

/// Every location of `exe` in the profile (each sampled pc, each caller's call instruction)
/// outside the PLT (which llvm-addr2line names `_init`, etm-bpf and perf `name@plt`) has as
/// many frames as `llvm-addr2line-22 -f -C -i` prints for that address (the same inline
/// chain), and at least one lambda frame is among them; the names differ in at most
/// `bounds` of the locations. Measured on pool.cpp, three runs: by g++ in 0 of 137-157
/// locations beyond parameter lists and 18-24 in them only (LLVM prints the parameters of
/// `std::__introsort_loop<..., 'lambda'(auto const&, auto const&)>` and its kin as `auto`);
/// by clang++-22 in 9-12 of 146-155 (LLVM leaves `crunch(unsigned int)::$_0::operator()`
/// mangled) and 1-3 in parameter lists only. With the unpatched cpp_demangle (which lost
/// the parameters of constructor templates and the `&&` of forwarding-reference packs):
/// 39-51 and 26-33 in parameter lists only, 13 clang names; before etm-bpf spelled names as
/// LLVM does and named the real function after its ELF symbol: 19-29 and 12-20 beyond
/// parameter lists. See README "Limits".
fn names_equal_llvm_addr2line(pprof_gz: &Path, exe: &Path, bounds: &NameBounds) {
    let p = etm_bpf_tests::pprof_wire::read_pprof_gz(&std::fs::read(pprof_gz).unwrap()).unwrap();
    let exe_s = exe.to_str().unwrap();
    let locs: Vec<&(String, u64, Vec<String>)> = p.locations.iter().filter(|(f, ..)| f == exe_s).collect();
    assert!(locs.len() >= 10, "only {} locations in {exe_s}: {:?}", locs.len(), p.mapping_files);
    let input: String = locs.iter().map(|(_, a, _)| format!("{a:#x}\n")).collect();
    let mut child = std::process::Command::new("llvm-addr2line-22")
        .args(["-f", "-C", "-i", "--output-style=JSON", "-e"])
        .arg(exe)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("run llvm-addr2line-22 (scripts/setup.sh installs llvm-22)");
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), input.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let mut bad = Vec::new();
    let (mut names_differ, mut params_differ) = (0, 0);
    let mut lambdas = 0;
    let lines: Vec<&str> = std::str::from_utf8(&out.stdout).unwrap().lines().collect();
    assert_eq!(lines.len(), locs.len(), "one JSON line per address");
    for ((_, addr, ours), line) in locs.iter().zip(lines) {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let theirs: Vec<String> =
            v["Symbol"].as_array().unwrap().iter().map(|f| f["FunctionName"].as_str().unwrap_or("").to_string()).collect();
        lambdas += ours.iter().filter(|n| n.contains("'lambda") || n.contains("$_")).count();
        if ours.iter().any(|n| n.ends_with("@plt")) {
            continue;
        }
        if ours.len() != theirs.len() {
            bad.push(format!("{addr:#x}:\n  ours {ours:?}\n  llvm {theirs:?}"));
        }
        let short = |v: &[String]| -> Vec<String> { v.iter().map(|n| normalize(n)).collect() };
        if short(ours) != short(&theirs) {
            names_differ += 1;
        } else if *ours != theirs {
            params_differ += 1;
        }
    }
    eprintln!(
        "{}: {} locations, {} with another inline depth than llvm-addr2line-22, {names_differ} with other names, \
         {params_differ} with other parameter lists only, {lambdas} lambda frames",
        exe.display(),
        locs.len(),
        bad.len()
    );
    assert!(
        bad.is_empty(),
        "{} of {} locations with another inline chain than llvm-addr2line-22's:\n{}",
        bad.len(),
        locs.len(),
        bad[..bad.len().min(5)].join("\n")
    );
    assert!(lambdas > 0, "no lambda frame among the sampled addresses");
    let n = locs.len() as f64;
    assert!(
        names_differ as f64 <= bounds.names * n && params_differ as f64 <= bounds.params * n,
        "{names_differ} of {n} locations named otherwise than by llvm-addr2line-22 (at most {:.0} allowed), \
         {params_differ} in their parameter lists only (at most {:.0})",
        bounds.names * n,
        bounds.params * n
    );
}

#[test]
fn cpp_thread_pool_by_gcc_matches_perf_dwarf() {
    cpp_pool("g++", NameBounds { names: 0.04, params: 0.25 });
}

#[test]
fn cpp_thread_pool_by_clang_matches_perf_dwarf() {
    cpp_pool("clang++-22", NameBounds { names: 0.15, params: 0.05 });
}

/// The system python3: hot_crc gets 2/3 of the CPU time of the two hot functions by the
/// script's own thread CPU clock. Natively, hot_crc's samples are those in libz's crc32_z and
/// both functions' samples are under `_PyEval_EvalFrameDefault` (a few interpreter samples
/// between calls count against hot_crc, within the 0.02).
#[test]
fn system_python_native_stacks_match_perf_dwarf() {
    if skip_unless_root() {
        return;
    }
    let py = Path::new("/usr/bin/python3");
    if !py.exists() {
        etm_testutil::skip("no /usr/bin/python3 (scripts/setup.sh installs it)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let script = etm_bpf_tests::repo_root().join("tests/workloads/hot.py");
    let (_w, ready) = spawn_ready(py, &[script.to_str().unwrap(), "120"]);
    let pid: u32 = ready.trim().strip_prefix("ready ").and_then(|p| p.parse().ok()).expect("ready PID");
    against_perf_dwarf(pid, dir.path(), |who, m| check_ratio(who, m, "crc32_z", &["_PyEval_EvalFrameDefault"], 2.0 / 3.0));
}

/// A frame-pointer build (tests/workloads/chains.c, `-O1 -fno-omit-frame-pointer`, main thread
/// and the thread SIGUSR1 starts): `run --unwind fp` (the kernel's frame-pointer walk) against
/// `perf record -g` (the same walk by perf), the whole contexts and main->a->hot1 = 2/3 of the
/// main thread's hot1 + hot2.
#[test]
fn frame_pointer_workload_matches_perf_g() {
    if skip_unless_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let Some(exe) = etm_bpf_tests::build_workload("chains", dir.path()) else { return };
    let (_w, ready) = spawn_ready(&exe, &["120"]);
    let pid: u32 = ready.trim().strip_prefix("ready ").and_then(|p| p.parse().ok()).expect("ready PID");
    etm_bpf_tests::send_signal(pid, "USR1");
    let Some(data) = perf_record(pid, dir.path(), "perf.data", &["-g"], 3) else { return };
    let perf = perf_script_contexts(&data);
    let dump = dir.path().join("dump-fp");
    let m = run_pid_dump(pid, 3, &["--unwind", "fp"], &dump, || {});
    let ours = etm_bpf_contexts(&dump.join("profile.pb.gz"));
    for (who, c) in [("perf -g", &perf), ("--unwind fp", &ours)] {
        check_ratio(who, c, "hot1", &["hot1", "hot2"], 2.0 / 3.0);
        assert!(containing(c, "hot3") > 0, "{who}: the second thread is missing");
    }
    let (tv, bound) = (total_variation(&ours, &perf), tv_bound(&ours, &perf));
    eprintln!("--unwind fp against perf -g: TV {tv:.3} (bound {bound:.3})\n{}", largest_differences(&ours, &perf, 6));
    assert!(
        tv <= bound,
        "TV {tv:.3} > {bound:.3}; largest differences (ours - perf):\n{}",
        largest_differences(&ours, &perf, 10)
    );
    assert_eq!(m["dropped"], 0, "samples dropped: {}", m["counts"]);
}
