//! The PGO dumps `run`/`replay` write from the profile's online counters, checked on the same
//! sessions against the samples themselves through the real tools.
//!
//! `replay --perfscript all` also keeps every sample and writes `<bin>.perfscript`: the very
//! samples the dumps were written from before the counters (the old writers read this store).
//! On synthetic ETE sessions of AArch64 programs built with DWARF (`indirect`, `loops`,
//! `recursion`: calls through pointers, data-dependent loops, deep recursion) and on sessions
//! shaped like hardware (the driver model: three processes on four CPUs, TRBE and a shared
//! ETR; the target's binary), for every binary:
//!
//! * the counters' dumps are the same with and without the sample store, and without it there
//!   is no `.perfscript` for a DWARF binary (it is not needed);
//! * context-free: `<bin>.autofdo.unsym.txt` is byte for byte what `llvm-profgen-22
//!   --skip-symbolization --ignore-stack-samples` writes from the samples, and gives the same
//!   AutoFDO profile as `--ignore-stack-samples` on the samples;
//! * context-sensitive: `<bin>.unsym.txt` read by llvm-profgen-22 gives byte for byte the
//!   profile of llvm-profgen's own unwinder output of the samples (`--skip-symbolization`, read
//!   back), and the profile of the samples themselves up to the ContextWasInlined attribute
//!   (which the unsymbolized format cannot carry); it holds the programs' hot functions;
//! * BOLT: `perf2bolt-22 -pa` makes the same fdata from `<bin>.bolt.pa` as from a
//!   pre-aggregated file this test writes itself from the samples (`B` per branch of the
//!   binary's view, `F` between consecutive ones, as the writer did from stored samples).
//!
//! An LBR `convert` of perf scripts is covered by `profgen_cases.rs` (LLVM's own inputs).

mod common_profgen;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use common_profgen::*;
use etm_live::collect::{Delivery, Strategy};
use etm_synth::hw::{ModelConfig, Topology};
use etm_synth::hw_run::{self, Built, RunOptions};
use etm_synth::image::CodeImage;
use etm_synth::qemu::{self, QemuOptions};
use etm_synth::testprogs::{self, BuildError, Compiler, PROGRAMS};

struct Tools {
    pg: PathBuf,
    p2b: PathBuf,
    etm: PathBuf,
}

fn tools() -> Option<Tools> {
    let t = (|| {
        testprogs::qemu_available().map_err(|e| e.to_string())?;
        Ok::<_, String>(Tools {
            pg: llvm_tool("llvm-profgen").ok_or("llvm-profgen-22 not installed")?,
            p2b: llvm_tool("perf2bolt").ok_or("perf2bolt-22 not installed")?,
            etm: etm_bpf_bin().ok_or("etm-bpf binary not built and ETM_BPF_BIN unset")?,
        })
    })();
    t.map_err(etm_testutil::skip).ok()
}

/// A test program built with DWARF (gcc, `-O2 -g -static -fno-omit-frame-pointer`).
fn build_g(name: &str, dir: &Path) -> Option<PathBuf> {
    let prog = PROGRAMS.iter().find(|p| p.name == name).expect("known program");
    match testprogs::build_with(prog, Compiler::Gcc, dir, &["-g"], "-g") {
        Ok(p) => Some(p),
        Err(BuildError::Missing(m)) => {
            etm_testutil::skip(m);
            None
        }
        Err(e) => panic!("{e}"),
    }
}

/// `etm-bpf replay SESSION --headless --dump-dir DUMP EXTRA...`; returns the manifest.
fn replay(t: &Tools, session: &Path, dump: &Path, extra: &[&str]) -> serde_json::Value {
    run_ok(Command::new(&t.etm).arg("replay").arg(session).args(["--headless", "--dump-dir"]).arg(dump).args(extra));
    serde_json::from_str(&std::fs::read_to_string(dump.join("manifest.json")).unwrap()).unwrap()
}

fn profgen(t: &Tools, bin: &Path, input: (&str, &Path), out: &Path, opts: &[&str]) -> String {
    run_ok(
        Command::new(&t.pg)
            .arg("--format=text")
            .arg(format!("{}={}", input.0, input.1.display()))
            .arg(format!("--binary={}", bin.display()))
            .arg(format!("--output={}", out.display()))
            .args(opts),
    );
    std::fs::read_to_string(out).unwrap()
}

/// The profile text with the ContextWasInlined bit (1) cleared from `!Attributes: N` lines
/// (a line left at 0 dropped, as llvm-profgen writes none then).
fn strip_was_inlined(t: &str) -> String {
    let mut out = String::new();
    for line in t.lines() {
        match line.trim_start().strip_prefix("!Attributes: ").and_then(|v| v.parse::<u32>().ok()) {
            Some(a) if a & !1 == 0 => continue,
            Some(a) => out.push_str(&format!("{}!Attributes: {}", &line[..line.len() - line.trim_start().len()], a & !1)),
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

/// BOLT's pre-aggregated input from an aggregated perf-script dump: per sample (a count line,
/// indented stack lines, one line of `0xFROM/0xTO/...` entries newest first; `0x1` external),
/// `B` per entry and `F` from each entry's target to the next newer entry's source when both
/// are in the binary and the range runs forward. Sorted as the writer sorts.
fn bolt_from_perfscript(text: &str) -> String {
    let (mut b, mut f) = (BTreeMap::<(u64, u64), u64>::new(), BTreeMap::<(u64, u64), u64>::new());
    let mut count = 1u64;
    for line in text.lines() {
        if let Ok(c) = line.parse::<u64>() {
            count = c;
            continue;
        }
        if !line.starts_with(" 0x") && !line.starts_with("  ") {
            continue;
        }
        let entries: Vec<(u64, u64)> = line
            .split_whitespace()
            .filter(|e| e.starts_with("0x"))
            .map(|e| {
                let mut p = e.split('/').map(|x| u64::from_str_radix(x.trim_start_matches("0x"), 16).unwrap());
                (p.next().unwrap(), p.next().unwrap())
            })
            .collect();
        for (i, &(from, to)) in entries.iter().enumerate() {
            *b.entry((from, to)).or_default() += count;
            if let Some(&(_, older_to)) = entries.get(i + 1)
                && older_to != 1
                && from != 1
                && older_to <= from
            {
                *f.entry((older_to, from)).or_default() += count;
            }
        }
    }
    let mut out = String::new();
    for ((from, to), c) in b {
        match (from == 1, to == 1) {
            (false, false) => out.push_str(&format!("B {from:x} {to:x} {c} 0\n")),
            (true, false) => out.push_str(&format!("B X:0 {to:x} {c} 0\n")),
            (false, true) => out.push_str(&format!("B {from:x} X:0 {c} 0\n")),
            (true, true) => {}
        }
    }
    for ((s, e), c) in f {
        out.push_str(&format!("F {s:x} {e:x} {c}\n"));
    }
    out
}

fn perf2bolt(t: &Tools, bin: &Path, pa: &Path, out: &Path) -> Vec<u8> {
    run_ok(Command::new(&t.p2b).arg("-pa").arg("-p").arg(pa).arg("-o").arg(out).arg(bin));
    std::fs::read(out).unwrap()
}

/// Every check of the module docs for binary `bin` (dump file prefix `name`), `all` the dumps
/// with the sample store, `dflt` without. Returns the CS profile's text.
fn check_binary(t: &Tools, bin: &Path, name: &str, all: &Path, dflt: &Path, work: &Path, label: &str) -> String {
    let label = format!("{label} {name}");
    let ps = all.join(format!("{name}.perfscript"));
    assert!(ps.is_file(), "{label}: no perf-script dump with --perfscript all");
    assert!(!dflt.join(format!("{name}.perfscript")).exists(), "{label}: a perf-script dump for a DWARF binary by default");
    for f in ["unsym.txt", "autofdo.unsym.txt", "bolt.pa"] {
        let (a, b) = (std::fs::read(all.join(format!("{name}.{f}"))), std::fs::read(dflt.join(format!("{name}.{f}"))));
        assert!(a.is_ok() && a.as_ref().ok() == b.as_ref().ok(), "{label}: {f} differs with the sample store");
    }
    let w = |s: &str| work.join(format!("{name}.{s}"));
    // Context-free.
    let cf = std::fs::read_to_string(dflt.join(format!("{name}.autofdo.unsym.txt"))).unwrap();
    let theirs_cf =
        profgen(t, bin, ("--perfscript", &ps), &w("llvm-cf.txt"), &["--skip-symbolization", "--ignore-stack-samples"]);
    assert_eq!(cf, theirs_cf, "{label}: context-free unsymbolized dump is not llvm-profgen's");
    let afdo = profgen(t, bin, ("--perfscript", &ps), &w("afdo.prof"), &["--ignore-stack-samples"]);
    let afdo_ours =
        profgen(t, bin, ("--unsymbolized-profile", &dflt.join(format!("{name}.autofdo.unsym.txt"))), &w("afdo-ours.prof"), &[]);
    assert_eq!(afdo_ours, afdo, "{label}: AutoFDO profile");
    // Context-sensitive.
    let unsym = dflt.join(format!("{name}.unsym.txt"));
    assert!(std::fs::read_to_string(&unsym).unwrap().starts_with('['), "{label}: unsymbolized dump not context-sensitive");
    profgen(t, bin, ("--perfscript", &ps), &w("llvm-cs.txt"), &["--skip-symbolization"]);
    let own = profgen(t, bin, ("--unsymbolized-profile", &w("llvm-cs.txt")), &w("own.prof"), &[]);
    let ours = profgen(t, bin, ("--unsymbolized-profile", &unsym), &w("cs-ours.prof"), &[]);
    assert_eq!(ours, own, "{label}: CS profile differs from llvm-profgen's own round trip");
    let direct = profgen(t, bin, ("--perfscript", &ps), &w("cs.prof"), &[]);
    assert_eq!(strip_was_inlined(&ours), strip_was_inlined(&direct), "{label}: CS profile differs from the samples'");
    // BOLT.
    let pa = w("from-samples.bolt.pa");
    std::fs::write(&pa, bolt_from_perfscript(&std::fs::read_to_string(&ps).unwrap())).unwrap();
    let want = perf2bolt(t, bin, &pa, &w("want.fdata"));
    let got = perf2bolt(t, bin, &dflt.join(format!("{name}.bolt.pa")), &w("got.fdata"));
    assert!(!want.is_empty() && got == want, "{label}: perf2bolt fdata differs");
    ours
}

/// The manifest says the sample store kept every sample (the perf-script dump is complete).
fn assert_store_complete(m: &serde_json::Value, label: &str) {
    let p = &m["profile"];
    assert_eq!((p["folded"].as_u64(), p["dropped"].as_u64()), (Some(0), Some(0)), "{label}: {p}");
    assert_eq!(p["samples_not_counted"].as_u64(), Some(0), "{label}: {p}");
}

#[test]
fn synthetic_sessions_equal_llvm_profgen_and_perf2bolt() {
    let Some(t) = tools() else { return };
    let work = scratch("counters-synth");
    for (name, arg, hot) in
        [("indirect", "30000", &["op_add", "op_mix"][..]), ("loops", "4", &["nested"][..]), ("recursion", "", &["fib"][..])]
    {
        let Some(bin) = build_g(name, &work) else { return };
        let sess = work.join(format!("{name}.session"));
        let mut c = Command::new(&t.etm);
        c.arg("synth").arg("--out").arg(&sess).args(["--window", "1000", "--period", "2000", "--"]).arg(&bin);
        if !arg.is_empty() {
            c.arg(arg);
        }
        run_ok(&mut c);
        let (all, dflt) = (work.join(format!("{name}.all")), work.join(format!("{name}.default")));
        let m = replay(&t, &sess, &all, &["--perfscript", "all"]);
        assert_store_complete(&m, name);
        replay(&t, &sess, &dflt, &[]);
        let file = bin.file_name().unwrap().to_string_lossy().into_owned();
        let cs = check_binary(&t, &bin, &file, &all, &dflt, &work, name);
        for f in hot {
            assert!(context_total(&cs, f) > 0, "{name}: {f} missing from the CS profile:\n{cs}");
        }
    }
    let _ = std::fs::remove_dir_all(&work);
}

/// `hw_run::build_programs` with DWARF: `loops 3`, `indirect`, `recursion`.
fn programs_g(dir: &Path) -> Option<Vec<Built>> {
    let mut out = Vec::new();
    for (name, args) in [("loops", vec!["3".to_string()]), ("indirect", vec![]), ("recursion", vec![])] {
        let bin = build_g(name, dir)?;
        let run = qemu::run(&bin, &args, &QemuOptions { max_insns: 3_000_000, ..Default::default() }).unwrap();
        let bytes = Arc::new(std::fs::read(&bin).unwrap());
        let image = CodeImage::parse(&bytes).unwrap();
        out.push(Built { file: bin, bytes, image, pcs: run.pcs });
    }
    Some(out)
}

#[test]
fn hardware_shaped_sessions_equal_llvm_profgen_and_perf2bolt() {
    let Some(t) = tools() else { return };
    let work = scratch("counters-hw");
    let Some(progs) = programs_g(&work) else { return };
    for (label, topology, delivery, harvest) in
        [("trbe", Topology::Trbe, Delivery::Watermark, 20), ("shared-etr", Topology::SharedEtr, Delivery::Harvest, 10)]
    {
        let mut cfg = ModelConfig { topology, ..ModelConfig::default() };
        if topology == Topology::SharedEtr {
            (cfg.etr_bytes, cfg.aux_bytes) = (8 << 20, 8 << 20);
        }
        let sess = work.join(format!("{label}.session"));
        let opts = RunOptions {
            strategy: Strategy { delivery, harvest_every_ns: Some(harvest * 1_000_000) },
            duration_ns: 60_000_000,
            drain_ns: 5_000_000,
            complete_by_sample_time: false,
            record: Some(sess.clone()),
            tasks: None,
        };
        hw_run::run(&progs, cfg, &opts).expect("model run");
        let (all, dflt) = (work.join(format!("{label}.all")), work.join(format!("{label}.default")));
        let m = replay(&t, &sess, &all, &["--perfscript", "all"]);
        assert_store_complete(&m, label);
        replay(&t, &sess, &dflt, &[]);
        // The target's binaries (the model's other processes are not profiled).
        let bins: Vec<PathBuf> = m["binaries"].as_array().unwrap().iter().map(|b| b["path"].as_str().unwrap().into()).collect();
        assert!(!bins.is_empty(), "{label}: no binary profiled");
        for p in progs.iter().filter(|p| bins.contains(&p.file)) {
            let file = p.file.file_name().unwrap().to_string_lossy().into_owned();
            let cs = check_binary(&t, &p.file, &file, &all, &dflt, &work, label);
            assert!(context_total(&cs, "main") > 0, "{label}: {file}: no samples under main:\n{cs}");
        }
    }
    let _ = std::fs::remove_dir_all(&work);
}
