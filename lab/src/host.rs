//! The host side of the lab: the pinned kernel package, the initramfs, the boot, and the
//! results read back from the console.

use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use sha2::Digest;

use crate::proto::{MARK, b64_decode, fnv1a};

/// A Debian package file, pinned by its pool path and SHA-256 (from the suite's `Packages`).
#[derive(Debug, Clone, Copy)]
pub struct Deb {
    pub path: &'static str,
    pub sha256: &'static str,
}

/// A kernel to boot: Debian's packages of one version.
#[derive(Debug, Clone, Copy)]
pub struct KernelPin {
    /// Debian architecture.
    pub arch: &'static str,
    /// Package version.
    pub version: &'static str,
    /// `uname -r` of the kernel.
    pub release: &'static str,
    /// `linux-binary-*` (the image) and `linux-base-*` (its config).
    pub debs: &'static [Deb],
}

/// Debian sid's arm64 kernel 7.2.13 (packages of 2026-10-28; `linux-binary` holds `vmlinuz`,
/// `linux-base` the config).
pub const ARM64_KERNEL: KernelPin = KernelPin {
    arch: "arm64",
    version: "7.2.13-1",
    release: "7.2.13+deb14-arm64",
    debs: &[
        Deb {
            path: "pool/main/l/linux-signed-arm64/linux-binary-7.2.13+deb14-arm64_7.2.13-1_arm64.deb",
            sha256: "9043487c40a7b1c9ef421bbe3f578bf30f1004abd19f259e769f4ff8a26bb40b",
        },
        Deb {
            path: "pool/main/l/linux/linux-base-7.2.13+deb14-arm64_7.2.13-1_arm64.deb",
            sha256: "60e3b0f2a150562f1cf0f15830924cdd7ed8931bdc1a8c826c39c6dd4d33e056",
        },
    ],
};

/// Where pinned packages are fetched from: the archive, then the snapshot archive, which keeps
/// every version after the suite has moved on.
pub const MIRRORS: &[&str] = &["https://deb.debian.org/debian", "https://snapshot.debian.org/archive/debian/20261201T000000Z"];

/// A fetched kernel.
#[derive(Debug, Clone)]
pub struct Kernel {
    pub pin: KernelPin,
    pub image: PathBuf,
    pub config: PathBuf,
}

fn sha256_file(p: &Path) -> anyhow::Result<String> {
    let data = std::fs::read(p).with_context(|| format!("read {}", p.display()))?;
    Ok(format!("{:x}", sha2::Sha256::digest(&data)))
}

/// Fetches (or finds in `cache`) the pinned packages, checks their hashes and unpacks them.
pub fn fetch_kernel(pin: KernelPin, cache: &Path) -> anyhow::Result<Kernel> {
    std::fs::create_dir_all(cache).with_context(|| format!("create {}", cache.display()))?;
    let root = cache.join(format!("root-{}-{}", pin.arch, pin.version));
    for deb in pin.debs {
        let name = deb.path.rsplit('/').next().expect("a file name");
        let file = cache.join(name);
        let cached = file.exists() && sha256_file(&file)? == deb.sha256;
        if !cached {
            let tmp = cache.join(format!("{name}.part"));
            let mut last = String::new();
            let mut got = false;
            for m in MIRRORS {
                let url = format!("{m}/{}", deb.path);
                let st =
                    Command::new("curl").args(["-fsSL", "--retry", "3", "--max-time", "300", "-o"]).arg(&tmp).arg(&url).status();
                match st {
                    Ok(s) if s.success() => {
                        let h = sha256_file(&tmp)?;
                        if h == deb.sha256 {
                            std::fs::rename(&tmp, &file)?;
                            got = true;
                            break;
                        }
                        last = format!("{url}: sha256 {h}, pinned {}", deb.sha256);
                    }
                    Ok(s) => last = format!("{url}: curl {s}"),
                    Err(e) => last = format!("curl: {e}"),
                }
            }
            if !got {
                bail!("cannot fetch {name} ({last})");
            }
        }
        let stamp = root.join(format!(".{name}"));
        if !stamp.exists() {
            std::fs::create_dir_all(&root)?;
            let st = Command::new("dpkg-deb").arg("-x").arg(&file).arg(&root).status().context("dpkg-deb")?;
            if !st.success() {
                bail!("dpkg-deb -x {} failed", file.display());
            }
            std::fs::write(&stamp, b"")?;
        }
    }
    let dir = root.join("usr/lib/modules").join(pin.release);
    let (image, config) = (dir.join("vmlinuz"), dir.join("config"));
    for f in [&image, &config] {
        if !f.exists() {
            bail!("{} not in the unpacked packages", f.display());
        }
    }
    Ok(Kernel { pin, image, config })
}

/// A `newc` cpio archive (what the kernel unpacks as initramfs, `init/initramfs.c`).
#[derive(Default)]
pub struct Initramfs {
    out: Vec<u8>,
    ino: u32,
    dirs: std::collections::HashSet<String>,
}

impl Initramfs {
    fn entry(&mut self, name: &str, mode: u32, data: &[u8]) {
        self.ino += 1;
        let name = name.trim_start_matches('/');
        let fields = [self.ino, mode, 0, 0, 1, 0, data.len() as u32, 0, 0, 0, 0, name.len() as u32 + 1, 0];
        self.out.extend_from_slice(b"070701");
        for f in fields {
            self.out.extend_from_slice(format!("{f:08x}").as_bytes());
        }
        self.out.extend_from_slice(name.as_bytes());
        self.out.push(0);
        while !self.out.len().is_multiple_of(4) {
            self.out.push(0);
        }
        self.out.extend_from_slice(data);
        while !self.out.len().is_multiple_of(4) {
            self.out.push(0);
        }
    }

    /// A directory and its parents.
    pub fn dir(&mut self, path: &str) {
        let path = path.trim_matches('/');
        if path.is_empty() || self.dirs.contains(path) {
            return;
        }
        if let Some((parent, _)) = path.rsplit_once('/') {
            self.dir(parent);
        }
        self.dirs.insert(path.to_string());
        self.entry(path, 0o040755, &[]);
    }

    fn parent(&mut self, path: &str) {
        if let Some((parent, _)) = path.trim_matches('/').rsplit_once('/') {
            self.dir(parent);
        }
    }

    /// A file with `data`.
    pub fn file(&mut self, path: &str, data: &[u8], executable: bool) {
        self.parent(path);
        self.entry(path, if executable { 0o100755 } else { 0o100644 }, data);
    }

    /// A symbolic link.
    pub fn symlink(&mut self, path: &str, target: &str) {
        self.parent(path);
        self.entry(path, 0o120777, target.as_bytes());
    }

    /// Copies a host file.
    pub fn copy(&mut self, path: &str, src: &Path) -> anyhow::Result<()> {
        let data = std::fs::read(src).with_context(|| format!("read {}", src.display()))?;
        let exec = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(src)?.permissions()) & 0o111 != 0;
        self.file(path, &data, exec);
        Ok(())
    }

    /// Copies a host tree (files, directories, symbolic links as links).
    pub fn copy_tree(&mut self, path: &str, src: &Path) -> anyhow::Result<()> {
        self.dir(path);
        for e in std::fs::read_dir(src).with_context(|| format!("read {}", src.display()))? {
            let e = e?;
            let (s, d) = (e.path(), format!("{}/{}", path.trim_end_matches('/'), e.file_name().to_string_lossy()));
            let ft = e.file_type()?;
            if ft.is_symlink() {
                self.symlink(&d, &std::fs::read_link(&s)?.to_string_lossy());
            } else if ft.is_dir() {
                self.copy_tree(&d, &s)?;
            } else {
                self.copy(&d, &s)?;
            }
        }
        Ok(())
    }

    /// The archive, gzip-compressed.
    pub fn finish(mut self) -> Vec<u8> {
        self.entry("TRAILER!!!", 0, &[]);
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&self.out).expect("in-memory gzip");
        gz.finish().expect("in-memory gzip")
    }
}

/// What the guest said when it booted.
#[derive(Debug, Clone, Default)]
pub struct BootInfo {
    pub release: String,
    pub machine: String,
    pub cpus: u32,
    pub pmus: Vec<String>,
    pub btf: bool,
}

/// One step's outcome.
#[derive(Debug, Clone, Default)]
pub struct StepResult {
    /// Exit code, `signalN`, `timeout` or `error ...`.
    pub rc: String,
    /// Guest seconds.
    pub secs: f64,
    /// Files sent back (path -> bytes); `<step>.stdout` and `.stderr` as `stdout`, `stderr`.
    pub files: BTreeMap<String, Vec<u8>>,
    /// Files the guest could not read.
    pub missing: Vec<String>,
    /// The pid of a background step.
    pub pid: Option<u32>,
}

impl StepResult {
    /// A returned file as text.
    pub fn text(&self, name: &str) -> String {
        self.files.get(name).map(|b| String::from_utf8_lossy(b).into_owned()).unwrap_or_default()
    }
}

/// Everything the console carried.
#[derive(Debug, Clone, Default)]
pub struct Results {
    pub boot: Option<BootInfo>,
    pub steps: BTreeMap<String, StepResult>,
    /// The guest reached the end of its steps.
    pub done: bool,
    /// Files whose length or hash did not match.
    pub corrupt: Vec<String>,
    /// The whole console, for the log.
    pub console: String,
    /// Wall time of the boot and run.
    pub wall: Duration,
}

impl Results {
    /// Parses console output (see `proto`).
    pub fn parse(console: &str) -> Results {
        let mut r = Results { console: console.to_string(), ..Default::default() };
        let mut cur: Option<(String, String, usize, String, String)> = None;
        for line in console.lines() {
            let line = line.trim_end_matches('\r');
            let Some(rest) = line.find(MARK).map(|i| &line[i + MARK.len()..]) else { continue };
            let rest = rest.trim_start();
            let (verb, args) = rest.split_once(' ').unwrap_or((rest, ""));
            match verb {
                "boot" => {
                    let kv: BTreeMap<&str, &str> = args.split(' ').filter_map(|t| t.split_once('=')).collect();
                    r.boot = Some(BootInfo {
                        release: kv.get("release").unwrap_or(&"").to_string(),
                        machine: kv.get("machine").unwrap_or(&"").to_string(),
                        cpus: kv.get("cpus").and_then(|c| c.parse().ok()).unwrap_or(0),
                        pmus: kv.get("pmus").map(|p| p.split(',').map(String::from).collect()).unwrap_or_default(),
                        btf: kv.get("btf") == Some(&"true"),
                    });
                }
                "rc" => {
                    let mut it = args.split(' ');
                    let name = it.next().unwrap_or("").to_string();
                    let rc = it.next().unwrap_or("").to_string();
                    let e = r.steps.entry(name).or_default();
                    if rc == "error" {
                        e.rc = args.split_once(' ').map_or(String::new(), |(_, x)| x.to_string());
                    } else {
                        e.rc = rc;
                        e.secs = it.next().and_then(|s| s.parse().ok()).unwrap_or(0.0);
                    }
                }
                "spawned" => {
                    let mut it = args.split(' ');
                    let name = it.next().unwrap_or("").to_string();
                    r.steps.entry(name).or_default().pid = it.next().and_then(|p| p.parse().ok());
                }
                "file" => {
                    let f: Vec<&str> = args.split(' ').collect();
                    if f.len() == 4 {
                        cur = Some((f[0].into(), f[1].into(), f[2].parse().unwrap_or(usize::MAX), f[3].into(), String::new()));
                    }
                }
                "d" => {
                    if let Some(c) = cur.as_mut() {
                        c.4.push_str(args.trim());
                    }
                }
                "end" => {
                    if let Some((step, path, len, hash, b64)) = cur.take() {
                        let data = b64_decode(&b64).unwrap_or_default();
                        if data.len() != len || format!("{:016x}", fnv1a(&data)) != hash {
                            r.corrupt.push(format!("{step}: {path}"));
                            continue;
                        }
                        let key = match path.rsplit_once('.') {
                            Some((base, ext)) if base == format!("/tmp/lab/{step}") => ext.to_string(),
                            _ => path,
                        };
                        r.steps.entry(step).or_default().files.insert(key, data);
                    }
                }
                "missing" => {
                    let mut it = args.splitn(3, ' ');
                    let (step, path) = (it.next().unwrap_or(""), it.next().unwrap_or(""));
                    r.steps.entry(step.to_string()).or_default().missing.push(path.to_string());
                }
                "done" => r.done = true,
                _ => {}
            }
        }
        r
    }
}

/// How to run the machine.
#[derive(Debug, Clone)]
pub struct MachineConfig {
    /// `qemu-system-aarch64` / `qemu-system-x86_64`.
    pub qemu: String,
    /// Machine and CPU arguments (`-M virt -cpu max`).
    pub machine: Vec<String>,
    pub smp: u32,
    pub mem_mb: u32,
    /// Serial console device for the kernel command line.
    pub console: String,
    /// `-icount shift=0`: one instruction per ns of guest time, so the emulated cycle counter
    /// counts instructions (deterministic sampling), at the cost of one host thread.
    pub icount: bool,
    /// Wall-clock limit.
    pub timeout: Duration,
}

impl MachineConfig {
    /// The arm64 `virt` machine with the `max` CPU (its emulated PMUv3).
    pub fn arm64() -> Self {
        MachineConfig {
            qemu: "qemu-system-aarch64".into(),
            machine: ["-M", "virt", "-cpu", "max"].map(String::from).to_vec(),
            smp: 2,
            mem_mb: 2048,
            console: "ttyAMA0".into(),
            icount: true,
            timeout: Duration::from_secs(900),
        }
    }
}

/// Whether the emulator starts here at all (`--version`).
pub fn emulator_available(qemu: &str) -> Result<String, String> {
    match Command::new(qemu).arg("--version").output() {
        Ok(o) if o.status.success() => Ok(String::from_utf8_lossy(&o.stdout).lines().next().unwrap_or("").to_string()),
        Ok(o) => Err(format!("{qemu} --version failed: {}", String::from_utf8_lossy(&o.stderr))),
        Err(e) => Err(format!("{qemu} not runnable ({e}); install qemu-system-arm (scripts/setup.sh)")),
    }
}

/// Boots `kernel` with `initrd` and collects the console until the guest powers off (or the
/// timeout). `log` gets every console line as it arrives.
pub fn boot(cfg: &MachineConfig, kernel: &Path, initrd: &Path, log: &Path) -> anyhow::Result<Results> {
    let mut cmd = Command::new(&cfg.qemu);
    cmd.args(&cfg.machine)
        .args(["-smp", &cfg.smp.to_string(), "-m", &cfg.mem_mb.to_string(), "-nographic", "-nic", "none", "-no-reboot"])
        .arg("-kernel")
        .arg(kernel)
        .arg("-initrd")
        .arg(initrd)
        .args(["-append", &format!("console={} rdinit=/init panic=-1 quiet loglevel=1", cfg.console)]);
    if cfg.icount {
        cmd.args(["-icount", "shift=0,align=off,sleep=off"]);
    }
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let started = Instant::now();
    let mut child = cmd.spawn().with_context(|| format!("start {}", cfg.qemu))?;
    let stdout = child.stdout.take().expect("piped");
    let stderr = child.stderr.take().expect("piped");
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let tx2 = tx.clone();
    std::thread::spawn(move || {
        for l in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    std::thread::spawn(move || {
        for l in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx2.send(format!("[qemu stderr] {l}")).is_err() {
                break;
            }
        }
    });
    let mut logf = std::fs::File::create(log).with_context(|| format!("create {}", log.display()))?;
    let mut console = String::new();
    let mut timed_out = false;
    loop {
        match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(l) => {
                let _ = writeln!(logf, "{l}");
                console.push_str(&l);
                console.push('\n');
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
        }
        if started.elapsed() > cfg.timeout {
            timed_out = true;
            let _ = child.kill();
            break;
        }
    }
    let _ = child.wait();
    let mut r = Results::parse(&console);
    r.wall = started.elapsed();
    if timed_out {
        bail!("the guest did not power off within {:?} (console in {})", cfg.timeout, log.display());
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::b64_encode;

    /// Console lines with kernel noise between them parse into steps and verified files; a
    /// file whose bytes do not match its hash is reported corrupt, not returned.
    #[test]
    fn parses_console() {
        let data = b"hello\nworld\n";
        let enc = b64_encode(data);
        let (a, b) = enc.split_at(5);
        let text = format!(
            "[    1.0] noise\n@@LAB boot release=7.2 machine=aarch64 cpus=2 pmus=software,armv8_pmuv3 btf=true\n\
             @@LAB rc doctor 0 0.30\n@@LAB file doctor /tmp/lab/doctor.stdout {} {:016x}\n@@LAB d {a}\n[ 2.0] x\n@@LAB d {b}\n@@LAB end\n\
             @@LAB file doctor /tmp/out/x 3 0000000000000000\n@@LAB d AAAA\n@@LAB end\n@@LAB spawned w 42\n@@LAB done\n",
            data.len(),
            fnv1a(data)
        );
        let r = Results::parse(&text);
        let boot = r.boot.unwrap();
        assert_eq!((boot.release.as_str(), boot.cpus, boot.btf), ("7.2", 2, true));
        assert_eq!(boot.pmus, ["software", "armv8_pmuv3"]);
        let d = &r.steps["doctor"];
        assert_eq!((d.rc.as_str(), d.secs), ("0", 0.30));
        assert_eq!(d.files["stdout"], data);
        assert_eq!(r.corrupt, ["doctor: /tmp/out/x"]);
        assert_eq!(r.steps["w"].pid, Some(42));
        assert!(r.done);
    }

    /// The archive is what `cpio -t` lists (the Debian tool as the independent reader).
    #[test]
    fn initramfs_lists_with_cpio() {
        let mut i = Initramfs::default();
        i.file("/lab/bin/x", b"#!/bin/sh\n", true);
        i.symlink("/lab/link", "bin/x");
        i.dir("/tmp");
        let gz = i.finish();
        let mut raw = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&gz[..]), &mut raw).unwrap();
        let out = Command::new("cpio").args(["-t", "--quiet"]).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn();
        let Ok(mut c) = out else { panic!("cpio not installed (scripts/setup.sh installs it)") };
        c.stdin.take().unwrap().write_all(&raw).unwrap();
        let o = c.wait_with_output().unwrap();
        let names: Vec<String> = String::from_utf8(o.stdout).unwrap().lines().map(String::from).collect();
        assert_eq!(names, ["lab", "lab/bin", "lab/bin/x", "lab/link", "tmp"]);
    }
}
