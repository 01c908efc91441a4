//! Periodic dumps written off the drain loop: the loop takes a [`DumpSnapshot`] (a copy of the
//! profile and trie; code images are shared) and hands it to a worker thread, which writes the
//! files and the manifest atomically, so writing (seconds for large profiles: every PGO
//! writer walks the whole profile) never delays draining the rings. A dump asked for while
//! the previous one is still being written is skipped and counted; code facts of each binary
//! are computed once per path and build-id for the whole run.

use std::path::PathBuf;
use std::sync::mpsc;
use std::thread::JoinHandle;

use anyhow::Context as _;

use crate::cmd::convert::FactsCache;
use crate::dump::write_atomic;
use crate::engine::{DumpMeta, DumpSnapshot, write_snapshot_files};

/// One dump: where, what, and the manifest without its `files` (the worker adds them).
pub struct DumpJob {
    pub dir: PathBuf,
    pub snapshot: DumpSnapshot,
    pub meta: DumpMeta,
    pub manifest: serde_json::Value,
}

/// The worker (module docs).
pub struct Dumper {
    tx: Option<mpsc::Sender<DumpJob>>,
    done: mpsc::Receiver<anyhow::Result<()>>,
    handle: Option<JoinHandle<()>>,
    busy: bool,
    /// Dumps written.
    pub written: u64,
    /// Dumps skipped because the previous one was still being written.
    pub skipped: u64,
}

impl Dumper {
    /// Starts the worker thread.
    pub fn start() -> anyhow::Result<Dumper> {
        let (tx, rx) = mpsc::channel::<DumpJob>();
        let (dtx, done) = mpsc::channel();
        let handle = std::thread::Builder::new()
            .name("etm-bpf-dump".into())
            .spawn(move || {
                let mut facts = FactsCache::default();
                for job in rx {
                    let r = write_job(&job, &mut facts);
                    if dtx.send(r).is_err() {
                        break;
                    }
                }
            })
            .context("start the dump thread")?;
        Ok(Dumper { tx: Some(tx), done, handle: Some(handle), busy: false, written: 0, skipped: 0 })
    }

    /// Results of finished dumps (the first error, if any).
    pub fn poll(&mut self) -> anyhow::Result<()> {
        while let Ok(r) = self.done.try_recv() {
            self.busy = false;
            self.written += 1;
            r?;
        }
        Ok(())
    }

    /// Hands `job` to the worker unless it is still writing the previous one (then the job is
    /// dropped and counted). Returns whether it was taken.
    pub fn submit(&mut self, job: DumpJob) -> anyhow::Result<bool> {
        self.poll()?;
        if self.busy {
            self.skipped += 1;
            return Ok(false);
        }
        let tx = self.tx.as_ref().context("the dump thread has stopped")?;
        tx.send(job).map_err(|_| anyhow::anyhow!("the dump thread has stopped"))?;
        self.busy = true;
        Ok(true)
    }

    /// Waits for the dump being written, if any.
    pub fn wait(&mut self) -> anyhow::Result<()> {
        if self.busy {
            let r = self.done.recv().map_err(|_| anyhow::anyhow!("the dump thread stopped while writing"))?;
            self.busy = false;
            self.written += 1;
            r?;
        }
        Ok(())
    }

    /// Writes `job` and waits for it (the final dump: nothing is dropped).
    pub fn write_now(&mut self, job: DumpJob) -> anyhow::Result<()> {
        self.wait()?;
        self.submit(job)?;
        self.wait()
    }
}

impl Drop for Dumper {
    fn drop(&mut self) {
        self.tx.take();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

fn write_job(job: &DumpJob, facts: &mut FactsCache) -> anyhow::Result<()> {
    std::fs::create_dir_all(&job.dir).with_context(|| format!("create {}", job.dir.display()))?;
    let files = write_snapshot_files(&job.dir, &job.snapshot, &job.meta, facts)?;
    let mut manifest = job.manifest.clone();
    manifest["files"] = serde_json::json!(files);
    write_atomic(&job.dir.join("manifest.json"), |w| {
        serde_json::to_writer_pretty(&mut *w, &manifest)?;
        std::io::Write::write_all(w, b"\n")
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::Engine;
    use etm_session::pipeline::PipelineConfig;
    use etm_session::session::{PauseSample, SessionEvent};

    fn job(dir: &std::path::Path, e: &Engine, n: u64) -> DumpJob {
        DumpJob {
            dir: dir.to_path_buf(),
            snapshot: e.snapshot(),
            meta: DumpMeta { period_ns: 1, time_nanos: 0, duration_nanos: 0, comment: "t".into() },
            manifest: serde_json::json!({ "n": n }),
        }
    }

    /// The worker writes what the snapshot held when it was taken (samples pushed afterwards
    /// are not in it), with the manifest listing the files; the final dump waits for it.
    #[test]
    fn writes_the_snapshot_off_the_loop() {
        let out = tempfile::tempdir().unwrap();
        let mut e = Engine::new(PipelineConfig::default(), None);
        let s = PauseSample {
            cpu: 0,
            pid: 9,
            tid: 9,
            time: 1,
            stack: vec![0x1000, 0x2000],
            branches: None,
            branch_flags: Vec::new(),
            window_ns: None,
            user_stack: None,
        };
        e.push(SessionEvent::Sample(&s));
        let mut d = Dumper::start().unwrap();
        assert!(d.submit(job(out.path(), &e, 1)).unwrap());
        // More samples after the snapshot: not in this dump.
        for t in 2..50 {
            e.push(SessionEvent::Sample(&PauseSample { time: t, ..s.clone() }));
        }
        d.wait().unwrap();
        let folded = std::fs::read_to_string(out.path().join("profile.folded")).unwrap();
        let count: u64 = folded.lines().map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap()).sum();
        assert_eq!(count, 1, "{folded}");
        let m: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.path().join("manifest.json")).unwrap()).unwrap();
        assert_eq!(
            (m["n"].as_u64(), m["files"].clone()),
            (Some(1), serde_json::json!(["profile.folded", "profile.svg", "profile.pb.gz"]))
        );
        d.write_now(job(out.path(), &e, 2)).unwrap();
        let folded = std::fs::read_to_string(out.path().join("profile.folded")).unwrap();
        let count: u64 = folded.lines().map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap()).sum();
        assert_eq!((count, d.written), (49, 2));
    }

    /// A dump that cannot be written is an error from the next call, not a panic or a hang.
    #[test]
    fn unwritable_dump_dir_is_reported() {
        let e = Engine::new(PipelineConfig::default(), None);
        let mut d = Dumper::start().unwrap();
        let err = d.write_now(job(std::path::Path::new("/proc/version/sub"), &e, 1)).unwrap_err();
        assert!(format!("{err:#}").contains("/proc/version/sub"), "{err:#}");
        // The worker is still there for the next one.
        let out = tempfile::tempdir().unwrap();
        d.write_now(job(out.path(), &e, 2)).unwrap();
    }
}
