//! The bootstrap root: accepts the job's ranks, checks each one's proof of the secret and its
//! join (same rank count, a rank in range and not taken), then serves all-gather rounds until
//! every rank has said goodbye. Strangers are refused and logged; they never reach a round.

use super::wire::{self, Reader, Writer};
use crate::auth;
use crate::error::{Error, Result};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Binds `addr` and serves one job from a background thread; returns the bound address.
pub(crate) fn spawn(addr: SocketAddr, secret: [u8; 16]) -> Result<SocketAddr> {
    let listener = TcpListener::bind(addr).map_err(|e| Error::sys(format!("bootstrap root: bind {addr}"), e))?;
    let bound = listener.local_addr().map_err(|e| Error::sys("bootstrap root: local address", e))?;
    std::thread::Builder::new()
        .name("occl-bootstrap-root".into())
        .spawn(move || {
            if let Err(e) = serve(listener, secret, None) {
                tracing::warn!("bootstrap root at {bound} stopped: {e}");
            }
        })
        .map_err(|e| Error::sys("bootstrap root: spawn thread", e))?;
    Ok(bound)
}

/// Serves one job on a listener that is already bound and known to the ranks (a rank's
/// transport listener, for a shrink), from a background thread; it stops waiting for joins
/// after `limit`.
pub(crate) fn spawn_on(listener: TcpListener, secret: [u8; 16], limit: Duration) -> Result<()> {
    let deadline = Instant::now() + limit;
    std::thread::Builder::new()
        .name("occl-bootstrap-root".into())
        .spawn(move || {
            if let Err(e) = serve(listener, secret, Some(deadline)) {
                tracing::warn!("bootstrap root (shrink) stopped: {e}");
            }
        })
        .map_err(|e| Error::sys("bootstrap root: spawn thread", e))?;
    Ok(())
}

struct Joined {
    stream: TcpStream,
    nranks: usize,
    rank: usize,
}

fn reject(mut s: TcpStream, why: &str) {
    let mut w = Writer::default();
    w.u8(wire::ERROR);
    w.str(why);
    let _ = wire::send(&mut s, &w.into_inner());
}

/// Authenticates and reads the join of one connection (on its own thread so that a stranger
/// that connects and stays silent cannot hold up the others).
fn admit(mut s: TcpStream, secret: [u8; 16], peer: SocketAddr) -> Option<Joined> {
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
    let mut r = Reader::new(&frame);
    match (r.u8(), r.u32(), r.u32(), r.finish()) {
        (Ok(wire::JOIN), Ok(n), Ok(rank), Ok(())) => {
            let _ = s.set_read_timeout(None);
            Some(Joined { stream: s, nranks: n as usize, rank: rank as usize })
        }
        _ => {
            tracing::warn!("bootstrap root: malformed join from {peer}");
            reject(s, "malformed join message");
            None
        }
    }
}

fn serve(listener: TcpListener, secret: [u8; 16], deadline: Option<Instant>) -> Result<()> {
    let (tx, rx) = mpsc::channel::<Joined>();
    // The acceptor runs until the job is complete; then the listener is closed by dropping it
    // together with this thread's handle on it (a non-blocking accept loop polls for that).
    listener.set_nonblocking(true).map_err(|e| Error::sys("bootstrap root: set non-blocking", e))?;
    let mut slots: Vec<Option<TcpStream>> = Vec::new();
    let mut nranks = 0usize;
    let mut joined = 0usize;
    while nranks == 0 || joined < nranks {
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(Error::Timeout {
                what: format!("waiting for ranks to join ({joined} of {nranks} did)"),
                secs: 0.0,
            });
        }
        match listener.accept() {
            Ok((s, peer)) => {
                let _ = s.set_nonblocking(false);
                let tx = tx.clone();
                let _ = std::thread::Builder::new().name("occl-bootstrap-admit".into()).spawn(move || {
                    if let Some(j) = admit(s, secret, peer) {
                        let _ = tx.send(j);
                    }
                });
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => tracing::warn!("bootstrap root: accept failed: {e}"),
        }
        while let Ok(j) = rx.recv_timeout(Duration::from_millis(2)) {
            if nranks == 0 {
                if j.nranks == 0 {
                    reject(j.stream, "nranks must be at least 1");
                    continue;
                }
                nranks = j.nranks;
                slots = (0..nranks).map(|_| None).collect();
            }
            if j.nranks != nranks {
                let why = format!("this rank says nranks={} but the job has nranks={nranks}", j.nranks);
                tracing::warn!("bootstrap root: refused rank {}: {why}", j.rank);
                reject(j.stream, &why);
            } else if j.rank >= nranks {
                let why = format!("rank {} is out of range for nranks={nranks}", j.rank);
                tracing::warn!("bootstrap root: {why}");
                reject(j.stream, &why);
            } else if slots[j.rank].is_some() {
                let why = format!("rank {} joined twice", j.rank);
                tracing::warn!("bootstrap root: {why}");
                reject(j.stream, &why);
            } else {
                slots[j.rank] = Some(j.stream);
                joined += 1;
            }
        }
    }
    drop(listener);
    let mut streams: Vec<TcpStream> = slots.into_iter().flatten().collect();
    tracing::debug!("bootstrap root: all {nranks} ranks joined");
    rounds(&mut streams)
}

/// All-gather rounds: read one frame from every rank, answer each with all of them. Ends when
/// every rank said goodbye; a rank that vanishes mid-round fails the round for the others.
fn rounds(streams: &mut [TcpStream]) -> Result<()> {
    let n = streams.len();
    loop {
        let mut parts: Vec<Vec<u8>> = Vec::with_capacity(n);
        let mut gone = Vec::new();
        for (rank, s) in streams.iter_mut().enumerate() {
            match wire::recv(s) {
                Ok(f) => {
                    let mut r = Reader::new(&f);
                    match r.u8() {
                        Ok(wire::GATHER) => match r.bytes() {
                            Ok(b) => parts.push(b.to_vec()),
                            Err(_) => gone.push((rank, "malformed gather".to_string())),
                        },
                        Ok(wire::BYE) => gone.push((rank, "left".to_string())),
                        _ => gone.push((rank, "unexpected frame".to_string())),
                    }
                }
                Err(e) => gone.push((rank, e.to_string())),
            }
        }
        if gone.len() == n {
            return Ok(());
        }
        if let Some((rank, why)) = gone.first() {
            let msg = format!("rank {rank} left the bootstrap ({why}) while others waited in a round");
            for s in streams.iter_mut() {
                let mut w = Writer::default();
                w.u8(wire::ERROR);
                w.str(&msg);
                let _ = wire::send(s, &w.into_inner());
            }
            return Err(Error::remote(*rank, msg));
        }
        let mut w = Writer::default();
        w.u8(wire::RESULT);
        w.u32(n as u32);
        for p in &parts {
            w.bytes(p);
        }
        let frame = w.into_inner();
        for s in streams.iter_mut() {
            wire::send(s, &frame)?;
        }
    }
}
