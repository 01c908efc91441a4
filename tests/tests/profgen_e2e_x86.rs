//! End to end on x86-64: build a small C program with clang-22 for profiling (DWARF and
//! pseudo-probe variants), derive exact hybrid samples from its real execution under
//! `qemu-x86_64 -singlestep` (no LBR on this machine), write them as perf-script text,
//! `etm-bpf convert` them, and drive the real consumers with our dumps:
//! * llvm-profgen-22 on our perf-script dump gives the same profile as on the qemu-derived
//!   original, and on our unsymbolized dump the same AutoFDO profile as `--ignore-stack-samples`;
//! * llvm-profdata-22 reads the profile, and its hot context is the one the program's
//!   structure says is hot (work under caller_a, not caller_b);
//! * clang-22 `-fprofile-sample-use` with it makes a profile-driven inlining decision
//!   (`-Rpass=sample-profile-inline` remark: work inlined at its caller_a call site "to match
//!   profiling context") and the result runs right;
//! * perf2bolt-22 reads our BOLT dump and llvm-bolt-22 optimizes the `--emit-relocs` build
//!   into a binary that prints the same result.

mod common_profgen;

use std::path::{Path, PathBuf};
use std::process::Command;

use common_profgen::exact;
use common_profgen::*;

const PROGRAM: &str = include_str!("common_profgen/e2e_prog.c");
const ARG: &str = "3000";

/// First executable PT_LOAD (vaddr, memsz, offset) from `llvm-readelf -lW`.
fn exec_segment(readelf: &Path, bin: &Path) -> (u64, u64, u64) {
    let out = run_ok(Command::new(readelf).arg("-lW").arg(bin));
    for l in out.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.first() == Some(&"LOAD") && l.contains(" R E ") {
            let h = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).unwrap();
            return (h(f[2]), h(f[5]), h(f[1]));
        }
    }
    panic!("no executable LOAD segment in {}", bin.display());
}

struct Tools {
    clang: PathBuf,
    objdump: PathBuf,
    readelf: PathBuf,
    profgen: PathBuf,
    profdata: PathBuf,
    perf2bolt: Option<PathBuf>,
    bolt: Option<PathBuf>,
    etm: PathBuf,
}

fn tools() -> Result<Tools, String> {
    let need = |n: &str| llvm_tool(n).ok_or(format!("{n}-22 not installed"));
    which("qemu-x86_64").ok_or("qemu-x86_64 not installed")?;
    Ok(Tools {
        clang: need("clang")?,
        objdump: need("llvm-objdump")?,
        readelf: need("llvm-readelf")?,
        profgen: need("llvm-profgen")?,
        profdata: need("llvm-profdata")?,
        perf2bolt: llvm_tool("perf2bolt"),
        bolt: llvm_tool("llvm-bolt"),
        etm: etm_bpf_bin().ok_or("etm-bpf binary not built and ETM_BPF_BIN unset")?,
    })
}

/// Dynamic (libc frames are external to the profiled binary, as on a real system: a static
/// libc without debug info would make llvm-profgen drop whole contexts), non-PIE (loaded at its
/// link address under qemu, which the MMAP2 line states).
const CFLAGS: &[&str] = &["-O2", "-g", "-fdebug-info-for-profiling", "-fno-omit-frame-pointer", "-no-pie"];

fn build(t: &Tools, src: &Path, out: &Path, extra: &[&str]) -> String {
    run_ok(Command::new(&t.clang).args(CFLAGS).args(extra).arg("-o").arg(out).arg(src))
}

fn run_native(bin: &Path) -> String {
    run_ok(Command::new(bin).arg(ARG).env_clear())
}

#[test]
fn x86_64_end_to_end() {
    if std::env::consts::ARCH != "x86_64" {
        etm_testutil::skip("host is not x86_64");
        return;
    }
    let t = match tools() {
        Ok(t) => t,
        Err(e) => {
            etm_testutil::skip(e);
            return;
        }
    };
    let work = scratch("e2e-x86");
    let src = work.join("prog.c");
    std::fs::write(&src, PROGRAM).unwrap();
    for (variant, extra) in [("dwarf", &["-Wl,--emit-relocs"][..]), ("probe", &["-fpseudo-probe-for-profiling"][..])] {
        let dir = work.join(variant);
        std::fs::create_dir_all(&dir).unwrap();
        let bin = dir.join("prog");
        build(&t, &src, &bin, extra);
        let expected_out = run_native(&bin);

        // Exact samples from the real execution.
        let insts = exact::disassemble(&t.objdump, &bin);
        let (samples, out, n) = exact::sample(&bin, &[ARG], &insts, 1009, 16);
        assert_eq!(out, expected_out, "{variant}: output under qemu differs");
        assert!(samples.len() > 500, "{variant}: only {} samples from {n} instructions", samples.len());
        let (vaddr, len, off) = exec_segment(&t.readelf, &bin);
        let script = dir.join("qemu.perfscript");
        exact::write_perfscript(&script, &bin, vaddr, len, off, &samples);

        // Convert and feed llvm-profgen both the original and our dump.
        let dump = dir.join("dump");
        let files = convert(&t.etm, &script, &[&bin], &dump);
        assert!(files.iter().any(|f| f.ends_with("prog.perfscript")), "{files:?}");
        assert!(dump.join("manifest.json").is_file());
        let profgen = |flag: &str, input: &Path, out: &Path, opts: &[&str]| {
            run_ok(
                Command::new(&t.profgen)
                    .arg("--format=text")
                    .arg(format!("{flag}={}", input.display()))
                    .arg(format!("--binary={}", bin.display()))
                    .arg(format!("--output={}", out.display()))
                    .args(opts),
            );
            std::fs::read_to_string(out).unwrap()
        };
        let prof = dir.join("cs.prof");
        let ours = profgen("--perfscript", &dump.join("prog.perfscript"), &prof, &[]);
        let orig = profgen("--perfscript", &script, &dir.join("cs-orig.prof"), &[]);
        assert_eq!(ours, orig, "{variant}: CS profile from our dump differs from the original samples'");
        if variant == "dwarf" {
            // DWARF binary: our unsymbolized dump is the context-sensitive unwinder output,
            // byte-identical to llvm-profgen's own `--skip-symbolization` of the samples.
            let theirs = profgen("--perfscript", &script, &dir.join("orig.unsym.txt"), &["--skip-symbolization"]);
            let ours_unsym = std::fs::read_to_string(dump.join("prog.unsym.txt")).unwrap();
            assert!(ours_unsym.starts_with('['), "{variant}: unsymbolized dump is not context-sensitive");
            assert_eq!(ours_unsym, theirs, "{variant}: CS unsymbolized dump differs from llvm-profgen's unwinder output");
        } else {
            let afdo_orig = profgen("--perfscript", &script, &dir.join("afdo-orig.prof"), &["--ignore-stack-samples"]);
            let afdo_unsym = profgen("--unsymbolized-profile", &dump.join("prog.unsym.txt"), &dir.join("afdo.prof"), &[]);
            assert_eq!(afdo_unsym, afdo_orig, "{variant}: AutoFDO profile from our unsymbolized dump differs");
        }

        // llvm-profdata reads it; the hot context is work under caller_a.
        let shown = run_ok(Command::new(&t.profdata).args(["show", "--sample", "--all-functions"]).arg(&prof));
        assert!(shown.contains("caller_a"), "{variant}: no caller_a in profile:\n{shown}");
        let hot_a = context_total(&ours, "caller_a");
        let hot_b = context_total(&ours, "caller_b");
        eprintln!("{variant}: {} samples; contexts through caller_a: {hot_a}, through caller_b: {hot_b}", samples.len());
        assert!(hot_a > 10 * hot_b.max(1), "{variant}: caller_a contexts ({hot_a}) not hotter than caller_b ({hot_b})");

        // The profile drives clang's decisions; the optimized program still computes the same.
        let opt = dir.join("prog.pgo");
        let o = run(Command::new(&t.clang)
            .args(CFLAGS)
            .args(extra.iter().filter(|f| f.starts_with("-fpseudo-probe")))
            .arg(format!("-fprofile-sample-use={}", prof.display()))
            .arg("-Rpass=sample-profile-inline")
            .arg("-o")
            .arg(&opt)
            .arg(&src));
        let remarks = String::from_utf8_lossy(&o.stderr).into_owned();
        assert!(o.status.success(), "{variant}: PGO build failed:\n{remarks}");
        // The hot context is main -> caller_a -> work: the sample loader must inline work at
        // its call site in caller_a "to match profiling context".
        assert!(
            remarks.lines().any(|l| l.contains("'work' inlined into")
                && l.contains("to match profiling context")
                && (l.contains("'caller_a'") || l.contains("caller_a:"))),
            "{variant}: no profile-driven inlining of work in its caller_a context:\n{remarks}"
        );
        assert_eq!(run_native(&opt), expected_out, "{variant}: PGO binary output differs");

        if variant == "dwarf" {
            bolt(&t, &bin, &dump.join("prog.bolt.pa"), &dir, &expected_out);
        }
    }
    let _ = std::fs::remove_dir_all(&work);
}

fn bolt(t: &Tools, bin: &Path, pa: &Path, dir: &Path, expected_out: &str) {
    let (Some(p2b), Some(bolt)) = (&t.perf2bolt, &t.bolt) else {
        etm_testutil::skip("BOLT part: perf2bolt-22/llvm-bolt-22 not installed");
        return;
    };
    let fdata = dir.join("prog.fdata");
    run_ok(Command::new(p2b).arg("-pa").arg("-p").arg(pa).arg("-o").arg(&fdata).arg(bin));
    let fd = std::fs::read_to_string(&fdata).unwrap();
    // caller_a and work are inlined into main in this build: the hottest branch must be in main.
    let hottest = fd.lines().max_by_key(|l| l.rsplit(' ').next().and_then(|c| c.parse::<u64>().ok()).unwrap_or(0));
    assert!(
        hottest.is_some_and(|l| l.starts_with("1 main ") && l.contains(" 1 main ")),
        "hottest perf2bolt branch not inside main: {hottest:?}\n{fd}"
    );
    let out = dir.join("prog.bolt");
    let log = run_ok(Command::new(bolt).arg(bin).arg("-o").arg(&out).arg(format!("-data={}", fdata.display())).args([
        "-reorder-blocks=ext-tsp",
        "-split-functions",
        "-dyno-stats",
    ]));
    eprintln!("llvm-bolt: {}", log.lines().filter(|l| l.contains("profile")).collect::<Vec<_>>().join(" | "));
    assert_eq!(run_native(&out), expected_out, "BOLT-optimized binary output differs");
}
