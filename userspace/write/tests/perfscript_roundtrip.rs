//! Our perf-script dump read back gives the same profile (written again, byte-identical), and
//! carries every sample the reader accepted, for each perf-script input of the shared
//! llvm-profgen test data (skips with a message if the data is absent).

use std::path::{Path, PathBuf};

use etm_profile::perfscript::read_perfscript;
use etm_profile::{BinaryInfo, HybridProfile, MmapResolver};
use etm_write::pgo::write_perfscript;

fn shared() -> PathBuf {
    std::env::var_os("ETM_BPF_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared"))
}

fn dump(p: &HybridProfile) -> String {
    let mut out = Vec::new();
    write_perfscript(p, 0, &mut out).unwrap();
    String::from_utf8(out).unwrap()
}

/// Total of the count lines of an aggregated dump.
fn counted(text: &str) -> u64 {
    text.lines().filter(|l| !l.is_empty() && l.bytes().all(|b| b.is_ascii_digit())).map(|l| l.parse::<u64>().unwrap()).sum()
}

#[test]
fn dumps_round_trip() {
    let root = shared().join("testdata/profgen");
    let Ok(dirs) = std::fs::read_dir(&root) else {
        etm_testutil::skip(format!("no shared profgen data at {}", root.display()));
        return;
    };
    let mut checked = 0;
    for d in dirs.flatten().filter(|d| d.path().is_dir()) {
        let files: Vec<PathBuf> = std::fs::read_dir(d.path()).unwrap().flatten().map(|e| e.path()).collect();
        let bins: Vec<&PathBuf> = files.iter().filter(|f| f.extension().is_some_and(|e| e == "perfbin")).collect();
        if bins.len() != 1 {
            continue; // several binaries in one case: the README maps inputs to binaries
        }
        let data = std::fs::read(bins[0]).unwrap();
        let info = BinaryInfo::from_elf(&bins[0].to_string_lossy(), &data).unwrap();
        for f in files.iter().filter(|f| f.extension().is_some_and(|e| e == "perfscript" || e == "aggperfscript")) {
            let text = std::fs::read_to_string(f).unwrap();
            let mut p1 = HybridProfile::default();
            let st = read_perfscript(&text, &mut MmapResolver::new(vec![info.clone()]), &mut p1);
            if p1.binaries().is_empty() {
                continue; // no address of this input lies in the binary
            }
            let d1 = dump(&p1);
            let mut p2 = HybridProfile::default();
            let st2 = read_perfscript(&d1, &mut MmapResolver::new(vec![info.clone()]), &mut p2);
            let d2 = dump(&p2);
            assert_eq!(d1, d2, "{}: dump of the re-read dump differs", f.display());
            assert_eq!(st2.rejected_samples, 0, "{}: our dump has rejected samples", f.display());
            let accepted = st.hybrid_samples + st.branch_only_samples;
            // Samples with no branch left in the binary's view are not written (llvm-profgen
            // drops them too).
            let written = counted(&d1);
            assert!(written > 0 && written <= accepted, "{}: {written} written of {accepted}", f.display());
            assert_eq!(written, p2.total_samples(), "{}: re-read sample count", f.display());
            checked += 1;
        }
    }
    assert!(checked >= 10, "only {checked} inputs checked");
}
