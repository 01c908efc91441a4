//! Support code for the end-to-end tests: locating (or building) the etm-bpf binary, building
//! the C workloads, privilege checks, and readers for the profile files that are independent
//! of the writers under test (a folded-stack parser and a minimal protobuf wire-format decoder
//! for `profile.proto`, with field numbers taken from github.com/google/pprof).

pub mod peer;
pub mod pprof_wire;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ has a parent").to_path_buf()
}

/// The etm-bpf binary: `ETM_BPF_BIN`, else `target/<profile>/etm-bpf` next to the running
/// test, built with cargo (same profile and target dir) if it is not there yet.
pub fn etm_bpf_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Some(p) = std::env::var_os("ETM_BPF_BIN") {
            return PathBuf::from(p);
        }
        let exe = std::env::current_exe().expect("current_exe");
        let profile_dir = exe.parent().and_then(Path::parent).expect("target/<profile>/deps");
        let bin = profile_dir.join("etm-bpf");
        if !bin.is_file() {
            let release = profile_dir.file_name().is_some_and(|n| n == "release");
            let target_dir = profile_dir.parent().expect("target dir");
            let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
            let mut cmd = Command::new(cargo);
            cmd.current_dir(repo_root()).args(["build", "-p", "etm-bpf"]).env("CARGO_TARGET_DIR", target_dir);
            if release {
                cmd.arg("--release");
            }
            let st = cmd.status().expect("run cargo build -p etm-bpf");
            assert!(st.success(), "cargo build -p etm-bpf failed");
        }
        bin
    })
    .clone()
}

/// True if this process runs with effective uid 0.
/// True (after printing the skip, which fails under CI=true) when this process is not root:
/// the live tests need CAP_BPF + CAP_PERFMON.
pub fn skip_unless_root() -> bool {
    if !is_root() {
        etm_testutil::skip("needs root (CAP_BPF + CAP_PERFMON) to load eBPF and open perf events");
        return true;
    }
    false
}

pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("Uid:")).and_then(|v| v.split_whitespace().nth(1).map(|e| e == "0")))
        .unwrap_or(false)
}

/// A C compiler: clang-22, clang, gcc or cc (first found).
pub fn c_compiler() -> Option<&'static str> {
    ["clang-22", "clang", "gcc", "cc"]
        .into_iter()
        .find(|c| Command::new(c).arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok())
}

/// Builds `tests/workloads/<name>.c` into `out_dir/<name>` with frame pointers and without
/// tail calls (so every caller stays on the stack). `None` (after printing why) if no compiler.
pub fn build_workload(name: &str, out_dir: &Path) -> Option<PathBuf> {
    build_workload_with(
        name,
        out_dir,
        &["-O1", "-g", "-fno-omit-frame-pointer", "-mno-omit-leaf-frame-pointer", "-fno-optimize-sibling-calls", "-pthread"],
        name,
    )
}

/// Builds `tests/workloads/NAME.c` with the C compiler and `flags` into `out_dir/OUT`.
pub fn build_workload_with(name: &str, out_dir: &Path, flags: &[&str], out: &str) -> Option<PathBuf> {
    let Some(cc) = c_compiler() else {
        etm_testutil::skip("no C compiler (clang-22, clang, gcc, cc) found");
        return None;
    };
    let src = repo_root().join("tests/workloads").join(format!("{name}.c"));
    let out = out_dir.join(out);
    let st = Command::new(cc).args(flags).arg("-o").arg(&out).arg(&src).status().expect("run the C compiler");
    assert!(st.success(), "{cc} failed on {}", src.display());
    Some(out)
}

/// A child process killed (and reaped) on drop.
pub struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `exe args` and waits for its first stdout line (the workloads print "ready PID").
pub fn spawn_ready(exe: &Path, args: &[&str]) -> (KillOnDrop, String) {
    let mut child =
        Command::new(exe).args(args).stdout(Stdio::piped()).spawn().unwrap_or_else(|e| panic!("start {}: {e}", exe.display()));
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().expect("piped stdout")).read_line(&mut line).expect("read the ready line");
    (KillOnDrop(child), line)
}

/// Sends signal `sig` (a name such as `USR1`, `INT`) to `pid` with kill(1).
pub fn send_signal(pid: u32, sig: &str) {
    let st = Command::new("kill").arg(format!("-{sig}")).arg(pid.to_string()).status();
    assert!(st.is_ok_and(|s| s.success()), "kill -{sig} {pid} failed");
}

/// Waits for `child` at most `timeout`; kills it and panics on timeout (a hang is a failure).
pub fn wait_timeout(child: &mut Child, timeout: Duration) -> std::process::ExitStatus {
    let t0 = Instant::now();
    loop {
        if let Some(st) = child.try_wait().expect("try_wait") {
            return st;
        }
        if t0.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            panic!("process did not exit within {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Reads all of a child's pipe into a string.
pub fn read_all(r: Option<impl Read>) -> String {
    let mut s = String::new();
    if let Some(mut r) = r {
        let _ = r.read_to_string(&mut s);
    }
    s
}

/// Parses folded stacks (`a;b;c count` per line) into path -> count; panics on a bad line.
pub fn parse_folded(text: &str) -> BTreeMap<Vec<String>, u64> {
    let mut m = BTreeMap::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let (stack, count) = line.rsplit_once(' ').unwrap_or_else(|| panic!("bad folded line {line:?}"));
        let count: u64 = count.parse().unwrap_or_else(|_| panic!("bad count in {line:?}"));
        let path = stack.split(';').map(str::to_owned).collect();
        *m.entry(path).or_insert(0) += count;
    }
    m
}

/// Sum of the counts of the folded stacks that contain frame `f`.
pub fn containing(m: &BTreeMap<Vec<String>, u64>, f: &str) -> u64 {
    m.iter().filter(|(p, _)| p.iter().any(|x| x == f)).map(|(_, c)| c).sum()
}

/// Sum of the counts of the folded stacks whose last frames are `suffix`.
pub fn ending_with(m: &BTreeMap<Vec<String>, u64>, suffix: &[&str]) -> u64 {
    m.iter().filter(|(p, _)| p.len() >= suffix.len() && p[p.len() - suffix.len()..] == *suffix).map(|(_, c)| c).sum()
}

pub use etm_testutil::cpu_seconds;

/// `etm-bpf run --pid PID --headless --duration SECS EXTRA... --dump-dir DUMP`; calls
/// `on_first_line` once the first line is out (profiling has started), asserts success and
/// returns the manifest (`DUMP/manifest.json`).
pub fn run_pid_dump(pid: u32, secs: u32, extra: &[&str], dump: &Path, on_first_line: impl FnOnce()) -> serde_json::Value {
    let mut run = Command::new(etm_bpf_bin())
        .args(["run", "--pid", &pid.to_string(), "--headless", "--duration", &secs.to_string()])
        .args(extra)
        .arg("--dump-dir")
        .arg(dump)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start etm-bpf");
    let mut out = BufReader::new(run.stdout.take().expect("piped stdout"));
    let mut first = String::new();
    out.read_line(&mut first).expect("read etm-bpf's output");
    on_first_line();
    let mut rest = String::new();
    out.read_to_string(&mut rest).expect("read etm-bpf's output");
    let st = wait_timeout(&mut run, Duration::from_secs(60 + u64::from(secs)));
    let stderr = read_all(run.stderr.take());
    assert!(st.success(), "etm-bpf run {extra:?} failed: {st}\n{first}{rest}\n{stderr}");
    let m = std::fs::read_to_string(dump.join("manifest.json")).expect("read manifest.json");
    serde_json::from_str(&m).expect("manifest.json is JSON")
}

/// Builds `tests/workloads/SRC` with `compiler FLAGS -o out_dir/OUT SRC AFTER` (AFTER:
/// libraries to link). `None` (after [`etm_testutil::skip`], a failure under CI) if the
/// compiler is not installed.
pub fn build_with(compiler: &str, src: &str, flags: &[&str], after: &[&str], out_dir: &Path, out: &str) -> Option<PathBuf> {
    if Command::new(compiler).arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status().is_err() {
        etm_testutil::skip(format!("no {compiler} (scripts/setup.sh installs it)"));
        return None;
    }
    let src = repo_root().join("tests/workloads").join(src);
    let out = out_dir.join(out);
    let st = Command::new(compiler).args(flags).arg("-o").arg(&out).arg(&src).args(after).status().expect("run the compiler");
    assert!(st.success(), "{compiler} failed on {}", src.display());
    Some(out)
}

/// The files of two dump directories are the same, byte for byte (at least `min` of them).
pub fn assert_same_files(a: &Path, b: &Path, min: usize, what: &str) {
    let names = |d: &Path| {
        let mut v: Vec<_> = std::fs::read_dir(d).unwrap().map(|e| e.unwrap().file_name()).collect();
        v.sort();
        v
    };
    assert_eq!(names(a), names(b), "{what}: dump files");
    assert!(names(a).len() >= min, "{what}: {:?}", names(a));
    for name in names(a) {
        let x = std::fs::read(a.join(&name)).unwrap();
        let y = std::fs::read(b.join(&name)).unwrap();
        assert!(x == y, "{name:?} differs: {what}");
    }
}
