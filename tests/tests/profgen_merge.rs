//! Merging two dumps equals one dump of the union of the samples: split an llvm-profgen test
//! input (hybrid and branch-only) into two halves, convert each, merge the two perf-script
//! dumps with `etm-bpf convert --perfscript A --perfscript B`, and require
//! * the merged dumps to be byte-identical to the dumps of the whole input, and
//! * llvm-profgen-22 on the merged dump to give the profile it gives on the original input.

mod common_profgen;

use std::path::Path;
use std::process::Command;

use common_profgen::*;

/// Split perf-script text into two files by alternating samples; MMAP lines go to both.
fn split(text: &str, hybrid: bool) -> (String, String) {
    let (mut a, mut b) = (String::new(), String::new());
    let mut cur = String::new();
    let mut k = 0;
    for line in text.lines() {
        if line.contains("PERF_RECORD_MMAP") {
            a.push_str(line);
            a.push('\n');
            b.push_str(line);
            b.push('\n');
            continue;
        }
        cur.push_str(line);
        cur.push('\n');
        let ends = if hybrid { line.starts_with(" 0x") } else { line.contains('/') };
        if ends {
            if k % 2 == 0 {
                a.push_str(&cur)
            } else {
                b.push_str(&cur)
            }
            k += 1;
            cur.clear();
        }
    }
    (a, b)
}

fn check(case: &str, script: &str, binary: &str, hybrid: bool) {
    let shared = shared_dir();
    let dir = shared.join("testdata/profgen").join(case);
    if !dir.join(script).is_file() {
        etm_testutil::skip(format!("no shared test data {}", dir.join(script).display()));
        return;
    }
    let Some(pg) = llvm_tool("llvm-profgen") else {
        etm_testutil::skip("llvm-profgen-22 not installed");
        return;
    };
    let Some(bin) = etm_bpf_bin() else {
        etm_testutil::skip("etm-bpf binary not built and ETM_BPF_BIN unset");
        return;
    };
    let work = scratch(&format!("merge-{case}"));
    let original = dir.join(script);
    let binary = dir.join(binary);
    let text = std::fs::read_to_string(&original).unwrap();
    let (a, b) = split(&text, hybrid);
    std::fs::write(work.join("a.script"), a).unwrap();
    std::fs::write(work.join("b.script"), b).unwrap();
    let name = binary.file_name().unwrap().to_string_lossy().into_owned();
    convert(&bin, &work.join("a.script"), &[&binary], &work.join("da"));
    convert(&bin, &work.join("b.script"), &[&binary], &work.join("db"));
    convert(&bin, &original, &[&binary], &work.join("du"));
    let ps = |d: &str| work.join(d).join(format!("{name}.perfscript"));
    let mut c = Command::new(&bin);
    c.arg("convert").arg("--perfscript").arg(ps("da")).arg("--perfscript").arg(ps("db"));
    c.arg("--binary").arg(&binary).arg("--dump-dir").arg(work.join("dm"));
    run_ok(&mut c);
    for ext in ["perfscript", "unsym.txt", "bolt.pa"] {
        let f = format!("{name}.{ext}");
        let m = std::fs::read(work.join("dm").join(&f)).unwrap();
        let u = std::fs::read(work.join("du").join(&f)).unwrap();
        assert!(m == u, "{case}: merged {f} differs from the dump of the whole input");
    }
    let profgen = |input: &Path, out: &str| {
        run_ok(
            Command::new(&pg)
                .arg("--format=text")
                .arg(format!("--perfscript={}", input.display()))
                .arg(format!("--binary={}", binary.display()))
                .arg(format!("--output={}", work.join(out).display())),
        );
        std::fs::read_to_string(work.join(out)).unwrap()
    };
    let expected = profgen(&original, "orig.prof");
    assert!(!expected.trim().is_empty(), "{case}: empty reference profile");
    assert_eq!(profgen(&ps("dm"), "merged.prof"), expected, "{case}: profile of the merged dump differs");
    let _ = std::fs::remove_dir_all(&work);
}

#[test]
fn merge_hybrid_dumps_equals_union() {
    check("inline-probe-afdo", "cs-preinline-cost.perfscript", "cs-preinline-cost.perfbin", true);
}

#[test]
fn merge_branch_only_dumps_equals_union() {
    check("noinline-noprobe", "noprobe.perfscript", "noprobe.perfbin", false);
}
