//! End to end: `etm-bpf synth` runs real AArch64 programs under qemu and writes ETE sessions
//! with ground truth; `etm-bpf replay` feeds them through the live pipeline (decoder -> join ->
//! profile). The checks are against the generator's ground truth (`ground_truth.jsonl`, the
//! executed path recorded by qemu), never against our own earlier output:
//!
//! * every joined sample's branch records equal the true last N branches before that pause,
//!   and its stack equals the true call stack;
//! * every sample whose window has a branch is joined (no reject on clean sessions);
//! * the profile's branch and range counts (from its perf-script dump) equal the ground-truth
//!   counts over the sampled windows;
//! * injected faults (truncated AUX record, lost records, a flipped byte, a removed sync) are
//!   counted and the samples of untouched windows are still exactly right.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;

use etm_bpf_tests::{assert_same_files, etm_bpf_bin};
use etm_synth::gtfile::{self, GroundTruth};
use etm_synth::testprogs::{self, Compiler, PROGRAMS};

const DEPTH: usize = 32;

/// Build a test program (gcc) or print why not.
fn build(name: &str, dir: &Path) -> Option<PathBuf> {
    if let Err(e) = testprogs::qemu_available() {
        etm_testutil::skip(e);
        return None;
    }
    let prog = PROGRAMS.iter().find(|p| p.name == name).expect("known program");
    match testprogs::build(prog, Compiler::Gcc, dir) {
        Ok(p) => Some(p),
        Err(testprogs::BuildError::Missing(m)) => {
            etm_testutil::skip(m);
            None
        }
        Err(e) => panic!("{e}"),
    }
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().expect("run etm-bpf");
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

fn synth(prog: &Path, args: &[&str], out: &Path, window: u64, period: u64, retstack: bool) -> GroundTruth {
    let mut c = Command::new(etm_bpf_bin());
    c.arg("synth").arg("--out").arg(out).args(["--window", &window.to_string(), "--period", &period.to_string()]);
    if !retstack {
        c.arg("--no-retstack");
    }
    c.arg("--").arg(prog).args(args);
    run(&mut c);
    let f = std::fs::File::open(out.join("ground_truth.jsonl")).expect("ground truth written");
    gtfile::read(std::io::BufReader::new(f)).expect("ground truth parses")
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Sample {
    time: u64,
    stack: Vec<u64>,
    branches: Vec<(u64, u64)>,
}

struct Replay {
    stats: serde_json::Value,
    /// The pause samples.
    samples: Vec<Sample>,
    /// The synthesized samples: (k, sample), the window's k-th back from its pause.
    synth: Vec<(u64, Sample)>,
    dumps: PathBuf,
}

fn replay(session: &Path, work: &Path, tag: &str) -> Replay {
    replay_with(session, work, tag, &[])
}

fn replay_with(session: &Path, work: &Path, tag: &str, extra: &[&str]) -> Replay {
    let samples_path = work.join(format!("{tag}.samples.jsonl"));
    let dumps = work.join(format!("{tag}.dumps"));
    let mut c = Command::new(etm_bpf_bin());
    // Every binary's perf-script dump: the tests read the samples in it.
    c.arg("replay").arg(session).args(["--headless", "--json", "--perfscript", "all", "--depth", &DEPTH.to_string()]);
    c.arg("--samples-out").arg(&samples_path).arg("--dump-dir").arg(&dumps).args(extra);
    let stats: serde_json::Value = serde_json::from_str(&run(&mut c)).expect("--json summary");
    let text = std::fs::read_to_string(&samples_path).expect("samples written");
    let (mut samples, mut synth) = (Vec::new(), Vec::new());
    for l in text.lines() {
        let v: serde_json::Value = serde_json::from_str(l).expect("sample line");
        let s = Sample {
            time: v["time"].as_u64().unwrap(),
            stack: v["stack"].as_array().unwrap().iter().map(|a| a.as_u64().unwrap()).collect(),
            branches: v["branches"]
                .as_array()
                .unwrap()
                .iter()
                .map(|b| (b["from"].as_u64().unwrap(), b["to"].as_u64().unwrap()))
                .collect(),
        };
        match v["synth"].as_u64().expect("synth field") {
            0 => samples.push(s),
            k => synth.push((k, s)),
        }
    }
    Replay { stats, samples, synth, dumps }
}

/// The true last-N branches of a window (newest first).
fn true_branches(w: &gtfile::GtWindow) -> Vec<(u64, u64)> {
    w.branches.iter().take(DEPTH).map(|b| (b.from, b.to)).collect()
}

/// The true branches of a window's synthesized samples (k = 1, 2, ...), newest first: the
/// window's unbroken chain up to the pause is its newest `chain_len` branches (`m`); sample k
/// is at the source of the chain's newest k * N-th branch, before it ran, with the N branches
/// before it (fewer for the oldest): floor((m - 1) / N) samples.
fn true_synth_branches(w: &gtfile::GtWindow) -> Vec<Vec<(u64, u64)>> {
    let m = w.chain_len as usize;
    (1..)
        .take_while(|k| k * DEPTH < m)
        .map(|k| w.branches[k * DEPTH..m.min((k + 1) * DEPTH)].iter().map(|b| (b.from, b.to)).collect())
        .collect()
}

/// Check every joined sample against the truth; returns how many pause samples matched. The
/// synthesized samples of each checked window: as many as [`true_synth_branches`] gives, each
/// with its branches and its leaf at the source of the branch after them.
fn check_samples(gt: &GroundTruth, r: &Replay, skip_windows: &[u64]) -> usize {
    let by_time: HashMap<u64, &gtfile::GtWindow> = gt.windows.iter().map(|w| (w.sample_time, w)).collect();
    let mut ok = 0;
    let mut synth: HashMap<u64, Vec<(u64, &Sample)>> = HashMap::new();
    for (k, s) in &r.synth {
        synth.entry(s.time).or_default().push((*k, s));
    }
    for s in &r.samples {
        let w = by_time.get(&s.time).unwrap_or_else(|| panic!("joined sample at {} has no window", s.time));
        if skip_windows.contains(&w.index) {
            continue;
        }
        assert_eq!(s.stack, w.stack, "window {}: stack differs from the true call stack", w.index);
        assert_eq!(s.branches, true_branches(w), "window {}: branches differ from the true last {DEPTH}", w.index);
        let want = true_synth_branches(w);
        let got = synth.remove(&s.time).unwrap_or_default();
        assert_eq!(got.len(), want.len(), "window {}: synthesized samples for {} branches", w.index, w.chain_len);
        for (i, (k, g)) in got.iter().enumerate() {
            assert_eq!(*k as usize, i + 1, "window {}: synthesized samples in order", w.index);
            assert_eq!(g.branches, want[i], "window {} synthesized sample {k}: branches", w.index);
            let next = &w.branches[*k as usize * DEPTH - 1];
            assert_eq!(g.stack[0], next.from, "window {} synthesized sample {k}: leaf", w.index);
        }
        ok += 1;
    }
    for (t, v) in synth {
        let w = by_time.get(&t).unwrap_or_else(|| panic!("synthesized sample at {t} has no window"));
        assert!(skip_windows.contains(&w.index), "window {}: synthesized samples {} without its pause sample", w.index, v.len());
    }
    ok
}

/// Branch and fall-through range counts from a list of (count, branches newest first).
type Counts = (BTreeMap<(u64, u64), u64>, BTreeMap<(u64, u64), u64>);

fn counts<'a>(it: impl Iterator<Item = (u64, &'a [(u64, u64)])>) -> Counts {
    let (mut br, mut rg) = (BTreeMap::new(), BTreeMap::new());
    for (n, bs) in it {
        for b in bs {
            *br.entry(*b).or_insert(0) += n;
        }
        for w in bs.windows(2) {
            // Range executed between the older branch's target and the newer branch.
            *rg.entry((w[1].1, w[0].0)).or_insert(0) += n;
        }
    }
    (br, rg)
}

/// One aggregated perf-script sample: count, stack (leaf first), branches (from, to).
type ScriptSample = (u64, Vec<u64>, Vec<(u64, u64)>);

/// Parse the aggregated perf-script dump (`<bin>.perfscript`): count line, stack lines,
/// branch-stack line.
fn perfscript_samples(path: &Path) -> Vec<ScriptSample> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut out = Vec::new();
    let mut lines = text.lines().peekable();
    while let Some(l) = lines.next() {
        let count: u64 = l.trim().parse().unwrap_or_else(|_| panic!("count line expected: {l:?}"));
        let mut stack = Vec::new();
        while let Some(s) = lines.peek().filter(|s| s.starts_with('\t')) {
            stack.push(u64::from_str_radix(s.trim(), 16).unwrap());
            lines.next();
        }
        let br_line = lines.next().expect("branch line");
        let branches = br_line
            .split_whitespace()
            .map(|t| {
                let mut p = t.split('/');
                let f = u64::from_str_radix(p.next().unwrap().trim_start_matches("0x"), 16).unwrap();
                let to = u64::from_str_radix(p.next().unwrap().trim_start_matches("0x"), 16).unwrap();
                (f, to)
            })
            .collect();
        out.push((count, stack, branches));
    }
    out
}

/// One program end to end: every sample joined and exact, profile counts exact.
fn clean_program(name: &str, args: &[&str], window: u64, period: u64, retstack: bool) {
    let tmp = tempfile::tempdir().unwrap();
    let Some(prog) = build(name, tmp.path()) else { return };
    let sess = tmp.path().join("session");
    let gt = synth(&prog, args, &sess, window, period, retstack);
    assert!(gt.windows.len() >= 5, "{name}: only {} windows", gt.windows.len());
    let r = replay(&sess, tmp.path(), "clean");
    let with_branches = gt.windows.iter().filter(|w| !w.branches.is_empty()).count();
    let matched = check_samples(&gt, &r, &[]);
    let j = &r.stats["join"];
    assert_eq!(j["rejected"], 0, "{name}: rejects on a clean session: {}", r.stats);
    assert_eq!(matched, with_branches, "{name}: every window with a branch gives a joined sample: {}", r.stats);
    assert_eq!(r.stats["decode"]["errors"], 0, "{name}: {}", r.stats);

    // Profile counts: the perf-script dump of the program's binary vs. the truth.
    let file = prog.file_name().unwrap().to_string_lossy().into_owned();
    let ps = perfscript_samples(&r.dumps.join(format!("{file}.perfscript")));
    let got = counts(ps.iter().map(|(n, _, b)| (*n, b.as_slice())));
    let mut truth: Vec<Vec<(u64, u64)>> = gt.windows.iter().map(true_branches).filter(|b| !b.is_empty()).collect();
    truth.extend(gt.windows.iter().flat_map(true_synth_branches));
    let want = counts(truth.iter().map(|b| (1, b.as_slice())));
    assert_eq!(got.0, want.0, "{name}: branch counts differ from the truth");
    assert_eq!(got.1, want.1, "{name}: range counts differ from the truth");
    let total: u64 = ps.iter().map(|p| p.0).sum();
    assert_eq!(total as usize, truth.len(), "{name}: samples in the perf-script dump");
    assert_eq!(j["synthesized"], r.synth.len(), "{name}: {}", r.stats);
    // Decoded on two worker threads: the same samples in the same order, the same dumps.
    let r2 = replay_with(&sess, tmp.path(), "threads2", &["--decode-threads", "2"]);
    assert!(r2.samples == r.samples && r2.synth == r.synth, "{name}: other samples with 2 decode threads");
    assert_same_files(&r.dumps, &r2.dumps, 5, &format!("{name}, 2 decode threads"));
    eprintln!("{name}: {} windows, {matched} samples joined and exact, {} synthesized", gt.windows.len(), r.synth.len());
}

/// Counted loops with data-dependent branches.
#[test]
fn replay_loops() {
    for retstack in [true, false] {
        clean_program("loops", &["10"], 1000, 10_000, retstack);
    }
}

/// Calls through function pointers (indirect calls and returns).
#[test]
fn replay_indirect() {
    clean_program("indirect", &[], 1000, 20_000, false);
}

/// Deep recursion: stacks and return-stack compression (with and without TRCCONFIGR.RS).
#[test]
fn replay_recursion() {
    for retstack in [true, false] {
        clean_program("recursion", &[], 1000, 20_000, retstack);
    }
}

/// A jump table (indirect jumps).
#[test]
fn replay_switch() {
    for retstack in [true, false] {
        clean_program("switch", &[], 1000, 20_000, retstack);
    }
}

/// Two code segments far apart (long addresses).
#[test]
fn replay_multi() {
    for retstack in [true, false] {
        clean_program("multi", &[], 1000, 20_000, retstack);
    }
}

/// The same with return-stack compression (TRCCONFIGR.RS, the default of `synth` and of real
/// systems that support it): returns predicted by the return stack carry no address.
#[test]
fn replay_indirect_retstack() {
    clean_program("indirect", &[], 1000, 20_000, true);
}

/// Replaying the same session twice gives byte-identical dumps (determinism).
#[test]
fn replay_is_deterministic() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(prog) = build("indirect", tmp.path()) else { return };
    let sess = tmp.path().join("session");
    synth(&prog, &[], &sess, 1000, 20_000, false);
    let a = replay(&sess, tmp.path(), "a");
    let b = replay(&sess, tmp.path(), "b");
    assert!(!a.samples.is_empty());
    assert_eq!(a.samples, b.samples);
    assert_same_files(&a.dumps, &b.dumps, 5, "two replays");
}

/// `--no-exact` leaves out the exact counts and nothing else: the same samples and the same
/// profile files, no `functions.csv` or `instructions.*`, and the manifest says so. (Without
/// them the decoders make no instruction ranges for the sink, on the main thread and in the
/// decode workers alike: the same again with two decode threads.)
#[test]
fn replay_without_exact_counts_keeps_the_profile() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(prog) = build("indirect", tmp.path()) else { return };
    let sess = tmp.path().join("session");
    synth(&prog, &[], &sess, 1000, 20_000, true);
    let a = replay(&sess, tmp.path(), "a");
    let b = replay_with(&sess, tmp.path(), "b", &["--no-exact"]);
    let c = replay_with(&sess, tmp.path(), "c", &["--no-exact", "--decode-threads", "2"]);
    assert!(!a.samples.is_empty());
    assert_eq!(a.samples, b.samples);
    assert_eq!(a.samples, c.samples);
    assert!(!a.synth.is_empty());
    assert_eq!(a.synth, b.synth);
    assert_eq!(a.synth, c.synth);
    let names = |d: &Path| -> Vec<String> {
        let mut v: Vec<String> =
            std::fs::read_dir(d).unwrap().map(|f| f.unwrap().file_name().to_string_lossy().into_owned()).collect();
        v.sort();
        v
    };
    let (na, nb) = (names(&a.dumps), names(&b.dumps));
    let exact_files = ["functions.csv", "contexts.csv", "instructions.folded", "instructions.svg"];
    for f in exact_files {
        assert!(na.iter().any(|n| n == f), "{f} missing with exact counts: {na:?}");
    }
    let expected: Vec<&String> = na.iter().filter(|n| !exact_files.contains(&n.as_str())).collect();
    assert_eq!(nb.iter().collect::<Vec<_>>(), expected);
    // The manifests without their exact summary (and the list of files written) are equal.
    let manifest = |d: &Path| -> serde_json::Value {
        fn strip(v: &mut serde_json::Value) {
            if let Some(o) = v.as_object_mut() {
                o.remove("exact");
                o.remove("files");
                o.values_mut().for_each(strip);
            }
        }
        let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(d.join("manifest.json")).unwrap()).unwrap();
        strip(&mut v);
        v
    };
    let mb: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(b.dumps.join("manifest.json")).unwrap()).unwrap();
    let exact = |v: &serde_json::Value| -> Option<serde_json::Value> {
        fn find(v: &serde_json::Value) -> Option<&serde_json::Value> {
            let o = v.as_object()?;
            o.get("exact").or_else(|| o.values().find_map(find))
        }
        find(v).cloned()
    };
    let eb = exact(&mb).expect("an exact summary in the manifest");
    assert_eq!(eb["enabled"], false, "{eb}");
    assert_eq!(eb["instructions"], 0, "{eb}");
    assert_eq!(manifest(&a.dumps), manifest(&b.dumps));
    for n in &nb {
        if n != "manifest.json" {
            for (x, how) in [(&b, "--no-exact"), (&c, "--no-exact --decode-threads 2")] {
                assert!(
                    std::fs::read(a.dumps.join(n)).unwrap() == std::fs::read(x.dumps.join(n)).unwrap(),
                    "{n} differs with {how}"
                );
            }
        }
    }
}

/// The live driver's watermark ("all trace of this CPU up to T is in") joins each sample as
/// soon as it arrives, with exactly the same result as waiting for the next window.
#[test]
fn replay_watermark_joins_early_with_same_result() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(prog) = build("indirect", tmp.path()) else { return };
    let sess = tmp.path().join("session");
    let gt = synth(&prog, &[], &sess, 1000, 20_000, true);
    let a = replay(&sess, tmp.path(), "wait");
    let b = replay_with(&sess, tmp.path(), "wm", &["--watermark"]);
    assert_eq!(a.samples, b.samples);
    assert_eq!(a.stats["join"]["by_watermark"], 0);
    assert_eq!(b.stats["join"]["by_watermark"].as_u64(), Some(gt.windows.len() as u64), "{}", b.stats);
    assert_eq!(check_samples(&gt, &b, &[]), gt.windows.iter().filter(|w| !w.branches.is_empty()).count());
}

/// Rewrite events.jsonl with `edit(line index, json) -> Some(new lines)`.
fn edit_events(sess: &Path, mut edit: impl FnMut(usize, &serde_json::Value) -> Option<Vec<serde_json::Value>>) {
    let p = sess.join("events.jsonl");
    let text = std::fs::read_to_string(&p).unwrap();
    let mut out = String::new();
    for (i, l) in text.lines().enumerate() {
        let v: serde_json::Value = serde_json::from_str(l).unwrap();
        match edit(i, &v) {
            Some(vs) => {
                for v in vs {
                    out.push_str(&v.to_string());
                    out.push('\n');
                }
            }
            None => {
                out.push_str(l);
                out.push('\n');
            }
        }
    }
    std::fs::write(&p, out).unwrap();
}

/// Faults injected into a synthetic session are counted, and every sample whose window was not
/// touched is still joined with exactly its true branches and stack.
#[test]
fn replay_faults_do_not_poison_other_samples() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(prog) = build("indirect", tmp.path()) else { return };
    let sess = tmp.path().join("session");
    let gt = synth(&prog, &[], &sess, 1000, 20_000, false);
    let n = gt.windows.len();
    assert!(n >= 12, "need windows to damage, got {n}");
    let aux = sess.join("aux").join(format!("cpu{}.bin", gt.meta.cpu));
    let mut bytes = std::fs::read(&aux).unwrap();
    // Windows to damage (by index) and how.
    let (w_flip, w_trunc, w_lost, w_nosync) = (3u64, 5u64, 7u64, 9u64);
    let win = |k: u64| gt.windows.iter().find(|w| w.index == k).unwrap();
    // 1. Flip a byte in the middle of window w_flip's trace.
    let w = win(w_flip);
    let at = (w.aux_offset + w.aux_size / 2) as usize;
    bytes[at] ^= 0x5a;
    // 4. Remove the sync: overwrite the first bytes (A-sync) of window w_nosync with zeros... an
    //    ETE A-sync is 11 x 0x00 + 0x80; replace its final 0x80 so no sync is found.
    let w = win(w_nosync);
    let start = w.aux_offset as usize;
    if let Some(pos) = bytes[start..start + 16.min(w.aux_size as usize)].iter().position(|&b| b == 0x80) {
        bytes[start + pos] = 0x00;
    }
    std::fs::write(&aux, &bytes).unwrap();
    // 2. Truncate window w_trunc's record to half, flagged truncated by the kernel.
    // 3. Lose window w_lost's AUX record and sample: a LOST record instead.
    let mut aux_seen = 0u64;
    let mut sample_seen = 0u64;
    edit_events(&sess, |_, v| match v["type"].as_str() {
        Some("aux") => {
            let k = aux_seen;
            aux_seen += 1;
            if k == w_trunc {
                let mut v = v.clone();
                v["size"] = (v["size"].as_u64().unwrap() / 2).into();
                v["flags"] = (v["flags"].as_u64().unwrap() | 1).into();
                Some(vec![v])
            } else if k == w_lost {
                Some(vec![serde_json::json!({"type": "lost", "id": 0, "lost": 2, "time": v["time"], "cpu": v["cpu"]})])
            } else {
                None
            }
        }
        Some("sample") => {
            let k = sample_seen;
            sample_seen += 1;
            (k == w_lost).then(Vec::new)
        }
        _ => None,
    });
    let r = replay(&sess, tmp.path(), "faulty");
    let damaged = [w_flip, w_trunc, w_lost, w_nosync];
    let ok = check_samples(&gt, &r, &damaged);
    let joined: Vec<u64> = r.samples.iter().map(|s| s.time).collect();
    let missing: Vec<u64> = gt
        .windows
        .iter()
        .filter(|w| !damaged.contains(&w.index) && !w.branches.is_empty() && !joined.contains(&w.sample_time))
        .map(|w| w.index)
        .collect();
    assert!(missing.is_empty(), "intact windows {missing:?} not joined: {}", r.stats);
    let intact = gt.windows.iter().filter(|w| !damaged.contains(&w.index) && !w.branches.is_empty()).count();
    assert_eq!(ok, intact, "every intact window's sample is joined exactly: {}", r.stats);
    let s = &r.stats;
    assert_eq!(s["aux"]["truncated"], 1, "{s}");
    // The lost record and the bytes cut from the truncated one leave gaps in the ring offsets.
    assert_eq!(s["aux"]["gaps"], 2, "{s}");
    assert_eq!(s["sideband"]["lost_records"], 1, "{s}");
    let faults = s["decode"]["errors"].as_u64().unwrap() + s["decode"]["nosync"].as_u64().unwrap();
    assert!(faults >= 2, "flipped byte and missing sync are seen by the decoder: {s}");
    // The damaged windows' samples are rejected or (if the damage hit nothing that matters)
    // exact; none is joined with wrong data: check_samples already asserted the others, so
    // check these too unless rejected.
    let by_time: HashMap<u64, &Sample> = r.samples.iter().map(|s| (s.time, s)).collect();
    for k in damaged {
        let w = win(k);
        if let Some(s) = by_time.get(&w.sample_time) {
            assert_eq!(s.branches, true_branches(w), "damaged window {k} joined with wrong branches");
        }
    }
}

/// The replay's dumps are what llvm-profgen reads: the synthetic ETM session of a program with
/// debug info gives a CSSPGO/AutoFDO text profile naming the functions the program calls
/// through its function-pointer table (from the C source: op_add, op_sub, op_xor, op_mix).
#[test]
fn replay_dumps_feed_llvm_profgen() {
    let profgen = "llvm-profgen-22";
    if Command::new(profgen).arg("--version").output().is_err() {
        etm_testutil::skip(format!("{profgen} not installed (scripts/setup.sh)"));
        return;
    }
    if let Err(e) = testprogs::qemu_available() {
        etm_testutil::skip(e);
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let prog = tmp.path().join("indg");
    let cc = Command::new("aarch64-linux-gnu-gcc")
        .args(["-O2", "-g", "-static", "-fno-omit-frame-pointer", "-o"])
        .arg(&prog)
        .arg(testprogs::source_dir().join("indirect.c"))
        .status();
    if !cc.is_ok_and(|s| s.success()) {
        etm_testutil::skip("aarch64-linux-gnu-gcc cannot build indirect.c");
        return;
    }
    let sess = tmp.path().join("session");
    synth(&prog, &[], &sess, 1000, 20_000, false);
    let r = replay(&sess, tmp.path(), "pg");
    assert!(!r.samples.is_empty());
    let out = tmp.path().join("indg.prof");
    let st = Command::new(profgen)
        .arg("--perfscript")
        .arg(r.dumps.join("indg.perfscript"))
        .arg("--binary")
        .arg(&prog)
        .arg("--format=text")
        .arg("--output")
        .arg(&out)
        .output()
        .unwrap();
    assert!(st.status.success(), "llvm-profgen failed: {}", String::from_utf8_lossy(&st.stderr));
    let text = std::fs::read_to_string(&out).unwrap();
    for f in ["main", "apply", "op_add", "op_sub", "op_xor", "op_mix"] {
        assert!(text.contains(f), "{f} missing from the llvm-profgen profile:\n{text}");
    }
}

/// CoreSight formatter frames (IHI 0029 "Trace Formatter", 16-byte frames as an ETR writes
/// them): byte 0 switches to `id` (flag bit 0 = 0: immediately), bytes 1..=14 carry data (even
/// bytes with their LSB moved to the flag byte 15); a short last frame ends with a switch to
/// the null ID 0 (an ID byte's flag 1 keeps the following odd byte in the old ID).
fn format_frames(data: &[u8], id: u8) -> Vec<u8> {
    let mut out = Vec::new();
    for chunk in data.chunks(14) {
        let mut f = [0u8; 16];
        f[0] = (id << 1) | 1;
        let mut flags = 0u8;
        let mut pos = 1;
        for &b in chunk {
            if pos % 2 == 0 {
                f[pos] = b & 0xfe;
                flags |= (b & 1) << (pos / 2);
            } else {
                f[pos] = b;
            }
            pos += 1;
        }
        if pos < 15 {
            if pos % 2 == 0 {
                f[pos] = 1; // switch to the null ID 0 at once: the rest is ignored
            } else {
                // The last data byte sits in an even slot: turn that slot into the switch to
                // ID 0 with flag 1 ("the next byte still belongs to the old ID") and move the
                // byte to the odd slot after it.
                let k = (pos - 1) / 2;
                let d = f[pos - 1] | ((flags >> k) & 1);
                flags |= 1 << k;
                f[pos - 1] = 1;
                f[pos] = d;
            }
        }
        f[15] = flags;
        out.extend_from_slice(&f);
    }
    out
}

/// The same session written as formatted (ETR-style, trace ID demultiplexed) AUX data instead
/// of raw TRBE data joins the same samples: the formatted path (deformatter, trace ID -> CPU
/// from AUX_OUTPUT_HW_ID) against the ground truth.
#[test]
fn replay_formatted_aux_matches_truth() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(prog) = build("indirect", tmp.path()) else { return };
    let sess = tmp.path().join("session");
    let gt = synth(&prog, &[], &sess, 1000, 20_000, true);
    let aux = sess.join("aux").join(format!("cpu{}.bin", gt.meta.cpu));
    let raw = std::fs::read(&aux).unwrap();
    let mut formatted = Vec::new();
    let mut ring = 0u64;
    edit_events(&sess, |_, v| {
        if v["type"] != "aux" {
            return None;
        }
        let (off, size) = (v["offset"].as_u64().unwrap() as usize, v["size"].as_u64().unwrap() as usize);
        let frames = format_frames(&raw[off..off + size], 0x10);
        let mut v = v.clone();
        v["offset"] = (formatted.len() as u64).into();
        v["size"] = (frames.len() as u64).into();
        v["aux_offset"] = ring.into();
        v["flags"] = 0.into();
        ring += frames.len() as u64;
        formatted.extend_from_slice(&frames);
        Some(vec![v])
    });
    std::fs::write(&aux, &formatted).unwrap();
    let r = replay(&sess, tmp.path(), "fmt");
    let with_branches = gt.windows.iter().filter(|w| !w.branches.is_empty()).count();
    assert_eq!(check_samples(&gt, &r, &[]), with_branches, "{}", r.stats);
    assert_eq!(r.stats["decode"]["unknown_trace_id"], 0, "{}", r.stats);
}

/// `functions.csv` rows: function -> (instructions, share, ci95 low, ci95 high).
fn functions_csv(path: &Path) -> BTreeMap<String, (u64, f64, f64, f64)> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut out = BTreeMap::new();
    for l in text.lines().skip(1) {
        // C test programs: no quoted fields.
        let f: Vec<&str> = l.split(',').collect();
        assert_eq!(f.len(), 21, "{l}");
        out.insert(
            f[0].to_string(),
            (f[2].parse().unwrap(), f[3].parse().unwrap(), f[4].parse().unwrap(), f[5].parse().unwrap()),
        );
    }
    out
}

/// Function extents of a program by binutils (`aarch64-linux-gnu-nm -S`, functions only).
fn nm_functions(prog: &Path) -> Vec<(u64, u64, String)> {
    let out = run(Command::new("aarch64-linux-gnu-nm").args(["-S", "--defined-only"]).arg(prog));
    let mut v: Vec<(u64, u64, String)> = out
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() == 4 && matches!(f[2], "t" | "T" | "W" | "i")).then(|| {
                let start = u64::from_str_radix(f[0], 16).unwrap();
                (start, start + u64::from_str_radix(f[1], 16).unwrap(), f[3].to_string())
            })
        })
        .collect();
    v.sort();
    v
}

fn function_of(fns: &[(u64, u64, String)], pc: u64) -> &str {
    let i = fns.partition_point(|f| f.0 <= pc);
    match i.checked_sub(1).map(|i| &fns[i]) {
        Some((s, e, n)) if *s <= pc && pc < *e => n,
        _ => "[none]",
    }
}

/// Instructions per function (named by `nm`) of `prog`'s run under qemu, over the population
/// a synthetic session's windows sample: window k stands for the period [kM, (k+1)M) and
/// traces its last N instructions. The start-up before `main` (libc tunables, IRELATIVE
/// relocations) is a phase a few periods long, which a systematic 1-in-M window cannot
/// estimate; it is left out, and so is the tail after the last window.
fn run_counts(prog: &Path, fns: &[(u64, u64, String)], windows: u64, period: u64) -> (BTreeMap<String, u64>, u64) {
    run_counts_of(&qemu_pcs(prog), fns, windows, period)
}

/// qemu's exact path of a whole run of `prog`.
fn qemu_pcs(prog: &Path) -> Vec<u64> {
    etm_synth::qemu::run(prog, &[], &etm_synth::qemu::QemuOptions::default()).expect("qemu runs the program").pcs
}

/// [`run_counts`] of a path already run.
fn run_counts_of(pcs: &[u64], fns: &[(u64, u64, String)], windows: u64, period: u64) -> (BTreeMap<String, u64>, u64) {
    let main_at = pcs.iter().position(|&pc| function_of(fns, pc) == "main").expect("main runs") as u64;
    let (lo_idx, hi_idx) = (main_at, windows * period);
    let mut whole: BTreeMap<String, u64> = BTreeMap::new();
    let mut total = 0u64;
    for (i, &pc) in pcs.iter().enumerate() {
        if !(lo_idx..hi_idx).contains(&(i as u64)) {
            continue;
        }
        *whole.entry(function_of(fns, pc).to_string()).or_default() += 1;
        total += 1;
    }
    (whole, total)
}

/// Exact counts per function from the trace, against two independent truths:
/// * the ranges qemu's exact path gives for the traced windows (ground truth), each named by
///   binutils `nm`: every function's instruction count in `functions.csv` equals the truth;
/// * the run's instructions per function from `main` to the last window (qemu's instruction
///   log of the full run, named by `nm`): the 95% intervals of the shares (windows as the
///   sampling unit) cover those shares. On the flat workload (256 small functions, 310
///   windows) for at least 95% of *every* function that ran, a function the windows never saw
///   counting as a miss (measured 247 of 259: 10 just outside their intervals, 8 of them
///   below, and 2 libc functions of `atoi` never traced); on calls through a table for at
///   least 90% of the functions with at least 0.5% of the instructions (6 of 6; below that
///   are libc start-up functions no window saw). Deterministic: the synthetic sessions are.
///
/// On a flat workload (256 small functions) and on calls through a table.
#[test]
fn exact_counts_equal_the_path() {
    for (name, args, window, period) in [("flat", &["200000"][..], 2000, 20_000), ("indirect", &[], 1000, 10_000)] {
        let tmp = tempfile::tempdir().unwrap();
        let Some(prog) = build(name, tmp.path()) else { return };
        let sess = tmp.path().join("s");
        let gt = synth(&prog, args, &sess, window, period, true);
        let r = replay(&sess, tmp.path(), name);
        let ours = functions_csv(&r.dumps.join("functions.csv"));
        let fns = nm_functions(&prog);
        let mut truth: BTreeMap<String, u64> = BTreeMap::new();
        for w in gt.windows.iter().filter(|w| w.fault.is_none()) {
            for rg in &w.ranges {
                *truth.entry(function_of(&fns, rg.start).to_string()).or_default() += rg.n_insns;
            }
        }
        let ours_n: BTreeMap<String, u64> = ours.iter().map(|(k, v)| (k.clone(), v.0)).collect();
        assert_eq!(ours_n, truth, "{name}: per-function instructions");
        if name == "flat" {
            let flat_fns = truth.keys().filter(|k| k.starts_with('f') && k[1..].parse::<u32>().is_ok()).count();
            assert!(flat_fns >= 200, "{name}: only {flat_fns} of the 256 functions seen");
        }
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        let pcs =
            etm_synth::qemu::run(&prog, &args, &etm_synth::qemu::QemuOptions::default()).expect("qemu runs the program").pcs;
        let (whole, total) = run_counts_of(&pcs, &fns, gt.windows.len() as u64, period);
        assert!(total > 100_000, "{name}: {total} instructions in the qemu log");
        // The flat workload: every function that ran; the table: those with 0.5% or more.
        let (floor, need) = if name == "flat" { (0.0, 0.95) } else { (0.005, 0.9) };
        let (mut checked, mut covered) = (0, 0);
        for (f, &n) in &whole {
            let share = n as f64 / total as f64;
            if share < floor {
                continue;
            }
            checked += 1;
            let (_, _, lo, hi) = ours.get(f).copied().unwrap_or((0, 0.0, 0.0, 0.0));
            covered += usize::from(lo <= share && share <= hi);
            if !(lo <= share && share <= hi) {
                eprintln!("  {f}: whole run {share:.4}, interval [{lo:.4}, {hi:.4}]");
            }
        }
        eprintln!("{name}: {covered} of {checked} functions' shares of the run inside their 95% intervals");
        assert!(checked >= 4 && covered as f64 >= need * checked as f64, "{name}: {covered} of {checked}");
        if name == "flat" {
            assert!(checked >= 256, "{name}: only {checked} functions in qemu's log");
        }
    }
}

/// `diff` on the exact counts of two builds (tests/aarch64/ab.c: fa : fb : fc = 2 : 1 : 1
/// units of one loop against 1 : 2 : 1): for each function the change of its share of the
/// traced instructions has the true change (qemu's path of each build, named by `nm`) inside
/// its 95% interval; fa's and fb's changes are significant, fc's (the same work in both) not.
#[test]
fn exact_diff_of_two_builds() {
    let tmp = tempfile::tempdir().unwrap();
    let (Some(a), Some(b)) = (build("ab_a", tmp.path()), build("ab_b", tmp.path())) else { return };
    let (window, period) = (1000, 7919);
    let mut truth = Vec::new();
    let mut dumps = Vec::new();
    for (tag, prog) in [("a", &a), ("b", &b)] {
        let sess = tmp.path().join(format!("s-{tag}"));
        let gt = synth(prog, &[], &sess, window, period, true);
        dumps.push(replay(&sess, tmp.path(), tag).dumps);
        let fns = nm_functions(prog);
        let (counts, total) = run_counts(prog, &fns, gt.windows.len() as u64, period);
        truth.push(counts.into_iter().map(|(f, n)| (f, n as f64 / total as f64)).collect::<BTreeMap<String, f64>>());
    }
    let v: serde_json::Value =
        serde_json::from_str(&run(Command::new(etm_bpf_bin()).args(["diff", "--json"]).arg(&dumps[0]).arg(&dumps[1]))).unwrap();
    let ex = v["exact_functions"].as_array().expect("exact comparison in the diff");
    for (f, sig) in [("fa", true), ("fb", true), ("fc", false)] {
        let e = ex.iter().find(|e| e["function"] == f).unwrap_or_else(|| panic!("{f}: {v}"));
        let d = truth[1].get(f).copied().unwrap_or(0.0) - truth[0].get(f).copied().unwrap_or(0.0);
        let (lo, hi) = (e["ci95"][0].as_f64().unwrap(), e["ci95"][1].as_f64().unwrap());
        eprintln!(
            "{f}: true change {d:+.4}, estimate {:+.4} [{lo:+.4}, {hi:+.4}], significant {}",
            e["change"], e["significant"]
        );
        assert!(lo <= d && d <= hi, "{f}: true change {d} outside [{lo}, {hi}]");
        assert_eq!(e["significant"], sig, "{f}: {e}");
    }
}

/// `functions.csv` by column name: function -> column -> field (C test programs: no quoting).
fn functions_table(path: &Path) -> BTreeMap<String, BTreeMap<String, String>> {
    csv_rows(path).into_iter().collect()
}

/// The rows of a CSV dump (`functions.csv`, `contexts.csv`) by column name, keyed by the
/// first column, in file order (C test programs: no quoting).
fn csv_rows(path: &Path) -> Vec<(String, BTreeMap<String, String>)> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut lines = text.lines();
    let head: Vec<&str> = lines.next().expect("header").split(',').collect();
    lines
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            assert_eq!(f.len(), head.len(), "{l}");
            (f[0].to_string(), head.iter().zip(&f).map(|(h, v)| (h.to_string(), v.to_string())).collect())
        })
        .collect()
}

/// A call or a return, by binutils `objdump -d` (the truth's own instruction classes).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Flow {
    Call,
    Return,
}

fn objdump_flow(prog: &Path) -> HashMap<u64, Flow> {
    let out = run(Command::new("aarch64-linux-gnu-objdump").args(["-d", "--no-show-raw-insn"]).arg(prog));
    out.lines()
        .filter_map(|l| {
            let (addr, rest) = l.trim_start().split_once(":\t")?;
            let addr = u64::from_str_radix(addr, 16).ok()?;
            let m = rest.split_whitespace().next()?;
            match m {
                "bl" | "blr" | "blraa" | "blrab" | "blraaz" | "blrabz" => Some((addr, Flow::Call)),
                "ret" | "retaa" | "retab" => Some((addr, Flow::Return)),
                _ => None,
            }
        })
        .collect()
}

/// Per function (named by `nm`): instructions inclusive of callees, calls, distinct blocks and
/// distinct taken branches, over the traced windows.
#[derive(Debug, Default, PartialEq)]
struct TrueCalls {
    inclusive: BTreeMap<String, u64>,
    calls: BTreeMap<String, u64>,
    blocks: BTreeMap<String, u64>,
    branches: BTreeMap<String, u64>,
    /// Calls per calling context (`outermost;...;callee`): the frames from the lowest stack
    /// depth the window reached so far up to the caller, then the callee.
    context_calls: BTreeMap<String, u64>,
}

/// The truth of [`TrueCalls`] from qemu's instruction log of the whole run: the true call
/// stack at every instruction (a frame pushed after each call instruction, popped after each
/// return, by objdump; its function is where its instructions are, by nm), and for each traced
/// window (the instructions of its ranges, from its first traced instruction) every
/// instruction counted once for each distinct function of the frames the window sees: those at
/// or above the lowest stack depth the window reaches. Calls: call instructions whose target
/// is in the window too, for the function called. Blocks and branches from the windows'
/// ranges and branches, distinct over the run.
fn true_calls(prog: &Path, gt: &GroundTruth, fns: &[(u64, u64, String)]) -> TrueCalls {
    let flow = objdump_flow(prog);
    let pcs = etm_synth::qemu::run(prog, &[], &etm_synth::qemu::QemuOptions::default()).expect("qemu runs").pcs;
    let name = |pc: u64| function_of(fns, pc).to_string();
    let mut t = TrueCalls::default();
    let mut windows: Vec<(u64, u64, &gtfile::GtWindow)> = gt
        .windows
        .iter()
        .filter(|w| w.fault.is_none() && !w.ranges.is_empty())
        .map(|w| (w.start_index, w.start_index + w.ranges.iter().map(|r| r.n_insns).sum::<u64>(), w))
        .collect();
    windows.sort_by_key(|w| w.0);
    let (mut blocks, mut branches) = (std::collections::HashSet::new(), std::collections::HashSet::new());
    for (_, _, w) in &windows {
        let mut at = w.start_index as usize;
        for r in &w.ranges {
            assert_eq!(pcs[at], r.start, "window {}: the truth's ranges follow qemu's log", w.index);
            at += r.n_insns as usize;
            if blocks.insert(r.start) {
                *t.blocks.entry(name(r.start)).or_default() += 1;
            }
        }
        for b in &w.branches {
            if branches.insert((b.from, b.to)) {
                *t.branches.entry(name(b.from)).or_default() += 1;
            }
        }
    }
    let mut stack: Vec<String> = Vec::new();
    let mut wi = 0;
    let mut in_window: Vec<Vec<String>> = Vec::new();
    let mut low_so_far = usize::MAX;
    for (i, &pc) in pcs.iter().enumerate() {
        let i = i as u64;
        let top = name(pc);
        match stack.last_mut() {
            Some(f) => *f = top,
            None => stack.push(top),
        }
        if let Some(&(lo, hi, _)) = windows.get(wi) {
            if (lo..hi).contains(&i) {
                in_window.push(stack.clone());
                low_so_far = low_so_far.min(stack.len());
                if i + 1 < hi && flow.get(&pc) == Some(&Flow::Call) {
                    let callee = name(pcs[i as usize + 1]);
                    let ctx = format!("{};{callee}", stack[low_so_far - 1..].join(";"));
                    *t.context_calls.entry(ctx).or_default() += 1;
                    *t.calls.entry(callee).or_default() += 1;
                }
            }
            if i + 1 == hi {
                let low = in_window.iter().map(Vec::len).min().expect("instructions");
                for s in &in_window {
                    let seen: std::collections::BTreeSet<&String> = s[low - 1..].iter().collect();
                    for f in seen {
                        *t.inclusive.entry(f.clone()).or_default() += 1;
                    }
                }
                in_window.clear();
                low_so_far = usize::MAX;
                wi += 1;
            }
        }
        match flow.get(&pc) {
            Some(Flow::Call) => stack.push(String::new()),
            Some(Flow::Return) => {
                stack.pop();
            }
            None => {}
        }
    }
    assert_eq!(wi, windows.len(), "every window inside qemu's log");
    t
}

/// Inclusive counts, calls, blocks and branches per function, and calls per calling context
/// (`contexts.csv`), from the trace (the shadow call stack over each window's ranges) equal the
/// truth of qemu's exact path ([`true_calls`]):
/// the flat workload (calls through a table), recursion, and the A/B program's build A (one
/// function shared by two callers).
#[test]
fn exact_inclusive_and_calls_equal_the_path() {
    for (name, window, period) in [("flat", 2000, 20_000), ("recursion", 1000, 7919), ("percall_a", 1000, 7919)] {
        let tmp = tempfile::tempdir().unwrap();
        let Some(prog) = build(name, tmp.path()) else { return };
        let sess = tmp.path().join("s");
        let gt = synth(&prog, &[], &sess, window, period, true);
        let r = replay(&sess, tmp.path(), name);
        let table = functions_table(&r.dumps.join("functions.csv"));
        let col = |c: &str| -> BTreeMap<String, u64> {
            table.iter().map(|(f, row)| (f.clone(), row[c].parse::<u64>().unwrap())).filter(|(_, n)| *n > 0).collect()
        };
        let truth = true_calls(&prog, &gt, &nm_functions(&prog));
        let mut context_calls: BTreeMap<String, u64> = BTreeMap::new();
        for (c, row) in csv_rows(&r.dumps.join("contexts.csv")) {
            *context_calls.entry(c).or_default() += row["calls"].parse::<u64>().unwrap();
        }
        let ours = TrueCalls {
            inclusive: col("inclusive"),
            calls: col("calls"),
            blocks: col("blocks"),
            branches: col("branches"),
            context_calls,
        };
        let n_calls: u64 = truth.calls.values().sum();
        eprintln!(
            "{name}: {} functions, {n_calls} calls, {} blocks, {} branches in the windows",
            truth.inclusive.len(),
            truth.blocks.values().sum::<u64>(),
            truth.branches.values().sum::<u64>()
        );
        assert!(n_calls > 100, "{name}: {n_calls} calls");
        assert_eq!(ours.inclusive, truth.inclusive, "{name}: inclusive instructions");
        assert_eq!(ours.calls, truth.calls, "{name}: calls");
        assert_eq!(ours.blocks, truth.blocks, "{name}: blocks");
        assert_eq!(ours.branches, truth.branches, "{name}: branches");
        assert_eq!(ours.context_calls, truth.context_calls, "{name}: calls per calling context (contexts.csv)");
        eprintln!("{name}: {} calling contexts", truth.context_calls.len());
        let m: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(r.dumps.join("manifest.json")).unwrap()).unwrap();
        let ex = &m["exact"];
        assert_eq!(ex["blocks_covered"], truth.blocks.values().sum::<u64>(), "{ex}");
        assert_eq!(ex["branches_covered"], truth.branches.values().sum::<u64>(), "{ex}");
        assert_eq!(ex["functions"], truth.inclusive.len(), "{ex}");
        // The instruction-weighted flame graph: the folded contexts' instructions by innermost
        // function are functions.csv's; in the SVG (inferno's frame titles) a function that is
        // never a caller there has its functions.csv count in all, and the root the total.
        let own = col("instructions");
        let mut by_leaf: BTreeMap<String, u64> = BTreeMap::new();
        let mut callers = std::collections::BTreeSet::new();
        for l in std::fs::read_to_string(r.dumps.join("instructions.folded")).unwrap().lines() {
            let (path, n) = l.rsplit_once(' ').unwrap();
            let (inner, outer) = match path.rsplit_once(';') {
                Some((outer, inner)) => (inner, Some(outer)),
                None => (path, None),
            };
            callers.extend(outer.into_iter().flat_map(|o| o.split(';')).map(str::to_string));
            *by_leaf.entry(inner.to_string()).or_default() += n.parse::<u64>().unwrap();
        }
        assert_eq!(by_leaf, own, "{name}: instructions.folded by innermost function");
        let svg = std::fs::read_to_string(r.dumps.join("instructions.svg")).unwrap();
        let mut widths: BTreeMap<String, u64> = BTreeMap::new();
        for t in svg.split("<title>").skip(1) {
            let t = t.split("</title>").next().unwrap();
            let (f, rest) = t.rsplit_once(" (").unwrap_or_else(|| panic!("{t}"));
            let n: u64 = rest.split(' ').next().unwrap().replace(',', "").parse().unwrap_or_else(|_| panic!("{t}"));
            *widths.entry(f.to_string()).or_default() += n;
        }
        assert_eq!(widths.get("all").copied(), Some(own.values().sum::<u64>()), "{name}: the root is every instruction");
        let leaves: Vec<&String> = own.keys().filter(|f| !callers.contains(*f)).collect();
        // (recursion.c: both functions are callers; flat and percall have leaves)
        assert!(name == "recursion" || !leaves.is_empty(), "{name}");
        for f in leaves {
            assert_eq!(widths.get(f), own.get(f), "{name}: {f}'s width in instructions.svg");
        }
    }
}

/// Self instructions per call of each called function over the run from `main` to the last
/// window (the population the windows sample, as in [`run_counts`]): its instructions in
/// qemu's log over the calls of it (call instructions by objdump, the callee by nm).
fn true_per_call(prog: &Path, fns: &[(u64, u64, String)], windows: u64, period: u64) -> BTreeMap<String, f64> {
    let flow = objdump_flow(prog);
    let pcs = etm_synth::qemu::run(prog, &[], &etm_synth::qemu::QemuOptions::default()).expect("qemu runs").pcs;
    let main_at = pcs.iter().position(|&pc| function_of(fns, pc) == "main").expect("main runs");
    let hi = ((windows * period) as usize).min(pcs.len());
    let (mut own, mut calls): (BTreeMap<&str, u64>, BTreeMap<&str, u64>) = Default::default();
    for i in main_at..hi {
        *own.entry(function_of(fns, pcs[i])).or_default() += 1;
        if flow.get(&pcs[i]) == Some(&Flow::Call) && i + 1 < hi {
            *calls.entry(function_of(fns, pcs[i + 1])).or_default() += 1;
        }
    }
    calls.iter().map(|(f, &c)| (f.to_string(), own.get(f).copied().unwrap_or(0) as f64 / c as f64)).collect()
}

/// The calls of qemu's log from `main` to the last window (as in [`true_per_call`]), with
/// their callers: a frame pushed at each call instruction (objdump) whose target is in that
/// span, counting the instructions executed while it is on top (its own) and until its return
/// (inclusive); per (caller, callee) by nm, the calls that returned in the span: (calls, own
/// instructions, inclusive instructions).
fn true_calls_by_caller(
    prog: &Path,
    pcs: &[u64],
    fns: &[(u64, u64, String)],
    windows: u64,
    period: u64,
) -> BTreeMap<(String, String), (u64, u64, u64)> {
    let flow = objdump_flow(prog);
    let main_at = pcs.iter().position(|&pc| function_of(fns, pc) == "main").expect("main runs");
    let hi = ((windows * period) as usize).min(pcs.len());
    // (caller, callee, own, first instruction)
    let mut stack: Vec<(&str, &str, u64, usize)> = Vec::new();
    let mut out: BTreeMap<(String, String), (u64, u64, u64)> = BTreeMap::new();
    for i in main_at..hi {
        if let Some(top) = stack.last_mut() {
            top.2 += 1;
        }
        match flow.get(&pcs[i]) {
            Some(Flow::Call) if i + 1 < hi => stack.push((function_of(fns, pcs[i]), function_of(fns, pcs[i + 1]), 0, i + 1)),
            Some(Flow::Return) => {
                if let Some((caller, callee, own, start)) = stack.pop() {
                    let e = out.entry((caller.to_string(), callee.to_string())).or_default();
                    *e = (e.0 + 1, e.1 + own, e.2 + (i + 1 - start) as u64);
                }
            }
            _ => {}
        }
    }
    out
}

/// `diff` on instructions per call (tests/aarch64/percall.c: B runs 6 instructions fewer per
/// call of `shared`, which `left` and `right` call): `shared`'s change of self instructions
/// per call is significant, negative, with the true change (qemu's path of each build, calls
/// by objdump) inside its 95% interval; no other function's change is significant. And for a
/// B identical to A (the same build sampled at another period): nothing significant, neither
/// per call nor in the instruction shares. Per calling context (`contexts.csv`, the caller
/// chain each window saw, matched by names): every context of `shared` (from `left` and from
/// `right`, both seen from `main`) significant, negative, with the true change of its caller
/// (qemu's log, a shadow stack by objdump's calls and returns) inside its interval; the
/// contexts of `left` and `right` not; A against A nothing.
#[test]
fn per_call_diff_of_two_builds() {
    let tmp = tempfile::tempdir().unwrap();
    let (Some(a), Some(b)) = (build("percall_a", tmp.path()), build("percall_b", tmp.path())) else { return };
    let window = 1000;
    let mut truth = Vec::new();
    let mut by_caller = Vec::new();
    let mut dumps = Vec::new();
    for (tag, prog, period) in [("a", &a, 7919), ("b", &b, 7919), ("a2", &a, 6151)] {
        let sess = tmp.path().join(format!("s-{tag}"));
        let gt = synth(prog, &[], &sess, window, period, true);
        dumps.push(replay(&sess, tmp.path(), tag).dumps);
        let fns = nm_functions(prog);
        truth.push(true_per_call(prog, &fns, gt.windows.len() as u64, period));
        by_caller.push(true_calls_by_caller(prog, &qemu_pcs(prog), &fns, gt.windows.len() as u64, period));
    }
    let diff = |x: &Path, y: &Path| -> serde_json::Value {
        serde_json::from_str(&run(Command::new(etm_bpf_bin()).args(["diff", "--json"]).arg(x).arg(y))).unwrap()
    };
    let v = diff(&dumps[0], &dumps[1]);
    let pc = v["per_call"].as_array().expect("per-call comparison in the diff");
    assert_eq!(v["svg_weight"], "instructions", "diff.svg of the exact counts");
    let svg = std::fs::read_to_string(v["svg"].as_str().unwrap()).unwrap();
    assert!(svg.contains("<title>shared (") && svg.contains(" instructions"), "diff.svg names shared with instruction counts");
    assert!(pc.len() >= 3, "{v}");
    for e in pc {
        let f = e["function"].as_str().unwrap();
        let (lo, hi) = (e["ci95"][0].as_f64().unwrap(), e["ci95"][1].as_f64().unwrap());
        let d = truth[1].get(f).copied().unwrap_or(f64::NAN) - truth[0].get(f).copied().unwrap_or(f64::NAN);
        eprintln!(
            "{f}: true {:.3} -> {:.3} (change {d:+.3}), estimate {:+.3} [{lo:+.3}, {hi:+.3}], significant {}",
            truth[0].get(f).copied().unwrap_or(f64::NAN),
            truth[1].get(f).copied().unwrap_or(f64::NAN),
            e["change"].as_f64().unwrap(),
            e["significant"]
        );
        assert_eq!(e["significant"], f == "shared", "{f}: {e}");
        if f == "shared" {
            assert!((d + 6.0).abs() < 1e-9, "the builds differ by 6 instructions per call of shared: {d}");
            assert!(e["change"].as_f64().unwrap() < 0.0 && lo <= d && d <= hi, "{f}: true change {d} outside [{lo}, {hi}]");
        }
    }
    assert!(pc.iter().any(|e| e["function"] == "shared"), "{v}");
    let ctx = v["per_call_contexts"].as_array().expect("per-context comparison in the diff");
    let self_per_call = |t: &BTreeMap<(String, String), (u64, u64, u64)>, k: &(String, String)| {
        t.get(k).map_or(f64::NAN, |&(c, own, _)| own as f64 / c as f64)
    };
    for e in ctx {
        let c = e["context"].as_str().unwrap();
        let path: Vec<&str> = c.split(';').collect();
        assert!(path.len() >= 2, "a complete call has its caller in the window: {c}");
        let key = (path[path.len() - 2].to_string(), path[path.len() - 1].to_string());
        let d = self_per_call(&by_caller[1], &key) - self_per_call(&by_caller[0], &key);
        let (lo, hi) = (e["ci95"][0].as_f64().unwrap(), e["ci95"][1].as_f64().unwrap());
        eprintln!(
            "{c}: {} / {} calls, true change {d:+.3}, estimate {:+.3} [{lo:+.3}, {hi:+.3}], significant {}",
            e["calls_a"],
            e["calls_b"],
            e["change"].as_f64().unwrap(),
            e["significant"]
        );
        assert_eq!(e["significant"], key.1 == "shared", "{c}: {e}");
        if key.1 == "shared" {
            assert!((d + 6.0).abs() < 1e-9, "{c}: the builds differ by 6 instructions per call of shared: {d}");
            assert!(e["change"].as_f64().unwrap() < 0.0 && lo <= d && d <= hi, "{c}: true change {d} outside [{lo}, {hi}]");
        }
    }
    for caller in ["main;left;shared", "main;right;shared"] {
        assert!(ctx.iter().any(|e| e["context"] == caller && e["significant"] == true), "{caller}: {v}");
    }
    let v = diff(&dumps[0], &dumps[2]);
    let sig = |k: &str| v[k].as_array().unwrap().iter().filter(|e| e["significant"] == true).count();
    assert_eq!(
        (sig("per_call"), sig("exact_functions"), sig("per_call_contexts")),
        (0, 0, 0),
        "A against A at another period: {v}"
    );
    assert!(!v["per_call_contexts"].as_array().unwrap().is_empty(), "{v}");
}

/// The intervals of calls whose length varies (tests/aarch64/varying.c: 16 leaves whose loops
/// run a pseudo-random number of rounds on every call, 4 callers of two leaves each with loops
/// of their own), against the true mean instructions per call over the run from `main` to the
/// last window (qemu's log: a shadow stack by objdump's calls and returns, functions by nm,
/// [`true_calls_by_caller`]), in three sessions (1000-instruction windows every 10000 and every
/// 7919 instructions, 400-instruction windows every 4000: there the longest calls are more
/// than half a window). Rule: the self per-call interval of every function with at least 30
/// complete calls in the windows, and its inclusive one where it calls others (a leaf's is its
/// self one); each has non-zero width, at least 90% of them hold the true mean (measured:
/// 56 of 58), and the self estimates are unbiased (their mean error in standard errors within
/// 0.3 of 0). The same for the instruction shares of the functions with at least 0.5% of the
/// run's instructions (measured: 61 of 63).
#[test]
fn per_call_intervals_cover_varying_calls() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(prog) = build("varying", tmp.path()) else { return };
    let fns = nm_functions(&prog);
    let pcs = qemu_pcs(&prog);
    let num = |row: &BTreeMap<String, String>, c: &str| row[c].parse::<f64>().unwrap_or(f64::NAN);
    let (mut checked, mut covered, mut lengths, mut z) = (0, 0, Vec::new(), Vec::new());
    let (mut s_checked, mut s_covered) = (0, 0);
    for (window, period) in [(1000, 10_000), (1000, 7919), (400, 4000)] {
        let sess = tmp.path().join(format!("s{period}"));
        let gt = synth(&prog, &[], &sess, window, period, true);
        let r = replay(&sess, tmp.path(), &format!("varying{period}"));
        let windows = gt.windows.len() as u64;
        let mut truth: BTreeMap<String, (u64, u64, u64)> = BTreeMap::new();
        for ((_, callee), (c, own, incl)) in true_calls_by_caller(&prog, &pcs, &fns, windows, period) {
            let e = truth.entry(callee).or_default();
            *e = (e.0 + c, e.1 + own, e.2 + incl);
        }
        let table = functions_table(&r.dumps.join("functions.csv"));
        for (f, row) in &table {
            if num(row, "complete_calls") < 30.0 {
                continue;
            }
            let &(c, own, incl) = truth.get(f).unwrap_or_else(|| panic!("{f}: no true calls"));
            lengths.push(own as f64 / c as f64);
            for (col, t) in [("self_per_call", own as f64 / c as f64), ("inclusive_per_call", incl as f64 / c as f64)] {
                if col == "inclusive_per_call" && incl == own {
                    continue;
                }
                let (v, lo, hi) = (num(row, col), num(row, &format!("{col}_ci95_low")), num(row, &format!("{col}_ci95_high")));
                assert!(hi > lo, "{f} {col}: the interval [{lo}, {hi}] has no width");
                checked += 1;
                covered += usize::from(lo <= t && t <= hi);
                if col == "self_per_call" {
                    z.push((v - t) / num(row, "self_per_call_stderr"));
                }
                eprintln!(
                    "period {period}: {f} {col}: {} complete calls, true {t:.2}, estimate {v:.2} [{lo:.2}, {hi:.2}]{}",
                    row["complete_calls"],
                    if lo <= t && t <= hi { "" } else { "  MISSED" }
                );
            }
        }
        let (whole, total) = run_counts_of(&pcs, &fns, windows, period);
        for (f, &n) in &whole {
            let share = n as f64 / total as f64;
            if share < 0.005 {
                continue;
            }
            let row = table.get(f).unwrap_or_else(|| panic!("{f}: not in functions.csv"));
            let (lo, hi) = (num(row, "ci95_low"), num(row, "ci95_high"));
            assert!(hi > lo, "{f}: share interval [{lo}, {hi}] has no width");
            s_checked += 1;
            s_covered += usize::from(lo <= share && share <= hi);
        }
    }
    eprintln!("varying: {covered} of {checked} per-call intervals hold the true mean");
    eprintln!("varying: {s_covered} of {s_checked} share intervals hold the run's share");
    assert!(checked >= 30, "{checked} intervals checked");
    assert!(covered * 10 >= checked * 9, "{covered} of {checked} per-call intervals hold the true mean");
    // No bias: the mean of the self per-call estimates' errors, in standard errors, is near 0:
    // within 0.3, about two standard deviations of a mean of 52 independent ones (measured
    // +0.10; without the weights T / (T - L + 1) -0.37, so this fails: long calls are less
    // often whole inside a window, and coverage alone, 53 of 58 then, does not see it).
    let mean_z = z.iter().sum::<f64>() / z.len() as f64;
    eprintln!("varying: mean error of the self per-call estimates {mean_z:+.2} standard errors over {}", z.len());
    assert!(mean_z.abs() < 0.3, "self per-call estimates biased: mean error {mean_z:+.2} standard errors");
    // The lengths do differ from function to function (the leaves' ranges of rounds).
    let (min, max) = lengths.iter().fold((f64::MAX, 0f64), |m, &x| (m.0.min(x), m.1.max(x)));
    assert!(max > 4.0 * min, "true self per call from {min} to {max}");
    assert!(s_checked >= 30 && s_covered * 10 >= s_checked * 9, "{s_covered} of {s_checked} share intervals");
}

/// Coverage of the flat workload's functions (256 small ones called through a table), against
/// the true set (every function of qemu's log from `main` to the last window, named by nm):
/// the functions the windows' exact counts cover, and the functions the pause samples' leaf
/// alone would cover (IP sampling at the same number of samples). The windows cover only true
/// functions and at least 95% of them; the leaves cover fewer (numbers in the README).
#[test]
fn coverage_of_windows_and_of_leaves() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(prog) = build("flat", tmp.path()) else { return };
    let (window, period) = (2000, 20_000);
    let sess = tmp.path().join("s");
    let gt = synth(&prog, &[], &sess, window, period, true);
    let r = replay(&sess, tmp.path(), "flat");
    let fns = nm_functions(&prog);
    let (whole, _) = run_counts(&prog, &fns, gt.windows.len() as u64, period);
    let is_flat = |f: &str| f.starts_with('f') && f[1..].parse::<u32>().is_ok();
    let truth: std::collections::BTreeSet<&str> = whole.keys().map(String::as_str).filter(|f| is_flat(f)).collect();
    let table = functions_csv(&r.dumps.join("functions.csv"));
    let windows: std::collections::BTreeSet<&str> = table.keys().map(String::as_str).filter(|f| is_flat(f)).collect();
    let leaves: std::collections::BTreeSet<&str> =
        r.samples.iter().map(|s| function_of(&fns, s.stack[0])).filter(|f| is_flat(f)).collect();
    eprintln!(
        "flat: {} samples; true functions {}, covered by the windows {} ({:.1}%), by the pause leaves {} ({:.1}%)",
        r.samples.len(),
        truth.len(),
        windows.len(),
        100.0 * windows.len() as f64 / truth.len() as f64,
        leaves.len(),
        100.0 * leaves.len() as f64 / truth.len() as f64
    );
    assert_eq!(truth.len(), 256, "every function of the table runs");
    assert!(windows.is_subset(&truth) && leaves.is_subset(&truth), "only functions that ran are covered");
    assert!(windows.len() * 100 >= truth.len() * 95, "windows cover {} of {}", windows.len(), truth.len());
    assert!(leaves.len() < windows.len(), "leaves {} against windows {}", leaves.len(), windows.len());
    let m: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(r.dumps.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(m["exact"]["functions"], table.len(), "{}", m["exact"]);
}

/// Branch instructions by binutils `objdump -d`: address -> unconditional (taken whenever it
/// runs) or not (conditional: taken when the next instruction is not the following one);
/// and the `svc` instructions (the trace restarts after each).
fn objdump_branches(prog: &Path) -> (HashMap<u64, bool>, std::collections::HashSet<u64>) {
    let out = run(Command::new("aarch64-linux-gnu-objdump").args(["-d", "--no-show-raw-insn"]).arg(prog));
    let (mut br, mut svc) = (HashMap::new(), std::collections::HashSet::new());
    for l in out.lines() {
        let Some((addr, rest)) = l.trim_start().split_once(":\t") else { continue };
        let Ok(addr) = u64::from_str_radix(addr, 16) else { continue };
        let Some(m) = rest.split_whitespace().next() else { continue };
        let uncond = matches!(
            m,
            "b" | "bl"
                | "br"
                | "blr"
                | "ret"
                | "braa"
                | "brab"
                | "braaz"
                | "brabz"
                | "blraa"
                | "blrab"
                | "blraaz"
                | "blrabz"
                | "retaa"
                | "retab"
        );
        let cond = m.starts_with("b.") || matches!(m, "cbz" | "cbnz" | "tbz" | "tbnz");
        if uncond || cond {
            br.insert(addr, uncond);
        } else if m == "svc" {
            svc.insert(addr);
        }
    }
    (br, svc)
}

/// Branches, newest first.
type Branches = Vec<(u64, u64)>;

/// Synthesized samples against qemu's exact path: replayed synthetic sessions of recursion.c
/// (fib and tree recursion: calls and returns of varying depth inside every window) and
/// percall.c (one function shared by two callers). From qemu's instruction log of the whole
/// run and binutils' classes of its instructions (objdump): the taken branches of each window
/// after its last `svc` (its unbroken chain, `m` branches) and the true call stack at every
/// instruction (a return address pushed by each call instruction, popped by each return, from
/// the program's first instruction). Every window has floor((m - 1) / N) synthesized samples;
/// the k-th is at the source of the chain's (m - kN)-th branch (counting from 0, oldest first)
/// and its stack equals the true stack there (leaf, then every return address down to
/// `_start`'s caller-less bottom) and its branches the true last taken branches before it
/// (N, fewer for the oldest: those of the chain). The only stops are windows whose chain
/// begins after an `svc` (trace restart); no synthesized sample is rejected; and the
/// perf-script dump's samples are the pause plus the synthesized ones (llvm-profgen's input).
#[test]
fn synthesized_samples_equal_the_path() {
    for (name, window, period) in [("recursion", 1000, 7919), ("percall_a", 1000, 7919)] {
        let tmp = tempfile::tempdir().unwrap();
        let Some(prog) = build(name, tmp.path()) else { return };
        let sess = tmp.path().join("s");
        let gt = synth(&prog, &[], &sess, window, period, true);
        let r = replay(&sess, tmp.path(), name);
        let (br, svc) = objdump_branches(&prog);
        let flow = objdump_flow(&prog);
        let pcs = etm_synth::qemu::run(&prog, &[], &etm_synth::qemu::QemuOptions::default()).expect("qemu runs").pcs;
        let taken = |i: usize| br.get(&pcs[i]).is_some_and(|&u| u || pcs.get(i + 1).is_some_and(|&n| n != pcs[i] + 4));
        // Per window: the instruction indices of its chain's taken branches, oldest first.
        let mut by_time: HashMap<u64, Vec<(u64, &Sample)>> = HashMap::new();
        for (k, s) in &r.synth {
            by_time.entry(s.time).or_default().push((*k, s));
        }
        // Instruction index -> the synthesized samples there, with their true branches.
        let mut at: BTreeMap<usize, Vec<(&Sample, Branches)>> = BTreeMap::new();
        let (mut restarts, mut n_synth) = (0, 0);
        for w in &gt.windows {
            let mut chain: Vec<usize> = Vec::new();
            let mut restarted = false;
            let (lo, hi) = (w.start_index as usize, w.pause_index as usize);
            for (i, pc) in pcs.iter().enumerate().take(hi).skip(lo) {
                if svc.contains(pc) {
                    chain.clear();
                    restarted = true;
                } else if taken(i) {
                    chain.push(i);
                }
            }
            let m = chain.len();
            let got = by_time.remove(&w.sample_time).unwrap_or_default();
            let want = m.saturating_sub(1) / DEPTH;
            assert_eq!(got.len(), want, "{name} window {}: {m} branches in its chain", w.index);
            if restarted && m > DEPTH {
                restarts += 1;
            }
            for (k, s) in got {
                let p = m - k as usize * DEPTH;
                let branches = chain[p.saturating_sub(DEPTH)..p].iter().rev().map(|&i| (pcs[i], pcs[i + 1])).collect();
                at.entry(chain[p]).or_default().push((s, branches));
                n_synth += 1;
            }
        }
        assert!(by_time.is_empty(), "{name}: synthesized samples of no window");
        assert!(n_synth >= 2 * gt.windows.len(), "{name}: {n_synth} synthesized samples in {} windows", gt.windows.len());
        // The true stack at each of those instructions.
        let mut stack: Vec<u64> = Vec::new();
        let (mut checked, mut deepest) = (0, 0);
        for (i, &pc) in pcs.iter().enumerate() {
            if let Some(v) = at.get(&i) {
                let mut truth = vec![pc];
                truth.extend(stack.iter().rev());
                for (s, branches) in v {
                    assert_eq!(s.stack, truth, "{name}: synthesized stack at instruction {i} ({pc:#x})");
                    assert_eq!(&s.branches, branches, "{name}: synthesized branches at instruction {i} ({pc:#x})");
                    checked += 1;
                    deepest = deepest.max(truth.len());
                }
            }
            match flow.get(&pc) {
                Some(Flow::Call) => stack.push(pc + 4),
                Some(Flow::Return) => {
                    stack.pop();
                }
                None => {}
            }
        }
        assert_eq!(checked, n_synth, "{name}: every synthesized sample inside qemu's log");
        let j = &r.stats["join"];
        assert_eq!(j["synthesized"], n_synth, "{name}: {j}");
        assert_eq!(j["synth_rejected"], 0, "{name}: {j}");
        let stops = if restarts > 0 { serde_json::json!({"trace-restart": restarts}) } else { serde_json::json!({}) };
        assert_eq!(j["synth_stops_by_reason"], stops, "{name}: {j}");
        let file = prog.file_name().unwrap().to_string_lossy().into_owned();
        let ps = perfscript_samples(&r.dumps.join(format!("{file}.perfscript")));
        let total: u64 = ps.iter().map(|p| p.0).sum();
        assert_eq!(total as usize, r.samples.len() + n_synth, "{name}: samples in the perf-script dump");
        eprintln!(
            "{name}: {} windows, {n_synth} synthesized samples equal to the path (stacks up to {deepest} frames), {restarts} windows stopped at an svc",
            gt.windows.len()
        );
        // Off: the pause samples alone, in the profile and in the dump.
        let off = replay_with(&sess, tmp.path(), "off", &["--no-synth-samples"]);
        assert!(off.synth.is_empty() && off.samples == r.samples, "{name}");
        assert_eq!(off.stats["join"]["synthesized"], 0);
        let ps = perfscript_samples(&off.dumps.join(format!("{file}.perfscript")));
        assert_eq!(ps.iter().map(|p| p.0).sum::<u64>() as usize, off.samples.len(), "{name}: without synthesized samples");
    }
}
