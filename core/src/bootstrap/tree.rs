//! The bootstrap tree: after the root phase every rank holds a link to its parent and one from
//! each child (`gather.rs` says which), and all later bootstrap all-gathers run over them. No
//! process carries more than three links, and the n² bytes of a peer table no longer leave one
//! root: each rank forwards the table to at most two children.
//!
//! Links are plain TCP. The dialing side (the child) proves the job secret (`auth`) and says
//! which rank it is; the accepting side takes only its own children and logs anyone else.

use super::gather::{self, Round};
use super::wire::{self, Reader, Writer};
use crate::auth;
use crate::error::{Error, Result};
use crate::wait::poll;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

const HELLO: u8 = 11;

/// How long the acceptor waits on each message of a connection before dropping it: half the
/// dialing side's own limit, and long enough for a real child on a crowded machine (1,024 thread
/// ranks on two cores).
const PATIENCE: Duration = Duration::from_secs(5);

/// How long linking into the tree may take before a missing neighbour is taken for gone.
const LINK_LIMIT: Duration = Duration::from_secs(30);

pub(crate) struct Tree {
    rank: usize,
    /// The rank at the other end of each link, and the link: the parent first, then children.
    peers: Vec<usize>,
    links: Vec<TcpStream>,
    /// Bytes read from each link and not yet handled: they may begin the next round.
    inbuf: Vec<Vec<u8>>,
    /// Where reads land, kept between rounds (a fresh buffer per round faults in new pages).
    readbuf: Box<[u8]>,
    nranks: usize,
    round: u32,
    timeout: Duration,
    /// Set by the first failure; the tree is not used again after it.
    broken: Option<String>,
}

fn hello(rank: usize, nranks: usize) -> Vec<u8> {
    let mut w = Writer::default();
    w.u8(HELLO);
    w.u32(nranks as u32);
    w.u32(rank as u32);
    w.into_inner()
}

/// Dials the parent's listener, retrying other failures until `deadline`. Every rank bound its
/// listener before it joined the root, so a refused connection means the parent is gone.
fn dial(parent: SocketAddr, secret: &[u8; 16], rank: usize, nranks: usize, deadline: Instant) -> Result<TcpStream> {
    let p = gather::parent(rank).unwrap_or(0);
    let mut s = super::dial(parent, secret, deadline, &format!("parent rank {p}"), false).map_err(|e| match e {
        Error::SystemError { source, .. } if source.kind() == std::io::ErrorKind::ConnectionRefused => Error::remote(
            p,
            format!("rank {p} is not listening at {parent} for the bootstrap tree: it exited after joining"),
        ),
        e => e,
    })?;
    wire::send(&mut s, &hello(rank, nranks))?;
    Ok(s)
}

/// Accepts connections until every child's has arrived (or `deadline`); strangers and
/// connections claiming another rank are logged and dropped. Returns them in `kids`' order.
fn accept_children(
    listener: &TcpListener,
    secret: &[u8; 16],
    rank: usize,
    nranks: usize,
    kids: &[usize],
    deadline: Instant,
    patience: Duration,
) -> Result<Vec<TcpStream>> {
    let secs = deadline.saturating_duration_since(Instant::now()).as_secs_f64();
    let mut got: Vec<Option<TcpStream>> = kids.iter().map(|_| None).collect();
    listener.set_nonblocking(true).map_err(|e| Error::sys("bootstrap tree: set non-blocking", e))?;
    while got.iter().any(Option::is_none) {
        let (mut s, peer) = match listener.accept() {
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    let missing: Vec<usize> =
                        kids.iter().zip(&got).filter(|(_, g)| g.is_none()).map(|(k, _)| *k).collect();
                    return Err(Error::Timeout {
                        what: format!(
                            "bootstrap tree: rank {rank} waiting for its children {missing:?} to connect (they joined \
                             the root, so they are gone or stuck)"
                        ),
                        secs,
                    });
                }
                let mut p = [libc::pollfd { fd: listener.as_raw_fd(), events: libc::POLLIN, revents: 0 }];
                poll(&mut p, left.min(Duration::from_millis(100)));
                continue;
            }
            Err(e) => return Err(Error::sys("bootstrap tree: accept", e)),
        };
        let _ = s.set_nonblocking(false);
        // Handshakes run one after another here: a silent stranger may hold up a real child
        // for this long, well inside the child's own handshake limit.
        if let Err(e) = auth::server_within(&mut s, secret, patience) {
            tracing::warn!("bootstrap tree: rank {rank} refused a connection from {peer}: {e}");
            continue;
        }
        let _ = s.set_read_timeout(Some(patience));
        let said = wire::recv(&mut s).and_then(|f| {
            let mut r = Reader::new(&f);
            let parsed = (r.u8()?, r.u32()? as usize, r.u32()? as usize);
            r.finish()?;
            Ok(parsed)
        });
        let slot = match said {
            Ok((HELLO, n, r)) if n == nranks => kids.iter().position(|&k| k == r).filter(|&i| got[i].is_none()),
            _ => None,
        };
        match slot {
            Some(i) => {
                let _ = s.set_read_timeout(None);
                s.set_nodelay(true).map_err(|e| Error::sys("bootstrap tree: set TCP_NODELAY", e))?;
                got[i] = Some(s);
            }
            None => tracing::warn!(
                "bootstrap tree: rank {rank} of {nranks} refused {peer}: it said {said:?}, expected one of ranks {kids:?}"
            ),
        }
    }
    Ok(got.into_iter().flatten().collect())
}

impl Tree {
    /// Links rank `rank` into the tree: dials `parent` (none for rank 0), then accepts its
    /// children on `listener`. A child's handshake waits until its parent is done with its own
    /// parent, so the links form in a wave down the tree, log₂(n) handshakes deep; the
    /// dependencies follow the tree, so they cannot wait in a circle.
    pub(crate) fn connect(
        listener: TcpListener,
        parent: Option<SocketAddr>,
        secret: &[u8; 16],
        rank: usize,
        nranks: usize,
        timeout: Duration,
    ) -> Result<Tree> {
        // Every rank has joined the root by now, so each is at most a scheduling delay from
        // dialing: a child that has not come after LINK_LIMIT is gone, and waiting out a long
        // OCCL_TIMEOUT would hold up the whole job.
        let deadline = Instant::now() + timeout.min(LINK_LIMIT);
        let kids = gather::children(rank, nranks);
        let up = parent.map(|p| dial(p, secret, rank, nranks, deadline)).transpose()?;
        let down = accept_children(&listener, secret, rank, nranks, &kids, deadline, PATIENCE)?;
        let links: Vec<TcpStream> = up.into_iter().chain(down).collect();
        for s in &links {
            s.set_nonblocking(true).map_err(|e| Error::sys("bootstrap tree: set non-blocking", e))?;
        }
        Ok(Tree {
            rank,
            peers: gather::links(rank, nranks),
            inbuf: vec![Vec::new(); links.len()],
            links,
            readbuf: vec![0; 64 << 10].into_boxed_slice(),
            nranks,
            round: 0,
            timeout,
            broken: None,
        })
    }

    /// Every rank's `mine`, in rank order (a collective call).
    pub(crate) fn all_gather(&mut self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        if let Some(why) = &self.broken {
            return Err(Error::usage(format!("the bootstrap tree failed earlier: {why}")));
        }
        let mut round = Round::new(self.rank, self.nranks, self.round, mine);
        self.round = self.round.wrapping_add(1);
        match self.drive(&mut round) {
            Ok(()) => round.finish(),
            Err(e) => {
                self.fail(&e, &round);
                Err(e)
            }
        }
    }

    fn drive(&mut self, round: &mut Round) -> Result<()> {
        let deadline = Instant::now() + self.timeout;
        let k = self.links.len();
        loop {
            for l in 0..k {
                // Frames already read (the previous round may have read ahead) come first.
                round.handle_bytes(l, &mut self.inbuf[l])?;
            }
            for l in 0..k {
                self.send(round, l)?;
            }
            if round.complete() && (0..k).all(|l| round.pending(l).is_empty()) {
                return Ok(());
            }
            // At most three links (a parent, two children): no allocation per wake.
            let mut fds = [libc::pollfd { fd: -1, events: 0, revents: 0 }; 3];
            for (l, fd) in fds.iter_mut().enumerate().take(k) {
                fd.fd = self.links[l].as_raw_fd();
                fd.events = if round.complete_from(l) { 0 } else { libc::POLLIN }
                    | if round.pending(l).is_empty() { 0 } else { libc::POLLOUT };
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                let waiting: Vec<usize> = (0..k)
                    .filter(|&l| !round.complete_from(l) || !round.pending(l).is_empty())
                    .map(|l| self.peers[l])
                    .collect();
                return Err(Error::Timeout {
                    what: format!("bootstrap all-gather on rank {} (waiting on ranks {waiting:?})", self.rank),
                    secs: self.timeout.as_secs_f64(),
                });
            }
            poll(&mut fds[..k], left);
            for (l, fd) in fds[..k].iter().enumerate() {
                if fd.revents == 0 {
                    continue;
                }
                if !round.complete_from(l) {
                    self.receive(round, l)?;
                } else if fd.revents & (libc::POLLHUP | libc::POLLERR) != 0 && round.owed_table(l) {
                    // A child that sent its subtree and then hung up: poll would report it
                    // at once on every turn until the table is ready to fail on.
                    return Err(gone(self.peers[l], "closed its link"));
                }
            }
        }
    }

    /// Writes what `round` has queued for link `l` until the socket would block.
    fn send(&mut self, round: &mut Round, l: usize) -> Result<()> {
        while !round.pending(l).is_empty() {
            match self.links[l].write(round.pending(l)) {
                Ok(0) => return Err(gone(self.peers[l], "closed its link")),
                Ok(n) => round.sent(l, n),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(gone(self.peers[l], &format!("dropped its link ({e})"))),
            }
        }
        Ok(())
    }

    /// Reads what link `l` has until the socket would block, handling whole frames.
    fn receive(&mut self, round: &mut Round, l: usize) -> Result<()> {
        let inbuf = &mut self.inbuf[l];
        loop {
            match self.links[l].read(&mut self.readbuf) {
                Ok(0) => {
                    // Whole frames already read (an error frame, say) still count.
                    round.handle_bytes(l, inbuf)?;
                    if round.complete_from(l) {
                        return Ok(());
                    }
                    return Err(gone(self.peers[l], "closed its link"));
                }
                Ok(n) => {
                    inbuf.extend_from_slice(&self.readbuf[..n]);
                    round.handle_bytes(l, inbuf)?;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(gone(self.peers[l], &format!("dropped its link ({e})"))),
            }
        }
    }

    /// Tells every neighbour why this rank stops (best effort, and not into a link left
    /// mid-frame), then closes the links so that they learn at once.
    fn fail(&mut self, e: &Error, round: &Round) {
        let (origin, why) = match e {
            Error::RemoteError { peer, what } => (*peer, what.clone()),
            e => (self.rank, format!("rank {}: {e}", self.rank)),
        };
        let frame = gather::error_frame(origin, &why);
        for (l, link) in self.links.iter_mut().enumerate() {
            if round.at_frame_boundary(l) {
                let _ = link.write(&frame);
            }
            let _ = link.shutdown(std::net::Shutdown::Both);
        }
        self.broken = Some(e.to_string());
    }
}

fn gone(rank: usize, how: &str) -> Error {
    Error::remote(
        rank,
        format!("rank {rank} {how} in the bootstrap tree (it failed, exited or destroyed its communicator)"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listener() -> (TcpListener, SocketAddr) {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let a = l.local_addr().expect("addr");
        (l, a)
    }

    #[test]
    fn strangers_wrong_secrets_and_wrong_ranks_are_refused_and_the_children_still_link() {
        let (l, at) = listener();
        let secret = [7u8; 16];
        let deadline = Instant::now() + Duration::from_secs(20);
        // Rank 1 of 5 has children 3 and 4.
        let h = std::thread::spawn(move || {
            let mut garbage = TcpStream::connect(at).expect("connect");
            garbage.write_all(b"GET / HTTP/1.1\r\n\r\n").expect("write");
            let _silent = TcpStream::connect(at).expect("connect");
            assert!(dial(at, &[8u8; 16], 3, 5, deadline).is_err(), "a wrong secret must be refused");
            let _wrong_rank = dial(at, &secret, 2, 5, deadline).expect("the handshake itself succeeds");
            let _wrong_size = dial(at, &secret, 3, 6, deadline).expect("the handshake itself succeeds");
            let four = dial(at, &secret, 4, 5, deadline).expect("child 4");
            let three = dial(at, &secret, 3, 5, deadline).expect("child 3");
            (three, four)
        });
        let got =
            accept_children(&l, &secret, 1, 5, &[3, 4], deadline, Duration::from_millis(500)).expect("both children");
        let (three, four) = h.join().expect("dialer");
        // In the children's order, whichever came first.
        assert_eq!(got[0].peer_addr().expect("peer"), three.local_addr().expect("local"));
        assert_eq!(got[1].peer_addr().expect("peer"), four.local_addr().expect("local"));
    }

    #[test]
    fn a_parent_that_is_gone_fails_the_dial_at_once_naming_it() {
        let (l, at) = listener();
        drop(l);
        let t0 = Instant::now();
        let e = dial(at, &[1; 16], 5, 8, Instant::now() + Duration::from_secs(30)).expect_err("nobody listens");
        assert!(matches!(e, Error::RemoteError { peer: 2, .. }), "{e}");
        assert!(t0.elapsed() < Duration::from_secs(2), "retried for {:?}", t0.elapsed());
    }

    #[test]
    fn a_child_that_never_comes_is_a_timeout_naming_it() {
        let (l, _) = listener();
        let soon = Instant::now() + Duration::from_millis(200);
        let e = accept_children(&l, &[1; 16], 0, 3, &[1, 2], soon, PATIENCE).expect_err("nobody dials");
        assert_eq!(e.kind(), crate::ErrorKind::Timeout, "{e}");
        assert!(e.to_string().contains("[1, 2]"), "{e}");
    }
}
