//! Transports: how bytes get from one rank to another. Every peer pair gets a pair of FIFOs
//! (`fifo`), carried by shared memory between ranks of one host (`shm`) or by sockets between
//! hosts (`tcp`, moved by the collective thread itself while it waits). Selection is by host
//! identity and, for ib (RDMA, feature `ib`), by whether both ranks have a usable device
//! (`ib`); `OCCL_TRANSPORT` forces one.

pub(crate) mod connect;
pub(crate) mod fifo;
pub(crate) mod ib;
pub(crate) mod peers;
pub(crate) mod shm;
mod shm_reap;
pub(crate) mod tcp;

use crate::auth;
use crate::bootstrap::{wire, PeerInfo};
use crate::config::{Config, TransportKind};
use crate::error::{Error, Result};
use crate::wait::Patience;
use fifo::{Cause, Liveness, RecvFifo, SendFifo};
use std::net::{TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Everything this rank has for one peer.
pub(crate) struct Peer {
    pub send: SendFifo,
    pub recv: RecvFifo,
    pub liveness: Liveness,
    pub tcp: Option<tcp::SharedLink>,
    /// The shm segment names of the send and receive FIFOs (processes on one host).
    pub shm_names: Vec<String>,
}

impl Peer {
    /// Tells the peer this rank is done (`state::CLOSED`) or failed (another state), and for tcp
    /// flushes and closes the sockets.
    pub(crate) fn close(&mut self, how: u32) {
        // A failed rank marked its ends with the cause already; this only closes open ones.
        self.send.set_state(how, None);
        self.recv.set_state(how, None);
        if let Some(t) = &self.tcp {
            crate::sync::lock(t).close(how);
        }
        self.unlink_orphans();
    }

    /// A segment the peer never mapped keeps its name (the peer may still come for data this
    /// rank sent) unless the peer is dead; then nobody will, and the name goes now rather than
    /// at `shm_reap`'s next pass.
    fn unlink_orphans(&self) {
        let Liveness::Process(pid) = self.liveness else { return };
        let regions = [&self.send.region, &self.recv.region];
        for (name, r) in self.shm_names.iter().zip(regions) {
            if r.header().attached.load(std::sync::atomic::Ordering::Acquire) < 2 && !fifo::pid_alive(pid) {
                shm::unlink(name);
            }
        }
    }

    /// Marks failure, and the failure that started it, without blocking (no flush): used on
    /// errors, where peers must learn fast. A tcp peer gets an ABORT frame (with the cause) if
    /// the socket takes it at once.
    pub(crate) fn fail(&self, how: u32, cause: Cause) {
        self.send.set_state(how, Some(cause));
        self.recv.set_state(how, Some(cause));
        if let Some(t) = &self.tcp {
            crate::sync::lock(t).abort(how);
        }
    }
}

/// The transport for the pair (me, peer), as every rank computes it from the same table.
pub(crate) fn select(config: &Config, me: &PeerInfo, peer: &PeerInfo) -> Result<TransportKind> {
    let same_host = me.host_id == peer.host_id;
    match config.transport {
        Some(TransportKind::Shm) if !same_host => Err(Error::usage(format!(
            "OCCL_TRANSPORT=shm, but rank {} is on host {} and rank {} on host {}; shm only connects ranks of one host (use tcp)",
            me.rank, me.hostname, peer.rank, peer.hostname
        ))),
        // Each rank checked its own device at init (`ib::probe`); this catches a peer without.
        Some(TransportKind::Ib) if !(me.ib && peer.ib) => Err(Error::usage(format!(
            "OCCL_TRANSPORT=ib, but rank {} on host {} has no usable RDMA device",
            if me.ib { peer.rank } else { me.rank },
            if me.ib { &peer.hostname } else { &me.hostname }
        ))),
        Some(k) => Ok(k),
        None if same_host => Ok(TransportKind::Shm),
        None if me.ib && peer.ib => Ok(TransportKind::Ib),
        None => Ok(TransportKind::Tcp),
    }
}

/// Connects this rank to its tcp peers (eagerly: each pair's lower rank dials) and returns a
/// connector for its shm peers, which connect on first use (`connect`), or at once with
/// `OCCL_RUNTIME_CONNECT=0`. Collective over the communicator: every rank calls it with the
/// same table. `listener` is the socket advertised in this rank's `PeerInfo`. Returns the
/// peers (shm ones still `None` when lazy), the driver of this rank's tcp links (if it has
/// any), the slot size and the connector.
pub(crate) fn connect_all(
    config: &Config,
    me: usize,
    table: &[PeerInfo],
    secret: &[u8; 16],
    listener: TcpListener,
    prof: Option<tcp::NetProf>,
) -> Result<Connected> {
    let n = table.len();
    let comm_id = table[0].comm_id;
    let kinds: Vec<Option<TransportKind>> = (0..n)
        .map(|p| if p == me { Ok(None) } else { select(config, &table[me], &table[p]).map(Some) })
        .collect::<Result<_>>()?;
    // One slot size for the whole communicator, so a ring step that receives over one
    // transport and sends over another cuts its slices the same way on both. Some pair uses
    // tcp when it is forced or when the ranks span hosts (a forced shm across hosts failed above
    // for some rank's pair, and every rank computes the same).
    let hosts_differ = table.iter().any(|p| p.host_id != table[0].host_id);
    let any_tcp = match config.transport {
        Some(k) => k != TransportKind::Shm,
        None => hosts_differ,
    };
    let slot = if any_tcp { config.tcp_slot_size } else { config.shm_slot_size };
    let nslots = config.fifo_slots;
    let deadline = Instant::now() + config.timeout;
    // More ranks on this host than cores to run them: shm waits must yield, not spin.
    let (local, cores) = crate::bootstrap::host_share(table, me);
    let shm_patience = if local > cores { Patience::Share } else { Patience::Eager };
    if !config.runtime_connect {
        eager_fits(table, me, &kinds)?;
    }
    let lazy = connect::Lazy::new(
        config,
        comm_id,
        *secret,
        me,
        table.iter().map(|p| p.pid).collect(),
        table.iter().map(|p| p.probe_addr).collect(),
        kinds.clone(),
        slot,
        shm_patience,
    );

    // tcp: lower ranks connect to higher ranks, nsocks sockets each.
    let tcp_lower: Vec<usize> = (0..me).filter(|&p| kinds[p] == Some(TransportKind::Tcp)).collect();
    let expected = tcp_lower.len() * config.nsocks;
    // No thread for a rank that no lower rank dials (one host: every rank, lazily connected).
    let acceptor = if expected > 0 {
        let wait = Wait { deadline, timeout: config.timeout };
        Some(spawn_acceptor(listener, &tcp_lower, *secret, comm_id, me, n, config.nsocks, wait)?)
    } else {
        None
    };
    let mut socks: Vec<Vec<Option<TcpStream>>> = (0..n).map(|_| (0..config.nsocks).map(|_| None).collect()).collect();
    for p in me + 1..n {
        if kinds[p] != Some(TransportKind::Tcp) {
            continue;
        }
        for (k, slot) in socks[p].iter_mut().enumerate() {
            *slot = Some(dial(&table[p], secret, comm_id, me, k, deadline)?);
        }
    }
    if let Some(acceptor) = acceptor {
        for (p, k, s) in acceptor.recv().map_err(|_| Error::internal("tcp acceptor thread vanished"))?? {
            socks[p][k] = Some(s);
        }
    }

    let mut peers: Vec<Option<Peer>> = (0..n).map(|_| None).collect();
    let mut links = Vec::new();
    for p in 0..n {
        match kinds[p] {
            Some(TransportKind::Shm) if !config.runtime_connect => peers[p] = Some(lazy.connect(p)?),
            Some(TransportKind::Tcp) => {
                let s: Vec<TcpStream> = socks[p].iter_mut().filter_map(Option::take).collect();
                if s.len() != config.nsocks {
                    return Err(Error::internal(format!("tcp sockets for rank {p} missing")));
                }
                let (link, send, recv) = tcp::TcpLink::start(p, s, nslots, slot, config.timeout, prof.clone())?;
                links.push(link.clone());
                peers[p] = Some(Peer { send, recv, liveness: Liveness::Local, tcp: Some(link), shm_names: Vec::new() });
            }
            // `ib::probe` offers ib to no peer until the data path exists.
            Some(TransportKind::Ib) => {
                return Err(Error::internal(format!("ib selected for rank {p}, but occl has no ib data path")))
            }
            Some(TransportKind::Shm) | None => {}
        }
    }
    Ok(Connected { peers, net: (!links.is_empty()).then(|| tcp::Net::new(links)), slot, lazy })
}

/// With `OCCL_RUNTIME_CONNECT=0`, the thread ranks of one process map one FIFO per ordered
/// pair: past the kernel's map limit thread creation itself fails and the process aborts, so
/// refuse first, naming the way out.
fn eager_fits(table: &[PeerInfo], me: usize, kinds: &[Option<TransportKind>]) -> Result<()> {
    let local = (0..table.len())
        .filter(|&p| p == me || (table[p].pid == table[me].pid && kinds[p] == Some(TransportKind::Shm)))
        .count();
    let maps = local * local.saturating_sub(1);
    let limit: usize = occl_events::files::read_to_string_capped(
        std::path::Path::new("/proc/sys/vm/max_map_count"),
        occl_events::files::MAX_SYSTEM_FILE,
    )
    .ok()
    .and_then(|s| s.trim().parse().ok())
    .unwrap_or(65530);
    if maps > limit / 2 {
        return Err(Error::usage(format!(
            "OCCL_RUNTIME_CONNECT=0 with {local} ranks in one process needs {maps} shared-memory FIFOs, \
             more than half of vm.max_map_count={limit}; leave OCCL_RUNTIME_CONNECT at 1 (peers connect on first use)"
        )));
    }
    Ok(())
}

/// What `connect_all` leaves a rank with.
pub(crate) struct Connected {
    pub peers: Vec<Option<Peer>>,
    pub net: Option<tcp::Net>,
    pub slot: usize,
    pub lazy: connect::Lazy,
}

const HELLO_MAGIC: u64 = 0x4f43_434c_5443_5048; // "OCCLTCPH"

fn dial(to: &PeerInfo, secret: &[u8; 16], comm_id: u64, me: usize, k: usize, deadline: Instant) -> Result<TcpStream> {
    let ctx = |what: &str| format!("tcp transport: {what} rank {} at {}", to.rank, to.listen);
    let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
    let mut s = TcpStream::connect_timeout(&to.listen, left).map_err(|e| Error::sys(ctx("connect to"), e))?;
    auth::client(&mut s, secret)?;
    let mut w = wire::Writer::default();
    w.u64(HELLO_MAGIC);
    w.u64(comm_id);
    w.u32(me as u32);
    w.u32(k as u32);
    wire::send(&mut s, &w.into_inner())?;
    Ok(s)
}

type Accepted = Result<Vec<(usize, usize, TcpStream)>>;

/// When a wait of init gives up: the instant, and the `OCCL_TIMEOUT` it came from (for the
/// message).
#[derive(Clone, Copy)]
struct Wait {
    deadline: Instant,
    timeout: Duration,
}

/// Accepts `nsocks` connections from each rank of `lower` on a thread of its own (so dialing
/// higher ranks cannot deadlock against them). Strangers are refused, logged and not counted.
#[allow(clippy::too_many_arguments)]
fn spawn_acceptor(
    listener: TcpListener,
    lower: &[usize],
    secret: [u8; 16],
    comm_id: u64,
    me: usize,
    n: usize,
    nsocks: usize,
    wait: Wait,
) -> Result<mpsc::Receiver<Accepted>> {
    let (tx, rx) = mpsc::channel();
    let lower = lower.to_vec();
    let expected = lower.len() * nsocks;
    listener.set_nonblocking(true).map_err(|e| Error::sys("tcp transport: listener non-blocking", e))?;
    std::thread::Builder::new()
        .name("occl-tcp-accept".into())
        .spawn(move || {
            let mut got: Vec<(usize, usize, TcpStream)> = Vec::new();
            let res = loop {
                if got.len() == expected {
                    break Ok(std::mem::take(&mut got));
                }
                if Instant::now() >= wait.deadline {
                    let missing: Vec<usize> = lower
                        .iter()
                        .copied()
                        .filter(|&p| got.iter().filter(|(q, _, _)| *q == p).count() < nsocks)
                        .collect();
                    break Err(Error::Timeout {
                        what: format!(
                            "rank {me} waiting for {} of its {expected} tcp connections from lower ranks (from rank(s) \
                             {missing:?}; are they alive, reachable at this rank's address, and set up alike?)",
                            expected - got.len()
                        ),
                        secs: wait.timeout.as_secs_f64(),
                    });
                }
                match listener.accept() {
                    Ok((mut s, from)) => {
                        let _ = s.set_nonblocking(false);
                        if let Err(e) = auth::server(&mut s, &secret) {
                            tracing::warn!("tcp transport: refused a connection from {from}: {e}");
                            continue;
                        }
                        match read_hello(&mut s, comm_id, me, n, nsocks) {
                            Ok((p, k)) if !got.iter().any(|(q, j, _)| *q == p && *j == k) => got.push((p, k, s)),
                            Ok((p, k)) => {
                                tracing::warn!("tcp transport: duplicate connection {k} from rank {p}; dropped")
                            }
                            Err(e) => tracing::warn!("tcp transport: refused a connection from {from}: {e}"),
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(1))
                    }
                    Err(e) => break Err(Error::sys("tcp transport: accept", e)),
                }
            };
            let _ = tx.send(res);
        })
        .map_err(|e| Error::sys("spawn tcp acceptor thread", e))?;
    Ok(rx)
}

fn read_hello(s: &mut TcpStream, comm_id: u64, me: usize, n: usize, nsocks: usize) -> Result<(usize, usize)> {
    s.set_read_timeout(Some(Duration::from_secs(10))).map_err(|e| Error::sys("set timeout", e))?;
    let f = wire::recv(s)?;
    let mut r = wire::Reader::new(&f);
    let (magic, id, from, k) = (r.u64()?, r.u64()?, r.u32()? as usize, r.u32()? as usize);
    r.finish()?;
    s.set_read_timeout(None).map_err(|e| Error::sys("set timeout", e))?;
    if magic != HELLO_MAGIC || id != comm_id {
        return Err(Error::usage("hello for a different communicator"));
    }
    if from >= me || from >= n || k >= nsocks {
        return Err(Error::usage(format!("hello from rank {from} socket {k} is out of range")));
    }
    Ok((from, k))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    fn peer(rank: usize, host: &str, ib: bool) -> PeerInfo {
        PeerInfo {
            rank,
            host_id: host.into(),
            hostname: format!("node-{host}"),
            pid: 100 + rank as u32,
            listen: "127.0.0.1:1".parse().expect("addr"),
            comm_id: 7,
            probe_addr: 0,
            ras_addr: String::new(),
            settings: vec![("OCCL_NSOCKS".into(), "2".into())],
            ib,
            cpus: crate::topo::CpuSet::parse_list("0-3,8").expect("cpus"),
            cpu_quota: 2,
        }
    }

    #[test]
    fn peer_info_carries_the_ib_offer_and_the_cpus() {
        for ib in [false, true] {
            let p = peer(3, "a", ib);
            assert_eq!(PeerInfo::decode(&p.encode()).expect("round trip"), p);
        }
        // After ib: the cpu list ("0-3,8", length-prefixed) and the quota.
        let tail = 4 + "0-3,8".len() + 4;
        let mut b = peer(0, "a", true).encode();
        let at = b.len() - tail - 4;
        b[at] = 2;
        assert!(PeerInfo::decode(&b).is_err(), "ib must be 0 or 1");
        let mut b = peer(0, "a", true).encode();
        let at = b.len() - 4 - "0-3,8".len();
        b[at] = b'x';
        let e = PeerInfo::decode(&b).unwrap_err();
        assert!(e.to_string().contains("malformed cpu set"), "{e}");
    }

    /// Lower ranks that never dial: the timeout names them and the real OCCL_TIMEOUT.
    #[test]
    fn the_acceptor_timeout_names_the_missing_ranks_and_the_timeout() {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let timeout = Duration::from_millis(300);
        let wait = Wait { deadline: Instant::now() + timeout, timeout };
        let rx = spawn_acceptor(listener, &[0, 2], [0; 16], 7, 3, 4, 2, wait).expect("spawn");
        let e = rx.recv_timeout(Duration::from_secs(10)).expect("the acceptor answers").expect_err("nobody dialed");
        assert_eq!(e.kind(), ErrorKind::Timeout);
        let text = e.to_string();
        assert!(text.contains("4 of its 4 tcp connections") && text.contains("[0, 2]"), "{text}");
        assert!(text.contains("within 0.3 s"), "{text}");
    }

    #[test]
    fn automatic_selection_uses_ib_only_across_hosts_with_devices_on_both_ends() {
        let auto = Config::default();
        let (a0, a1, b_ib, b_no) = (peer(0, "a", true), peer(1, "a", true), peer(2, "b", true), peer(3, "b", false));
        assert_eq!(select(&auto, &a0, &a1).expect("same host"), TransportKind::Shm);
        assert_eq!(select(&auto, &a0, &b_ib).expect("both have ib"), TransportKind::Ib);
        assert_eq!(select(&auto, &b_ib, &a0).expect("symmetric"), TransportKind::Ib);
        assert_eq!(select(&auto, &a0, &b_no).expect("one lacks ib"), TransportKind::Tcp);
        assert_eq!(select(&auto, &peer(0, "a", false), &peer(1, "b", false)).expect("none"), TransportKind::Tcp);
    }

    #[test]
    fn forced_transports_override_and_a_forced_ib_names_the_rank_without_a_device() {
        let ib = Config { transport: Some(TransportKind::Ib), ..Config::default() };
        assert_eq!(select(&ib, &peer(0, "a", true), &peer(1, "a", true)).expect("loopback ib"), TransportKind::Ib);
        let e = select(&ib, &peer(0, "a", true), &peer(1, "b", false)).expect_err("peer has none");
        assert_eq!(e.kind(), ErrorKind::InvalidUsage);
        assert!(e.to_string().contains("rank 1 on host node-b has no usable RDMA device"), "{e}");
        let e = select(&ib, &peer(0, "a", false), &peer(1, "b", true)).expect_err("I have none");
        assert!(e.to_string().contains("rank 0 on host node-a"), "{e}");
        let tcp = Config { transport: Some(TransportKind::Tcp), ..Config::default() };
        assert_eq!(select(&tcp, &peer(0, "a", true), &peer(1, "b", true)).expect("forced"), TransportKind::Tcp);
    }
}
