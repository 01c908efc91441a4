//! For every llvm-profgen test case in `../shared/testdata/profgen/` with perf-script input,
//! `etm-bpf convert` the input, hand our dumps to llvm-profgen-22 with the case's options, and
//! require the very profile llvm-profgen-22 produces from the original input.
//!
//! The RUN lines are read from the shared README (they are LLVM's own, verbatim). Per run:
//! * `<bin>.perfscript` replaces the original `--perfscript` (every run);
//! * `<bin>.unsym.txt` replaces it as `--unsymbolized-profile` when the run is
//!   context-insensitive (`--ignore-stack-samples`, or a branch-only input), with
//!   `--ignore-stack-samples` dropped (our unsymbolized dump is already context-free);
//! * for DWARF (non-probe) binaries with hybrid samples `<bin>.unsym.txt` is the
//!   context-sensitive form (the profile's online counters) and replaces the input of every
//!   context-sensitive run, and `<bin>.autofdo.unsym.txt` beside it the input of the
//!   `--ignore-stack-samples` runs;
//! * with `--skip-symbolization` the unsymbolized outputs themselves are compared (CS
//!   unwinder output only for runs with llvm-profgen's default unwinder options).
//!
//! Normalization: none beyond forcing `--format=text` (binary formats are compared through
//! their text form); outputs must be byte-identical, except that a profile read from a CS
//! unsymbolized file is compared with the ContextWasInlined attribute bit cleared (the format
//! cannot carry it; llvm-profgen's own round trip loses it too, and is checked byte-identical).

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

/// The profile text with the ContextWasInlined bit (1) cleared from `!Attributes: N` lines
/// (lines left at 0 dropped, as llvm-profgen writes none then): llvm-profgen sets it from the
/// inline state seen while unwinding perf samples, which its unsymbolized format does not
/// carry, so it is absent from any profile read from an unsymbolized file.
fn strip_was_inlined(t: &str) -> String {
    let mut out = String::with_capacity(t.len());
    for line in t.lines() {
        let attr = line.trim_start().strip_prefix("!Attributes: ").and_then(|v| v.parse::<u32>().ok());
        match attr {
            Some(a) if a & !1 == 0 => continue,
            Some(a) => {
                let indent = &line[..line.len() - line.trim_start().len()];
                out.push_str(&format!("{indent}!Attributes: {}", a & !1));
            }
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

/// Whether an ELF file carries pseudo probes (its section names include `.pseudo_probe`).
fn is_probe_binary(path: &Path) -> bool {
    let data = std::fs::read(path).unwrap_or_default();
    data.windows(13).any(|w| w == b".pseudo_probe")
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
        etm_testutil::skip(format!("no shared profgen test data at {}", shared.display()));
        return;
    }
    let Some(pg) = llvm_tool("llvm-profgen") else {
        etm_testutil::skip("llvm-profgen-22 not installed");
        return;
    };
    let Some(bin) = etm_bpf_bin() else {
        etm_testutil::skip("etm-bpf binary not built (cargo build --release -p etm-bpf) and ETM_BPF_BIN unset");
        return;
    };
    let runs = runs(&shared);
    assert!(runs.len() >= 40, "expected the README's perf-script RUN lines, found {}", runs.len());
    let work = scratch("cases");
    let mut dumps: BTreeMap<(PathBuf, PathBuf), PathBuf> = BTreeMap::new();
    let mut failures = Vec::new();
    let (mut checked_ps, mut checked_unsym, mut checked_cs_unsym, mut cs_ignore_stack) = (0, 0, 0, 0);
    for (n, r) in runs.iter().enumerate() {
        let key = (r.input.clone(), r.binary.clone());
        let next = dumps.len();
        let dump = dumps
            .entry(key)
            .or_insert_with(|| {
                let d = work.join(format!("dump{next}"));
                let files = convert(&bin, &r.input, &[&r.binary], &d);
                // perfscript, unsym.txt, bolt.pa, and autofdo.unsym.txt beside a CS unsym.txt
                assert!(files.len() == 3 || files.len() == 4, "convert of {} listed {files:?}", r.input.display());
                d
            })
            .clone();
        let name = r.binary.file_name().unwrap().to_string_lossy().into_owned();
        let ours_ps = dump.join(format!("{name}.perfscript"));
        let ours_unsym = dump.join(format!("{name}.unsym.txt"));
        let ours_autofdo = dump.join(format!("{name}.autofdo.unsym.txt"));
        let label = format!(
            "{} {} {}",
            r.dir.file_name().unwrap().to_string_lossy(),
            r.input.file_name().unwrap().to_string_lossy(),
            r.opts.join(" ")
        );
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
        let unsym_text = std::fs::read_to_string(&ours_unsym).unwrap_or_default();
        let ours_cs = unsym_text.starts_with('[');
        // DWARF binaries with hybrid samples get the context-sensitive unsymbolized dump;
        // pseudo-probe binaries keep the context-free one (LLVM 22 crashes on CS input there).
        if !branch_only && is_probe_binary(&r.binary) == ours_cs {
            failures.push(format!(
                "{label}: unsymbolized dump CS={ours_cs} for a {} binary",
                if ours_cs { "probe" } else { "DWARF" }
            ));
            continue;
        }
        if ours_cs != ours_autofdo.is_file() {
            failures.push(format!("{label}: context-free dump beside a CS={ours_cs} unsymbolized dump: {}", !ours_cs));
            continue;
        }
        // The context-free unsymbolized dump: the CS dump's companion, or the dump itself.
        let cf_unsym = if ours_cs { &ours_autofdo } else { &ours_unsym };
        if ours_cs && context_free {
            cs_ignore_stack += 1;
        }
        if ours_cs && !context_free {
            if r.opts.iter().any(|o| o == "--skip-symbolization") {
                // Unwinder output: only llvm-profgen's default unwinder options are reproduced.
                let neutral = |o: &String| {
                    o == "--skip-symbolization"
                        || ["--profile-summary-", "--csspgo-preinliner=", "--gen-cs-nested-profile="]
                            .iter()
                            .any(|p| o.starts_with(p))
                };
                // A run with other unwinder options (e.g. --compress-recursion=0): our dump is
                // the default unwinder's output, so it must equal llvm-profgen's output for the
                // same input with those options left out.
                let expected = if r.opts.iter().all(neutral) {
                    expected
                } else {
                    let opts: Vec<String> = r.opts.iter().filter(|o| neutral(o)).cloned().collect();
                    match profgen(&pg, "--perfscript", &r.input, &r.binary, &opts, &work.join(format!("dflt{n}"))) {
                        Ok(t) => t,
                        Err(e) => {
                            failures.push(format!("{label}: original input, default unwinder options: {e}"));
                            continue;
                        }
                    }
                };
                if unsym_text == expected {
                    checked_cs_unsym += 1;
                } else {
                    failures.push(format!("{label}: CS unsymbolized dump differs: {}", first_diff(&expected, &unsym_text)));
                }
            } else {
                // (1) byte-identical to llvm-profgen's own round trip (its default unwinder
                // output of the original input, read back with the run's options);
                // (2) equal to the profile from the original input up to the
                // ContextWasInlined attribute, which the unsymbolized format cannot carry.
                let theirs = work.join(format!("theirs-unsym{n}"));
                let own = profgen(&pg, "--perfscript", &r.input, &r.binary, &["--skip-symbolization".to_string()], &theirs)
                    .and_then(|_| {
                        profgen(&pg, "--unsymbolized-profile", &theirs, &r.binary, &r.opts, &work.join(format!("rt{n}")))
                    });
                let ours = profgen(&pg, "--unsymbolized-profile", &ours_unsym, &r.binary, &r.opts, &work.join(format!("cs{n}")));
                let (own, ours) = match (own, ours) {
                    (Ok(a), Ok(b)) => (a, b),
                    (a, b) => {
                        failures.push(format!("{label}: CS unsymbolized round trip: {:?} / {:?}", a.err(), b.err()));
                        continue;
                    }
                };
                if ours != own {
                    failures.push(format!(
                        "{label}: CS unsymbolized dump differs from llvm-profgen's round trip: {}",
                        first_diff(&own, &ours)
                    ));
                    continue;
                }
                let unwinder_opt =
                    r.opts.iter().any(|o| o.starts_with("--compress-recursion") || o.starts_with("--csprof-max-context-depth"));
                if unwinder_opt {
                    eprintln!("note: {label}: unwinder option; CS unsymbolized checked against llvm-profgen's round trip only");
                    checked_cs_unsym += 1;
                } else if strip_was_inlined(&ours) == strip_was_inlined(&expected) {
                    checked_cs_unsym += 1;
                } else {
                    let (e, o) = (strip_was_inlined(&expected), strip_was_inlined(&ours));
                    failures.push(format!("{label}: CS unsymbolized dump differs: {}", first_diff(&e, &o)));
                }
            }
            continue;
        }
        if !context_free {
            continue;
        }
        let absolute = r.opts.iter().any(|o| o == "--use-offset=0");
        if r.opts.iter().any(|o| o == "--skip-symbolization") && !absolute {
            let ours = std::fs::read_to_string(cf_unsym).unwrap_or_default();
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
        match profgen(&pg, "--unsymbolized-profile", cf_unsym, &r.binary, &opts, &work.join(format!("un{n}"))) {
            Ok(t) if t == expected => checked_unsym += 1,
            Ok(t) => failures.push(format!("{label}: unsymbolized dump differs: {}", first_diff(&expected, &t))),
            Err(e) => failures.push(format!("{label}: unsymbolized dump: {e}")),
        }
    }
    eprintln!(
        "profgen cases: {} runs over {} inputs; identical via perfscript: {checked_ps}, via context-free unsymbolized: {checked_unsym} ({cs_ignore_stack} of them --ignore-stack-samples runs on CS DWARF inputs, through .autofdo.unsym.txt), via CS unsymbolized: {checked_cs_unsym}",
        runs.len(),
        dumps.len()
    );
    assert!(failures.is_empty(), "{} mismatches:\n{}", failures.len(), failures.join("\n"));
    assert!(cs_ignore_stack >= 2, "expected --ignore-stack-samples runs on CS DWARF inputs, got {cs_ignore_stack}");
    assert!(
        checked_cs_unsym >= 10,
        "expected the DWARF CS runs to be checked through the CS unsymbolized dump, got {checked_cs_unsym}"
    );
    let _ = std::fs::remove_dir_all(&work);
}
