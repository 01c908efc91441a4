//! Injected faults reach the session as specified (so replay tests can rely on them): a
//! truncated window keeps half its bytes and is flagged TRUNCATED, a corrupted one differs in
//! exactly one byte, a no-sync one lacks its A-sync + Trace Info, a lost one has its sample
//! replaced by a `lost` record; untouched windows carry the clean bytes. Read back with the
//! session crate's own reader.

use etm_session::session::{PERF_AUX_FLAG_TRUNCATED, SessionEvent, SessionReader, Sideband};
use etm_synth::ete::A_SYNC;
use etm_synth::generate::{Fault, SynthConfig, synthesize};
use etm_synth::image::CodeImage;
use etm_synth::qemu::{self, QemuOptions};
use etm_synth::session_out::write_session;
use etm_synth::testprogs::{self, BuildError, Compiler, PROGRAMS};

/// Each fault kind changes exactly its window, in the documented way.
#[test]
fn faults_are_written_as_documented() {
    if let Err(e) = testprogs::qemu_available() {
        etm_testutil::skip(e);
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let prog = PROGRAMS.iter().find(|p| p.name == "loops").unwrap();
    let bin = match testprogs::build(prog, Compiler::Gcc, tmp.path()) {
        Ok(b) => b,
        Err(BuildError::Missing(why)) => {
            etm_testutil::skip(why);
            return;
        }
        Err(e) => panic!("{e}"),
    };
    let args = vec!["4".to_string()];
    let run = qemu::run(&bin, &args, &QemuOptions::default()).unwrap();
    let mut image = CodeImage::load(&bin).unwrap();
    let faults = vec![(1, Fault::Truncate), (2, Fault::Corrupt), (3, Fault::NoSync), (4, Fault::Lost)];
    let cfg = SynthConfig { window: 800, period: 5_000, faults, ..SynthConfig::default() };
    let syn = synthesize(&mut image, &run.pcs, &cfg);
    assert!(syn.windows.len() >= 6);
    let dir = tmp.path().join("s");
    write_session(&dir, &bin, &args, run.exit_code, &image, &syn).unwrap();

    let mut r = SessionReader::open(&dir).unwrap();
    let (mut auxes, mut samples, mut lost) = (Vec::new(), 0usize, 0usize);
    while let Some(ev) = r.next_event().unwrap() {
        match ev {
            SessionEvent::Aux { record, data } => auxes.push((record.flags, data.to_vec())),
            SessionEvent::Sample(_) => samples += 1,
            SessionEvent::Sideband(Sideband::Lost { lost: n, .. }) => lost += *n as usize,
            _ => {}
        }
    }
    assert_eq!(auxes.len(), syn.windows.len());
    assert_eq!((samples, lost), (syn.windows.len() - 1, 1));
    for (k, (flags, data)) in auxes.iter().enumerate() {
        let clean = &syn.windows[k].bytes;
        assert!(clean.starts_with(&A_SYNC) && clean[12] == 0x01, "every clean window starts with A-sync, TINFO");
        match k {
            1 => {
                assert_ne!(flags & PERF_AUX_FLAG_TRUNCATED, 0);
                assert_eq!(&data[..], &clean[..clean.len() / 2]);
            }
            2 => {
                assert_eq!(data.len(), clean.len());
                assert_eq!(data.iter().zip(clean).filter(|(a, b)| a != b).count(), 1);
            }
            3 => assert_eq!(&data[..], &clean[14..]),
            _ => {
                assert_eq!(flags & PERF_AUX_FLAG_TRUNCATED, 0);
                assert_eq!(&data[..], &clean[..]);
            }
        }
    }
}
