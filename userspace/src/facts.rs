//! Code facts per binary (`etm_write::elf::ElfCodeFacts`: what llvm-profgen learns by
//! disassembling it), computed once per build-id (per path without one) from the image the
//! engine or `convert` registered, when the profile first meets the binary. The profile's
//! online aggregation and the dump writers read the same object: the writers get it from the
//! profile they write.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use etm_profile::{BinaryInfo, CodeFacts, FactsProvider};
use etm_session::image::ImageBytes;
use etm_write::elf::ElfCodeFacts;

/// Images by path and the facts made from them (module docs). Cheap to clone (shared).
#[derive(Clone, Default)]
pub struct FactsSource(Arc<Mutex<Inner>>);

#[derive(Default)]
struct Inner {
    images: HashMap<String, ImageBytes>,
    /// By build-id (hex), or by path without one; `None`: the image is not an ELF file.
    facts: HashMap<String, Option<Arc<ElfCodeFacts>>>,
    /// Microseconds spent computing each binary's facts, by path.
    times: HashMap<String, u64>,
}

impl FactsSource {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers the image of `path` (as the profile's binaries name it).
    pub fn add_image(&self, path: &str, data: ImageBytes) {
        self.lock().images.entry(path.to_string()).or_insert(data);
    }

    /// The facts of a binary, computed now if its build-id (or path) was not seen yet;
    /// `None` without an image or if it is not an ELF file.
    pub fn facts(&self, info: &BinaryInfo) -> Option<Arc<ElfCodeFacts>> {
        let key = match info.build_id_hex() {
            k if k.is_empty() => info.path.clone(),
            k => k,
        };
        let g = self.lock();
        if let Some(f) = g.facts.get(&key) {
            return f.clone();
        }
        let img = g.images.get(&info.path)?.clone();
        drop(g);
        let t0 = std::time::Instant::now();
        let f = match ElfCodeFacts::from_elf(&img) {
            Ok(f) => Some(Arc::new(f)),
            Err(e) => {
                log::warn!("{}: no code facts ({e}); its PGO dumps know only its code sections", info.path);
                None
            }
        };
        let us = t0.elapsed().as_micros().min(u128::from(u64::MAX)) as u64;
        log::debug!("{}: code facts in {us} us", info.path);
        let mut g = self.lock();
        g.times.insert(info.path.clone(), us);
        g.facts.entry(key).or_insert(f).clone()
    }

    /// The provider the profile asks ([`etm_profile::HybridProfile::set_facts_provider`]).
    pub fn provider(&self) -> FactsProvider {
        let me = self.clone();
        Arc::new(move |info: &BinaryInfo| me.facts(info).map(|f| f as Arc<dyn CodeFacts>))
    }

    /// What computing the facts of `path` cost (microseconds), if they were computed.
    pub fn facts_us(&self, path: &str) -> Option<u64> {
        self.lock().times.get(path).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Facts are computed once per build-id, shared by every binary with that build-id, and
    /// none without an image.
    #[test]
    fn once_per_build_id() {
        let exe = std::env::current_exe().unwrap();
        let data = std::fs::read(&exe).unwrap();
        let info = BinaryInfo::from_elf("/a/x", &data).unwrap();
        let s = FactsSource::default();
        assert!(s.facts(&info).is_none());
        s.add_image("/a/x", ImageBytes::from(data));
        let f1 = s.facts(&info).unwrap();
        let f2 = s.facts(&BinaryInfo { path: "/b/y".into(), ..info.clone() });
        match info.build_id {
            Some(_) => assert!(Arc::ptr_eq(&f1, &f2.unwrap())),
            None => assert!(f2.is_none()),
        }
        assert!(s.facts_us("/a/x").is_some());
    }
}
