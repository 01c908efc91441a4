//! The simpleperf ETM capture `perf-data/perf_etm.snapshot` (AUX trace of `etm_test_loop`,
//! CPU 7) must decode to exactly the instruction ranges and taken branches that simpleperf's
//! own AutoFDO injection found (`simpleperf-testdata-etm/perf_inject.data`, produced by AOSP
//! simpleperf from the same `perf_etm.data`, independent of our code).
//!
//! `perf_inject.data` lists ranges as `start-last:count` (last = address of the last
//! instruction) and taken branches as `from->to:count`, as offsets in the binary. simpleperf
//! writes the target of a *direct* branch and `0` for an *indirect* one (RET, BR: target not
//! encoded in the instruction). Our ranges come from the element decoder; our branches from
//! [`BranchBuilder`] (perf's rules: from = last instruction of a range ending in a taken branch,
//! to = start of the next range), converted to simpleperf's convention (indirect -> 0); a taken
//! indirect branch right before a trace discontinuity is also counted (`->0`), as simpleperf
//! counts every taken branch.

use std::collections::BTreeMap;
use std::ops::ControlFlow;

use etm_decode::branches::BranchBuilder;
use etm_decode::elements::ElementKind;
use etm_decode::insn::InstrType;
use etm_decode::pipeline::decode_snapshot_buffer;
use etm_decode::snapshot::{DirFiles, Snapshot};

mod common;
use common::shared_dir;

type Counts = BTreeMap<(u64, u64), u64>;

fn parse_inject(text: &str) -> (Counts, Counts) {
    let mut lines = text.lines().filter(|l| !l.starts_with("//"));
    let mut section = |sep: &str| -> Counts {
        let n: usize = lines.next().unwrap().trim().parse().unwrap();
        let mut m = Counts::new();
        for _ in 0..n {
            let l = lines.next().unwrap();
            let (k, c) = l.rsplit_once(':').unwrap();
            let (a, b) = k.split_once(sep).unwrap();
            let a = u64::from_str_radix(a, 16).unwrap();
            let b = u64::from_str_radix(b, 16).unwrap();
            *m.entry((a, b)).or_default() += c.parse::<u64>().unwrap();
        }
        m
    };
    let ranges = section("-");
    let _addrs = section("-");
    let branches = section("->");
    (ranges, branches)
}

/// Ranges and branches from our decode equal simpleperf's AutoFDO injection output.
#[test]
fn perf_etm_matches_simpleperf_inject() {
    let base = shared_dir().join("testdata/etm/perf-data");
    let snapdir = base.join("perf_etm.snapshot");
    let inject = base.join("simpleperf-testdata-etm/perf_inject.data");
    if !snapdir.is_dir() || !inject.is_file() {
        etm_testutil::skip(format!("{} or {} not found (set ETM_BPF_SHARED)", snapdir.display(), inject.display()));
        return;
    }
    let (want_ranges, want_branches) = parse_inject(&std::fs::read_to_string(&inject).unwrap());
    assert!(!want_ranges.is_empty() && !want_branches.is_empty());

    let files = DirFiles::new(&snapdir);
    let snap = Snapshot::parse(&files).unwrap();
    // load bias of the binary: the dump maps file offset `offset` at `address`
    let dump = snap.devices.iter().flat_map(|d| d.dumps.iter()).find(|d| d.file == "etm_test_loop").unwrap();
    let bias = dump.address - dump.offset;
    let buf = snap.buffer("AUX_CPU7").unwrap().clone();

    let mut ranges = Counts::new();
    let mut branches = Counts::new();
    let mut bb = BranchBuilder::new(64);
    decode_snapshot_buffer(&snap, &files, &buf, &mut |e| {
        match e.kind {
            ElementKind::InstrRange(r) => {
                *ranges.entry((r.start - bias, r.last_instr_addr() - bias)).or_default() += 1;
            }
            ElementKind::TraceOn(_) | ElementKind::NoSync(_) | ElementKind::EoTrace(_) => {
                if let Some((r, true)) = bb.last_range() {
                    assert_eq!(r.last_type, InstrType::BrIndirect, "direct branch before a discontinuity");
                    *branches.entry((r.last_instr_addr() - bias, 0)).or_default() += 1;
                }
            }
            _ => {}
        }
        let prev = bb.last_range();
        if let Some(rec) = bb.element(e) {
            let (r, _) = prev.unwrap();
            let to = if r.last_type == InstrType::BrIndirect { 0 } else { rec.to - bias };
            *branches.entry((rec.from - bias, to)).or_default() += 1;
        }
        ControlFlow::Continue(())
    })
    .unwrap();

    assert_eq!(ranges, want_ranges, "instruction ranges differ from simpleperf's");
    assert_eq!(branches, want_branches, "branches differ from simpleperf's");
}
