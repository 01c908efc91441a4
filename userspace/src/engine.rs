//! The profile engine both drivers share: [`etm_session::Pipeline`] (decode -> join ->
//! `HybridProfile` + `ContextTrie`) with the binary's symbolizer as its frame namer, the code
//! images the pipeline reads, and the dump writers. `run` (live) and `replay` feed it the same
//! [`SessionEvent`]s and write their profiles with [`write_profile_files`], so a recorded live
//! run replays to the same profile.

use std::cell::RefCell;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use etm_profile::BinaryInfo;
use etm_session::image::ImageBytes;
use etm_session::pipeline::FrameNamer;
use etm_session::session::{PauseSample, SessionEvent, Sideband};
use etm_session::{Pipeline, PipelineConfig};
use etm_stacks::addrspace::Binary;
use etm_stacks::{Frame, FrameId, FrameTable};

use crate::dump::write_atomic;
use crate::symbolize::Symbolizer;
use crate::unwind::{DwarfUnwinder, UnwindMode};
use etm_live::stream::EventSink;

/// Reads the bytes of a code image named by an MMAP2 record (process, file name, address,
/// length): `(local file, bytes)`.
pub type ImageLoader = Box<dyn FnMut(u32, &str, u64, u64) -> Option<(PathBuf, ImageBytes)>>;

/// Binaries known to the engine, shared with the frame namer.
#[derive(Default)]
struct Names {
    symbolizer: Symbolizer,
    /// In registration order; the index is the frames' (and pprof mappings') binary id.
    bins: Vec<Binary>,
    by_path: HashMap<String, u32>,
    /// Original path -> the local file to symbolize from.
    files: Vec<PathBuf>,
    /// Frames whose address was in no known binary.
    unknown_frames: u64,
    /// Per binary (same index as `bins`): what loading it cost, and when it was first named.
    load: Vec<LoadTimes>,
    /// When the engine was made (the origin of [`LoadTimes::first_named_ms`]).
    created: Option<std::time::Instant>,
}

/// What loading one binary cost (manifest `binaries[].load`): wall times of reading or mapping
/// its image, registering it (ELF headers, the pipeline's code map), registering its
/// executable mappings with the DWARF unwinder, and loading its symbol table and DWARF at the
/// first address symbolized in it; and when (since the engine started) a trie frame was first
/// named from it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LoadTimes {
    pub image_us: u64,
    pub register_us: u64,
    pub unwind_us: u64,
    pub symbols_us: u64,
    pub first_named_ms: Option<u64>,
    /// Its code facts for the PGO counters (disassembly), when the profile first met it.
    pub facts_us: Option<u64>,
}

impl LoadTimes {
    /// As manifest JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "image_us": self.image_us, "register_us": self.register_us, "unwind_us": self.unwind_us,
            "symbols_us": self.symbols_us, "first_named_ms": self.first_named_ms, "facts_us": self.facts_us,
        })
    }
}

fn micros(t: std::time::Instant) -> u64 {
    t.elapsed().as_micros().min(u128::from(u64::MAX)) as u64
}

/// Names trie frames with DWARF (inline frames included) through [`Symbolizer`].
struct SymNamer(Rc<RefCell<Names>>);

impl FrameNamer for SymNamer {
    fn frame(&mut self, binary: Option<&BinaryInfo>, symbol: Option<&str>, link: u64, _addr: u64) -> Frame {
        match (symbol, binary) {
            (Some(s), _) => Frame::new(s, None),
            (None, Some(b)) => Frame::new(format!("[{}+{link:#x}]", b.file_name()), None),
            (None, None) => Frame::new("[unknown]", None),
        }
    }

    fn frame_ids(
        &mut self,
        binary: Option<&BinaryInfo>,
        symbol: Option<&str>,
        link: u64,
        addr: u64,
        table: &mut FrameTable,
        out: &mut Vec<FrameId>,
    ) {
        let mut n = self.0.borrow_mut();
        let Some(b) = binary else {
            n.unknown_frames += 1;
            out.push(table.intern(Frame::new("[unknown]", None)));
            return;
        };
        let Some(&id) = n.by_path.get(&b.path) else {
            drop(n);
            out.push(table.intern(self.frame(binary, symbol, link, addr)));
            return;
        };
        if !b.path.starts_with('/') {
            // [vdso] and other pseudo mappings: no file to symbolize from.
            out.push(table.intern(Frame::new(b.path.clone(), Some(id))));
            return;
        }
        let Names { symbolizer, bins, files, load, created, .. } = &mut *n;
        let file = files[id as usize].to_string_lossy().into_owned();
        symbolizer.frames(id, "", &file, bins[id as usize].build_id.as_deref(), link, table, out);
        if let Some(l) = load.get_mut(id as usize)
            && l.first_named_ms.is_none()
        {
            l.symbols_us = symbolizer.load_us(id).unwrap_or(0);
            l.first_named_ms = created.map(|c| c.elapsed().as_millis() as u64);
        }
    }
}

/// The pipeline plus what the binary adds around it.
pub struct Engine {
    pipeline: Pipeline,
    names: Rc<RefCell<Names>>,
    loader: Option<ImageLoader>,
    /// Samples with at least one branch record that reached the profile.
    pub branch_samples: u64,
    /// Stack-depth statistics of the samples pushed.
    pub depth: DepthStats,
    /// `run --unwind dwarf|auto`: the DWARF unwinder of the target's mappings.
    unwind: Option<DwarfUnwinder>,
    /// The images registered, by path (kept only while unwinding, for new mappings).
    images: HashMap<String, ImageBytes>,
    /// `--unwind` for samples that carry a stack copy (pause records).
    unwind_mode: UnwindMode,
    /// The sample a stack copy was unwound into, reused.
    unwound: PauseSample,
    /// The images' code facts, for the profile's counters.
    facts: crate::facts::FactsSource,
}

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
    fn add(&mut self, depth: usize) {
        self.samples += 1;
        self.sum += depth as u64;
        self.max = self.max.max(depth as u32);
        if depth <= 2 {
            self.shallow += 1;
        }
    }
    /// Average depth.
    pub fn mean(&self) -> f64 {
        if self.samples == 0 { 0.0 } else { self.sum as f64 / self.samples as f64 }
    }
    /// Fraction of samples with at most 2 frames.
    pub fn shallow_fraction(&self) -> f64 {
        if self.samples == 0 { 0.0 } else { self.shallow as f64 / self.samples as f64 }
    }
}

impl Engine {
    /// An engine over a pipeline built with `cfg`. `loader` reads code images named by MMAP2
    /// records that were not registered with [`Engine::add_image`] (the live driver).
    pub fn new(cfg: PipelineConfig, loader: Option<ImageLoader>) -> Engine {
        let mut pipeline = Pipeline::new(cfg);
        let names = Rc::new(RefCell::new(Names {
            symbolizer: Symbolizer::new(),
            created: Some(std::time::Instant::now()),
            ..Default::default()
        }));
        pipeline.set_frame_namer(Box::new(SymNamer(names.clone())));
        let facts = crate::facts::FactsSource::default();
        pipeline.set_profile_facts(facts.provider());
        Engine {
            facts,
            pipeline,
            names,
            loader,
            branch_samples: 0,
            depth: DepthStats::default(),
            unwind: None,
            images: HashMap::new(),
            unwind_mode: UnwindMode::Fp,
            unwound: PauseSample::default(),
        }
    }

    /// Registers every executable mapping with a DWARF unwinder from now on
    /// ([`Engine::unwind`]); samples pushed with a stack copy (`PauseSample::user_stack`) get
    /// the stack `mode` chooses ([`DwarfUnwinder::choose`]).
    pub fn enable_unwinding(&mut self, mode: UnwindMode) {
        self.unwind.get_or_insert_with(DwarfUnwinder::default);
        self.unwind_mode = mode;
    }

    /// The DWARF unwinder, if enabled.
    pub fn unwinder(&self) -> Option<&DwarfUnwinder> {
        self.unwind.as_ref()
    }

    /// The DWARF unwinder, mutably, if enabled.
    pub fn unwinder_mut(&mut self) -> Option<&mut DwarfUnwinder> {
        self.unwind.as_mut()
    }

    /// Registers the code image `path` (as MMAP2 records name it), read from `local`.
    pub fn add_image(&mut self, path: &str, local: &Path, data: impl Into<ImageBytes>) {
        let data: ImageBytes = data.into();
        let t0 = std::time::Instant::now();
        let mut n = self.names.borrow_mut();
        if n.by_path.contains_key(path) {
            return;
        }
        let elf = etm_stacks::addrspace::parse_elf(&data).ok();
        let info = BinaryInfo::from_elf(path, &data).unwrap_or_else(|_| BinaryInfo {
            path: path.to_string(),
            build_id: elf.as_ref().and_then(|e| e.build_id.clone()),
            ..Default::default()
        });
        let id = n.bins.len() as u32;
        n.bins.push(Binary {
            path: path.to_string(),
            build_id: info.build_id.clone(),
            segments: elf.as_ref().map(|e| e.segments.clone()).unwrap_or_default(),
            load_addresses: Vec::new(),
            elf_ok: elf.is_some(),
            info,
        });
        n.by_path.insert(path.to_string(), id);
        n.files.push(local.to_path_buf());
        n.load.push(LoadTimes::default());
        drop(n);
        if self.unwind.is_some() {
            self.images.insert(path.to_string(), data.clone());
        }
        self.facts.add_image(path, data.clone());
        self.pipeline.add_image(path, data);
        if let Some(l) = self.names.borrow_mut().load.get_mut(id as usize) {
            l.register_us = micros(t0);
        }
    }

    /// What loading each binary cost, in [`Engine::binaries`] order.
    pub fn load_times(&self) -> Vec<LoadTimes> {
        let n = self.names.borrow();
        n.load.iter().zip(&n.bins).map(|(l, b)| LoadTimes { facts_us: self.facts.facts_us(&b.path), ..*l }).collect()
    }

    /// Whether an image is registered under `path`.
    pub fn has_image(&self, path: &str) -> bool {
        self.names.borrow().by_path.contains_key(path)
    }

    /// The pipeline (stats, profile, trie).
    pub fn pipeline(&self) -> &Pipeline {
        &self.pipeline
    }

    /// The pipeline, mutably (watermarks, finish).
    pub fn pipeline_mut(&mut self) -> &mut Pipeline {
        &mut self.pipeline
    }

    /// Binaries seen, with the addresses their executable mappings were placed at.
    pub fn binaries(&self) -> std::cell::Ref<'_, [Binary]> {
        std::cell::Ref::map(self.names.borrow(), |n| n.bins.as_slice())
    }

    /// Trie frames whose address was in no known binary.
    pub fn unknown_frames(&self) -> u64 {
        self.names.borrow().unknown_frames
    }

    /// Whether every address of `stack` lies in a binary the pipeline has placed.
    pub fn resolves(&self, stack: &[u64]) -> bool {
        let r = self.pipeline.resolver();
        stack.iter().enumerate().all(|(i, &a)| r.resolve(if i == 0 { a } else { a.saturating_sub(1) }).is_some())
    }

    /// Feeds one event (the one entry point of both drivers). A sample with a stack copy
    /// goes on with the stack `--unwind` chooses for it (nothing after this reads the copy).
    pub fn push(&mut self, ev: SessionEvent<'_>) {
        if let SessionEvent::Sample(s) = ev
            && let Some(us) = &s.user_stack
            && let Some(u) = self.unwind.as_mut()
        {
            let regs = etm_bpf_common::UserRegs {
                magic: etm_bpf_common::USTACK_MAGIC,
                flags: us.flags,
                pc: us.pc,
                sp: us.sp,
                fp: us.fp,
                lr: us.lr,
                copied: us.bytes.len() as u32,
                size: us.size,
            };
            let mut d = std::mem::take(&mut self.unwound);
            if u.choose(self.unwind_mode, Some((regs, &us.bytes)), &s.stack, &mut d.stack) {
                d.cpu = s.cpu;
                d.pid = s.pid;
                d.tid = s.tid;
                d.time = s.time;
                d.branches.clone_from(&s.branches);
                d.branch_flags.clone_from(&s.branch_flags);
                d.window_ns = s.window_ns;
                self.push_event(SessionEvent::Sample(&d));
            } else {
                // its frame-pointer stack, as it came (the pipeline does not read the copy)
                self.push_event(ev);
            }
            self.unwound = d;
            return;
        }
        self.push_event(ev);
    }

    fn push_event(&mut self, ev: SessionEvent<'_>) {
        match &ev {
            SessionEvent::Sideband(Sideband::Mmap2 { pid, filename, addr, len, prot, pgoff, .. }) => {
                let t0 = std::time::Instant::now();
                if !self.has_image(filename)
                    && (*prot == 0 || *prot & libc::PROT_EXEC as u32 != 0)
                    && let Some(load) = self.loader.as_mut()
                    && let Some((local, bytes)) = load(*pid, filename, *addr, *len)
                {
                    let image_us = micros(t0);
                    self.add_image(filename, &local, bytes);
                    if let Some(l) = self.names.borrow_mut().load.last_mut() {
                        l.image_us = image_us;
                    }
                }
                let t1 = std::time::Instant::now();
                if let Some(u) = self.unwind.as_mut()
                    && let Some(data) = self.images.get(filename.as_str())
                    && (*prot == 0 || *prot & libc::PROT_EXEC as u32 != 0)
                    && let Err(e) = u.add_mapping(filename, data, *addr, *len, *pgoff)
                {
                    log::debug!("no unwind info for {filename}: {e}");
                }
                let unwind_us = micros(t1);
                let mut n = self.names.borrow_mut();
                if let Some(&id) = n.by_path.get(filename.as_str()) {
                    n.load[id as usize].unwind_us += unwind_us;
                    let la = &mut n.bins[id as usize].load_addresses;
                    if let Err(pos) = la.binary_search(addr) {
                        la.insert(pos, *addr);
                    }
                }
            }
            SessionEvent::Sample(s) => {
                self.depth.add(s.stack.len());
                if s.branches.as_ref().is_some_and(|b| !b.is_empty()) {
                    self.branch_samples += 1;
                }
            }
            _ => {}
        }
        self.pipeline.push(ev);
    }
}

impl EventSink for Engine {
    fn event(&mut self, ev: SessionEvent<'_>) {
        self.push(ev);
    }
}

fn rejects(c: &etm_session::join::RejectCounts) -> std::collections::BTreeMap<&'static str, u64> {
    c.iter().map(|(r, n)| (r.name(), n)).collect()
}

/// What the DWARF unwinder did (`--unwind dwarf|auto`; `enabled: false` and zeros under
/// `fp`), without wall times: the replay's manifest is deterministic, `run` adds its timing
/// and the kernel's copy counters.
pub fn unwind_counts(e: &Engine) -> serde_json::Value {
    let u = e.unwinder().map(|u| u.stats).unwrap_or_default();
    serde_json::json!({
        "enabled": e.unwinder().is_some(),
        "dwarf_stacks": u.dwarf,
        "frame_pointer_stacks": u.fp,
        "dwarf_truncated": u.truncated,
        "dwarf_failed": u.failed,
        "records_without_copy": u.no_copy,
        "copy_bytes_per_sample": u.copied_bytes.checked_div(u.unwinds).unwrap_or(0),
        "fp_stacks_trusted": u.fp_trusted,
        "binaries_with_frame_pointers": u.fp_binaries,
        "binaries_without_frame_pointers": u.no_fp_binaries,
    })
}

/// The pipeline's counters as JSON (replay summary, `run` manifest).
pub fn pipeline_json(p: &Pipeline) -> serde_json::Value {
    let st = p.stats();
    serde_json::json!({
        "aux": {
            "records": st.aux_records, "bytes": st.aux_bytes, "truncated": st.aux_truncated,
            "short": st.aux_short, "gaps": st.aux_gaps, "partial_collision": st.aux_partial_collision,
            "overwrite": st.aux_overwrite, "undecoded": st.aux_undecoded,
            "collision_resets": st.aux_collision_resets, "cpu_changes": st.aux_cpu_changes,
        },
        "decode": {
            "resets": st.decoder_resets, "overflows": st.decode_overflows, "nosync": st.decode_nosync,
            "errors": st.decode_errors, "nocode": st.decode_nocode, "trace_on": st.trace_on,
            "branches": st.branches, "unknown_trace_id": st.unknown_trace_id, "foreign": st.decode_foreign,
            "worker_failures": st.decode_worker_failures,
        },
        "join": {
            "segments": st.join.segments, "segments_unmatched": st.join.segments_unmatched,
            "segments_overflow": st.join.segments_overflow,
            "samples": st.samples, "joined": st.join.joined, "partial": st.join.partial,
            "forced": st.join.forced, "by_watermark": st.join.by_watermark, "unverified": st.join.unverified,
            "leaf_frame_missing": st.join.leaf_frame_missing,
            "rejected": st.join.rejected.total(), "rejected_by_reason": rejects(st.rejected()),
            "synthesized": st.join.synthesized, "synth_unverified": st.join.synth_unverified,
            "synth_rejected": st.join.synth_rejected.total(),
            "synth_rejected_by_reason": rejects(&st.join.synth_rejected),
            "synth_stops": st.join.synth_stops.total(),
            "synth_stops_by_reason": st.join.synth_stops.iter().map(|(r, n)| (r.name(), n)).collect::<std::collections::BTreeMap<_, _>>(),
        },
        "samples": {"lbr": st.lbr_samples, "stack_only": st.stack_only_samples, "profiled": st.profiled, "stacks_truncated": st.stacks_truncated},
        "exact": exact_json(p),
        "branch_records": {
            "empty_stacks": st.lbr_empty, "wrong_path_dropped": st.lbr_wrong_path, "tx_aborts": st.lbr_tx_abort,
            "partial_entries": st.lbr_partial_entries, "cut_entries": st.lbr_cut_entries,
            "flags_mismatch": st.lbr_flags_mismatch, "warning": st.branch_warning(),
        },
        "sideband": {
            "records": st.sideband, "lost_records": st.lost_records, "lost_events": st.lost_events,
            "switches": st.switches, "throttles": st.throttles, "window_ends": st.window_ends,
            "trace_complete": st.trace_complete,
        },
        "profile": profile_json(p.profile()),
        "contexts": p.trie().0.len().saturating_sub(1),
    })
}

/// The profile's counters as JSON (`pipeline.profile` of the replay summary and the `run`
/// manifest, `profile` of `convert`'s).
pub fn profile_json(p: &etm_profile::HybridProfile) -> serde_json::Value {
    let ps = p.stats();
    let (mut tuples, mut contexts, mut counts) = (0, 0, 0);
    for b in 0..p.binaries().len() {
        let a = p.agg(b);
        tuples += a.tuples().len();
        contexts += a.context_count();
        counts += a.count_entries();
    }
    serde_json::json!({
        "samples": ps.samples, "unresolved_addresses": ps.unresolved_addresses,
        // The counters (memory bounded by code and contexts) and what their budget did.
        "tuples": tuples, "contexts": contexts, "counts": counts, "stacks": p.stacks().count(),
        "bytes": p.bytes_used(), "accounted_bytes": p.accounted_bytes(), "budget_bytes": p.limits().max_bytes,
        "samples_not_counted": ps.agg.samples_dropped, "counts_folded": ps.agg.counts_folded,
        "counts_dropped": ps.agg.counts_dropped, "contexts_folded": ps.agg.contexts_folded,
        "stacks_folded": ps.stacks_folded, "stacks_dropped": ps.stacks_dropped,
        // The store of distinct samples the .perfscript dump is written from: past its
        // budget new samples fold to their leaf, then are dropped (the counters have them).
        "distinct": p.distinct_samples(), "sample_store_bytes": p.sample_bytes(),
        "sample_budget_bytes": p.limits().max_sample_bytes, "folded": ps.folded, "dropped": ps.dropped,
    })
}

/// Timing and labels of a pprof dump.
pub struct DumpMeta {
    pub period_ns: i64,
    pub time_nanos: i64,
    pub duration_nanos: i64,
    pub comment: String,
}

/// A copy of what a dump writes, taken on the drain loop so that a worker can write it while
/// draining goes on ([`crate::dumper::Dumper`]).
#[derive(Clone)]
pub struct DumpSnapshot {
    pub profile: etm_profile::HybridProfile,
    pub trie: etm_stacks::trie::ContextTrie,
    pub frames: etm_stacks::frames::FrameTable,
    /// Code images of the profile's binaries (shared, not copied).
    pub images: Vec<(String, ImageBytes)>,
    /// Write the per-binary PGO dumps (samples carry branch records).
    pub pgo: bool,
    /// Per binary path: the local file to symbolize from and the build-id.
    pub files: Vec<(String, PathBuf, Option<Vec<u8>>)>,
    /// Exact instruction counts per function from the trace (empty without ETM), with the
    /// number of segments and instructions they come from.
    pub functions: Vec<etm_session::pipeline::ExactFunction>,
    pub exact_totals: (u64, u64),
    /// The exact instructions per calling context, as folded lines (`instructions.folded`).
    pub exact_folded: Vec<String>,
    /// The calling contexts entered by a call, named as in `exact_folded`, with their calls
    /// and instructions per call (`contexts.csv`).
    pub exact_context_calls: Vec<(String, etm_profile::exact::ContextCalls)>,
}

impl Engine {
    /// The copy of the profile a dump writes.
    pub fn snapshot(&self) -> DumpSnapshot {
        let p = &self.pipeline;
        let (trie, frames) = p.trie();
        let images = p.profile().binaries().iter().filter_map(|b| Some((b.path.clone(), p.code().image_arc(&b.path)?))).collect();
        DumpSnapshot {
            profile: p.profile().clone(),
            trie: trie.clone(),
            frames: frames.clone(),
            images,
            pgo: self.has_branches(),
            files: {
                let n = self.names.borrow();
                n.bins.iter().zip(&n.files).map(|(b, f)| (b.path.clone(), f.clone(), b.build_id.clone())).collect()
            },
            functions: exact_functions(p),
            exact_totals: (p.exact_counts().segments(), p.exact_counts().instructions()),
            exact_folded: exact_folded(p),
            exact_context_calls: exact_context_calls(p),
        }
    }
}

/// Writes a snapshot into `dir` atomically: the per-binary PGO dumps (`<binary>.perfscript`,
/// `.unsym.txt`, `.bolt.pa`) when it has branch records (code facts from its images, kept in
/// `facts`), `profile.folded` and `profile.pb.gz`. Returns the names of the files written.
pub fn write_snapshot_files(
    dir: &Path,
    s: &DumpSnapshot,
    meta: &DumpMeta,
    facts: &mut crate::cmd::convert::FactsCache,
) -> anyhow::Result<Vec<String>> {
    let mut files = Vec::new();
    if s.pgo {
        let image = |b: &BinaryInfo| s.images.iter().find(|(p, _)| *p == b.path).map(|(_, d)| d.as_slice());
        files.extend(
            crate::cmd::convert::write_profile_dumps_cached(&s.profile, dir, &image, facts)?
                .iter()
                .filter_map(|f| f.file_name().map(|n| n.to_string_lossy().into_owned())),
        );
    }
    let folded = etm_stacks::folded::folded_lines(&s.trie, &s.frames);
    write_atomic(&dir.join("profile.folded"), |w| {
        for l in &folded {
            writeln!(w, "{l}")?;
        }
        Ok(())
    })?;
    write_atomic(&dir.join("profile.svg"), |w| etm_write::flame::write_flamegraph(&folded, &meta.comment, "samples", w))?;
    let pmeta = etm_write::pprof::PprofMeta {
        period_ns: meta.period_ns,
        time_nanos: meta.time_nanos,
        duration_nanos: meta.duration_nanos,
        comments: vec![meta.comment.clone()],
    };
    let profile = pprof_of(s, &pmeta, &mut facts.symbols);
    write_atomic(&dir.join("profile.pb.gz"), |w| etm_write::pprof::write_pprof_gz(&profile, w))?;
    if s.exact_totals.0 > 0 {
        write_atomic(&dir.join("functions.csv"), |w| write_functions_csv(s, w))?;
        files.push("functions.csv".into());
        write_atomic(&dir.join("contexts.csv"), |w| write_contexts_csv(s, w))?;
        files.push("contexts.csv".into());
        write_atomic(&dir.join("instructions.folded"), |w| {
            for l in &s.exact_folded {
                writeln!(w, "{l}")?;
            }
            Ok(())
        })?;
        write_atomic(&dir.join("instructions.svg"), |w| {
            etm_write::flame::write_flamegraph_all(&s.exact_folded, &meta.comment, "instructions", w)
        })?;
        files.push("instructions.folded".into());
        files.push("instructions.svg".into());
    }
    files.push("profile.folded".into());
    files.push("profile.svg".into());
    files.push("profile.pb.gz".into());
    Ok(files)
}

/// The exact per-function counts of the pipeline, with the symbols demangled as the frames
/// of the views and folded profiles are.
pub fn exact_functions(p: &Pipeline) -> Vec<etm_session::pipeline::ExactFunction> {
    let mut v = p.exact_functions();
    for f in &mut v {
        f.function = crate::symbolize::demangle(&f.function);
    }
    v
}

/// The exact instructions per calling context as folded lines (`outermost;...;innermost
/// instructions`, sorted), the names demangled as in [`exact_functions`].
fn exact_folded(p: &Pipeline) -> Vec<String> {
    let mut v: Vec<String> = p.exact_contexts().into_iter().map(|(path, n)| format!("{} {n}", context_name(path))).collect();
    v.sort();
    v
}

/// A context's path as in `instructions.folded`: `outermost;...;innermost`, demangled.
fn context_name(path: Vec<&str>) -> String {
    let names: Vec<String> = path.into_iter().map(crate::symbolize::demangle).collect();
    names.join(";")
}

/// The calling contexts entered by a call, named by [`context_name`].
fn exact_context_calls(p: &Pipeline) -> Vec<(String, etm_profile::exact::ContextCalls)> {
    p.exact_context_calls().into_iter().map(|(path, c)| (context_name(path), c)).collect()
}

/// Per function name: its exact counts (the live view's columns).
pub fn exact_figures(p: &Pipeline) -> std::collections::HashMap<String, crate::tui::app::ExactFigures> {
    crate::tui::app::ExactFigures::by_name(&exact_functions(p))
}

/// The summary of the exact per-function counts (`functions.csv`).
fn exact_json(p: &Pipeline) -> serde_json::Value {
    let c = p.exact_counts();
    serde_json::json!({
        "enabled": p.exact_enabled(),
        "segments": c.segments(),
        "instructions": c.instructions(),
        "functions": c.functions_seen(),
        "instructions_beyond_function_bound": c.overflow_instructions,
        "blocks_covered": c.coverage().0,
        "branches_covered": c.coverage().1,
        "coverage_beyond_bound": c.coverage_overflow,
        "context_calls_beyond_bound": c.context_calls_beyond_bound,
    })
}

/// A CSV field (RFC 4180: quoted when it holds a comma, quote or line break).
fn csv_field(s: &str) -> std::borrow::Cow<'_, str> {
    if s.contains([',', '"', '\n', '\r']) { format!("\"{}\"", s.replace('"', "\"\"")).into() } else { s.into() }
}

/// `functions.csv`: the exact instruction counts per function from the decoded trace, most
/// first, with the share of all traced instructions and its 95% interval (segments as the
/// sampling unit: `etm_profile::exact`); instructions inclusive of callees inside the segments,
/// calls, instructions per call (self and inclusive, each with its 95% interval, from the calls
/// complete inside a window: `etm_profile::exact`; empty without), the distinct blocks and taken
/// branches covered, and the complete calls.
fn write_functions_csv(s: &DumpSnapshot, w: &mut dyn std::io::Write) -> std::io::Result<()> {
    writeln!(
        w,
        "function,binary,instructions,share,ci95_low,ci95_high,stderr,segments,inclusive,calls,\
         self_per_call,self_per_call_ci95_low,self_per_call_ci95_high,self_per_call_stderr,\
         inclusive_per_call,inclusive_per_call_ci95_low,inclusive_per_call_ci95_high,inclusive_per_call_stderr,\
         blocks,branches,complete_calls"
    )?;
    for f in &s.functions {
        let c = &f.count;
        writeln!(
            w,
            "{},{},{},{:.6},{:.6},{:.6},{:.6},{},{},{},{},{},{},{},{}",
            csv_field(&f.function),
            csv_field(&f.binary),
            c.instructions,
            c.share,
            c.ci.0,
            c.ci.1,
            c.stderr,
            c.segments,
            c.inclusive,
            c.calls,
            ratio_fields(c.self_per_call),
            ratio_fields(c.inclusive_per_call),
            c.blocks,
            c.branches,
            c.complete_calls
        )?;
    }
    Ok(())
}

/// `contexts.csv`: per calling context entered by a call in the decoded trace (its path as in
/// `instructions.folded`, the innermost function the one called), the instructions that
/// function executed in it, its calls and complete calls, and its instructions per call self
/// and inclusive with 95% intervals (the estimator of `functions.csv`, over the calls of this
/// context: `etm_profile::exact`), most calls first.
fn write_contexts_csv(s: &DumpSnapshot, w: &mut dyn std::io::Write) -> std::io::Result<()> {
    writeln!(
        w,
        "context,function,instructions,calls,complete_calls,\
         self_per_call,self_per_call_ci95_low,self_per_call_ci95_high,self_per_call_stderr,\
         inclusive_per_call,inclusive_per_call_ci95_low,inclusive_per_call_ci95_high,inclusive_per_call_stderr"
    )?;
    for (name, c) in &s.exact_context_calls {
        let function = name.rsplit(';').next().unwrap_or(name);
        writeln!(
            w,
            "{},{},{},{},{},{},{}",
            csv_field(name),
            csv_field(function),
            c.instructions,
            c.calls,
            c.complete_calls,
            ratio_fields(c.self_per_call),
            ratio_fields(c.inclusive_per_call)
        )?;
    }
    Ok(())
}

/// A ratio estimate as four CSV fields (value, 95% interval, stderr), empty without one.
fn ratio_fields(r: Option<etm_profile::exact::Ratio>) -> String {
    match r {
        Some(r) => format!("{:.4},{:.4},{:.4},{:.4}", r.value, r.ci.0, r.ci.1, r.stderr),
        None => ",,,".to_owned(),
    }
}

/// The address-level pprof profile of a snapshot ([`etm_write::pprof::build_address_profile`]),
/// its locations named as the trie names its frames (the same symbolizer rules: DWARF with
/// inline frames, symbols with perf's extents, `[binary+0x...]`, pseudo mappings by name).
fn pprof_of(s: &DumpSnapshot, meta: &etm_write::pprof::PprofMeta, symbols: &mut Symbolizer) -> etm_write::pprof::Profile {
    use etm_write::pprof::SourceLine;
    let bins = s.profile.binaries();
    let mut symbolize = |b: usize, addr: u64| -> Vec<SourceLine> {
        let Some(info) = bins.get(b) else { return Vec::new() };
        let path = info.path.as_str();
        let Some(id) = s.files.iter().position(|(p, _, _)| p == path) else {
            return vec![SourceLine { function: Symbolizer::unknown_name(path, addr), file: String::new(), line: 0 }];
        };
        if !path.starts_with('/') {
            return vec![SourceLine { function: path.to_owned(), file: String::new(), line: 0 }];
        }
        let (_, local, build_id) = &s.files[id];
        let lines = symbols.lines(id as u32, "", &local.to_string_lossy(), build_id.as_deref(), addr);
        if lines.is_empty() {
            return vec![SourceLine { function: Symbolizer::unknown_name(path, addr), file: String::new(), line: 0 }];
        }
        lines
            .into_iter()
            .map(|l| SourceLine { function: l.function, file: l.file.unwrap_or_default(), line: i64::from(l.line) })
            .collect()
    };
    let st = s.profile.stats();
    let mut meta = meta.clone();
    if st.stacks_folded + st.stacks_dropped > 0 {
        meta.comments.push(format!(
            "the profile's budget cut {} samples to their leaf and dropped {}; profile.folded keeps their contexts",
            st.stacks_folded, st.stacks_dropped
        ));
    }
    etm_write::pprof::build_address_profile(&s.profile, &mut symbolize, "[unknown]", &meta)
}

/// [`write_snapshot_files`] of the engine's current profile, with the PGO dumps when `pgo`.
pub fn write_profile_files(dir: &Path, e: &Engine, meta: &DumpMeta, pgo: bool) -> anyhow::Result<Vec<String>> {
    let s = DumpSnapshot { pgo, ..e.snapshot() };
    write_snapshot_files(dir, &s, meta, &mut crate::cmd::convert::FactsCache::default())
}

impl Engine {
    /// Whether any profiled sample carried branch records (ETM windows or LBR/BRBE).
    pub fn has_branches(&self) -> bool {
        let st = self.pipeline.stats();
        st.join.joined > 0 || self.branch_samples > 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use etm_session::session::{BranchPair, PauseSample};
    use std::process::Command;
    use std::sync::Arc;

    /// Samples pushed through the engine (image + MMAP2 placing it at a PIE base) land in the
    /// context trie with the frames `addr2line(1)` independently reports, inline frames
    /// included; per-binary PGO dumps are written once a sample carries branch records.
    #[test]
    fn engine_names_inline_frames_and_writes_pgo_dumps_with_branches() {
        let dir = tempfile::tempdir().unwrap();
        let (src, exe) = (dir.path().join("t.c"), dir.path().join("t"));
        std::fs::write(
            &src,
            "static inline __attribute__((always_inline)) int leaf(int x) { \
               for (int i = 0; i < 100; i++) x = x * 3 + i; return x; }\n\
             __attribute__((noinline)) int outer(int x) { return leaf(x) + 1; }\n\
             __attribute__((noinline)) int a(int x) { return outer(x) * 2; }\n\
             int main(int c, char **v) { return a(c); }\n",
        )
        .unwrap();
        let Some(cc) = ["clang-22", "clang", "gcc", "cc"].into_iter().find(|c| Command::new(c).arg("--version").output().is_ok())
        else {
            etm_testutil::skip("no C compiler found");
            return;
        };
        // Real calls (no tail calls), so that each caller has a return address.
        assert!(
            Command::new(cc)
                .args(["-O2", "-g", "-fno-optimize-sibling-calls", "-o"])
                .arg(&exe)
                .arg(&src)
                .status()
                .unwrap()
                .success()
        );
        let Some(nm) = Command::new("nm").arg(&exe).output().ok().filter(|o| o.status.success()) else {
            etm_testutil::skip("nm (binutils) not available");
            return;
        };
        let nm = String::from_utf8(nm.stdout).unwrap();
        let sym = |name: &str| {
            nm.lines()
                .find_map(|l| {
                    let v: Vec<&str> = l.split_whitespace().collect();
                    (v.len() == 3 && v[2] == name).then(|| u64::from_str_radix(v[0], 16).unwrap())
                })
                .unwrap()
        };
        let outer = sym("outer");
        // The return addresses: the instruction after the call to `target` (objdump -d).
        let dis = String::from_utf8(Command::new("objdump").arg("-d").arg(&exe).output().unwrap().stdout).unwrap();
        let call = |target: &str| -> (u64, u64) {
            let lines: Vec<&str> = dis.lines().collect();
            let i = lines.iter().position(|l| l.contains("call") && l.ends_with(&format!("<{target}>"))).expect("a call");
            let addr = |l: &str| u64::from_str_radix(l.split(':').next().unwrap().trim(), 16).unwrap();
            (addr(lines[i]), addr(lines[i + 1]))
        };
        let ((call_outer, ret_a), (_, ret_main)) = (call("outer"), call("a"));
        // addr2line -a -f -i: per address, the function names innermost first.
        let addrs: Vec<String> = (outer..outer + 64).map(|x| format!("{x:#x}")).collect();
        let Some(o) = Command::new("addr2line").args(["-a", "-f", "-i", "-e"]).arg(&exe).args(&addrs).output().ok() else {
            etm_testutil::skip("addr2line (binutils) not available");
            return;
        };
        let text = String::from_utf8(o.stdout).unwrap();
        let mut inline_addr = None;
        for group in text.split("\n0x") {
            let lines: Vec<&str> = group.lines().collect();
            let funcs: Vec<&str> = lines.iter().skip(1).step_by(2).copied().collect();
            if funcs == ["leaf", "outer"] {
                inline_addr = Some(u64::from_str_radix(lines[0].trim_start_matches("0x"), 16).unwrap());
                break;
            }
        }
        let x = inline_addr.expect("addr2line finds leaf inlined in outer");

        let data = Arc::new(std::fs::read(&exe).unwrap());
        let info = BinaryInfo::from_elf("/opt/t", &data).unwrap();
        let seg = info.exec_segments[0];
        let base = 0x5555_0000_0000u64;
        // The image mapped at a PIE base, as the kernel would report it.
        let mmap = Sideband::Mmap2 {
            pid: 9,
            tid: 9,
            addr: base + (seg.vaddr & !0xfff),
            len: seg.memsz + (seg.vaddr & 0xfff),
            pgoff: seg.offset & !0xfff,
            prot: 5,
            flags: 2,
            filename: "/opt/t".into(),
            build_id: None,
            time: 0,
            cpu: None,
        };
        let mut e = Engine::new(PipelineConfig::default(), None);
        e.add_image("/opt/t", &exe, data);
        e.push(SessionEvent::Sideband(&mmap));
        let stack = vec![base + x, base + ret_a, base + ret_main];
        assert!(e.resolves(&stack));
        // Placed at the PIE base, the image is not also at its link-time addresses.
        assert!(!e.resolves(&[x]), "{x:#x} resolves in a placed PIE");
        let s = PauseSample {
            cpu: 0,
            pid: 9,
            tid: 9,
            time: 1,
            stack: stack.clone(),
            branches: None,
            branch_flags: Vec::new(),
            window_ns: None,
            user_stack: None,
        };
        e.push(SessionEvent::Sample(&s));
        let (trie, frames) = e.pipeline().trie();
        let folded = etm_stacks::folded::folded_lines(trie, frames);
        assert_eq!(folded, vec!["main;a;outer;leaf 1".to_string()]);
        // The counters say how full the profile is: one sampled stack, no branches (nothing
        // counted for the PGO dumps, no sample kept for a perf-script dump).
        let pj = pipeline_json(e.pipeline());
        assert_eq!((pj["profile"]["stacks"].as_u64(), pj["profile"]["distinct"].as_u64()), (Some(1), Some(0)));
        assert_eq!(pj["profile"]["bytes"].as_u64(), Some(e.pipeline().profile().bytes_used() as u64));
        assert!(pj["profile"]["bytes"].as_u64().unwrap() > 0);
        assert_eq!(pj["profile"]["budget_bytes"].as_u64(), Some(etm_profile::ProfileLimits::default().max_bytes as u64));
        assert_eq!(e.binaries()[0].load_addresses, vec![base + (seg.vaddr & !0xfff)]);

        let meta = DumpMeta { period_ns: 1, time_nanos: 0, duration_nanos: 0, comment: "t".into() };
        let out = tempfile::tempdir().unwrap();
        assert!(!e.has_branches());
        let files = write_profile_files(out.path(), &e, &meta, e.has_branches()).unwrap();
        assert_eq!(files, ["profile.folded", "profile.svg", "profile.pb.gz"]);

        // An LBR-style sample: branch into outer from a (validation off: x86 code).
        let mut cfg = PipelineConfig::default();
        cfg.join.validate = false;
        let mut e2 = Engine::new(cfg, None);
        e2.add_image("/opt/t", &exe, Arc::new(std::fs::read(&exe).unwrap()));
        e2.push(SessionEvent::Sideband(&mmap));
        let br = vec![BranchPair { from: base + call_outer, to: base + outer }];
        e2.push(SessionEvent::Sample(&PauseSample { branches: Some(br.clone()), ..s.clone() }));
        assert!(e2.has_branches());
        let files = write_profile_files(out.path(), &e2, &meta, e2.has_branches()).unwrap();
        // A DWARF binary: its context-sensitive profile is the counters' (no perf-script
        // dump needed), with the context-free one beside it.
        assert_eq!(files[..4], ["t.unsym.txt", "t.autofdo.unsym.txt", "t.bolt.pa", "profile.folded"], "{files:?}");
        let bolt = std::fs::read_to_string(out.path().join("t.bolt.pa")).unwrap();
        // The PGO dumps use link-time addresses (the MMAP2 bias removed).
        assert_eq!(bolt, format!("B {call_outer:x} {outer:x} 1 0\n"));
        // With every sample kept, the perf-script dump too.
        let mut cfg = PipelineConfig::default();
        cfg.join.validate = false;
        cfg.profile.keep_samples = etm_profile::KeepSamples::All;
        let mut e3 = Engine::new(cfg, None);
        e3.add_image("/opt/t", &exe, Arc::new(std::fs::read(&exe).unwrap()));
        e3.push(SessionEvent::Sideband(&mmap));
        e3.push(SessionEvent::Sample(&PauseSample { branches: Some(br), ..s }));
        let files = write_profile_files(out.path(), &e3, &meta, e3.has_branches()).unwrap();
        assert!(files.iter().any(|f| f == "t.perfscript"), "{files:?}");
        let ps = std::fs::read_to_string(out.path().join("t.perfscript")).unwrap();
        assert!(ps.contains(&format!(" {call_outer:#x}/{outer:#x}/")), "{ps}");
    }
}
