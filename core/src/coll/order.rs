//! The order ranks take around rings and along chains and trees: the ranks of one host next to
//! each other (hosts in order of their first rank, ranks in order within a host), so a ring
//! crosses between hosts once per host rather than at every step when a launcher interleaves
//! them. The ring, chain and tree code runs on positions in this order as if they were ranks;
//! `Ctx` maps positions back to ranks where a peer is named or a rank's own block is addressed.

/// A permutation of `0..n`: `order[pos]` is a rank, `pos[rank]` its position.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RingOrder {
    order: Vec<usize>,
    pos: Vec<usize>,
}

impl RingOrder {
    /// Ranks grouped by host, given each rank's host identity.
    pub(crate) fn host_grouped<S: AsRef<str>>(hosts: &[S]) -> RingOrder {
        let mut first: Vec<&str> = Vec::new();
        let host_index: Vec<usize> = hosts
            .iter()
            .map(|h| {
                let h = h.as_ref();
                first.iter().position(|&f| f == h).unwrap_or_else(|| {
                    first.push(h);
                    first.len() - 1
                })
            })
            .collect();
        let mut order: Vec<usize> = (0..hosts.len()).collect();
        order.sort_by_key(|&r| (host_index[r], r));
        let mut pos = vec![0; order.len()];
        for (p, &r) in order.iter().enumerate() {
            pos[r] = p;
        }
        RingOrder { order, pos }
    }

    /// Whether every rank sits at its own position (no mapping needed).
    pub(crate) fn is_identity(&self) -> bool {
        self.order.iter().enumerate().all(|(p, &r)| p == r)
    }

    /// The rank at position `p`.
    pub(crate) fn rank(&self, p: usize) -> usize {
        self.order[p]
    }

    /// The position of `rank`.
    pub(crate) fn pos(&self, rank: usize) -> usize {
        self.pos[rank]
    }

    #[cfg(test)]
    pub(crate) fn ranks(&self) -> &[usize] {
        &self.order
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ring links whose two ends are on different hosts.
    fn crossings(order: &RingOrder, hosts: &[&str]) -> usize {
        let n = hosts.len();
        (0..n).filter(|&p| hosts[order.rank(p)] != hosts[order.rank((p + 1) % n)]).count()
    }

    #[test]
    fn interleaved_hosts_cross_twice() {
        let hosts = ["A", "B", "A", "B", "A", "B"];
        let o = RingOrder::host_grouped(&hosts);
        assert_eq!(o.ranks(), [0, 2, 4, 1, 3, 5]);
        assert_eq!(crossings(&o, &hosts), 2);
        // Rank order would cross at every link.
        let plain = RingOrder::host_grouped(&["0", "1", "2", "3", "4", "5"]);
        assert!(plain.is_identity());
        assert_eq!((0..6).filter(|&r| hosts[r] != hosts[(r + 1) % 6]).count(), 6);
        for r in 0..6 {
            assert_eq!(o.rank(o.pos(r)), r);
        }
    }

    #[test]
    fn hosts_keep_the_order_of_their_first_rank() {
        let hosts = ["B", "A", "B", "C", "A"];
        let o = RingOrder::host_grouped(&hosts);
        assert_eq!(o.ranks(), [0, 2, 1, 4, 3]);
        assert_eq!(crossings(&o, &hosts), 3);
        assert!(RingOrder::host_grouped(&["h", "h", "h"]).is_identity());
        assert!(RingOrder::host_grouped(&["a", "a", "b", "b"]).is_identity());
    }
}
