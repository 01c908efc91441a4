//! Aggregation cost of `ContextTrie::add`: N samples over C distinct contexts of depth 8-39
//! (frames drawn from 5000 functions, a skewed choice of context per sample), then the folded
//! and pprof writers on the result. Usage: bench_trie [SAMPLES] [CONTEXTS] [MAX_NODES]
use std::time::Instant;

use etm_stacks::{Frame, FrameTable, trie::ContextTrie};

fn main() {
    let mut args = std::env::args().skip(1).map(|a| a.parse::<usize>().expect("number"));
    let samples = args.next().unwrap_or(1_000_000);
    let contexts = args.next().unwrap_or(20_000);
    let max_nodes = args.next().unwrap_or(200_000);
    let mut frames = FrameTable::new();
    let ids: Vec<u32> = (0..5000).map(|i| frames.intern(Frame::new(format!("fn_{i}"), Some(0)))).collect();
    // xorshift: deterministic contexts sharing prefixes (a few roots, many leaves).
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut rnd = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let paths: Vec<Vec<u32>> = (0..contexts)
        .map(|_| {
            let depth = 8 + (rnd() % 32) as usize;
            (0..depth).map(|d| ids[((rnd() % (4 << d.min(10))) as usize) % ids.len()]).collect()
        })
        .collect();
    let mut trie = ContextTrie::new(max_nodes);
    let t = Instant::now();
    for _ in 0..samples {
        // Skewed: low indices much more often.
        let r = rnd();
        let i = ((r % contexts as u64) * ((r >> 32) % contexts as u64) / contexts as u64) as usize;
        trie.add(&paths[i], 1);
    }
    let add = t.elapsed();
    let t = Instant::now();
    let mut out = Vec::new();
    etm_stacks::folded::write_folded(&trie, &frames, &mut out).unwrap();
    let folded = t.elapsed();
    let s = trie.stats();
    println!(
        "{samples} samples, {contexts} contexts: add {:.0} ns/sample ({:.2} s); nodes {} folded {} compactions {}; folded {:.3} s ({} KiB)",
        add.as_nanos() as f64 / samples as f64,
        add.as_secs_f64(),
        s.nodes,
        s.folded_samples,
        s.compactions,
        folded.as_secs_f64(),
        out.len() / 1024
    );
}
