//! `Comm::split(color, key)`, NCCL's `ncclCommSplit`: every rank of the parent calls it; ranks
//! with the same color form a new communicator, ranked by (key, parent rank); a rank with
//! `OCCL_SPLIT_NOCOLOR` takes part in the exchange and gets none.
//!
//! Two rounds over the parent's bootstrap connection (no collective, so the parent's operation
//! counters and events do not change): every rank's (color, key); then each color's new rank 0
//! publishes a fresh `UniqueId` (a new root and secret) that its members join. The new
//! communicators are independent of the parent and of each other: they connect their own
//! transports and run concurrently with the parent.

use crate::bootstrap::wire::{Reader, Writer};
use crate::comm::Comm;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::id::UniqueId;

/// The color of a rank that takes part in a split but joins no new communicator
/// (`NCCL_SPLIT_NOCOLOR`).
pub const OCCL_SPLIT_NOCOLOR: i32 = -1;

/// A failed id creation on a color's rank 0, published instead of an id so that its members
/// fail too instead of waiting.
const FAILED: u8 = b'!';

impl Comm {
    /// Splits this communicator by `color` (≥ 0, or `OCCL_SPLIT_NOCOLOR`); within a color, new
    /// ranks follow `key`, then the parent rank. Every rank of this communicator must call it.
    /// Returns `None` for `OCCL_SPLIT_NOCOLOR`. The new communicator has the parent's
    /// configuration; see `split_with`.
    pub fn split(&self, color: i32, key: i32) -> Result<Option<Comm>> {
        self.split_with(color, key, self.config.clone())
    }

    /// As `split`, with the new communicator's configuration.
    pub fn split_with(&self, color: i32, key: i32, config: Config) -> Result<Option<Comm>> {
        crate::launch::refuse_in_group("split")?;
        let (n, me) = (self.nranks(), self.rank());
        let (id, new_rank, size) = {
            let mut g = self.lock_usable()?;
            let boot = g.boot.as_mut().ok_or_else(|| Error::usage("the communicator was destroyed"))?;
            let mut w = Writer::default();
            w.u32(color as u32);
            w.u32(key as u32);
            let parts = boot.all_gather(&w.into_inner())?;
            let mut colors = Vec::with_capacity(n);
            for (r, b) in parts.iter().enumerate() {
                let mut rd = Reader::new(b);
                let (c, k) = (rd.u32()? as i32, rd.u32()? as i32);
                rd.finish()?;
                if c < 0 && c != OCCL_SPLIT_NOCOLOR {
                    // Every rank sees the same table, so every rank fails alike.
                    return Err(Error::usage(format!(
                        "split: rank {r} passed color {c}; a color is >= 0, or OCCL_SPLIT_NOCOLOR ({OCCL_SPLIT_NOCOLOR}) for no communicator"
                    )));
                }
                colors.push((c, k, r));
            }
            let mut members: Vec<(i32, usize)> =
                colors.iter().filter(|&&(c, _, _)| c == color).map(|&(_, k, r)| (k, r)).collect();
            members.sort_unstable();
            let leader = members.first().map(|m| m.1);
            let mine = if color != OCCL_SPLIT_NOCOLOR && leader == Some(me) {
                // The new root listens where this communicator's ranks do, unless `config` says.
                let ip = config.listen_addr.or(self.config.listen_addr).unwrap_or(std::net::Ipv4Addr::LOCALHOST.into());
                match UniqueId::new_on(ip) {
                    Ok(id) => id.to_string().into_bytes(),
                    Err(e) => {
                        let _ = boot.all_gather(&[&[FAILED], e.to_string().as_bytes()].concat());
                        return Err(e);
                    }
                }
            } else {
                Vec::new()
            };
            let ids = boot.all_gather(&mine)?;
            drop(g);
            let Some(leader) = leader.filter(|_| color != OCCL_SPLIT_NOCOLOR) else { return Ok(None) };
            let text = ids.get(leader).map(|b| String::from_utf8_lossy(b).into_owned()).unwrap_or_default();
            if let Some(why) = text.strip_prefix(FAILED as char) {
                return Err(Error::remote(
                    leader,
                    format!("split: could not start the new communicator's root: {why}"),
                ));
            }
            let id: UniqueId = text.parse()?;
            let new_rank =
                members.iter().position(|m| m.1 == me).ok_or_else(|| Error::internal("split: not a member"))?;
            (id, new_rank, members.len())
        };
        tracing::debug!("occl: split of comm {:016x}: rank {me} is rank {new_rank}/{size} of color {color}", self.id());
        Comm::init_rank(size, &id, new_rank, config).map(Some)
    }
}
