//! `UniqueId`: where the bootstrap root listens and the job's secret. Like NCCL's
//! `ncclUniqueId`, one rank creates it (which starts the root) and every rank receives it out of
//! band (an environment variable, a file); unlike NCCL's it carries a 128-bit secret that every
//! connection of the job must prove it knows.

use crate::error::{Error, Result};
use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;

const PREFIX: &str = "occl1-";

/// The root address and job secret of one communicator's bootstrap.
#[derive(Clone, PartialEq, Eq)]
pub struct UniqueId {
    pub(crate) addr: SocketAddr,
    pub(crate) secret: [u8; 16],
}

// `UniqueId::new` and `new_on`, which start a root, are in `bootstrap::root`.
impl UniqueId {
    /// An id for a root that a launcher-chosen rank serves at a well-known address (torchrun's
    /// `MASTER_ADDR`), with a secret all ranks derive the same way. Does not start the root.
    pub(crate) fn at(addr: SocketAddr, secret: [u8; 16]) -> UniqueId {
        UniqueId { addr, secret }
    }

    /// The root's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

/// 16 bytes from the kernel's CSPRNG.
pub(crate) fn random_bytes() -> Result<[u8; 16]> {
    let mut b = [0u8; 16];
    let mut got = 0;
    while got < b.len() {
        // SAFETY: writes at most len-got bytes into the live array.
        let n = unsafe { libc::getrandom(b[got..].as_mut_ptr().cast(), b.len() - got, 0) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(Error::sys("getrandom for the job secret", e));
        }
        got += n as usize;
    }
    Ok(b)
}

impl fmt::Display for UniqueId {
    /// `occl1-<32 hex digits of secret>@<address>`, e.g. `occl1-00ff…@127.0.0.1:41000`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(PREFIX)?;
        for b in self.secret {
            write!(f, "{b:02x}")?;
        }
        write!(f, "@{}", self.addr)
    }
}

impl fmt::Debug for UniqueId {
    /// Never prints the secret.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "UniqueId({}, secret: <hidden>)", self.addr)
    }
}

impl FromStr for UniqueId {
    type Err = Error;

    fn from_str(s: &str) -> Result<UniqueId> {
        let bad = |why: &str| {
            Error::arg(format!("unique id {s:?} is malformed ({why}); expected occl1-<32 hex digits>@<ip>:<port>"))
        };
        let rest = s.trim().strip_prefix(PREFIX).ok_or_else(|| bad("missing occl1- prefix"))?;
        let (hex, addr) = rest.split_once('@').ok_or_else(|| bad("missing @"))?;
        if hex.len() != 32 || !hex.bytes().all(|c| c.is_ascii_hexdigit()) {
            return Err(bad("the secret is not 32 hex digits"));
        }
        let mut secret = [0u8; 16];
        for (i, b) in secret.iter_mut().enumerate() {
            *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).map_err(|_| bad("bad hex"))?;
        }
        let addr: SocketAddr = addr.parse().map_err(|_| bad("bad address"))?;
        Ok(UniqueId { addr, secret })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_round_trip_and_errors() {
        let id = UniqueId::at("127.0.0.1:4000".parse().unwrap(), [0xab; 16]);
        let s = id.to_string();
        assert_eq!(s, format!("occl1-{}@127.0.0.1:4000", "ab".repeat(16)));
        assert_eq!(s.parse::<UniqueId>().unwrap(), id);
        let v6 = UniqueId::at("[::1]:9".parse().unwrap(), [1; 16]);
        assert_eq!(v6.to_string().parse::<UniqueId>().unwrap(), v6);
        assert!(!format!("{id:?}").contains("abab"), "Debug must hide the secret");
        for bad in ["", "occl1-xyz@1.2.3.4:5", "occl2-00@1.2.3.4:5", &s.replace('@', "#")] {
            let e = bad.parse::<UniqueId>().unwrap_err();
            assert_eq!(e.kind(), crate::ErrorKind::InvalidArgument, "{bad}");
        }
    }
}
