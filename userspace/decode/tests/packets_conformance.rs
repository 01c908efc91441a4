//! Packet-level conformance against OpenCSD 1.8.0 reference listings.
//!
//! For every snapshot under `$ETM_BPF_SHARED/testdata/etm` (default `<repo>/../shared`) and
//! every packet reference `<name>[.<BUFFER>].pkt.ppl.xz` in it, we list the buffer's packets
//! with our deformatter + parser + printer and compare with the reference line by line,
//! normalising only whitespace and skipping the header (tool banner, command line, snapshot
//! path). The references were produced by `trc_pkt_lister -ss_dir <name> -no_time_print`
//! (see the test-data README), so they are independent of our code.
//!
//! Snapshots listed in `MUST_MATCH` must stay 100% identical; the test fails otherwise.

use std::path::{Path, PathBuf};

use etm_decode::listing::{ListOptions, list_buffer};
use etm_decode::snapshot::{DirFiles, Snapshot};

mod common;
use common::{matched_lines, norm, shared_dir, snapshot_dirs, xz_text};

/// Snapshot references (directory/reference stem) that we reproduce exactly.
const MUST_MATCH: &[&str] = &[
    "002-ack_test_scr",
    "a55-test-tpiu",
    "a57_single_step",
    "armv8_1m_branches",
    "bugfix-exact-match",
    "ete-bc-instr",
    "ete-ite-instr",
    "ete-wfet",
    "ete_ip",
    "ete_mem",
    "ete_spec_1",
    "ete_spec_2",
    "ete_spec_3",
    "event_test",
    "feat_cmpbr",
    "infrastructure",
    "init-short-addr",
    "juno-ret-stck",
    "juno-uname-001",
    "juno_r1_1",
    "maxspec0_commopt1",
    "maxspec78_commopt0",
    "pauth_lr",
    "pauth_lr_Rm",
    "perf_etm.AUX_CPU7",
    "perf_kernel.AUX_CPU0",
    "perf_kernel.AUX_CPU6",
    "perf_with_unformatted_trace.AUX_CPU0",
    "q_elem",
    "rme_test",
    "s_9001",
    "src_addr",
    "ss_ib_el1ns",
    "texit-poe2",
    "tme_simple",
    "tme_tcancel",
    "tme_test",
    "trace_file_cid_vmid",
    "trace_file_vmid",
    "ts_bit64_set",
    "ts_marker",
];

/// Reference lines from the first `Protocol printer` line on.
fn reference_lines(text: &str) -> Vec<String> {
    let mut started = false;
    let mut v = Vec::new();
    for l in text.lines() {
        if !started && l.starts_with("Trace Packet Lister : Protocol printer") {
            started = true;
        }
        if started && !l.trim().is_empty() {
            v.push(norm(l));
        }
    }
    v
}

struct Case {
    label: String,
    dir: PathBuf,
    reference: PathBuf,
    buffer: Option<String>,
}

fn cases(etm: &Path) -> Vec<Case> {
    let dirs = snapshot_dirs(etm);
    let mut v = Vec::new();
    for d in dirs {
        let mut refs: Vec<PathBuf> = std::fs::read_dir(&d)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.to_string_lossy().ends_with(".pkt.ppl.xz"))
            .collect();
        refs.sort();
        let dname = d.file_name().unwrap().to_string_lossy().into_owned();
        let stem = dname.trim_end_matches(".snapshot").to_string();
        for r in refs {
            let fname = r.file_name().unwrap().to_string_lossy().into_owned();
            let mid = fname.trim_end_matches(".pkt.ppl.xz");
            let buffer = mid.strip_prefix(&format!("{stem}.")).map(str::to_string);
            v.push(Case { label: mid.to_string(), dir: d.clone(), reference: r, buffer });
        }
    }
    v
}

/// Every packet reference is compared; the per-snapshot identical-line percentage is printed
/// and the snapshots in `MUST_MATCH` must be identical.
#[test]
fn packets_match_opencsd_references() {
    let etm = shared_dir().join("testdata/etm");
    if !etm.is_dir() {
        etm_testutil::skip(format!("{} not found (set ETM_BPF_SHARED)", etm.display()));
        return;
    }
    let cases = cases(&etm);
    assert!(!cases.is_empty(), "no .pkt.ppl.xz references under {}", etm.display());
    let mut failures = Vec::new();
    let mut identical = 0;
    for c in &cases {
        let files = DirFiles::new(&c.dir);
        let snap = Snapshot::parse(&files).unwrap_or_else(|e| panic!("{}: {e}", c.label));
        let buf = match &c.buffer {
            Some(b) => snap.buffer(b).unwrap_or_else(|| panic!("{}: no buffer {b}", c.label)).clone(),
            None => snap.first_buffer().unwrap().clone(),
        };
        let mut ours = Vec::new();
        list_buffer(&snap, &files, &buf, ListOptions::default(), &mut |l| ours.push(norm(l))).unwrap();
        let reference = reference_lines(&xz_text(&c.reference));
        let m = matched_lines(&reference, &ours);
        let total = reference.len().max(ours.len());
        let pct = 100.0 * m as f64 / total.max(1) as f64;
        let same = reference == ours;
        if same {
            identical += 1;
        }
        let first_diff = reference.iter().zip(&ours).position(|(a, b)| a != b);
        eprintln!(
            "{:<45} ref {:>7} ours {:>7} identical {:>7.3}%{}",
            c.label,
            reference.len(),
            ours.len(),
            pct,
            match first_diff {
                Some(i) => format!("\n    first diff line {i}:\n    ref : {}\n    ours: {}", reference[i], ours[i]),
                None if !same => "  (length differs)".to_string(),
                None => String::new(),
            }
        );
        if MUST_MATCH.contains(&c.label.as_str()) && !same {
            failures.push(c.label.clone());
        }
    }
    eprintln!("{identical}/{} packet references identical", cases.len());
    assert!(failures.is_empty(), "regressed against the reference: {failures:?}");
}

/// Packet lines (with raw bytes) of a `-decode` listing: lines `Idx:..; ID:..; [0x..];...`.
/// Library error messages are printed without a newline, so a packet line may follow one on
/// the same line; we cut such a line at its first `Idx:` (on both sides).
fn packet_lines_with_bytes(lines: impl Iterator<Item = String>) -> Vec<String> {
    let mut v = Vec::new();
    for l in lines {
        let l = match l.find("Idx:") {
            Some(i) => l[i..].to_string(),
            None => continue,
        };
        // `Idx:N; ID:N; [` marks a packet line (element lines have no bytes)
        let mut parts = l.splitn(3, "; ");
        let (_, _, rest) = (parts.next(), parts.next(), parts.next().unwrap_or(""));
        if rest.starts_with('[') {
            v.push(norm(&l));
        }
    }
    v
}

/// The packet lines inside the `-decode` references (raw bytes and every unsynchronised block
/// shown, as OpenCSD's packet monitor prints them) match our listing with raw bytes.
#[test]
fn packet_lines_of_decode_listings_match() {
    let etm = shared_dir().join("testdata/etm");
    if !etm.is_dir() {
        etm_testutil::skip(format!("{} not found (set ETM_BPF_SHARED)", etm.display()));
        return;
    }
    let mut n = 0;
    let mut bad = Vec::new();
    for c in cases(&etm) {
        let dec = c.reference.to_string_lossy().replace(".pkt.ppl.xz", ".decode.ppl.xz");
        let dec = PathBuf::from(dec);
        if !dec.is_file() {
            continue;
        }
        let files = DirFiles::new(&c.dir);
        let snap = Snapshot::parse(&files).unwrap();
        let buf = match &c.buffer {
            Some(b) => snap.buffer(b).unwrap().clone(),
            None => snap.first_buffer().unwrap().clone(),
        };
        let mut ours = Vec::new();
        let opts = ListOptions { raw_bytes: true, ..Default::default() };
        list_buffer(&snap, &files, &buf, opts, &mut |l| ours.push(l.to_string())).unwrap();
        let ours = packet_lines_with_bytes(ours.into_iter());
        let reference = packet_lines_with_bytes(xz_text(&dec).lines().map(str::to_string));
        n += 1;
        if ours != reference {
            let i = reference.iter().zip(&ours).position(|(a, b)| a != b).unwrap_or(reference.len().min(ours.len()));
            eprintln!(
                "{}: decode-listing packet lines differ (ref {} ours {}) at {i}:\n  ref : {:?}\n  ours: {:?}",
                c.label,
                reference.len(),
                ours.len(),
                reference.get(i),
                ours.get(i)
            );
            bad.push(c.label.clone());
        }
    }
    eprintln!("{n} decode listings compared, {} differ", bad.len());
    assert!(n > 0);
    assert!(bad.is_empty(), "packet lines differ from the -decode references: {bad:?}");
}
