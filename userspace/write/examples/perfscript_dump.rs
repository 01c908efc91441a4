//! Development driver: read a perf script with the profile crate alone and write the three
//! dumps into a directory (the `etm-bpf convert` logic without the binary's atomic writes).
//! Usage: perfscript_dump SCRIPT OUTDIR BINARY...

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let text = std::fs::read_to_string(&a[1]).unwrap();
    let out = std::path::Path::new(&a[2]);
    std::fs::create_dir_all(out).unwrap();
    let mut infos = Vec::new();
    let mut facts = Vec::new();
    for p in &a[3..] {
        let d = std::fs::read(p).unwrap();
        infos.push(etm_profile::BinaryInfo::from_elf(p, &d).unwrap());
        facts.push(std::sync::Arc::new(etm_write::elf::ElfCodeFacts::from_elf(&d).unwrap()));
    }
    let by_path: Vec<(String, std::sync::Arc<etm_write::elf::ElfCodeFacts>)> =
        infos.iter().map(|i| i.path.clone()).zip(facts).collect();
    let mut r = etm_profile::MmapResolver::new(infos);
    let mut p = etm_profile::HybridProfile::default();
    p.set_facts_provider(std::sync::Arc::new(move |info: &etm_profile::BinaryInfo| {
        by_path.iter().find(|(p, _)| *p == info.path).map(|(_, f)| f.clone() as std::sync::Arc<dyn etm_profile::CodeFacts>)
    }));
    let st = etm_profile::perfscript::read_perfscript(&text, &mut r, &mut p);
    eprintln!("{st:?} {:?}", p.stats());
    for (b, info) in p.binaries().iter().enumerate() {
        let [ps, un, bo] = etm_write::pgo::dump_file_names(info.file_name());
        let mut w = std::fs::File::create(out.join(ps)).unwrap();
        etm_write::pgo::write_perfscript(&p, b, &mut w).unwrap();
        let w = std::fs::File::create(out.join(un)).unwrap();
        etm_write::pgo::write_unsymbolized(&p, b, w).unwrap();
        let w = std::fs::File::create(out.join(bo)).unwrap();
        etm_write::pgo::write_bolt_pa(&p, b, w).unwrap();
    }
}
