//! Element-level conformance against OpenCSD 1.8.0 reference decodes.
//!
//! For every snapshot under `$ETM_BPF_SHARED/testdata/etm` (default `<repo>/../shared`) and
//! every full-decode reference `<name>[.<BUFFER>].decode.ppl.xz` (and the `-src_addr_n` and
//! `-multi_session` variants `<name>.decode.{src_addr_n,multi_session}.ppl.xz`, and the juno_r1_1
//! decoder-option variants `.decode.{rangelimit,badopcode,aa64_opcode_chk}.ppl.xz`, decoded with
//! the matching `DecodeOptions`) in it, we decode the buffer
//! with our deformatter + packet parser + instruction-level decoder over the snapshot's memory
//! image and compare our `OCSD_GEN_TRC_ELEM_*` lines with the reference's element lines,
//! normalising only whitespace (packet lines, header and OpenCSD's error messages are not
//! element lines). The references were produced by `trc_pkt_lister -ss_dir <name> -decode
//! -no_time_print` (see the test-data README), so they are independent of our code.
//!
//! Snapshots listed in `MUST_MATCH` must stay 100% identical; the test fails otherwise.
//! Set `ETM_ELEMENTS_DUMP=<dir>` to write `<label>.ours` / `<label>.ref` for diffing.

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

use etm_decode::decoder::DecodeOptions;
use etm_decode::pipeline::{decode_snapshot_buffer_opts, decode_snapshot_multi_session};
use etm_decode::snapshot::{DirFiles, Snapshot};

mod common;
use common::{matched_lines, norm, shared_dir, snapshot_dirs, xz_text};

/// Snapshot references whose element lines we reproduce exactly.
const MUST_MATCH: &[&str] = &[
    "002-ack_test_scr",
    "002-ack_test_scr.src_addr_n",
    "a55-test-tpiu",
    "a57_single_step",
    "armv8_1m_branches",
    "bugfix-exact-match",
    "ete-bc-instr",
    "ete-ite-instr",
    "ete-ite-instr.multi_session",
    "ete-wfet",
    "ete_ip",
    "ete_ip.src_addr_n",
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
    "juno_r1_1.aa64_opcode_chk",
    "juno_r1_1.badopcode",
    "juno_r1_1.rangelimit",
    "maxspec0_commopt1",
    "maxspec78_commopt0",
    "pauth_lr",
    "pauth_lr.multi_session",
    "pauth_lr_Rm",
    "pauth_lr_Rm.multi_session",
    "perf_etm.AUX_CPU7",
    "perf_kernel.AUX_CPU0",
    "perf_kernel.AUX_CPU6",
    "perf_with_unformatted_trace.AUX_CPU0",
    "q_elem",
    "q_elem.multi_session",
    "rme_test",
    "rme_test.multi_session",
    "s_9001",
    "s_9001.multi_session",
    "src_addr",
    "src_addr.src_addr_n",
    "ss_ib_el1ns",
    "ss_ib_el1ns.multi_session",
    "texit-poe2",
    "tme_simple",
    "tme_tcancel",
    "tme_test",
    "trace_file_cid_vmid",
    "trace_file_vmid",
    "ts_bit64_set",
    "ts_marker",
];

/// Element lines of a reference listing. OpenCSD error messages have no trailing newline, so
/// an element line may be glued to one: keep the text from the last `Idx:` before the element.
fn reference_elements(text: &str) -> Vec<String> {
    let mut v = Vec::new();
    for l in text.lines() {
        if let Some(p) = l.find("OCSD_GEN_TRC_ELEM_") {
            let start = l[..p].rfind("Idx:").unwrap_or(0);
            v.push(norm(&l[start..]));
        }
    }
    v
}

struct Case {
    label: String,
    dir: PathBuf,
    reference: PathBuf,
    buffer: Option<String>,
    /// reference made with `-src_addr_n`
    src_addr_n: bool,
    /// reference made with `-multi_session` (all buffers, one decoder)
    multi: bool,
    /// decoder options of the juno_r1_1 error-injection variants
    opts: DecodeOptions,
}

/// The juno_r1_1 variants made with decoder options (test-data README, "Reference output
/// files"): `OPENCSD_INSTR_RANGE_LIMIT=100`, `OPENCSD_ERR_ON_AA64_BAD_OPCODE=1` and
/// `-aa64_opcode_chk` (the last two select the same check).
const OPTION_VARIANTS: &[(&str, DecodeOptions)] = &[
    ("rangelimit", DecodeOptions { range_limit: 100, aa64_opcode_chk: false }),
    ("badopcode", DecodeOptions { range_limit: 0, aa64_opcode_chk: true }),
    ("aa64_opcode_chk", DecodeOptions { range_limit: 0, aa64_opcode_chk: true }),
];

fn cases(etm: &Path) -> Vec<Case> {
    let dirs = snapshot_dirs(etm);
    let mut v = Vec::new();
    for d in dirs {
        let dname = d.file_name().unwrap().to_string_lossy().into_owned();
        let stem = dname.trim_end_matches(".snapshot").to_string();
        let mut refs: Vec<PathBuf> = std::fs::read_dir(&d)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                let f = p.file_name().unwrap().to_string_lossy().into_owned();
                // the `-decode` references, their -src_addr_n / -multi_session variants and the option variants
                f == format!("{stem}.decode.src_addr_n.ppl.xz")
                    || f == format!("{stem}.decode.multi_session.ppl.xz")
                    || OPTION_VARIANTS.iter().any(|(v, _)| f == format!("{stem}.decode.{v}.ppl.xz"))
                    || f.ends_with(".decode.ppl.xz") && {
                        let mid = f.trim_end_matches(".decode.ppl.xz");
                        mid == stem || (mid.starts_with(&format!("{stem}.AUX_CPU")))
                    }
            })
            .collect();
        refs.sort();
        for r in refs {
            let fname = r.file_name().unwrap().to_string_lossy().into_owned();
            if let Some((variant, opts)) = OPTION_VARIANTS.iter().find(|(x, _)| fname == format!("{stem}.decode.{x}.ppl.xz")) {
                let label = format!("{stem}.{variant}");
                v.push(Case { label, dir: d.clone(), reference: r, buffer: None, src_addr_n: false, multi: false, opts: *opts });
                continue;
            }
            if fname.ends_with(".decode.src_addr_n.ppl.xz") {
                let label = format!("{stem}.src_addr_n");
                v.push(Case {
                    label,
                    dir: d.clone(),
                    reference: r,
                    buffer: None,
                    src_addr_n: true,
                    multi: false,
                    opts: DecodeOptions::default(),
                });
                continue;
            }
            if fname.ends_with(".decode.multi_session.ppl.xz") {
                let label = format!("{stem}.multi_session");
                v.push(Case {
                    label,
                    dir: d.clone(),
                    reference: r,
                    buffer: None,
                    src_addr_n: false,
                    multi: true,
                    opts: DecodeOptions::default(),
                });
                continue;
            }
            let mid = fname.trim_end_matches(".decode.ppl.xz");
            let buffer = mid.strip_prefix(&format!("{stem}.")).map(str::to_string);
            v.push(Case {
                label: mid.to_string(),
                dir: d.clone(),
                reference: r,
                buffer,
                src_addr_n: false,
                multi: false,
                opts: DecodeOptions::default(),
            });
        }
    }
    v
}

/// Every decode reference is compared; the per-snapshot identical-line percentage is printed
/// and the snapshots in `MUST_MATCH` must be identical.
#[test]
fn elements_match_opencsd_references() {
    let etm = shared_dir().join("testdata/etm");
    if !etm.is_dir() {
        etm_testutil::skip(format!("{} not found (set ETM_BPF_SHARED)", etm.display()));
        return;
    }
    let only = std::env::var("ETM_ELEMENTS_ONLY").ok();
    let dump = std::env::var_os("ETM_ELEMENTS_DUMP").map(PathBuf::from);
    let cases = cases(&etm);
    assert!(!cases.is_empty(), "no .decode.ppl.xz references under {}", etm.display());
    let mut failures = Vec::new();
    let mut identical = Vec::new();
    for c in &cases {
        if let Some(o) = &only
            && !o.split(',').any(|x| x == c.label)
        {
            continue;
        }
        let files = DirFiles::new(&c.dir);
        let snap = Snapshot::parse(&files).unwrap_or_else(|e| panic!("{}: {e}", c.label));
        let buf = match &c.buffer {
            Some(b) => snap.buffer(b).unwrap_or_else(|| panic!("{}: no buffer {b}", c.label)).clone(),
            None => snap.first_buffer().unwrap().clone(),
        };
        let mut ours = Vec::new();
        let mut line = Vec::new();
        let mut push = |e: &etm_decode::elements::Element| {
            // the listing writer the CLI uses (its text equals `Display`, see unit tests)
            line.clear();
            e.write_line(&mut line);
            // (elements OpenCSD has no line for, such as TRACE_INFO, write nothing)
            if !line.is_empty() {
                ours.push(norm(std::str::from_utf8(&line).unwrap()));
            }
            ControlFlow::Continue(())
        };
        if c.multi {
            decode_snapshot_multi_session(&snap, &files, &mut push).unwrap();
        } else {
            decode_snapshot_buffer_opts(&snap, &files, &buf, c.src_addr_n, c.opts, &mut push).unwrap();
        }
        let reference = reference_elements(&xz_text(&c.reference));
        if let Some(d) = &dump {
            let _ = std::fs::create_dir_all(d);
            let _ = std::fs::write(d.join(format!("{}.ours", c.label)), ours.join("\n") + "\n");
            let _ = std::fs::write(d.join(format!("{}.ref", c.label)), reference.join("\n") + "\n");
        }
        let m = matched_lines(&reference, &ours);
        let total = reference.len().max(ours.len());
        let pct = 100.0 * m as f64 / total.max(1) as f64;
        let same = reference == ours;
        if same {
            identical.push(c.label.clone());
        }
        let first_diff = reference.iter().zip(&ours).position(|(a, b)| a != b);
        eprintln!(
            "{:<45} ref {:>8} ours {:>8} identical {:>7.3}%{}",
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
    eprintln!("{}/{} element references identical: {identical:?}", identical.len(), cases.len());
    if only.is_none() {
        // every MUST_MATCH label must have been found and compared (a missing file is a failure)
        for l in MUST_MATCH {
            assert!(cases.iter().any(|c| c.label == *l), "reference for {l} not found");
        }
    }
    assert!(failures.is_empty(), "regressed against the reference: {failures:?}");
}
