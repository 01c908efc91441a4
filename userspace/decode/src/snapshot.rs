//! OpenCSD snapshot reader ("ARM Trace and Debug Snapshot file format 0v2", with the
//! extensions described in OpenCSD `decoder/docs/test_progs.md`).
//!
//! A snapshot directory holds `snapshot.ini` (device list + trace metadata file), one `.ini`
//! per device (cores with `[dumpN]` memory regions, trace sources with `[regs]`), and
//! `trace.ini` (trace buffers, source -> buffer and core -> source maps).
//!
//! The parser is I/O-free: it asks a [`SnapshotFiles`] implementation for file contents by
//! name. [`DirFiles`] is the thin loader that reads a directory.
//!
//! # Usage
//!
//! ```no_run
//! use etm_decode::snapshot::{DirFiles, Snapshot, SnapshotFiles};
//! let files = DirFiles::new("testdata/etm/juno_r1_1");
//! let snap = Snapshot::parse(&files)?;
//! for src in snap.trace_sources() {
//!     // per trace ID: protocol, ETMv4/ETE register config, core profile and memory regions
//!     let cfg = &src.config;
//!     println!("{} id={:#x} {:?} v{}.{}", src.name, cfg.trace_id(), cfg.protocol,
//!              cfg.major_version(), cfg.minor_version());
//!     if let Some(core) = &src.core {
//!         for dump in &core.dumps {
//!             let bytes = snap.read_dump(&files, dump)?; // Vec<u8> of exactly the region
//!             println!("  {:#x}+{:#x} {:?}", dump.address, bytes.len(), dump.space);
//!         }
//!     }
//! }
//! let buf = snap.first_buffer().unwrap();
//! let trace: Vec<u8> = files.read(&buf.file)?;
//! # Ok::<(), etm_decode::snapshot::SnapshotError>(())
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Errors from reading a snapshot.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// A file named by the snapshot could not be read.
    #[error("cannot read snapshot file {name}: {source}")]
    Io {
        /// File name relative to the snapshot directory.
        name: String,
        /// Underlying I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A required section or key is missing.
    #[error("{file}: missing {what}")]
    Missing {
        /// File in which it is missing.
        file: String,
        /// What is missing.
        what: String,
    },
    /// A value could not be parsed as a number.
    #[error("{file}: bad number {value:?} for {key}")]
    BadNumber {
        /// File containing the value.
        file: String,
        /// Key.
        key: String,
        /// The text that failed to parse.
        value: String,
    },
}

/// Source of snapshot file contents, by name relative to the snapshot directory.
pub trait SnapshotFiles {
    /// Returns the whole content of file `name`.
    fn read(&self, name: &str) -> Result<Vec<u8>, SnapshotError>;
}

/// [`SnapshotFiles`] reading from a directory on disk.
#[derive(Debug, Clone)]
pub struct DirFiles {
    dir: PathBuf,
}

impl DirFiles {
    /// Loader for the snapshot directory `dir`.
    pub fn new(dir: impl AsRef<Path>) -> Self {
        DirFiles { dir: dir.as_ref().to_path_buf() }
    }
    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl SnapshotFiles for DirFiles {
    fn read(&self, name: &str) -> Result<Vec<u8>, SnapshotError> {
        std::fs::read(self.dir.join(name)).map_err(|source| SnapshotError::Io { name: name.to_string(), source })
    }
}

/// In-memory [`SnapshotFiles`] (tests, fuzzing).
impl SnapshotFiles for BTreeMap<String, Vec<u8>> {
    fn read(&self, name: &str) -> Result<Vec<u8>, SnapshotError> {
        self.get(name).cloned().ok_or_else(|| SnapshotError::Io {
            name: name.to_string(),
            source: std::io::Error::from(std::io::ErrorKind::NotFound),
        })
    }
}

/// One parsed INI file: sections in file order, each with keys in file order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ini {
    /// `(section name, [(key, value)])`, names as written (case kept).
    pub sections: Vec<(String, Vec<(String, String)>)>,
}

impl Ini {
    /// Parses INI text: `[section]`, `key=value`, `;`/`#` comments, CRLF tolerated.
    /// Keys before any section go to a section named "".
    pub fn parse(text: &str) -> Ini {
        let mut ini = Ini::default();
        for raw in text.lines() {
            let line = raw.trim();
            if line.is_empty() || line.starts_with(';') || line.starts_with('#') {
                continue;
            }
            if let Some(rest) = line.strip_prefix('[') {
                let name = rest.split(']').next().unwrap_or("").trim();
                ini.sections.push((name.to_string(), Vec::new()));
                continue;
            }
            if let Some((k, v)) = line.split_once('=') {
                if ini.sections.is_empty() {
                    ini.sections.push((String::new(), Vec::new()));
                }
                let v = v.split(&[';', '#'][..]).next().unwrap_or("").trim();
                if let Some(last) = ini.sections.last_mut() {
                    last.1.push((k.trim().to_string(), v.to_string()));
                }
            }
        }
        ini
    }

    /// Keys of the first section named `name` (case-insensitive).
    pub fn section(&self, name: &str) -> Option<&[(String, String)]> {
        self.sections.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, kv)| kv.as_slice())
    }

    /// Value of `key` in section `sect` (both case-insensitive).
    pub fn get(&self, sect: &str, key: &str) -> Option<&str> {
        self.section(sect)?.iter().find(|(k, _)| k.eq_ignore_ascii_case(key)).map(|(_, v)| v.as_str())
    }
}

fn lookup<'a>(kv: &'a [(String, String)], key: &str) -> Option<&'a str> {
    kv.iter().find(|(k, _)| k.eq_ignore_ascii_case(key)).map(|(_, v)| v.as_str())
}

/// Parses `0x..` hex or decimal.
pub fn parse_num(s: &str) -> Option<u64> {
    let s = s.trim();
    if let Some(h) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        u64::from_str_radix(h, 16).ok()
    } else {
        s.parse().ok()
    }
}

/// Device class from `[device] class=`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceClass {
    /// A processor core (`class=core`).
    Core,
    /// A trace source (`class=trace_source`): ETM, ETE, STM, ...
    TraceSource,
    /// Anything else, as written.
    Other(String),
}

/// One register line of `[regs]`: `NAME`, `NAME(0x004)`, `NAME(id:0x4)`, `NAME(id:0x100,size:64)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Register {
    /// Register name, upper case (e.g. `TRCIDR0`).
    pub name: String,
    /// Register id/offset if given.
    pub id: Option<u32>,
    /// Size in bits if given.
    pub size: Option<u32>,
    /// Value.
    pub value: u64,
}

/// A memory dump region of a core device (`[dump...]` section).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemDump {
    /// File name relative to the snapshot directory.
    pub file: String,
    /// Load address of the first byte.
    pub address: u64,
    /// Length in bytes; `None` means "to the end of the file".
    pub length: Option<u64>,
    /// Offset into the file.
    pub offset: u64,
    /// Memory space qualifier (`EL2`, `N`, `ROOT`, ...), if given.
    pub space: Option<String>,
}

/// A device `.ini` file.
#[derive(Debug, Clone)]
pub struct Device {
    /// File name it was read from.
    pub file: String,
    /// `[device] name=`.
    pub name: String,
    /// `[device] class=`.
    pub class: DeviceClass,
    /// `[device] type=` (e.g. `ETM4`, `ETE`, `Cortex-A53`, `ARM-AA64`).
    pub dev_type: String,
    /// `[regs]` in file order.
    pub regs: Vec<Register>,
    /// `[dump*]` regions in file order.
    pub dumps: Vec<MemDump>,
}

impl Device {
    /// Value of register `name` (case-insensitive), if present.
    pub fn reg(&self, name: &str) -> Option<u64> {
        self.regs.iter().find(|r| r.name.eq_ignore_ascii_case(name)).map(|r| r.value)
    }
}

/// Format of a trace buffer file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BufferFormat {
    /// 16-byte CoreSight formatter frames (ETB/ETF/ETR), several trace IDs.
    Coresight,
    /// Unformatted single-source byte stream (TRBE, or a source captured alone).
    SourceData,
    /// DSTREAM capture of TPIU frames.
    DstreamCoresight,
    /// Anything else, as written.
    Other(String),
}

/// A trace buffer from `trace.ini`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceBuffer {
    /// Buffer name (`name=`), e.g. `ETB_0`.
    pub name: String,
    /// File name relative to the snapshot directory.
    pub file: String,
    /// Format.
    pub format: BufferFormat,
}

/// Trace protocol of a source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// ETMv4 instruction trace (IHI 0064).
    Etmv4,
    /// Embedded Trace Extension (DDI 0608).
    Ete,
    /// STM or other unsupported source.
    Other,
}

/// Architecture profile of the core a source traces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CoreProfile {
    /// A-profile (Cortex-A, `ARM-AA64`, unknown names default here).
    A,
    /// R-profile.
    R,
    /// M-profile (Cortex-M).
    M,
}

/// ETMv4/ETE register configuration of one trace source: what the packet parser and the
/// element decoder need. Registers absent from the snapshot read as 0 (OpenCSD uses the same
/// defaults for TRCIDR9-13), except TRCDEVARCH which defaults to ETE 1.0 (`0x47705A13`) for ETE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EtmConfig {
    /// Protocol (from the device `type`).
    pub protocol: Protocol,
    /// Core profile of the traced core.
    pub core_profile: CoreProfile,
    /// TRCCONFIGR.
    pub configr: u32,
    /// TRCTRACEIDR.
    pub traceidr: u32,
    /// TRCIDR0..TRCIDR13 (index = register number).
    pub idr: [u32; 14],
    /// TRCAUTHSTATUS.
    pub authstatus: u32,
    /// TRCDEVARCH (ETE).
    pub devarch: u32,
}

impl EtmConfig {
    /// Builds a configuration from a trace-source device.
    pub fn from_device(dev: &Device, core_profile: CoreProfile) -> EtmConfig {
        let r = |n: &str| dev.reg(n).unwrap_or(0) as u32;
        let mut idr = [0u32; 14];
        for (i, v) in idr.iter_mut().enumerate() {
            *v = r(&format!("TRCIDR{i}"));
        }
        let protocol = protocol_of_type(&dev.dev_type);
        let devarch = match (dev.reg("TRCDEVARCH"), protocol) {
            (Some(v), _) => v as u32,
            (None, Protocol::Ete) => 0x4770_5A13,
            (None, _) => 0,
        };
        EtmConfig {
            protocol,
            core_profile,
            configr: r("TRCCONFIGR"),
            traceidr: r("TRCTRACEIDR"),
            idr,
            authstatus: r("TRCAUTHSTATUS"),
            devarch,
        }
    }

    /// A default ETMv4.0/ETE-like config for raw streams without a snapshot (tests, fuzzing):
    /// 64-bit addresses, 32-bit context ID, 8-bit VMID, all optional features present.
    pub fn generic(protocol: Protocol, trace_id: u8) -> EtmConfig {
        let mut idr = [0u32; 14];
        // TRCIDR0: IS0 traced, retstack, cycle counting, Q (both), TSSIZE=64, commitopt0
        idr[0] = 0x0801_8EA1 | (0x3 << 15);
        idr[1] = if protocol == Protocol::Ete { 0x4100_FFF0 } else { 0x4100_F443 };
        idr[2] = 0x2000_0488 | (1 << 10); // IASIZE 64, CIDSIZE 32, VMIDSIZE 8, CCSIZE 12
        idr[8] = 0;
        EtmConfig {
            protocol,
            core_profile: CoreProfile::A,
            configr: 0x1 | (1 << 4) | (1 << 6) | (1 << 7) | (1 << 11) | (1 << 12),
            traceidr: trace_id as u32,
            idr,
            authstatus: 0,
            devarch: if protocol == Protocol::Ete { 0x4773_5A13 } else { 0 },
        }
    }

    /// Trace ID (TRCTRACEIDR[6:0]).
    pub fn trace_id(&self) -> u8 {
        (self.traceidr & 0x7F) as u8
    }
    /// Major architecture version: 4 for ETMv4 (TRCIDR1[11:8]), 5 for ETE.
    pub fn major_version(&self) -> u8 {
        match self.protocol {
            Protocol::Ete => 5,
            _ => ((self.idr[1] >> 8) & 0xF) as u8,
        }
    }
    /// Minor version: TRCIDR1[7:4] for ETMv4, TRCDEVARCH[19:16] for ETE.
    pub fn minor_version(&self) -> u8 {
        match self.protocol {
            Protocol::Ete => ((self.devarch >> 16) & 0xF) as u8,
            _ => ((self.idr[1] >> 4) & 0xF) as u8,
        }
    }
    /// `major << 4 | minor` (0x42 = ETMv4.2, 0x53 = ETE 1.3).
    pub fn full_version(&self) -> u8 {
        (self.major_version() << 4) | (self.minor_version() & 0xF)
    }
    /// Is this ETE (protocol version 5.x)?
    pub fn is_ete(&self) -> bool {
        self.protocol == Protocol::Ete
    }
    /// Instruction address size: 64 if TRCIDR2.IASIZE == 8, else 32.
    pub fn ia_size(&self) -> u32 {
        if self.idr[2] & 0x1F == 8 { 64 } else { 32 }
    }
    /// Context ID size in bits (TRCIDR2.CIDSIZE: 4 -> 32, else 0).
    pub fn cid_size(&self) -> u32 {
        if (self.idr[2] >> 5) & 0x1F == 4 { 32 } else { 0 }
    }
    /// VMID size in bits (TRCIDR2.VMIDSIZE: 1 -> 8, 2 -> 16, 4 -> 32 from v4.1).
    pub fn vmid_size(&self) -> u32 {
        match (self.idr[2] >> 10) & 0x1F {
            1 => 8,
            2 if self.minor_version() > 0 || self.is_ete() => 16,
            4 if self.minor_version() > 0 || self.is_ete() => 32,
            _ => 0,
        }
    }
    /// Cycle-count field size in bits (TRCIDR2.CCSIZE + 12).
    pub fn cc_size(&self) -> u32 {
        ((self.idr[2] >> 25) & 0xF) + 12
    }
    /// Timestamp size in bits (TRCIDR0.TSSIZE: 6 -> 48, 8 -> 64, else 0).
    pub fn ts_size(&self) -> u32 {
        match (self.idr[0] >> 24) & 0x1F {
            6 => 48,
            8 => 64,
            _ => 0,
        }
    }
    /// Return stack implemented (TRCIDR0.RETSTACK).
    pub fn has_ret_stack(&self) -> bool {
        self.idr[0] & (1 << 9) != 0
    }
    /// Cycle counting in instruction trace implemented (TRCIDR0.TRCCCI).
    pub fn has_cycle_count(&self) -> bool {
        self.idr[0] & (1 << 7) != 0
    }
    /// Commit packets are omitted (TRCIDR0.COMMOPT and cycle counting).
    pub fn commit_opt1(&self) -> bool {
        self.idr[0] & (1 << 29) != 0 && self.has_cycle_count()
    }
    /// Transaction start is a P0 element (TRCIDR0.COMMTRANS == 0).
    pub fn comm_trans_p0(&self) -> bool {
        self.idr[0] & (1 << 30) == 0
    }
    /// Q element support (TRCIDR0.QSUPP != 0).
    pub fn has_q_elem(&self) -> bool {
        (self.idr[0] >> 15) & 0x3 != 0
    }
    /// Conditional instruction tracing implemented (TRCIDR0.TRCCOND).
    pub fn has_cond_trace(&self) -> bool {
        self.idr[0] & (1 << 6) != 0
    }
    /// Data trace implemented (TRCIDR0.TRCDATA != 0).
    pub fn has_data_trace(&self) -> bool {
        (self.idr[0] >> 3) & 0x3 != 0
    }
    /// TS marker packets implemented (ETE >= 1.1 and TRCIDR0.TSMARK).
    pub fn has_ts_marker(&self) -> bool {
        self.full_version() >= 0x51 && self.idr[0] & (1 << 23) != 0
    }
    /// WFI/WFE are P0 waypoints (TRCIDR2.WFXMODE, v4.3+).
    pub fn wfi_wfe_branch(&self) -> bool {
        self.idr[2] & (1 << 31) != 0 && self.full_version() >= 0x43
    }
    /// Maximum speculation depth (TRCIDR8).
    pub fn max_spec_depth(&self) -> u32 {
        self.idr[8]
    }
    /// TRCCONFIGR.BB: branch broadcast.
    pub fn branch_broadcast(&self) -> bool {
        self.configr & (1 << 3) != 0
    }
    /// TRCCONFIGR.CCI: cycle counting enabled.
    pub fn cycle_count_enabled(&self) -> bool {
        self.configr & (1 << 4) != 0
    }
    /// TRCCONFIGR.CID: context ID tracing enabled.
    pub fn cid_enabled(&self) -> bool {
        self.configr & (1 << 6) != 0
    }
    /// TRCCONFIGR.VMID: VMID tracing enabled.
    pub fn vmid_enabled(&self) -> bool {
        self.configr & (1 << 7) != 0
    }
    /// TRCCONFIGR.TS: timestamps enabled.
    pub fn ts_enabled(&self) -> bool {
        self.configr & (1 << 11) != 0
    }
    /// TRCCONFIGR.RS: return stack enabled.
    pub fn ret_stack_enabled(&self) -> bool {
        self.configr & (1 << 12) != 0
    }
    /// TRCCONFIGR.QE: Q elements enabled (0 none, 1 with instruction counts, 3 all).
    pub fn q_elem_mode(&self) -> u32 {
        (self.configr >> 13) & 0x3
    }
    /// TRCCONFIGR.VMIDOPT: VMID field holds CONTEXTIDR_EL2.
    pub fn vmid_opt(&self) -> bool {
        self.configr & (1 << 15) != 0
    }
    /// TRCCONFIGR.COND != 0 (conditional instruction trace enabled).
    pub fn cond_trace_enabled(&self) -> bool {
        (self.configr >> 8) & 0x7 != 0
    }
    /// TRCCONFIGR data trace enabled (DA or DV, bits 16/17).
    pub fn data_trace_enabled(&self) -> bool {
        (self.configr >> 16) & 0x3 != 0
    }
}

fn protocol_of_type(t: &str) -> Protocol {
    let u = t.to_ascii_uppercase();
    if u.starts_with("ETE") {
        Protocol::Ete
    } else if u.starts_with("ETM4") || u.starts_with("ETMV4") {
        Protocol::Etmv4
    } else {
        Protocol::Other
    }
}

/// Profile implied by a core `type=` name (OpenCSD core-name table: `Cortex-M*` -> M,
/// `Cortex-R*` -> R, everything else A).
pub fn core_profile_of_type(t: &str) -> CoreProfile {
    let u = t.to_ascii_uppercase();
    if u.starts_with("CORTEX-M") || u.starts_with("ARMV8-M") || u.starts_with("ARMV8.1-M") {
        CoreProfile::M
    } else if u.starts_with("CORTEX-R") {
        CoreProfile::R
    } else {
        CoreProfile::A
    }
}

/// The core a trace source is attached to.
#[derive(Debug, Clone)]
pub struct CoreInfo {
    /// Core device name (e.g. `cpu_0`).
    pub name: String,
    /// Core type (e.g. `Cortex-A53`, `ARM-AA64`).
    pub core_type: String,
    /// Architecture profile.
    pub profile: CoreProfile,
    /// Memory regions dumped for this core.
    pub dumps: Vec<MemDump>,
}

/// A trace source with everything needed to decode it.
#[derive(Debug, Clone)]
pub struct TraceSource {
    /// Source device name (e.g. `ETM_0`).
    pub name: String,
    /// Register configuration (protocol, trace ID, IDRs).
    pub config: EtmConfig,
    /// Core it traces, if the snapshot maps one.
    pub core: Option<CoreInfo>,
    /// Name of the buffer its trace goes to, if mapped.
    pub buffer: Option<String>,
}

/// A parsed snapshot.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// `[snapshot] description=`.
    pub description: Option<String>,
    /// All devices in `[device_list]` order.
    pub devices: Vec<Device>,
    /// Trace buffers named in `buffers=`, in the order of their sections in the file
    /// (OpenCSD's order; missing sections are reported as errors).
    pub buffers: Vec<TraceBuffer>,
    /// `[source_buffers]`: (source name, buffer name).
    pub source_buffers: Vec<(String, String)>,
    /// `[core_trace_sources]`: (core name, source name).
    pub core_trace_sources: Vec<(String, String)>,
}

fn text(files: &dyn SnapshotFiles, name: &str) -> Result<String, SnapshotError> {
    let b = files.read(name)?;
    Ok(String::from_utf8_lossy(&b).into_owned())
}

fn parse_reg_key(key: &str) -> (String, Option<u32>, Option<u32>) {
    let (name, rest) = match key.split_once('(') {
        Some((n, r)) => (n.trim(), Some(r.trim_end_matches(')'))),
        None => (key.trim(), None),
    };
    let mut id = None;
    let mut size = None;
    if let Some(rest) = rest {
        for part in rest.split(',') {
            let part = part.trim();
            if let Some(v) = part.strip_prefix("id:") {
                id = parse_num(v).map(|x| x as u32);
            } else if let Some(v) = part.strip_prefix("size:") {
                size = parse_num(v).map(|x| x as u32);
            } else if let Some(v) = parse_num(part) {
                id = Some(v as u32);
            }
        }
    }
    (name.to_ascii_uppercase(), id, size)
}

impl Device {
    /// Parses a device `.ini` (`file` is its name, for messages).
    pub fn parse(file: &str, ini_text: &str) -> Result<Device, SnapshotError> {
        let ini = Ini::parse(ini_text);
        let missing = |what: &str| SnapshotError::Missing { file: file.into(), what: what.into() };
        let name = ini.get("device", "name").ok_or_else(|| missing("[device] name"))?.to_string();
        let class = match ini.get("device", "class").unwrap_or("") {
            c if c.eq_ignore_ascii_case("core") => DeviceClass::Core,
            c if c.eq_ignore_ascii_case("trace_source") => DeviceClass::TraceSource,
            c => DeviceClass::Other(c.to_string()),
        };
        let dev_type = ini.get("device", "type").unwrap_or("").to_string();
        let mut regs = Vec::new();
        let mut dumps = Vec::new();
        for (sect, kv) in &ini.sections {
            let lsect = sect.to_ascii_lowercase();
            if lsect == "regs" {
                for (k, v) in kv {
                    let (rname, id, size) = parse_reg_key(k);
                    let value = parse_num(v).ok_or_else(|| SnapshotError::BadNumber {
                        file: file.into(),
                        key: k.clone(),
                        value: v.clone(),
                    })?;
                    regs.push(Register { name: rname, id, size, value });
                }
            } else if lsect.starts_with("dump") {
                let num = |key: &str| -> Result<Option<u64>, SnapshotError> {
                    match lookup(kv, key) {
                        None => Ok(None),
                        Some(v) => parse_num(v).map(Some).ok_or_else(|| SnapshotError::BadNumber {
                            file: file.into(),
                            key: format!("[{sect}] {key}"),
                            value: v.into(),
                        }),
                    }
                };
                let dfile = lookup(kv, "file").ok_or_else(|| missing(&format!("[{sect}] file")))?;
                let address = num("address")?.ok_or_else(|| missing(&format!("[{sect}] address")))?;
                dumps.push(MemDump {
                    file: dfile.to_string(),
                    address,
                    length: num("length")?,
                    offset: num("offset")?.unwrap_or(0),
                    space: lookup(kv, "space").map(str::to_string),
                });
            }
        }
        Ok(Device { file: file.into(), name, class, dev_type, regs, dumps })
    }
}

impl Snapshot {
    /// Reads `snapshot.ini`, every device file it lists and the trace metadata file.
    pub fn parse(files: &dyn SnapshotFiles) -> Result<Snapshot, SnapshotError> {
        let snap_ini = Ini::parse(&text(files, "snapshot.ini")?);
        let description = snap_ini.get("snapshot", "description").map(str::to_string);
        let mut devices = Vec::new();
        if let Some(list) = snap_ini.section("device_list") {
            for (_, f) in list {
                devices.push(Device::parse(f, &text(files, f)?)?);
            }
        }
        let meta = snap_ini.get("trace", "metadata").unwrap_or("trace.ini").to_string();
        let tini = Ini::parse(&text(files, &meta)?);
        let mut buffers = Vec::new();
        if let Some(list) = tini.get("trace_buffers", "buffers") {
            let listed: Vec<&str> = list.split(',').map(str::trim).filter(|s| !s.is_empty()).collect();
            // OpenCSD keeps buffers in the order their sections appear in the file (not the
            // order of `buffers=`): e.g. ete-ite-instr lists buffer1,buffer2 but its
            // [buffer2] section comes first, and trc_pkt_lister decodes ETB_2 by default.
            let mut ordered: Vec<&str> = tini
                .sections
                .iter()
                .map(|(n, _)| n.as_str())
                .filter(|n| listed.iter().any(|l| l.eq_ignore_ascii_case(n)))
                .collect();
            ordered.dedup();
            for l in &listed {
                if !ordered.iter().any(|o| o.eq_ignore_ascii_case(l)) {
                    ordered.push(l);
                }
            }
            for sect in ordered {
                let missing = |w: &str| SnapshotError::Missing { file: meta.clone(), what: format!("[{sect}] {w}") };
                let kv = tini.section(sect).ok_or_else(|| missing("section"))?;
                let format = match lookup(kv, "format").unwrap_or("") {
                    f if f.eq_ignore_ascii_case("coresight") => BufferFormat::Coresight,
                    f if f.eq_ignore_ascii_case("source_data") => BufferFormat::SourceData,
                    f if f.eq_ignore_ascii_case("dstream_coresight") => BufferFormat::DstreamCoresight,
                    f => BufferFormat::Other(f.to_string()),
                };
                buffers.push(TraceBuffer {
                    name: lookup(kv, "name").ok_or_else(|| missing("name"))?.to_string(),
                    file: lookup(kv, "file").ok_or_else(|| missing("file"))?.to_string(),
                    format,
                });
            }
        }
        let pairs = |s: &str| -> Vec<(String, String)> { tini.section(s).map(|kv| kv.to_vec()).unwrap_or_default() };
        Ok(Snapshot {
            description,
            devices,
            buffers,
            source_buffers: pairs("source_buffers"),
            core_trace_sources: pairs("core_trace_sources"),
        })
    }

    /// Device by name.
    pub fn device(&self, name: &str) -> Option<&Device> {
        self.devices.iter().find(|d| d.name == name)
    }

    /// Buffer by name.
    pub fn buffer(&self, name: &str) -> Option<&TraceBuffer> {
        self.buffers.iter().find(|b| b.name == name)
    }

    /// The first buffer (what `trc_pkt_lister` decodes by default).
    pub fn first_buffer(&self) -> Option<&TraceBuffer> {
        self.buffers.first()
    }

    /// Every ETMv4/ETE trace source (STM and others are skipped), in device-list order,
    /// with its config, core (profile + memory regions) and buffer.
    pub fn trace_sources(&self) -> Vec<TraceSource> {
        let mut out = Vec::new();
        for dev in &self.devices {
            if dev.class != DeviceClass::TraceSource || protocol_of_type(&dev.dev_type) == Protocol::Other {
                continue;
            }
            let core = self.core_trace_sources.iter().find(|(_, s)| *s == dev.name).and_then(|(c, _)| self.device(c)).map(|c| {
                CoreInfo {
                    name: c.name.clone(),
                    core_type: c.dev_type.clone(),
                    profile: core_profile_of_type(&c.dev_type),
                    dumps: c.dumps.clone(),
                }
            });
            let profile = core.as_ref().map(|c| c.profile).unwrap_or(CoreProfile::A);
            out.push(TraceSource {
                name: dev.name.clone(),
                config: EtmConfig::from_device(dev, profile),
                core,
                buffer: self.source_buffers.iter().find(|(s, _)| *s == dev.name).map(|(_, b)| b.clone()),
            });
        }
        out
    }

    /// Trace sources writing to buffer `buffer` (ordered by trace ID, like `trc_pkt_lister`).
    pub fn sources_for_buffer(&self, buffer: &str) -> Vec<TraceSource> {
        let mut v: Vec<_> = self.trace_sources().into_iter().filter(|s| s.buffer.as_deref() == Some(buffer)).collect();
        v.sort_by_key(|s| s.config.trace_id());
        v
    }

    /// Reads the bytes of one memory region (`length` defaults to the rest of the file after
    /// `offset`; a region extending past the end of the file is truncated).
    pub fn read_dump(&self, files: &dyn SnapshotFiles, dump: &MemDump) -> Result<Vec<u8>, SnapshotError> {
        let mut data = files.read(&dump.file)?;
        let start = (dump.offset as usize).min(data.len());
        let end = match dump.length {
            Some(l) => start.saturating_add(l as usize).min(data.len()),
            None => data.len(),
        };
        // the file's bytes themselves, not a copy (most dumps are whole files)
        data.truncate(end);
        data.drain(..start);
        Ok(data)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(list: &[(&str, &str)]) -> BTreeMap<String, Vec<u8>> {
        list.iter().map(|(k, v)| (k.to_string(), v.as_bytes().to_vec())).collect()
    }

    /// All three register key spellings and 64-bit registers parse to name/id/size/value.
    #[test]
    fn register_key_forms() {
        let d = Device::parse(
            "d.ini",
            "[device]\nname=ETM_0\nclass=trace_source\ntype=ETM4\n[regs]\nTRCCONFIGR(0x004)=0x000000C1\r\n\
             TRCIDR0(id:0x78)=0x28000EA1\nTRCIDR2=0x488 ; comment\nTRCACVR0(id:0x100,size:64)=0xFFFF000000000001\n",
        )
        .unwrap();
        assert_eq!(d.reg("trcconfigr"), Some(0xC1));
        assert_eq!(d.regs[0].id, Some(4));
        assert_eq!(d.regs[1].id, Some(0x78));
        assert_eq!(d.reg("TRCIDR2"), Some(0x488));
        assert_eq!(d.regs[3].size, Some(64));
        assert_eq!(d.reg("TRCACVR0"), Some(0xFFFF_0000_0000_0001));
    }

    /// Buffers come in section order, not `buffers=` order (OpenCSD's default-buffer choice).
    #[test]
    fn buffer_section_order() {
        let f = files(&[
            ("snapshot.ini", "[device_list]\n[trace]\nmetadata=trace.ini\n"),
            (
                "trace.ini",
                "[trace_buffers]\nbuffers=buffer1,buffer2\n[buffer2]\nname=B2\nfile=b2\nformat=source_data\n[buffer1]\nname=B1\nfile=b1\nformat=source_data\n",
            ),
        ]);
        let s = Snapshot::parse(&f).unwrap();
        assert_eq!(s.first_buffer().unwrap().name, "B2");
        assert_eq!(s.buffers.len(), 2);
    }

    /// A minimal snapshot links source -> core dumps and source -> buffer, and derives sizes from IDRs.
    #[test]
    fn snapshot_links_sources() {
        let f = files(&[
            (
                "snapshot.ini",
                "[snapshot]\nversion=1.0\n[device_list]\ndevice0=cpu.ini\ndevice1=etm.ini\n[trace]\nmetadata=trace.ini\n",
            ),
            (
                "cpu.ini",
                "[device]\nname=cpu_0\nclass=core\ntype=Cortex-M55\n[dump1]\nfile=m.bin\naddress=0x1000\noffset=0x2\nlength=0x2\nspace=EL2\n",
            ),
            (
                "etm.ini",
                "[device]\nname=ETM_0\nclass=trace_source\ntype=ETM4\n[regs]\nTRCTRACEIDR=0x10\nTRCIDR0=0x28000EA1\nTRCIDR1=0x4100F403\nTRCIDR2=0x00000488\nTRCCONFIGR=0xC1\n",
            ),
            (
                "trace.ini",
                "[trace_buffers]\nbuffers=buffer0\n[buffer0]\nname=ETB_0\nfile=t.bin\nformat=coresight\n[source_buffers]\nETM_0=ETB_0\n[core_trace_sources]\ncpu_0=ETM_0\n",
            ),
            ("m.bin", "abcdef"),
        ]);
        let s = Snapshot::parse(&f).unwrap();
        let src = &s.trace_sources()[0];
        assert_eq!(src.config.trace_id(), 0x10);
        assert_eq!(src.config.protocol, Protocol::Etmv4);
        assert_eq!(src.config.full_version(), 0x40);
        assert_eq!(src.config.cid_size(), 32);
        assert_eq!(src.config.vmid_size(), 8);
        assert_eq!(src.config.ia_size(), 64);
        assert_eq!(src.config.core_profile, CoreProfile::M);
        assert_eq!(src.buffer.as_deref(), Some("ETB_0"));
        let core = src.core.as_ref().unwrap();
        assert_eq!(core.dumps[0].space.as_deref(), Some("EL2"));
        assert_eq!(s.read_dump(&f, &core.dumps[0]).unwrap(), b"cd");
        assert_eq!(s.first_buffer().unwrap().format, BufferFormat::Coresight);
    }
}
