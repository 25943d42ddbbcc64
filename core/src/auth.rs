//! Mutual challenge-response over a fresh TCP connection: each side proves it knows the job
//! secret without sending it. The MAC is SipHash-2-4 with the 128-bit secret as key (a keyed
//! PRF), over a role label and both nonces, so a reply can be neither replayed nor reflected.

use crate::error::{Error, Result};
use siphasher::sip128::{Hasher128, SipHasher24};
use std::hash::Hasher;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

const MAGIC: &[u8; 8] = b"OCCLAUTH";
/// How long a handshake may take; a stranger that connects and says nothing is dropped after it.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

fn mac(secret: &[u8; 16], label: u8, first: &[u8; 16], second: &[u8; 16]) -> [u8; 16] {
    let mut h = SipHasher24::new_with_key(secret);
    h.write(&[label]);
    h.write(first);
    h.write(second);
    h.finish128().as_bytes()
}

/// A name only holders of the job secret can compute: a keyed PRF of `label` and `parts`, as 32
/// hex digits. Shared-memory segments are named with it, so another local user can neither
/// guess a job's segment names to create them first nor find one before it exists.
pub(crate) fn secret_tag(secret: &[u8; 16], label: &[u8], parts: &[u64]) -> String {
    let mut h = SipHasher24::new_with_key(secret);
    h.write(label);
    for p in parts {
        h.write(&p.to_le_bytes());
    }
    format!("{:032x}", h.finish128().as_u128())
}

fn ct_eq(a: &[u8; 16], b: &[u8; 16]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn io(what: &str) -> impl Fn(std::io::Error) -> Error + '_ {
    move |e| Error::sys(format!("authentication: {what}"), e)
}

/// The connecting side. Fails with `RemoteError`-free `SystemError`s on I/O and `InvalidUsage`
/// when the other side does not know the secret.
pub(crate) fn client(stream: &mut TcpStream, secret: &[u8; 16]) -> Result<()> {
    let old = stream.read_timeout().ok().flatten();
    stream.set_read_timeout(Some(HANDSHAKE_TIMEOUT)).map_err(io("set timeout"))?;
    let nonce_c = crate::id::random_bytes()?;
    let mut hello = [0u8; 24];
    hello[..8].copy_from_slice(MAGIC);
    hello[8..].copy_from_slice(&nonce_c);
    stream.write_all(&hello).map_err(io("send hello"))?;
    let mut reply = [0u8; 40];
    stream.read_exact(&mut reply).map_err(io("read server proof"))?;
    if &reply[..8] != MAGIC {
        return Err(Error::usage("authentication: the peer does not speak occl's bootstrap protocol"));
    }
    let nonce_s: [u8; 16] = reply[8..24].try_into().map_err(|_| Error::internal("nonce size"))?;
    let proof: [u8; 16] = reply[24..40].try_into().map_err(|_| Error::internal("proof size"))?;
    if !ct_eq(&proof, &mac(secret, b'S', &nonce_c, &nonce_s)) {
        // Hang up now, so the other side learns at once rather than after its timeout.
        let _ = stream.shutdown(std::net::Shutdown::Both);
        return Err(Error::usage(
            "authentication: the peer does not know this job's secret (a different job, or a stale unique id)",
        ));
    }
    stream.write_all(&mac(secret, b'C', &nonce_s, &nonce_c)).map_err(io("send client proof"))?;
    let mut ok = [0u8; 1];
    stream.read_exact(&mut ok).map_err(io("read verdict"))?;
    if ok[0] != 1 {
        return Err(Error::usage("authentication: the peer refused this rank's proof of the job secret"));
    }
    stream.set_read_timeout(old).map_err(io("restore timeout"))?;
    Ok(())
}

/// The accepting side. On a wrong proof it answers "refused", logs the stranger and fails.
pub(crate) fn server(stream: &mut TcpStream, secret: &[u8; 16]) -> Result<()> {
    server_within(stream, secret, HANDSHAKE_TIMEOUT)
}

/// As `server`, waiting at most `limit` for each message: an acceptor that handshakes on its
/// own thread, one connection after another, is held up by a silent stranger only that long.
pub(crate) fn server_within(stream: &mut TcpStream, secret: &[u8; 16], limit: Duration) -> Result<()> {
    let old = stream.read_timeout().ok().flatten();
    stream.set_read_timeout(Some(limit)).map_err(io("set timeout"))?;
    let mut hello = [0u8; 24];
    // The magic first: a stranger speaking another protocol is refused as soon as it is seen.
    stream.read_exact(&mut hello[..8]).map_err(io("read hello"))?;
    if &hello[..8] != MAGIC {
        return Err(Error::usage("authentication: a connection that does not speak occl's protocol"));
    }
    stream.read_exact(&mut hello[8..]).map_err(io("read hello"))?;
    let nonce_c: [u8; 16] = hello[8..].try_into().map_err(|_| Error::internal("nonce size"))?;
    let nonce_s = crate::id::random_bytes()?;
    let mut reply = [0u8; 40];
    reply[..8].copy_from_slice(MAGIC);
    reply[8..24].copy_from_slice(&nonce_s);
    reply[24..].copy_from_slice(&mac(secret, b'S', &nonce_c, &nonce_s));
    stream.write_all(&reply).map_err(io("send proof"))?;
    let mut proof = [0u8; 16];
    stream.read_exact(&mut proof).map_err(|e| match e.kind() {
        // A client that hangs up on our proof found that we do not share its secret.
        std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::ConnectionReset => {
            Error::usage("authentication: the peer rejected this side's proof (it has a different job secret)")
        }
        _ => Error::sys("authentication: read client proof", e),
    })?;
    let good = ct_eq(&proof, &mac(secret, b'C', &nonce_s, &nonce_c));
    stream.write_all(&[good as u8]).map_err(io("send verdict"))?;
    if !good {
        return Err(Error::usage("authentication: a connection that does not know the job secret"));
    }
    stream.set_read_timeout(old).map_err(io("restore timeout"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    fn pair(client_secret: [u8; 16], server_secret: [u8; 16]) -> (Result<()>, Result<()>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let t = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            server(&mut s, &server_secret)
        });
        let mut c = TcpStream::connect(addr).unwrap();
        let rc = client(&mut c, &client_secret);
        (rc, t.join().unwrap())
    }

    #[test]
    fn same_secret_passes_both_ways() {
        let (c, s) = pair([7; 16], [7; 16]);
        c.unwrap();
        s.unwrap();
    }

    #[test]
    fn secret_tags_depend_on_every_input() {
        let t = secret_tag(&[7; 16], b"fifo", &[1, 2, 3]);
        assert_eq!(t.len(), 32);
        assert!(t.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_eq!(t, secret_tag(&[7; 16], b"fifo", &[1, 2, 3]));
        assert_ne!(t, secret_tag(&[8; 16], b"fifo", &[1, 2, 3]));
        assert_ne!(t, secret_tag(&[7; 16], b"fifx", &[1, 2, 3]));
        assert_ne!(t, secret_tag(&[7; 16], b"fifo", &[1, 2, 4]));
    }

    #[test]
    fn wrong_secret_is_refused_on_both_sides() {
        let (c, s) = pair([7; 16], [8; 16]);
        assert_eq!(c.unwrap_err().kind(), crate::ErrorKind::InvalidUsage);
        assert_eq!(s.unwrap_err().kind(), crate::ErrorKind::InvalidUsage);
    }
}
