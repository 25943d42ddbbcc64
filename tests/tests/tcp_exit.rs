//! Over tcp, an operation that returned `Ok` has delivered its data even if its process then
//! exits without destroying the communicator: rank 0 sends 4 KB and 6 MiB and broadcasts 256 KiB,
//! then calls `exit(0)` (or returns from main with the communicator leaked); rank 1, which starts
//! each receive 200 ms late, must get every byte. Shared memory always did; over tcp the receiver
//! failed with "lost its connection" (end of stream on one socket while another still held data,
//! or a reset that threw away what the exiting rank's kernel had not sent yet).
//!
//! Racy by nature, so each case runs several times.

mod common;

use common::{assert_all_ok, env, run_job, scratch};
use occl_tests::launch::Spawn;
use std::time::{Duration, Instant};

fn run(case: &str, vars: &[(&str, &str)], args: &[&str], rounds: usize) {
    let mut all = vec![("OCCL_TRANSPORT", "tcp")];
    all.extend_from_slice(vars);
    for round in 0..rounds {
        let t = Instant::now();
        let outs = run_job(2, args, Spawn { env: env(&all), ..Spawn::default() }, Duration::from_secs(60));
        assert_all_ok(&outs, &format!("{case}, round {round}"));
        assert!(outs[1].output.contains("received every byte"), "{case}: {}", outs[1].output);
        assert!(t.elapsed() < Duration::from_secs(30), "{case}, round {round}: took {:?}", t.elapsed());
    }
}

#[test]
fn data_sent_before_exit_without_destroy_arrives() {
    run("exit(0)", &[], &["exit-after-send", "exit"], 3);
    run("return with the communicator leaked", &[], &["exit-after-send", "return"], 2);
}

/// Rank 1 first sends rank 0 64 KiB that rank 0 never receives, more than rank 0's FIFO takes
/// (2 slots of 4 KiB): at exit its socket holds unread data, and closing such a socket resets
/// the connection, which drops what the kernel had not sent yet. Rank 0 leaves only once rank 1's
/// send has returned (a file rank 1 creates), so the data is in rank 0's socket by then. (No
/// broadcast here: after an unmatched send on their channel it would fail, rightly, as an
/// operation mismatch.)
#[test]
fn data_sent_before_exit_arrives_when_the_exiting_rank_left_data_unread() {
    let small_fifo = [("OCCL_FIFO_SLOTS", "2"), ("OCCL_TCP_SLOT_SIZE", "4096")];
    let dir = scratch("tcp-exit-unread");
    for round in 0..3 {
        let mark = dir.join(format!("unread-sent-{round}"));
        let mark = mark.to_str().expect("a UTF-8 temp path");
        run(
            &format!("unread data at exit, round {round}"),
            &small_fifo,
            &["exit-after-send", "exit", "65536", mark],
            1,
        );
        assert!(std::path::Path::new(mark).exists(), "rank 1 created {mark} after its send");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
