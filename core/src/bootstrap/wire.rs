//! Length-prefixed frames on bootstrap sockets, and a bounds-checked reader for their contents.
//! A frame is a little-endian u32 length and that many bytes; lengths over `MAX_FRAME` are
//! refused before anything is allocated.

use crate::error::{Error, Result};
use std::io::{Read, Write};

pub(crate) const MAX_FRAME: usize = 16 << 20;

pub(crate) const JOIN: u8 = 1;
pub(crate) const GATHER: u8 = 2;
pub(crate) const ERROR: u8 = 4;
/// A join for scalable init: also which of m ids and the next root's id.
pub(crate) const JOIN_MULTI: u8 = 6;
/// A root's hello to the next root of the ring of roots.
pub(crate) const ROOT_PEER: u8 = 7;
/// The root's answer to a join: the tree address of the rank's parent.
pub(crate) const PARENT: u8 = 8;

/// `payload` with its length prefix: one frame.
pub(crate) fn frame(payload: &[u8]) -> Vec<u8> {
    let mut buf = Vec::with_capacity(4 + payload.len());
    buf.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    buf.extend_from_slice(payload);
    buf
}

pub(crate) fn send(s: &mut impl Write, payload: &[u8]) -> Result<()> {
    if payload.len() > MAX_FRAME {
        return Err(Error::internal(format!("bootstrap frame of {} bytes exceeds the limit", payload.len())));
    }
    s.write_all(&frame(payload)).map_err(|e| Error::sys("bootstrap: send", e))
}

/// A frame's announced length, refused over the limit before anything waits for that many bytes.
fn announced(prefix: [u8; 4]) -> Result<usize> {
    let len = u32::from_le_bytes(prefix) as usize;
    if len > MAX_FRAME {
        return Err(Error::internal(format!("bootstrap: a peer announced a {len}-byte frame (limit {MAX_FRAME})")));
    }
    Ok(len)
}

/// The whole frame at the front of `buf` (bytes read from a non-blocking socket), if one is
/// there, and its length with the prefix.
pub(crate) fn frame_at(buf: &[u8]) -> Result<Option<(&[u8], usize)>> {
    let Some(&[a, b, c, d]) = buf.get(..4) else { return Ok(None) };
    let len = announced([a, b, c, d])?;
    Ok(buf.get(4..4 + len).map(|f| (f, 4 + len)))
}

pub(crate) fn recv(s: &mut impl Read) -> Result<Vec<u8>> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len).map_err(|e| Error::sys("bootstrap: receive", e))?;
    let len = announced(len)?;
    let mut buf = vec![0u8; len];
    s.read_exact(&mut buf).map_err(|e| Error::sys("bootstrap: receive", e))?;
    Ok(buf)
}

#[derive(Default)]
pub(crate) struct Writer(Vec<u8>);

impl Writer {
    pub fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    pub fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    pub fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    pub fn bytes(&mut self, b: &[u8]) {
        self.u32(b.len() as u32);
        self.0.extend_from_slice(b);
    }
    pub fn str(&mut self, s: &str) {
        self.bytes(s.as_bytes());
    }
    pub fn into_inner(self) -> Vec<u8> {
        self.0
    }
}

pub(crate) struct Reader<'a> {
    b: &'a [u8],
}

impl<'a> Reader<'a> {
    pub fn new(b: &'a [u8]) -> Self {
        Reader { b }
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if self.b.len() < n {
            return Err(Error::internal("bootstrap: truncated message from a peer"));
        }
        let (h, t) = self.b.split_at(n);
        self.b = t;
        Ok(h)
    }
    pub fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }
    pub fn u32(&mut self) -> Result<u32> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    pub fn u64(&mut self) -> Result<u64> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }
    pub fn bytes(&mut self) -> Result<&'a [u8]> {
        let n = self.u32()? as usize;
        self.take(n)
    }
    pub fn str(&mut self) -> Result<String> {
        let b = self.bytes()?;
        String::from_utf8(b.to_vec()).map_err(|_| Error::internal("bootstrap: a peer sent a non-UTF-8 string"))
    }
    pub fn finish(&self) -> Result<()> {
        if self.b.is_empty() {
            Ok(())
        } else {
            Err(Error::internal("bootstrap: trailing bytes in a message from a peer"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_oversize_is_refused() {
        let mut buf = Vec::new();
        send(&mut buf, b"hello").unwrap();
        assert_eq!(recv(&mut &buf[..]).unwrap(), b"hello");
        let mut huge = (MAX_FRAME as u32 + 1).to_le_bytes().to_vec();
        huge.extend_from_slice(&[0; 16]);
        assert_eq!(recv(&mut &huge[..]).unwrap_err().kind(), crate::ErrorKind::InternalError);
        let trunc = [10u8, 0, 0, 0, 1, 2];
        assert_eq!(recv(&mut &trunc[..]).unwrap_err().kind(), crate::ErrorKind::SystemError);
    }

    #[test]
    fn reader_rejects_truncated_fields() {
        let mut w = Writer::default();
        w.str("abc");
        let b = w.into_inner();
        assert_eq!(Reader::new(&b).str().unwrap(), "abc");
        assert!(Reader::new(&b[..5]).str().is_err());
        assert!(Reader::new(&[0xff, 0xff, 0xff, 0xff]).bytes().is_err());
    }
}
