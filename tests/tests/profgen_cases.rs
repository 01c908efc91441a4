//! For every llvm-profgen test case in `../shared/testdata/profgen/` with perf-script input,
//! `etm-bpf convert` the input, hand our dumps to llvm-profgen-22 with the case's options, and
//! require the very profile llvm-profgen-22 produces from the original input.
//!
//! The RUN lines are read from the shared README (they are LLVM's own, verbatim). Per run:
//! * `<bin>.perfscript` replaces the original `--perfscript` (every run);
//! * `<bin>.unsym.txt` replaces it as `--unsymbolized-profile` when the run is
//!   context-insensitive (`--ignore-stack-samples`, or a branch-only input), with
//!   `--ignore-stack-samples` dropped (our unsymbolized dump is already context-free);
//! * with `--skip-symbolization` the unsymbolized outputs themselves are compared.
//!
//! Normalization: none beyond forcing `--format=text` (binary formats are compared through
//! their text form); outputs must be byte-identical.

mod common_profgen;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use common_profgen::*;

struct Run {
    dir: PathBuf,
    input: PathBuf,
    binary: PathBuf,
    opts: Vec<String>,
}

/// RUN lines of llvm-profgen with a perf-script input, from the README tables.
fn runs(shared: &Path) -> Vec<Run> {
    let root = shared.join("testdata/profgen");
    let readme = std::fs::read_to_string(root.join("README.md")).expect("profgen README");
    let mut dir = PathBuf::new();
    let mut saved_script: Option<String> = None;
    let mut out = Vec::new();
    for line in readme.lines() {
        if let Some(rest) = line.strip_prefix("### `") {
            dir = root.join(rest.trim_end_matches('`').trim_end_matches('/'));
            continue;
        }
        if line.starts_with("From `") {
            // "... whose data lines are saved here as `X.perfscript`"
            saved_script = line.split("saved here as `").nth(1).and_then(|s| s.split('`').next()).map(String::from);
            continue;
        }
        if !line.starts_with("| ") {
            continue;
        }
        let Some(cmd) = line.split('`').nth(1) else { continue };
        if !cmd.starts_with("llvm-profgen ") || !cmd.contains("--perfscript=") {
            continue;
        }
        if cmd.contains("--show-disassembly-only") || cmd.contains("--show-mmap-events") {
            continue; // disassembly/mmap listings, not profiles
        }
        // Drop the FileCheck pipe (escaped `\|` in the markdown table) and redirections.
        let cmd = cmd.split('|').next().unwrap().replace("2>&1", "").replace('\\', "");
        let mut toks: Vec<String> = cmd.split_whitespace().skip(1).map(String::from).collect();
        // "--output %t" form
        if let Some(i) = toks.iter().position(|t| t == "--output") {
            toks.remove(i + 1);
            toks.remove(i);
        }
        let mut input = None;
        let mut binary = None;
        let mut opts = Vec::new();
        for t in toks {
            let path = |v: &str| {
                if v == "%s" {
                    dir.join(saved_script.as_deref().unwrap_or("missing"))
                } else {
                    dir.join(v.trim_start_matches("%S/Inputs/"))
                }
            };
            if let Some(v) = t.strip_prefix("--perfscript=") {
                input = Some(path(v));
            } else if let Some(v) = t.strip_prefix("--binary=") {
                binary = Some(path(v));
            } else if t.starts_with("--output=") || t.starts_with("--format=") {
            } else {
                opts.push(t);
            }
        }
        let (Some(input), Some(binary)) = (input, binary) else { continue };
        out.push(Run { dir: dir.clone(), input, binary, opts });
    }
    out
}

fn profgen(pg: &Path, input_flag: &str, input: &Path, binary: &Path, opts: &[String], out: &Path) -> Result<String, String> {
    let o = run(Command::new(pg)
        .arg("--format=text")
        .arg(format!("{input_flag}={}", input.display()))
        .arg(format!("--binary={}", binary.display()))
        .arg(format!("--output={}", out.display()))
        .args(opts));
    if !o.status.success() {
        return Err(format!("llvm-profgen failed: {}", String::from_utf8_lossy(&o.stderr)));
    }
    std::fs::read_to_string(out).map_err(|e| format!("no output: {e}"))
}

fn first_diff(a: &str, b: &str) -> String {
    for (i, (x, y)) in a.lines().zip(b.lines()).enumerate() {
        if x != y {
            return format!("line {}: expected `{x}`, got `{y}`", i + 1);
        }
    }
    format!("line counts differ: {} vs {}", a.lines().count(), b.lines().count())
}

#[test]
fn profgen_cases_match_llvm_profgen() {
    let shared = shared_dir();
    if !shared.join("testdata/profgen/README.md").is_file() {
        eprintln!("SKIP: no shared profgen test data at {}", shared.display());
        return;
    }
    let Some(pg) = llvm_tool("llvm-profgen") else {
        eprintln!("SKIP: llvm-profgen-22 not installed");
        return;
    };
    let Some(bin) = etm_bpf_bin() else {
        eprintln!("SKIP: etm-bpf binary not built (cargo build --release -p etm-bpf) and ETM_BPF_BIN unset");
        return;
    };
    let runs = runs(&shared);
    assert!(runs.len() >= 40, "expected the README's perf-script RUN lines, found {}", runs.len());
    let work = scratch("cases");
    let mut dumps: BTreeMap<(PathBuf, PathBuf), PathBuf> = BTreeMap::new();
    let mut failures = Vec::new();
    let (mut checked_ps, mut checked_unsym) = (0, 0);
    for (n, r) in runs.iter().enumerate() {
        let key = (r.input.clone(), r.binary.clone());
        let next = dumps.len();
        let dump = dumps
            .entry(key)
            .or_insert_with(|| {
                let d = work.join(format!("dump{next}"));
                let files = convert(&bin, &r.input, &[&r.binary], &d);
                assert_eq!(files.len(), 3, "convert of {} listed {files:?}", r.input.display());
                d
            })
            .clone();
        let name = r.binary.file_name().unwrap().to_string_lossy().into_owned();
        let ours_ps = dump.join(format!("{name}.perfscript"));
        let ours_unsym = dump.join(format!("{name}.unsym.txt"));
        let label = format!("{} {} {}", r.dir.file_name().unwrap().to_string_lossy(), r.input.file_name().unwrap().to_string_lossy(), r.opts.join(" "));
        let expected = match profgen(&pg, "--perfscript", &r.input, &r.binary, &r.opts, &work.join(format!("exp{n}"))) {
            Ok(t) => t,
            Err(e) => {
                failures.push(format!("{label}: original input: {e}"));
                continue;
            }
        };
        match profgen(&pg, "--perfscript", &ours_ps, &r.binary, &r.opts, &work.join(format!("ps{n}"))) {
            Ok(t) if t == expected => checked_ps += 1,
            Ok(t) => failures.push(format!("{label}: perfscript dump differs: {}", first_diff(&expected, &t))),
            Err(e) => failures.push(format!("{label}: perfscript dump: {e}")),
        }
        let branch_only = std::fs::read_to_string(&ours_ps).map(|t| !t.contains("\n\t")).unwrap_or(false);
        let context_free = branch_only || r.opts.iter().any(|o| o == "--ignore-stack-samples");
        if !context_free {
            continue;
        }
        let absolute = r.opts.iter().any(|o| o == "--use-offset=0");
        if r.opts.iter().any(|o| o == "--skip-symbolization") && !absolute {
            let ours = std::fs::read_to_string(&ours_unsym).unwrap_or_default();
            if ours == expected {
                checked_unsym += 1;
            } else {
                failures.push(format!("{label}: unsymbolized dump differs: {}", first_diff(&expected, &ours)));
            }
            continue;
        }
        // Our unsymbolized dump is offset-based and context-free: drop the flags that only
        // say so. With `--skip-symbolization --use-offset=0` (absolute addresses in the
        // unsymbolized text) compare the final profiles instead.
        let drop = ["--ignore-stack-samples", "--skip-symbolization", "--use-offset=0"];
        let opts: Vec<String> = r.opts.iter().filter(|o| !drop.contains(&o.as_str())).cloned().collect();
        let expected = if absolute {
            let mut o2 = opts.clone();
            o2.push("--ignore-stack-samples".into());
            match profgen(&pg, "--perfscript", &r.input, &r.binary, &o2, &work.join(format!("exp-abs{n}"))) {
                Ok(t) => t,
                Err(e) => {
                    failures.push(format!("{label}: original input: {e}"));
                    continue;
                }
            }
        } else {
            expected
        };
        match profgen(&pg, "--unsymbolized-profile", &ours_unsym, &r.binary, &opts, &work.join(format!("un{n}"))) {
            Ok(t) if t == expected => checked_unsym += 1,
            Ok(t) => failures.push(format!("{label}: unsymbolized dump differs: {}", first_diff(&expected, &t))),
            Err(e) => failures.push(format!("{label}: unsymbolized dump: {e}")),
        }
    }
    eprintln!(
        "profgen cases: {} runs over {} inputs; identical via perfscript: {checked_ps}, via unsymbolized: {checked_unsym}",
        runs.len(),
        dumps.len()
    );
    assert!(failures.is_empty(), "{} mismatches:\n{}", failures.len(), failures.join("\n"));
    let _ = std::fs::remove_dir_all(&work);
}
