//! The kernels on a real GPU: the quick form of the full check (every kernel × type × operator ×
//! small size × alignment × output form against the host reference), and the safe wrappers on
//! cudarc buffers. Without a driver, a GPU or NVRTC each test says it was skipped and why.

use occl_kernels::cache::Cache;
use occl_kernels::check::{self, Options};
use occl_kernels::cudarc::driver::{CudaContext, CudaStream};
use occl_kernels::{device, nvrtc, DataType, Error, Kernels, RedOp, Reduce, Scale};
use std::sync::Arc;

/// The device, its kernels (built into a fresh cache) and a stream; or `None` after printing why
/// this machine cannot run the test.
fn gpu(test: &str) -> Option<(Arc<CudaContext>, Kernels, Arc<CudaStream>)> {
    let ctx = match device::context(0) {
        Ok(c) => c,
        Err(e @ (Error::NoDriver | Error::NoDevice(_))) => {
            skip(test, &e.to_string());
            return None;
        }
        Err(e) => panic!("{test}: {e}"),
    };
    if !nvrtc::available() {
        skip(test, &Error::NoNvrtc.to_string());
        return None;
    }
    let dir = std::env::temp_dir().join(format!("occl-kernels-test-{}-{test}", std::process::id()));
    let k = Kernels::load_with(&ctx, Some(&Cache::new(&dir)))
        .unwrap_or_else(|e| panic!("{test}: loading the kernels: {e}"));
    let _ = std::fs::remove_dir_all(&dir);
    let stream = ctx.new_stream().expect("stream");
    Some((ctx, k, stream))
}

/// Says why a test did not run, on the real stderr: the test harness captures `eprintln!` of
/// passing tests, and a skip must be seen.
fn skip(test: &str, why: &str) {
    use std::io::Write;
    // One write, so that lines of tests running side by side do not interleave.
    let _ = std::io::stderr().lock().write_all(format!("{test}: SKIPPED: {why}\n").as_bytes());
}

#[test]
fn every_kernel_matches_the_host_reference() {
    let Some((_ctx, k, stream)) = gpu("every_kernel_matches_the_host_reference") else { return };
    let s = check::verify(&k, &stream, &Options::quick(), &mut |l| eprintln!("{l}")).expect("check ran");
    assert!(s.failed.is_empty(), "{} failures, first: {:#?}", s.failed.len(), &s.failed[..s.failed.len().min(10)]);
    assert!(s.passed > 10_000, "only {} cases ran", s.passed);
}

#[test]
fn safe_wrappers_on_cudarc_buffers() {
    let Some((_ctx, k, stream)) = gpu("safe_wrappers_on_cudarc_buffers") else { return };
    let a: Vec<f32> = (0..1001).map(|i| i as f32 * 0.5).collect();
    let b: Vec<f32> = (0..1001).map(|i| 1000.0 - i as f32).collect();
    let (da, db) = (stream.clone_htod(&a).expect("htod"), stream.clone_htod(&b).expect("htod"));
    let mut d1 = stream.alloc_zeros::<f32>(a.len()).expect("alloc");
    let mut d2 = stream.alloc_zeros::<f32>(a.len()).expect("alloc");

    k.reduce2(&stream, &Reduce::new(DataType::F32, RedOp::Max), &mut d1, &mut d2, &da, &db).expect("reduce2");
    let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x.max(*y)).collect();
    assert_eq!(stream.clone_dtoh(&d1).expect("dtoh"), want);
    assert_eq!(stream.clone_dtoh(&d2).expect("dtoh"), want);

    // In place, an average finished by division: (max + b) / 2.
    k.reduce_in_place(&stream, &Reduce::avg_postdiv(DataType::F32, 2), &mut d1, &db).expect("in place");
    let want2: Vec<f32> = want.iter().zip(&b).map(|(x, y)| (x + y) / 2.0).collect();
    assert_eq!(stream.clone_dtoh(&d1).expect("dtoh"), want2);

    k.scale(&stream, &Scale { dtype: DataType::F32, premul: Some(0.25), postdiv: None }, &mut d2, &da).expect("scale");
    assert_eq!(stream.clone_dtoh(&d2).expect("dtoh"), a.iter().map(|x| x * 0.25).collect::<Vec<_>>());

    // Views at an odd element offset take the scalar-head path.
    let mut out = stream.alloc_zeros::<f32>(a.len()).expect("alloc");
    k.reduce(&stream, &Reduce::new(DataType::F32, RedOp::Sum), &mut out.slice_mut(1..), &da.slice(1..), &db.slice(1..))
        .expect("views");
    let got = stream.clone_dtoh(&out).expect("dtoh");
    assert_eq!(got[0], 0.0, "untouched");
    assert!(got[1..].iter().zip(a[1..].iter().zip(&b[1..])).all(|(g, (x, y))| *g == x + y));

    // Bytes: copy2 of the f32 buffers as raw bytes.
    let mut c1 = stream.alloc_zeros::<f32>(a.len()).expect("alloc");
    let mut c2 = stream.alloc_zeros::<f32>(a.len()).expect("alloc");
    k.copy2(&stream, &mut c1, &mut c2, &da).expect("copy2");
    assert_eq!(stream.clone_dtoh(&c1).expect("dtoh"), a);
    assert_eq!(stream.clone_dtoh(&c2).expect("dtoh"), a);

    // Typed errors, not launches: mismatched lengths, premultiplied integers.
    let short = stream.alloc_zeros::<f32>(10).expect("alloc");
    let e = k.reduce(&stream, &Reduce::new(DataType::F32, RedOp::Sum), &mut d1, &da, &short).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    let e = k.reduce(&stream, &Reduce::avg_premul(DataType::I32, 2), &mut d1, &da, &db).unwrap_err();
    assert!(e.to_string().contains("float"), "{e}");
    stream.synchronize().expect("sync");
}

#[test]
fn raw_launches_replay_from_a_cuda_graph() {
    use occl_kernels::cudarc::driver::{sys, DevicePtr};
    let Some((_ctx, k, stream)) = gpu("raw_launches_replay_from_a_cuda_graph") else { return };
    let n = 4097;
    let b: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let mut da = stream.alloc_zeros::<f32>(n).expect("alloc");
    let db = stream.clone_htod(&b).expect("htod");
    let (d, d2) = (stream.alloc_zeros::<f32>(n).expect("alloc"), stream.alloc_zeros::<f32>(n).expect("alloc"));
    // Addresses are taken before the capture: only the kernels go into the graph.
    let (pa, pb, pd, pd2) =
        (da.device_ptr(&stream).0, db.device_ptr(&stream).0, d.device_ptr(&stream).0, d2.device_ptr(&stream).0);
    stream.synchronize().expect("sync");
    stream.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).expect("begin capture");
    // SAFETY: four live buffers of n f32 each; they outlive every replay below.
    unsafe {
        k.reduce_raw(&stream, &Reduce::new(DataType::F32, RedOp::Sum), pd, None, pa, pb, n).expect("captured reduce");
        k.copy_raw(&stream, pd2, None, pd, n * 4).expect("captured copy");
    }
    let graph = stream.end_capture(sys::CUgraphInstantiate_flags(0)).expect("end capture").expect("a graph");
    for round in 1..=3 {
        let a: Vec<f32> = (0..n).map(|i| (round * 1000 + i) as f32).collect();
        stream.memcpy_htod(&a, &mut da).expect("htod");
        graph.launch().expect("replay");
        let got = stream.clone_dtoh(&d2).expect("dtoh");
        let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
        assert_eq!(got, want, "replay {round}");
    }
}

#[test]
fn the_clock_probe_maps_the_device_clock_onto_the_hosts() {
    let test = "the_clock_probe_maps_the_device_clock_onto_the_hosts";
    let Some((ctx, _k, _stream)) = gpu(test) else { return };
    let coll = occl_kernels::coll::CollKernels::load(&ctx, 2).unwrap_or_else(|e| panic!("{test}: {e}"));
    let host = || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    let (mut probe, a) = coll.clock_probe(&host).expect("calibrate");
    let b = probe.measure(&host, 16, std::time::Duration::from_millis(100)).expect("probe").expect("an answer");
    std::thread::sleep(std::time::Duration::from_millis(700));
    let c = probe.measure(&host, 16, std::time::Duration::from_millis(100)).expect("probe").expect("an answer");
    let m = occl_kernels::timer::ClockMap::with_drift_since(c, &a);
    eprintln!(
        "{test}: offset {} ns ± {} ns, again {} ± {}, 0.7 s later {} ± {}: drift {} ppb",
        a.offset_ns, a.err_ns, b.offset_ns, b.err_ns, c.offset_ns, c.err_ns, m.ppb
    );
    // A PCIe round trip is a few µs; a bound past 100 µs means the probe did not answer promptly.
    assert!(a.err_ns < 100_000 && b.err_ns < 100_000 && c.err_ns < 100_000, "{a:?} {b:?} {c:?}");
    // Back to back, two measurements agree within their bounds (plus a µs of drift).
    assert!(a.offset_ns.abs_diff(b.offset_ns) <= a.err_ns + b.err_ns + 1_000, "{a:?} vs {b:?}");
    // Crystals differ by tens of ppm, not hundreds.
    assert!(m.ppb.abs() < 200_000, "{m:?}");
    assert_eq!(m.to_host(c.device_ns), c.device_ns.saturating_add_signed(c.offset_ns));
}

/// A launch made as occl makes its communication kernels' runs in thread-block clusters of the
/// size asked for, and in none where the size does not divide the grid (as NCCL's launches): a
/// probe kernel writes the cluster size each of its blocks sees.
#[test]
fn peer_launches_run_in_the_clusters_asked_for() {
    use occl_kernels::cudarc::driver::{DevicePtr, LaunchConfig};
    use occl_kernels::cudarc::nvrtc::Ptx;
    use occl_kernels::peer_launch::{launch, ClusterSize, PeerLaunch, SyncDomain};
    let test = "peer_launches_run_in_the_clusters_asked_for";
    let Some((ctx, _k, stream)) = gpu(test) else { return };
    let info = device::DeviceInfo::of(&ctx).expect("device info");
    let (major, _) = ctx.compute_capability().expect("compute capability");
    if major < 9 {
        skip(test, &format!("{} has no thread-block clusters (compute capability 9.0 and later)", info.arch()));
        return;
    }
    let src = r#"extern "C" __global__ void probe(unsigned* out) {
        unsigned n;
        asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(n));
        if (threadIdx.x == 0) out[blockIdx.x] = n;
    }"#;
    let cubin = nvrtc::compile_cubin(src, "probe.cu", &info.arch(), &[format!("--gpu-architecture={}", info.arch())])
        .expect("compile the probe");
    let module = ctx.load_module(Ptx::from_binary(cubin)).expect("load the probe");
    let f = module.load_function("probe").expect("the probe");
    let hopper = PeerLaunch::for_device(major);
    for (cluster, grid, want) in [(4, 24, 4), (4, 16, 4), (4, 6, 1), (2, 6, 2), (8, 16, 8), (0, 24, 1), (1, 8, 1)] {
        let out = stream.alloc_zeros::<u32>(grid as usize).expect("alloc");
        let ptr = out.device_ptr(&stream).0;
        let cfg = LaunchConfig { grid_dim: (grid, 1, 1), block_dim: (32, 1, 1), shared_mem_bytes: 0 };
        let how = hopper.with(SyncDomain::Remote, ClusterSize::new(cluster));
        // SAFETY: the probe takes one pointer to `grid` u32s, which outlive the launch (synchronized below).
        unsafe { launch(&stream, &f, &ptr, cfg, how, "cuLaunchKernelEx(probe)") }.expect("launch");
        let got = stream.clone_dtoh(&out).expect("dtoh");
        assert_eq!(got, vec![want; grid as usize], "clusters of {cluster} over {grid} blocks");
    }
}
