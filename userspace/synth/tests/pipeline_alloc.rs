//! The pipeline's steady state allocates only for what is new: after a warm-up half of a
//! synthetic session (loops: the same code over and over), pushing the second half's AUX
//! records and samples (decode, join, validation, profile, context trie) allocates at most a
//! few times per new distinct profile sample or trie context, and nothing per window
//! otherwise; with the exact counts (the decoder hands ranges) and without (it hands taken
//! branches). Counted with a global allocator wrapper on the pushing thread only.

use std::sync::Arc;

use etm_session::pipeline::{Pipeline, PipelineConfig};
use etm_session::session::{SessionEvent, SessionReader};
use etm_synth::generate::{SynthConfig, synthesize};
use etm_synth::image::CodeImage;
use etm_synth::qemu::{self, QemuOptions};
use etm_synth::session_out::write_session;
use etm_synth::testprogs::{self, BuildError, Compiler, PROGRAMS};

#[global_allocator]
static A: etm_testutil::CountingAlloc = etm_testutil::CountingAlloc;

/// An owned copy of a session event.
enum Ev {
    Aux(etm_session::session::AuxRecord, Vec<u8>),
    Sample(etm_session::session::PauseSample),
    Side(etm_session::session::Sideband),
}

#[test]
fn steady_state_allocates_only_for_new_contexts() {
    if let Err(e) = testprogs::qemu_available() {
        return etm_testutil::skip(e);
    }
    let tmp = tempfile::tempdir().unwrap();
    let prog = PROGRAMS.iter().find(|p| p.name == "loops").unwrap();
    let bin = match testprogs::build(prog, Compiler::Gcc, tmp.path()) {
        Ok(b) => b,
        Err(BuildError::Missing(why)) => return etm_testutil::skip(why),
        Err(e) => panic!("{e}"),
    };
    let args = vec!["160".to_string()];
    let run = qemu::run(&bin, &args, &QemuOptions::default()).unwrap();
    let mut image = CodeImage::load(&bin).unwrap();
    let syn = synthesize(&mut image, &run.pcs, &SynthConfig { window: 1000, period: 3000, ..SynthConfig::default() });
    let dir = tmp.path().join("s");
    write_session(&dir, &bin, &args, run.exit_code, &image, &syn).unwrap();
    let mut r = SessionReader::open(&dir).unwrap();
    let mut evs = Vec::new();
    while let Some(ev) = r.next_event().unwrap() {
        evs.push(match ev {
            SessionEvent::Aux { record, data } => Ev::Aux(record, data.to_vec()),
            SessionEvent::Sample(s) => Ev::Sample(s.clone()),
            SessionEvent::Sideband(s) => Ev::Side(s.clone()),
        });
    }
    let windows = evs.iter().filter(|e| matches!(e, Ev::Aux(..))).count();
    assert!(windows >= 400, "{windows} windows");
    for exact in [true, false] {
        let mut cfg = PipelineConfig::from_meta(r.meta());
        cfg.exact = exact;
        let mut p = Pipeline::new(cfg);
        p.add_image(&bin.to_string_lossy(), Arc::new(std::fs::read(&bin).unwrap()));
        let push = |p: &mut Pipeline, e: &Ev| match e {
            Ev::Aux(rec, d) => p.push(SessionEvent::Aux { record: *rec, data: d }),
            Ev::Sample(s) => p.push(SessionEvent::Sample(s)),
            Ev::Side(s) => p.push(SessionEvent::Sideband(s)),
        };
        let half = evs.len() / 2;
        for e in &evs[..half] {
            push(&mut p, e);
        }
        // What the profile grows by: stored samples and counters (tuples, contexts, counts).
        let grown = |p: &Pipeline| p.profile().distinct_samples() + p.profile().distinct_entries();
        let (d0, n0) = (grown(&p), p.trie().0.len());
        let j0 = p.stats().join.joined;
        let allocs = etm_testutil::count_allocations(|| {
            for e in &evs[half..] {
                push(&mut p, e);
            }
        });
        let (d1, n1) = (grown(&p), p.trie().0.len());
        let joined = p.stats().join.joined - j0;
        let new = (d1 - d0) + (n1 - n0);
        eprintln!(
            "exact counts {exact}: second half: {joined} samples joined, {} new distinct samples or counters, {} new trie nodes, {allocs} allocations",
            d1 - d0,
            n1 - n0
        );
        assert!(joined >= 150, "{joined}");
        assert!(
            allocs <= 4 * new as u64 + 8,
            "exact counts {exact}: {allocs} allocations for {new} new samples/contexts over {joined} windows"
        );
    }
}
