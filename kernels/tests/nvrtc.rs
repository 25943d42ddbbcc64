//! NVRTC builds the real kernel sources (no GPU needed, only libnvrtc): for Hopper and for older
//! architectures, and a broken source fails with NVRTC's log as a typed error.

use occl_kernels::{compile, nvrtc, Error};

/// NVRTC, or a plain line saying why this test did not run.
fn nvrtc_or_skip(test: &str) -> bool {
    if nvrtc::available() {
        return true;
    }
    skip(test, "libnvrtc.so could not be loaded (no CUDA toolkit or nvidia-cuda-nvrtc on LD_LIBRARY_PATH)");
    false
}

/// Says why a test did not run, on the real stderr: the test harness captures `eprintln!` of
/// passing tests, and a skip must be seen.
fn skip(test: &str, why: &str) {
    use std::io::Write;
    // One write, so that lines of tests running side by side do not interleave.
    let _ = std::io::stderr().lock().write_all(format!("{test}: SKIPPED: {why}\n").as_bytes());
}

#[test]
fn the_kernels_compile_for_hopper_and_older_gpus() {
    if !nvrtc_or_skip("the_kernels_compile_for_hopper_and_older_gpus") {
        return;
    }
    let (major, minor) = nvrtc::version().expect("nvrtc version");
    let archs = nvrtc::supported_archs().expect("supported archs");
    assert!(archs.contains(&90), "NVRTC {major}.{minor} lacks sm_90: {archs:?}");
    for arch in ["sm_90", "sm_80"] {
        let t = std::time::Instant::now();
        let cubin = compile(arch).unwrap_or_else(|e| panic!("{arch}: {e}"));
        // A cubin is an ELF image.
        assert_eq!(&cubin[..4], b"\x7fELF", "{arch}");
        // The fp8 kernels exist only from sm_89 on; every name is in the image's string table.
        let has = |name: &str| cubin.windows(name.len()).any(|w| w == name.as_bytes());
        assert!(has("occl_reduce_bf16_sum") && has("occl_scale_f64") && has("occl_copy"), "{arch}");
        assert_eq!(has("occl_reduce_f8e4m3_max"), arch == "sm_90", "{arch}");
        eprintln!("{arch}: {} byte cubin in {:.1} s (NVRTC {major}.{minor})", cubin.len(), t.elapsed().as_secs_f64());
    }
}

#[test]
fn a_compile_error_carries_nvrtcs_log() {
    if !nvrtc_or_skip("a_compile_error_carries_nvrtcs_log") {
        return;
    }
    let src = "extern \"C\" __global__ void broken(int* p) {\n  *p = undeclared_thing;\n}\n";
    let err = nvrtc::compile_cubin(src, "broken.cu", "sm_90", &["--gpu-architecture=sm_90".to_string()]).unwrap_err();
    match &err {
        Error::Compile { name, arch, log, .. } => {
            assert_eq!((name.as_str(), arch.as_str()), ("broken.cu", "sm_90"));
            assert!(log.contains("broken.cu(2)") && log.contains("undeclared_thing"), "log: {log}");
        }
        other => panic!("expected a compile error, got {other:?}"),
    }
    assert!(err.to_string().contains("undeclared_thing"), "the message shows the log: {err}");
}

/// The lane width of `dt`'s program (`None`: the byte mover) under the default two lanes.
fn two_lane_width(dt: Option<occl_kernels::DataType>) -> u32 {
    use occl_kernels::coll;
    if dt.is_some() {
        coll::reduce_lane_threads(2)
    } else {
        coll::lane_threads(2)
    }
}

#[test]
fn the_collective_programs_compile_for_hopper() {
    use occl_kernels::{coll, options, DataType};
    if !nvrtc_or_skip("the_collective_programs_compile_for_hopper") {
        return;
    }
    // One program per element size (and fp8, whose conversions are sm_89's), and the byte mover.
    for (dt, kernels) in [
        (Some(DataType::F32), vec!["occl_coll_f32_sum", "occl_coll_f32_min", "occl_coll_f32_premulsum"]),
        (Some(DataType::Bf16), vec!["occl_coll_bf16_sum", "occl_coll_bf16_prod", "occl_coll_bf16_premulsum"]),
        (Some(DataType::F8E4M3), vec!["occl_coll_f8e4m3_max", "occl_coll_f8e4m3_premulsum"]),
        (Some(DataType::I64), vec!["occl_coll_i64_sum", "occl_coll_i64_premulsum"]),
        (Some(DataType::U8), vec!["occl_coll_u8_premulsum"]),
        (None, vec!["occl_coll_copy", "occl_clock_probe", "occl_p2p_group", "occl_coll_win"]),
    ] {
        let t = std::time::Instant::now();
        let cubin = nvrtc::compile_cubin(
            &coll::source(dt, false, two_lane_width(dt)),
            "occl-coll.cu",
            "sm_90",
            &options("sm_90"),
        )
        .unwrap_or_else(|e| panic!("{dt:?}: {e}"));
        assert_eq!(&cubin[..4], b"\x7fELF", "{dt:?}");
        for k in kernels {
            assert!(cubin.windows(k.len()).any(|w| w == k.as_bytes()), "{dt:?} lacks {k}");
        }
        eprintln!("{dt:?}: {} byte cubin in {:.1} s", cubin.len(), t.elapsed().as_secs_f64());
    }
}

#[test]
fn the_phase_profiled_programs_compile_for_hopper() {
    use occl_kernels::{coll, options, DataType};
    if !nvrtc_or_skip("the_phase_profiled_programs_compile_for_hopper") {
        return;
    }
    // The OCCL_PHASES builds of the byte mover and of one reducing type: same kernels, and a
    // different image from the plain build's.
    for (dt, kernels) in [
        (None, vec!["occl_coll_copy", "occl_clock_probe", "occl_p2p_group", "occl_coll_win"]),
        (Some(DataType::F32), vec!["occl_coll_f32_sum", "occl_coll_f32_premulsum"]),
    ] {
        let build = |phases| {
            nvrtc::compile_cubin(
                &coll::source(dt, phases, two_lane_width(dt)),
                "occl-coll.cu",
                "sm_90",
                &options("sm_90"),
            )
            .unwrap_or_else(|e| panic!("{dt:?} phases {phases}: {e}"))
        };
        let (plain, profiled) = (build(false), build(true));
        for k in kernels {
            assert!(profiled.windows(k.len()).any(|w| w == k.as_bytes()), "{dt:?} profiled lacks {k}");
        }
        assert_ne!(plain, profiled, "{dt:?}: OCCL_PHASES changed nothing");
    }
}

#[test]
fn the_grouped_p2p_kernel_takes_the_argument_block_rust_builds() {
    use occl_kernels::{coll, options, p2p};
    if !nvrtc_or_skip("the_grouped_p2p_kernel_takes_the_argument_block_rust_builds") {
        return;
    }
    // The kernel's P2pArgs and CollArgs must be as large as Rust's: static assertions compiled
    // with the real source, so a field added on one side only fails here.
    let size = std::mem::size_of::<p2p::P2pArgs>();
    let src = format!(
        "{}\nstatic_assert(sizeof(P2pArgs) == {size}, \"P2pArgs size\");\nstatic_assert(OCCL_P2P_OPS == {}, \"ops\");\n\
         static_assert(sizeof(CollArgs) == {}, \"CollArgs size\");\n\
         static_assert(sizeof(((CollArgs*)0)->win) == {}, \"CollArgs win, its last field\");\n",
        coll::source(None, false, coll::lane_threads(2)),
        p2p::MAX_OPS,
        std::mem::size_of::<coll::CollArgs>(),
        std::mem::size_of::<coll::CollArgs>() - std::mem::offset_of!(coll::CollArgs, win),
    );
    let cubin = nvrtc::compile_cubin(&src, "occl-p2p.cu", "sm_90", &options("sm_90")).unwrap_or_else(|e| panic!("{e}"));
    assert!(cubin.windows(14).any(|w| w == b"occl_p2p_group"));
    // A different size is refused by the same check (the assertion is live).
    let wrong = src.replace(&format!("== {size}"), &format!("== {}", size + 8));
    assert!(nvrtc::compile_cubin(&wrong, "occl-p2p.cu", "sm_90", &options("sm_90")).is_err());
}

#[test]
fn the_lane_programs_compile_for_hopper_with_the_widths_rust_launches() {
    use occl_kernels::{coll, options, DataType};
    if !nvrtc_or_skip("the_lane_programs_compile_for_hopper_with_the_widths_rust_launches") {
        return;
    }
    // Two and four lanes to a block (OCCL_CUDA_LANES): the byte mover in blocks of 1024 (lanes of
    // 512 or 256), a reducing type in blocks of 512 (lanes of 256 or 128), plain and
    // phase-profiled; the kernel's constants are checked against Rust's.
    for (dt, kernels, width, block) in [
        (
            None,
            vec!["occl_coll_copy", "occl_clock_probe", "occl_p2p_group"],
            coll::lane_threads as fn(u32) -> u32,
            1024,
        ),
        (
            Some(DataType::F32),
            vec!["occl_coll_f32_sum", "occl_coll_f32_max", "occl_coll_f32_premulsum"],
            coll::reduce_lane_threads,
            coll::REDUCE_BLOCK,
        ),
    ] {
        let build = |phases: bool, lanes: u32| {
            let lane = width(lanes);
            let src = format!(
                "{}\nstatic_assert(OCCL_LANE == {lane}, \"lane\");\n\
                 static_assert(OCCL_LANES_MAX == {lanes}, \"lanes\");\n\
                 static_assert(OCCL_BLOCK == {block}, \"block\");\n\
                 static_assert(OCCL_CU == {}, \"a fold's packs per source\");\n",
                coll::source(dt, phases, lane),
                if block > 512 { 4 } else { 8 }
            );
            nvrtc::compile_cubin(&src, "occl-coll.cu", "sm_90", &options("sm_90"))
                .unwrap_or_else(|e| panic!("{dt:?} phases {phases} lanes {lanes}: {e}"))
        };
        let t = std::time::Instant::now();
        let (plain, profiled) = (build(false, coll::MAX_LANES), build(true, coll::MAX_LANES));
        for k in &kernels {
            for (what, cubin) in [("plain", &plain), ("profiled", &profiled)] {
                assert!(cubin.windows(k.len()).any(|w| w == k.as_bytes()), "{dt:?} {what} 4-lane build lacks {k}");
            }
        }
        assert_ne!(plain, profiled, "{dt:?}: OCCL_PHASES changed nothing in the 4-lane build");
        assert_ne!(plain, build(false, 2), "{dt:?}: the lane width changed nothing");
        eprintln!("{dt:?}: three builds in {:.1} s", t.elapsed().as_secs_f64());
    }
}

#[test]
fn a_prebuilt_cache_holds_what_a_communicator_looks_up() {
    use occl_kernels::cache::{Cache, Key};
    use occl_kernels::{coll, options, prebuild};
    if !nvrtc_or_skip("a_prebuilt_cache_holds_what_a_communicator_looks_up") {
        return;
    }
    let dir = std::env::temp_dir().join(format!("occl-prebuild-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let cache = Cache::new(&dir);
    // The byte mover alone keeps the test short; the list itself is unit-tested.
    let progs: Vec<_> =
        prebuild::all_programs(&[2], false).into_iter().filter(|p| p.0 == "occl-coll-copy.cu").collect();
    assert_eq!(progs.len(), 1);
    let built = prebuild::prebuild(&cache, "sm_90", &progs, 2).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(built.len(), 1);
    assert!(built[0].compile_time.is_some(), "compiled, not found");
    // The key a communicator on an sm_90 device computes for the same program.
    let src = coll::source(None, false, coll::lane_threads(2));
    let opts = options("sm_90");
    let key = Key { source: &src, options: &opts, arch: "sm_90", nvrtc: nvrtc::version().expect("version") };
    assert_eq!(built[0].file, cache.path(&key));
    let bin = cache.load(&key).expect("the prebuilt program is in the cache");
    assert_eq!(&bin[..4], b"\x7fELF");
    // A second run finds it and compiles nothing.
    let again = prebuild::prebuild(&cache, "sm_90", &progs, 1).unwrap_or_else(|e| panic!("{e}"));
    assert!(again[0].compile_time.is_none());
    // An architecture NVRTC does not know is refused before anything is compiled.
    let e = prebuild::prebuild(&cache, "sm_1", &progs, 1).unwrap_err();
    assert!(matches!(e, Error::ArchUnsupported { .. }), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}
