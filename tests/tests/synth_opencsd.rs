//! Independent check of the synthetic-session generator: the ETE trace it writes for real
//! AArch64 programs (run under qemu-aarch64) is decoded by Debian's OpenCSD `trc_pkt_lister`
//! (a decoder we did not write), and the instruction ranges OpenCSD reconstructs must equal,
//! window by window, the ranges of the ground truth derived from qemu's exact executed path.
//!
//! Skips (with a printed reason) when qemu-aarch64, a cross compiler or trc_pkt_lister is
//! missing.

use std::path::Path;
use std::process::Command;

use etm_synth::generate::{SynthConfig, synthesize};
use etm_synth::gtfile;
use etm_synth::image::CodeImage;
use etm_synth::qemu::{self, QemuOptions};
use etm_synth::session_out::{GROUND_TRUTH_FILE, write_session};
use etm_synth::snapshot::write_snapshot;
use etm_synth::testprogs::{self, BuildError, Compiler, PROGRAMS};
use etm_synth::truth::RangeEnd;

/// One `OCSD_GEN_TRC_ELEM_INSTR_RANGE` line: byte index, start, end, count, last atom E.
#[derive(Debug, Clone, PartialEq, Eq)]
struct OcsdRange {
    idx: u64,
    start: u64,
    end: u64,
    n: u64,
    taken: bool,
}

fn field<'a>(s: &'a str, after: &str, until: char) -> Option<&'a str> {
    let i = s.find(after)? + after.len();
    let rest = &s[i..];
    Some(&rest[..rest.find(until)?])
}

/// Parse `trc_pkt_lister -decode` output (OpenCSD 1.3.3 format):
/// `Idx:21; ID:10; OCSD_GEN_TRC_ELEM_INSTR_RANGE(exec range=0x4005c0:[0x4005d0] num_i(4) last_sz(4) (ISA=A64) E BR )`
fn parse_ranges(log: &str) -> (Vec<OcsdRange>, Vec<String>) {
    let mut ranges = Vec::new();
    let mut bad = Vec::new();
    for line in log.lines() {
        if line.contains("OCSD_GEN_TRC_ELEM_INSTR_RANGE(") {
            let idx = field(line, "Idx:", ';').and_then(|v| v.parse().ok()).expect("Idx");
            let start = u64::from_str_radix(field(line, "exec range=0x", ':').expect("start"), 16).unwrap();
            let end = u64::from_str_radix(field(line, ":[0x", ']').expect("end"), 16).unwrap();
            let n = field(line, "num_i(", ')').and_then(|v| v.parse().ok()).expect("num_i");
            let after_isa = &line[line.find("(ISA=A64) ").expect("isa") + 10..];
            ranges.push(OcsdRange { idx, start, end, n, taken: after_isa.starts_with('E') });
        } else if line.contains("ADDR_NACC")
            || line.contains("ERROR")
            || line.contains("BAD_")
            || (line.contains("OCSD_GEN_TRC_ELEM_NO_SYNC") && !line.contains("init-decoder"))
        {
            bad.push(line.to_string());
        }
    }
    (ranges, bad)
}

fn check_program(
    bin: &Path,
    args: &[String],
    run: &qemu::QemuRun,
    cfg: &SynthConfig,
    work: &Path,
) -> Result<(usize, usize, u64, String), String> {
    let mut image = CodeImage::load(bin).map_err(|e| e.to_string())?;
    let syn = synthesize(&mut image, &run.pcs, cfg);
    assert_eq!(syn.stats.gaps, 0, "{}: unexpected discontinuities in the path", bin.display());
    assert_eq!(syn.stats.outside_image, 0, "{}: instructions outside the image", bin.display());
    assert!(syn.windows.len() >= 5, "{}: only {} windows", bin.display(), syn.windows.len());

    // The session and its ground truth file; the check below reads the truth back from disk.
    let sess = work.join("session");
    write_session(&sess, bin, args, run.exit_code, &image, &syn).map_err(|e| e.to_string())?;
    let gt = gtfile::read(std::io::BufReader::new(std::fs::File::open(sess.join(GROUND_TRUTH_FILE)).unwrap()))
        .map_err(|e| e.to_string())?;
    assert_eq!(gt.windows.len(), syn.windows.len());

    let ss = work.join("snapshot");
    let offsets = write_snapshot(&ss, &image, &syn).map_err(|e| e.to_string())?;
    let log = work.join("decode.ppl");
    let out = Command::new("trc_pkt_lister")
        .arg("-ss_dir")
        .arg(&ss)
        .arg("-decode")
        .arg("-logfilename")
        .arg(&log)
        .output()
        .map_err(|e| format!("trc_pkt_lister: {e}"))?;
    assert!(out.status.success(), "trc_pkt_lister failed: {}", String::from_utf8_lossy(&out.stderr));
    let text = std::fs::read_to_string(&log).unwrap();
    let (ranges, bad) = parse_ranges(&text);
    assert!(bad.is_empty(), "{}: OpenCSD reported problems: {:#?}", bin.display(), &bad[..bad.len().min(10)]);

    let total: u64 = offsets.last().copied().unwrap_or(0) + syn.windows.last().map_or(0, |w| w.bytes.len() as u64);
    let mut checked = 0;
    for (k, w) in gt.windows.iter().enumerate() {
        let lo = offsets[k];
        let hi = offsets.get(k + 1).copied().unwrap_or(total);
        let got: Vec<&OcsdRange> = ranges.iter().filter(|r| r.idx >= lo && r.idx < hi).collect();
        let want = &w.ranges;
        let same = got.len() == want.len()
            && got.iter().zip(want.iter()).all(|(g, t)| {
                g.start == t.start
                    && g.end == t.end
                    && g.n == t.n_insns
                    && match t.last {
                        RangeEnd::E => g.taken,
                        RangeEnd::N => !g.taken,
                        RangeEnd::Exception => true,
                    }
            });
        if !same {
            let first_diff = got.iter().zip(want.iter()).position(|(g, t)| g.start != t.start || g.end != t.end);
            return Err(format!(
                "{} window {k}: OpenCSD gives {} ranges, ground truth {}; first difference at {:?}: \
                 ocsd {:x?} vs truth {:x?}",
                bin.display(),
                got.len(),
                want.len(),
                first_diff,
                first_diff.and_then(|i| got.get(i)),
                first_diff.and_then(|i| want.get(i)),
            ));
        }
        // Branches: consecutive OpenCSD ranges where the first ends with a taken waypoint give
        // {from = its last instruction, to = the next range's start}; they must be the ground
        // truth's branches (oldest first), all but possibly the window's last one (whose
        // target starts no range before the pause).
        let derived: Vec<(u64, u64)> = got
            .windows(2)
            .zip(want.iter())
            .filter(|(pair, t)| pair[0].taken && t.last == RangeEnd::E)
            .map(|(pair, _)| (pair[0].end - 4, pair[1].start))
            .collect();
        let truth: Vec<(u64, u64)> = w.branches.iter().rev().map(|b| (b.from, b.to)).collect();
        if truth.len() < derived.len() || truth.len() - derived.len() > 1 || truth[..derived.len()] != derived[..] {
            return Err(format!(
                "{} window {k}: branches from OpenCSD ranges ({}) differ from the ground truth ({})",
                bin.display(),
                derived.len(),
                truth.len()
            ));
        }
        // The unbroken chain up to the pause: branches after the last exception range.
        let last_exc = want.iter().rposition(|t| t.last == RangeEnd::Exception);
        let after: usize = got
            .windows(2)
            .enumerate()
            .zip(want.iter())
            .filter(|((i, pair), t)| last_exc.is_none_or(|x| *i > x) && pair[0].taken && t.last == RangeEnd::E)
            .count();
        if !(after as u64 == w.chain_len || after as u64 + 1 == w.chain_len) {
            return Err(format!("{} window {k}: chain after the last svc {after} vs chain_len {}", bin.display(), w.chain_len));
        }
        checked += got.len();
    }
    // The packet kinds the check exercised.
    let sum = |f: fn(&etm_synth::ete::EncoderStats) -> u64| syn.windows.iter().map(|w| f(&w.packets)).sum::<u64>();
    let hits = sum(|p| p.retstack_hits);
    if !cfg.retstack {
        assert_eq!(hits, 0, "{}: return-stack hits without retstack", bin.display());
    }
    let svcs: usize = syn.windows.iter().map(|w| w.exceptions.len()).sum();
    let mix = format!(
        "{} atoms, {} addresses ({} exact, {} short), {hits} return-stack hits, {svcs} svc",
        sum(|p| p.atoms),
        sum(|p| p.addresses),
        sum(|p| p.exact_match),
        sum(|p| p.short)
    );
    Ok((gt.windows.len(), checked, hits, mix))
}

/// For every test program (loops, function-pointer calls, recursion, jump table, two modules)
/// built with gcc and clang, OpenCSD decodes the generated ETE trace to exactly the ground
/// truth's instruction ranges in every window, and the taken branches between those ranges
/// are the ground truth's branches, with and without return-stack compression.
#[test]
fn opencsd_decodes_generated_trace_to_ground_truth_ranges() {
    if let Err(e) = testprogs::qemu_available() {
        etm_testutil::skip(e);
        return;
    }
    // Look the tool up on PATH (running it, even with -help, writes a log into the cwd).
    let on_path = std::env::var_os("PATH").is_some_and(|p| std::env::split_paths(&p).any(|d| d.join("trc_pkt_lister").is_file()));
    if !on_path {
        etm_testutil::skip("trc_pkt_lister (libopencsd-bin) not installed; see scripts/setup.sh");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let mut built = 0;
    let mut total_hits = 0;
    let mut failures = Vec::new();
    for compiler in Compiler::ALL {
        for prog in PROGRAMS {
            let bin = match testprogs::build(prog, compiler, tmp.path()) {
                Ok(b) => b,
                Err(BuildError::Missing(why)) => {
                    etm_testutil::skip(format!("{} with {}: {why}", prog.name, compiler.name()));
                    continue;
                }
                Err(e) => panic!("{e}"),
            };
            built += 1;
            // Small runs: the programs' argument scales their work (~100k-300k instructions).
            let arg = match prog.name {
                "loops" => "8",
                "indirect" => "6000",
                "recursion" => "18",
                "switch" => "6000",
                "flat" => "8000",
                "ab_a" | "ab_b" => "60",
                "percall_a" | "percall_b" => "2000",
                "varying" => "2000",
                _ => "600",
            };
            let args = [arg.to_string()];
            let run = qemu::run(&bin, &args, &QemuOptions::default()).expect("qemu run");
            for retstack in [true, false] {
                let cfg = SynthConfig { window: 1_000, period: 7_919, retstack, ..SynthConfig::default() };
                let work = tmp.path().join(format!("{}-{}-{retstack}", prog.name, compiler.name()));
                match check_program(&bin, &args, &run, &cfg, &work) {
                    Ok((windows, ranges, hits, mix)) => {
                        total_hits += hits;
                        eprintln!(
                            "ok: {} {} retstack={retstack}: {windows} windows, {ranges} ranges equal ({mix})",
                            prog.name,
                            compiler.name()
                        )
                    }
                    Err(e) => failures.push(e),
                }
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
    // Return-stack compression was really exercised (some returns sent no address).
    assert!(built == 0 || total_hits > 0, "no return-stack hit in any program");
    if built == 0 {
        etm_testutil::skip("no cross compiler available");
    }
}

/// `etm-bpf synth` (the CLI) writes a session, its ground truth and an OpenCSD snapshot that
/// agree: OpenCSD finds exactly the ground truth's total number of ranges in the snapshot, the
/// session has one AUX record per window and one sample per window without a `lost` fault.
#[test]
fn cli_synth_writes_consistent_session() {
    if let Err(e) = testprogs::qemu_available() {
        etm_testutil::skip(e);
        return;
    }
    let on_path = std::env::var_os("PATH").is_some_and(|p| std::env::split_paths(&p).any(|d| d.join("trc_pkt_lister").is_file()));
    if !on_path {
        etm_testutil::skip("trc_pkt_lister (libopencsd-bin) not installed; see scripts/setup.sh");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let prog = PROGRAMS.iter().find(|p| p.name == "switch").unwrap();
    let bin = match testprogs::build(prog, Compiler::Gcc, tmp.path()) {
        Ok(b) => b,
        Err(BuildError::Missing(why)) => {
            etm_testutil::skip(why);
            return;
        }
        Err(e) => panic!("{e}"),
    };
    let (sess, ss) = (tmp.path().join("sess"), tmp.path().join("ss"));
    let out = Command::new(etm_bpf_tests::etm_bpf_bin())
        .args(["synth", "--out"])
        .arg(&sess)
        .args(["--window", "500", "--period", "3000", "--fault", "lost@2", "--snapshot"])
        .arg(&ss)
        .arg("--")
        .arg(&bin)
        .arg("3000")
        .output()
        .unwrap();
    assert!(out.status.success(), "etm-bpf synth failed: {}", String::from_utf8_lossy(&out.stderr));
    let gt = gtfile::read(std::io::BufReader::new(std::fs::File::open(sess.join(GROUND_TRUTH_FILE)).unwrap())).unwrap();
    assert!(gt.windows.len() >= 10);
    assert_eq!(gt.meta.window, 500);
    assert_eq!(gt.windows[2].fault, Some(etm_synth::generate::Fault::Lost));
    let events = std::fs::read_to_string(sess.join("events.jsonl")).unwrap();
    let count = |t: &str| events.lines().filter(|l| l.starts_with(&format!("{{\"type\":\"{t}\""))).count();
    assert_eq!(count("aux"), gt.windows.len());
    assert_eq!(count("sample"), gt.windows.len() - 1);
    assert_eq!(count("lost"), 1);
    assert!(sess.join("images").join(bin.file_name().unwrap()).is_file(), "program copied into images/");
    let log = tmp.path().join("decode.ppl");
    let st = Command::new("trc_pkt_lister").arg("-ss_dir").arg(&ss).arg("-decode").arg("-logfilename").arg(&log).output();
    assert!(st.unwrap().status.success());
    let (ranges, bad) = parse_ranges(&std::fs::read_to_string(&log).unwrap());
    assert!(bad.is_empty(), "{bad:?}");
    assert_eq!(ranges.len() as u64, gt.totals.ranges);
}
