//! The bootstrap root: accepts the job's ranks, checks each one's proof of the secret and its
//! join (same rank count, a rank in range and not taken), then tells every rank the tree
//! address of its parent and stops: all later exchanges run over the ranks' own tree
//! (`tree.rs`). The root sends O(n) bytes, not the n² of a peer table. Strangers are refused
//! and logged; they never reach the tree.

use super::tier::{self, Block, Tier};
use super::wire::{self, Reader, Writer};
use crate::auth;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::id::UniqueId;
use crate::sync::lock;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

impl UniqueId {
    /// A new id whose bootstrap root listens on loopback, served by a thread of this process.
    pub fn new() -> Result<UniqueId> {
        UniqueId::new_on(IpAddr::V4(Ipv4Addr::LOCALHOST))
    }

    /// A new id whose bootstrap root listens on `ip` (for jobs that span hosts).
    pub fn new_on(ip: IpAddr) -> Result<UniqueId> {
        let secret = crate::id::random_bytes()?;
        let (addr, _) = spawn(SocketAddr::new(ip, 0), secret, None, TELL_LIMIT)?;
        Ok(UniqueId::at(addr, secret))
    }

    /// A new id whose root listens where `config`'s ranks would: `OCCL_SOCKET_ADDR`, else the
    /// first interface `OCCL_SOCKET_IFNAME` allows, else loopback (`ncclGetUniqueId`).
    pub fn new_for(config: &Config) -> Result<UniqueId> {
        UniqueId::new_on(crate::netif::root_ip(config.listen_addr, config.socket_ifname.as_deref())?)
    }
}

/// How long a root that found the ranks disagreeing keeps telling late joiners, unless its
/// starter gives a bound.
const TELL_LIMIT: Duration = Duration::from_secs(120);

/// How long a failed job's root waits for ranks that only a disagreeing size counts (rank 3
/// of a job the root says has 2): they come at once if they exist.
const OTHER_SIZE_GRACE: Duration = Duration::from_secs(3);

/// What the rank that starts a root knows of the job: its size, and the variable that set it
/// (`WORLD_SIZE`), so that a rank that disagrees is told in those words.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Expect {
    pub nranks: usize,
    pub var: &'static str,
}

/// Whether a root is telling the job's ranks that it failed. The process that serves the root
/// keeps it alive (`linger`) until every rank heard, so that none waits for a root that is gone.
#[derive(Clone, Default)]
pub(crate) struct Watch(Arc<(Mutex<bool>, Condvar)>);

impl Watch {
    fn telling(&self, on: bool) {
        let (m, cv) = &*self.0;
        *lock(m) = on;
        cv.notify_all();
    }

    /// Waits, at most `limit`, while the root is telling ranks that the job failed.
    pub(crate) fn linger(&self, limit: Duration) {
        let (m, cv) = &*self.0;
        let g = lock(m);
        let _ = cv.wait_timeout_while(g, limit, |on| *on);
    }
}

/// Binds `addr` and serves one job from a background thread; returns the bound address and
/// the root's watch. With `expect`, a join whose size differs fails the job (`tell_for`
/// bounds how long the root then tells the ranks still to come).
pub(crate) fn spawn(
    addr: SocketAddr,
    secret: [u8; 16],
    expect: Option<Expect>,
    tell_for: Duration,
) -> Result<(SocketAddr, Watch)> {
    let listener = TcpListener::bind(addr).map_err(|e| Error::sys(format!("bootstrap root: bind {addr}"), e))?;
    deepen_backlog(&listener);
    let bound = listener.local_addr().map_err(|e| Error::sys("bootstrap root: local address", e))?;
    let watch = Watch::default();
    let root = Root { secret, deadline: None, expect, tell_for, watch: watch.clone() };
    std::thread::Builder::new()
        .name("occl-bootstrap-root".into())
        .spawn(move || {
            if let Err(e) = root.serve(listener) {
                tracing::warn!("bootstrap root at {bound} stopped: {e}");
            }
        })
        .map_err(|e| Error::sys("bootstrap root: spawn thread", e))?;
    Ok((bound, watch))
}

/// Every rank of a job connects to its root at once: std's backlog of 128 overflows at a few
/// hundred ranks and the kernel drops SYNs, which clients retry only after a second. Listening
/// again with a larger backlog raises it (the kernel caps it at net.core.somaxconn).
pub(crate) fn deepen_backlog(listener: &TcpListener) {
    use std::os::fd::AsRawFd;
    // SAFETY: listen(2) on a socket we own that is already listening only changes its backlog.
    if unsafe { libc::listen(listener.as_raw_fd(), 65535) } != 0 {
        tracing::debug!("bootstrap root: raising the listen backlog failed: {}", std::io::Error::last_os_error());
    }
}

/// Serves one job on a listener that is already bound and known to the ranks (a rank's
/// transport listener, for a shrink), from a background thread; it stops waiting for joins
/// after `limit`.
pub(crate) fn spawn_on(listener: TcpListener, secret: [u8; 16], limit: Duration) -> Result<()> {
    let root =
        Root { secret, deadline: Some(Instant::now() + limit), expect: None, tell_for: limit, watch: Watch::default() };
    std::thread::Builder::new()
        .name("occl-bootstrap-root".into())
        .spawn(move || {
            if let Err(e) = root.serve(listener) {
                tracing::warn!("bootstrap root (shrink) stopped: {e}");
            }
        })
        .map_err(|e| Error::sys("bootstrap root: spawn thread", e))?;
    Ok(())
}

/// What a rank's join says: the job's size, its rank, where its tree listener is, and
/// (scalable init) which of `m` ids it joined and the id of the next root in the ring of roots.
struct Joined {
    stream: TcpStream,
    nranks: usize,
    rank: usize,
    m: usize,
    k: usize,
    next: Option<UniqueId>,
    tree: String,
}

/// A connection that passed authentication: a rank, or the previous root of the ring.
enum Arrival {
    Rank(Joined),
    Root { stream: TcpStream, nranks: usize, m: usize, k: usize },
}

fn reject(mut s: TcpStream, why: &str) {
    let mut w = Writer::default();
    w.u8(wire::ERROR);
    w.str(why);
    let _ = wire::send(&mut s, &w.into_inner());
}

fn parse_join(frame: &[u8], stream: TcpStream) -> Result<Arrival> {
    let mut r = Reader::new(frame);
    let t = r.u8()?;
    let (nranks, rank) = (r.u32()? as usize, r.u32()? as usize);
    let arrival = match t {
        wire::JOIN => Arrival::Rank(Joined { stream, nranks, rank, m: 1, k: 0, next: None, tree: r.str()? }),
        wire::JOIN_MULTI => {
            let (m, k) = (r.u32()? as usize, r.u32()? as usize);
            let next = r.str()?;
            let next = if next.is_empty() { None } else { Some(next.parse::<UniqueId>()?) };
            Arrival::Rank(Joined { stream, nranks, rank, m, k, next, tree: r.str()? })
        }
        // A root's hello: nranks, m, k (m read as the "rank" field).
        wire::ROOT_PEER => Arrival::Root { stream, nranks, m: rank, k: r.u32()? as usize },
        t => return Err(Error::internal(format!("unexpected frame type {t}"))),
    };
    r.finish()?;
    Ok(arrival)
}

/// Authenticates and reads the join of one connection (on its own thread so that a stranger
/// that connects and stays silent cannot hold up the others).
fn admit(mut s: TcpStream, secret: [u8; 16], peer: SocketAddr) -> Option<Arrival> {
    if let Err(e) = auth::server(&mut s, &secret) {
        tracing::warn!("bootstrap root: refused a connection from {peer}: {e}");
        return None;
    }
    let _ = s.set_nodelay(true);
    let _ = s.set_read_timeout(Some(Duration::from_secs(30)));
    let frame = match wire::recv(&mut s) {
        Ok(f) => f,
        Err(e) => {
            tracing::warn!("bootstrap root: no join from {peer}: {e}");
            return None;
        }
    };
    let _ = s.set_read_timeout(None);
    let Ok(copy) = s.try_clone() else { return None };
    match parse_join(&frame, copy) {
        Ok(a) => Some(a),
        Err(e) => {
            tracing::warn!("bootstrap root: malformed join from {peer}: {e}");
            reject(s, "malformed join message");
            None
        }
    }
}

/// The job as the first join describes it: this root is id `k` of `m` and serves `[lo, hi)`.
struct Job {
    nranks: usize,
    m: usize,
    k: usize,
    next: Option<UniqueId>,
    lo: usize,
    hi: usize,
}

/// Why a join is refused: `Fatal` when the job can no longer form (the ranks disagree on its
/// size), so that every rank is told rather than left waiting for one that never joins.
enum Refusal {
    One(String),
    Fatal(String),
}

/// Rank `rank` was started for a job of `theirs` ranks, the root for `ours`; `var` is what the
/// user set (`WORLD_SIZE`) or `nranks`.
fn size_differs(rank: usize, theirs: usize, ours: usize, var: &str) -> String {
    format!(
        "rank {rank} says {var}={theirs}, the root has {var}={ours}; every rank must be started with the same {var}"
    )
}

impl Job {
    /// Why `j` does not belong to this job, if it does not.
    fn refuse(&self, j: &Joined, slots: &[Option<(TcpStream, String)>], var: &str) -> Option<Refusal> {
        if j.nranks != self.nranks {
            return Some(Refusal::Fatal(size_differs(j.rank, j.nranks, self.nranks, var)));
        }
        if j.m != self.m || j.k != self.k || j.next.as_ref().map(|i| i.addr) != self.next.as_ref().map(|i| i.addr) {
            return Some(Refusal::One(format!(
                "rank {} joined as id {} of {} but this root is id {} of {} (every rank must pass the same ids)",
                j.rank, j.k, j.m, self.k, self.m
            )));
        }
        if j.rank >= self.nranks {
            // Some rank of the job's range will never come.
            return Some(Refusal::Fatal(format!("rank {} is out of range for {var}={}", j.rank, self.nranks)));
        }
        if j.rank < self.lo || j.rank >= self.hi {
            return Some(Refusal::One(format!(
                "rank {} belongs to id {}, not to id {}",
                j.rank,
                tier::id_of(j.rank, self.m, self.nranks),
                self.k
            )));
        }
        if slots[j.rank - self.lo].is_some() {
            return Some(Refusal::One(format!("rank {} joined twice", j.rank)));
        }
        None
    }
}

/// One root: the job's secret, when it stops waiting for joins, what its starter expects, and
/// how it tells a failed job's ranks (see `spawn`).
struct Root {
    secret: [u8; 16],
    deadline: Option<Instant>,
    expect: Option<Expect>,
    tell_for: Duration,
    watch: Watch,
}

impl Root {
    /// Takes every pending connection, each authenticated and read on its own thread so that a
    /// silent stranger holds up nobody; whether there was any.
    fn accept_pending(&self, listener: &TcpListener, tx: &mpsc::Sender<Arrival>) -> bool {
        let mut accepted = false;
        loop {
            match listener.accept() {
                Ok((s, peer)) => {
                    accepted = true;
                    let _ = s.set_nonblocking(false);
                    let (tx, secret) = (tx.clone(), self.secret);
                    let _ = std::thread::Builder::new().name("occl-bootstrap-admit".into()).spawn(move || {
                        if let Some(j) = admit(s, secret, peer) {
                            let _ = tx.send(j);
                        }
                    });
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return accepted,
                Err(e) => {
                    tracing::warn!("bootstrap root: accept failed: {e}");
                    return accepted;
                }
            }
        }
    }

    /// The job cannot form: tells the ranks that joined, the one that disagreed, and every rank
    /// still to come (until each rank of `share` heard, and for `OTHER_SIZE_GRACE` each of the
    /// larger size a join claimed; at most `tell_for`), then fails.
    fn fail_job(
        &self,
        listener: &TcpListener,
        (tx, rx): (&mpsc::Sender<Arrival>, &mpsc::Receiver<Arrival>),
        joined: Vec<(usize, TcpStream)>,
        culprit: Joined,
        why: String,
        share: std::ops::Range<usize>,
    ) -> Result<()> {
        self.watch.telling(true);
        tracing::warn!("bootstrap root: the job cannot form: {why}");
        let mut told = vec![false; share.len()];
        let tell = |told: &mut Vec<bool>, rank: usize, nranks: usize, s: TcpStream| {
            let end = nranks.clamp(share.end, crate::config::MAX_NRANKS.max(share.end));
            told.resize(told.len().max(end - share.start), false);
            if let Some(t) = rank.checked_sub(share.start).and_then(|i| told.get_mut(i)) {
                *t = true;
            }
            reject(s, &why);
        };
        for (rank, s) in joined {
            tell(&mut told, rank, share.end, s);
        }
        tell(&mut told, culprit.rank, culprit.nranks, culprit.stream);
        let grace = Instant::now() + OTHER_SIZE_GRACE;
        let end = Instant::now() + self.tell_for;
        let end = self.deadline.map_or(end, |d| d.min(end));
        while Instant::now() < end {
            let mut wait = if self.accept_pending(listener, tx) { Duration::ZERO } else { Duration::from_millis(1) };
            while let Ok(a) = rx.recv_timeout(std::mem::take(&mut wait)) {
                if let Arrival::Rank(j) = a {
                    tell(&mut told, j.rank, j.nranks, j.stream);
                }
            }
            // The root's own share must hear; ranks that only another size counts may not
            // exist, and are waited for a moment only.
            let share_told = told[..share.len()].iter().all(|t| *t);
            if share_told && (told.iter().all(|t| *t) || Instant::now() >= grace) {
                break;
            }
        }
        self.watch.telling(false);
        Err(Error::usage(why))
    }

    fn serve(self, listener: TcpListener) -> Result<()> {
        let (tx, rx) = mpsc::channel::<Arrival>();
        // The acceptor runs until the job is complete; then the listener is closed by dropping
        // it together with this thread's handle on it (a non-blocking accept loop polls for that).
        listener.set_nonblocking(true).map_err(|e| Error::sys("bootstrap root: set non-blocking", e))?;
        let var = self.expect.map_or("nranks", |e| e.var);
        let mut slots: Vec<Option<(TcpStream, String)>> = Vec::new();
        let mut job: Option<Job> = None;
        let mut joined = 0usize;
        let mut prev: Option<(TcpStream, usize, usize, usize)> = None;
        let mut dialing: Option<mpsc::Receiver<Result<TcpStream>>> = None;
        let complete = |job: &Option<Job>, joined: usize, prev: &Option<_>| {
            job.as_ref().is_some_and(|j| joined == j.hi - j.lo && (j.m == 1 || prev.is_some()))
        };
        while !complete(&job, joined, &prev) {
            if self.deadline.is_some_and(|d| Instant::now() >= d) {
                let want = job.as_ref().map_or(0, |j| j.hi - j.lo);
                return Err(Error::Timeout {
                    what: format!("waiting for ranks to join ({joined} of {want} did)"),
                    secs: 0.0,
                });
            }
            // Take every pending connection before waiting: one accept per wait would cap a root
            // at a few hundred joins a second (1,024 ranks on one id took 10 s).
            let accepted = self.accept_pending(&listener, &tx);
            // Wait briefly for an admission only when nothing new came in; then take all there are.
            let mut wait = if accepted { Duration::ZERO } else { Duration::from_millis(1) };
            while let Ok(a) = rx.recv_timeout(std::mem::take(&mut wait)) {
                let j = match a {
                    Arrival::Root { stream, nranks, m, k } => {
                        if prev.is_some() {
                            tracing::warn!("bootstrap root: a second previous root connected; dropped");
                        } else {
                            prev = Some((stream, nranks, m, k));
                        }
                        continue;
                    }
                    Arrival::Rank(j) => j,
                };
                if job.is_none() {
                    if let Some(e) = self.expect.filter(|e| e.nranks != j.nranks) {
                        let why = size_differs(j.rank, j.nranks, e.nranks, e.var);
                        return self.fail_job(&listener, (&tx, &rx), Vec::new(), j, why, 0..e.nranks);
                    }
                    // The slots below are sized by the first rank's nranks: bound it.
                    if !(1..=crate::config::MAX_NRANKS).contains(&j.nranks)
                        || j.m == 0
                        || j.m > j.nranks
                        || j.k >= j.m
                        || (j.m > 1) != j.next.is_some()
                    {
                        let why = format!(
                            "nranks must be between 1 and {}, with between 1 and nranks ids",
                            crate::config::MAX_NRANKS
                        );
                        reject(j.stream, &why);
                        continue;
                    }
                    let (lo, hi) = tier::share(j.k, j.m, j.nranks);
                    slots = (lo..hi).map(|_| None).collect();
                    if let Some(next) = j.next.clone() {
                        // Dialed at once, on its own thread: every root waits for its previous
                        // root before serving, so dialing only after that would wait in a circle.
                        let (dtx, drx) = mpsc::channel();
                        let (k, m, n) = (j.k, j.m, j.nranks);
                        let limit = self.deadline.unwrap_or_else(|| Instant::now() + Duration::from_secs(120));
                        let _ = std::thread::Builder::new().name("occl-bootstrap-dial".into()).spawn(move || {
                            let _ = dtx.send(tier::dial_next(&next, k, m, n, limit));
                        });
                        dialing = Some(drx);
                    }
                    job = Some(Job { nranks: j.nranks, m: j.m, k: j.k, next: j.next.clone(), lo, hi });
                }
                let Some(jb) = job.as_ref() else { continue };
                match jb.refuse(&j, &slots, var) {
                    None => {
                        slots[j.rank - jb.lo] = Some((j.stream, j.tree));
                        joined += 1;
                    }
                    Some(Refusal::One(why)) => {
                        tracing::warn!("bootstrap root: refused rank {}: {why}", j.rank);
                        reject(j.stream, &why);
                    }
                    Some(Refusal::Fatal(why)) => {
                        let lo = jb.lo;
                        let share = lo..jb.hi;
                        let joined: Vec<(usize, TcpStream)> = std::mem::take(&mut slots)
                            .into_iter()
                            .enumerate()
                            .filter_map(|(i, s)| s.map(|(s, _)| (lo + i, s)))
                            .collect();
                        return self.fail_job(&listener, (&tx, &rx), joined, j, why, share);
                    }
                }
            }
        }
        drop(listener);
        let Some(job) = job else { return Err(Error::internal("bootstrap root: no job")) };
        let (mut streams, addrs): (Vec<TcpStream>, Vec<String>) = slots.into_iter().flatten().unzip();
        let tier = match prev {
            None => None,
            Some((prev, nranks, m, k)) => {
                if nranks != job.nranks || m != job.m || k != (job.k + m - 1) % m {
                    let why = format!(
                        "the previous root says it is id {k} of {m} for nranks={nranks}; this is id {} of {}",
                        job.k, job.m
                    );
                    fail_all(&mut streams, &why);
                    return Err(Error::usage(why));
                }
                let dialed = dialing.as_ref().map_or_else(
                    || Err(Error::internal("no dial to the next root")),
                    |d| d.recv().unwrap_or_else(|_| Err(Error::internal("the dialing thread vanished"))),
                );
                match dialed {
                    Ok(n) => Some(Tier::new(job.k, job.m, n, prev)),
                    Err(e) => {
                        fail_all(&mut streams, &format!("bootstrap root {} could not reach the next root: {e}", job.k));
                        return Err(e);
                    }
                }
            }
        };
        tracing::debug!("bootstrap root {}/{}: all {} ranks of its share joined", job.k, job.m, job.hi - job.lo);
        answer_parents(&mut streams, addrs, job.lo, job.nranks, tier)
    }
}

fn fail_all(streams: &mut [TcpStream], msg: &str) {
    for s in streams.iter_mut() {
        let mut w = Writer::default();
        w.u8(wire::ERROR);
        w.str(msg);
        let _ = wire::send(s, &w.into_inner());
    }
}

/// Tells every rank of the share the tree address of its parent: the share's own addresses,
/// with the other roots' shares swapped in first when there are several roots. A rank that
/// cannot be told is logged; its neighbours find out when they dial it or wait for its dial,
/// and fail with its name.
fn answer_parents(
    streams: &mut [TcpStream],
    addrs: Vec<String>,
    lo: usize,
    nranks: usize,
    tier: Option<Tier>,
) -> Result<()> {
    let all: Vec<Vec<u8>> = match tier {
        None => addrs.into_iter().map(String::into_bytes).collect(),
        Some(mut t) => {
            let blocks = match t.exchange(Block::Parts(addrs.into_iter().map(String::into_bytes).collect())) {
                Ok(b) => b,
                Err(e) => {
                    fail_all(streams, &format!("the bootstrap roots lost each other: {e}"));
                    return Err(e);
                }
            };
            let mut all = Vec::with_capacity(nranks);
            for b in blocks {
                match b {
                    Block::Parts(p) => all.extend(p),
                    Block::Failed(why) => {
                        fail_all(streams, &why);
                        return Err(Error::usage(why));
                    }
                }
            }
            all
        }
    };
    if all.len() != nranks {
        let why = format!("the bootstrap roots hold {} tree addresses for {nranks} ranks", all.len());
        fail_all(streams, &why);
        return Err(Error::internal(why));
    }
    for (i, s) in streams.iter_mut().enumerate() {
        let rank = lo + i;
        let mut w = Writer::default();
        w.u8(wire::PARENT);
        w.bytes(super::gather::parent(rank).map_or(&[][..], |p| &all[p]));
        if let Err(e) = wire::send(s, &w.into_inner()) {
            tracing::warn!("bootstrap root: could not tell rank {rank} its parent: {e}");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bootstrap::Client;

    /// A rank started for another job size fails the job on every rank within moments, each
    /// told both sizes, and the root's process is kept until every rank heard.
    #[test]
    fn a_rank_that_disagrees_on_the_size_fails_every_rank_naming_both() {
        let secret = [5u8; 16];
        let expect = Expect { nranks: 3, var: "WORLD_SIZE" };
        let (addr, watch) =
            spawn("127.0.0.1:0".parse().expect("addr"), secret, Some(expect), Duration::from_secs(20)).expect("root");
        let id = UniqueId::at(addr, secret);
        let lo = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let t = Instant::now();
        let join = |rank: usize, nranks: usize| {
            let id = id.clone();
            std::thread::spawn(move || Client::join_any(&[id], rank, nranks, lo, Duration::from_secs(30)).err())
        };
        let early = join(0, 3);
        std::thread::sleep(Duration::from_millis(100));
        let wrong = join(2, 8);
        std::thread::sleep(Duration::from_millis(100));
        let late = join(1, 3);
        for (who, h) in [("rank 0", early), ("rank 2", wrong), ("rank 1", late)] {
            let e = h.join().expect("thread").unwrap_or_else(|| panic!("{who} joined a job that cannot form"));
            assert_eq!(e.kind(), crate::ErrorKind::InvalidUsage, "{who}: {e}");
            assert!(e.to_string().contains("rank 2 says WORLD_SIZE=8, the root has WORLD_SIZE=3"), "{who}: {e}");
        }
        // Every rank of the root's size heard: it stops telling at once.
        watch.linger(Duration::from_secs(20));
        assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    }

    /// Without an expected size (an id created in code), the first join sets it.
    #[test]
    fn without_an_expected_size_the_first_join_sets_it() {
        let id = UniqueId::new().expect("id");
        let lo = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let first = {
            let id = id.clone();
            std::thread::spawn(move || Client::join_any(&[id], 0, 2, lo, Duration::from_secs(30)).err())
        };
        std::thread::sleep(Duration::from_millis(100));
        let e = Client::join_any(&[id], 1, 4, lo, Duration::from_secs(30)).err().expect("refused");
        assert!(e.to_string().contains("rank 1 says nranks=4, the root has nranks=2"), "{e}");
        let e = first.join().expect("thread").expect("rank 0 told");
        assert!(e.to_string().contains("rank 1 says nranks=4"), "{e}");
    }
}
