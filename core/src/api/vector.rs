//! Collectives built from grouped sends and receives, as NCCL users build them: all-to-all
//! with per-rank counts (`all_to_allv`), gather and scatter. Each runs as one implicit group, so
//! every rank's sends and receives progress together.

use crate::comm::Comm;
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::launch;
use crate::op::Op;
use crate::record::CollType;

/// `[displ, displ + count)` within a buffer of `len` elements, for rank `r`'s block.
fn block(what: &str, r: usize, count: usize, displ: usize, len: usize) -> Result<()> {
    match displ.checked_add(count) {
        Some(end) if end <= len => Ok(()),
        _ => Err(Error::arg(format!(
            "{what}: rank {r}'s block [{displ}, {displ}+{count}) does not fit in the {len}-element buffer"
        ))),
    }
}

fn per_rank(what: &str, got: usize, n: usize) -> Result<()> {
    if got != n {
        return Err(Error::arg(format!("{what} has {got} entries; it needs one per rank ({n})")));
    }
    Ok(())
}

fn p2p<T: Element>(coll: CollType, count: usize, peer: usize, send: usize, recv: usize) -> Op {
    Op::new(coll, count, T::DTYPE, send, recv).peer(peer)
}

impl Comm {
    /// All-to-all with a count and displacement per rank (MPI's `Alltoallv`): rank `j` gets
    /// `send[send_displs[j]..][..send_counts[j]]`, and `recv[recv_displs[i]..][..recv_counts[i]]`
    /// comes from rank `i`. Rank `i`'s `send_counts[j]` must equal rank `j`'s `recv_counts[i]`;
    /// the receive blocks must not overlap. Runs as one group of sends and receives.
    #[allow(clippy::too_many_arguments)] // MPI's argument list: buffer, counts, displacements per side
    pub fn all_to_allv<T: Element>(
        &self,
        send: &[T],
        send_counts: &[usize],
        send_displs: &[usize],
        recv: &mut [T],
        recv_counts: &[usize],
        recv_displs: &[usize],
    ) -> Result<()> {
        launch::refuse_borrowed("all_to_allv")?;
        let (n, me) = (self.nranks(), self.rank());
        per_rank("all_to_allv: send_counts", send_counts.len(), n)?;
        per_rank("all_to_allv: send_displs", send_displs.len(), n)?;
        per_rank("all_to_allv: recv_counts", recv_counts.len(), n)?;
        per_rank("all_to_allv: recv_displs", recv_displs.len(), n)?;
        for r in 0..n {
            block("all_to_allv: send", r, send_counts[r], send_displs[r], send.len())?;
            block("all_to_allv: recv", r, recv_counts[r], recv_displs[r], recv.len())?;
        }
        let mut blocks: Vec<(usize, usize, usize)> =
            (0..n).filter(|&r| recv_counts[r] > 0).map(|r| (recv_displs[r], recv_counts[r], r)).collect();
        blocks.sort_unstable();
        for w in blocks.windows(2) {
            if w[0].0 + w[0].1 > w[1].0 {
                return Err(Error::arg(format!(
                    "all_to_allv: the receive blocks of ranks {} and {} overlap",
                    w[0].2, w[1].2
                )));
            }
        }
        if send_counts[me] != recv_counts[me] {
            return Err(Error::arg(format!(
                "all_to_allv: this rank sends itself {} elements but receives {} from itself",
                send_counts[me], recv_counts[me]
            )));
        }
        let own = &send[send_displs[me]..][..send_counts[me]];
        recv[recv_displs[me]..][..recv_counts[me]].copy_from_slice(own);
        let (sp, rp) = (send.as_ptr(), recv.as_mut_ptr());
        let size = std::mem::size_of::<T>();
        let mut calls = Vec::with_capacity(2 * n);
        for k in 1..n {
            let (to, from) = ((me + k) % n, (me + n - k) % n);
            if recv_counts[from] > 0 {
                let at = rp as usize + recv_displs[from] * size;
                calls.push(p2p::<T>(CollType::Recv, recv_counts[from], from, 0, at));
            }
            if send_counts[to] > 0 {
                let at = sp as usize + send_displs[to] * size;
                calls.push(p2p::<T>(CollType::Send, send_counts[to], to, at, 0));
            }
        }
        // The blocks were checked to lie within `send` and `recv`, which stay borrowed until
        // the group has run; the receive blocks are disjoint.
        crate::exec::group::run_now(self, &calls)
    }

    /// Every rank's `send` lands in the root's `recv` (nranks × send.len(), in rank order).
    /// Off the root `recv` is ignored (pass an empty slice).
    pub fn gather<T: Element>(&self, send: &[T], recv: &mut [T], root: usize) -> Result<()> {
        launch::refuse_borrowed("gather")?;
        let (n, me, count) = (self.nranks(), self.rank(), send.len());
        if root >= n {
            return Err(Error::arg(format!("root {root} is out of range for nranks={n} (ranks are 0..{n})")));
        }
        let mut calls = Vec::new();
        if me == root {
            if Some(recv.len()) != count.checked_mul(n) {
                return Err(Error::arg(format!(
                    "gather: recv has {} elements but needs nranks × send = {n} × {count}",
                    recv.len()
                )));
            }
            recv[me * count..][..count].copy_from_slice(send);
            let rp = recv.as_mut_ptr() as usize;
            let size = std::mem::size_of::<T>();
            for r in (0..n).filter(|&r| r != me && count > 0) {
                calls.push(p2p::<T>(CollType::Recv, count, r, 0, rp + r * count * size));
            }
        } else if count > 0 {
            calls.push(p2p::<T>(CollType::Send, count, root, send.as_ptr() as usize, 0));
        }
        crate::exec::group::run_now(self, &calls)
    }

    /// Block `i` of the root's `send` (nranks × recv.len()) lands in rank `i`'s `recv`. Off the
    /// root `send` is ignored (pass an empty slice).
    pub fn scatter<T: Element>(&self, send: &[T], recv: &mut [T], root: usize) -> Result<()> {
        launch::refuse_borrowed("scatter")?;
        let (n, me, count) = (self.nranks(), self.rank(), recv.len());
        if root >= n {
            return Err(Error::arg(format!("root {root} is out of range for nranks={n} (ranks are 0..{n})")));
        }
        let mut calls = Vec::new();
        if me == root {
            if Some(send.len()) != count.checked_mul(n) {
                return Err(Error::arg(format!(
                    "scatter: send has {} elements but needs nranks × recv = {n} × {count}",
                    send.len()
                )));
            }
            recv.copy_from_slice(&send[me * count..][..count]);
            let sp = send.as_ptr() as usize;
            let size = std::mem::size_of::<T>();
            for r in (0..n).filter(|&r| r != me && count > 0) {
                calls.push(p2p::<T>(CollType::Send, count, r, sp + r * count * size, 0));
            }
        } else if count > 0 {
            calls.push(p2p::<T>(CollType::Recv, count, root, 0, recv.as_mut_ptr() as usize));
        }
        crate::exec::group::run_now(self, &calls)
    }
}
