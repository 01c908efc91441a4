//! Sessions shaped like hardware, replayed by the binary: the driver model (`etm_synth::hw`)
//! runs three processes on four CPUs into TRBE, shared-ETR and throttled rings, the live
//! collector drains them, and every event it hands the pipeline is recorded as a session
//! (`etm_synth::hw_run`, the same events `run --record` writes). `etm-bpf replay` on that
//! directory must
//!
//! * join exactly the samples the live-side pipeline joined, with the same branches (one
//!   pipeline, two drivers), and
//! * match the model's ground truth for the target (`hw_truth.jsonl`): every joined sample has
//!   its own thread's window branches, none another process's, and every pause sample that
//!   closed a complete window is joined (complete: its trace arrived whole and so did what
//!   shows its end; `hw::Loss` says why the others are not).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use etm_bpf_tests::{assert_same_files, etm_bpf_bin};
use etm_live::collect::{Delivery, Strategy};
use etm_session::session::BranchPair;
use etm_synth::hw::{ModelConfig, Topology};
use etm_synth::hw_run::{self, Built, Joined, RunOptions, TRUTH_FILE};
use etm_synth::testprogs::BuildError;

fn programs() -> Option<&'static Vec<Built>> {
    static P: OnceLock<Option<Vec<Built>>> = OnceLock::new();
    P.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("etm-replay-hw-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        match hw_run::build_programs(&dir) {
            Ok(p) => Some(p),
            Err(BuildError::Missing(why)) => {
                etm_testutil::skip(why);
                None
            }
            Err(e) => panic!("{e}"),
        }
    })
    .as_ref()
}

/// `etm-bpf replay DIR --samples-out --dump-dir --decode-threads N`: the joined pause samples
/// in join order (the synthesized ones, which the model's live pipeline does not make, left
/// out), the JSON summary, and the dumps' directory.
fn replay(session: &Path, threads: usize) -> (Vec<Joined>, serde_json::Value, PathBuf) {
    let out = session.with_extension(format!("t{threads}.samples.jsonl"));
    let dumps = session.with_extension(format!("t{threads}.dumps"));
    let o = Command::new(etm_bpf_bin())
        .arg("replay")
        .arg(session)
        .args(["--headless", "--json", "--decode-threads", &threads.to_string(), "--samples-out"])
        .arg(&out)
        .arg("--dump-dir")
        .arg(&dumps)
        .output()
        .expect("run etm-bpf replay");
    assert!(o.status.success(), "replay failed: {}", String::from_utf8_lossy(&o.stderr));
    let summary: serde_json::Value = serde_json::from_slice(&o.stdout).expect("--json summary");
    let text = std::fs::read_to_string(&out).expect("samples written");
    let joined = text
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v["synth"] == 0)
        .map(|v| {
            let branches = v["branches"]
                .as_array()
                .unwrap()
                .iter()
                .map(|b| BranchPair { from: b["from"].as_u64().unwrap(), to: b["to"].as_u64().unwrap() })
                .collect();
            (v["cpu"].as_i64().unwrap() as i32, v["time"].as_u64().unwrap(), v["tid"].as_u64().unwrap() as u32, branches)
        })
        .collect();
    (joined, summary, dumps)
}

fn record_and_replay(
    label: &str,
    cfg: ModelConfig,
    delivery: Delivery,
    harvest_ms: u64,
    drain_ns: u64,
) -> Option<serde_json::Value> {
    let progs = programs()?;
    let work = tempfile::Builder::new().prefix(&format!("replay-hw-{label}-")).tempdir().unwrap();
    let dir = work.path().join("session");
    let opts = RunOptions {
        strategy: Strategy { delivery, harvest_every_ns: Some(harvest_ms * 1_000_000) },
        duration_ns: 60_000_000,
        drain_ns,
        complete_by_sample_time: false,
        record: Some(dir.clone()),
        tasks: None,
    };
    let live = hw_run::run(progs, cfg, &opts).expect("model run");
    let (mut replayed, summary, dumps) = replay(&dir, 1);
    // The per-CPU streams decoded on two worker threads: the same joins in the same order,
    // the same counters, the same dumps.
    let (replayed2, summary2, dumps2) = replay(&dir, 2);
    assert!(replayed2 == replayed, "{label}: 2 decode threads joined other samples or branches, or in another order");
    let strip = |mut s: serde_json::Value| {
        s.as_object_mut().unwrap().remove("elapsed_s");
        s
    };
    assert_eq!(strip(summary2), strip(summary.clone()), "{label}: counters with 2 decode threads");
    assert_eq!(summary["decode"]["worker_failures"], 0, "{label}: {summary}");
    assert_same_files(&dumps, &dumps2, 5, &format!("{label}, 1 and 2 decode threads"));
    let truth = hw_run::read_truth(&dir.join(TRUTH_FILE)).expect("truth file");
    assert_eq!(truth, live.truth, "{label}: the truth file holds the model's truth");
    // One pipeline, two drivers: the same samples with the same branches.
    let mut live_joined = live.joined.clone();
    live_joined.sort_by_key(|j| (j.0, j.1));
    replayed.sort_by_key(|j| (j.0, j.1));
    assert_eq!(
        replayed.len(),
        live_joined.len(),
        "{label}: replay joined {} samples, live {}",
        replayed.len(),
        live_joined.len()
    );
    assert!(replayed == live_joined, "{label}: replay joined other samples or branches than the live pipeline");
    let c = hw_run::check(&truth, &replayed);
    assert!(c.wrong.is_empty(), "{label}: {} wrong joins, first: {}", c.wrong.len(), c.wrong[0]);
    assert!(c.complete >= 100, "{label}: only {} complete windows", c.complete);
    assert_eq!(c.joined_complete, c.complete, "{label}: complete windows not joined ({c:?})");
    eprintln!("{label}: {} windows, {} complete, {:.1}% joined; losses {:?}", c.windows, c.complete, 100.0 * c.share(), c.losses);
    let j = &summary["join"];
    eprintln!(
        "{label}: synthesized {} rejected {} {} stops {}",
        j["synthesized"], j["synth_rejected"], j["synth_rejected_by_reason"], j["synth_stops_by_reason"]
    );
    // The model's windows of several processes and threads give synthesized samples (the
    // replay's default) and none contradicts its window's branches.
    assert!(j["synthesized"].as_u64().unwrap() > 0 && j["synth_rejected"] == 0, "{label}: {j}");
    Some(summary)
}

/// TRBE per CPU: RAW records at the watermark with COLLISION, padding, harvests.
#[test]
fn trbe_session_replays_to_truth() {
    let cfg = ModelConfig { topology: Topology::Trbe, ..ModelConfig::default() };
    let Some(s) = record_and_replay("trbe", cfg, Delivery::Watermark, 20, 5_000_000) else { return };
    assert!(s["aux"]["collision_resets"].as_u64().unwrap() > 0, "COLLISION records replayed: {s}");
}

/// One ETR for four CPUs: formatted frames of every trace ID, harvested, in the last CPU's ring.
#[test]
fn shared_etr_session_replays_to_truth() {
    let cfg = ModelConfig { topology: Topology::SharedEtr, etr_bytes: 8 << 20, aux_bytes: 8 << 20, ..ModelConfig::default() };
    record_and_replay("shared-etr", cfg, Delivery::Harvest, 10, 5_000_000);
}

/// Throttled groups (THROTTLE records, reopened groups): nothing joined across the gaps.
#[test]
fn throttled_session_replays_to_truth() {
    let cfg = ModelConfig { topology: Topology::Trbe, throttle: Some((500, 4_000_000)), ..ModelConfig::default() };
    let Some(s) = record_and_replay("throttled", cfg, Delivery::Watermark, 20, 2_000_000) else { return };
    assert!(s["join"]["rejected_by_reason"]["throttled"].as_u64().unwrap_or(0) > 0, "throttled samples counted: {s}");
    assert!(s["sideband"]["throttles"].as_u64().unwrap() > 0, "THROTTLE records replayed: {s}");
}
