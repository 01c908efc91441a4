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
//! | BRBE | `bus/event_source/devices/<armv8 pmu>/caps/branches` | shown only when BRBE records exist (`caps_is_visible`); `brbe_num_branch_records`: 8, 16, 32 or 64 |
//! | LBR | `bus/event_source/devices/{cpu,cpu_core,cpu_atom}/caps/branches` | `x86_pmu.lbr_nr`, shown only when non-zero (`lbr_is_visible`, amd `amd_branches_is_visible`); `caps/pmu_name` names the generation |
//! | LBR kind | `proc/cpuinfo` flags `arch_lbr`, `amd_lbr_v2` | Arch LBR (depth from CPUID 0x1C, `intel_pmu_arch_lbr_init`: `fls(lbr_depth_mask) * 8`), AMD LBRv2 (`amd_pmu_lbr_init`); else legacy Intel LBR (depth by model: Core 2 4, Atom 8, Nehalem-Broadwell 16, Skylake+ and Goldmont 32) |

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
    /// x86 LBR records per core PMU that has them: (pmu, records, `caps/pmu_name`).
    pub lbr: Vec<(String, u32, Option<String>)>,
    /// `proc/cpuinfo` says `arch_lbr`.
    pub arch_lbr: bool,
    /// `proc/cpuinfo` says `amd_lbr_v2`.
    pub amd_lbr_v2: bool,
}

/// The branch-record unit a host has, as the kernel drivers set it up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BranchUnit {
    /// Arm BRBE with this many records.
    Brbe(u32),
    /// Intel Arch LBR.
    ArchLbr(u32),
    /// AMD LBRv2 (Zen 4+).
    AmdLbrV2(u32),
    /// Model-specific Intel LBR (its format is in IA32_PERF_CAPABILITIES, not in sysfs).
    LegacyLbr(u32),
}

impl BranchUnit {
    /// Records per sample the hardware gives.
    pub fn depth(&self) -> u32 {
        match *self {
            BranchUnit::Brbe(n) | BranchUnit::ArchLbr(n) | BranchUnit::AmdLbrV2(n) | BranchUnit::LegacyLbr(n) => n,
        }
    }

    /// One line for `doctor`.
    pub fn describe(&self) -> String {
        match *self {
            BranchUnit::Brbe(n) => format!("Arm BRBE, {n} records (BRBIDR0_EL1.NUMREC)"),
            BranchUnit::ArchLbr(n) => format!("Intel Arch LBR, depth {n} (CPUID 0x1C)"),
            BranchUnit::AmdLbrV2(n) => format!("AMD LBRv2, {n} records (wrong-path entries dropped)"),
            BranchUnit::LegacyLbr(n) => format!("Intel LBR (model-specific format), {n} records"),
        }
    }
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
        let mut lbr = Vec::new();
        for name in ["cpu", "cpu_core", "cpu_atom"] {
            let caps = sysfs_root.join(EVENT_SOURCE).join(name).join("caps");
            if let Some(n) = read(&caps.join("branches")).and_then(|s| s.parse::<u32>().ok())
                && n > 0
            {
                lbr.push((name.to_string(), n, read(&caps.join("pmu_name"))));
            }
        }
        let cpuinfo = read(&proc_root.join("cpuinfo")).unwrap_or_default();
        let flags: Vec<&str> = cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("flags").and_then(|r| r.trim_start().strip_prefix(':')))
            .map(|f| f.split_whitespace().collect())
            .unwrap_or_default();
        HostFacts {
            lbr,
            arch_lbr: flags.contains(&"arch_lbr"),
            amd_lbr_v2: flags.contains(&"amd_lbr_v2"),
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

    /// The branch-record unit (the deepest, on a hybrid part), if the kernel shows one.
    pub fn branch_unit(&self) -> Option<BranchUnit> {
        if let Some(n) = self.brbe.iter().map(|b| b.1).max() {
            return Some(BranchUnit::Brbe(n));
        }
        let n = self.lbr.iter().map(|l| l.1).max()?;
        Some(if self.arch_lbr {
            BranchUnit::ArchLbr(n)
        } else if self.amd_lbr_v2 {
            BranchUnit::AmdLbrV2(n)
        } else {
            BranchUnit::LegacyLbr(n)
        })
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

    /// The branch unit from the PMU caps and cpuinfo flags: hybrid Intel parts show both
    /// core PMUs, Arch LBR and AMD LBRv2 are told by their flags, BRBE by its PMU.
    #[test]
    fn branch_units() {
        let dir = crate::discovery::tests::fixture_copy("n1-etr", "branch-units");
        let caps = |pmu: &str, n: &str, name: Option<&str>| {
            let c = dir.join(EVENT_SOURCE).join(pmu).join("caps");
            std::fs::create_dir_all(&c).unwrap();
            std::fs::write(c.join("branches"), n).unwrap();
            if let Some(name) = name {
                std::fs::write(c.join("pmu_name"), name).unwrap();
            }
        };
        let read = || HostFacts::read(&dir.join("proc"), &dir);
        assert_eq!(read().branch_unit(), None);
        caps("cpu_core", "32\n", Some("alderlake_hybrid"));
        caps("cpu_atom", "32\n", None);
        std::fs::write(dir.join("proc/cpuinfo"), "processor\t: 0\nflags\t\t: fpu pdcm arch_lbr ibt\n").unwrap();
        let f = read();
        assert_eq!(f.lbr.len(), 2);
        assert_eq!(f.lbr[0], ("cpu_core".to_string(), 32, Some("alderlake_hybrid".to_string())));
        assert_eq!(f.branch_unit(), Some(BranchUnit::ArchLbr(32)));
        std::fs::write(dir.join("proc/cpuinfo"), "flags\t\t: fpu amd_lbr_v2\n").unwrap();
        assert_eq!(read().branch_unit(), Some(BranchUnit::AmdLbrV2(32)));
        std::fs::write(dir.join("proc/cpuinfo"), "flags\t\t: fpu\n").unwrap();
        caps("cpu_core", "16\n", None);
        assert_eq!(read().branch_unit(), Some(BranchUnit::LegacyLbr(32)));
        caps("armv9_neoverse_v3", "64\n", None);
        assert_eq!(read().branch_unit(), Some(BranchUnit::Brbe(64)));
        caps("armv9_neoverse_v3", "0\n", None);
        assert_eq!(read().brbe, vec![]);
        let _ = std::fs::remove_dir_all(dir);
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

/// Where branch-sampling events are opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BranchScope {
    /// One event per target thread (`pid = tid, cpu = -1`, `inherit`): only the target's
    /// tasks record branches and pay the wipe at their switches.
    PerThread,
    /// One event per CPU for every task (`pid = -1`): every task on every CPU records
    /// branches and pays the wipe at each switch (on legacy LBR a rewrite of all LBR MSRs).
    CpuWide,
}

/// The first kernel version known to carry both "perf/core: Run sched_task() for PMUs with
/// only CPU-wide events" and "perf/core: Fix NULL pmu_ctx passed to pmu->sched_task()":
/// none yet (7.1.8 has neither: `perf_pmu_sched_task` returns early when the incoming task
/// has a perf context, and `__perf_pmu_sched_task` passes `cpc->task_epc`, NULL without task
/// events of that PMU). Stable backports cannot be told from the version.
pub const SCHED_TASK_FIXED_IN: Option<KernelVersion> = None;

/// "perf: arm_pmu: Kill last use of per-CPU cpu_armpmu pointer" (6.19): from then on
/// `armv8pmu_sched_task` reads `pmu_ctx->pmu`, and a NULL `pmu_ctx` faults.
pub const ARM_PMU_CTX_DEREF_SINCE: KernelVersion = KernelVersion { major: 6, minor: 19, patch: 0 };

/// The scope decision and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScopeChoice {
    pub scope: BranchScope,
    pub reason: String,
    /// CPU-wide branch events could crash this kernel (arm64, NULL `pmu_ctx`).
    pub null_pmu_ctx_risk: bool,
    /// CPU-wide branch buffers are not wiped at switches into tasks with their own perf
    /// events: a target's first samples can carry another process's branches.
    pub stale_branch_risk: bool,
}

/// Chooses per-thread or CPU-wide branch events (`requested = None`: auto) for `kernel` on
/// arm64 or not, following the `sched_task` paths of kernel/events/core.c and
/// drivers/perf/arm_pmuv3.c.
pub fn branch_event_scope(kernel: Option<KernelVersion>, arm64: bool, requested: Option<BranchScope>) -> ScopeChoice {
    let fixed = matches!((kernel, SCHED_TASK_FIXED_IN), (Some(k), Some(f)) if k >= f);
    let null_pmu_ctx_risk = arm64 && !fixed && kernel.is_none_or(|k| k >= ARM_PMU_CTX_DEREF_SINCE);
    let stale_branch_risk = !fixed;
    let kname = kernel.map_or("an unknown kernel".to_string(), |k| format!("kernel {k}"));
    let (scope, reason) = match requested {
        Some(BranchScope::PerThread) => (BranchScope::PerThread, "per-thread branch events requested".to_string()),
        Some(BranchScope::CpuWide) => (BranchScope::CpuWide, "CPU-wide branch events requested".to_string()),
        None if fixed => (BranchScope::CpuWide, format!("{kname} has the sched_task fixes")),
        None if null_pmu_ctx_risk => (
            BranchScope::PerThread,
            format!(
                "{kname} lacks \"Fix NULL pmu_ctx passed to pmu->sched_task()\": CPU-wide branch events can fault in armv8pmu_sched_task"
            ),
        ),
        None => (
            BranchScope::PerThread,
            format!(
                "{kname} lacks \"Run sched_task() for PMUs with only CPU-wide events\": CPU-wide branch buffers are not wiped at switches into tasks with perf events"
            ),
        ),
    };
    ScopeChoice { scope, reason, null_pmu_ctx_risk, stale_branch_risk }
}

/// Context switches so far: the system's (`/proc/stat` `ctxt`) and the threads' of `pid`
/// (`voluntary_ctxt_switches + nonvoluntary_ctxt_switches` of each `/proc/PID/task/*/status`).
/// Each switch of a task with branch events costs a wipe (`intel_pmu_lbr_sched_task`,
/// `amd_pmu_lbr_sched_task`, `armv8pmu_sched_task` -> `brbe_invalidate`): per-thread events
/// pay the target's, CPU-wide events the system's.
pub fn context_switches(proc_root: &Path, pid: u32) -> (Option<u64>, Option<u64>) {
    let system = read(&proc_root.join("stat"))
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("ctxt ").and_then(|v| v.trim().parse().ok())));
    let target = std::fs::read_dir(proc_root.join(format!("{pid}/task"))).ok().map(|rd| {
        rd.flatten()
            .filter_map(|t| read(&t.path().join("status")))
            .flat_map(|s| {
                s.lines()
                    .filter_map(|l| {
                        l.strip_prefix("voluntary_ctxt_switches:")
                            .or_else(|| l.strip_prefix("nonvoluntary_ctxt_switches:"))
                            .and_then(|v| v.trim().parse::<u64>().ok())
                    })
                    .collect::<Vec<_>>()
            })
            .sum()
    });
    (system, target)
}

#[cfg(test)]
mod scope_tests {
    use super::*;

    /// No kernel is known to have both fixes: auto is per-thread everywhere, and on arm64 from
    /// 6.19 because CPU-wide events could fault; a request is honoured with its risks said.
    #[test]
    fn scope_follows_the_sched_task_paths() {
        let k = |a, b| Some(KernelVersion::new(a, b, 0));
        let c = branch_event_scope(k(7, 1), true, None);
        assert_eq!(c.scope, BranchScope::PerThread);
        assert!(c.null_pmu_ctx_risk && c.stale_branch_risk && c.reason.contains("NULL pmu_ctx"), "{c:?}");
        let c = branch_event_scope(k(6, 18), true, None);
        assert!(!c.null_pmu_ctx_risk && c.stale_branch_risk && c.reason.contains("not wiped"), "{c:?}");
        let c = branch_event_scope(k(7, 1), false, Some(BranchScope::CpuWide));
        assert_eq!((c.scope, c.null_pmu_ctx_risk, c.stale_branch_risk), (BranchScope::CpuWide, false, true));
        assert_eq!(branch_event_scope(None, true, None).scope, BranchScope::PerThread);
    }

    /// On the real kernel: this process's threads switched no more often than the system.
    #[test]
    fn context_switches_of_this_process() {
        std::thread::sleep(std::time::Duration::from_millis(5));
        let (sys, me) = context_switches(Path::new("/proc"), std::process::id());
        let (sys, me) = (sys.expect("/proc/stat ctxt"), me.expect("own tasks"));
        assert!(me >= 1 && me <= sys, "{me} {sys}");
    }
}
