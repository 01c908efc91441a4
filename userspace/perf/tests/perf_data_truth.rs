//! The record parser and the AUX cursor checked against perf.data files recorded by real
//! kernels (simpleperf test data, ETMv4 + ETR and ETE + TRBE devices) and against the perf
//! tool's own decode of the same files (`perf report -D`, stored next to them).

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::process::Command;

use etm_perf::attr::trcconfigr_for;
use etm_perf::discovery::{CsEtmSystem, TraceArch, trace_arch};
use etm_perf::format::ConfigWords;
use etm_perf::perf_data::{PERF_RECORD_AUXTRACE, PerfData};
use etm_perf::records::{Mmap2FileId, PerfRecord, parse_record};
use etm_perf::ring::AuxCursor;

fn shared() -> PathBuf {
    std::env::var_os("ETM_BPF_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared"))
}

const FILES: [&str; 4] = ["perf_etm", "perf_kernel", "perf_with_missing_aux_data", "perf_with_unformatted_trace"];

fn load(name: &str) -> Option<(Vec<u8>, String)> {
    let dir = shared().join("testdata/etm/perf-data/simpleperf-testdata-etm");
    let data = std::fs::read(dir.join(format!("{name}.data"))).ok()?;
    let out = Command::new("xz").arg("-dc").arg(dir.join(format!("{name}.perf-report-D.txt.xz"))).output().ok()?;
    out.status.success().then(|| (data, String::from_utf8_lossy(&out.stdout).into_owned()))
}

/// perf prints u64 fields with `%#lx` (0 as "0") or decimal.
fn num(s: &str) -> u64 {
    let s = s.trim_end_matches([',', ':']);
    match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).unwrap(),
        None => s.parse::<i64>().map(|v| v as u64).unwrap(),
    }
}

struct DumpLine {
    cpu: u64,
    time: u64,
    size: u64,
    name: String,
    rest: String,
}

/// `cpu time offset [size]: PERF_RECORD_X rest` lines keyed by file offset.
fn dump_lines(text: &str) -> BTreeMap<u64, DumpLine> {
    let mut m = BTreeMap::new();
    for line in text.lines() {
        let t: Vec<&str> = line.splitn(6, ' ').collect();
        if t.len() < 5 || !t[4].starts_with("PERF_RECORD_") || !t[2].starts_with("0x") || t[2] == "0x0" {
            continue;
        }
        let (Ok(cpu), Ok(time)) = (t[0].parse::<u64>(), t[1].parse::<u64>()) else { continue };
        let size = num(t[3].trim_start_matches('[').trim_end_matches("]:"));
        m.insert(num(t[2]), DumpLine { cpu, time, size, name: t[4].to_string(), rest: t.get(5).unwrap_or(&"").to_string() });
    }
    m
}

/// Every kernel record in the four files parses, and its fields equal what `perf report -D`
/// printed for the same file offset.
#[test]
fn records_match_perf_report_dump() {
    let mut checked = 0;
    for name in FILES {
        let Some((data, dump)) = load(name) else {
            etm_testutil::skip(format!("{name}: shared test data or xz missing (set ETM_BPF_SHARED)"));
            return;
        };
        let pd = PerfData::parse(&data).unwrap();
        let fmt = pd.attrs[0].0.sample_format();
        let lines = dump_lines(&dump);
        let mut per_type: HashMap<u32, usize> = HashMap::new();
        for r in pd.records() {
            let rec = parse_record(r.bytes, &fmt).unwrap_or_else(|e| panic!("{name} @{:#x}: {e}", r.offset));
            if rec.ty >= 64 {
                continue;
            }
            let l = lines.get(&(r.offset as u64)).unwrap_or_else(|| panic!("{name}: perf printed nothing at {:#x}", r.offset));
            assert_eq!(l.size, r.bytes.len() as u64);
            assert_eq!(l.time, rec.sample_id.time.unwrap_or(0), "{name} @{:#x} time", r.offset);
            assert_eq!(l.cpu, u64::from(rec.sample_id.cpu.unwrap_or(0)), "{name} @{:#x} cpu", r.offset);
            *per_type.entry(rec.ty).or_default() += 1;
            let w: Vec<&str> = l.rest.split_whitespace().collect();
            match rec.kind {
                PerfRecord::Aux { aux_offset, aux_size, flags } => {
                    assert_eq!(l.name, "PERF_RECORD_AUX");
                    assert_eq!((w[0], w[2], w[4]), ("offset:", "size:", "flags:"));
                    assert_eq!((num(w[1]), num(w[3]), num(w[5])), (aux_offset, aux_size, flags), "{name} @{:#x}", r.offset);
                }
                PerfRecord::ItraceStart { pid, tid } => {
                    assert_eq!(l.name, "PERF_RECORD_ITRACE_START");
                    assert_eq!((num(w[1]), num(w[3])), (u64::from(pid), u64::from(tid)));
                }
                PerfRecord::Comm { pid, tid, comm, exec } => {
                    let s = if exec { l.rest.strip_prefix("exec: ").unwrap().to_string() } else { l.rest.clone() };
                    assert_eq!(l.name, if exec { "PERF_RECORD_COMM" } else { "PERF_RECORD_COMM:" });
                    assert_eq!(s, format!("{}:{pid}/{tid}", String::from_utf8_lossy(comm)));
                }
                PerfRecord::Exit { pid, ppid, tid, ptid, .. } => {
                    assert_eq!(l.name, format!("PERF_RECORD_EXIT({pid}:{tid}):({ppid}:{ptid})"));
                }
                PerfRecord::Mmap2(m) => {
                    assert_eq!(l.name, "PERF_RECORD_MMAP2");
                    let Mmap2FileId::Inode { maj, min, ino, ino_generation } = m.file_id else { panic!("build-id mmap2") };
                    let want = format!(
                        "{}/{}: [{:#x}({:#x}) @ {:#x} {:02x}:{:02x} {} {}]:",
                        m.pid, m.tid, m.addr, m.len, m.pgoff, maj, min, ino, ino_generation
                    )
                    .replace("@ 0x0 ", "@ 0 ");
                    assert!(l.rest.starts_with(&want), "{name} @{:#x}: {:?} vs {want:?}", r.offset, l.rest);
                    assert!(l.rest.ends_with(&*String::from_utf8_lossy(m.filename)));
                }
                PerfRecord::Mmap { pid, tid, addr, len, pgoff, filename } => {
                    assert_eq!(l.name, "PERF_RECORD_MMAP");
                    let want =
                        format!("{}/{}: [{:#x}({:#x}) @ {:#x}]:", pid as i32, tid, addr, len, pgoff).replace("@ 0x0]", "@ 0]");
                    assert!(l.rest.starts_with(&want), "{:?} vs {want:?}", l.rest);
                    assert!(l.rest.ends_with(&*String::from_utf8_lossy(filename)));
                }
                other => panic!("{name}: unexpected kernel record {other:?}"),
            }
            checked += 1;
        }
        // perf printed exactly as many records of each kernel type as we parsed.
        for (ty, n) in per_type {
            let tname = match ty {
                1 => "PERF_RECORD_MMAP",
                3 => "PERF_RECORD_COMM",
                4 => "PERF_RECORD_EXIT",
                10 => "PERF_RECORD_MMAP2",
                11 => "PERF_RECORD_AUX",
                12 => "PERF_RECORD_ITRACE_START",
                _ => continue,
            };
            let perf_n = lines
                .values()
                .filter(|l| l.name.trim_end_matches(':') == tname || l.name.starts_with(&format!("{tname}(")))
                .count();
            assert_eq!(perf_n, n, "{name}: count of {tname}");
        }
    }
    assert!(checked > 800, "only {checked} records checked");
}

/// The AUX records of real sessions form a contiguous stream per CPU (no gaps/overlaps in the
/// cursor), and the windows the cursor copies out of a ring rebuilt from the AUXTRACE payloads
/// are exactly the bytes perf saved for them.
#[test]
fn aux_cursor_on_recorded_streams() {
    for name in FILES {
        let Some((data, _)) = load(name) else {
            etm_testutil::skip(format!("{name}: shared test data or xz missing"));
            return;
        };
        let pd = PerfData::parse(&data).unwrap();
        let fmt = pd.attrs[0].0.sample_format();
        // AUXTRACE: {size, offset, reference, idx u32, tid u32, cpu u32, reserved}
        let mut trace: BTreeMap<u32, Vec<(u64, &[u8])>> = BTreeMap::new();
        let mut auxrecs: BTreeMap<u32, Vec<(u64, u64, u64)>> = BTreeMap::new();
        for r in pd.records() {
            let rec = parse_record(r.bytes, &fmt).unwrap();
            if rec.ty == PERF_RECORD_AUXTRACE {
                let off = u64::from_le_bytes(r.bytes[16..24].try_into().unwrap());
                let cpu = u32::from_le_bytes(r.bytes[40..44].try_into().unwrap());
                trace.entry(cpu).or_default().push((off, r.aux_payload));
            }
            if let PerfRecord::Aux { aux_offset, aux_size, flags } = rec.kind {
                auxrecs.entry(rec.sample_id.cpu.unwrap()).or_default().push((aux_offset, aux_size, flags));
            }
        }
        for (cpu, recs) in &auxrecs {
            let size = 1u64 << 24;
            let mut cur = AuxCursor::new(size, 0);
            let mut ring = vec![0u8; size as usize];
            for (off, payload) in trace.get(cpu).into_iter().flatten() {
                for (i, b) in payload.iter().enumerate() {
                    ring[((off + i as u64) % size) as usize] = *b;
                }
            }
            let mut total = 0;
            for &(o, s, f) in recs {
                let w = cur.on_aux_record(o, s, f);
                assert_eq!((w.start, w.len), (o, s), "{name} cpu{cpu}");
                let mut out = Vec::new();
                assert!(cur.copy_window(&ring, &w, &mut out));
                if let Some(saved) = trace.get(cpu) {
                    for (toff, payload) in saved {
                        if o >= *toff && o + s <= toff + payload.len() as u64 {
                            assert_eq!(&out[..], &payload[(o - toff) as usize..(o - toff + s) as usize]);
                        }
                    }
                }
                assert_eq!(w.is_raw(), name == "perf_with_unformatted_trace", "{name}: format flag");
                total += s;
            }
            assert_eq!((cur.stats.gap_bytes, cur.stats.overlaps, cur.stats.bytes), (0, 0, total), "{name} cpu{cpu}");
            if let Some(saved) = trace.get(cpu) {
                let saved_total: u64 = saved.iter().map(|(_, p)| p.len() as u64).sum();
                // perf pads each AUXTRACE payload to 8 bytes (PERF_AUXTRACE_RECORD_ALIGNMENT).
                assert!(
                    saved_total >= total && saved_total - total < 8 * saved.len() as u64,
                    "{name} cpu{cpu}: AUXTRACE {saved_total} vs AUX {total}"
                );
            }
        }
    }
}

/// TRCCONFIGR synthesised from the recorded attr's config (with the mainline format fields of
/// the N1 fixture) equals what perf wrote into each file's AUXTRACE_INFO for every CPU, and the
/// ETE/ETMv4 classification of the recorded ID registers is consistent with the recording:
/// ETMv4 magic (0x4040..) blocks classify as ETMv4; ETE-magic (0x5050..) blocks, which carry
/// TRCDEVARCH, classify as ETE exactly when TRCIDR1's architecture fields read 0xF/0xF (how an
/// ETE reports itself there). simpleperf wrote the ETE magic for an ETMv4.2 unit (TRCDEVARCH
/// 0x47724a13, TRCIDR1 0x4100f423) in perf_with_missing_aux_data: that one must be ETMv4.2.
#[test]
fn trcconfigr_and_arch_match_auxtrace_info() {
    let sys = CsEtmSystem::discover(&PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/n1-etr")).unwrap();
    let mut cpus_checked = 0;
    for name in FILES {
        let Some((data, _)) = load(name) else {
            etm_testutil::skip(format!("{name}: shared test data or xz missing"));
            return;
        };
        let pd = PerfData::parse(&data).unwrap();
        let attr = pd.attrs[0].0;
        let words = ConfigWords { config: attr.config, config1: attr.config1, config2: attr.config2, config3: attr.config3 };
        let want_cfgr = trcconfigr_for(&sys, &words);
        let info = pd
            .records()
            .into_iter()
            .find(|r| u32::from_le_bytes(r.bytes[0..4].try_into().unwrap()) == 70)
            .expect("AUXTRACE_INFO");
        let q: Vec<u64> = info.bytes[16..].chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap())).collect();
        let nr_cpu = (q[1] & 0xffff_ffff) as usize;
        let mut i = 3;
        for _ in 0..nr_cpu {
            let (magic, n) = (q[i], q[i + 2] as usize);
            let p = &q[i + 3..i + 3 + n];
            // ETMv4: CONFIGR, TRACEIDR, IDR0, IDR1, IDR2, IDR8, AUTHSTATUS[, TS_SOURCE];
            // ETE: the same with DEVARCH after AUTHSTATUS.
            assert_eq!(p[0] as u32, want_cfgr, "{name} cpu {}", q[i + 1]);
            let devarch = (magic == 0x5050_5050_5050_5050).then(|| p[7] as u32);
            let arch = trace_arch(devarch, p[3] as u32);
            if magic == 0x4040_4040_4040_4040 {
                assert!(matches!(arch, TraceArch::Etm4 { .. }), "{name}: {arch:?}");
            } else {
                let idr1_ete = (p[3] >> 4) & 0xff == 0xff;
                assert_eq!(matches!(arch, TraceArch::Ete { .. }), idr1_ete, "{name}: {arch:?}");
                if !idr1_ete {
                    assert_eq!(arch, TraceArch::Etm4 { minor: 2 }, "{name}");
                }
            }
            cpus_checked += 1;
            i += 3 + n;
        }
    }
    assert!(cpus_checked >= 20, "{cpus_checked}");
}
