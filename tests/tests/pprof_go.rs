//! `profile.pb.gz` read by Go's pprof (`go tool pprof`, an independent reader of the format):
//! a live stack-only run of the chains workload (tests/workloads/chains.c) gives mappings with
//! the extents of the workload's executable segment (as `readelf -lW` prints it), locations at
//! the sampled addresses, and source lines: `-disasm` puts every sample of `spin` on one of
//! its instructions (inside its `nm -S` extent; pprof's disassembly leaves out a routine's
//! last byte, whose samples are counted from pprof's sample list) and `-list` on its source
//! lines, nearly all on the loop's.

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::Duration;

use etm_bpf_tests::{build_workload, etm_bpf_bin, parse_folded, spawn_ready, wait_timeout};

fn go_pprof(args: &[&str], profile: &std::path::Path) -> String {
    let o = Command::new("go").args(["tool", "pprof"]).args(args).arg(profile).output().expect("run go tool pprof");
    assert!(o.status.success(), "go tool pprof {args:?}: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn go_pprof_reads_addresses_mappings_and_lines() {
    if etm_bpf_tests::skip_unless_root() {
        return;
    }
    if !Command::new("go").arg("version").output().is_ok_and(|o| o.status.success()) {
        etm_testutil::skip("go not installed (scripts/setup.sh installs golang-go)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let Some(exe) = build_workload("chains", dir.path()) else { return };
    let (_workload, ready) = spawn_ready(&exe, &["60"]);
    let pid: u32 = ready.trim().strip_prefix("ready ").and_then(|p| p.parse().ok()).expect("ready PID");
    let dump = dir.path().join("dump");
    let mut run = Command::new(etm_bpf_bin())
        .args(["run", "--pid", &pid.to_string(), "--headless", "--duration", "3"])
        .arg("--dump-dir")
        .arg(&dump)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start etm-bpf");
    let st = wait_timeout(&mut run, Duration::from_secs(60));
    assert!(st.success(), "etm-bpf failed: {}", run_stderr(&mut run));
    let pb = dump.join("profile.pb.gz");
    let exe_s = exe.to_str().unwrap();

    // Mappings: the workload's executable PT_LOAD, exactly.
    let readelf = String::from_utf8(Command::new("readelf").arg("-lW").arg(&exe).output().unwrap().stdout).unwrap();
    let seg = readelf
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|f| f.first() == Some(&"LOAD") && f.contains(&"E"))
        .expect("an executable PT_LOAD");
    let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).unwrap();
    let (offset, vaddr, memsz) = (hex(seg[1]), hex(seg[2]), hex(seg[5]));
    let raw = go_pprof(&["-raw"], &pb);
    let mapping = raw
        .lines()
        .skip_while(|l| *l != "Mappings")
        .find(|l| l.contains(exe_s))
        .unwrap_or_else(|| panic!("no mapping of {exe_s}:\n{raw}"));
    let extent: Vec<u64> = mapping.split_whitespace().nth(1).unwrap().split('/').map(hex).collect();
    assert_eq!(extent, [vaddr, vaddr + memsz, offset], "{mapping}");
    let mapping_id = mapping.split(':').next().unwrap().trim().to_string();
    assert!(mapping.ends_with("[FN][FL][LN][IN]"), "{mapping}");

    // Every location in the workload's mapping lies in its segment.
    let locs: Vec<u64> = raw
        .lines()
        .skip_while(|l| *l != "Locations")
        .take_while(|l| *l != "Mappings")
        .filter(|l| l.contains(&format!(" M={mapping_id} ")))
        .map(|l| hex(l.split_whitespace().nth(1).unwrap()))
        .collect();
    assert!(!locs.is_empty(), "{raw}");
    assert!(locs.iter().all(|a| (vaddr..vaddr + memsz).contains(a)), "{locs:x?}");

    // spin's samples, from the folded file (the trie), then from pprof's disassembly and
    // source listing.
    let folded = parse_folded(&std::fs::read_to_string(dump.join("profile.folded")).unwrap());
    let spin_self: u64 = folded.iter().filter(|(p, _)| p.last().map(String::as_str) == Some("spin")).map(|(_, c)| c).sum();
    // ~2,900 at 999 Hz on an idle machine; fewer when other work shares the CPUs.
    assert!(spin_self >= 200, "{spin_self} samples in spin");
    let nm = String::from_utf8(Command::new("nm").arg("-S").arg(&exe).output().unwrap().stdout).unwrap();
    let (start, size) = nm
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|f| f.len() == 4 && f[3] == "spin")
        .map(|f| (hex(f[0]), hex(f[1])))
        .expect("spin in nm -S");
    let disasm = go_pprof(&["-sample_index=samples", "-disasm=spin"], &pb);
    let mut per_insn: BTreeMap<u64, u64> = BTreeMap::new();
    for l in disasm.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.len() >= 3
            && let (Ok(flat), Some(addr)) = (f[0].parse::<u64>(), f[2].strip_suffix(':'))
            && let Ok(addr) = u64::from_str_radix(addr, 16)
        {
            *per_insn.entry(addr).or_default() += flat;
        }
    }
    // Go pprof's disassembly stops before a routine's last byte (here spin's one-byte `ret`),
    // so the samples there, counted from pprof's own sample list, are not in it.
    let loc_addr: BTreeMap<u64, u64> = raw
        .lines()
        .skip_while(|l| *l != "Locations")
        .take_while(|l| *l != "Mappings")
        .filter_map(|l| {
            let (id, rest) = l.trim().split_once(": ")?;
            Some((id.parse().ok()?, hex(rest.split_whitespace().next()?)))
        })
        .collect();
    let at_last_byte: u64 = raw
        .lines()
        .skip_while(|l| *l != "Samples:")
        .take_while(|l| *l != "Locations")
        .filter_map(|l| {
            let (vals, ids) = l.split_once(": ")?;
            let count: u64 = vals.split_whitespace().next()?.parse().ok()?;
            let leaf: u64 = ids.split_whitespace().next()?.parse().ok()?;
            (loc_addr.get(&leaf) == Some(&(start + size - 1))).then_some(count)
        })
        .sum();
    assert_eq!(per_insn.values().sum::<u64>() + at_last_byte, spin_self, "{disasm}\n{raw}");
    assert!(per_insn.keys().all(|a| (start..start + size).contains(a)), "{per_insn:x?} outside {start:#x}+{size:#x}");
    // The loop's line of chains.c holds every sample of spin.
    let src = std::fs::read_to_string(etm_bpf_tests::repo_root().join("tests/workloads/chains.c")).unwrap();
    let loop_line = src.lines().position(|l| l.contains("sink += i * 3")).unwrap() + 1;
    let list = go_pprof(&["-sample_index=samples", "-list=spin"], &pb);
    let mut per_line: BTreeMap<usize, u64> = BTreeMap::new();
    for l in list.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.len() >= 3
            // `NN:` then the source text, which may follow the colon directly (`26:}`).
            && let (Ok(flat), Some(Ok(line))) = (f[0].parse::<u64>(), f[2].split_once(':').map(|(n, _)| n.parse::<usize>()))
        {
            *per_line.entry(line).or_default() += flat;
        }
    }
    // All on spin's lines (its signature to its closing brace), nearly all on the loop.
    let first = src.lines().position(|l| l.contains("void spin(void)")).unwrap() + 1;
    assert_eq!(per_line.values().sum::<u64>(), spin_self, "{list}");
    assert!(
        per_line.keys().all(|l| (first..=loop_line + 1).contains(l)),
        "{per_line:?}, spin is lines {first}-{}",
        loop_line + 1
    );
    assert!(per_line.get(&loop_line).copied().unwrap_or(0) * 100 >= spin_self * 95, "{per_line:?}");
}

fn run_stderr(run: &mut std::process::Child) -> String {
    etm_bpf_tests::read_all(run.stderr.take())
}
