//! `etm-bpf diff` on live profiles of two builds with known cost shares
//! (tests/workloads/ab.c): build A spends 1/2 : 1/4 : 1/4 of its time in fa : fb : fc, build B
//! 1/4 : 1/2 : 1/4. The inclusive shares move by exactly -1/4 and +1/4 (fc: 0): the diff flags
//! fa and fb as significant with those changes inside their intervals (plus 0.02 for main's
//! loop and clock reads, which take samples of their own; measured: -0.250 and +0.251 against
//! -0.25 and +0.25), does not flag fc, writes a differential flame
//! graph, and two runs of one build show no significant change. The same per calling context:
//! the paths through fa and fb move by those quarters, fc's not, and nothing moves between two
//! runs of one build.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use etm_bpf_tests::{c_compiler, etm_bpf_bin, repo_root, spawn_ready, wait_timeout};

fn build(dir: &Path, name: &str, defs: &[&str]) -> PathBuf {
    let out = dir.join(name);
    let st = Command::new(c_compiler().expect("a C compiler"))
        .args(["-O1", "-g", "-fno-omit-frame-pointer", "-mno-omit-leaf-frame-pointer", "-fno-optimize-sibling-calls"])
        .args(defs)
        .arg("-o")
        .arg(&out)
        .arg(repo_root().join("tests/workloads/ab.c"))
        .status()
        .unwrap();
    assert!(st.success());
    out
}

fn profile(exe: &Path, dump: &Path) {
    let (_w, ready) = spawn_ready(exe, &["60"]);
    let pid = ready.trim().strip_prefix("ready ").expect("ready PID").to_string();
    let mut run = Command::new(etm_bpf_bin())
        .args(["run", "--pid", &pid, "--headless", "--duration", "3", "--dump-dir"])
        .arg(dump)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let st = wait_timeout(&mut run, Duration::from_secs(60));
    assert!(st.success(), "etm-bpf run: {}", etm_bpf_tests::read_all(run.stderr.take()));
}

fn diff(a: &Path, b: &Path, alpha: &str) -> serde_json::Value {
    let o = Command::new(etm_bpf_bin()).args(["diff", "--json", "--alpha", alpha]).arg(a).arg(b).output().unwrap();
    assert!(o.status.success(), "diff: {}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

#[test]
fn diff_finds_the_real_changes_only() {
    if etm_bpf_tests::skip_unless_root() {
        return;
    }
    if c_compiler().is_none() {
        etm_testutil::skip("no C compiler");
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let a = build(d.path(), "ab-a", &["-DUA=2", "-DUB=1"]);
    let b = build(d.path(), "ab-b", &["-DUA=1", "-DUB=2", "-DPAD"]);
    let (da, da2, db) = (d.path().join("a"), d.path().join("a2"), d.path().join("b"));
    profile(&a, &da);
    profile(&b, &db);
    profile(&a, &da2);

    let v = diff(&da, &db, "0.05");
    let f = |n: &str| {
        v["functions"].as_array().unwrap().iter().find(|f| f["function"] == n).unwrap_or_else(|| panic!("{n}: {v}")).clone()
    };
    for (name, truth) in [("fa", -0.25), ("fb", 0.25), ("fc", 0.0)] {
        let x = f(name);
        let (d, lo, hi) =
            (x["incl_change"].as_f64().unwrap(), x["incl_ci95"][0].as_f64().unwrap(), x["incl_ci95"][1].as_f64().unwrap());
        eprintln!("{name}: change {d:+.3} [{lo:+.3}, {hi:+.3}], truth {truth:+.2}, significant {}", x["significant"]);
        assert!(lo - 0.02 <= truth && truth <= hi + 0.02, "{name}: {d} [{lo}, {hi}] vs {truth}");
        // fa/fb/fc have no self time (unit() has it all): their inclusive change is the one
        // tested.
        assert_eq!(x["incl_significant"], truth != 0.0, "{name}: {x}");
        assert_eq!(x["self_significant"], false, "{name}: {x}");
    }
    // Per calling context (matched by the frames' names): the path into fa loses its quarter,
    // fb's gains it, fc's does not move.
    let ctx = |v: &serde_json::Value, suffix: &str| {
        v["contexts"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["context"].as_str().unwrap().ends_with(suffix))
            .max_by_key(|c| c["incl_a"].as_u64().unwrap() + c["incl_b"].as_u64().unwrap())
            .unwrap_or_else(|| panic!("no context ending {suffix}: {v}"))
            .clone()
    };
    for (suffix, truth) in [(";main;fa", -0.25), (";main;fb", 0.25), (";main;fc", 0.0)] {
        let x = ctx(&v, suffix);
        let (d, lo, hi) =
            (x["incl_change"].as_f64().unwrap(), x["incl_ci95"][0].as_f64().unwrap(), x["incl_ci95"][1].as_f64().unwrap());
        eprintln!("{}: change {d:+.3} [{lo:+.3}, {hi:+.3}], truth {truth:+.2}", x["context"]);
        assert!(lo - 0.02 <= truth && truth <= hi + 0.02, "{suffix}: {d} [{lo}, {hi}] vs {truth}");
        assert_eq!(x["incl_significant"], truth != 0.0, "{suffix}: {x}");
    }
    assert!(db.join("diff.svg").exists());
    let svg = std::fs::read_to_string(db.join("diff.svg")).unwrap();
    assert!(svg.contains("<svg") && svg.contains("fa (") && svg.contains("fb ("));
    // Two runs of build A: nothing significant at a 1% family-wise level.
    let same = diff(&da, &da2, "0.01");
    let sig: Vec<&serde_json::Value> =
        same["functions"].as_array().unwrap().iter().filter(|f| f["significant"] == true).collect();
    // The leaf `unit` holds nearly all self samples in both builds: no self change.
    assert_eq!(f("unit")["self_significant"], false);
    assert!(sig.is_empty(), "{sig:?}");
    let sig: Vec<&serde_json::Value> = same["contexts"].as_array().unwrap().iter().filter(|c| c["significant"] == true).collect();
    assert!(sig.is_empty(), "contexts: {sig:?}");
    assert!(ctx(&same, ";main;fa")["incl_a"].as_u64().unwrap() > 0);
    // And every dump has its flame graph.
    for dir in [&da, &db, &da2] {
        let svg = std::fs::read_to_string(dir.join("profile.svg")).unwrap();
        assert!(svg.contains("unit (") && svg.contains("main ("), "{}", dir.display());
    }
}
