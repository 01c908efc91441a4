//! Benchmark of the profile model: aggregation cost per hybrid sample (new and already-seen
//! samples), the copy a dump takes on the drain loop, dump time of the three writers, and peak
//! memory, for a large synthetic profile (random addresses: nearly every branch tuple is new,
//! the worst case for the counters). The sample store keeps every sample (as the store the
//! dumps came from before the counters) so its size and copy can be set beside the counters'.
//! Run with `bench/profile.sh` (release build). Arguments: SAMPLES CONTEXTS (default 1000000
//! 100000).

use std::time::Instant;

use etm_profile::{BinaryInfo, Branch, ExecSegment, HybridProfile, HybridSample, IdentityResolver, KeepSamples, ProfileLimits};
use etm_write::pgo::{write_bolt_pa, write_perfscript, write_unsymbolized};

/// Deterministic xorshift generator.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn peak_rss_kib() -> u64 {
    etm_testutil::self_status_kib("VmHWM")
}

/// Process CPU time (user + system) in seconds: wall time is unreliable on a shared 2-core
/// machine.
fn cpu_s() -> f64 {
    etm_testutil::cpu_seconds(std::process::id()).unwrap_or(0.0)
}

struct Clock(Instant, f64);
impl Clock {
    fn start() -> Self {
        Clock(Instant::now(), cpu_s())
    }
    /// (wall seconds, cpu seconds)
    fn stop(&self) -> (f64, f64) {
        (self.0.elapsed().as_secs_f64(), cpu_s() - self.1)
    }
}

fn main() {
    let a: Vec<u64> = std::env::args().skip(1).filter_map(|s| s.parse().ok()).collect();
    let samples = a.first().copied().unwrap_or(1_000_000) as usize;
    let contexts = a.get(1).copied().unwrap_or(100_000) as usize;
    let base = 0x40_0000u64;
    let text = 0x10_0000u64;
    let bin = BinaryInfo {
        path: "/bench/app".into(),
        build_id: Some(vec![0xab; 20]),
        exec_segments: vec![ExecSegment { vaddr: base, memsz: text, offset: 0 }],
        code_ranges: vec![(base, base + text)],
        is_pie: false,
    };
    let r = IdentityResolver::new(vec![bin]);
    // Pre-generate the distinct samples: stacks of depth 4..20, 16 branches each.
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut stacks: Vec<Vec<u64>> = Vec::with_capacity(contexts);
    let mut lbrs: Vec<Vec<Branch>> = Vec::with_capacity(contexts);
    for _ in 0..contexts {
        let depth = 4 + (rng.next() % 16) as usize;
        stacks.push((0..depth).map(|_| base + rng.next() % text).collect());
        lbrs.push(
            (0..16)
                .map(|_| {
                    let from = base + rng.next() % text;
                    Branch { from, to: base + rng.next() % text }
                })
                .collect(),
        );
    }
    let before = peak_rss_kib();
    let mut p = HybridProfile::new(ProfileLimits { keep_samples: KeepSamples::All, ..Default::default() });
    // Skewed order: context i drawn with a power-law-ish distribution.
    let order: Vec<usize> = (0..samples)
        .map(|i| {
            if i < contexts {
                i
            } else {
                ((rng.next() % contexts as u64) * (rng.next() % contexts as u64) / contexts as u64) as usize
            }
        })
        .collect();
    let n_new = contexts.min(samples);
    let t = Clock::start();
    for &i in &order[..n_new] {
        p.add(&HybridSample { stack: &stacks[i], branches: &lbrs[i] }, &r);
    }
    let first = t.stop();
    let t = Clock::start();
    for &i in &order[n_new..] {
        p.add(&HybridSample { stack: &stacks[i], branches: &lbrs[i] }, &r);
    }
    let seen = t.stop();
    let n_seen = samples - n_new;
    let a = p.agg(0);
    println!(
        "samples: {samples}, distinct samples: {}, tuples {}, contexts {}, counts {}",
        p.distinct_samples(),
        a.tuples().len(),
        a.context_count(),
        a.count_entries()
    );
    let ns = |s: f64, n: usize| s * 1e9 / n.max(1) as f64;
    println!(
        "aggregation (wall/cpu ns per sample): new {:.0}/{:.0}, already-seen {:.0}/{:.0}",
        ns(first.0, n_new),
        ns(first.1, n_new),
        ns(seen.0, n_seen),
        ns(seen.1, n_seen)
    );
    println!(
        "model bytes: counters {} MiB accounted, sample store {} MiB accounted, {} MiB allocated in all",
        p.accounted_bytes() >> 20,
        p.sample_bytes() >> 20,
        p.bytes_used() >> 20
    );
    // The copy a dump takes on the drain loop: the whole profile, and without the sample store.
    let t = Clock::start();
    let copy = p.clone();
    let whole = t.stop();
    drop(copy);
    let mut counters_only = HybridProfile::new(ProfileLimits { max_sample_bytes: 0, ..Default::default() });
    counters_only.merge(&p);
    let t = Clock::start();
    let copy = counters_only.clone();
    let lean = t.stop();
    drop((copy, counters_only));
    println!(
        "snapshot copy (wall/cpu ms): with the sample store {:.1}/{:.1}, counters only {:.1}/{:.1}",
        whole.0 * 1e3,
        whole.1 * 1e3,
        lean.0 * 1e3,
        lean.1 * 1e3
    );
    let dir = std::env::temp_dir().join(format!("etm-bench-profile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let t = Clock::start();
    let mut f = std::io::BufWriter::new(std::fs::File::create(dir.join("app.perfscript")).unwrap());
    write_perfscript(&p, 0, &mut f).unwrap();
    drop(f);
    let ps = t.stop();
    let t = Clock::start();
    let f = std::io::BufWriter::new(std::fs::File::create(dir.join("app.unsym.txt")).unwrap());
    write_unsymbolized(&p, 0, f).unwrap();
    let un = t.stop();
    let t = Clock::start();
    let f = std::io::BufWriter::new(std::fs::File::create(dir.join("app.bolt.pa")).unwrap());
    write_bolt_pa(&p, 0, f).unwrap();
    let bo = t.stop();
    let size = |n: &str| std::fs::metadata(dir.join(n)).map(|m| m.len() >> 20).unwrap_or(0);
    println!(
        "dump (wall/cpu s): perfscript {:.2}/{:.2} ({} MiB), unsym {:.2}/{:.2} ({} MiB), bolt.pa {:.2}/{:.2} ({} MiB)",
        ps.0,
        ps.1,
        size("app.perfscript"),
        un.0,
        un.1,
        size("app.unsym.txt"),
        bo.0,
        bo.1,
        size("app.bolt.pa")
    );
    println!("peak RSS: {} MiB (input generation alone: {} MiB)", peak_rss_kib() >> 10, before >> 10);
    let _ = std::fs::remove_dir_all(&dir);
}
