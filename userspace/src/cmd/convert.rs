//! `etm-bpf convert`: perf-script samples (`perf script -F ip,brstack`, with or without call
//! stacks, plain or aggregated) into the etm-bpf profile model and its dumps.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};

use crate::dump::write_atomic;
use etm_profile::{BinaryInfo, HybridProfile, MmapResolver, ProfileLimits, perfscript};
use etm_write::pgo;
use etm_write::symbolize::DwarfSymbolizer;
use etm_write::unwind;

#[derive(clap::Args, Debug)]
#[command(after_help = "Examples:\n  \
    perf record -e cycles -b --call-graph fp -- ./app && perf script -F ip,brstack --show-mmap-events > app.script\n  \
    etm-bpf convert --perfscript app.script --binary ./app --dump-dir out/\n  \
    llvm-profgen --perfscript out/app.perfscript --binary ./app --output app.prof")]
pub struct ConvertArgs {
    /// perf-script text to read; given several times, each file is read into its own profile
    /// and the profiles are merged (e.g. to merge earlier `.perfscript` dumps).
    #[arg(long, required = true)]
    pub perfscript: Vec<PathBuf>,
    /// Profiled binaries (ELF); default: the files named by the script's MMAP lines.
    #[arg(long)]
    pub binary: Vec<PathBuf>,
    /// Directory to write the dumps and manifest.json into (created if missing).
    #[arg(long)]
    pub dump_dir: PathBuf,
    /// Memory budget in MiB of the counters (new contexts past it are counted in the empty
    /// context) and of the store of samples the `.perfscript` dump is written from (new
    /// samples past it are folded to their leaf, then dropped), each.
    #[arg(long, default_value_t = 512)]
    pub max_mb: usize,
}

pub fn main(args: ConvertArgs) -> anyhow::Result<ExitCode> {
    let mut texts = Vec::new();
    let mut non_utf8 = 0u64;
    for p in &args.perfscript {
        let bytes = std::fs::read(p).with_context(|| format!("cannot read {}", p.display()))?;
        let (text, bad) = lossy_lines(bytes);
        if bad > 0 {
            log::warn!("{}: {bad} lines are not valid UTF-8 and were read with replacement characters", p.display());
        }
        non_utf8 += bad;
        texts.push(text);
    }
    let mut paths = args.binary.clone();
    if paths.is_empty() {
        for line in texts.iter().flat_map(|t| t.lines()).filter(|l| l.contains("PERF_RECORD_MMAP")) {
            if let Some((_, _, _, p)) = perfscript::parse_mmap_line(line)
                && Path::new(p).is_file()
                && !paths.iter().any(|q| q == Path::new(p))
            {
                paths.push(PathBuf::from(p));
            }
        }
        if paths.is_empty() {
            bail!("no --binary given and no MMAP line names a readable file");
        }
    }
    let mut infos = Vec::new();
    let mut images = Vec::new();
    let facts = crate::facts::FactsSource::default();
    for p in &paths {
        let data = etm_session::image::ImageBytes::map(p).with_context(|| format!("reading binary {}", p.display()))?;
        let info =
            BinaryInfo::from_elf(&p.to_string_lossy(), &data).with_context(|| format!("parsing binary {}", p.display()))?;
        facts.add_image(&info.path, data.clone());
        infos.push(info);
        images.push(data);
    }
    let limits = ProfileLimits {
        max_bytes: args.max_mb << 20,
        max_sample_bytes: args.max_mb << 20,
        keep_samples: etm_profile::KeepSamples::All,
        ..Default::default()
    };
    let mut profile = HybridProfile::new(limits);
    profile.set_facts_provider(facts.provider());
    let mut st = perfscript::PerfScriptStats::default();
    for (text, path) in texts.iter().zip(&args.perfscript) {
        // Each file has its own load bases and its own profile, merged into the total.
        let mut resolver = MmapResolver::new(infos.clone());
        let mut one = HybridProfile::new(limits); // fresh id cache for this file's resolver
        one.set_facts_provider(facts.provider());
        let s = perfscript::read_perfscript(text, &mut resolver, &mut one);
        log::info!("{}: {}", path.display(), describe(&s));
        if s.hybrid_samples + s.branch_only_samples == 0 {
            bail!(
                "no samples read from {} ({}; expected `perf script -F ip,brstack` output, with or \
                 without call stacks): {}",
                path.display(),
                plural(s.lines, "line"),
                describe(&s)
            );
        }
        profile.merge(&one);
        st.lines += s.lines;
        st.hybrid_samples += s.hybrid_samples;
        st.branch_only_samples += s.branch_only_samples;
        st.mmap_events += s.mmap_events;
        st.mmap_matched += s.mmap_matched;
        st.mmap_unparsed += s.mmap_unparsed;
        st.rejected_samples += s.rejected_samples;
        st.broken_branch_entries += s.broken_branch_entries;
    }
    let image = |b: &BinaryInfo| infos.iter().position(|i| i.path == b.path).map(|k| &images[k][..]);
    let files = write_profile_dumps_from_images(&profile, &args.dump_dir, &image)?;
    write_manifest(&args.dump_dir, &files, &profile, &st, non_utf8)?;
    for f in &files {
        println!("{}", f.display());
    }
    let mut summary = format!(
        "etm-bpf: converted {} ({} read{})",
        describe(&st),
        plural(st.lines, "line"),
        match non_utf8 {
            0 => String::new(),
            1 => ", 1 line not valid UTF-8, read with replacement characters".to_string(),
            n => format!(", {n} lines not valid UTF-8, read with replacement characters"),
        }
    );
    summary.push('.');
    eprintln!("{summary}");
    Ok(ExitCode::SUCCESS)
}

/// The text of a perf script: valid UTF-8 as is; otherwise every line that is not valid UTF-8
/// is read lossily (invalid bytes become U+FFFD, so a symbol or comm with a stray byte does
/// not lose its sample's addresses). Returns the text and the number of such lines.
pub fn lossy_lines(bytes: Vec<u8>) -> (String, u64) {
    match String::from_utf8(bytes) {
        Ok(s) => (s, 0),
        Err(e) => {
            let bytes = e.into_bytes();
            let mut out = String::with_capacity(bytes.len() + 64);
            let mut bad = 0;
            for line in bytes.split_inclusive(|&b| b == b'\n') {
                match std::str::from_utf8(line) {
                    Ok(l) => out.push_str(l),
                    Err(_) => {
                        bad += 1;
                        out.push_str(&String::from_utf8_lossy(line));
                    }
                }
            }
            (out, bad)
        }
    }
}

/// `1 line`, `2 lines`.
fn plural(n: u64, what: &str) -> String {
    if n == 1 { format!("1 {what}") } else { format!("{n} {what}s") }
}

/// What a perf script yielded, as a sentence fragment for the user.
fn describe(s: &perfscript::PerfScriptStats) -> String {
    let mut parts = vec![format!(
        "{} samples ({} with call stacks, {} branch-only)",
        s.hybrid_samples + s.branch_only_samples,
        s.hybrid_samples,
        s.branch_only_samples
    )];
    if s.rejected_samples > 0 {
        parts.push(format!("{} samples rejected as malformed", s.rejected_samples));
    }
    if s.broken_branch_entries > 0 {
        parts.push(format!("{} branch entries unparsable", s.broken_branch_entries));
    }
    parts.push(format!("{} of {} MMAP lines matched a binary", s.mmap_matched, s.mmap_events));
    if s.mmap_unparsed > 0 {
        parts.push(format!("{} MMAP lines unparsable", s.mmap_unparsed));
    }
    parts.join(", ")
}

/// Writes the PGO dumps of every binary with counters ([`write_profile_dumps_cached`]), the
/// DWARF of binaries whose ELF bytes `image` gives read for their context-sensitive profile.
pub fn write_profile_dumps_from_images<'a>(
    profile: &HybridProfile,
    dir: &Path,
    image: &dyn Fn(&BinaryInfo) -> Option<&'a [u8]>,
) -> anyhow::Result<Vec<PathBuf>> {
    write_profile_dumps_cached(profile, dir, image, &mut FactsCache::default())
}

/// What the periodic dumps of a live run keep between writes: the DWARF symbolizer of each
/// binary's context-sensitive profile (by path and build-id: DWARF is read once, not at
/// every dump; the code facts come with the profile) and the symbolizer of `profile.pb.gz`.
#[derive(Default)]
pub struct FactsCache {
    /// `None`: a pseudo-probe binary, or DWARF that could not be read.
    syms: std::collections::HashMap<(String, String), Option<std::sync::Arc<DwarfSymbolizer>>>,
    /// Names and source lines of the pprof locations.
    pub symbols: crate::symbolize::Symbolizer,
}

impl FactsCache {
    /// The DWARF symbolizer for the context-sensitive profile of a binary with image `img`:
    /// `None` for pseudo-probe binaries (LLVM 22 crashes on their context-sensitive
    /// unsymbolized profile) and unreadable DWARF.
    fn symbolizer(&mut self, b: &BinaryInfo, img: &[u8]) -> Option<std::sync::Arc<DwarfSymbolizer>> {
        let key = (b.path.clone(), b.build_id_hex());
        self.syms
            .entry(key)
            .or_insert_with(|| {
                if etm_write::elf::has_pseudo_probes(img) {
                    return None;
                }
                match DwarfSymbolizer::from_elf(img) {
                    Ok(s) => {
                        if s.units_skipped() > 0 {
                            log::warn!(
                                "{}: {} DWARF units could not be parsed; their code has no context",
                                b.path,
                                s.units_skipped()
                            );
                        }
                        Some(std::sync::Arc::new(s))
                    }
                    Err(e) => {
                        log::warn!("{}: reading DWARF: {e}; its unsymbolized profile is context-free", b.path);
                        None
                    }
                }
            })
            .clone()
    }
}

/// Write, atomically, for every binary with counters: `<binary>.perfscript` (when the sample
/// store holds samples of it), `<binary>.unsym.txt` (context-sensitive for a DWARF binary with
/// hybrid samples whose image `image` gives, with its context-free form in
/// `<binary>.autofdo.unsym.txt`; context-free otherwise) and `<binary>.bolt.pa`; returns the
/// paths written.
pub fn write_profile_dumps_cached<'a>(
    profile: &HybridProfile,
    dir: &Path,
    image: &dyn Fn(&BinaryInfo) -> Option<&'a [u8]>,
    cache: &mut FactsCache,
) -> anyhow::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut written = Vec::new();
    let mut used_names: Vec<String> = Vec::new();
    for (b, info) in profile.binaries().iter().enumerate() {
        let stored = profile.samples().any(|s| s.touches(b));
        if profile.agg(b).is_empty() && !stored {
            continue;
        }
        let mut name = info.file_name().to_string();
        if used_names.contains(&name) {
            name = format!("{name}.{}", info.build_id_hex());
        }
        used_names.push(name.clone());
        let [ps, unsym, bolt] = pgo::dump_file_names(&name);
        if stored {
            let path = dir.join(&ps);
            write_atomic(&path, |w| pgo::write_perfscript(profile, b, w).map(drop))?;
            written.push(path);
        }
        let path = dir.join(&unsym);
        let sym = match image(info) {
            Some(img) if unwind::has_stack_samples(profile, b) => cache.symbolizer(info, img),
            _ => None,
        };
        match sym {
            Some(s) => {
                write_atomic(&path, |w| unwind::write_unsymbolized_cs(profile, b, &*s, w).map(drop))?;
                written.push(path);
                let path = dir.join(pgo::autofdo_file_name(&name));
                write_atomic(&path, |w| pgo::write_unsymbolized(profile, b, w).map(drop))?;
                written.push(path);
            }
            None => {
                write_atomic(&path, |w| pgo::write_unsymbolized(profile, b, w).map(drop))?;
                written.push(path);
            }
        }
        let path = dir.join(&bolt);
        write_atomic(&path, |w| pgo::write_bolt_pa(profile, b, w).map(drop))?;
        written.push(path);
    }
    Ok(written)
}

fn write_manifest(
    dir: &Path,
    files: &[PathBuf],
    profile: &HybridProfile,
    st: &perfscript::PerfScriptStats,
    non_utf8_lines: u64,
) -> anyhow::Result<()> {
    let names: Vec<String> = files.iter().filter_map(|f| f.file_name().map(|n| n.to_string_lossy().into_owned())).collect();
    let binaries: Vec<serde_json::Value> =
        profile.binaries().iter().map(|b| serde_json::json!({"path": b.path, "build_id": b.build_id_hex()})).collect();
    let v = serde_json::json!({
        "tool": "etm-bpf",
        "version": env!("CARGO_PKG_VERSION"),
        "command": "convert",
        "files": names,
        "binaries": binaries,
        "profile": crate::engine::profile_json(profile),
        "perfscript": {
            "hybrid_samples": st.hybrid_samples, "branch_only_samples": st.branch_only_samples,
            "rejected_samples": st.rejected_samples, "mmap_events": st.mmap_events,
            "mmap_matched": st.mmap_matched,
            "lines": st.lines, "non_utf8_lines": non_utf8_lines,
        },
    });
    write_atomic(&dir.join("manifest.json"), |w| {
        serde_json::to_writer_pretty(&mut *w, &v)?;
        w.write_all(b"\n")
    })?;
    Ok(())
}
