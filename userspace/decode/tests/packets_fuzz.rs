//! Deterministic fuzzing of the deformatter + packet parser (the same body as the cargo-fuzz
//! target `fuzz/fuzz_targets/packets.rs`): 200,000 inputs mutated from slices of the real
//! captures (or from synthetic seeds when the test data is absent). Each input runs once whole
//! and once split at pseudo-random chunk boundaries; any panic or any difference between the
//! two runs fails the test. Run with `--release` (the suite does); debug builds run 1/10th.

use etm_decode::packet::fuzz::check;

mod common;
use common::shared_dir;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Seed byte streams: the trace buffers of the snapshots (whole files), or synthetic data.
fn seeds() -> Vec<Vec<u8>> {
    let etm = shared_dir().join("testdata/etm");
    let mut v = Vec::new();
    for name in [
        "juno_r1_1/cstrace.bin",
        "a55-test-tpiu/DSTREAM_0.bin",
        "ete_ip/session1.bin",
        "src_addr/session1.bin",
        "texit-poe2/session1.bin",
        "maxspec78_commopt0/session1.bin",
        "q_elem/session2.bin",
        "tme_test/session1.bin",
        "perf-data/perf_kernel.snapshot/aux_cpu6.bin",
    ] {
        if let Ok(d) = std::fs::read(etm.join(name)) {
            v.push(d);
        }
    }
    if v.is_empty() {
        eprintln!("NOTE: no captures under {}; using synthetic seeds only", etm.display());
    }
    let mut syn = vec![0u8; 11];
    syn.push(0x80);
    syn.extend([0x01, 0x00, 0x04, 0x85, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x31]);
    syn.extend((0..200u32).map(|i| (i * 37 % 251) as u8));
    v.push(syn);
    v
}

/// 200k mutated inputs run through `check` without a panic or a chunking difference.
#[test]
fn fuzz_packets_deterministic() {
    let n: usize = if cfg!(debug_assertions) { 20_000 } else { 200_000 };
    let seeds = seeds();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut input = Vec::with_capacity(1024);
    let mut packets = 0u64;
    let mut errors = 0u64;
    let start = std::time::Instant::now();
    for _ in 0..n {
        let seed = &seeds[rng.below(seeds.len())];
        let len = 8 + rng.below(400);
        let off = rng.below(seed.len().saturating_sub(len));
        input.clear();
        // selector bytes: format/protocol/config, then a split seed
        for _ in 0..7 {
            input.push(rng.next() as u8);
        }
        input.extend_from_slice(&seed[off..(off + len).min(seed.len())]);
        // mutations
        for _ in 0..rng.below(6) {
            let l = input.len();
            match rng.below(5) {
                0 => {
                    let i = 7 + rng.below(l - 7);
                    input[i] ^= 1 << rng.below(8);
                }
                1 => {
                    let i = 7 + rng.below(l - 7);
                    input[i] = rng.next() as u8;
                }
                2 => {
                    let i = 7 + rng.below(l - 7);
                    input.insert(i, rng.next() as u8);
                }
                3 if l > 8 => {
                    let i = 7 + rng.below(l - 7);
                    input.remove(i);
                }
                _ => {
                    // splice a run of A-sync / FSYNC / 0x00 bytes
                    let i = 7 + rng.below(l - 7);
                    let pat: &[u8] = match rng.below(3) {
                        0 => &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x80],
                        1 => &[0xFF, 0xFF, 0xFF, 0x7F],
                        _ => &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
                    };
                    for (k, b) in pat.iter().enumerate() {
                        input.insert(i + k, *b);
                    }
                }
            }
        }
        let o = check(&input);
        packets += o.packets;
        errors += o.errors;
    }
    eprintln!("{n} inputs, {packets} packets ({errors} error packets) in {:.2?}", start.elapsed());
    assert!(packets > 0, "the corpus produced no packets at all");
}
