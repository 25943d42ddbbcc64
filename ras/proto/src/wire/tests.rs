use super::*;
use crate::record::{CollType, CommId, Failure, InFlight, LiveSnapshot, RankInfo};
use crate::test_rng::TestRng;

fn string(rng: &mut TestRng, max: usize) -> String {
    const PIECES: [&str; 6] = ["a", "192.0.2.2", ":", "é", "節", "[::1]:28028"];
    let mut s = String::new();
    let n = rng.usize(8);
    for _ in 0..n {
        let p = PIECES[rng.usize(PIECES.len())];
        if s.len() + p.len() > max {
            break;
        }
        s.push_str(p);
    }
    s
}

fn opt<T>(rng: &mut TestRng, f: impl FnOnce(&mut TestRng) -> T) -> Option<T> {
    rng.chance(50).then(|| f(rng))
}

fn record(rng: &mut TestRng) -> RankRecord {
    let size = 1 + rng.below(u64::from(crate::record::MAX_COMM_RANKS)) as u32;
    RankRecord {
        info: RankInfo {
            comm: CommId { hash: rng.u64(), root_host_hash: rng.u64(), root_pid_hash: rng.u64() },
            size,
            rank: rng.below(u64::from(size)) as u32,
            pid: rng.wide() as u32,
            host: string(rng, 40),
            cuda_dev: opt(rng, |r| r.wide() as u32),
            nvml_dev: opt(rng, |r| r.wide() as u32),
        },
        live: LiveSnapshot {
            launched: std::array::from_fn(|_| rng.wide()),
            completed: std::array::from_fn(|_| rng.wide()),
            init_state: rng.wide() as i32,
            async_error: -(rng.below(9) as i32),
            finalize_called: rng.chance(50),
            destroy_flag: rng.chance(50),
            abort_flag: rng.chance(50),
            in_flight: opt(rng, in_flight),
            failed: rng.wide(),
            last_failure: opt(rng, |r| Failure {
                op: opt(r, in_flight),
                at_ns: r.wide(),
                result: -(r.below(9) as i32),
                error: string(r, 200),
            }),
        },
    }
}

fn in_flight(r: &mut TestRng) -> InFlight {
    InFlight {
        seq: r.wide(),
        coll: CollType::ALL[r.usize(8)],
        coll_seq: r.wide(),
        bytes: r.wide(),
        start_ns: r.wide(),
        peer: opt(r, |r| r.wide() as u32),
        step_state: opt(r, |r| r.below(32) as u32),
    }
}

fn peers(rng: &mut TestRng, max: usize) -> Vec<PeerId> {
    (0..rng.usize(max)).map(|_| PeerId(rng.wide() as u32)).collect()
}

fn status(rng: &mut TestRng) -> ProcessStatus {
    ProcessStatus {
        peer: PeerId(rng.wide() as u32),
        addr: string(rng, 64),
        host: string(rng, 64),
        pid: rng.wide() as u32,
        epoch: rng.wide() as u32,
        records: (0..rng.usize(4)).map(|_| record(rng)).collect(),
        dead: peers(rng, 4),
        unresponsive: peers(rng, 4),
    }
}

pub(crate) fn random_msg(rng: &mut TestRng) -> Msg {
    let nonce = |rng: &mut TestRng| -> [u8; 16] { std::array::from_fn(|_| rng.u64() as u8) };
    match rng.below(10) {
        0 => Msg::Hello(Hello {
            table_hash: rng.u64(),
            from: PeerId(rng.wide() as u32),
            from_addr: string(rng, 64),
            epoch: rng.wide() as u32,
            nonce: nonce(rng),
        }),
        1 => Msg::HelloAck(HelloAck {
            from: PeerId(rng.wide() as u32),
            epoch: rng.wide() as u32,
            nonce: nonce(rng),
            proof: nonce(rng),
        }),
        2 => Msg::HelloFinish(HelloFinish { proof: nonce(rng) }),
        3 => Msg::KeepAlive(KeepAlive {
            table_hash: rng.u64(),
            news_digest: rng.u64(),
            dead: rng.wide() as u32,
            unresponsive: rng.wide() as u32,
            link: rng.chance(50),
        }),
        4 => Msg::PeerNews(PeerNews {
            id: NewsId { origin: PeerId(rng.wide() as u32), seq: rng.wide() },
            items: (0..rng.usize(5))
                .map(|_| NewsItem { peer: PeerId(rng.wide() as u32), epoch: rng.wide() as u32, dead: rng.chance(50) })
                .collect(),
        }),
        5 => Msg::StatusRequest(StatusRequest {
            id: RequestId { origin: PeerId(rng.wide() as u32), seq: rng.wide() },
            budget_ns: rng.wide(),
            path: peers(rng, 6),
        }),
        6 => Msg::StatusReply(StatusReply {
            id: RequestId { origin: PeerId(rng.wide() as u32), seq: rng.wide() },
            duplicate: rng.chance(50),
            leg_timeouts: rng.wide() as u32,
            statuses: (0..rng.usize(4)).map(|_| status(rng)).collect(),
        }),
        7 => Msg::MetricsRequest(MetricsRequest { seq: rng.wide() }),
        8 => Msg::MetricsReply(MetricsReply { seq: rng.wide(), text: string(rng, 300) }),
        _ => Msg::Bye(ByeReason::from_code(rng.u64() as u8)),
    }
}

fn frame(msg: &Msg) -> Vec<u8> {
    let mut buf = Vec::new();
    encode(msg, &mut buf).expect("encode");
    buf
}

/// Feeds `bytes` in chunks of random sizes and collects what comes out, stopping at the first error.
fn decode_chunked(rng: &mut TestRng, bytes: &[u8]) -> (Vec<Msg>, Option<WireError>) {
    let mut dec = Decoder::new();
    let mut out = Vec::new();
    let mut rest = bytes;
    while !rest.is_empty() {
        let n = (1 + rng.usize(300)).min(rest.len());
        let (chunk, tail) = rest.split_at(n);
        rest = tail;
        dec.push(chunk).expect("push within bounds");
        loop {
            match dec.next() {
                Ok(Some(m)) => out.push(m),
                Ok(None) => break,
                Err(e) => return (out, Some(e)),
            }
        }
    }
    (out, None)
}

#[test]
fn random_messages_round_trip_in_any_split() {
    let mut rng = TestRng::new(1);
    for _ in 0..2_000 {
        let msgs: Vec<Msg> = (0..1 + rng.usize(6)).map(|_| random_msg(&mut rng)).collect();
        let mut bytes = Vec::new();
        for m in &msgs {
            let before = bytes.len();
            encode(m, &mut bytes).expect("encode");
            assert_eq!(bytes.len() - before, encoded_len(m).expect("len"));
        }
        let (out, err) = decode_chunked(&mut rng, &bytes);
        assert_eq!(err, None);
        assert_eq!(out, msgs);
    }
}

#[test]
fn known_frame_layout() {
    let bytes = frame(&Msg::Bye(ByeReason::Duplicate));
    assert_eq!(bytes, [0, 0, 0, 3, VERSION, 8, 1]);
    let ka = Msg::KeepAlive(KeepAlive { table_hash: 1, news_digest: 2, dead: 300, unresponsive: 0, link: true });
    let bytes = frame(&ka);
    assert_eq!(&bytes[..6], &[0, 0, 0, 22, VERSION, 4]);
    assert_eq!(&bytes[6..22], &[0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2]);
    assert_eq!(&bytes[22..], &[0xac, 0x02, 0, 1], "varint 300, varint 0, bool");
}

#[test]
fn every_bound_is_enforced_on_both_sides() {
    // Encoding refuses what decoding would refuse.
    let long = Msg::Hello(Hello {
        table_hash: 0,
        from: PeerId(0),
        from_addr: "x".repeat(MAX_STRING + 1),
        epoch: 0,
        nonce: [0; 16],
    });
    let mut buf = vec![9];
    assert!(matches!(encode(&long, &mut buf), Err(WireError::TooLong { .. })));
    assert_eq!(buf, [9], "a failed encode leaves the buffer as it was");
    let path = Msg::StatusRequest(StatusRequest {
        id: RequestId { origin: PeerId(0), seq: 0 },
        budget_ns: 0,
        path: vec![PeerId(1); MAX_PATH + 1],
    });
    assert!(matches!(encoded_len(&path), Err(WireError::TooLong { .. })));
    let mut bad = record(&mut TestRng::new(3));
    bad.info.rank = bad.info.size;
    let reply = Msg::StatusReply(StatusReply {
        id: RequestId { origin: PeerId(0), seq: 0 },
        duplicate: false,
        leg_timeouts: 0,
        statuses: vec![ProcessStatus {
            peer: PeerId(0),
            addr: String::new(),
            host: String::new(),
            pid: 0,
            epoch: 0,
            records: vec![bad],
            dead: vec![],
            unresponsive: vec![],
        }],
    });
    assert!(matches!(encoded_len(&reply), Err(WireError::Invalid(_))));

    // A string of MAX_STRING bytes is fine.
    let ok =
        Msg::Hello(Hello { table_hash: 0, from: PeerId(0), from_addr: "é".repeat(2048), epoch: 0, nonce: [0; 16] });
    let (out, err) = decode_chunked(&mut TestRng::new(0), &frame(&ok));
    assert_eq!((out, err), (vec![ok], None));
}

fn decode_one(bytes: &[u8]) -> Result<Option<Msg>, WireError> {
    let mut dec = Decoder::new();
    dec.push(bytes).expect("push");
    dec.next()
}

#[test]
fn hostile_frames_fail_without_allocating() {
    // A length beyond the limit fails as soon as the header is in, before any body is buffered.
    let mut dec = Decoder::new();
    dec.push(&u32::MAX.to_be_bytes()).expect("push");
    assert_eq!(dec.next(), Err(WireError::FrameTooLarge { len: u32::MAX as usize, max: MAX_FRAME }));
    assert_eq!(dec.buffered(), 0);
    // ... and the error sticks.
    dec.push(&frame(&Msg::Bye(ByeReason::Shutdown))).expect("push");
    assert!(dec.next().is_err());

    let mut small = Decoder::handshake();
    small.push(&((HANDSHAKE_MAX_FRAME + 1) as u32).to_be_bytes()).expect("push");
    assert!(matches!(small.next(), Err(WireError::FrameTooLarge { .. })));

    assert_eq!(decode_one(&[0, 0, 0, 1, VERSION]), Err(WireError::FrameTooShort { len: 1 }));
    assert_eq!(decode_one(&[0, 0, 0, 2, 9, 8]), Err(WireError::Version(9)));
    assert_eq!(decode_one(&[0, 0, 0, 2, VERSION, 99]), Err(WireError::UnknownType(99)));
    assert_eq!(decode_one(&[0, 0, 0, 4, VERSION, 8, 0, 0]), Err(WireError::TrailingBytes(1)));
    assert_eq!(decode_one(&[0, 0, 0, 2, VERSION, 8]), Err(WireError::Truncated("bye")));
    // A status reply claiming 2^62 statuses in a 20-byte frame.
    let mut body = vec![VERSION, 7, 0, 0, 0, 0];
    body.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x3f]);
    let mut bytes = (body.len() as u32).to_be_bytes().to_vec();
    bytes.extend_from_slice(&body);
    assert!(matches!(decode_one(&bytes), Err(WireError::TooLong { .. })));
    // 65536 news items claimed, none present.
    let body = [VERSION, 5, 0, 0, 0x80, 0x80, 0x04];
    let mut bytes = (body.len() as u32).to_be_bytes().to_vec();
    bytes.extend_from_slice(&body);
    assert_eq!(decode_one(&bytes), Err(WireError::Truncated("peer news: items")));
    // An 11-byte varint, and a 10-byte one that overflows.
    let body = [VERSION, 8 - 2, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01];
    let mut bytes = (body.len() as u32).to_be_bytes().to_vec();
    bytes.extend_from_slice(&body);
    assert!(matches!(decode_one(&bytes), Err(WireError::Invalid(_))));
    let body = [VERSION, 6, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02];
    let mut bytes = (body.len() as u32).to_be_bytes().to_vec();
    bytes.extend_from_slice(&body);
    assert!(matches!(decode_one(&bytes), Err(WireError::Invalid(_))));
    // Bad bool and invalid UTF-8.
    let mut ka =
        frame(&Msg::KeepAlive(KeepAlive { table_hash: 0, news_digest: 0, dead: 0, unresponsive: 0, link: true }));
    *ka.last_mut().expect("byte") = 2;
    assert!(matches!(decode_one(&ka), Err(WireError::Invalid(_))));
    let mut hello =
        frame(&Msg::Hello(Hello { table_hash: 0, from: PeerId(0), from_addr: "ab".into(), epoch: 0, nonce: [0; 16] }));
    hello[6 + 8 + 1 + 1] = 0xff;
    assert!(matches!(decode_one(&hello), Err(WireError::Invalid(_))));
}

#[test]
fn push_is_bounded() {
    let mut dec = Decoder::with_max_frame(1000);
    dec.push(&[0u8; 3]).expect("push");
    let err = dec.push(&vec![0u8; decoder::max_buffered(1000)]).expect_err("too much");
    assert!(matches!(err, WireError::BufferFull { .. }));
    assert_eq!(dec.buffered(), 3, "a refused push takes nothing");
}

/// A valid stream, then damaged: bytes flipped, cut, duplicated, inserted, or replaced by noise.
fn mutate(rng: &mut TestRng, mut bytes: Vec<u8>) -> Vec<u8> {
    for _ in 0..1 + rng.usize(4) {
        match rng.below(6) {
            0 if !bytes.is_empty() => {
                let i = rng.usize(bytes.len());
                bytes[i] ^= 1 << rng.below(8);
            }
            1 if !bytes.is_empty() => {
                let i = rng.usize(bytes.len());
                bytes[i] = rng.u64() as u8;
            }
            2 => bytes.truncate(rng.usize(bytes.len() + 1)),
            3 => {
                let i = rng.usize(bytes.len() + 1);
                let n = 1 + rng.usize(8);
                let noise = rng.bytes(n);
                bytes.splice(i..i, noise);
            }
            4 if !bytes.is_empty() => {
                let i = rng.usize(bytes.len());
                let j = (i + 1 + rng.usize(16)).min(bytes.len());
                let copy = bytes[i..j].to_vec();
                bytes.splice(i..i, copy);
            }
            _ => {
                let n = rng.usize(64);
                bytes = rng.bytes(n);
            }
        }
    }
    bytes
}

#[test]
fn random_truncated_and_mutated_bytes_never_panic() {
    // 300,000 cases from a fixed seed; each goes through the fuzz entry (which also checks re-encoding) and through a
    // decoder in random chunks.
    let mut rng = TestRng::new(0x5eed);
    let mut decoded = 0usize;
    let mut errors = 0usize;
    for case in 0..300_000u32 {
        let mut bytes = Vec::new();
        for _ in 0..1 + rng.usize(3) {
            bytes.extend(frame(&random_msg(&mut rng)));
        }
        let bytes = if case % 10 == 0 { bytes } else { mutate(&mut rng, bytes) };
        fuzz_wire_bytes(&bytes);
        let (out, err) = decode_chunked(&mut rng, &bytes);
        decoded += out.len();
        errors += usize::from(err.is_some());
    }
    // Both paths were exercised: many mutated streams still carry whole messages, many do not.
    assert!(decoded > 100_000 && errors > 100_000, "decoded {decoded}, errors {errors}");
}

#[test]
fn a_frame_of_the_maximum_size_decodes() {
    // One status reply close to 16 MiB: records with long host names.
    let mut rng = TestRng::new(9);
    let mut rec = record(&mut rng);
    rec.info.host = "h".repeat(MAX_STRING);
    let per = ProcessStatus {
        peer: PeerId(1),
        addr: String::new(),
        host: String::new(),
        pid: 1,
        epoch: 0,
        records: vec![rec; 1000],
        dead: vec![],
        unresponsive: vec![],
    };
    let mut reply = StatusReply {
        id: RequestId { origin: PeerId(0), seq: 1 },
        duplicate: false,
        leg_timeouts: 0,
        statuses: vec![],
    };
    while reply_len(&reply).expect("len")
        + reply_len(&StatusReply { statuses: vec![per.clone()], ..reply.clone() }).expect("len")
        < MAX_FRAME
    {
        reply.statuses.push(per.clone());
    }
    let msg = Msg::StatusReply(reply);
    let bytes = frame(&msg);
    assert!(bytes.len() > MAX_FRAME / 2 && bytes.len() <= MAX_FRAME + HEADER_LEN, "{}", bytes.len());
    let mut dec = Decoder::new();
    let mut got = None;
    for chunk in bytes.chunks(decoder::MAX_PUSH) {
        dec.push(chunk).expect("push");
        if let Some(m) = dec.next().expect("decode") {
            got = Some(m);
        }
    }
    assert_eq!(got, Some(msg));
    assert_eq!(dec.buffered(), 0);
}

#[test]
fn metrics_text_is_bounded_on_both_sides() {
    let long = Msg::MetricsReply(MetricsReply { seq: 1, text: "x".repeat(MAX_METRICS_TEXT + 1) });
    assert!(matches!(encode(&long, &mut Vec::new()), Err(WireError::TooLong { .. })));
    let fits = Msg::MetricsReply(MetricsReply { seq: u64::MAX, text: "y".repeat(MAX_METRICS_TEXT) });
    let bytes = frame(&fits);
    assert_eq!(decode_one(&bytes), Ok(Some(fits)));
    // A length above the bound is refused before anything is read or reserved.
    let mut hostile = vec![0, 0, 0, 0, VERSION, 10, 1];
    let mut n = (MAX_METRICS_TEXT + 1) as u64;
    while n >= 0x80 {
        hostile.push((n as u8) | 0x80);
        n >>= 7;
    }
    hostile.push(n as u8);
    let len = (hostile.len() - HEADER_LEN) as u32;
    hostile[..4].copy_from_slice(&len.to_be_bytes());
    assert!(matches!(decode_one(&hostile), Err(WireError::TooLong { what: "metrics reply: text", .. })));
    // Text must be UTF-8.
    let mut bad = frame(&Msg::MetricsReply(MetricsReply { seq: 0, text: "ab".into() }));
    let at = bad.len() - 1;
    bad[at] = 0xff;
    assert_eq!(decode_one(&bad), Err(WireError::Invalid("metrics reply: text")));
}
