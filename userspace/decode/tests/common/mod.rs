//! Helpers shared by the decoder's integration tests (test data location, reference files).
#![allow(dead_code)] // each test binary uses a subset

use std::path::{Path, PathBuf};

/// `$ETM_BPF_SHARED`, else `<repo>/../shared`.
pub fn shared_dir() -> PathBuf {
    match std::env::var_os("ETM_BPF_SHARED") {
        Some(p) => PathBuf::from(p),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared"),
    }
}

pub fn xz_text(path: &Path) -> String {
    let data = std::fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let mut out = Vec::new();
    lzma_rs::xz_decompress(&mut &data[..], &mut out).unwrap_or_else(|e| panic!("xz {}: {e:?}", path.display()));
    String::from_utf8_lossy(&out).into_owned()
}

pub fn norm(l: &str) -> String {
    l.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Number of lines matched by a greedy alignment that resynchronises within a window.
pub fn matched_lines(a: &[String], b: &[String]) -> usize {
    let (mut i, mut j, mut m) = (0, 0, 0);
    while i < a.len() && j < b.len() {
        if a[i] == b[j] {
            m += 1;
            i += 1;
            j += 1;
            continue;
        }
        let mut found = None;
        'w: for d in 1..64 {
            for (di, dj) in [(d, 0), (0, d), (d, d)] {
                if i + di < a.len() && j + dj < b.len() && a[i + di] == b[j + dj] {
                    found = Some((di, dj));
                    break 'w;
                }
            }
        }
        match found {
            Some((di, dj)) => {
                i += di;
                j += dj;
            }
            None => {
                i += 1;
                j += 1;
            }
        }
    }
    m
}

/// Snapshot directories (holding a `snapshot.ini`) directly under `etm` or one level deeper
/// (e.g. `perf-data/*.snapshot`), sorted.
pub fn snapshot_dirs(etm: &Path) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    for e in std::fs::read_dir(etm).unwrap().flatten() {
        let p = e.path();
        if p.join("snapshot.ini").is_file() {
            dirs.push(p.clone());
        }
        if p.is_dir() {
            for e2 in std::fs::read_dir(&p).unwrap().flatten() {
                if e2.path().join("snapshot.ini").is_file() {
                    dirs.push(e2.path());
                }
            }
        }
    }
    dirs.sort();
    dirs
}
