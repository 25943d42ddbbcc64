//! Connecting one RC queue pair to its peer, as a state machine with no I/O.
//!
//! Each side creates its QP, publishes a `ConnRecord` through occl's bootstrap, and feeds the
//! peer's record in with `handle_remote`. The driver asks `poll_transition` for the next
//! `ibv_modify_qp` to issue (RESET→INIT, INIT→RTR, RTR→RTS), issues it, and reports the outcome
//! with `handle_applied` or `handle_failed`. INIT needs nothing from the peer; RTR needs its
//! record; RTS follows RTR. Anything out of order is an error, and a failure is final.

use crate::error::{Error, Result};

/// Path MTU, as `enum ibv_mtu` numbers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Mtu {
    M256 = 1,
    M512 = 2,
    M1024 = 3,
    M2048 = 4,
    M4096 = 5,
}

impl Mtu {
    /// From `enum ibv_mtu`; `None` for anything else.
    pub fn from_code(code: u32) -> Option<Mtu> {
        Some(match code {
            1 => Mtu::M256,
            2 => Mtu::M512,
            3 => Mtu::M1024,
            4 => Mtu::M2048,
            5 => Mtu::M4096,
            _ => return None,
        })
    }

    pub fn code(self) -> u32 {
        self as u32
    }

    pub fn bytes(self) -> usize {
        128 << self.code()
    }
}

/// How a port is addressed: by LID on InfiniBand, by GID on RoCE (Ethernet).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkLayer {
    Infiniband,
    Ethernet,
}

/// What one side tells the other to connect a QP pair, plus where the peer may write: the
/// receive slots (`addr`, `rkey`, `nslots` × `slot_size`).
///
/// Wire layout (little-endian, `LEN` bytes): version u16, link layer u8, mtu u8, qpn u32,
/// psn u32, lid u16, reserved u16 (0), gid [u8; 16], addr u64, rkey u32, nslots u32,
/// slot_size u32, reserved u32 (0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnRecord {
    pub link: LinkLayer,
    pub mtu: Mtu,
    /// Queue pair number (24 bits).
    pub qpn: u32,
    /// First packet sequence number (24 bits).
    pub psn: u32,
    pub lid: u16,
    pub gid: [u8; 16],
    pub addr: u64,
    pub rkey: u32,
    pub nslots: u32,
    pub slot_size: u32,
}

impl ConnRecord {
    pub const VERSION: u16 = 1;
    pub const LEN: usize = 56;

    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[0..2].copy_from_slice(&Self::VERSION.to_le_bytes());
        b[2] = match self.link {
            LinkLayer::Infiniband => 1,
            LinkLayer::Ethernet => 2,
        };
        b[3] = self.mtu.code() as u8;
        b[4..8].copy_from_slice(&self.qpn.to_le_bytes());
        b[8..12].copy_from_slice(&self.psn.to_le_bytes());
        b[12..14].copy_from_slice(&self.lid.to_le_bytes());
        b[16..32].copy_from_slice(&self.gid);
        b[32..40].copy_from_slice(&self.addr.to_le_bytes());
        b[40..44].copy_from_slice(&self.rkey.to_le_bytes());
        b[44..48].copy_from_slice(&self.nslots.to_le_bytes());
        b[48..52].copy_from_slice(&self.slot_size.to_le_bytes());
        b
    }

    /// Decodes a peer's record; wrong length, version, reserved bits, link layer, MTU code,
    /// 24-bit fields out of range or an empty slot ring are errors.
    pub fn decode(b: &[u8]) -> Result<ConnRecord> {
        if b.len() != Self::LEN {
            return Err(Error::Record(format!("{} bytes, expected {}", b.len(), Self::LEN)));
        }
        let u16_at = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let version = u16_at(0);
        if version != Self::VERSION {
            return Err(Error::Record(format!("version {version}, this build speaks {}", Self::VERSION)));
        }
        if u16_at(14) != 0 || u32_at(52) != 0 {
            return Err(Error::Record("reserved bytes are not zero".into()));
        }
        let link = match b[2] {
            1 => LinkLayer::Infiniband,
            2 => LinkLayer::Ethernet,
            x => return Err(Error::Record(format!("link layer {x} is neither 1 (InfiniBand) nor 2 (Ethernet)"))),
        };
        let mtu = Mtu::from_code(u32::from(b[3])).ok_or_else(|| Error::Record(format!("MTU code {}", b[3])))?;
        let (qpn, psn) = (u32_at(4), u32_at(8));
        if qpn > 0xff_ffff || psn > 0xff_ffff {
            return Err(Error::Record(format!("qpn {qpn:#x} or psn {psn:#x} exceeds 24 bits")));
        }
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[16..32]);
        let addr = u64::from_le_bytes(b[32..40].try_into().map_err(|_| Error::Record("addr".into()))?);
        let (rkey, nslots, slot_size) = (u32_at(40), u32_at(44), u32_at(48));
        if nslots == 0 || slot_size == 0 {
            return Err(Error::Record(format!("empty receive ring ({nslots} slots of {slot_size} bytes)")));
        }
        Ok(ConnRecord { link, mtu, qpn, psn, lid: u16_at(12), gid, addr, rkey, nslots, slot_size })
    }
}

/// Fuzz entry (`ibverbs/fuzz`): any bytes either fail to decode or decode to a record that
/// encodes back to exactly those bytes.
#[cfg(any(test, feature = "test-support"))]
pub fn fuzz_conn_record(data: &[u8]) {
    if let Ok(r) = ConnRecord::decode(data) {
        assert_eq!(r.encode().as_slice(), data, "a decoded record must re-encode to its bytes");
    }
}

/// Where the QP is. `Error` is final.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QpState {
    Reset,
    Init,
    Rtr,
    Rts,
    Error,
}

/// One `ibv_modify_qp` for the driver to issue, with the values it needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    /// RESET→INIT: bind to the local port and allow remote writes.
    Init { port: u8 },
    /// INIT→RTR: the peer's address and receive PSN; `mtu` is the smaller of the two sides'.
    /// `gid_index` is the local GID for the global route (RoCE); `None` on InfiniBand.
    Rtr { port: u8, dest_qpn: u32, rq_psn: u32, mtu: Mtu, dlid: u16, dgid: [u8; 16], gid_index: Option<u8> },
    /// RTR→RTS: the local send PSN.
    Rts { sq_psn: u32 },
}

impl Transition {
    /// The state the QP is in once this transition has been applied.
    pub fn target(&self) -> QpState {
        match self {
            Transition::Init { .. } => QpState::Init,
            Transition::Rtr { .. } => QpState::Rtr,
            Transition::Rts { .. } => QpState::Rts,
        }
    }
}

/// The connection of one local QP to one remote QP.
#[derive(Debug, Clone)]
pub struct Connection {
    local: ConnRecord,
    port: u8,
    gid_index: Option<u8>,
    remote: Option<ConnRecord>,
    state: QpState,
    /// The transition handed out and not yet reported back.
    pending: Option<Transition>,
}

impl Connection {
    /// A QP in RESET on `port`, described to the peer by `local`. `gid_index` is required on
    /// Ethernet (RoCE routes by GID) and ignored on InfiniBand.
    pub fn new(local: ConnRecord, port: u8, gid_index: Option<u8>) -> Result<Connection> {
        if local.link == LinkLayer::Ethernet && gid_index.is_none() {
            return Err(Error::Conn("a RoCE port needs a GID index".into()));
        }
        if port == 0 {
            return Err(Error::Conn("port 0: ports count from 1".into()));
        }
        Ok(Connection { local, port, gid_index, remote: None, state: QpState::Reset, pending: None })
    }

    pub fn state(&self) -> QpState {
        self.state
    }

    pub fn local(&self) -> &ConnRecord {
        &self.local
    }

    pub fn remote(&self) -> Option<&ConnRecord> {
        self.remote.as_ref()
    }

    /// Whether data may be posted (the QP is in RTS).
    pub fn is_ready(&self) -> bool {
        self.state == QpState::Rts
    }

    /// The peer's record, received once through the bootstrap.
    pub fn handle_remote(&mut self, remote: ConnRecord) -> Result<()> {
        if self.state == QpState::Error {
            return Err(Error::Conn("the connection already failed".into()));
        }
        if self.remote.is_some() {
            return Err(Error::Conn("a second connection record from the peer".into()));
        }
        if remote.link != self.local.link {
            return Err(self.fail(format!(
                "link layers differ: local {:?}, remote {:?} (InfiniBand and RoCE ports cannot connect)",
                self.local.link, remote.link
            )));
        }
        match remote.link {
            LinkLayer::Infiniband if remote.lid == 0 => {
                return Err(self.fail("the peer's InfiniBand port has LID 0 (no subnet manager?)".into()))
            }
            LinkLayer::Ethernet if remote.gid == [0; 16] => {
                return Err(self.fail("the peer's RoCE port sent an all-zero GID".into()))
            }
            _ => {}
        }
        self.remote = Some(remote);
        Ok(())
    }

    /// The next `ibv_modify_qp` to issue, if one can be issued now. Returns the same
    /// transition until it is reported back.
    pub fn poll_transition(&mut self) -> Option<Transition> {
        if let Some(t) = self.pending {
            return Some(t);
        }
        let t = match (self.state, &self.remote) {
            (QpState::Reset, _) => Transition::Init { port: self.port },
            (QpState::Init, Some(r)) => Transition::Rtr {
                port: self.port,
                dest_qpn: r.qpn,
                rq_psn: r.psn,
                mtu: self.local.mtu.min(r.mtu),
                dlid: r.lid,
                dgid: r.gid,
                gid_index: match r.link {
                    LinkLayer::Ethernet => self.gid_index,
                    LinkLayer::Infiniband => None,
                },
            },
            (QpState::Rtr, _) => Transition::Rts { sq_psn: self.local.psn },
            _ => return None,
        };
        self.pending = Some(t);
        Some(t)
    }

    /// The driver applied `t` successfully.
    pub fn handle_applied(&mut self, t: Transition) -> Result<()> {
        if self.pending != Some(t) {
            return Err(self.fail(format!("applied {t:?}, but the pending transition was {:?}", self.pending)));
        }
        self.pending = None;
        self.state = t.target();
        Ok(())
    }

    /// The driver's `ibv_modify_qp` failed: the connection is dead. Returns the error to report.
    pub fn handle_failed(&mut self, why: impl std::fmt::Display) -> Error {
        let t = self.pending.take();
        self.fail(format!("{t:?} failed: {why}"))
    }

    fn fail(&mut self, why: String) -> Error {
        self.state = QpState::Error;
        self.pending = None;
        Error::Conn(why)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(link: LinkLayer, mtu: Mtu, qpn: u32) -> ConnRecord {
        ConnRecord {
            link,
            mtu,
            qpn,
            psn: 0x12_3456,
            lid: 7,
            gid: [0xfe; 16],
            addr: 0x7f00_dead_b000,
            rkey: 0x1234,
            nslots: 8,
            slot_size: 1 << 17,
        }
    }

    #[test]
    fn record_round_trips_in_a_fixed_layout() {
        let r = record(LinkLayer::Ethernet, Mtu::M4096, 0xab_cdef);
        let b = r.encode();
        assert_eq!(b.len(), ConnRecord::LEN);
        assert_eq!(&b[0..2], &[1, 0]);
        assert_eq!(&b[4..8], &[0xef, 0xcd, 0xab, 0], "qpn little-endian");
        assert_eq!(ConnRecord::decode(&b).expect("valid"), r);
    }

    #[test]
    fn decode_rejects_malformed_bytes() {
        let good = record(LinkLayer::Infiniband, Mtu::M2048, 5).encode();
        assert!(ConnRecord::decode(&good[..ConnRecord::LEN - 1]).is_err(), "short");
        assert!(ConnRecord::decode(&[good.as_slice(), &[0]].concat()).is_err(), "long");
        assert!(ConnRecord::decode(&[]).is_err(), "empty");
        let mutate = |i: usize, v: u8| {
            let mut b = good;
            b[i] = v;
            ConnRecord::decode(&b).expect_err(&format!("byte {i} = {v}"))
        };
        assert!(mutate(0, 2).to_string().contains("version 2"));
        assert!(mutate(2, 0).to_string().contains("link layer 0"));
        assert!(mutate(3, 0).to_string().contains("MTU code 0"));
        assert!(mutate(3, 6).to_string().contains("MTU code 6"));
        assert!(mutate(7, 1).to_string().contains("24 bits"), "qpn high byte");
        assert!(mutate(11, 1).to_string().contains("24 bits"), "psn high byte");
        assert!(mutate(14, 1).to_string().contains("reserved"));
        assert!(mutate(55, 1).to_string().contains("reserved"));
        let mut b = good;
        b[44..48].fill(0);
        assert!(ConnRecord::decode(&b).expect_err("no slots").to_string().contains("empty receive ring"));
    }

    #[test]
    fn random_and_mutated_records_never_panic() {
        let good = record(LinkLayer::Ethernet, Mtu::M4096, 0x1234).encode();
        let mut x: u64 = 0x5eed;
        let mut next = || {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (x >> 33) as usize
        };
        let mut decoded = 0;
        for case in 0..100_000 {
            let mut b = good.to_vec();
            match case % 4 {
                0 => b.truncate(next() % (ConnRecord::LEN + 1)),
                1 => b.push(next() as u8),
                _ => {
                    for _ in 0..1 + next() % 3 {
                        let i = next() % b.len();
                        b[i] = next() as u8;
                    }
                }
            }
            fuzz_conn_record(&b);
            decoded += usize::from(ConnRecord::decode(&b).is_ok());
        }
        // Mutations of non-checked bytes (gid, addr, keys) still decode; the rest do not.
        assert!(decoded > 10_000 && decoded < 90_000, "decoded {decoded}");
    }

    /// Runs the driver loop as occl would, with every modify succeeding.
    fn drive(c: &mut Connection) -> Vec<Transition> {
        let mut done = Vec::new();
        while let Some(t) = c.poll_transition() {
            c.handle_applied(t).expect("in order");
            done.push(t);
        }
        done
    }

    #[test]
    fn reset_init_rtr_rts_in_order_with_the_peer_record() {
        let local = record(LinkLayer::Infiniband, Mtu::M4096, 1);
        let mut c = Connection::new(local, 1, None).expect("new");
        assert_eq!(c.state(), QpState::Reset);
        // Without the peer's record only INIT can happen.
        assert_eq!(drive(&mut c), vec![Transition::Init { port: 1 }]);
        assert_eq!(c.state(), QpState::Init);
        assert_eq!(c.poll_transition(), None);
        let remote = ConnRecord { qpn: 99, psn: 42, lid: 3, mtu: Mtu::M1024, ..local };
        c.handle_remote(remote).expect("record");
        let t = drive(&mut c);
        assert_eq!(
            t,
            vec![
                Transition::Rtr {
                    port: 1,
                    dest_qpn: 99,
                    rq_psn: 42,
                    mtu: Mtu::M1024,
                    dlid: 3,
                    dgid: local.gid,
                    gid_index: None
                },
                Transition::Rts { sq_psn: local.psn },
            ]
        );
        assert!(c.is_ready());
        assert_eq!(c.poll_transition(), None);
    }

    #[test]
    fn roce_uses_the_gid_index_and_the_smaller_mtu() {
        let local = record(LinkLayer::Ethernet, Mtu::M1024, 1);
        assert!(Connection::new(local, 1, None).is_err(), "RoCE without a GID index");
        let mut c = Connection::new(local, 2, Some(3)).expect("new");
        c.handle_remote(ConnRecord { mtu: Mtu::M4096, ..local }).expect("record");
        let t = drive(&mut c);
        assert!(matches!(t[1], Transition::Rtr { mtu: Mtu::M1024, gid_index: Some(3), port: 2, .. }), "{t:?}");
    }

    #[test]
    fn out_of_order_and_duplicate_inputs_are_errors() {
        let local = record(LinkLayer::Infiniband, Mtu::M4096, 1);
        let mut c = Connection::new(local, 1, None).expect("new");
        // Reporting a transition that was not handed out fails the connection.
        let e = c.handle_applied(Transition::Rts { sq_psn: 1 }).expect_err("not pending");
        assert!(e.to_string().contains("pending"), "{e}");
        assert_eq!(c.state(), QpState::Error);
        assert_eq!(c.poll_transition(), None, "a failed connection offers nothing");
        assert!(c.handle_remote(local).is_err());

        let mut c = Connection::new(local, 1, None).expect("new");
        c.handle_remote(local).expect("first");
        assert!(c.handle_remote(local).expect_err("second").to_string().contains("second"));
        // poll twice without applying: the same transition, not the next one.
        let t = c.poll_transition();
        assert_eq!(c.poll_transition(), t);
    }

    #[test]
    fn peer_records_that_cannot_connect_are_rejected() {
        let ib = record(LinkLayer::Infiniband, Mtu::M4096, 1);
        let roce = record(LinkLayer::Ethernet, Mtu::M4096, 1);
        let mut c = Connection::new(ib, 1, None).expect("new");
        assert!(c.handle_remote(roce).expect_err("mixed").to_string().contains("link layers differ"));
        let mut c = Connection::new(ib, 1, None).expect("new");
        assert!(c.handle_remote(ConnRecord { lid: 0, ..ib }).expect_err("lid 0").to_string().contains("LID 0"));
        let mut c = Connection::new(roce, 1, Some(0)).expect("new");
        assert!(c.handle_remote(ConnRecord { gid: [0; 16], ..roce }).is_err());
    }

    #[test]
    fn a_failed_modify_is_final() {
        let local = record(LinkLayer::Infiniband, Mtu::M4096, 1);
        let mut c = Connection::new(local, 1, None).expect("new");
        c.poll_transition().expect("init");
        let e = c.handle_failed("EINVAL");
        assert!(e.to_string().contains("Init") && e.to_string().contains("EINVAL"), "{e}");
        assert_eq!(c.state(), QpState::Error);
        assert_eq!(c.poll_transition(), None);
    }
}
