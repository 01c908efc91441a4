//! `etm-bpf convert` on imperfect input: perf-script lines that are not UTF-8 (perf writes
//! comm and symbol names as the bytes it found) are read lossily and counted, and the other
//! samples convert exactly as without them; a file without samples is reported in a sentence.
//!
//! Truth: the bad lines are inserted by the test between the samples of an llvm-profgen test
//! input (shared test data), so the dumps must equal the dumps of the untouched input, and the
//! count must be the number of lines inserted.

mod common_profgen;

use std::process::Command;

use common_profgen::*;

#[test]
fn non_utf8_lines_are_counted_and_the_other_samples_converted() {
    let dir = shared_dir().join("testdata/profgen/noinline-noprobe");
    let (script, binary) = (dir.join("noprobe.perfscript"), dir.join("noprobe.perfbin"));
    if !script.is_file() {
        etm_testutil::skip(format!("no shared test data {}", script.display()));
        return;
    }
    let Some(bin) = etm_bpf_bin() else {
        etm_testutil::skip("etm-bpf binary not built and ETM_BPF_BIN unset");
        return;
    };
    let work = scratch("convert-utf8");
    let clean = std::fs::read(&script).unwrap();
    // Before every sample line: a line with a comm in Latin-1 and a stray byte.
    let mut dirty = Vec::new();
    let mut inserted = 0;
    for (i, line) in clean.split_inclusive(|&b| b == b'\n').enumerate() {
        if i >= 1 {
            dirty.extend_from_slice(b"caf\xe9 \xff\xfe 12345 [000] 0.0: cycles:\n");
            inserted += 1;
        }
        dirty.extend_from_slice(line);
    }
    assert!(std::str::from_utf8(&dirty).is_err());
    assert!(inserted >= 3);
    std::fs::write(work.join("dirty.script"), &dirty).unwrap();
    convert(&bin, &script, &[&binary], &work.join("clean"));
    let mut c = Command::new(&bin);
    c.arg("convert").arg("--perfscript").arg(work.join("dirty.script"));
    c.arg("--binary").arg(&binary).arg("--dump-dir").arg(work.join("dirty"));
    let o = run(&mut c);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "convert failed on the dirty script: {stderr}");
    assert!(stderr.contains(&format!("{inserted} lines not valid UTF-8")), "{stderr}");
    assert!(!stderr.contains("Stats {"), "Debug dump in the summary: {stderr}");
    for ext in ["perfscript", "unsym.txt", "bolt.pa"] {
        let f = format!("noprobe.perfbin.{ext}");
        let a = std::fs::read(work.join("clean").join(&f)).unwrap();
        let b = std::fs::read(work.join("dirty").join(&f)).unwrap();
        assert!(a == b, "{f}: the samples around the bad lines did not convert as without them");
    }
    let m: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(work.join("dirty/manifest.json")).unwrap()).unwrap();
    assert_eq!(m["perfscript"]["non_utf8_lines"], inserted);
    let _ = std::fs::remove_dir_all(&work);
}

#[test]
fn no_samples_is_a_sentence() {
    let Some(bin) = etm_bpf_bin() else {
        etm_testutil::skip("etm-bpf binary not built and ETM_BPF_BIN unset");
        return;
    };
    let work = scratch("convert-empty");
    std::fs::write(work.join("empty.script"), "not a perf script line\n").unwrap();
    let mut c = Command::new(&bin);
    c.arg("convert").arg("--perfscript").arg(work.join("empty.script"));
    c.arg("--binary").arg(&bin).arg("--dump-dir").arg(work.join("out"));
    let o = run(&mut c);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    let line = err.trim();
    assert!(line.starts_with("etm-bpf: no samples read from "), "{err}");
    assert!(line.contains("(1 line;"), "{err}");
    assert!(!line.contains('{') && !line.contains("Stats"), "Debug dump in the error: {err}");
    assert_eq!(line.lines().count(), 1, "{err}");
    let _ = std::fs::remove_dir_all(&work);
}
