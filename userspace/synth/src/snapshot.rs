//! Write generated trace as an OpenCSD snapshot directory (the format `trc_pkt_lister -ss_dir`
//! reads; OpenCSD `decoder/docs/specs/ARM Trace and Debug Snapshot file format`), so an
//! independent decoder can check the generator.
//!
//! ```text
//! snapshot.ini   [snapshot] version, [device_list] cpu_0.ini + ETE_0.ini, [trace] trace.ini
//! cpu_0.ini      core ARM-AA64 with one [dumpN] per executable segment (code_N.bin)
//! ETE_0.ini      trace_source ETE with TRCCONFIGR, TRCTRACEIDR, TRCDEVARCH, TRCIDR0/1/2/8
//! trace.ini      one buffer, format=source_data (raw ETE, no frame formatter)
//! trace.bin      the windows' bytes concatenated
//! ```

use std::fmt::Write as _;
use std::path::Path;

use crate::SynthError;
use crate::generate::{Synthesis, regs};
use crate::image::CodeImage;

/// Write the snapshot for `syn` into `dir` (created). Returns the byte offset of each window in
/// `trace.bin`.
pub fn write_snapshot(dir: &Path, image: &CodeImage, syn: &Synthesis) -> Result<Vec<u64>, SynthError> {
    let io = |p: &Path| {
        let p = p.to_path_buf();
        move |source| SynthError::Io { path: p, source }
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let w = |name: &str, text: &[u8]| -> Result<(), SynthError> {
        let p = dir.join(name);
        std::fs::write(&p, text).map_err(io(&p))
    };
    w(
        "snapshot.ini",
        b"[snapshot]\nversion=1.0\ndescription=etm-bpf synthetic ETE session\n\n\
          [device_list]\ndevice0=cpu_0.ini\ndevice1=ETE_0.ini\n\n[trace]\nmetadata=trace.ini\n",
    )?;
    let mut cpu = String::from(
        "[device]\nname=cpu_0\nclass=core\ntype=ARM-AA64\n\n[regs]\nPC(size:64)=0\nSP(size:64)=0\nSCTLR_EL1=0\nCPSR=0\n",
    );
    for (k, seg) in image.segments.iter().enumerate() {
        let name = format!("code_{k}.bin");
        w(&name, &seg.data)?;
        let _ = write!(cpu, "\n[dump{}]\nfile={name}\naddress=0x{:x}\nlength=0x{:x}\n", k + 1, seg.vaddr, seg.data.len());
    }
    w("cpu_0.ini", cpu.as_bytes())?;
    let ete = format!(
        "[device]\nname=ETE_0\nclass=trace_source\ntype=ETE\n\n[regs]\nTRCCONFIGR=0x{:x}\nTRCTRACEIDR=0x{:x}\n\
         TRCDEVARCH=0x{:x}\nTRCIDR0=0x{:x}\nTRCIDR1=0x{:x}\nTRCIDR2=0x{:x}\nTRCIDR8=0x{:x}\n",
        syn.config.trcconfigr(),
        regs::TRACE_ID,
        regs::TRCDEVARCH,
        regs::TRCIDR0,
        regs::TRCIDR1,
        regs::TRCIDR2,
        regs::TRCIDR8
    );
    w("ETE_0.ini", ete.as_bytes())?;
    w(
        "trace.ini",
        b"[trace_buffers]\nbuffers=buffer0\n\n[buffer0]\nname=TRBE_0\nfile=trace.bin\nformat=source_data\n\n\
          [source_buffers]\nETE_0=TRBE_0\n\n[core_trace_sources]\ncpu_0=ETE_0\n",
    )?;
    let mut all = Vec::new();
    let mut offsets = Vec::with_capacity(syn.windows.len());
    for win in &syn.windows {
        offsets.push(all.len() as u64);
        all.extend_from_slice(&win.bytes);
    }
    w("trace.bin", &all)?;
    Ok(offsets)
}
