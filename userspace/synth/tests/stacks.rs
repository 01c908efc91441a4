//! The true call stacks of generated pause samples are structurally right, checked against
//! the program's static code and symbols (not against the path the stacks came from): every
//! return address follows a `BL`/`BLR`, the outermost frame returns into `_start` (nothing
//! lost at the bottom), frames inside the recursive
//! functions nest as deep as the source allows, and the session's samples equal the truth.

use std::path::Path;

use etm_synth::a64::{InsnClass, classify};
use etm_synth::generate::{SynthConfig, synthesize};
use etm_synth::gtfile;
use etm_synth::image::CodeImage;
use etm_synth::qemu::{self, QemuOptions};
use etm_synth::session_out::{GROUND_TRUTH_FILE, write_session};
use etm_synth::testprogs::{self, BuildError, Compiler, PROGRAMS};
use object::{Object, ObjectSymbol};

/// Function symbols of a static ELF: (start, end, name).
fn functions(bin: &Path) -> Vec<(u64, u64, String)> {
    let data = std::fs::read(bin).unwrap();
    let file = object::File::parse(&*data).unwrap();
    let mut v: Vec<(u64, u64, String)> = file
        .symbols()
        .filter(|s| s.kind() == object::SymbolKind::Text && s.size() > 0)
        .map(|s| (s.address(), s.address() + s.size(), s.name().unwrap_or("").to_string()))
        .collect();
    v.sort();
    v
}

fn func_of(f: &[(u64, u64, String)], a: u64) -> Option<&str> {
    f.iter().find(|(s, e, _)| a >= *s && a < *e).map(|(_, _, n)| n.as_str())
}

/// Stacks of the recursion and indirect-call programs (gcc and clang) are consistent with the
/// code and symbols, and what the session's samples carry is exactly the ground truth.
#[test]
fn pause_stacks_match_static_code() {
    if let Err(e) = testprogs::qemu_available() {
        etm_testutil::skip(e);
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    for compiler in Compiler::ALL {
        for prog in PROGRAMS.iter().filter(|p| p.name == "recursion" || p.name == "indirect") {
            let bin = match testprogs::build(prog, compiler, tmp.path()) {
                Ok(b) => b,
                Err(BuildError::Missing(why)) => {
                    etm_testutil::skip(format!("{} with {}: {why}", prog.name, compiler.name()));
                    continue;
                }
                Err(e) => panic!("{e}"),
            };
            let args = vec![if prog.name == "recursion" { "16" } else { "3000" }.to_string()];
            let run = qemu::run(&bin, &args, &QemuOptions::default()).unwrap();
            assert_eq!(run.exit_code, Some(0));
            let mut image = CodeImage::load(&bin).unwrap();
            let cfg = SynthConfig { window: 500, period: 1_501, ..SynthConfig::default() };
            let syn = synthesize(&mut image, &run.pcs, &cfg);
            assert_eq!(syn.stats.unmatched_returns, 0, "{}", bin.display());
            let funcs = functions(&bin);
            let mut max_rec_depth = 0;
            for w in &syn.windows {
                assert_eq!(w.stack[0], run.pcs[w.pause_index as usize], "leaf = the PC at the pause");
                for &r in &w.stack[1..] {
                    let insn = image.insn(r - 4).expect("return address in the image");
                    assert!(
                        matches!(
                            classify(insn, r - 4),
                            InsnClass::DirectUncond { link: true, .. } | InsnClass::Indirect { link: true, .. }
                        ),
                        "{}: return address {r:#x} does not follow a call",
                        bin.display()
                    );
                }
                let outer = *w.stack.last().unwrap();
                if w.stack.len() > 1 {
                    let f = func_of(&funcs, outer).unwrap_or("?");
                    assert!(
                        f == "_start",
                        "{}: outermost return {outer:#x} is in {f}, not in _start (frames lost)",
                        bin.display()
                    );
                }
                let rec = w.stack.iter().filter(|&&a| matches!(func_of(&funcs, a), Some("fib" | "depth" | "build"))).count();
                max_rec_depth = max_rec_depth.max(rec);
            }
            if prog.name == "recursion" {
                // fib(16) nests 16 deep (+ the leaf); windows every ~1500 instructions in a run
                // dominated by fib land inside it, and never deeper than the source allows.
                assert!((5..=18).contains(&max_rec_depth), "{}: recursion depth {max_rec_depth}", bin.display());
            }
            // The session's samples carry the same stacks, and the ground truth file agrees.
            let sess = tmp.path().join(format!("s-{}-{}", prog.name, compiler.name()));
            write_session(&sess, &bin, &args, run.exit_code, &image, &syn).unwrap();
            let gt = gtfile::read(std::io::BufReader::new(std::fs::File::open(sess.join(GROUND_TRUTH_FILE)).unwrap())).unwrap();
            let events = std::fs::read_to_string(sess.join("events.jsonl")).unwrap();
            let samples: Vec<Vec<u64>> = events
                .lines()
                .filter(|l| l.starts_with("{\"type\":\"sample\""))
                .map(|l| {
                    let v: serde_json::Value = serde_json::from_str(l).unwrap();
                    v["stack"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect()
                })
                .collect();
            let truth: Vec<Vec<u64>> = gt.windows.iter().map(|w| w.stack.clone()).collect();
            assert_eq!(samples, truth);
            assert!(gt.windows.len() >= 10);
            eprintln!(
                "ok: {} {}: {} windows, max recursion frames {max_rec_depth}",
                prog.name,
                compiler.name(),
                gt.windows.len()
            );
        }
    }
}
