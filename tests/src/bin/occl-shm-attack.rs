//! Both sides of the shared-memory isolation test (tests/tests/shm_isolation.rs).
//!
//! `occl-shm-attack victim <go-file> <done-file>`: one rank of a job (launcher environment).
//! It prints `READY rank=R pid=P comm=<hex id>`, waits for `<go-file>`, then sends 64 KiB from
//! rank 0 to rank 1, all-reduces 1 MiB and runs a registered all-reduce on `HostBuf`s, checks
//! every byte, prints `RESULT ok` (or `WRONG …` / `ERR …`), and holds its buffers until
//! `<done-file>` exists so the attacker can try them.
//!
//! `occl-shm-attack attacker <comm hex> <pid>…`: run as another user. Everything it is given is
//! what the RAS port tells anyone on the node. It plants, mode 0666, the FIFO files a job would
//! use if their names could be computed from the communicator id and pids, then watches /dev/shm
//! (inotify) and tries to open every occl file that appears, and every descriptor of the victims
//! through /proc, until the victims exit. It prints `PLANTED n`, then
//! `ATTACK seen=… opened=… denied=… gone=… proc_opened=… proc_denied=…`.

use occl::{Comm, HostBuf, RedOp};
use std::ffi::CString;
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("victim") if args.len() == 3 => victim(Path::new(&args[1]), Path::new(&args[2])),
        Some("attacker") if args.len() >= 3 => attacker(&args[1], &args[2..]),
        _ => {
            eprintln!("usage: occl-shm-attack victim <go-file> <done-file> | attacker <comm-hex> <pid>...");
            ExitCode::from(2)
        }
    }
}

fn wait_for(file: &Path, limit: Duration) -> bool {
    let start = Instant::now();
    while !file.exists() {
        if start.elapsed() > limit {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    true
}

fn victim(go: &Path, done: &Path) -> ExitCode {
    let comm = match Comm::from_env() {
        Ok(c) => c,
        Err(e) => {
            println!("ERR kind={:?} msg={e}", e.kind());
            return ExitCode::from(3);
        }
    };
    let (r, n) = (comm.rank(), comm.nranks());
    println!("READY rank={r} pid={} comm={:016x}", std::process::id(), comm.id());
    if !wait_for(go, Duration::from_secs(60)) {
        println!("WRONG no go-file within 60 s");
        return ExitCode::from(1);
    }
    let mut wrong = Vec::new();
    let outcome = (|| -> occl::Result<Option<(HostBuf<f32>, HostBuf<f32>)>> {
        // A message whose every byte is known: a forged or truncated one shows.
        let msg: Vec<u8> = (0..65536u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8).collect();
        if r == 0 {
            comm.send(&msg, 1)?;
        } else if r == 1 {
            // Late, so rank 0's segments wait alone in /dev/shm for a while, for the attacker.
            std::thread::sleep(Duration::from_millis(300));
            let mut got = vec![0u8; msg.len()];
            comm.recv(&mut got, 0)?;
            if got != msg {
                wrong.push(format!(
                    "rank 1 received {} wrong bytes of 65536",
                    got.iter().zip(&msg).filter(|(a, b)| a != b).count()
                ));
            }
        }
        let a = vec![(r + 1) as f32; 1 << 18];
        let mut b = vec![0f32; 1 << 18];
        comm.all_reduce(&a, &mut b, RedOp::Sum)?;
        let want = (n * (n + 1) / 2) as f32;
        if b.iter().any(|&x| x != want) {
            wrong.push(format!("all-reduce: expected {want} everywhere"));
        }
        let mut send = HostBuf::<f32>::alloc(1 << 16)?;
        send.fill((r + 1) as f32);
        let recv = HostBuf::<f32>::alloc(1 << 16)?;
        let hs = comm.register(&send)?;
        let hr = comm.register(&recv)?;
        let mut recv = recv;
        comm.all_reduce(&send, &mut recv, RedOp::Sum)?;
        if recv.iter().any(|&x| x != want) {
            wrong.push(format!("registered all-reduce: expected {want} everywhere"));
        }
        comm.deregister(hs)?;
        comm.deregister(hr)?;
        Ok(Some((send, recv)))
    })();
    let held = match outcome {
        Ok(h) => h,
        Err(e) => {
            println!("ERR kind={:?} msg={e}", e.kind());
            return ExitCode::from(3);
        }
    };
    if wrong.is_empty() {
        println!("RESULT ok rank={r}");
    } else {
        for w in &wrong {
            println!("WRONG {w}");
        }
    }
    // The registered buffers stay allocated (their memory files open) while the attacker tries.
    let released = wait_for(done, Duration::from_secs(60));
    drop(held);
    if let Err(e) = comm.destroy() {
        println!("ERR kind={:?} msg={e}", e.kind());
        return ExitCode::from(3);
    }
    if !released {
        println!("WRONG no done-file within 60 s");
    }
    if wrong.is_empty() && released {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

#[derive(Default)]
struct Tally {
    seen: usize,
    opened: usize,
    denied: usize,
    gone: usize,
    proc_opened: usize,
    proc_denied: usize,
}

/// Opens `path` for reading and writing, then for reading; what happened.
fn try_open(path: &str) -> Result<(), i32> {
    let Ok(c) = CString::new(path) else { return Err(libc::EINVAL) };
    for flags in [libc::O_RDWR, libc::O_RDONLY] {
        // SAFETY: a NUL-terminated path; a descriptor we got is closed at once.
        let fd = unsafe { libc::open(c.as_ptr(), flags | libc::O_CLOEXEC | libc::O_NONBLOCK) };
        if fd >= 0 {
            // SAFETY: closing our own descriptor.
            unsafe { libc::close(fd) };
            return Ok(());
        }
    }
    Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
}

fn alive(pid: u32) -> bool {
    // SAFETY: signal 0 only tests existence (EPERM: it exists and is another user's).
    unsafe { libc::kill(pid as libc::pid_t, 0) == 0 || *libc::__errno_location() == libc::EPERM }
}

fn attacker(comm: &str, pids: &[String]) -> ExitCode {
    let (Ok(comm), Ok(pids)) =
        (u64::from_str_radix(comm, 16), pids.iter().map(|p| p.parse::<u32>()).collect::<Result<Vec<u32>, _>>())
    else {
        eprintln!("attacker: bad comm id or pid");
        return ExitCode::from(2);
    };
    // SAFETY: plain syscalls; the watch's events are read into a local buffer below.
    let ino = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
    let shm = CString::new("/dev/shm").unwrap_or_default();
    if ino < 0 || unsafe { libc::inotify_add_watch(ino, shm.as_ptr(), libc::IN_CREATE) } < 0 {
        eprintln!("attacker: inotify on /dev/shm: {}", std::io::Error::last_os_error());
        return ExitCode::from(2);
    }
    // The names the FIFO segments had when they were named by communicator, ranks and pid.
    let mut planted = Vec::new();
    for (from, &pid) in pids.iter().enumerate() {
        for to in (0..pids.len()).filter(|&t| t != from) {
            let name = format!("/dev/shm/occl-{comm:016x}-{from}-{to}-{pid}");
            let Ok(c) = CString::new(name.as_str()) else { continue };
            // SAFETY: creating a file of our own; 0666 so a victim could open it read-write.
            let fd =
                unsafe { libc::open(c.as_ptr(), libc::O_CREAT | libc::O_EXCL | libc::O_RDWR | libc::O_CLOEXEC, 0o666) };
            if fd >= 0 {
                // SAFETY: sizing and closing our own file; fchmod undoes the umask.
                unsafe {
                    libc::fchmod(fd, 0o666);
                    libc::ftruncate(fd, 1 << 20);
                    libc::close(fd);
                }
                planted.push(name);
            }
        }
    }
    println!("PLANTED {}", planted.len());
    let mut t = Tally::default();
    let mut buf = [0u8; 8192];
    let deadline = Instant::now() + Duration::from_secs(90);
    while pids.iter().any(|&p| alive(p)) && Instant::now() < deadline {
        // SAFETY: reading inotify records into our buffer.
        let n = unsafe { libc::read(ino, buf.as_mut_ptr().cast(), buf.len()) };
        let mut at = 0usize;
        while n > 0 && at + std::mem::size_of::<libc::inotify_event>() <= n as usize {
            // SAFETY: the kernel wrote whole records; read_unaligned copes with any offset.
            let ev: libc::inotify_event = unsafe { std::ptr::read_unaligned(buf.as_ptr().add(at).cast()) };
            let name_at = at + std::mem::size_of::<libc::inotify_event>();
            let name_end = (name_at + ev.len as usize).min(n as usize);
            let name: String = String::from_utf8_lossy(&buf[name_at..name_end]).trim_end_matches('\0').to_string();
            at = name_end;
            let path = format!("/dev/shm/{name}");
            if !name.starts_with("occl-") || planted.contains(&path) {
                continue;
            }
            t.seen += 1;
            println!("SEEN {path}");
            match try_open(&path) {
                Ok(()) => {
                    t.opened += 1;
                    println!("OPENED {path}");
                }
                Err(libc::ENOENT) => t.gone += 1,
                Err(_) => t.denied += 1,
            }
        }
        for &pid in &pids {
            for fd in 0..64 {
                match try_open(&format!("/proc/{pid}/fd/{fd}")) {
                    Ok(()) => {
                        t.proc_opened += 1;
                        println!("OPENED /proc/{pid}/fd/{fd}");
                    }
                    Err(libc::EACCES | libc::EPERM) => t.proc_denied += 1,
                    Err(_) => {}
                }
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    for p in &planted {
        let _ = std::fs::remove_file(p);
    }
    println!(
        "ATTACK seen={} opened={} denied={} gone={} proc_opened={} proc_denied={}",
        t.seen, t.opened, t.denied, t.gone, t.proc_opened, t.proc_denied
    );
    ExitCode::SUCCESS
}
