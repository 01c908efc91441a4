//! Deterministic fuzzing of the full decoder (deformatter + packet parser + instruction-level
//! decoder over a fixed code image) without cargo-fuzz: real captures, mutated with a seeded
//! PRNG (byte flips, insertions, deletions, splices), must never panic, must give the same
//! elements whole and chunked, and must stay within a bounded element count per input byte.

use etm_decode::pipeline::fuzz::{check_with, code_image};

mod common;
use common::shared_dir;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Mutated real captures never panic, decode identically in chunks, and produce a bounded
/// number of elements.
#[test]
fn decoder_survives_mutated_captures() {
    let etm = shared_dir().join("testdata/etm");
    let mut seeds: Vec<(u8, Vec<u8>)> = Vec::new();
    for (f, fmt) in [
        ("juno_r1_1/cstrace.bin", 0u8),
        ("bugfix-exact-match/cstrace.bin", 0),
        ("ete_ip/session1.bin", 5),
        ("src_addr/session1.bin", 5),
        ("texit-poe2/session1.bin", 5),
        ("q_elem/session1.bin", 5),
        ("maxspec78_commopt0/session1.bin", 5),
    ] {
        if let Ok(d) = std::fs::read(etm.join(f)) {
            seeds.push((fmt, d));
        }
    }
    if seeds.is_empty() {
        etm_testutil::skip(format!("no captures under {} (set ETM_BPF_SHARED)", etm.display()));
        return;
    }
    let img = code_image();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let iters = std::env::var("DECODE_FUZZ_ITERS").ok().and_then(|v| v.parse().ok()).unwrap_or(3000u32);
    let mut total = 0u64;
    for i in 0..iters {
        let (fmt, src) = &seeds[i as usize % seeds.len()];
        let len = 16 + (rng.next() % 1024) as usize;
        let off = (rng.next() as usize) % src.len().saturating_sub(len).max(1);
        let mut d: Vec<u8> = vec![*fmt ^ (rng.next() as u8 & 0x08), rng.next() as u8, rng.next() as u8, rng.next() as u8];
        d.extend_from_slice(&src[off..(off + len).min(src.len())]);
        for _ in 0..(rng.next() % 8) {
            let p = 4 + (rng.next() as usize) % (d.len() - 4);
            match rng.next() % 4 {
                0 => d[p] ^= 1 << (rng.next() % 8),
                1 => d[p] = rng.next() as u8,
                2 => d.insert(p, rng.next() as u8),
                _ => {
                    d.remove(p);
                }
            }
        }
        let n = check_with(&d, &img);
        assert!(n <= 64 * d.len() as u64 + 64, "element explosion: {n} elements from {} bytes", d.len());
        total += n;
    }
    eprintln!("{iters} mutated inputs, {total} elements");
}
