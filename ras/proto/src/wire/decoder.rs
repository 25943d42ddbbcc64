//! The streaming decoder: bytes in as the socket delivers them, whole messages out.

use super::codec::{read_body, Reader};
use super::{Msg, WireError, HANDSHAKE_MAX_FRAME, HEADER_LEN, MAX_FRAME, VERSION};

/// What one `push` may add beyond a whole frame: a driver that drains `next()` after every read of at most this many
/// bytes never hits [`WireError::BufferFull`].
pub const MAX_PUSH: usize = 64 * 1024;

/// The most bytes a decoder with frame limit `max_frame` ever holds.
pub(crate) fn max_buffered(max_frame: usize) -> usize {
    HEADER_LEN + max_frame + MAX_PUSH
}

/// Splits a byte stream into frames and decodes them.
///
/// Feed it with [`Decoder::push`] and drain it with [`Decoder::next`] until `Ok(None)`. After the first error it
/// returns that error forever: the stream has lost its framing and the connection must be closed.
#[derive(Debug)]
pub struct Decoder {
    buf: Vec<u8>,
    /// Start of the bytes not yet decoded.
    pos: usize,
    max_frame: usize,
    failed: Option<WireError>,
}

impl Default for Decoder {
    fn default() -> Self {
        Self::new()
    }
}

impl Decoder {
    /// A decoder with the full frame limit, [`MAX_FRAME`].
    pub fn new() -> Self {
        Self::with_max_frame(MAX_FRAME)
    }

    /// A decoder accepting frames up to `max_frame` bytes (capped at [`MAX_FRAME`]); use [`HANDSHAKE_MAX_FRAME`]
    /// until the connection is authenticated.
    pub fn with_max_frame(max_frame: usize) -> Self {
        Self { buf: Vec::new(), pos: 0, max_frame: max_frame.min(MAX_FRAME), failed: None }
    }

    /// A decoder for a connection not yet authenticated.
    pub fn handshake() -> Self {
        Self::with_max_frame(HANDSHAKE_MAX_FRAME)
    }

    /// Changes the frame limit, e.g. to [`MAX_FRAME`] once the peer has proved it knows the job secret.
    pub fn set_max_frame(&mut self, max_frame: usize) {
        self.max_frame = max_frame.min(MAX_FRAME);
    }

    /// Bytes held and not yet decoded.
    pub fn buffered(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// Adds bytes read from the socket. Fails, taking nothing, when that would hold more than a whole frame plus
    /// [`MAX_PUSH`].
    pub fn push(&mut self, data: &[u8]) -> Result<(), WireError> {
        let max = max_buffered(self.max_frame);
        if self.buffered() + data.len() > max {
            return Err(WireError::BufferFull { held: self.buffered(), more: data.len(), max });
        }
        if self.pos == self.buf.len() && self.buf.capacity() > 4 * MAX_PUSH {
            // Give back the room a large frame took once it is decoded.
            self.buf = Vec::new();
            self.pos = 0;
        } else if self.pos > 0 && (self.pos == self.buf.len() || self.pos >= MAX_PUSH) {
            self.buf.drain(..self.pos);
            self.pos = 0;
        }
        self.buf.extend_from_slice(data);
        Ok(())
    }

    /// The next whole message, `Ok(None)` when more bytes are needed. (Not an `Iterator`: an error ends the stream
    /// for good, which `Result<Option<_>>` says and `Option<Result<_>>` would not.)
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> Result<Option<Msg>, WireError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        let res = self.decode_one();
        if let Err(e) = &res {
            self.failed = Some(e.clone());
            self.buf = Vec::new();
            self.pos = 0;
        }
        res
    }

    fn decode_one(&mut self) -> Result<Option<Msg>, WireError> {
        let avail = &self.buf[self.pos..];
        let Some(header) = avail.first_chunk::<HEADER_LEN>() else {
            return Ok(None);
        };
        let len = u32::from_be_bytes(*header) as usize;
        // Checked before waiting for the body, so an oversized length is refused before anything is buffered for it.
        if len > self.max_frame {
            return Err(WireError::FrameTooLarge { len, max: self.max_frame });
        }
        if len < 2 {
            return Err(WireError::FrameTooShort { len });
        }
        let Some(&version) = avail.get(HEADER_LEN) else {
            return Ok(None);
        };
        if version != VERSION {
            return Err(WireError::Version(version));
        }
        if avail.len() < HEADER_LEN + len {
            return Ok(None);
        }
        let ty = avail[HEADER_LEN + 1];
        let body = &avail[HEADER_LEN + 2..HEADER_LEN + len];
        let msg = read_body(ty, &mut Reader::new(body))?;
        self.pos += HEADER_LEN + len;
        Ok(Some(msg))
    }
}
