//! Filling a kernel cache ahead of time, with NVRTC and no GPU.
//!
//! A communicator compiles its programs at first use (`coll.rs`, `kernels.rs`), which on a
//! fresh machine takes NVRTC seconds per program. A build machine can compile them once for the
//! GPUs' architecture into a directory whose files the cache of every GPU machine then reads
//! (`OCCL_KERNEL_CACHE_DIR`; `occl-gpu prebuild`). The files carry the same keys as the ones
//! compiled in place (source, options, architecture, NVRTC version), so a machine whose NVRTC
//! differs by its minor version ignores them and compiles as before.

use crate::cache::{Cache, Key};
use crate::error::{Error, Result};
use crate::{coll, kernels, nvrtc};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One program of [`prebuild`]: its name, where it lies and how long NVRTC took (`None`: it
/// was in the cache already).
#[derive(Debug, Clone)]
pub struct Built {
    pub name: String,
    pub file: PathBuf,
    pub compile_time: Option<Duration>,
}

/// Every program a communicator may build (the element kernels and the collective programs,
/// [`coll::programs`]) as (name, source).
pub fn all_programs(lanes: &[u32], phases: bool) -> Vec<(String, String)> {
    let mut v = vec![("occl-kernels.cu".to_string(), kernels::source())];
    v.extend(coll::programs(lanes, phases));
    v
}

/// Compiles `programs` for `arch` (`sm_XY`) into `cache`, `jobs` at a time, skipping those it
/// already holds. Fails on the first program NVRTC refuses, or if the cache cannot be written.
pub fn prebuild(cache: &Cache, arch: &str, programs: &[(String, String)], jobs: usize) -> Result<Vec<Built>> {
    let version = nvrtc::version()?;
    let supported = nvrtc::supported_archs()?;
    let wanted = arch.strip_prefix("sm_").and_then(|a| a.parse::<u32>().ok());
    if !wanted.is_some_and(|a| supported.contains(&a)) {
        return Err(Error::ArchUnsupported {
            arch: arch.to_string(),
            nvrtc: format!("{}.{}", version.0, version.1),
            supported: supported.iter().map(|a| format!("sm_{a}")).collect::<Vec<_>>().join(" "),
        });
    }
    let opts = kernels::options(arch);
    let next = AtomicUsize::new(0);
    let done = Mutex::new(Vec::new());
    let one = |(name, src): &(String, String)| -> Result<Built> {
        let key = Key { source: src, options: &opts, arch, nvrtc: version };
        if cache.load(&key).is_some() {
            return Ok(Built { name: name.clone(), file: cache.path(&key), compile_time: None });
        }
        let t = Instant::now();
        let bin = nvrtc::compile_cubin(src, name, arch, &opts)?;
        let file =
            cache.store(&key, &bin).map_err(|source| Error::CacheWrite { dir: cache.dir().to_path_buf(), source })?;
        Ok(Built { name: name.clone(), file, compile_time: Some(t.elapsed()) })
    };
    std::thread::scope(|s| {
        for _ in 0..jobs.clamp(1, programs.len().max(1)) {
            s.spawn(|| {
                while let Some(p) = programs.get(next.fetch_add(1, Ordering::Relaxed)) {
                    let r = one(p);
                    let failed = r.is_err();
                    done.lock().unwrap_or_else(|e| e.into_inner()).push(r);
                    if failed {
                        next.store(programs.len(), Ordering::Relaxed);
                    }
                }
            });
        }
    });
    let mut built = done.into_inner().unwrap_or_else(|e| e.into_inner()).into_iter().collect::<Result<Vec<_>>>()?;
    built.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(built)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DataType;

    #[test]
    fn the_list_holds_every_program_a_communicator_builds_once() {
        let types = DataType::ALL.len();
        // One and two lanes share the 512-thread byte mover; a reducing program's lanes are
        // 512 threads at one lane and 256 at two (blocks of 512 either way).
        let plain = all_programs(&[1, 2], false);
        assert_eq!(plain.len(), 1 + 1 + 2 * types);
        assert_eq!(plain[0].0, "occl-kernels.cu");
        assert!(plain.iter().any(|(n, s)| n == "occl-coll-copy.cu" && *s == coll::source(None, false, 512)));
        assert!(plain.iter().any(|(n, s)| n == "occl-coll-f32-lane256.cu"
            && *s == coll::source(Some(DataType::F32), false, coll::reduce_lane_threads(2))));
        let all = all_programs(&[1, 2, 4], true);
        assert_eq!(all.len(), 1 + 2 * 2 + 3 * 2 * types, "lane widths of both kinds, plain and profiled");
        let mut names: Vec<&str> = all.iter().map(|p| p.0.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), all.len(), "one name per program");
        assert!(all.iter().any(|(n, s)| n == "occl-coll-bf16-phases-lane128.cu"
            && *s == coll::source(Some(DataType::Bf16), true, coll::reduce_lane_threads(4))));
        // A four-lane communicator still builds the 512-thread byte mover (p2p, clock probe).
        let four_only = all_programs(&[4], false);
        assert_eq!(four_only.len(), 1 + 1 + types + 1);
        assert!(four_only.iter().any(|(n, _)| n == "occl-coll-copy.cu"));
    }
}
