//! `etm-decode`: an I/O-free CoreSight ETMv4 / ETE trace decoder.
//!
//! Stages (OpenCSD's structure, see `docs/design.md`):
//!
//! 1. [`frame`]: CoreSight formatter frames (IHI 0029 "Trace Formatter"), FSYNC handling,
//!    demultiplexing by trace ID; unformatted single-source data; DSTREAM/TPIU framing.
//! 2. [`packet`]: ETMv4 (IHI 0064) / ETE (DDI 0608) packet parser, resumable across chunks.
//! 3. [`decoder`]: instruction-level decoder (P0 speculation, exceptions, return stack, Q and
//!    source-address elements) walking the code image ([`image`], [`walk`], [`insn`], with the
//!    per-image block [`cache`]) and emitting generic [`elements`]; [`pipeline`] wires stages
//!    1-3 for a buffer; [`branches`] turns elements into last-branch records (perf's rules).
//!
//! Inputs: [`snapshot`] reads OpenCSD snapshot directories (register configuration per
//! trace ID, memory dumps, trace buffers). Output helpers: [`listing`] prints packets in
//! `trc_pkt_lister` format.
//!
//! Design constraints: no I/O (except the thin snapshot directory loader), no allocation
//! per packet, corrupt input is counted and resynced past, never a panic.
//!
//! ```
//! use etm_decode::{packet::{Packet, PacketParser}, snapshot::{EtmConfig, Protocol}};
//! let cfg = EtmConfig::generic(Protocol::Ete, 1);
//! let mut parser = PacketParser::new(&cfg);
//! let bytes = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x80, 0x04];
//! let mut n = 0;
//! parser.feed(0, &bytes, &mut |_idx, p: &Packet, _raw: &[u8]| { n += 1; let _ = p; });
//! assert_eq!(n, 2); // A-sync, Trace On
//! ```

pub mod branches;
mod by_id;
pub mod cache;
pub mod decoder;
pub mod elements;
pub mod frame;
pub mod image;
pub mod insn;
pub mod listing;
pub mod packet;
pub mod pipeline;
pub mod snapshot;
pub mod walk;
