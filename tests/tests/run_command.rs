//! End-to-end: `etm-bpf run --headless -- CMD ARGS` starts the command itself (tests/workloads/
//! startup.c). Needs root (BPF + perf events); skips with a reason otherwise (fails under CI).
//!
//! Truth (from the workload's code): the main thread runs main->boot->boot_hot->spin for its
//! first BOOT_MS of CPU time, only at start-up, then main->steady->steady_hot->spin for
//! STEADY_MS, the same spin() loop on both paths; so the boot share of the spin samples is
//! BOOT_MS / (BOOT_MS + STEADY_MS), +- 4 binomial standard deviations + 0.03. Start-up is
//! only seen if the events were in place before the exec. The workload prints its real uid,
//! gid and groups (getuid/getgid/getgroups) and exits with the status it is given (or kills
//! itself with a signal); `id -G` gives the groups a user should have.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use etm_bpf_tests::{build_workload, containing, ending_with, etm_bpf_bin, parse_folded, wait_timeout};

/// `etm-bpf ARGS` with extra environment, stdin from /dev/null; its output after exit.
fn etm_bpf(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(etm_bpf_bin());
    cmd.args(args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    // Only the environment a test gives says whether etm-bpf runs "under sudo".
    cmd.env_remove("SUDO_UID").env_remove("SUDO_GID").env_remove("SUDO_USER");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("start etm-bpf");
    // Read the pipes while it runs (a full pipe must not block it).
    let out = child.stdout.take();
    let err = child.stderr.take();
    let out = std::thread::spawn(move || etm_bpf_tests::read_all(out));
    let err = std::thread::spawn(move || etm_bpf_tests::read_all(err));
    let status = wait_timeout(&mut child, Duration::from_secs(60));
    Output { status, stdout: out.join().unwrap().into_bytes(), stderr: err.join().unwrap().into_bytes() }
}

/// The workload, built into a directory every user may enter (for the runs as nobody).
fn workload(dir: &Path) -> Option<std::path::PathBuf> {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    build_workload("startup", dir)
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The start-up work shows with its known chain and share, the exit status is the command's,
/// the command's stdout is exactly its own line (etm-bpf's lines go to stderr).
#[test]
fn run_command_profiles_start_up_and_passes_exit_status() {
    if etm_bpf_tests::skip_unless_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let Some(exe) = workload(dir.path()) else { return };
    let dump = dir.path().join("dump");
    let (boot_ms, steady_ms) = (200.0, 600.0);
    let o = etm_bpf(
        &["run", "--headless", "--dump-dir", dump.to_str().unwrap(), "--", exe.to_str().unwrap(), "200", "600", "42"],
        &[],
    );
    let (stdout, stderr) = (text(&o.stdout), text(&o.stderr));
    assert_eq!(o.status.code(), Some(42), "exit status not passed through: {}\nstderr:\n{stderr}", o.status);
    assert_eq!(stdout, "startup uid=0 gid=0 groups=0 boot_ms=200 steady_ms=600\n".replace(" groups=0", &groups_of_root()));
    assert!(stderr.contains("stopped (target exited)"), "{stderr}");
    assert!(stderr.contains("exited with status 42"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");

    let folded = parse_folded(&std::fs::read_to_string(dump.join("profile.folded")).unwrap());
    let (boot, steady) = (containing(&folded, "boot_hot"), containing(&folded, "steady_hot"));
    eprintln!("boot {boot} steady {steady}\n{folded:#?}");
    for (f, chain) in
        [("boot_hot", ["main", "boot", "boot_hot", "spin"]), ("steady_hot", ["main", "steady", "steady_hot", "spin"])]
    {
        let full = ending_with(&folded, &chain);
        assert!(full * 100 >= containing(&folded, f) * 97, "{f}: only {full} of {} with the full chain", containing(&folded, f));
    }
    // 200 ms of CPU at 999 Hz is ~200 samples; a profiler attached after the exec sees few.
    assert!(boot >= 100, "start-up work missing: {boot} samples in boot_hot (expected ~200)");
    let n = (boot + steady) as f64;
    assert!(n >= 400.0, "too few samples: {n}");
    let want = boot_ms / (boot_ms + steady_ms);
    let share = boot as f64 / n;
    let tol = 4.0 * (want * (1.0 - want) / n).sqrt() + 0.03;
    assert!((share - want).abs() <= tol, "boot share {share:.3}, expected {want:.3} +- {tol:.3}");

    let m: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dump.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(m["command"][0], exe.to_str().unwrap());
    assert_eq!(m["final"], true);
    assert_eq!(m["samples"], folded.values().sum::<u64>());
}

/// ` groups=...` as the workload prints it when it inherits this process's supplementary
/// groups (the kernel's list in /proc/self/status).
fn groups_of_root() -> String {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let sup: Vec<&str> = status.lines().find_map(|l| l.strip_prefix("Groups:")).unwrap_or("").split_whitespace().collect();
    format!(" groups={}", sup.join(","))
}

/// A command killed by a signal: etm-bpf exits with 128 + the signal number.
#[test]
fn run_command_killed_by_signal_exits_128_plus_signal() {
    if etm_bpf_tests::skip_unless_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let Some(exe) = workload(dir.path()) else { return };
    let o = etm_bpf(&["run", "--headless", "--", exe.to_str().unwrap(), "20", "20", "-15"], &[]);
    assert_eq!(o.status.code(), Some(128 + 15), "stderr:\n{}", text(&o.stderr));
    assert!(text(&o.stderr).contains("killed by signal 15"), "{}", text(&o.stderr));
}

/// Under sudo (SUDO_UID/SUDO_GID of the invoking user in etm-bpf's environment) the command
/// runs as that user with that user's groups, not root's; --as-root keeps root.
#[test]
fn run_command_under_sudo_runs_as_the_invoking_user() {
    if etm_bpf_tests::skip_unless_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let Some(exe) = workload(dir.path()) else { return };
    let (uid, gid) = (65534, 65534);
    // The groups user 65534 has, from the system's own tool.
    let id = Command::new("id").args(["-G", &uid.to_string()]).output().expect("id -G 65534");
    assert!(id.status.success(), "id -G {uid}: {}", text(&id.stderr));
    let mut want: Vec<u32> = text(&id.stdout).split_whitespace().map(|g| g.parse().unwrap()).collect();
    want.sort_unstable();
    let env = [("SUDO_UID", "65534"), ("SUDO_GID", "65534"), ("SUDO_USER", "nobody")];
    let o = etm_bpf(&["run", "--headless", "--", exe.to_str().unwrap(), "20", "20", "0"], &env);
    let stdout = text(&o.stdout);
    assert!(o.status.success(), "{}\nstderr:\n{}", o.status, text(&o.stderr));
    let field = |name: &str| -> String {
        stdout
            .split_whitespace()
            .find_map(|w| w.strip_prefix(name))
            .unwrap_or_else(|| panic!("no {name} in {stdout:?}"))
            .to_owned()
    };
    assert_eq!(field("uid="), uid.to_string(), "{stdout}");
    assert_eq!(field("gid="), gid.to_string(), "{stdout}");
    let mut got: Vec<u32> = field("groups=").split(',').filter(|g| !g.is_empty()).map(|g| g.parse().unwrap()).collect();
    got.sort_unstable();
    assert_eq!(got, want, "supplementary groups of the command: {stdout}");
    assert!(!got.contains(&0), "root's group kept: {stdout}");

    let o = etm_bpf(&["run", "--headless", "--as-root", "--", exe.to_str().unwrap(), "20", "20", "0"], &env);
    assert!(o.status.success(), "{}\nstderr:\n{}", o.status, text(&o.stderr));
    assert!(text(&o.stdout).starts_with("startup uid=0 gid=0 "), "{}", text(&o.stdout));
}

/// A command that does not exist: one clear error line, failure, no panic, nothing left.
#[test]
fn run_command_not_found_is_a_sentence() {
    if etm_bpf_tests::skip_unless_root() {
        return;
    }
    let o = etm_bpf(&["run", "--headless", "--", "no-such-command-for-etm-bpf"], &[]);
    let err = text(&o.stderr);
    assert!(!o.status.success());
    assert_eq!(err.trim(), "etm-bpf: command not found: no-such-command-for-etm-bpf (not in PATH)");
}

/// --pid and a command together, or neither, are usage errors.
#[test]
fn pid_and_command_are_exclusive() {
    let o = etm_bpf(&["run", "--headless", "--pid", "1", "--", "true"], &[]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o.stderr));
    assert!(text(&o.stderr).contains("cannot be used with"), "{}", text(&o.stderr));
    let o = etm_bpf(&["run", "--headless"], &[]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o.stderr));
    assert!(text(&o.stderr).contains("--pid"), "{}", text(&o.stderr));
}

/// `--record` with a command records the start-up too: the replay of the session has the
/// boot path's samples (~200 in 200 ms of CPU at 999 Hz).
#[test]
fn run_command_record_replays_start_up() {
    if etm_bpf_tests::skip_unless_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let Some(exe) = workload(dir.path()) else { return };
    let (rec, dump) = (dir.path().join("rec"), dir.path().join("replayed"));
    let o = etm_bpf(
        &[
            "run",
            "--headless",
            "--branches",
            "none",
            "--record",
            rec.to_str().unwrap(),
            "--",
            exe.to_str().unwrap(),
            "200",
            "100",
            "0",
        ],
        &[],
    );
    assert!(o.status.success(), "{}\nstderr:\n{}", o.status, text(&o.stderr));
    let o = etm_bpf(&["replay", rec.to_str().unwrap(), "--headless", "--dump-dir", dump.to_str().unwrap()], &[]);
    assert!(o.status.success(), "replay: {}\nstderr:\n{}", o.status, text(&o.stderr));
    let folded = parse_folded(&std::fs::read_to_string(dump.join("profile.folded")).unwrap());
    let boot = ending_with(&folded, &["main", "boot", "boot_hot", "spin"]);
    assert!(boot >= 100, "start-up missing from the recording: {boot} boot samples\n{folded:#?}");
}
