//! Turns sample records into the context profile: address resolution through the target's
//! address space (re-read on unknown addresses, exec and dlopen), symbolization and the trie.

use std::time::{Duration, Instant};

use etm_stacks::{AddressSpace, ContextTrie, Frame, FrameId, FrameTable};

use crate::symbolize::Symbolizer;

/// Minimum time between two re-reads of `/proc/PID/maps` triggered by unknown addresses.
const RELOAD_MIN_INTERVAL: Duration = Duration::from_millis(250);

/// Stack-depth statistics (how deep the frame-pointer chains are).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct DepthStats {
    /// Samples seen.
    pub samples: u64,
    /// Sum of depths.
    pub sum: u64,
    /// Samples with at most 2 frames (frame-pointer chain missing or broken).
    pub shallow: u64,
    /// Largest depth seen.
    pub max: u32,
}

impl DepthStats {
    /// Average depth.
    pub fn mean(&self) -> f64 {
        if self.samples == 0 { 0.0 } else { self.sum as f64 / self.samples as f64 }
    }
    /// Fraction of samples with at most 2 frames.
    pub fn shallow_fraction(&self) -> f64 {
        if self.samples == 0 { 0.0 } else { self.shallow as f64 / self.samples as f64 }
    }
}

/// Counters of the user-space side.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CollectorStats {
    /// Records received from the ring buffer.
    pub records: u64,
    /// Records that were too short or had an empty stack (counted, skipped).
    pub bad_records: u64,
    /// Records of another process (should not happen: the kernel side filters).
    pub foreign: u64,
    /// Frames whose address was in no known mapping after a re-read.
    pub unmapped_frames: u64,
    /// Re-reads of `/proc/PID/maps`.
    pub maps_reloads: u64,
    /// Stack depths.
    pub depth: DepthStats,
}

/// The live profile of one process.
pub struct Collector {
    pid: u32,
    space: AddressSpace,
    symbolizer: Symbolizer,
    frames: FrameTable,
    trie: ContextTrie,
    stats: CollectorStats,
    last_maps: String,
    last_reload: Option<Instant>,
    path: Vec<FrameId>,
    per_addr: Vec<FrameId>,
    /// `/proc/PID/root`: the target's mount namespace.
    root: String,
}

impl Collector {
    /// A collector for process `pid` keeping at most `max_nodes` contexts.
    pub fn new(pid: u32, max_nodes: usize) -> Collector {
        Collector {
            pid,
            space: AddressSpace::new(),
            symbolizer: Symbolizer::new(),
            frames: FrameTable::new(),
            trie: ContextTrie::new(max_nodes),
            stats: CollectorStats::default(),
            last_maps: String::new(),
            last_reload: None,
            path: Vec::new(),
            per_addr: Vec::new(),
            root: format!("/proc/{pid}/root"),
        }
    }

    /// Re-reads `/proc/PID/maps` and updates the address space if it changed (exec, dlopen).
    pub fn reload_maps(&mut self) -> std::io::Result<()> {
        let text = std::fs::read_to_string(format!("/proc/{}/maps", self.pid))?;
        self.last_reload = Some(Instant::now());
        if text == self.last_maps {
            return Ok(());
        }
        self.stats.maps_reloads += 1;
        let pid = self.pid;
        let new = self.space.update(&text, &mut |e| {
            // map_files works for deleted files and other mount namespaces (root only).
            std::fs::read(format!("/proc/{pid}/map_files/{:x}-{:x}", e.start, e.end))
                .or_else(|_| std::fs::read(format!("/proc/{pid}/root{}", e.path)))
                .ok()
        });
        if new > 0 {
            log::info!("address space of {pid}: {new} new binaries");
        }
        self.last_maps = text;
        Ok(())
    }

    /// Adds one sample with user stack `stack` (leaf first) of process `pid`.
    pub fn add_sample(&mut self, pid: u32, stack: &[u64]) {
        self.stats.records += 1;
        if pid != self.pid {
            self.stats.foreign += 1;
            return;
        }
        if stack.is_empty() {
            self.stats.bad_records += 1;
            return;
        }
        let d = &mut self.stats.depth;
        d.samples += 1;
        d.sum += stack.len() as u64;
        d.max = d.max.max(stack.len() as u32);
        if stack.len() <= 2 {
            d.shallow += 1;
        }
        let mut path = std::mem::take(&mut self.path);
        path.clear();
        // Outermost caller first; return addresses (all but [0]) point after the call, so
        // look up `addr - 1` to land inside the call instruction (right line, right inline).
        for (i, &addr) in stack.iter().enumerate().rev() {
            let lookup = if i == 0 { addr } else { addr.saturating_sub(1) };
            self.frames_of(lookup, &mut path);
        }
        self.trie.add(&path, 1);
        self.path = path;
    }

    fn frames_of(&mut self, addr: u64, out: &mut Vec<FrameId>) {
        let mut r = self.space.resolve(addr);
        if r.is_none() && self.last_reload.is_none_or(|t| t.elapsed() >= RELOAD_MIN_INTERVAL) {
            if let Err(e) = self.reload_maps() {
                log::debug!("re-reading maps of {}: {e}", self.pid);
            }
            r = self.space.resolve(addr);
        }
        let Some(r) = r else {
            self.stats.unmapped_frames += 1;
            out.push(self.frames.intern(Frame::new("[unknown]", None)));
            return;
        };
        let bin = self.space.binary(r.binary).expect("resolved binary exists");
        if !bin.path.starts_with('/') {
            // [vdso] and other pseudo mappings: no file to symbolize from.
            out.push(self.frames.intern(Frame::new(bin.path.clone(), Some(r.binary.0))));
            return;
        }
        self.per_addr.clear();
        self.symbolizer.frames(
            r.binary.0,
            &self.root,
            &bin.path,
            bin.build_id.as_deref(),
            r.link_addr,
            &mut self.frames,
            &mut self.per_addr,
        );
        out.extend_from_slice(&self.per_addr);
    }

    /// The context trie.
    pub fn trie(&self) -> &ContextTrie {
        &self.trie
    }
    /// The frame table.
    pub fn frames(&self) -> &FrameTable {
        &self.frames
    }
    /// The address space.
    pub fn space(&self) -> &AddressSpace {
        &self.space
    }
    /// Counters.
    pub fn stats(&self) -> CollectorStats {
        self.stats
    }
}

