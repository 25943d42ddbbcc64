//! Prints this host's topology as occl sees it, with the NIC fusion at a level:
//! `cargo run -p occl --example topo_dump -- [LEVEL] [xml|json] [SYSFS_ROOT]`
//! (defaults: PORT, json, `/`).

use occl::topo::{dump, Host, PathType, Topology};
use std::path::Path;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(level) = PathType::parse(args.first().map_or("PORT", String::as_str)) else {
        eprintln!("topo_dump: level must be one of LOC PORT PIX PXB PHB SYS");
        return ExitCode::from(2);
    };
    let mut topo = match args.get(2) {
        Some(root) => Topology::read(Path::new(root)),
        None => Topology::detect(Host { name: "localhost".into(), hash: 0 }),
    };
    if args.get(2).is_some() {
        topo.host = None;
    }
    let fusion = match topo.fuse(level, None) {
        Ok(f) => Some(f),
        Err(e) => {
            eprintln!("topo_dump: {e}");
            None
        }
    };
    let xml = args.get(1).is_some_and(|f| f == "xml");
    print!("{}", if xml { dump::to_xml(&topo, fusion.as_ref()) } else { dump::to_json(&topo, fusion.as_ref()) });
    ExitCode::SUCCESS
}
