//! occl-kernels-check: builds the kernels on this machine's GPU, checks every kernel × type ×
//! operator against the host reference, and measures bandwidth against the device's own copy.
//!
//! Usage: occl-kernels-check [--device N] [--large-mib N] [--quick] [--no-bench]
//!        [--bench-sizes 64K,1M,256M] [--cache-dir DIR] [--out FILE.md] [--load-only]
//! Ends with the line `N passed, M failed`; exits 1 on a failure, 2 when there is no GPU.

use occl_kernels::cache::Cache;
use occl_kernels::check::{self, bench, Options};
use occl_kernels::{device, nvrtc, Error, Kernels};
use std::fmt::Write as _;
use std::process::ExitCode;
use std::time::Instant;

struct Args {
    device: usize,
    large_mib: usize,
    quick: bool,
    bench: bool,
    bench_sizes: Vec<usize>,
    cache_dir: Option<String>,
    out: Option<String>,
    load_only: bool,
}

fn size(s: &str) -> Result<usize, String> {
    let s = s.trim();
    let (num, mul) = match s.chars().last() {
        Some('K' | 'k') => (&s[..s.len() - 1], 1 << 10),
        Some('M' | 'm') => (&s[..s.len() - 1], 1 << 20),
        Some('G' | 'g') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<usize>().map(|n| n * mul).map_err(|e| format!("bad size '{s}': {e}"))
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        device: 0,
        large_mib: 256,
        quick: false,
        bench: true,
        bench_sizes: vec![64 << 10, 1 << 20, 16 << 20, 256 << 20],
        cache_dir: None,
        out: None,
        load_only: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--device" => a.device = value()?.parse().map_err(|e| format!("--device: {e}"))?,
            "--large-mib" => a.large_mib = value()?.parse().map_err(|e| format!("--large-mib: {e}"))?,
            "--quick" => a.quick = true,
            "--no-bench" => a.bench = false,
            "--bench-sizes" => a.bench_sizes = value()?.split(',').map(size).collect::<Result<_, _>>()?,
            "--cache-dir" => a.cache_dir = Some(value()?),
            "--out" => a.out = Some(value()?),
            "--load-only" => a.load_only = true,
            "-h" | "--help" => {
                return Err("usage: occl-kernels-check [--device N] [--large-mib N] [--quick] [--no-bench] [--bench-sizes 64K,1M,256M] [--cache-dir DIR] [--out FILE.md] [--load-only]".into())
            }
            other => return Err(format!("unknown argument '{other}' (see --help)")),
        }
    }
    Ok(a)
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("OCCL_LOG").unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        .init();
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("occl-kernels-check: {e}");
            return ExitCode::from(2);
        }
    };
    match run(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e @ (Error::NoDriver | Error::NoDevice(_) | Error::NoNvrtc)) => {
            eprintln!("occl-kernels-check: cannot run here: {e}");
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("occl-kernels-check: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> Result<bool, Error> {
    let ctx = device::context(args.device)?;
    let info = device::DeviceInfo::of(&ctx)?;
    let (vmaj, vmin) = nvrtc::version()?;
    let mut md = String::new();
    let say = |md: &mut String, line: String| {
        println!("{line}");
        md.push_str(&line);
        md.push('\n');
    };
    let head = format!(
        "device {}: {} ({}, {} SMs, {:.1} GiB); NVRTC {vmaj}.{vmin}",
        info.ordinal,
        info.name,
        info.arch(),
        info.sms,
        info.memory as f64 / (1u64 << 30) as f64
    );
    say(&mut md, head);

    if args.load_only {
        let t = Instant::now();
        let k = Kernels::load(&ctx)?;
        let r = k.report();
        println!(
            "loaded in {:.0} ms: {} ({} bytes, cache file {})",
            t.elapsed().as_secs_f64() * 1e3,
            match r.compile_time {
                Some(c) => format!("compiled by NVRTC in {:.0} ms", c.as_secs_f64() * 1e3),
                None => "read from the cache".into(),
            },
            r.cubin_bytes,
            r.cache_file.as_ref().map_or("none".into(), |p| p.display().to_string())
        );
        return Ok(true);
    }

    // Cold build into a fresh cache directory, then a load that must come from it.
    let dir = match &args.cache_dir {
        Some(d) => std::path::PathBuf::from(d),
        None => std::env::temp_dir().join(format!("occl-kernels-check-{}", std::process::id())),
    };
    let _ = std::fs::remove_dir_all(&dir);
    let cache = Cache::new(&dir);
    let t = Instant::now();
    let cold = Kernels::load_with(&ctx, Some(&cache))?;
    let cold_ms = t.elapsed().as_secs_f64() * 1e3;
    let t = Instant::now();
    let warm = Kernels::load_with(&ctx, Some(&cache))?;
    let warm_ms = t.elapsed().as_secs_f64() * 1e3;
    let mut load_ok = true;
    let compile = cold.report().compile_time.map_or(f64::NAN, |c| c.as_secs_f64() * 1e3);
    say(
        &mut md,
        format!(
            "kernels: NVRTC build {compile:.0} ms ({:.0} ms with module load), {} byte cubin for {}; load from the cache {warm_ms:.1} ms",
            cold_ms,
            cold.report().cubin_bytes,
            cold.report().arch
        ),
    );
    if cold.report().compile_time.is_none() || warm.report().compile_time.is_some() {
        say(&mut md, "FAILED: the first load should compile and the second should come from the cache".into());
        load_ok = false;
    }
    drop(cold);
    let k = warm;
    let stream = ctx.new_stream().map_err(|e| Error::Driver { call: "cuStreamCreate", source: e })?;

    let opt = if args.quick { Options::quick() } else { Options::full(args.large_mib << 20) };
    let t = Instant::now();
    let summary = check::verify(&k, &stream, &opt, &mut |l| println!("{l}"))?;
    say(
        &mut md,
        format!(
            "check: {} cases passed, {} failed in {:.1} s (sizes 0, 1, odd, 2^k±1{}; aligned, shared offset, mismatched offsets; one output, two, in place)",
            summary.passed,
            summary.failed.len(),
            t.elapsed().as_secs_f64(),
            if opt.large_bytes > 0 { format!(", 2^20±1 and {} MiB", args.large_mib) } else { String::new() }
        ),
    );
    for f in summary.failed.iter().take(40) {
        say(&mut md, format!("FAILED {f}"));
    }

    if args.bench {
        println!("bandwidth (bytes read + written per second; ×memcpy: against cuMemcpyDtoDAsync at the same size):");
        let rows = bench::run(&k, &stream, &args.bench_sizes, &mut |l| println!("{l}"))?;
        let _ = writeln!(md, "\n| size | kernel | µs | GB/s | × memcpy D2D |\n|---:|---|---:|---:|---:|");
        for r in &rows {
            let _ =
                writeln!(md, "| {} | {} | {:.2} | {:.0} | {:.2} |", human(r.bytes), r.name, r.us, r.gbps, r.vs_memcpy);
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    if let Some(path) = &args.out {
        if let Err(e) = std::fs::write(path, &md) {
            eprintln!("occl-kernels-check: cannot write {path}: {e}");
        }
    }
    // The cache round trip counts as one more case.
    println!(
        "{} passed, {} failed",
        summary.passed + usize::from(load_ok),
        summary.failed.len() + usize::from(!load_ok)
    );
    Ok(load_ok && summary.failed.is_empty())
}

fn human(b: usize) -> String {
    if b >= 1 << 30 && b.is_multiple_of(1 << 30) {
        format!("{} GiB", b >> 30)
    } else if b >= 1 << 20 && b.is_multiple_of(1 << 20) {
        format!("{} MiB", b >> 20)
    } else if b >= 1 << 10 && b.is_multiple_of(1 << 10) {
        format!("{} KiB", b >> 10)
    } else {
        format!("{b} B")
    }
}
