//! What the running kernel and this process allow, read from a proc tree and a sysfs tree
//! (the live `/proc` and `/sys`, or captured trees: fixtures, a `run --record` directory).
//!
//! | fact | where | why it matters |
//! |---|---|---|
//! | kernel release | `proc/sys/kernel/osrelease` | aux_action (6.13), CoreSight pause (6.16) |
//! | `perf_event_max_sample_rate` | `proc/sys/kernel/` | `max_samples_per_tick = DIV_ROUND_UP(rate, HZ)`: above it a group is throttled (`__perf_event_account_interrupt`) |
//! | `perf_cpu_time_max_percent` | `proc/sys/kernel/` | `perf_sample_event_took` lowers the rate when handlers take longer |
//! | `perf_event_paranoid`, `perf_event_mlock_kb` | `proc/sys/kernel/` | who may open CPU-wide events; AUX/data ring memory per user beyond RLIMIT_MEMLOCK |
//! | page size | `proc/self/smaps` (`KernelPageSize`) | ring sizes are in pages |
//! | `CONFIG_PID_IN_CONTEXTIDR` | `proc/config.gz`, `boot/config-<release>` | CONTEXTIDR holds the thread id only with it (`contextidr_thread_switch`) |
//! | initial PID namespace | `proc/self/status` `NSpid:` (one level) | `etm4_parse_event_config` traces context IDs only for a task in the initial PID namespace |
//! | capabilities | `proc/self/status` `CapEff:` | CAP_PERFMON (38), CAP_BPF (39), CAP_SYS_ADMIN (21) |
//! | CPU frequency | `devices/system/cpu/cpuN/cpufreq/cpuinfo_max_freq` (kHz) | cycles per second: interrupt rates of cycle-period events |
//! | BRBE | `bus/event_source/devices/<armv8 pmu>/caps/branches` | shown only when BRBE records exist (`caps_is_visible`) |

use std::io::Read as _;
use std::path::Path;

use crate::discovery::{EVENT_SOURCE, KernelVersion};

/// `CAP_SYS_ADMIN`.
pub const CAP_SYS_ADMIN: u32 = 21;
/// `CAP_PERFMON`.
pub const CAP_PERFMON: u32 = 38;
/// `CAP_BPF`.
pub const CAP_BPF: u32 = 39;

/// The facts (see the module docs); `None` where the tree does not tell.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HostFacts {
    pub release: Option<String>,
    pub kernel: Option<KernelVersion>,
    pub max_sample_rate: Option<u64>,
    pub cpu_time_max_percent: Option<u64>,
    pub paranoid: Option<i32>,
    pub mlock_kb: Option<u64>,
    pub page_size: Option<u64>,
    pub pid_in_contextidr: Option<bool>,
    pub init_pid_ns: Option<bool>,
    pub cap_eff: Option<u64>,
    /// Highest `cpuinfo_max_freq` of any CPU, Hz.
    pub cpu_max_hz: Option<u64>,
    /// BRBE records per PMU that has them: (pmu, records).
    pub brbe: Vec<(String, u32)>,
}

fn read(path: &Path) -> Option<String> {
    std::fs::read_to_string(path).ok().map(|s| s.trim().to_string())
}

impl HostFacts {
    /// Reads the facts from `proc_root` (normally `/proc`) and `sysfs_root` (normally `/sys`).
    pub fn read(proc_root: &Path, sysfs_root: &Path) -> HostFacts {
        let k = proc_root.join("sys/kernel");
        let release = read(&k.join("osrelease"));
        let kernel = release.as_deref().and_then(KernelVersion::parse);
        let num = |name: &str| read(&k.join(name)).and_then(|s| s.parse::<i64>().ok());
        let status = read(&proc_root.join("self/status")).unwrap_or_default();
        let field = |key: &str| status.lines().find_map(|l| l.strip_prefix(key)).map(|v| v.trim().to_string());
        let page_size = read(&proc_root.join("self/smaps")).and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("KernelPageSize:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
                .map(|kb| kb * 1024)
        });
        let config = kernel_config(proc_root, release.as_deref());
        let pid_in_contextidr = config.map(|c| c.lines().any(|l| l.trim() == "CONFIG_PID_IN_CONTEXTIDR=y"));
        let cpu_max_hz = (0..4096)
            .map_while(|c| {
                let d = sysfs_root.join(format!("devices/system/cpu/cpu{c}"));
                d.exists().then(|| read(&d.join("cpufreq/cpuinfo_max_freq")).and_then(|s| s.parse::<u64>().ok()))
            })
            .flatten()
            .max()
            .map(|khz| khz * 1000);
        let mut brbe = Vec::new();
        if let Ok(rd) = std::fs::read_dir(sysfs_root.join(EVENT_SOURCE)) {
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if (name.starts_with("armv8_") || name.starts_with("armv9_"))
                    && let Some(n) = read(&e.path().join("caps/branches")).and_then(|s| s.parse::<u32>().ok())
                    && n > 0
                {
                    brbe.push((name, n));
                }
            }
        }
        brbe.sort();
        HostFacts {
            release,
            kernel,
            max_sample_rate: num("perf_event_max_sample_rate").map(|v| v.max(0) as u64),
            cpu_time_max_percent: num("perf_cpu_time_max_percent").map(|v| v.max(0) as u64),
            paranoid: num("perf_event_paranoid").map(|v| v as i32),
            mlock_kb: num("perf_event_mlock_kb").map(|v| v.max(0) as u64),
            page_size,
            pid_in_contextidr,
            init_pid_ns: field("NSpid:").map(|v| v.split_whitespace().count() == 1),
            cap_eff: field("CapEff:").and_then(|v| u64::from_str_radix(&v, 16).ok()),
            cpu_max_hz,
            brbe,
        }
    }

    /// Whether capability `cap` is effective.
    pub fn has_cap(&self, cap: u32) -> Option<bool> {
        self.cap_eff.map(|c| c & (1 << cap) != 0)
    }

    /// Context IDs reach the trace as thread ids: the kernel writes them into CONTEXTIDR and
    /// will trace them for us. `None`: unknown.
    pub fn context_ids_usable(&self) -> Option<bool> {
        match (self.pid_in_contextidr, self.init_pid_ns) {
            (Some(false), _) | (_, Some(false)) => Some(false),
            (Some(true), Some(true)) => Some(true),
            _ => None,
        }
    }
}

/// The kernel configuration text: `proc/config.gz` (gzip) or `boot/config-<release>` beside
/// the proc tree (`/proc/../boot` is `/boot`).
fn kernel_config(proc_root: &Path, release: Option<&str>) -> Option<String> {
    if let Ok(gz) = std::fs::read(proc_root.join("config.gz")) {
        let mut s = String::new();
        if flate2::read::GzDecoder::new(&gz[..]).read_to_string(&mut s).is_ok() {
            return Some(s);
        }
    }
    let boot = proc_root.parent().unwrap_or(Path::new("/")).join("boot");
    std::fs::read_to_string(boot.join(format!("config-{}", release?))).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discovery::tests::fixture;

    /// The facts of the N1 fixture: every file the module docs list, read.
    #[test]
    fn reads_a_fixture_tree() {
        let f = HostFacts::read(&fixture("n1-etr/proc"), &fixture("n1-etr"));
        assert_eq!(f.kernel, Some(KernelVersion::new(6, 16, 0)));
        assert_eq!((f.max_sample_rate, f.paranoid, f.mlock_kb, f.page_size), (Some(100_000), Some(2), Some(516), Some(4096)));
        assert_eq!((f.pid_in_contextidr, f.init_pid_ns, f.cpu_max_hz), (Some(true), Some(true), Some(3_000_000_000)));
        assert_eq!((f.has_cap(CAP_PERFMON), f.has_cap(CAP_BPF)), (Some(true), Some(true)));
        assert_eq!(f.context_ids_usable(), Some(true));
        assert!(f.brbe.is_empty());
    }

    /// A nested PID namespace (two NSpid levels) or a kernel without PID_IN_CONTEXTIDR: no
    /// context IDs; a gzip'd proc/config.gz is read.
    #[test]
    fn context_ids_off() {
        let dir = crate::discovery::tests::fixture_copy("n1-etr", "host");
        std::fs::write(dir.join("proc/self/status"), "NSpid:\t4242\t17\n").unwrap();
        assert_eq!(HostFacts::read(&dir.join("proc"), &dir).context_ids_usable(), Some(false));
        std::fs::write(dir.join("proc/self/status"), "NSpid:\t4242\n").unwrap();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut gz, b"# CONFIG_PID_IN_CONTEXTIDR is not set\n").unwrap();
        std::fs::write(dir.join("proc/config.gz"), gz.finish().unwrap()).unwrap();
        let f = HostFacts::read(&dir.join("proc"), &dir);
        assert_eq!((f.pid_in_contextidr, f.context_ids_usable()), (Some(false), Some(false)));
        let _ = std::fs::remove_dir_all(dir);
    }
}
