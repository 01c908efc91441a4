//! `etm-bpf decode`: decode a CoreSight ETMv4/ETE trace snapshot (OpenCSD snapshot format).
//!
//! `--packets` prints the packet stream in OpenCSD `trc_pkt_lister` line format, so the output
//! diffs against `trc_pkt_lister -ss_dir DIR -no_time_print` (after the header lines).
//! `--packets --stats` parses without printing and prints counters (the packet benchmark mode).
//! Element/branch output (`--format elements|branches`, `--stats` without `--packets`) is
//! produced by the element decoder.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context as _;
use etm_decode::listing::{ListOptions, list_buffer};
use etm_decode::snapshot::{DirFiles, Snapshot};

/// What to print for each decoded item.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Generic trace elements (`OCSD_GEN_TRC_ELEM_...` lines).
    Elements,
    /// Synthesized branch records (from -> to), newest first per window.
    Branches,
}

#[derive(clap::Args, Debug)]
#[command(after_help = "Examples:\n  \
    etm-bpf decode --snapshot ../shared/testdata/etm/juno_r1_1 --packets\n  \
    etm-bpf decode --snapshot DIR --packets --raw-bytes     # like trc_pkt_lister -pkt_mon\n  \
    etm-bpf decode --snapshot DIR --packets --stats         # parse only, print counts\n  \
    etm-bpf decode --snapshot perf-data/perf_kernel.snapshot --src-name AUX_CPU6 --packets")]
pub struct DecodeArgs {
    /// OpenCSD snapshot directory (snapshot.ini, trace.ini, device .ini files).
    #[arg(long, value_name = "DIR")]
    pub snapshot: PathBuf,
    /// Trace buffer to decode (trace.ini buffer `name=`); default: the first buffer.
    #[arg(long, value_name = "NAME")]
    pub src_name: Option<String>,
    /// Print the packet stream (trc_pkt_lister format) instead of elements.
    #[arg(long)]
    pub packets: bool,
    /// With --packets: also print each packet's raw bytes and every unsynchronised block.
    #[arg(long, requires = "packets")]
    pub raw_bytes: bool,
    /// Output format when decoding elements.
    #[arg(long, value_enum, default_value_t = Format::Elements)]
    pub format: Format,
    /// Decode fully without printing items; print counts (bytes, packets, errors, ...).
    #[arg(long)]
    pub stats: bool,
    /// Stop at the first corrupt packet or decode error (default: count, resync, continue).
    #[arg(long)]
    pub halt_on_error: bool,
    /// Element decoder: report source-address (ETE) ranges as N atoms (trc_pkt_lister -src_addr_n).
    #[arg(long)]
    pub src_addr_n: bool,
    /// Element decoder: an instruction range longer than N instructions is a decode error
    /// (NO_SYNC, resync), like OpenCSD's env OPENCSD_INSTR_RANGE_LIMIT=N. 0: no limit.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub range_limit: u32,
    /// Element decoder: an A64 opcode with the top 16 bits zero is a decode error
    /// (trc_pkt_lister -aa64_opcode_chk).
    #[arg(long)]
    pub aa64_opcode_chk: bool,
    /// Same check as --aa64-opcode-chk (OpenCSD's env OPENCSD_ERR_ON_AA64_BAD_OPCODE=1).
    #[arg(long)]
    pub err_bad_opcode: bool,
    /// Do not print the listing header.
    #[arg(long)]
    pub no_header: bool,
}

pub fn main(args: DecodeArgs) -> anyhow::Result<ExitCode> {
    let files = DirFiles::new(&args.snapshot);
    let snap = Snapshot::parse(&files).with_context(|| format!("reading snapshot {}", args.snapshot.display()))?;
    let buffer = match &args.src_name {
        Some(n) => snap.buffer(n).with_context(|| format!("no trace buffer named {n:?} in trace.ini"))?,
        None => snap.first_buffer().context("snapshot lists no trace buffer")?,
    }
    .clone();

    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::with_capacity(1 << 16, stdout.lock());
    if !args.no_header && !args.stats {
        writeln!(out, "etm-bpf decode: ETMv4/ETE trace decoder (etm-decode {})", env!("CARGO_PKG_VERSION"))?;
        writeln!(out, "-----------------------------------------------")?;
        writeln!(out)?;
        writeln!(out, "Command Line:-")?;
        let cmd: Vec<String> = std::env::args().collect();
        writeln!(out, "{}", cmd.join("  "))?;
        writeln!(out)?;
        writeln!(out, "Trace Packet Lister : reading snapshot from path {}", args.snapshot.display())?;
        writeln!(out, "Using {} as trace source", buffer.name)?;
    }

    if !args.packets {
        return decode_elements(&args, &snap, &files, &buffer, &mut out);
    }

    let opts = ListOptions { raw_bytes: args.raw_bytes, no_print: args.stats };
    let mut io_err: Option<std::io::Error> = None;
    let mut halted = false;
    let start = Instant::now();
    let summary = {
        let mut emit = |line: &str| {
            if halted || io_err.is_some() {
                return;
            }
            if args.halt_on_error && is_error_line(line) {
                halted = true;
            }
            if !args.stats
                && let Err(e) = out.write_all(line.as_bytes()).and_then(|()| out.write_all(b"\n"))
            {
                io_err = Some(e);
            }
        };
        list_buffer(&snap, &files, &buffer, opts, &mut emit).with_context(|| format!("listing buffer {}", buffer.name))?
    };
    let elapsed = start.elapsed();
    if let Some(e) = io_err {
        if e.kind() != std::io::ErrorKind::BrokenPipe {
            return Err(e).context("writing output");
        }
        return Ok(ExitCode::SUCCESS);
    }
    if args.stats {
        let p = summary.packets;
        let f = summary.frames;
        writeln!(out, "buffer           {}", buffer.name)?;
        writeln!(out, "bytes            {}", summary.bytes)?;
        writeln!(out, "frames           {}", f.frames)?;
        writeln!(out, "packets          {}", p.packets)?;
        writeln!(out, "packet errors    {}", p.errors)?;
        writeln!(out, "unsynced bytes   {}", p.unsynced_bytes)?;
        writeln!(out, "frame resets     {}", f.resets)?;
        writeln!(out, "discarded bytes  {}", f.discarded_bytes)?;
        let secs = elapsed.as_secs_f64().max(1e-9);
        writeln!(out, "time             {:.3} ms ({:.1} MB/s)", secs * 1e3, summary.bytes as f64 / secs / 1e6)?;
    }
    out.flush()?;
    if halted {
        eprintln!("etm-bpf: stopped at the first corrupt packet (--halt-on-error)");
        return Ok(ExitCode::FAILURE);
    }
    if args.stats && summary.packets.errors > 0 && args.halt_on_error {
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

/// Lines of corrupt packets in the listing (reserved headers are prefixed by the OpenCSD
/// error message; bad sequences and incomplete packets are named).
fn is_error_line(line: &str) -> bool {
    line.starts_with("PKTP_")
        || line.contains("\tI_BAD_SEQUENCE")
        || line.contains("\tI_INCOMPLETE_EOT")
        || line.contains("\tI_RESERVED")
}

/// The optional decoder checks selected by the command line.
fn decode_options(args: &DecodeArgs) -> etm_decode::decoder::DecodeOptions {
    etm_decode::decoder::DecodeOptions {
        range_limit: args.range_limit,
        aa64_opcode_chk: args.aa64_opcode_chk || args.err_bad_opcode,
    }
}

/// Element decoding: the element listing (default), branch records (`--format branches`) or
/// counts only (`--stats`), all from the full instruction-level decode.
fn decode_elements(
    args: &DecodeArgs,
    snap: &Snapshot,
    files: &DirFiles,
    buffer: &etm_decode::snapshot::TraceBuffer,
    out: &mut impl std::io::Write,
) -> anyhow::Result<ExitCode> {
    use etm_decode::branches::BranchBuilder;
    use etm_decode::elements::{Element, ElementKind, UnsyncReason};
    use etm_decode::pipeline::{BufferDecoder, snapshot_image};
    use std::ops::ControlFlow;

    use etm_decode::snapshot::SnapshotFiles as _;
    let data = files.read(&buffer.file).with_context(|| format!("reading trace buffer {}", buffer.file))?;
    let (image, missing) = snapshot_image(snap, files);
    for m in &missing {
        log::warn!("memory image file {m} not found: its addresses decode as ADDR_NACC");
    }
    let mut dec = BufferDecoder::for_snapshot(snap, buffer);
    dec.set_src_addr_n(args.src_addr_n);
    dec.set_options(decode_options(args));
    let mut builders: Vec<Option<BranchBuilder>> = (0..128).map(|_| None).collect();
    let mut line: Vec<u8> = Vec::with_capacity(256);
    let mut io_err: Option<std::io::Error> = None;
    let mut halted = false;
    let start = Instant::now();
    {
        let mut sink = |e: &Element| -> ControlFlow<()> {
            if args.halt_on_error && matches!(e.kind, ElementKind::NoSync(UnsyncReason::BadPacket | UnsyncReason::BadImage)) {
                halted = true;
                return ControlFlow::Break(());
            }
            let r = match args.format {
                Format::Elements => {
                    line.clear();
                    e.write_line(&mut line);
                    out.write_all(&line)
                }
                Format::Branches => {
                    let b = builders[(e.trace_id & 0x7F) as usize].get_or_insert_with(|| BranchBuilder::new(64));
                    match b.element(e) {
                        Some(rec) => {
                            writeln!(out, "Idx:{}; ID:{:x}; BRANCH 0x{:x} -> 0x{:x}", e.index, e.trace_id, rec.from, rec.to)
                        }
                        None => Ok(()),
                    }
                }
            };
            match r {
                Ok(()) => ControlFlow::Continue(()),
                Err(err) => {
                    io_err = Some(err);
                    ControlFlow::Break(())
                }
            }
        };
        if args.stats {
            // --stats: decode everything, look only for decode errors (for --halt-on-error)
            let mut count_only = CountOnly { halt_on_error: args.halt_on_error, halted: false };
            run_decoder(&mut dec, &data, &image, &mut count_only);
            halted |= count_only.halted;
        } else {
            run_decoder(&mut dec, &data, &image, &mut sink);
        }
    }
    let elapsed = start.elapsed();
    if let Some(e) = io_err {
        if e.kind() != std::io::ErrorKind::BrokenPipe {
            return Err(e).context("writing output");
        }
        return Ok(ExitCode::SUCCESS);
    }
    let s = dec.summary();
    if args.stats {
        writeln!(out, "buffer           {}", buffer.name)?;
        writeln!(out, "bytes            {}", s.bytes)?;
        writeln!(out, "packets          {}", s.decode.packets)?;
        writeln!(out, "packet errors    {}", s.packets.errors)?;
        writeln!(out, "elements         {}", s.decode.elements)?;
        writeln!(out, "ranges           {}", s.decode.ranges)?;
        writeln!(out, "instructions     {}", s.decode.instructions)?;
        writeln!(out, "addr not access. {}", s.decode.nacc)?;
        writeln!(out, "decode errors    {}", s.decode.errors())?;
        writeln!(out, "cache hits/miss  {}/{}", s.decode.cache_hits, s.decode.cache_misses)?;
        let secs = elapsed.as_secs_f64().max(1e-9);
        writeln!(out, "time             {:.3} ms ({:.1} MB/s)", secs * 1e3, s.bytes as f64 / secs / 1e6)?;
    }
    out.flush()?;
    if halted {
        eprintln!("etm-bpf: stopped at the first corrupt packet or decode error (--halt-on-error)");
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

/// Feeds the whole buffer to the decoders, then flushes them at end of trace.
fn run_decoder<S: etm_decode::decoder::ElementSink>(
    dec: &mut etm_decode::pipeline::BufferDecoder,
    data: &[u8],
    image: &etm_decode::image::MemoryImage,
    sink: &mut S,
) {
    for chunk in data.chunks(64 * 1024) {
        if dec.push(chunk, image, sink).is_break() {
            return;
        }
    }
    let _ = dec.finish(image, sink);
}

/// `--stats` sink: elements are only counted (by the decoder); with `--halt-on-error` it
/// stops at the first decode error.
struct CountOnly {
    halt_on_error: bool,
    halted: bool,
}

impl etm_decode::decoder::ElementSink for CountOnly {
    fn element(&mut self, e: &etm_decode::elements::Element) -> std::ops::ControlFlow<()> {
        use etm_decode::elements::{ElementKind, UnsyncReason};
        if self.halt_on_error && matches!(e.kind, ElementKind::NoSync(UnsyncReason::BadPacket | UnsyncReason::BadImage)) {
            self.halted = true;
            return std::ops::ControlFlow::Break(());
        }
        std::ops::ControlFlow::Continue(())
    }

    /// Ranges are counted by the decoder and are never decode errors.
    fn ranges(&mut self, _trace_id: u8, _rs: &[etm_decode::elements::Range]) -> std::ops::ControlFlow<()> {
        std::ops::ControlFlow::Continue(())
    }

    /// (likewise, without the decoder buffering them)
    fn takes_packet_ranges(&self) -> bool {
        true
    }

    fn packet_ranges(
        &mut self,
        _trace_id: u8,
        _index: u64,
        _rs: &[etm_decode::elements::InstrRange],
    ) -> std::ops::ControlFlow<()> {
        std::ops::ControlFlow::Continue(())
    }

    fn elements(&mut self, es: &[etm_decode::elements::Element]) -> std::ops::ControlFlow<()> {
        if self.halt_on_error {
            for e in es {
                self.element(e)?;
            }
        }
        std::ops::ControlFlow::Continue(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: DecodeArgs,
    }

    fn opts(extra: &[&str]) -> etm_decode::decoder::DecodeOptions {
        let mut v = vec!["t", "--snapshot", "x"];
        v.extend_from_slice(extra);
        decode_options(&Cli::try_parse_from(v).unwrap().args)
    }

    /// The option flags map onto the decoder options (default: all checks off, as OpenCSD).
    #[test]
    fn option_flags() {
        assert_eq!(opts(&[]), etm_decode::decoder::DecodeOptions::default());
        assert_eq!(opts(&["--range-limit", "100"]).range_limit, 100);
        assert!(!opts(&["--range-limit", "100"]).aa64_opcode_chk);
        assert!(opts(&["--aa64-opcode-chk"]).aa64_opcode_chk);
        assert!(opts(&["--err-bad-opcode"]).aa64_opcode_chk);
    }
}
