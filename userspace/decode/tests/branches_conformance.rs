//! The taken branches the decoder hands to a sink that takes branches instead of ranges
//! (`ElementSink::takes_branches`: perf's rule applied in the decoder, from the records its
//! run cache stores with each run) are those perf's rule makes from the element stream, element
//! by element (`BranchBuilder`, which `perf_data.rs` checks against simpleperf), on every
//! buffer of every real capture under `$ETM_BPF_SHARED/testdata/etm` over its own code image:
//! pushed in 4 KiB pieces and cut at seeded random points.

use etm_decode::pipeline::fuzz::branches_agree;
use etm_decode::pipeline::{BufferDecoder, snapshot_image};
use etm_decode::snapshot::{DirFiles, Snapshot, SnapshotFiles};

mod common;
use common::{shared_dir, snapshot_dirs};

#[test]
fn decoder_branches_are_the_elements_branches() {
    let etm = shared_dir().join("testdata/etm");
    if !etm.is_dir() {
        etm_testutil::skip(format!("{} not found (set ETM_BPF_SHARED)", etm.display()));
        return;
    }
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let (mut buffers, mut records) = (0, 0);
    for dir in snapshot_dirs(&etm) {
        let files = DirFiles::new(&dir);
        let snap = Snapshot::parse(&files).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        let (img, _missing) = snapshot_image(&snap, &files);
        for buf in &snap.buffers {
            let Ok(data) = files.read(&buf.file) else { continue };
            let make = || BufferDecoder::for_snapshot(&snap, buf);
            let pieces: Vec<usize> = (4096..data.len()).step_by(4096).collect();
            let mut cuts = Vec::new();
            let mut at = 0;
            while at < data.len() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                at += 1 + (x % 97) as usize;
                cuts.push(at);
            }
            let n = branches_agree(&make, &data, &pieces, &img);
            assert_eq!(branches_agree(&make, &data, &cuts, &img), n, "{} {}", dir.display(), buf.name);
            eprintln!("{:<50} {:<12} {n:>8} records", dir.file_name().unwrap().to_string_lossy(), buf.name);
            buffers += 1;
            records += n;
        }
    }
    assert!(buffers >= 40, "{buffers} buffers");
    // (the captures take many taken branches through the decoder's stored runs)
    assert!(records > 100_000, "{records} records");
}

/// The same on mutated pieces of real captures over their own code (bytes flipped, inserted,
/// deleted), where decode errors cut packets whose first runs came from the run cache.
#[test]
fn decoder_branches_survive_mutations() {
    let etm = shared_dir().join("testdata/etm");
    if !etm.is_dir() {
        etm_testutil::skip(format!("{} not found (set ETM_BPF_SHARED)", etm.display()));
        return;
    }
    let mut x: u64 = 0x2545_F491_4F6C_DD1D;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let iters: usize = std::env::var("DECODE_FUZZ_ITERS").ok().and_then(|v| v.parse().ok()).unwrap_or(3000) / 10;
    let mut records = 0;
    for name in ["bugfix-exact-match", "juno_r1_1", "juno-ret-stck", "ete_ip"] {
        let dir = etm.join(name);
        let files = DirFiles::new(&dir);
        let snap = Snapshot::parse(&files).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        let (img, _missing) = snapshot_image(&snap, &files);
        let buf = snap.first_buffer().unwrap();
        let src = files.read(&buf.file).unwrap();
        let make = || BufferDecoder::for_snapshot(&snap, buf);
        for _ in 0..iters {
            let len = 64 + (next() % 8192) as usize;
            let off = (next() as usize) % src.len().saturating_sub(len).max(1);
            let mut d = src[off..(off + len).min(src.len())].to_vec();
            for _ in 0..(1 + next() % 6) {
                let p = (next() as usize) % d.len();
                match next() % 3 {
                    0 => d[p] ^= 1 << (next() % 8),
                    1 => d.insert(p, next() as u8),
                    _ => {
                        d.remove(p);
                    }
                }
            }
            let cuts: Vec<usize> = (0..d.len()).step_by(1 + (next() % 61) as usize).skip(1).collect();
            records += branches_agree(&make, &d, &[], &img);
            branches_agree(&make, &d, &cuts, &img);
        }
    }
    assert!(records > 10_000, "{records} records");
}
