//! The target's executable mappings as MMAP2 sideband for the pipeline: `/proc/PID/maps` is
//! read at start and again on exec/dlopen (an address no placed binary covers), and every new
//! executable mapping becomes a `Sideband::Mmap2` event, as perf synthesizes them for existing
//! mappings. The pipeline places images with them; `--record` saves them, so a replay places
//! the same images at the same addresses.

use std::collections::HashSet;
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use etm_session::image::ImageBytes;
use etm_session::session::Sideband;
use etm_stacks::addrspace::parse_maps;

/// Minimum time between two re-reads of `/proc/PID/maps` triggered by unknown addresses.
pub const RELOAD_MIN_INTERVAL: Duration = Duration::from_millis(50);
/// The same while the mappings are still changing (the last re-read found new ones, as
/// during a program's start-up, when the dynamic loader maps its libraries): none, as only
/// samples taken after the last re-read may trigger one, at most one per drained batch.
pub const RELOAD_SETTLING_INTERVAL: Duration = Duration::ZERO;

/// Tracks the executable mappings of one process.
pub struct MapsTracker {
    pid: u32,
    last_text: String,
    known: HashSet<(u64, u64, u64, String)>,
    last_reload: Option<Instant>,
    /// The sample clock's time of the last re-read.
    last_reload_time: u64,
    /// Whether the last re-read found changed mappings.
    last_changed: bool,
    /// Re-reads that found changed mappings.
    pub changes: u64,
    /// Malformed maps lines skipped.
    pub bad_lines: u64,
}

impl MapsTracker {
    /// A tracker of process `pid` (nothing read yet).
    pub fn new(pid: u32) -> MapsTracker {
        MapsTracker {
            pid,
            last_text: String::new(),
            known: HashSet::new(),
            last_reload: None,
            last_reload_time: 0,
            last_changed: false,
            changes: 0,
            bad_lines: 0,
        }
    }

    /// The process whose maps this tracks.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Whether an unknown address of a sample taken at `sample_time` may trigger a re-read
    /// now: never for a sample older than the last re-read (the maps read then already showed
    /// everything mapped at the sample's time), and at most once per [`RELOAD_MIN_INTERVAL`]
    /// ([`RELOAD_SETTLING_INTERVAL`] while the mappings keep changing).
    pub fn reload_due(&self, sample_time: u64) -> bool {
        let min = if self.last_changed { RELOAD_SETTLING_INTERVAL } else { RELOAD_MIN_INTERVAL };
        self.last_reload.is_none_or(|t| sample_time > self.last_reload_time && t.elapsed() >= min)
    }

    /// Re-reads the maps; appends an MMAP2 record (time `time`) for every executable mapping
    /// not seen before. Returns whether the mappings changed.
    pub fn reload(&mut self, time: u64, out: &mut Vec<Sideband>) -> std::io::Result<bool> {
        let text = std::fs::read_to_string(format!("/proc/{}/maps", self.pid))?;
        self.last_reload = Some(Instant::now());
        self.last_reload_time = time;
        self.last_changed = text != self.last_text;
        if !self.last_changed {
            return Ok(false);
        }
        self.changes += 1;
        Ok(self.apply(&text, time, out))
    }

    /// [`MapsTracker::reload`] on given maps text.
    fn apply(&mut self, text: &str, time: u64, out: &mut Vec<Sideband>) -> bool {
        let (entries, bad) = parse_maps(text);
        self.bad_lines += bad as u64;
        let mut now = HashSet::new();
        for e in entries {
            let pseudo = e.path.starts_with('[') && e.path != "[heap]" && e.path != "[stack]";
            if !(e.is_exec() && (e.is_file() || pseudo)) {
                continue;
            }
            let key = (e.start, e.end, e.offset, e.path.clone());
            if !self.known.contains(&key) {
                out.push(Sideband::Mmap2 {
                    pid: self.pid,
                    tid: self.pid,
                    addr: e.start,
                    len: e.end - e.start,
                    pgoff: e.offset,
                    prot: (libc::PROT_READ | libc::PROT_EXEC) as u32,
                    flags: libc::MAP_PRIVATE as u32,
                    filename: e.path.clone(),
                    build_id: None,
                    time,
                    cpu: None,
                });
            }
            now.insert(key);
        }
        self.known = now;
        self.last_text = text.to_string();
        true
    }
}

/// A code image for the pipeline: a file through the target's mount namespace
/// (`/proc/PID/root`), mapped read-only ([`ImageBytes::map`]: what a change of the file under
/// the map does), or a pseudo mapping such as `[vdso]` read from the target's memory.
pub fn load_image(pid: u32, filename: &str, addr: u64, len: u64) -> Option<(PathBuf, ImageBytes)> {
    if filename.starts_with('/') {
        let rooted = PathBuf::from(format!("/proc/{pid}/root{filename}"));
        return match ImageBytes::map(&rooted) {
            Ok(b) => Some((rooted, b)),
            Err(_) => ImageBytes::map(Path::new(filename)).ok().map(|b| (PathBuf::from(filename), b)),
        };
    }
    if filename == "[vdso]" && len <= 1 << 20 {
        let f = std::fs::File::open(format!("/proc/{pid}/mem")).ok()?;
        let mut buf = vec![0u8; len as usize];
        f.read_exact_at(&mut buf, addr).ok()?;
        return Some((PathBuf::from(filename), buf.into()));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// New executable mappings (files and [vdso]) become MMAP2 records once; data mappings,
    /// [stack] and unchanged mappings do not.
    #[test]
    fn new_exec_mappings_become_mmap2() {
        let maps = "\
55d0c0000000-55d0c0001000 r--p 00000000 08:01 42 /usr/bin/demo
55d0c0001000-55d0c0002000 r-xp 00001000 08:01 42 /usr/bin/demo
55d0c0003000-55d0c0004000 rw-p 00003000 08:01 42 /usr/bin/demo
7ffd00000000-7ffd00021000 rwxp 00000000 00:00 0 [stack]
7ffd00100000-7ffd00102000 r-xp 00000000 00:00 0 [vdso]
";
        let mut t = MapsTracker::new(7);
        let mut out = Vec::new();
        assert!(t.apply(maps, 5, &mut out));
        let names: Vec<(u64, u64, String)> = out
            .iter()
            .map(|s| match s {
                Sideband::Mmap2 { addr, pgoff, filename, pid, .. } => {
                    assert_eq!(*pid, 7);
                    (*addr, *pgoff, filename.clone())
                }
                _ => unreachable!(),
            })
            .collect();
        assert_eq!(names, vec![(0x55d0c0001000, 0x1000, "/usr/bin/demo".into()), (0x7ffd00100000, 0, "[vdso]".into())]);
        out.clear();
        let dlopen = format!("{maps}7f0000001000-7f0000002000 r-xp 00001000 08:01 77 /usr/lib/libx.so\n");
        t.apply(&dlopen, 6, &mut out);
        assert_eq!(out.len(), 1, "only the new mapping: {out:?}");
    }
}
