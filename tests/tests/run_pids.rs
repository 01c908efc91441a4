//! End-to-end: `etm-bpf run` on several processes (`--pid A,B`, `--merge`) and on the
//! processes a target forks (`--follow-children`). Needs root (BPF + perf events); skips with a
//! reason otherwise (fails under CI).
//!
//! Truth, from the workloads' code and from which process runs which workload:
//! * tests/workloads/chains.c runs main->a->hot1->spin and main->b->hot2->spin (the same spin
//!   loop) at random, 2 : 1: hot1 / (hot1 + hot2) = 2/3.
//! * tests/workloads/ab.c (UA=2, UB=1) runs unit() from fa, fb and fc, each call chosen to keep
//!   their shares of the thread's CPU clock at 2 : 1 : 1: fa / (fa + fb + fc) = 1/2. (Equal
//!   work is not equal time: with fa running two units per call it had 0.55-0.57 of the time,
//!   by rdtsc without any profiler, and perf and etm-bpf agreed on that within 0.005.)
//! * The two workloads share no function but main (and libc), so a profile of one process
//!   holding a frame of the other is a routing error.
//!
//! Tolerances: each ratio within 4 binomial standard deviations + 0.03 (ab's units are ~10 ms
//! long, so its samples come in runs). A profile is complete if it has at least 70% of the
//! samples the process's CPU time (from /proc/PID/stat, the kernel's accounting) gives at the
//! sampling frequency over the time the profiler was live, and at most 120% of them over the
//! whole run.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use etm_bpf_tests::{build_workload, containing, cpu_seconds, ending_with, etm_bpf_bin, parse_folded, spawn_ready, wait_timeout};

const FREQ: f64 = 999.0;

type Folded = BTreeMap<Vec<String>, u64>;

fn folded(dir: &Path) -> Folded {
    let path = dir.join("profile.folded");
    parse_folded(&std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
}

fn manifest(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("manifest.json")).unwrap()).unwrap()
}

fn pid_of(ready: &str) -> u32 {
    ready.trim().strip_prefix("ready ").and_then(|p| p.parse().ok()).unwrap_or_else(|| panic!("no ready line: {ready:?}"))
}

/// Asserts `part / whole` is `want` within 4 binomial standard deviations + 0.03.
fn assert_share(what: &str, part: u64, whole: u64, want: f64) {
    assert!(whole >= 150, "{what}: too few samples ({whole})");
    let n = whole as f64;
    let share = part as f64 / n;
    let tol = 4.0 * (want * (1.0 - want) / n).sqrt() + 0.03;
    assert!((share - want).abs() <= tol, "{what}: {share:.3}, expected {want:.3} +- {tol:.3} ({part} of {whole})");
}

/// chains' frames: its known ratio, its full chains, and none of ab's frames.
fn assert_chains_only(f: &Folded) {
    let (hot1, hot2) = (containing(f, "hot1"), containing(f, "hot2"));
    assert_share("chains hot1/(hot1+hot2)", hot1, hot1 + hot2, 2.0 / 3.0);
    assert!(ending_with(f, &["main", "a", "hot1", "spin"]) * 100 >= hot1 * 97, "hot1 without its full chain: {f:#?}");
    for other in ["fa", "fb", "fc", "unit"] {
        assert_eq!(containing(f, other), 0, "ab's {other} in chains' profile: {f:#?}");
    }
}

/// ab's frames: its known ratio, its full chains, and none of chains' frames.
fn assert_ab_only(f: &Folded) {
    let (fa, fb, fc) = (containing(f, "fa"), containing(f, "fb"), containing(f, "fc"));
    assert_share("ab fa/(fa+fb+fc)", fa, fa + fb + fc, 0.5);
    assert!(ending_with(f, &["main", "fa", "unit"]) * 100 >= fa * 97, "fa without its full chain: {f:#?}");
    for other in ["hot1", "hot2", "spin", "a", "b"] {
        assert_eq!(containing(f, other), 0, "chains' {other} in ab's profile: {f:#?}");
    }
}

/// Both workloads, built into `dir`.
fn workloads(dir: &Path) -> Option<(PathBuf, PathBuf)> {
    Some((build_workload("chains", dir)?, build_workload("ab", dir)?))
}

/// `etm-bpf run --headless ARGS` with piped output.
fn start(args: &[&str]) -> Child {
    Command::new(etm_bpf_bin())
        .arg("run")
        .arg("--headless")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start etm-bpf")
}

/// Waits for `run` (60 s at most): (exit status, stdout, stderr).
fn finish(mut run: Child) -> (std::process::ExitStatus, String, String) {
    let out = run.stdout.take();
    let err = run.stderr.take();
    let out = std::thread::spawn(move || etm_bpf_tests::read_all(out));
    let err = std::thread::spawn(move || etm_bpf_tests::read_all(err));
    let st = wait_timeout(&mut run, Duration::from_secs(60));
    (st, out.join().unwrap(), err.join().unwrap())
}

/// `--pid A,B`: pid-A/ holds only A's chains, pid-B/ only B's, each in its known ratio, each a
/// complete dump naming its process; `--pid A --pid B --merge`: one profile with both.
#[test]
fn several_pids_one_profile_each_or_merged() {
    if etm_bpf_tests::skip_unless_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let Some((chains, ab)) = workloads(dir.path()) else { return };
    let (_a, ready_a) = spawn_ready(&chains, &["60"]);
    let (_b, ready_b) = spawn_ready(&ab, &["60"]);
    let (a, b) = (pid_of(&ready_a), pid_of(&ready_b));

    let dump = dir.path().join("per-pid");
    let d = dump.to_str().unwrap();
    let (st, stdout, stderr) = finish(start(&["--pid", &format!("{a},{b}"), "--duration", "5", "--dump-dir", d]));
    assert!(st.success(), "etm-bpf failed: {st}\nstdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stdout.contains("2 of 2 running"), "{stdout}");
    let (fa, fb) = (folded(&dump.join(format!("pid-{a}"))), folded(&dump.join(format!("pid-{b}"))));
    eprintln!("pid {a}: {fa:#?}\npid {b}: {fb:#?}");
    assert_chains_only(&fa);
    assert_ab_only(&fb);
    assert!(!dump.join("profile.folded").exists(), "a profile outside the pid directories");
    for (pid, f, exe) in [(a, &fa, &chains), (b, &fb, &ab)] {
        let m = manifest(&dump.join(format!("pid-{pid}")));
        assert_eq!((m["pid"].as_u64(), m["final"].as_bool()), (Some(u64::from(pid)), Some(true)), "{m:#}");
        assert_eq!(m["command"][0], exe.to_str().unwrap());
        assert_eq!(m["samples"], f.values().sum::<u64>());
        assert_eq!(m["run"]["targets"], serde_json::json!([a, b]));
        for file in ["profile.pb.gz", "profile.svg"] {
            assert!(dump.join(format!("pid-{pid}")).join(file).exists(), "pid-{pid}/{file} missing");
        }
    }

    let merged = dir.path().join("merged");
    let (st, stdout, stderr) = finish(start(&[
        "--pid",
        &a.to_string(),
        "--pid",
        &b.to_string(),
        "--merge",
        "--duration",
        "5",
        "--dump-dir",
        merged.to_str().unwrap(),
    ]));
    assert!(st.success(), "etm-bpf --merge failed: {st}\nstdout:\n{stdout}\nstderr:\n{stderr}");
    let f = folded(&merged);
    eprintln!("merged: {f:#?}");
    let (hot1, hot2) = (containing(&f, "hot1"), containing(&f, "hot2"));
    let (fa_n, fb_n, fc_n) = (containing(&f, "fa"), containing(&f, "fb"), containing(&f, "fc"));
    assert_share("merged chains hot1/(hot1+hot2)", hot1, hot1 + hot2, 2.0 / 3.0);
    assert_share("merged ab fa/(fa+fb+fc)", fa_n, fa_n + fb_n + fc_n, 0.5);
    let m = manifest(&merged);
    assert_eq!(m["pids"], serde_json::json!([a, b]));
    assert_eq!(m["samples"], f.values().sum::<u64>());
    assert!(!merged.join(format!("pid-{a}")).exists());
}

/// One of two targets killed mid-run: the status line and the manifests say so, the run goes
/// on, the other's profile is complete (against its CPU time) with its known ratio; when the
/// second exits too the run stops by itself, long before --duration.
#[test]
fn a_vanished_pid_is_counted_and_the_other_goes_on() {
    if etm_bpf_tests::skip_unless_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let Some((chains, ab)) = workloads(dir.path()) else { return };
    let (mut wa, ready_a) = spawn_ready(&chains, &["60"]);
    let (mut wb, ready_b) = spawn_ready(&ab, &["60"]);
    let (a, b) = (pid_of(&ready_a), pid_of(&ready_b));
    let dump = dir.path().join("dump");
    let cpu_before = cpu_seconds(a).unwrap();
    let t0 = std::time::Instant::now();
    let mut run = start(&["--pid", &format!("{a},{b}"), "--duration", "40", "--dump-dir", dump.to_str().unwrap()]);
    let mut out = BufReader::new(run.stdout.take().unwrap());
    let mut lines = String::new();
    // The first status line: profiling is live.
    out.read_line(&mut lines).unwrap();
    let cpu_live = cpu_seconds(a).unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    wb.0.kill().unwrap();
    wb.0.wait().unwrap();
    // A few more seconds of A alone, then A goes too.
    std::thread::sleep(Duration::from_secs(3));
    let cpu_end = cpu_seconds(a).unwrap();
    wa.0.kill().unwrap();
    wa.0.wait().unwrap();
    out.read_to_string(&mut lines).unwrap();
    run.stdout = None;
    let (st, _, stderr) = finish(run);
    let elapsed = t0.elapsed();
    assert!(st.success(), "etm-bpf failed: {st}\nstdout:\n{lines}\nstderr:\n{stderr}");
    assert!(lines.contains(&format!("1 of 2 running, exited: {b}")), "{lines}");
    assert!(lines.contains("stopped (target exited)"), "{lines}");
    assert!(lines.contains(&format!("pid {b} exited during the run")), "{lines}");
    assert!(elapsed < Duration::from_secs(30), "did not stop when both targets were gone ({elapsed:?})");

    let fa = folded(&dump.join(format!("pid-{a}")));
    assert_chains_only(&fa);
    let n = fa.values().sum::<u64>() as f64;
    let (low, high) = (0.7 * FREQ * (cpu_end - cpu_live), 1.2 * FREQ * (cpu_end - cpu_before + 0.02));
    eprintln!("pid {a}: {n} samples, CPU {cpu_before:.2}/{cpu_live:.2}/{cpu_end:.2} s: [{low:.0}, {high:.0}]");
    assert!(n >= low && n <= high, "pid {a}: {n} samples, its CPU time gives [{low:.0}, {high:.0}]");
    let ma = manifest(&dump.join(format!("pid-{a}")));
    assert_eq!(ma["run"]["targets_exited"][0], b, "{ma:#}");
    assert_eq!(ma["final"], true);
    // B's profile stays, with what it got before it was killed.
    let fb = folded(&dump.join(format!("pid-{b}")));
    assert!(containing(&fb, "fa") > 0, "{fb:#?}");
    assert_eq!(manifest(&dump.join(format!("pid-{b}")))["processes"][0]["exited"], true);
}

/// `run --follow-children -- sh -c 'chains & ab; wait'`: both children's chains are in the
/// profile with their known ratios (their exec'd binaries symbolized), the manifest lists the
/// processes followed; without the flag none of the children's frames are there.
#[test]
fn follow_children_of_a_launched_command() {
    if etm_bpf_tests::skip_unless_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let Some((chains, ab)) = workloads(dir.path()) else { return };
    let script = format!("{} 3 >/dev/null & {} 3 >/dev/null; wait", chains.display(), ab.display());
    let run_with = |flag: Option<&str>, name: &str| {
        let dump = dir.path().join(name);
        let mut args = vec!["--dump-dir", dump.to_str().unwrap()];
        args.extend(flag);
        args.extend(["--", "sh", "-c", &script]);
        let (st, stdout, stderr) = finish(start(&args));
        assert!(st.success(), "etm-bpf {flag:?} failed: {st}\nstdout:\n{stdout}\nstderr:\n{stderr}");
        (folded(&dump), manifest(&dump))
    };
    let (f, m) = run_with(Some("--follow-children"), "follow");
    eprintln!("followed: {f:#?}\n{m:#}");
    let (hot1, hot2) = (containing(&f, "hot1"), containing(&f, "hot2"));
    let (fa, fb, fc) = (containing(&f, "fa"), containing(&f, "fb"), containing(&f, "fc"));
    assert_share("child chains hot1/(hot1+hot2)", hot1, hot1 + hot2, 2.0 / 3.0);
    assert_share("child ab fa/(fa+fb+fc)", fa, fa + fb + fc, 0.5);
    assert!(ending_with(&f, &["main", "a", "hot1", "spin"]) * 100 >= hot1 * 97, "{f:#?}");
    assert!(ending_with(&f, &["main", "fa", "unit"]) * 100 >= fa * 97, "{f:#?}");
    assert!(m["run"]["forks_followed_kernel"].as_u64().unwrap() >= 2, "{m:#}");
    assert!(m["processes"].as_array().unwrap().len() >= 3, "sh and its two children: {m:#}");
    assert_eq!(m["processes"][0]["target"], true);

    let (f, _) = run_with(None, "no-follow");
    eprintln!("not followed: {f:#?}");
    for frame in ["hot1", "hot2", "fa", "fb", "unit", "spin"] {
        assert_eq!(containing(&f, frame), 0, "a child's {frame} without --follow-children: {f:#?}");
    }
}

/// A shell that forks 300 short-lived processes, then chains: the kernel program followed
/// exactly the 301 forks the script makes (dash forks once per external command), none was
/// lost, the exited ones left the filter, and chains' profile holds its split.
#[test]
fn follow_children_through_many_short_processes() {
    if etm_bpf_tests::skip_unless_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let Some((chains, _)) = workloads(dir.path()) else { return };
    let dump = dir.path().join("dump");
    let script = format!(
        "i=0; while [ $i -lt 300 ]; do /bin/true; i=$((i+1)); done; {} 3 >/dev/null; echo done >/dev/null",
        chains.display()
    );
    let (st, stdout, stderr) =
        finish(start(&["--follow-children", "--dump-dir", dump.to_str().unwrap(), "--", "sh", "-c", &script]));
    assert!(st.success(), "etm-bpf failed: {st}\nstdout:\n{stdout}\nstderr:\n{stderr}");
    let m = manifest(&dump);
    assert_eq!(m["run"]["forks_followed_kernel"], 301, "{m:#}");
    assert_eq!(m["run"]["forks_lost_filter_full"], 0, "{m:#}");
    assert_eq!(m["run"]["filter_entries"], 0, "exited processes left in the filter: {m:#}");
    let f = folded(&dump);
    let (hot1, hot2) = (containing(&f, "hot1"), containing(&f, "hot2"));
    assert_share("chains after 300 forks hot1/(hot1+hot2)", hot1, hot1 + hot2, 2.0 / 3.0);
}

/// `--pid P --follow-children` on a running shell that starts a workload after profiling
/// began: the child's chains are in P's profile (the children of a process given by pid are
/// followed the same way).
#[test]
fn follow_children_of_a_running_pid() {
    if etm_bpf_tests::skip_unless_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let Some((chains, _)) = workloads(dir.path()) else { return };
    let mut sh = Command::new("sh")
        .arg("-c")
        // Not the last command, so the shell forks for it rather than exec'ing in place.
        .arg(format!("echo ready $$; read go; {} 3 >/dev/null; echo done >/dev/null", chains.display()))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut ready = String::new();
    BufReader::new(sh.stdout.as_mut().unwrap()).read_line(&mut ready).unwrap();
    let pid = pid_of(&ready);
    let dump = dir.path().join("dump");
    let mut run =
        start(&["--pid", &pid.to_string(), "--follow-children", "--duration", "30", "--dump-dir", dump.to_str().unwrap()]);
    let mut out = BufReader::new(run.stdout.take().unwrap());
    let mut first = String::new();
    out.read_line(&mut first).unwrap();
    // Profiling is live: let the shell start the workload.
    std::io::Write::write_all(sh.stdin.as_mut().unwrap(), b"go\n").unwrap();
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    run.stdout = None;
    let (st, _, stderr) = finish(run);
    let _ = sh.wait();
    assert!(st.success(), "etm-bpf failed: {st}\n{first}{rest}\nstderr:\n{stderr}");
    assert!(rest.contains("stopped (target exited)"), "{rest}");
    let f = folded(&dump);
    eprintln!("{f:#?}");
    assert_chains_only(&f);
    let m = manifest(&dump);
    assert!(m["processes"].as_array().unwrap().len() >= 2, "the shell and its child: {m:#}");
}
