//! Hostile configuration in real ranks: a value out of range is an `InvalidArgument` that names
//! the variable and the range, a configured file is read up to a bound, and a trace directory
//! that cannot be written is one warning. Never a panic, an endless read or a hang.

mod common;

use common::{env, run_job, scratch, worker};
use occl_tests::launch::{RankOutput, Spawn};
use std::time::{Duration, Instant};

fn assert_no_panic(o: &RankOutput, what: &str) {
    assert!(!o.output.contains("panicked"), "{what}: rank {} panicked:\n{}", o.rank, o.output);
}

/// Each variable, with a value that once panicked or allocated its size, fails init on every rank
/// with the variable and its range named.
#[test]
fn out_of_range_values_fail_init_by_name_without_a_panic() {
    for (var, value, range) in [
        // Duration::from_secs_f64 panicked on every rank.
        ("OCCL_TIMEOUT", "1e30", "at most 31536000"),
        ("OCCL_TIMEOUT", "NaN", "at most 31536000"),
        // The bootstrap root allocated a slot per rank: an 89 GB allocation, an abort.
        ("OCCL_NRANKS", "1000000000000000000", "between 1 and 1048576"),
        ("OCCL_FIFO_SLOTS", "18446744073709551616", "a slot count"),
        ("OCCL_TRACE_MAX_EVENTS", "18446744073709551615", "from 1 to 10000000"),
    ] {
        let what = format!("{var}={value}");
        let mut vars = vec![(var, value)];
        if var == "OCCL_TRACE_MAX_EVENTS" {
            // Trace variables are read with the trace directory set; a bad one turns traces off
            // with a warning rather than failing the job.
            vars.push(("OCCL_TRACE_DIR", "/nonexistent-occl-trace-dir"));
        }
        let spawn = Spawn { env: env(&vars), ..Spawn::default() };
        let t = Instant::now();
        let outs = run_job(2, &["matrix", "colls=all_reduce;counts=8"], spawn, Duration::from_secs(60));
        assert!(t.elapsed() < Duration::from_secs(30), "{what}: took {:?}", t.elapsed());
        for o in &outs {
            assert_no_panic(o, &what);
            let said = o.output.contains(var) && o.output.contains(range);
            if var == "OCCL_TRACE_MAX_EVENTS" {
                assert!(o.status.success() && said, "{what}: rank {} should warn and run:\n{}", o.rank, o.output);
            } else {
                assert!(!o.status.success(), "{what}: rank {} started", o.rank);
                assert!(
                    o.output.contains("ERR kind=InvalidArgument") && said,
                    "{what}: rank {}:\n{}",
                    o.rank,
                    o.output
                );
            }
        }
    }
}

/// `OCCL_TUNER_FILE=/dev/zero` grew each rank by 380 MB/s until the kernel killed it. The ranks
/// run under a 2 GiB address-space limit, so the unbounded read fails the test quickly instead of
/// exhausting the machine.
#[test]
fn an_endless_tuner_file_is_refused_within_bounds() {
    let limited = "ulimit -v 2097152 && exec \"$0\" \"$@\"";
    let w = worker().to_string_lossy().into_owned();
    let spawn = Spawn {
        env: env(&[("OCCL_TUNER_FILE", "/dev/zero")]),
        capture_stdout: true,
        capture_stderr: true,
        ..Spawn::default()
    };
    let args: Vec<String> =
        ["-c", limited, &w, "matrix", "colls=all_reduce;counts=8"].iter().map(|s| s.to_string()).collect();
    let t = Instant::now();
    let job = occl_tests::launch::Job::spawn(std::path::Path::new("/bin/sh"), &args, 2, &spawn).expect("start job");
    let outs = job.wait(Duration::from_secs(60)).expect("job finishes");
    assert!(t.elapsed() < Duration::from_secs(30), "took {:?}", t.elapsed());
    for o in &outs {
        assert_no_panic(o, "OCCL_TUNER_FILE=/dev/zero");
        assert!(!o.output.contains("memory allocation"), "rank {} ran out of memory:\n{}", o.rank, o.output);
        assert!(
            o.output.contains("ERR kind=InvalidArgument")
                && o.output.contains("OCCL_TUNER_FILE /dev/zero")
                && o.output.contains("larger than 1 MiB"),
            "rank {}:\n{}",
            o.rank,
            o.output
        );
    }
}

/// A trace directory that nobody can create (a path under a regular file): the job's operations
/// succeed, and each rank warns once, naming the path and the OS error, whether the files are
/// written at destroy (and again at exit) or only by the exit handler (which panicked:
/// `tracing` there touched thread-locals already destroyed).
#[test]
fn an_unwritable_trace_dir_is_one_warning_and_no_failure() {
    let dir = scratch("trace-unwritable");
    std::fs::write(dir.join("file"), "not a directory").expect("blocker");
    let trace_dir = dir.join("file").join("traces");
    let td = trace_dir.to_string_lossy().into_owned();
    for args in [&["trace", "1"][..], &["trace", "1", "9", "0", "exit"][..]] {
        let what = args.join(" ");
        let spawn = Spawn { env: env(&[("OCCL_TRACE_DIR", &td)]), ..Spawn::default() };
        let outs = run_job(2, args, spawn, Duration::from_secs(60));
        for o in &outs {
            assert_no_panic(o, &what);
            assert!(
                o.status.success() && o.output.contains("OK rank="),
                "{what}: rank {} failed:\n{}",
                o.rank,
                o.output
            );
            let warnings: Vec<&str> = o.output.lines().filter(|l| l.contains("cannot write a trace file")).collect();
            assert_eq!(warnings.len(), 1, "{what}: rank {} warns once:\n{}", o.rank, o.output);
            assert!(warnings[0].contains(&td) && warnings[0].contains("Not a directory"), "{what}: {}", warnings[0]);
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
