//! The lab workload's exact profile: stationary (the shares of 20 and 40 iterations agree) and
//! the three contexts in the proportions the source implies.

use etm_synth::testprogs::{self, BuildError, Compiler, PROGRAMS};

#[test]
fn contexts_workload_is_stationary() {
    let dir = tempfile::tempdir().unwrap();
    let prog = PROGRAMS.iter().find(|p| p.name == "contexts").unwrap();
    let bin = match testprogs::qemu_available().and_then(|_| testprogs::build(prog, Compiler::Gcc, dir.path())) {
        Ok(b) => b,
        Err(BuildError::Missing(why)) => return etm_testutil::skip(why),
        Err(e) => panic!("{e}"),
    };
    let shares = |iters: &str| {
        let c = etm_lab::truth::program_counts(&bin, &[iters.to_string()], "main", 50_000_000).unwrap();
        etm_lab::truth::shares(&c)
    };
    let (a, b) = (shares("20"), shares("40"));
    for k in ["main;work;alpha", "main;work;beta;gamma_", "main;work;delta"] {
        assert!((a[k] - b[k]).abs() < 0.002, "{k}: {} vs {}", a[k], b[k]);
    }
    eprintln!("{b:?}");
    assert!(b["main;work;beta;gamma_"] > b["main;work;alpha"] && b["main;work;alpha"] > b["main;work;delta"], "{b:?}");
    assert!(b["main;work;beta;gamma_"] + b["main;work;alpha"] + b["main;work;delta"] > 0.95);
}
