//! One all-gather round over the bootstrap tree, as a state machine that does no I/O.
//!
//! The ranks form a binary tree in heap order (rank r's parent is (r-1)/2, its children 2r+1
//! and 2r+2). A round gathers up the tree, each rank sending its parent the blocks of its whole
//! subtree, and rank 0 sends the full table back down, each rank forwarding it unchanged. So a
//! round is 2·log₂(n) hops, where a ring takes n-1: with many ranks per core, every hop waits
//! for a thread to be scheduled, and a ring of 1,024 thread ranks on two cores took a second
//! per round. The driver (`tree.rs`) feeds it the bytes read from each link and sends what it
//! queues for each.
//!
//! Frames: `[UP][u32 round][u32 count]{[u32 rank][bytes]}*`, `[DOWN][u32 round][u32 n]{[bytes]}*`
//! and `[ERROR][u32 origin][str why]`. An error travels on the same links, so every rank learns
//! which rank failed and why instead of only that its neighbour hung up.

use super::wire::{self, Reader, Writer};
use crate::error::{Error, Result};

const UP: u8 = 12;
const DOWN: u8 = 13;
const FAILED: u8 = wire::ERROR;

/// Rank `rank`'s parent in the tree (none for rank 0).
pub(crate) fn parent(rank: usize) -> Option<usize> {
    rank.checked_sub(1).map(|r| r / 2)
}

/// Rank `rank`'s children among `nranks`.
pub(crate) fn children(rank: usize, nranks: usize) -> Vec<usize> {
    [2 * rank + 1, 2 * rank + 2].into_iter().filter(|&c| c < nranks).collect()
}

/// Rank `rank`'s links in the order the driver keeps them: the parent (if any), then the
/// children.
pub(crate) fn links(rank: usize, nranks: usize) -> Vec<usize> {
    parent(rank).into_iter().chain(children(rank, nranks)).collect()
}

fn subtree_size(rank: usize, nranks: usize) -> usize {
    1 + children(rank, nranks).iter().map(|&c| subtree_size(c, nranks)).sum::<usize>()
}

fn in_subtree(mut r: usize, root: usize) -> bool {
    loop {
        if r == root {
            return true;
        }
        match parent(r) {
            Some(p) if r > root => r = p,
            _ => return false,
        }
    }
}

/// The frame (length prefix included) that tells a neighbour rank `origin` failed with `why`.
pub(crate) fn error_frame(origin: usize, why: &str) -> Vec<u8> {
    let mut w = Writer::default();
    w.u8(FAILED);
    w.u32(origin as u32);
    w.str(why);
    wire::frame(&w.into_inner())
}

/// One round in progress on rank `rank` of `nranks`.
pub(crate) struct Round {
    rank: usize,
    nranks: usize,
    round: u32,
    /// The ranks at the other end of each link (`links()`), and whether each link has given
    /// this round what it owes (a child its subtree, the parent the table).
    peers: Vec<usize>,
    done: Vec<bool>,
    parts: Vec<Option<Vec<u8>>>,
    /// Frames queued for each link, and how many of their bytes are sent (kept whole until all
    /// are, so that a failure can tell whether the link stopped mid-frame).
    out: Vec<Vec<u8>>,
    off: Vec<usize>,
    /// The table, once it came down (or, on rank 0, once every subtree came up).
    table: Option<Vec<Vec<u8>>>,
    sent_up: bool,
}

impl Round {
    /// Starts round `round` (every rank counts its calls alike) with this rank's block.
    pub(crate) fn new(rank: usize, nranks: usize, round: u32, mine: &[u8]) -> Round {
        let peers = links(rank, nranks);
        let k = peers.len();
        let mut r = Round {
            rank,
            nranks,
            round,
            peers,
            done: vec![false; k],
            parts: vec![None; nranks],
            out: vec![Vec::new(); k],
            off: vec![0; k],
            table: None,
            sent_up: false,
        };
        r.parts[rank] = Some(mine.to_vec());
        r.advance();
        r
    }

    fn link_of_parent(&self) -> Option<usize> {
        parent(self.rank).map(|_| 0)
    }

    fn child_links(&self) -> std::ops::Range<usize> {
        usize::from(self.rank > 0)..self.peers.len()
    }

    /// Sends up once every child's subtree is in; on rank 0 that completes the table, which
    /// then goes down.
    fn advance(&mut self) {
        if self.table.is_some() || !self.child_links().all(|l| self.done[l]) {
            return;
        }
        match self.link_of_parent() {
            Some(p) if !self.sent_up => {
                self.sent_up = true;
                let mut w = Writer::default();
                w.u8(UP);
                w.u32(self.round);
                let mine: Vec<(usize, &Vec<u8>)> =
                    self.parts.iter().enumerate().filter_map(|(r, b)| b.as_ref().map(|b| (r, b))).collect();
                w.u32(mine.len() as u32);
                for (r, b) in mine {
                    w.u32(r as u32);
                    w.bytes(b);
                }
                self.out[p] = wire::frame(&w.into_inner());
            }
            Some(_) => {}
            None if self.parts.iter().all(Option::is_some) => {
                let t: Vec<Vec<u8>> = std::mem::take(&mut self.parts).into_iter().flatten().collect();
                let mut w = Writer::default();
                w.u8(DOWN);
                w.u32(self.round);
                w.u32(t.len() as u32);
                for b in &t {
                    w.bytes(b);
                }
                self.send_down(&wire::frame(&w.into_inner()));
                self.table = Some(t);
            }
            None => {}
        }
    }

    fn send_down(&mut self, frame: &[u8]) {
        for l in self.child_links() {
            self.out[l].extend_from_slice(frame);
        }
    }

    /// Whether link `link` has given all it owes this round. Frames after that belong to the
    /// next round and must stay unread.
    pub(crate) fn complete_from(&self, link: usize) -> bool {
        self.done[link]
    }

    pub(crate) fn complete(&self) -> bool {
        self.table.is_some()
    }

    /// Whether the rank at the end of `link` is a child still waiting for the table: if it
    /// hangs up now, the round cannot finish.
    pub(crate) fn owed_table(&self, link: usize) -> bool {
        self.table.is_none() && self.child_links().contains(&link)
    }

    /// Bytes queued for `link`; the driver sends them and calls `sent`.
    pub(crate) fn pending(&self, link: usize) -> &[u8] {
        &self.out[link][self.off[link]..]
    }

    pub(crate) fn sent(&mut self, link: usize, n: usize) {
        let (out, off) = (&mut self.out[link], &mut self.off[link]);
        *off = (*off + n).min(out.len());
        if *off == out.len() {
            out.clear();
            *off = 0;
        }
    }

    /// Whether what was sent on `link` ends with a whole frame, so that another frame (an
    /// error) can follow it.
    pub(crate) fn at_frame_boundary(&self, link: usize) -> bool {
        let (out, off) = (&self.out[link], self.off[link]);
        let mut at = 0;
        while at < off {
            let len = out.get(at..at + 4).map_or(0, |l| u32::from_le_bytes([l[0], l[1], l[2], l[3]]) as usize);
            at += 4 + len;
        }
        at == off
    }

    /// Handles the whole frames at the front of `buf` (bytes read from `link`) until that link
    /// is complete, and removes them; a partial frame and the frames of later rounds stay.
    pub(crate) fn handle_bytes(&mut self, link: usize, buf: &mut Vec<u8>) -> Result<()> {
        let mut used = 0;
        let res = loop {
            if self.done[link] {
                break Ok(());
            }
            match wire::frame_at(&buf[used..]) {
                Ok(Some((f, len))) => {
                    if let Err(e) = self.handle_frame(link, f) {
                        break Err(e);
                    }
                    used += len;
                }
                Ok(None) => break Ok(()),
                Err(e) => break Err(e),
            }
        };
        buf.drain(..used);
        res
    }

    fn round_check(&self, round: u32, sender: usize) -> Result<()> {
        if round == self.round {
            return Ok(());
        }
        Err(Error::usage(format!(
            "bootstrap: rank {sender} is in its bootstrap exchange #{round} while rank {} is in #{}; \
             the ranks made different collective calls (init, split, register, ...)",
            self.rank, self.round
        )))
    }

    /// Handles one frame from `link`. An error frame is returned as the error of the rank it
    /// names; anything else out of place is an error of the sender.
    fn handle_frame(&mut self, link: usize, frame: &[u8]) -> Result<()> {
        let sender = self.peers[link];
        let bad = |what: String| Error::remote(sender, format!("bootstrap tree: rank {sender} {what}"));
        let mut r = Reader::new(frame);
        match r.u8()? {
            UP if Some(link) != self.link_of_parent() => {
                self.round_check(r.u32()?, sender)?;
                let count = r.u32()? as usize;
                if count != subtree_size(sender, self.nranks) {
                    return Err(bad(format!(
                        "sent {count} blocks for a subtree of {}",
                        subtree_size(sender, self.nranks)
                    )));
                }
                for _ in 0..count {
                    let rank = r.u32()? as usize;
                    let data = r.bytes()?;
                    if rank >= self.nranks || !in_subtree(rank, sender) || self.parts[rank].is_some() {
                        return Err(bad(format!(
                            "sent a block for rank {rank}, which is not its subtree's or came twice"
                        )));
                    }
                    self.parts[rank] = Some(data.to_vec());
                }
                r.finish()?;
                self.done[link] = true;
                self.advance();
                Ok(())
            }
            DOWN if Some(link) == self.link_of_parent() => {
                self.round_check(r.u32()?, sender)?;
                let n = r.u32()? as usize;
                if n != self.nranks {
                    return Err(bad(format!("sent a table of {n} blocks for {} ranks", self.nranks)));
                }
                let table = (0..n).map(|_| r.bytes().map(<[u8]>::to_vec)).collect::<Result<Vec<_>>>()?;
                r.finish()?;
                if table[self.rank].as_slice() != self.parts[self.rank].as_deref().unwrap_or_default() {
                    return Err(bad("sent a table whose entry for this rank is not what this rank gave".into()));
                }
                // The table goes on down unchanged.
                self.send_down(&wire::frame(frame));
                self.done[link] = true;
                self.table = Some(table);
                Ok(())
            }
            FAILED => {
                let origin = r.u32()? as usize;
                let why = r.str()?;
                Err(Error::remote(origin, why))
            }
            t => Err(bad(format!("sent a frame of type {t} where none was due"))),
        }
    }

    /// Every rank's block in rank order, once the round is complete.
    pub(crate) fn finish(self) -> Result<Vec<Vec<u8>>> {
        self.table.ok_or_else(|| Error::internal("bootstrap tree: the round ended without the table"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs one round on `n` simulated ranks. Each turn one rank hands up to `chunk` bytes of
    /// one link's queue to that neighbour, which handles what it has; the turns rotate so that
    /// ranks and links run at different paces.
    fn simulate(n: usize, chunk: usize, blocks: &[Vec<u8>]) -> Vec<Vec<Vec<u8>>> {
        let mut rounds: Vec<Round> = (0..n).map(|r| Round::new(r, n, 7, &blocks[r])).collect();
        // inbox[r][l]: bytes rank r has read from its link l.
        let mut inbox: Vec<Vec<Vec<u8>>> = (0..n).map(|r| vec![Vec::new(); links(r, n).len()]).collect();
        let mut turn = 0;
        let idle =
            |rs: &[Round]| rs.iter().all(|r| r.complete() && (0..r.peers.len()).all(|l| r.pending(l).is_empty()));
        while !idle(&rounds) {
            let r = turn % n;
            turn += 1;
            let k = rounds[r].peers.len();
            if k == 0 {
                continue;
            }
            let l = (turn / n) % k;
            let take = rounds[r].pending(l).len().min(chunk + turn % 3);
            let bytes = rounds[r].pending(l)[..take].to_vec();
            rounds[r].sent(l, take);
            let to = rounds[r].peers[l];
            let back = links(to, n).iter().position(|&p| p == r).unwrap();
            inbox[to][back].extend_from_slice(&bytes);
            rounds[to].handle_bytes(back, &mut inbox[to][back]).unwrap();
            assert!(turn < 10_000_000, "the round did not converge");
        }
        assert!(inbox.iter().flatten().all(Vec::is_empty), "a rank was sent more than the round holds");
        rounds.into_iter().map(|r| r.finish().unwrap()).collect()
    }

    #[test]
    fn every_rank_gets_every_block_in_rank_order() {
        for n in [1usize, 2, 3, 4, 5, 7, 8, 13] {
            let blocks: Vec<Vec<u8>> = (0..n).map(|r| vec![r as u8; r % 4 * 37]).collect();
            for chunk in [1, 5, 4096] {
                for (r, got) in simulate(n, chunk, &blocks).iter().enumerate() {
                    assert_eq!(got, &blocks, "n={n} chunk={chunk} rank {r}");
                }
            }
        }
    }

    #[test]
    fn the_tree_is_shallow_and_covers_every_rank_once() {
        for n in [1usize, 2, 3, 1000, 1024] {
            let mut seen = vec![0; n];
            for r in 0..n {
                for c in children(r, n) {
                    assert_eq!(parent(c), Some(r));
                    seen[c] += 1;
                }
                let mut depth = 0;
                let mut x = r;
                while let Some(p) = parent(x) {
                    x = p;
                    depth += 1;
                }
                assert!(depth <= usize::BITS as usize - n.leading_zeros() as usize, "n={n} r={r}: depth {depth}");
            }
            assert_eq!(seen.iter().sum::<usize>(), n - 1);
            assert_eq!(subtree_size(0, n), n);
        }
    }

    fn up_frame(round: u32, blocks: &[(u32, &[u8])]) -> Vec<u8> {
        let mut w = Writer::default();
        w.u8(UP);
        w.u32(round);
        w.u32(blocks.len() as u32);
        for (r, b) in blocks {
            w.u32(*r);
            w.bytes(b);
        }
        wire::frame(&w.into_inner())
    }

    #[test]
    fn wrong_round_foreign_blocks_errors_and_garbage_are_refused() {
        // Rank 1 of 4: parent 0 (link 0), child 3 (link 1).
        let e = Round::new(1, 4, 3, b"x").handle_bytes(1, &mut up_frame(4, &[(3, b"y")])).unwrap_err();
        assert!(e.to_string().contains("different collective calls"), "{e}");
        let e = Round::new(1, 4, 3, b"x").handle_bytes(1, &mut up_frame(3, &[(2, b"y")])).unwrap_err();
        assert!(matches!(e, Error::RemoteError { peer: 3, .. }), "{e}");
        let e = Round::new(1, 4, 3, b"x").handle_bytes(1, &mut up_frame(3, &[(3, b"y"), (3, b"y")])).unwrap_err();
        assert!(matches!(e, Error::RemoteError { peer: 3, .. }), "{e}");
        // An UP from the parent is out of place.
        let e = Round::new(1, 4, 3, b"x").handle_bytes(0, &mut up_frame(3, &[(0, b"y")])).unwrap_err();
        assert!(matches!(e, Error::RemoteError { peer: 0, .. }), "{e}");

        let e = Round::new(1, 4, 3, b"x").handle_bytes(0, &mut error_frame(2, "rank 2 ran out of memory")).unwrap_err();
        assert!(matches!(&e, Error::RemoteError { peer: 2, what } if what.contains("out of memory")), "{e}");

        for garbage in [&[0, 0, 0, 0][..], &[3, 0, 0, 0, UP, 3, 0][..], &[1, 0, 0, 0, 99][..]] {
            assert!(Round::new(1, 4, 3, b"x").handle_bytes(1, &mut garbage.to_vec()).is_err(), "{garbage:?}");
        }
        let mut huge = (wire::MAX_FRAME as u32 + 1).to_le_bytes().to_vec();
        huge.extend_from_slice(&[0; 8]);
        assert!(Round::new(1, 4, 3, b"x").handle_bytes(1, &mut huge).is_err());
        let mut partial = vec![5, 0, 0, 0, 1, 2];
        Round::new(1, 4, 3, b"x").handle_bytes(1, &mut partial).unwrap();
        assert_eq!(partial.len(), 6, "a partial frame stays for the next read");
    }

    #[test]
    fn a_table_that_misstates_this_rank_is_refused() {
        // Rank 1 of 2 sends "x" up; a table saying rank 1 gave "z" is the parent's error.
        let mut r1 = Round::new(1, 2, 0, b"x");
        let mut r0 = Round::new(0, 2, 0, b"a");
        r0.handle_bytes(0, &mut up_frame(0, &[(1, b"z")])).unwrap();
        let e = r1.handle_bytes(0, &mut r0.pending(0).to_vec()).unwrap_err();
        assert!(matches!(e, Error::RemoteError { peer: 0, .. }), "{e}");
    }

    #[test]
    fn frames_of_the_next_round_stay_unread() {
        // Rank 0 of 2 answers round 0 and at once round 1 (rank 1's block came up early):
        // rank 1 must take only round 0's table now.
        let mut a = Round::new(0, 2, 0, b"a");
        a.handle_bytes(0, &mut up_frame(0, &[(1, b"c")])).unwrap();
        let mut b = Round::new(0, 2, 1, b"b");
        b.handle_bytes(0, &mut up_frame(1, &[(1, b"d")])).unwrap();
        let mut stream = [a.pending(0), b.pending(0)].concat();
        let mut r1 = Round::new(1, 2, 0, b"c");
        r1.handle_bytes(0, &mut stream).unwrap();
        assert_eq!(r1.finish().unwrap(), vec![b"a".to_vec(), b"c".to_vec()]);
        let mut r1 = Round::new(1, 2, 1, b"d");
        r1.handle_bytes(0, &mut stream).unwrap();
        assert!(stream.is_empty());
        assert_eq!(r1.finish().unwrap(), vec![b"b".to_vec(), b"d".to_vec()]);
    }

    #[test]
    fn children_are_owed_the_table_until_it_is_ready_and_the_parent_never() {
        let mut r0 = Round::new(0, 3, 0, b"a");
        assert!(r0.owed_table(0) && r0.owed_table(1));
        r0.handle_bytes(0, &mut up_frame(0, &[(1, b"b")])).unwrap();
        assert!(r0.owed_table(0), "a child that sent its subtree still waits for the table");
        r0.handle_bytes(1, &mut up_frame(0, &[(2, b"c")])).unwrap();
        assert!(r0.complete() && !r0.owed_table(0) && !r0.owed_table(1));
        assert!(!Round::new(1, 3, 0, b"b").owed_table(0), "link 0 of rank 1 is its parent");
    }

    #[test]
    fn a_partly_sent_frame_is_not_a_boundary() {
        let mut r = Round::new(1, 2, 0, b"abc");
        assert!(r.at_frame_boundary(0) && !r.pending(0).is_empty());
        r.sent(0, 3);
        assert!(!r.at_frame_boundary(0));
        let rest = r.pending(0).len();
        r.sent(0, rest);
        assert!(r.at_frame_boundary(0) && r.pending(0).is_empty());
    }
}
