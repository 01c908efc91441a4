//! `etm-bpf run` error cases: one clear line on stderr, a non-zero exit, no panic, no hang.

use std::process::{Command, Output, Stdio};
use std::time::Duration;

use etm_bpf_tests::{etm_bpf_bin, is_root, wait_timeout};

fn run(args: &[&str]) -> Output {
    let mut child = Command::new(etm_bpf_bin())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start etm-bpf");
    let st = wait_timeout(&mut child, Duration::from_secs(30));
    Output {
        status: st,
        stdout: etm_bpf_tests::read_all(child.stdout.take()).into_bytes(),
        stderr: etm_bpf_tests::read_all(child.stderr.take()).into_bytes(),
    }
}

/// One `etm-bpf:` error line (after any logged warnings), a failure status, no panic.
fn assert_clean_error(o: &Output, needle: &str) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "expected failure, got {}: {err}", o.status);
    assert!(err.contains(needle), "stderr lacks {needle:?}: {err}");
    assert!(!err.contains("panicked"), "panic: {err}");
    let lines: Vec<&str> = err.trim().lines().collect();
    assert!(lines.last().is_some_and(|l| l.starts_with("etm-bpf: ") && l.contains(needle)), "not one error line last: {err}");
    assert!(lines[..lines.len() - 1].iter().all(|l| l.starts_with("[WARN ")), "other lines than warnings: {err}");
}

/// Without --pid, clap reports the missing argument.
#[test]
fn missing_pid_is_a_usage_error() {
    let o = run(&["run", "--headless"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--pid"));
}

/// A pid that does not exist is reported as such.
#[test]
fn no_such_pid() {
    // Above the kernel's PID_MAX_LIMIT (4194304), so it can never exist.
    let o = run(&["run", "--pid", "999999999", "--headless", "--duration", "1"]);
    assert_clean_error(&o, "no such process: 999999999");
}

/// A dump dir below a regular file cannot be created.
#[test]
fn unwritable_dump_dir() {
    let pid = std::process::id().to_string();
    let o = run(&["run", "--pid", &pid, "--headless", "--dump-dir", "/proc/version/sub"]);
    assert_clean_error(&o, "cannot create dump dir /proc/version/sub");
}

/// Without a terminal the live view refuses to start and points to --headless.
#[test]
fn live_view_needs_a_terminal() {
    let pid = std::process::id().to_string();
    let o = run(&["run", "--pid", &pid]);
    assert_clean_error(&o, "--headless");
}

/// An unprivileged user is told which capabilities are needed.
#[test]
fn not_root_names_the_capabilities() {
    let pid = std::process::id().to_string();
    let bin = etm_bpf_bin();
    let o = if is_root() {
        // Drop to nobody, without capabilities, with setpriv(1).
        let probe = Command::new("setpriv").arg("--version").output();
        if probe.is_err() {
            etm_testutil::skip("running as root and setpriv(1) is not available to drop privileges");
            return;
        }
        let o = Command::new("setpriv")
            .args(["--reuid", "65534", "--regid", "65534", "--clear-groups", "--inh-caps=-all"])
            .arg(&bin)
            .args(["run", "--pid", &pid, "--headless", "--duration", "1"])
            .output()
            .expect("run setpriv");
        let err = String::from_utf8_lossy(&o.stderr);
        if err.contains("setpriv:") {
            etm_testutil::skip(format!("setpriv could not drop privileges or exec the binary: {err}"));
            return;
        }
        o
    } else {
        run(&["run", "--pid", &pid, "--headless", "--duration", "1"])
    };
    assert_clean_error(&o, "CAP_BPF");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("CAP_PERFMON") && err.contains("CAP_SYS_ADMIN"), "{err}");
}

/// Invalid numbers are rejected before anything is opened.
#[test]
fn invalid_frequency() {
    let pid = std::process::id().to_string();
    let o = run(&["run", "--pid", &pid, "--headless", "--freq", "0"]);
    assert_clean_error(&o, "--freq");
}

/// `--branches etm` without a cs_etm PMU fails with one line naming what is missing, both on
/// an empty sysfs tree (any machine) and on this machine's /sys when it has no CoreSight.
#[test]
fn branches_etm_without_cs_etm() {
    let pid = std::process::id().to_string();
    let empty = tempfile::tempdir().unwrap();
    let o = run(&[
        "run",
        "--pid",
        &pid,
        "--headless",
        "--duration",
        "1",
        "--branches",
        "etm",
        "--sysfs-root",
        empty.path().to_str().unwrap(),
    ]);
    assert_clean_error(&o, "--branches etm: no cs_etm PMU");
    if std::path::Path::new("/sys/bus/event_source/devices/cs_etm").exists() {
        etm_testutil::skip("real /sys part: this machine has a cs_etm PMU");
        return;
    }
    let o = run(&["run", "--pid", &pid, "--headless", "--duration", "1", "--branches", "etm"]);
    assert_clean_error(&o, "--branches etm: no cs_etm PMU (/sys/bus/event_source/devices/cs_etm is missing)");
}

/// ETM window options without `--branches etm` are a usage error, not silently ignored.
#[test]
fn window_needs_branches_etm() {
    let pid = std::process::id().to_string();
    let o = run(&["run", "--pid", &pid, "--headless", "--branches", "none", "--window", "free"]);
    assert_clean_error(&o, "--window applies to --branches etm only");
}

/// `--branches auto` picks ETM when a cs_etm PMU exists: with the Neoverse N1 fixture sysfs
/// and proc trees (a PMU type this kernel does not have), the run gets as far as opening the
/// cs_etm event and fails there with one line (needs root: BPF is loaded first). The N1 has no
/// FEAT_TRF (ts_source -1), so the plan traces the target per-thread (pid N, cpu -1) and warns
/// why.
#[test]
fn auto_picks_etm_when_cs_etm_exists() {
    if !is_root() {
        etm_testutil::skip("needs root (the eBPF program is loaded before the cs_etm events)");
        return;
    }
    let fixture = etm_bpf_tests::repo_root().join("userspace/perf/tests/fixtures/n1-etr");
    let pid = std::process::id().to_string();
    let o = run(&[
        "run",
        "--pid",
        &pid,
        "--headless",
        "--duration",
        "1",
        "--branches",
        "auto",
        "--sysfs-root",
        fixture.to_str().unwrap(),
        "--proc-root",
        fixture.join("proc").to_str().unwrap(),
    ]);
    assert_clean_error(
        &o,
        &format!("--branches etm: opening the cs_etm event group: perf_event_open(leader, pid {pid}, cpu -1)"),
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("ts_source is not 1"), "{err}");
    // The fixture's kernel config has CONFIG_PID_IN_CONTEXTIDR=y: no warning about it.
    assert!(!err.contains("PID_IN_CONTEXTIDR"), "{err}");
}

/// Several pids: one that does not exist is named; ETM windows and --record take one process.
#[test]
fn several_pids_errors() {
    let (me, parent) = (std::process::id().to_string(), std::os::unix::process::parent_id().to_string());
    let two = format!("{me},{parent}");
    let o = run(&["run", "--pid", &format!("{me},999999999"), "--headless", "--duration", "1"]);
    assert_clean_error(&o, "no such process: 999999999");
    let fixture = etm_bpf_tests::repo_root().join("userspace/perf/tests/fixtures/n1-etr");
    let o = run(&["run", "--pid", &two, "--headless", "--branches", "etm", "--sysfs-root", fixture.to_str().unwrap()]);
    assert_clean_error(&o, "--branches etm profiles one process");
    let rec = tempfile::tempdir().unwrap();
    let o = run(&["run", "--pid", &me, "--follow-children", "--headless", "--record", rec.path().to_str().unwrap()]);
    assert_clean_error(&o, "--record records one process");
    let o = run(&["run", "--pid", &two, "--headless", "--record", rec.path().to_str().unwrap()]);
    assert_clean_error(&o, "--record records one process");
}
