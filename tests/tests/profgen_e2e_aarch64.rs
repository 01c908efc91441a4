//! End to end on AArch64 through the ETM path: build the test program with
//! `clang-22 --target=aarch64-linux-gnu` (static, DWARF and pseudo-probe variants), make a
//! synthetic ETE session of its real execution (`etm-bpf synth`, qemu-aarch64 ground truth),
//! `etm-bpf replay` it (our decoder, join and profile), and drive the real consumers with the
//! dumps (a DWARF binary gets the context-sensitive `.unsym.txt` and the context-free
//! `.autofdo.unsym.txt` from the profile's counters, a pseudo-probe binary the `.perfscript`
//! and a context-free `.unsym.txt`):
//! * llvm-profgen-22 gives the same AutoFDO profile from our context-free unsymbolized dump as
//!   from the samples (`--ignore-stack-samples` on the perf-script dump, kept for the DWARF
//!   binary with `--perfscript all`);
//! * the hot path in it is the one the program's structure says (work under caller_a);
//! * clang-22 `-fprofile-sample-use` inlines work at its hot caller_a call site "to match
//!   profiling context", and the optimized program computes the same result under
//!   qemu-aarch64.
//!
//! * llvm-profgen-22's context-sensitive profile (from the CS unsymbolized dump of the DWARF
//!   binary, the perf-script dump of the probe binary) is non-empty with the hot contexts
//!   through caller_a: in a static binary the root frames are glibc code without debug info,
//!   which llvm-profgen would let empty every context; the code facts mark them external
//!   (`ElfCodeFacts`), as a shared libc's frames are.

mod common_profgen;

use std::path::Path;
use std::process::Command;

use common_profgen::*;

const PROGRAM: &str = include_str!("common_profgen/e2e_prog.c");
const ARG: &str = "3000";
const CFLAGS: &[&str] =
    &["--target=aarch64-linux-gnu", "-O2", "-g", "-fdebug-info-for-profiling", "-fno-omit-frame-pointer", "-static"];

fn qemu_run(bin: &Path) -> String {
    run_ok(Command::new("qemu-aarch64").arg(bin).arg(ARG).env_clear())
}

#[test]
fn aarch64_etm_end_to_end() {
    let tools = (|| {
        which("qemu-aarch64").ok_or("qemu-aarch64 not installed")?;
        let clang = llvm_tool("clang").ok_or("clang-22 not installed")?;
        let pg = llvm_tool("llvm-profgen").ok_or("llvm-profgen-22 not installed")?;
        let etm = etm_bpf_bin().ok_or("etm-bpf binary not built and ETM_BPF_BIN unset")?;
        Ok::<_, &str>((clang, pg, etm))
    })();
    let (clang, pg, etm) = match tools {
        Ok(t) => t,
        Err(e) => {
            etm_testutil::skip(e);
            return;
        }
    };
    let work = scratch("e2e-a64");
    let src = work.join("prog.c");
    std::fs::write(&src, PROGRAM).unwrap();
    for (variant, extra) in [("dwarf", &[][..]), ("probe", &["-fpseudo-probe-for-profiling"][..])] {
        let dir = work.join(variant);
        std::fs::create_dir_all(&dir).unwrap();
        let bin = dir.join("prog");
        let o = run(Command::new(&clang).args(CFLAGS).args(extra).arg("-o").arg(&bin).arg(&src));
        if !o.status.success() {
            // The cross toolchain (gcc-aarch64-linux-gnu / libc6-dev-arm64-cross) is missing.
            etm_testutil::skip(format!("cannot build for aarch64: {}", String::from_utf8_lossy(&o.stderr)));
            return;
        }
        let expected = qemu_run(&bin);

        let sess = dir.join("session");
        run_ok(
            Command::new(&etm)
                .args(["synth", "--window", "1000", "--period", "1009", "--out"])
                .arg(&sess)
                .arg("--")
                .arg(&bin)
                .arg(ARG),
        );
        let dump = dir.join("dump");
        run_ok(Command::new(&etm).arg("replay").arg(&sess).arg("--headless").arg("--dump-dir").arg(&dump));
        let manifest = std::fs::read_to_string(dump.join("manifest.json")).unwrap_or_default();
        let probe = variant == "probe";
        let files: &[&str] = if probe {
            &["prog.perfscript", "prog.unsym.txt", "prog.bolt.pa"]
        } else {
            &["prog.unsym.txt", "prog.autofdo.unsym.txt", "prog.bolt.pa"]
        };
        for f in files {
            assert!(dump.join(f).is_file(), "{variant}: replay wrote no {f}");
            assert!(manifest.contains(f), "{variant}: manifest does not list {f}");
        }
        assert_eq!(dump.join("prog.perfscript").is_file(), probe, "{variant}: a perf-script dump only where needed");
        // The samples themselves, for the DWARF binary too.
        let samples = dir.join("samples");
        run_ok(
            Command::new(&etm).arg("replay").arg(&sess).args(["--headless", "--perfscript", "all", "--dump-dir"]).arg(&samples),
        );

        let profgen = |flag: &str, input: &Path, out: &str, opts: &[&str]| {
            run_ok(
                Command::new(&pg)
                    .arg("--format=text")
                    .arg(format!("{flag}={}", input.display()))
                    .arg(format!("--binary={}", bin.display()))
                    .arg(format!("--output={}", dir.join(out).display()))
                    .args(opts),
            );
            std::fs::read_to_string(dir.join(out)).unwrap()
        };
        let afdo = profgen("--perfscript", &samples.join("prog.perfscript"), "afdo.prof", &["--ignore-stack-samples"]);
        let cf = dump.join(if probe { "prog.unsym.txt" } else { "prog.autofdo.unsym.txt" });
        let afdo_unsym = profgen("--unsymbolized-profile", &cf, "afdo-unsym.prof", &[]);
        assert_eq!(afdo_unsym, afdo, "{variant}: unsymbolized dump and the samples disagree");
        let (hot_a, hot_b) = (context_total(&afdo, "caller_a"), context_total(&afdo, "caller_b"));
        eprintln!("{variant}: samples through caller_a {hot_a}, through caller_b {hot_b}");
        assert!(hot_a > 10 * hot_b.max(1), "{variant}: caller_a ({hot_a}) not hotter than caller_b ({hot_b})");

        // Context-sensitive: the static glibc root frames are external, so the contexts
        // survive; the hot one runs through caller_a.
        let cs = if probe {
            profgen("--perfscript", &dump.join("prog.perfscript"), "cs.prof", &[])
        } else {
            profgen("--unsymbolized-profile", &dump.join("prog.unsym.txt"), "cs.prof", &[])
        };
        let (cs_a, cs_b) = (context_total(&cs, "caller_a"), context_total(&cs, "caller_b"));
        eprintln!("{variant}: CS contexts through caller_a {cs_a}, through caller_b {cs_b}");
        assert!(cs_a > 10 * cs_b.max(1), "{variant}: CS profile: caller_a ({cs_a}) not hotter than caller_b ({cs_b}):\n{cs}");

        let opt = dir.join("prog.pgo");
        let o = run(Command::new(&clang)
            .args(CFLAGS)
            .args(extra)
            .arg(format!("-fprofile-sample-use={}", dir.join("afdo.prof").display()))
            .arg("-Rpass=sample-profile-inline")
            .arg("-o")
            .arg(&opt)
            .arg(&src));
        let remarks = String::from_utf8_lossy(&o.stderr).into_owned();
        assert!(o.status.success(), "{variant}: PGO build failed:\n{remarks}");
        let work_inlined = |ctx: &str| {
            remarks
                .lines()
                .any(|l| l.contains("'work' inlined into") && l.contains("to match profiling context") && l.contains(ctx))
        };
        assert!(work_inlined("caller_a:"), "{variant}: work not inlined in its hot caller_a context:\n{remarks}");
        assert_eq!(qemu_run(&opt), expected, "{variant}: PGO binary output differs");
    }
    let _ = std::fs::remove_dir_all(&work);
}
