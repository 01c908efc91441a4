//! Which sink each CPU's trace goes to, from the CoreSight device graph in sysfs, decided as
//! the kernel decides it for a perf session without `@sink`.
//!
//! * `coresight_find_default_sink()` (coresight-core.c): a per-CPU sink registered for the
//!   CPU (`coresight_set_percpu_sink`: a TRBE, device `trbeN`) first; else the best sink
//!   reachable over the output connections (`coresight_find_sink`), best by subtype
//!   (`coresight_select_best_sink`: `SINK_PERCPU_SYSMEM` > `SINK_SYSMEM` (TMC-ETR) >
//!   `SINK_BUFFER` (TMC-ETF, ETB)), then by distance; a link-sink (the ETF) is passed through
//!   to look for a better one behind it.
//! * Connections are the sysfs links `connections/out:N -> ../<device>` that
//!   `coresight_make_links()` (coresight-sysfs.c) creates below `bus/coresight/devices/<dev>`.
//!   TRBEs have none ("TRBE coresight devices do not need regular connections",
//!   `arm_trbe_register_coresight_cpu`).
//! * Device names (`coresight_alloc_device_name`, `tmc_probe`): `etmN`, `funnelN`,
//!   `replicatorN`, `tmc_etfN`, `tmc_etrN`, `tmc_etbN`, `trbeN` (N = the CPU for TRBEs).
//!
//! Kernels without the `connections` links (before they were added) give only the sink
//! names in `cs_etm/sinks/`; then a single ETR is assumed to be shared by every CPU, and the
//! result says it was assumed.

use std::collections::{BTreeMap, VecDeque};
use std::fs;
use std::path::{Path, PathBuf};

use crate::discovery::{CS_ETM, CsEtmSystem, EVENT_SOURCE};

/// `bus/coresight/devices` below the sysfs root.
pub const CORESIGHT_DEVICES: &str = "bus/coresight/devices";

/// Kinds of sinks, in `coresight_dev_subtype_sink` order (higher is preferred).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SinkKind {
    /// ETB / TMC-ETF: an on-chip buffer (`SINK_BUFFER`).
    Buffer,
    /// TMC-ETR: system memory (`SINK_SYSMEM`).
    SysMem,
    /// TRBE: per-CPU system memory (`SINK_PERCPU_SYSMEM`).
    PerCpu,
}

impl SinkKind {
    fn of(name: &str) -> Option<(SinkKind, bool)> {
        // (kind, whether trace also passes on: a link-sink)
        if name.starts_with("trbe") {
            Some((SinkKind::PerCpu, false))
        } else if name.starts_with("tmc_etr") {
            Some((SinkKind::SysMem, false))
        } else if name.starts_with("tmc_etf") {
            Some((SinkKind::Buffer, true))
        } else if name.starts_with("tmc_etb") || name.starts_with("etb") {
            Some((SinkKind::Buffer, false))
        } else {
            None
        }
    }

    /// Name for summaries.
    pub fn name(self) -> &'static str {
        match self {
            SinkKind::Buffer => "buffer",
            SinkKind::SysMem => "ETR",
            SinkKind::PerCpu => "TRBE",
        }
    }
}

/// One sink and the CPUs whose default sink it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SinkUse {
    pub name: String,
    pub kind: SinkKind,
    /// A per-CPU sink (TRBE).
    pub per_cpu: bool,
    /// CPUs that trace into it, sorted.
    pub cpus: Vec<u32>,
}

impl SinkUse {
    /// Several CPUs share it (CPU-wide sessions publish only when the last one stops).
    pub fn shared(&self) -> bool {
        !self.per_cpu && self.cpus.len() > 1
    }
}

/// The sinks of a system.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SinkTopology {
    pub sinks: Vec<SinkUse>,
    /// CPUs with an ETM but no reachable sink (the kernel drops them from a session's mask,
    /// `etm_setup_aux`).
    pub unreachable: Vec<u32>,
    /// The graph was not in sysfs: the result is a guess from `cs_etm/sinks/`.
    pub assumed: bool,
}

impl SinkTopology {
    /// The default sink of `cpu`.
    pub fn sink_of(&self, cpu: u32) -> Option<&SinkUse> {
        self.sinks.iter().find(|s| s.cpus.contains(&cpu))
    }

    /// A one-line description.
    pub fn summary(&self) -> String {
        let mut parts: Vec<String> = self
            .sinks
            .iter()
            .map(|s| {
                if s.per_cpu {
                    format!("{} (TRBE, cpu {})", s.name, cpu_list(&s.cpus))
                } else {
                    format!("{} ({}, cpus {})", s.name, s.kind.name(), cpu_list(&s.cpus))
                }
            })
            .collect();
        if !self.unreachable.is_empty() {
            parts.push(format!("no sink: cpus {}", cpu_list(&self.unreachable)));
        }
        let mut s = parts.join(", ");
        if self.assumed {
            s += " (assumed: no connections in sysfs)";
        }
        s
    }

    /// Reads the graph below `sysfs_root` for the CPUs of `sys`.
    pub fn discover(sysfs_root: &Path, sys: &CsEtmSystem) -> SinkTopology {
        let devs = sysfs_root.join(CORESIGHT_DEVICES);
        let mut by_sink: BTreeMap<String, (SinkKind, Vec<u32>)> = BTreeMap::new();
        let mut unreachable = Vec::new();
        let mut any_graph = false;
        for c in &sys.cpus {
            let trbe = format!("trbe{}", c.cpu);
            if devs.join(&trbe).exists() || sys.sinks.contains_key(&trbe) {
                by_sink.entry(trbe).or_insert((SinkKind::PerCpu, Vec::new())).1.push(c.cpu);
                any_graph = true;
                continue;
            }
            let etm = sysfs_root.join(EVENT_SOURCE).join(CS_ETM).join(format!("cpu{}", c.cpu));
            let start = fs::canonicalize(&etm).unwrap_or(etm);
            if start.join("connections").is_dir() {
                any_graph = true;
            }
            match find_sink(&start) {
                Some((name, kind)) => by_sink.entry(name).or_insert((kind, Vec::new())).1.push(c.cpu),
                None => unreachable.push(c.cpu),
            }
        }
        if !any_graph {
            // No graph: guess from the sink names (one ETR for every CPU, or per-CPU TRBEs).
            let etrs: Vec<&String> = sys.sinks.keys().filter(|n| n.starts_with("tmc_etr")).collect();
            let all: Vec<u32> = sys.cpus.iter().map(|c| c.cpu).collect();
            if let Some(first) = etrs.first() {
                return SinkTopology {
                    sinks: vec![SinkUse { name: (*first).clone(), kind: SinkKind::SysMem, per_cpu: false, cpus: all }],
                    unreachable: Vec::new(),
                    assumed: true,
                };
            }
        }
        let sinks = by_sink
            .into_iter()
            .map(|(name, (kind, mut cpus))| {
                cpus.sort_unstable();
                SinkUse { per_cpu: kind == SinkKind::PerCpu, name, kind, cpus }
            })
            .collect();
        SinkTopology { sinks, unreachable, assumed: false }
    }
}

/// `coresight_find_sink` over the sysfs links from the device at `start`: the best sink by
/// kind, then the nearest.
fn find_sink(start: &Path) -> Option<(String, SinkKind)> {
    let mut best: Option<(SinkKind, usize, String)> = None;
    let mut queue = VecDeque::from([(start.to_path_buf(), 0usize)]);
    let mut seen: Vec<PathBuf> = Vec::new();
    while let Some((dev, depth)) = queue.pop_front() {
        if seen.contains(&dev) || depth > 32 {
            continue;
        }
        seen.push(dev.clone());
        let name = dev.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let mut pass_on = true;
        if depth > 0
            && let Some((kind, link)) = SinkKind::of(&name)
        {
            let better = match &best {
                None => true,
                Some((k, d, _)) => kind > *k || (kind == *k && depth < *d),
            };
            if better {
                best = Some((kind, depth, name.clone()));
            }
            pass_on = link;
        }
        if !pass_on {
            continue;
        }
        let Ok(rd) = fs::read_dir(dev.join("connections")) else { continue };
        let mut outs: Vec<PathBuf> =
            rd.flatten().filter(|e| e.file_name().to_string_lossy().starts_with("out:")).map(|e| e.path()).collect();
        outs.sort();
        for o in outs {
            if let Ok(target) = fs::canonicalize(&o) {
                queue.push_back((target, depth + 1));
            }
        }
    }
    best.map(|(k, _, n)| (n, k))
}

/// `0-3,8` style list.
pub fn cpu_list(cpus: &[u32]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let mut j = i;
        while j + 1 < cpus.len() && cpus[j + 1] == cpus[j] + 1 {
            j += 1;
        }
        out.push(if j > i { format!("{}-{}", cpus[i], cpus[j]) } else { cpus[i].to_string() });
        i = j + 1;
    }
    out.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discovery::tests::fixture;

    /// N1: every ETM reaches the one ETR through the cluster funnels, the main funnel and
    /// the ETF (a link-sink passed through for the better ETR): one sink shared by all CPUs.
    #[test]
    fn n1_shares_one_etr() {
        let sys = CsEtmSystem::discover(&fixture("n1-etr")).unwrap();
        let t = SinkTopology::discover(&fixture("n1-etr"), &sys);
        assert_eq!(
            t.sinks,
            vec![SinkUse { name: "tmc_etr0".into(), kind: SinkKind::SysMem, per_cpu: false, cpus: vec![0, 1, 2, 3] }]
        );
        assert!(t.sinks[0].shared() && !t.assumed && t.unreachable.is_empty());
        assert_eq!(t.summary(), "tmc_etr0 (ETR, cpus 0-3)");
    }

    /// V2: a TRBE per CPU.
    #[test]
    fn v2_has_a_trbe_per_cpu() {
        let sys = CsEtmSystem::discover(&fixture("v2-trbe")).unwrap();
        let t = SinkTopology::discover(&fixture("v2-trbe"), &sys);
        assert_eq!(t.sinks.len(), 4);
        assert!(t.sinks.iter().enumerate().all(|(i, s)| s.per_cpu && s.cpus == vec![i as u32] && !s.shared()));
    }

    /// The fixture trees are what a clean clone holds: git stores no empty directories, so a
    /// device directory with nothing in it would vanish from CI's checkout (and with it the
    /// ETR behind the ETF). Every directory must hold a file or a link.
    #[test]
    fn fixtures_survive_a_clone() {
        /// Whether `d` holds a file or link anywhere below; collects the directories that do
        /// not (a `connections` directory of a device without outputs may be empty: the reader
        /// treats a missing one the same way).
        fn holds_files(d: &std::path::Path, out: &mut Vec<PathBuf>) -> bool {
            let mut any = false;
            for e in fs::read_dir(d).unwrap().flatten() {
                any |= !e.file_type().unwrap().is_dir() || holds_files(&e.path(), out);
            }
            if !any && d.file_name().is_some_and(|n| n != "connections") {
                out.push(d.to_path_buf());
            }
            any
        }
        for f in ["n1-etr", "v2-trbe"] {
            let mut out = Vec::new();
            holds_files(&fixture(f), &mut out);
            assert!(out.is_empty(), "empty directories git will not keep: {out:?}");
        }
    }

    /// CPU lists print as the kernel's cpulist format.
    #[test]
    fn cpu_lists() {
        assert_eq!(cpu_list(&[0, 1, 2, 3, 8, 10, 11]), "0-3,8,10-11");
        assert_eq!(cpu_list(&[5]), "5");
    }
}
