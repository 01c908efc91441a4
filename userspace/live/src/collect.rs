//! The collection strategy: when to drain, when to stop and restart the groups so that the
//! sinks publish their trace, and what that proves about which pause samples have all their
//! trace — per sink topology, because the CoreSight sinks publish at different moments:
//!
//! * a **private ETR** (one CPU per ETR, or a per-thread session) copies a window into the AUX
//!   ring at its pause: `etm_event_pause` → `tmc_update_etr_buffer` → `perf_aux_output_end`
//!   writes the PERF_RECORD_AUX before the pause program runs, so the newest AUX record of a
//!   buffer proves its trace complete up to that record's time ([`Delivery::PerPause`]);
//! * a **TRBE** writes into the AUX pages directly and publishes only at its watermark
//!   interrupt (`__trbe_normal_offset` puts the limit at `aux_wakeup + aux_watermark`) or
//!   when the event stops (`arm_trbe_update_buffer`); `etm_event_pause` returns early for
//!   per-CPU sinks. Its records, too, prove their buffer complete up to their time (what it
//!   could not write meanwhile is lost, not late); between them a sample waits for later trace
//!   of its CPU or for a harvest ([`Delivery::Watermark`]);
//! * a **shared ETR** (several CPUs, CPU-wide) publishes nothing while more than one CPU uses
//!   it (`tmc_update_etr_buffer`: "Don't do anything if another tracer is using this sink",
//!   `refcnt != 1`); the last CPU to stop copies the whole ETR buffer into its own AUX ring
//!   (TRUNCATED, with a barrier, if it wrapped). Only a harvest publishes
//!   ([`Delivery::Harvest`]).
//!
//! A **harvest** disables every group and enables them again: each stop runs the sink's
//! `update_buffer` (`etm_event_stop(PERF_EF_UPDATE)`), so after draining, every byte of trace
//! made before the harvest began is in the pipeline, and [`Sideband::TraceComplete`] says so
//! for the newest record time seen before the groups were stopped.
//!
//! The same collector runs on real groups ([`crate::group::LiveGroup`]) and on the driver
//! model in `etm-synth`, through [`Groups`].

use etm_session::session::{SessionEvent, Sideband};

use crate::ring::RingSource;
use crate::stream::{CpuStream, EventSink};

pub use etm_perf::plan::Delivery;

/// What the collector does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Strategy {
    /// How the sinks publish.
    pub delivery: Delivery,
    /// Stop and restart every group this often (driver ns); `None`: never (per-pause).
    pub harvest_every_ns: Option<u64>,
}

/// The groups a collector drives: real ones or the driver model's.
pub trait Groups {
    /// The buffer type.
    type Ring: RingSource;
    /// Number of groups.
    fn count(&self) -> usize;
    /// The buffer of group `i`.
    fn ring(&mut self, i: usize) -> &mut Self::Ring;
    /// Stops group `i` (`PERF_EVENT_IOC_DISABLE` on its leader).
    fn disable(&mut self, i: usize) -> std::io::Result<()>;
    /// Starts group `i` again (`PERF_EVENT_IOC_ENABLE`).
    fn enable(&mut self, i: usize) -> std::io::Result<()>;
    /// Closes and opens group `i` anew (fresh rings), returning its new stream. Needed after
    /// the kernel throttled a group with an AUX leader: `perf_event_throttle()` stops it with
    /// `pmu->stop(event, 0)`, and `etm_event_stop` without `PERF_EF_UPDATE` leaves the AUX
    /// transaction open (`aux_nest` stays 1), so `perf_aux_output_begin` refuses every later
    /// start (`WARN_ON_ONCE(nest)`) until the ring is freed.
    fn reopen(&mut self, i: usize) -> std::io::Result<CpuStream>;
}

/// Counters of the collector.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct CollectStats {
    /// Ticks.
    pub ticks: u64,
    /// Records drained.
    pub records: u64,
    /// Harvests (every group stopped and started).
    pub harvests: u64,
    /// Disable/enable ioctls that failed.
    pub ioctl_errors: u64,
    /// Groups opened anew after a throttle stopped their AUX leader.
    pub reopened: u64,
    /// Reopens that failed (the CPU's trace stays off).
    pub reopen_errors: u64,
    /// TraceComplete proofs handed to the pipeline.
    pub proofs: u64,
}

/// Drains the groups and applies the strategy.
pub struct Collector {
    streams: Vec<CpuStream>,
    strategy: Strategy,
    last_harvest_ns: Option<u64>,
    /// Per stream: the newest AUX time already proven (per-pause delivery).
    proven: Vec<u64>,
    /// Per stream: THROTTLE records already acted on.
    throttles_seen: Vec<u64>,
    /// Counters.
    pub stats: CollectStats,
}

impl Collector {
    /// A collector over `streams` (one per group, same order as [`Groups`]).
    pub fn new(streams: Vec<CpuStream>, strategy: Strategy) -> Self {
        let n = streams.len();
        Collector {
            streams,
            strategy,
            last_harvest_ns: None,
            proven: vec![0; n],
            throttles_seen: vec![0; n],
            stats: CollectStats::default(),
        }
    }

    /// The strategy.
    pub fn strategy(&self) -> Strategy {
        self.strategy
    }

    /// The streams (their counters, trace IDs seen).
    pub fn streams(&self) -> &[CpuStream] {
        &self.streams
    }

    /// Mutable streams (set the target filter).
    pub fn streams_mut(&mut self) -> &mut [CpuStream] {
        &mut self.streams
    }

    /// Drains every buffer once, in group order (leaders' buffers first: the driver orders
    /// them so that in per-thread mode the AUX buffer is drained before the pause records).
    pub fn drain<G: Groups>(&mut self, groups: &mut G, sink: &mut dyn EventSink) -> usize {
        let mut n = 0;
        for (i, s) in self.streams.iter_mut().enumerate() {
            n += s.drain(groups.ring(i), &mut DynSink(sink));
        }
        self.stats.records += n as u64;
        n
    }

    /// One step of the collection at driver time `now_ns`: drain, prove what the delivery
    /// proves, harvest when due, and reopen throttled AUX groups.
    pub fn tick<G: Groups>(&mut self, groups: &mut G, now_ns: u64, sink: &mut dyn EventSink) {
        self.stats.ticks += 1;
        self.drain(groups, sink);
        if self.strategy.delivery != Delivery::Harvest {
            // A buffer's sink writes its CPU's trace in order and a PERF_RECORD_AUX publishes
            // everything before it (a private ETR at each pause; a TRBE at its watermark IRQ
            // and at stop, where trace it could not write is lost, not late): the newest
            // record proves the buffer's trace complete up to its time. Not so for a shared
            // sink, whose records appear only at harvests.
            for (i, s) in self.streams.iter().enumerate() {
                if s.newest_aux_time > self.proven[i] {
                    self.proven[i] = s.newest_aux_time;
                    // A CPU-wide buffer holds its CPU's trace; a per-thread buffer every CPU's.
                    let cpu = (s.cpu >= 0).then_some(s.cpu);
                    sink.event(SessionEvent::Sideband(&Sideband::TraceComplete { cpu, time: s.newest_aux_time }));
                    self.stats.proofs += 1;
                }
            }
        }
        if let Some(every) = self.strategy.harvest_every_ns {
            let due = self.last_harvest_ns.is_none_or(|t| now_ns.saturating_sub(t) >= every);
            if self.last_harvest_ns.is_none() {
                self.last_harvest_ns = Some(now_ns);
            } else if due {
                self.harvest(groups, sink);
                self.last_harvest_ns = Some(now_ns);
            }
        }
        for i in 0..self.streams.len() {
            let s = &self.streams[i];
            if s.stats.throttles > self.throttles_seen[i] {
                self.throttles_seen[i] = s.stats.throttles;
                if s.has_aux() {
                    self.reopen(groups, i, sink);
                }
            }
        }
    }

    /// Stops every group and starts it again, drains, and proves the trace complete up to the
    /// newest record seen before the stops (module docs).
    pub fn harvest<G: Groups>(&mut self, groups: &mut G, sink: &mut dyn EventSink) {
        let before = self.streams.iter().map(|s| s.newest_time).max().unwrap_or(0);
        for i in 0..groups.count() {
            if groups.disable(i).is_err() {
                self.stats.ioctl_errors += 1;
            }
        }
        for i in 0..groups.count() {
            if groups.enable(i).is_err() {
                self.stats.ioctl_errors += 1;
            }
        }
        self.stats.harvests += 1;
        self.drain(groups, sink);
        if before > 0 {
            sink.event(SessionEvent::Sideband(&Sideband::TraceComplete { cpu: None, time: before }));
            self.stats.proofs += 1;
        }
    }

    fn reopen<G: Groups>(&mut self, groups: &mut G, i: usize, sink: &mut dyn EventSink) {
        // What the old buffer still holds is drained first (records up to the throttle).
        let _ = self.streams[i].drain(groups.ring(i), &mut DynSink(sink));
        let target = self.streams[i].target;
        match groups.reopen(i) {
            Ok(mut s) => {
                s.target = target;
                self.streams[i] = s;
                self.proven[i] = 0;
                self.throttles_seen[i] = 0;
                self.stats.reopened += 1;
                if groups.enable(i).is_err() {
                    self.stats.ioctl_errors += 1;
                }
            }
            Err(e) => {
                log::warn!("group {i}: reopening after a throttle failed: {e}");
                self.stats.reopen_errors += 1;
            }
        }
    }

    /// Stops every group, drains what is left and hands back the streams.
    pub fn finish<G: Groups>(mut self, groups: &mut G, sink: &mut dyn EventSink) -> (Vec<CpuStream>, CollectStats) {
        for i in 0..groups.count() {
            let _ = groups.disable(i);
        }
        self.drain(groups, sink);
        (self.streams, self.stats)
    }
}

/// `&mut dyn EventSink` as an `impl EventSink`.
struct DynSink<'a>(&'a mut dyn EventSink);

impl EventSink for DynSink<'_> {
    fn event(&mut self, ev: SessionEvent<'_>) {
        self.0.event(ev)
    }
}
