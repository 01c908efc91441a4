//! Helpers shared by the `profgen_*` tests: locating shared data, the etm-bpf binary and the
//! LLVM 22 tools, scratch directories, and running commands.
#![allow(dead_code)]

pub mod exact;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// `ETM_BPF_SHARED`, default `<repo>/../shared`.
pub fn shared_dir() -> PathBuf {
    match std::env::var_os("ETM_BPF_SHARED") {
        Some(p) => PathBuf::from(p),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared"),
    }
}

/// The etm-bpf binary: `ETM_BPF_BIN`, else next to this test's target dir
/// (`target/<profile>/etm-bpf`, built by scripts/test.sh before the tests).
pub fn etm_bpf_bin() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("ETM_BPF_BIN") {
        return Some(PathBuf::from(p));
    }
    let exe = std::env::current_exe().ok()?;
    let p = exe.parent()?.parent()?.join("etm-bpf");
    p.is_file().then_some(p)
}

/// An LLVM 22 tool by base name (`llvm-profgen`, `clang`, `perf2bolt`, ...).
pub fn llvm_tool(name: &str) -> Option<PathBuf> {
    let p = PathBuf::from(format!("/usr/lib/llvm-22/bin/{name}"));
    if p.is_file() {
        return Some(p);
    }
    let versioned = format!("{name}-22");
    std::env::var_os("PATH")?.to_str()?.split(':').map(|d| Path::new(d).join(&versioned)).find(|p| p.is_file())
}

/// Any program on PATH.
pub fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?.to_str()?.split(':').map(|d| Path::new(d).join(name)).find(|p| p.is_file())
}

/// A fresh scratch directory under the system temp dir.
pub fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("etm-profgen-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("create scratch dir");
    d
}

/// Run a command, returning its output (panics only if it cannot be spawned).
pub fn run(cmd: &mut Command) -> Output {
    cmd.output().unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}

/// Run a command that must succeed; returns stdout.
pub fn run_ok(cmd: &mut Command) -> String {
    let o = run(cmd);
    assert!(
        o.status.success(),
        "{cmd:?} failed ({}):\nstdout: {}\nstderr: {}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// `etm-bpf convert --perfscript F --binary B... --dump-dir D`; returns the files it listed.
pub fn convert(bin: &Path, script: &Path, binaries: &[&Path], dump: &Path) -> Vec<PathBuf> {
    let mut c = Command::new(bin);
    c.arg("convert").arg("--perfscript").arg(script).arg("--dump-dir").arg(dump);
    for b in binaries {
        c.arg("--binary").arg(b);
    }
    run_ok(&mut c).lines().map(PathBuf::from).collect()
}

/// Sum of the head totals of profile entries whose context mentions `func` (flat or nested
/// text profile: top-level lines `[ctx]:total:head` or `name:total:head`, plus nested
/// `N: name:total` inlinee lines).
pub fn context_total(profile: &str, func: &str) -> u64 {
    let mut total = 0;
    for l in profile.lines() {
        let t = l.trim_start();
        if t.contains(func)
            && let Some(n) = t.rsplit(':').nth(if l.starts_with(' ') { 0 } else { 1 })
            && let Ok(v) = n.trim().parse::<u64>()
        {
            total += v;
        }
    }
    total
}
