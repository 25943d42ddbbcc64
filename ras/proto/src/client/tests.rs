use super::*;

/// Feeds `input` in one call and returns every action.
fn run(session: &mut ClientSession, input: &[u8]) -> Vec<Action> {
    session.handle_bytes(input);
    std::iter::from_fn(|| session.poll_action()).collect()
}

fn replies(input: &str) -> Vec<Action> {
    run(&mut ClientSession::new(0), input.as_bytes())
}

fn reply(text: &str) -> Action {
    Action::Reply(format!("{text}\n"))
}

#[test]
fn observed_transcript_before_status() {
    // proto_probe_transcript.txt from NCCL 2.28.9, minus MONITOR (which 2.28 did not know).
    let input =
        "CLIENT PROTOCOL 1\nCLIENT PROTOCOL 2\nFOO BAR\nTIMEOUT abc\nTIMEOUT 3\nSET FORMAT xml\nSET FORMAT text\n";
    let expected = [
        "SERVER PROTOCOL 2",
        "SERVER PROTOCOL 2",
        "ERROR: Unknown command FOO BAR",
        "ERROR: Invalid timeout value abc",
        "OK",
        "ERROR: Invalid format xml",
        "OK",
    ];
    assert_eq!(replies(input), expected.map(reply));
}

#[test]
fn ncclras_flow_handshake_timeout_format_status() {
    let mut s = ClientSession::new(7);
    assert!(!s.handshake_done());
    assert_eq!(run(&mut s, b"CLIENT PROTOCOL 2\n"), [reply("SERVER PROTOCOL 2")]);
    assert!(s.handshake_done());
    assert_eq!(s.client_version(), Some(2));
    assert_eq!(run(&mut s, b"TIMEOUT 10\n"), [reply("OK")]);
    assert_eq!(run(&mut s, b"SET FORMAT json\n"), [reply("OK")]);
    let status = Action::Status { verbose: true, format: Format::Json, timeout: Timeout::Seconds(10) };
    assert_eq!(run(&mut s, b"VERBOSE STATUS\n"), [status]);
    assert_eq!(s.opened_ms(), 7);
    // Out of the command state: nothing more is interpreted or buffered.
    assert_eq!(run(&mut s, b"STATUS\nCLIENT PROTOCOL 2\npartial"), []);
    assert_eq!(s.buffered_len(), 0);
    assert!(!s.is_closed());
}

#[test]
fn status_without_handshake_uses_defaults() {
    let mut s = ClientSession::new(0);
    let status = Action::Status { verbose: false, format: Format::Text, timeout: Timeout::Default };
    assert_eq!(run(&mut s, b"STATUS\n"), [status]);
    assert!(!s.handshake_done());
}

#[test]
fn client_protocol_version_is_ignored() {
    for line in ["CLIENT PROTOCOL 1", "CLIENT PROTOCOL 3", "CLIENT PROTOCOL", "client protocol x"] {
        assert_eq!(replies(&format!("{line}\n")), [reply("SERVER PROTOCOL 2")], "{line}");
    }
    assert_eq!(replies("CLIENT\n"), [reply("ERROR: Unknown command CLIENT")]);
    assert_eq!(replies("CLIENTPROTOCOL 2\n"), [reply("ERROR: Unknown command CLIENTPROTOCOL 2")]);
}

#[test]
fn timeout_values() {
    let mut s = ClientSession::new(0);
    assert_eq!(run(&mut s, b"TIMEOUT 0\n"), [reply("OK")]);
    assert_eq!(s.timeout(), Timeout::Disabled);
    assert_eq!(run(&mut s, b"timeout 18446744073709551615\n"), [reply("OK")]);
    assert_eq!(s.timeout(), Timeout::Seconds(u64::MAX));
    assert_eq!(run(&mut s, b"TIMEOUT 3s\n"), [reply("ERROR: Invalid timeout value 3s")]);
    assert_eq!(s.timeout(), Timeout::Seconds(u64::MAX), "a rejected value changes nothing");
    // One session each: a session closes after a few bad lines.
    for bad in ["-1", "+3", "3 4", "3s", "1.5", "18446744073709551616"] {
        let want = reply(&format!("ERROR: Invalid timeout value {bad}"));
        assert_eq!(replies(&format!("TIMEOUT {bad}\n")), [want], "{bad}");
    }
    assert_eq!(replies("TIMEOUT\n"), [reply("ERROR: Missing timeout value")]);
    assert_eq!(replies("TIMEOUT   \n"), [reply("ERROR: Missing timeout value")]);
    assert_eq!(replies("TIMEOUTS 3\n"), [reply("ERROR: Unknown command TIMEOUTS 3")]);
}

#[test]
fn set_format() {
    let mut s = ClientSession::new(0);
    assert_eq!(run(&mut s, b"set format JSON\n"), [reply("OK")]);
    assert_eq!(s.format(), Format::Json);
    assert_eq!(run(&mut s, b"Set Format Text\n"), [reply("OK")]);
    assert_eq!(s.format(), Format::Text);
    assert_eq!(run(&mut s, b"SET FORMAT json text\n"), [reply("ERROR: Invalid format json text")]);
    assert_eq!(run(&mut s, b"SET FORMAT\n"), [reply("ERROR: Missing format")]);
    assert_eq!(run(&mut s, b"SET COLOR red\n"), [reply("ERROR: Unknown command SET COLOR red")]);
    assert_eq!(s.format(), Format::Text);
}

#[test]
fn status_variants_and_case() {
    let st = |verbose| Action::Status { verbose, format: Format::Text, timeout: Timeout::Default };
    assert_eq!(replies("status\n"), [st(false)]);
    assert_eq!(replies("  Verbose\t  Status  \n"), [st(true)]);
    assert_eq!(replies("STATUS now\n"), [reply("ERROR: Unknown command STATUS now")]);
    assert_eq!(replies("VERBOSE\n"), [reply("ERROR: Unknown command VERBOSE")]);
    assert_eq!(replies("STATUSX\n"), [reply("ERROR: Unknown command STATUSX")]);
}

#[test]
fn monitor_groups() {
    let mon = |lifecycle, trace| Action::Monitor { groups: EventGroups { lifecycle, trace }, format: Format::Text };
    assert_eq!(replies("MONITOR\n"), [reply("OK"), mon(true, false)]);
    assert_eq!(replies("monitor trace\n"), [reply("OK"), mon(false, true)]);
    assert_eq!(replies("MONITOR lifecycle, TRACE\n"), [reply("OK"), mon(true, true)]);
    assert_eq!(replies("MONITOR all\n"), [reply("OK"), mon(true, true)]);
    assert_eq!(replies("MONITOR bogus\n"), [reply("ERROR: Invalid event group 'bogus'")]);
    assert_eq!(replies("MONITOR trace,,all\n"), [reply("ERROR: Invalid event group ''")]);
    // The JSON format carries over, and input after MONITOR is not interpreted.
    let mut s = ClientSession::new(0);
    let json = Action::Monitor { groups: EventGroups::ALL, format: Format::Json };
    assert_eq!(run(&mut s, b"SET FORMAT json\nMONITOR all\nSTATUS\n"), [reply("OK"), reply("OK"), json]);
}

#[test]
fn split_input_across_calls() {
    let mut s = ClientSession::new(0);
    for b in b"CLIENT PROTOCOL 2\r" {
        assert_eq!(run(&mut s, &[*b]), []);
    }
    assert_eq!(run(&mut s, b"\nTIME"), [reply("SERVER PROTOCOL 2")]);
    assert_eq!(run(&mut s, b"OUT 5"), []);
    assert_eq!(run(&mut s, b"\n"), [reply("OK")]);
    assert_eq!(s.timeout(), Timeout::Seconds(5));
}

#[test]
fn coalesced_input_and_crlf() {
    let input = "CLIENT PROTOCOL 2\r\nTIMEOUT 1\r\nSET FORMAT json\r\nSTATUS\r\n";
    let status = Action::Status { verbose: false, format: Format::Json, timeout: Timeout::Seconds(1) };
    assert_eq!(replies(input), [reply("SERVER PROTOCOL 2"), reply("OK"), reply("OK"), status]);
    // Only one CR before the LF is dropped; the echo keeps anything else as sent.
    assert_eq!(replies("FOO\r\r\n"), [reply("ERROR: Unknown command FOO\r")]);
}

#[test]
fn empty_lines_are_ignored() {
    assert_eq!(replies("\n\r\n   \n\t\r\nTIMEOUT 2\n\n"), [reply("OK")]);
}

#[test]
fn unknown_command_echoes_line_as_sent() {
    assert_eq!(replies("  foo  bar \n"), [reply("ERROR: Unknown command   foo  bar ")]);
    assert_eq!(replies("HELLO\nTIMEOUT 1\n"), [reply("ERROR: Unknown command HELLO"), reply("OK")]);
}

#[test]
fn non_utf8_bytes() {
    assert_eq!(run(&mut ClientSession::new(0), b"\xff\xfe\n"), [reply("ERROR: Unknown command \u{fffd}\u{fffd}")]);
    assert_eq!(run(&mut ClientSession::new(0), b"STAT\xc3US\n"), [reply("ERROR: Unknown command STAT\u{fffd}US")]);
    let got = run(&mut ClientSession::new(0), b"TIMEOUT \x80\nSET FORMAT j\xffson\n");
    assert_eq!(got, [reply("ERROR: Invalid timeout value \u{fffd}"), reply("ERROR: Invalid format j\u{fffd}son")]);
    // A multi-byte character split across calls is reassembled before decoding.
    let mut s = ClientSession::new(0);
    run(&mut s, b"X\xc3");
    assert_eq!(run(&mut s, b"\xa9\n"), [reply("ERROR: Unknown command X\u{e9}")]);
}

#[test]
fn line_limit_boundary() {
    let too_long = || [reply("ERROR: Command line too long (more than 1023 bytes)"), Action::Close];
    // 1023 bytes of text plus LF fit in NCCL's 1024-byte buffer.
    let mut line = vec![b'x'; MAX_LINE_BYTES - 1];
    line.push(b'\n');
    let got = run(&mut ClientSession::new(0), &line);
    assert_eq!(got, [Action::Reply(format!("ERROR: Unknown command {}\n", "x".repeat(1023)))]);
    // 1024 bytes with no LF fill the buffer: error, then close, without waiting for the LF.
    let mut s = ClientSession::new(0);
    assert_eq!(run(&mut s, &[b'x'; MAX_LINE_BYTES - 1]), []);
    assert_eq!(s.buffered_len(), MAX_LINE_BYTES - 1);
    assert_eq!(run(&mut s, b"x"), too_long());
    assert!(s.is_closed());
    assert_eq!(s.buffered_len(), 0);
    assert_eq!(run(&mut s, b"STATUS\n"), [], "nothing after Close");
    // The same when the over-long line arrives in one call with its LF, after a good command.
    let mut big = b"TIMEOUT 1\n".to_vec();
    big.extend_from_slice(&[b'y'; MAX_LINE_BYTES]);
    big.extend_from_slice(b"\nSTATUS\n");
    let mut want = vec![reply("OK")];
    want.extend(too_long());
    assert_eq!(run(&mut ClientSession::new(0), &big), want);
}

#[test]
fn bad_lines_get_a_few_errors_then_a_final_one_and_close() {
    // Issue 26: a megabyte of garbage lines was echoed back as two megabytes of errors.
    let mut s = ClientSession::new(0);
    let flood = "FOO\n".repeat(1 << 18);
    s.handle_bytes(flood.as_bytes());
    assert!(s.is_closed());
    let mut want = vec![reply("ERROR: Unknown command FOO"); MAX_BAD_LINES as usize];
    want.push(reply("ERROR: 4 invalid commands; closing the connection (send CLIENT PROTOCOL 2, then STATUS)"));
    want.push(Action::Close);
    assert_eq!(std::iter::from_fn(|| s.poll_action()).collect::<Vec<_>>(), want);
    assert_eq!(s.lines_handled(), 4, "nothing after the close is read");
    // Good lines between bad ones do not reset the count, and blank lines are not bad.
    let got = replies("FOO\nTIMEOUT 1\n\nBAR\n\n\nSET FORMAT xml\nBAZ\nSTATUS\n");
    let tail = [
        reply("ERROR: 4 invalid commands; closing the connection (send CLIENT PROTOCOL 2, then STATUS)"),
        Action::Close,
    ];
    assert_eq!(got[got.len() - 2..], tail, "{got:?}");
    assert_eq!(got.len(), 6, "{got:?}");
    // Split across reads as a socket delivers them, the same.
    let mut s = ClientSession::new(0);
    let mut all = Vec::new();
    for chunk in flood.as_bytes()[..4096].chunks(7) {
        all.extend(run(&mut s, chunk));
    }
    assert_eq!(all.len(), MAX_BAD_LINES as usize + 2);
}

#[test]
fn pipelined_flood_is_cut_off() {
    let mut s = ClientSession::new(0);
    let flood = "TIMEOUT 1\n".repeat(30_000);
    s.handle_bytes(flood.as_bytes());
    assert!(s.is_closed());
    assert!(s.buffered_len() <= MAX_PENDING_REPLY_BYTES + 64);
    let actions: Vec<_> = std::iter::from_fn(|| s.poll_action()).collect();
    assert_eq!(actions.last(), Some(&Action::Close));
    assert_eq!(actions[actions.len() - 2], reply("ERROR: Too many unanswered commands"));
    assert_eq!(s.buffered_len(), 0);
    // Polling between reads keeps a long, well-behaved pipeline going.
    let mut s = ClientSession::new(0);
    for _ in 0..10_000 {
        assert_eq!(run(&mut s, b"TIMEOUT 1\n"), [reply("OK")]);
    }
}

/// xorshift64*: deterministic, no crate.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

#[test]
fn random_bytes_never_panic_and_stay_bounded() {
    const WORDS: [&[u8]; 12] = [
        b"CLIENT PROTOCOL 2",
        b"TIMEOUT ",
        b"SET FORMAT ",
        b"json",
        b"STATUS",
        b"VERBOSE ",
        b"MONITOR ",
        b"trace,",
        b"\r\n",
        b"\n",
        b" ",
        b"\xff",
    ];
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let bound = MAX_LINE_BYTES + MAX_PENDING_REPLY_BYTES + 128;
    let (mut ok, mut status, mut closed, mut cut_off) = (0, 0, 0, 0);
    for _ in 0..10_000 {
        let len = (rng.next() % 2048) as usize;
        let mut data = Vec::with_capacity(len + 32);
        while data.len() < len {
            let r = rng.next();
            match r % 4 {
                0 => data.extend_from_slice(WORDS[(r >> 8) as usize % WORDS.len()]),
                1 => data.push(b'0' + (r >> 8) as u8 % 10),
                _ => data.push((r >> 8) as u8),
            }
        }
        if rng.next() & 7 == 0 {
            // Some inputs with no LF at all, so over-long lines are exercised too.
            data.iter_mut().filter(|b| **b == b'\n').for_each(|b| *b = b'x');
        }
        fuzz_client_bytes(&data);
        // Also fed whole, without polling in between.
        let mut s = ClientSession::new(0);
        s.handle_bytes(&data);
        assert!(s.buffered_len() <= bound);
        while let Some(action) = s.poll_action() {
            match action {
                Action::Reply(text) if text == "OK\n" => ok += 1,
                Action::Status { .. } => status += 1,
                Action::Close => closed += 1,
                Action::Reply(text) if text.contains("invalid commands; closing") => cut_off += 1,
                _ => {}
            }
        }
        assert!(s.buffered_len() < MAX_LINE_BYTES);
    }
    // The generator reaches the interesting paths, not just "Unknown command" (most inputs hold more than a few bad
    // lines, so most sessions end cut off; enough reach a report first).
    assert!(
        ok > 30 && status > 30 && closed > 100 && cut_off > 100,
        "ok {ok}, status {status}, closed {closed}, cut off {cut_off}"
    );
}

#[test]
fn job_picks_one_of_the_nodes_jobs() {
    let mut s = ClientSession::new(0);
    assert_eq!(s.job(), None);
    assert_eq!(run(&mut s, b"JOB 4242\n"), [reply("OK")]);
    assert_eq!(s.job(), Some("4242"));
    assert_eq!(run(&mut s, b"job  run-7:b\n"), [reply("OK")], "a later JOB replaces it; keywords in any case");
    assert_eq!(s.job(), Some("run-7:b"));
    assert_eq!(
        run(&mut s, b"JOB\nJOB a b\n"),
        [reply("ERROR: Invalid job name ''"), reply("ERROR: Invalid job name 'a b'")]
    );
    assert_eq!(s.job(), Some("run-7:b"));
    let long = format!("JOB {}\n", "x".repeat(MAX_JOB_NAME + 1));
    assert!(
        matches!(&run(&mut s, long.as_bytes())[..], [Action::Reply(r)] if r.starts_with("ERROR: Invalid job name"))
    );
    assert_eq!(
        run(&mut s, b"STATUS\n"),
        [Action::Status { verbose: false, format: Format::Text, timeout: Timeout::Default }]
    );
    assert_eq!(s.job(), Some("run-7:b"));
}
