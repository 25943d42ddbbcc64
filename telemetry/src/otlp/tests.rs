//! The exporter in process, against loopback sockets: it never blocks the emitting thread, it
//! counts what it cannot deliver, and what it delivers as OTLP/JSON has the tree's links.

use super::*;
use crate::event::{EventDescr, EventId, StateArgs};
use crate::sink::Sink;
use crate::spans::Telemetry;
use std::io::{BufRead, BufReader, Read, Write};
use std::num::NonZeroU64;
use std::time::Instant;

fn id(n: u64) -> EventId {
    EventId(NonZeroU64::new(n).expect("non-zero"))
}

fn meta() -> CommMeta {
    CommMeta { name: Some("unit".into()), hash: 0xfeed, rank: 0, nranks: 2, n_nodes: 1 }
}

/// One all-reduce tree in occl's order: GroupApi, CollApi, Group, Coll, a ProxyOp with one step.
fn tree(s: &dyn Sink, base: u64, seq: u64) {
    let (ga, api, g, c, op, st) = (id(base), id(base + 1), id(base + 2), id(base + 3), id(base + 4), id(base + 5));
    s.start(ga, None, &EventDescr::GroupApi { graph_captured: false, group_depth: 1 });
    let d = EventDescr::CollApi {
        func: "AllReduce",
        count: 4,
        datatype: "ncclFloat32",
        root: 0,
        stream: 0,
        graph_captured: false,
    };
    s.start(api, Some(ga), &d);
    s.stop(api);
    s.start(g, None, &EventDescr::Group);
    let d = EventDescr::Coll {
        rank: 0,
        seq_number: seq,
        func: "AllReduce",
        send_buff: 0,
        recv_buff: 0,
        count: 4,
        root: 0,
        datatype: "ncclFloat32",
        n_channels: 1,
        n_warps: 0,
        algo: "RING",
        proto: "SIMPLE",
        parent_group: Some(g),
    };
    s.start(c, Some(api), &d);
    let d = EventDescr::ProxyOp { rank: 0, pid: 1, channel_id: 0, peer: 1, n_steps: 1, chunk_size: 16, is_send: true };
    s.start(op, Some(c), &d);
    s.start(st, Some(op), &EventDescr::ProxyStep { rank: 0, step: 0 });
    s.state(st, &StateArgs::ProxyStep { state: crate::ProxyStepState::SendWait, trans_size: 16 });
    s.stop(st);
    s.stop(op);
    s.stop(c);
    s.stop(g);
    s.stop(ga);
}

const SPANS_PER_TREE: u64 = 6;

fn closed_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port()
}

#[test]
fn a_down_collector_never_blocks_and_every_lost_span_is_counted() {
    let cfg = OtlpConfig {
        endpoint: format!("http://127.0.0.1:{}/v1/traces", closed_port()),
        max_queue: 64,
        max_batch: 16,
        schedule_delay: Duration::from_millis(5),
        step_sampling: 1.0,
        timeout: Duration::from_millis(500),
        ..OtlpConfig::default()
    };
    let exp = OtlpExporter::new(cfg).expect("exporter");
    let t = Telemetry::new(vec![exp.clone()]);
    let s = t.comm_sink(meta());
    let trees = 2000u64;
    let t0 = Instant::now();
    for i in 0..trees {
        tree(&*s, 1 + i * 10, i + 1);
    }
    let emit = t0.elapsed();
    s.finalize();
    // Finalize waits at most the export timeout; the thread's last attempts end soon after.
    assert!(exp.flush_within(Duration::from_secs(10)), "the export thread finishes its backlog");
    let st = exp.stats();
    assert_eq!(st.exported, 0);
    assert_eq!(st.dropped(), trees * SPANS_PER_TREE, "{st:?}");
    assert!(st.dropped_queue_full > 0 && st.dropped_export_failed > 0, "{st:?}");
    // 12,000 spans: a blocking exporter would take seconds of connect attempts.
    assert!(emit < Duration::from_secs(2), "emitting took {emit:?}");
    let mut m = String::new();
    exp.render_metrics(&mut m);
    assert!(
        m.contains(&format!("occl_otlp_spans_dropped_total{{reason=\"queue_full\"}} {}\n", st.dropped_queue_full)),
        "{m}"
    );
    assert!(m.contains(&format!(
        "occl_otlp_spans_dropped_total{{reason=\"export_failed\"}} {}\n",
        st.dropped_export_failed
    )));
    assert!(m.contains("occl_otlp_spans_exported_total 0\n"));
}

/// Answers every request 200 and hands back each request's head and body.
fn capture_server() -> (u16, std::sync::mpsc::Receiver<(String, Vec<u8>)>) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = l.local_addr().expect("addr").port();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for c in l.incoming().flatten() {
            serve(c, &tx);
        }
    });
    (port, rx)
}

/// One connection's requests, until it closes.
fn serve(c: std::net::TcpStream, tx: &std::sync::mpsc::Sender<(String, Vec<u8>)>) {
    let mut w = c.try_clone().expect("clone");
    let mut r = BufReader::new(c);
    loop {
        let (mut head, mut line, mut len) = (String::new(), String::new(), 0usize);
        loop {
            line.clear();
            if r.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            if line.trim().is_empty() {
                break;
            }
            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                len = v.trim().parse().unwrap_or(0);
            }
            head.push_str(&line);
        }
        let mut body = vec![0u8; len];
        if r.read_exact(&mut body).is_err() {
            return;
        }
        let _ = tx.send((head, body));
        let _ = w.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}");
    }
}

#[test]
fn json_export_carries_the_tree_with_exact_parents() {
    let (port, rx) = capture_server();
    let cfg = OtlpConfig {
        protocol: Protocol::HttpJson,
        endpoint: format!("http://127.0.0.1:{port}/custom/path"),
        headers: vec![("Authorization".into(), "Bearer t".into())],
        step_sampling: 1.0,
        rank: Some(5),
        job: Some("jobX".into()),
        ..OtlpConfig::default()
    };
    let exp = OtlpExporter::new(cfg).expect("exporter");
    let t = Telemetry::new(vec![exp.clone()]);
    let s = t.comm_sink(meta());
    tree(&*s, 1, 9);
    s.finalize();
    assert_eq!(exp.stats().exported, SPANS_PER_TREE);
    let (head, body) = rx.recv_timeout(Duration::from_secs(5)).expect("a request");
    assert!(head.starts_with("POST /custom/path HTTP/1.1"), "{head}");
    let lower = head.to_ascii_lowercase();
    assert!(lower.contains("content-type: application/json") && lower.contains("authorization: bearer t"), "{head}");
    let v: serde_json::Value = serde_json::from_slice(&body).expect("json");
    let rs = &v["resourceSpans"][0];
    let res: Vec<(String, serde_json::Value)> = rs["resource"]["attributes"]
        .as_array()
        .expect("attributes")
        .iter()
        .map(|a| (a["key"].as_str().unwrap_or("").to_string(), a["value"].clone()))
        .collect();
    assert!(res.contains(&("service.instance.id".into(), serde_json::json!({"stringValue": "jobX/5"}))), "{res:?}");
    let spans = rs["scopeSpans"][0]["spans"].as_array().expect("spans");
    assert_eq!(spans.len(), SPANS_PER_TREE as usize);
    let by_name = |n: &str| spans.iter().find(|s| s["name"] == n).unwrap_or_else(|| panic!("{n}"));
    let (ga, api, g, c, op, st) = (
        by_name("ncclGroup"),
        by_name("ncclAllReduce"),
        by_name("group launch"),
        by_name("AllReduce"),
        by_name("proxy send"),
        by_name("proxy step send"),
    );
    assert!(spans.iter().all(|s| s["traceId"] == c["traceId"] && s["traceId"].as_str().map(str::len) == Some(32)));
    assert_eq!(ga.get("parentSpanId"), None);
    for (child, parent) in [(api, ga), (g, ga), (c, api), (op, c), (st, op)] {
        assert_eq!(child["parentSpanId"], parent["spanId"], "{} under {}", child["name"], parent["name"]);
    }
    let attr = |s: &serde_json::Value, k: &str| -> serde_json::Value {
        s["attributes"]
            .as_array()
            .and_then(|a| a.iter().find(|x| x["key"] == k))
            .map(|x| x["value"].clone())
            .unwrap_or_default()
    };
    assert_eq!(attr(c, "occl.seq"), serde_json::json!({"intValue": "9"}));
    assert_eq!(attr(c, "occl.bytes"), serde_json::json!({"intValue": "16"}));
    assert_eq!(attr(c, "occl.comm.name"), serde_json::json!({"stringValue": "unit"}));
    assert_eq!(attr(op, "occl.steps.done"), serde_json::json!({"intValue": "1"}));
    assert_eq!(st["events"][0]["name"], "SendWait");
    assert_eq!(c["kind"], 1);
}

#[test]
fn kernel_channel_and_copy_engine_spans_have_the_times_they_were_given() {
    let (port, rx) = capture_server();
    let cfg = OtlpConfig {
        protocol: Protocol::HttpJson,
        endpoint: format!("http://127.0.0.1:{port}/v1/traces"),
        ..OtlpConfig::default()
    };
    let exp = OtlpExporter::new(cfg).expect("exporter");
    let t = Telemetry::new(vec![exp.clone()]);
    let s = t.comm_sink(meta());
    tree(&*s, 1, 3);
    let (t0, t1) = (1_700_000_000_123_456_789u64, 1_700_000_000_123_460_000u64);
    s.start_at(id(10), Some(id(4)), &EventDescr::KernelCh { channel_id: 2, p_timer: 5 }, t0);
    s.state(id(10), &StateArgs::KernelChStop { p_timer: 6 });
    s.stop_at(id(10), t1);
    // A copy-engine call's device time, under the CollApi (id 2).
    let ce = crate::test_descr::ce_coll("AllReduce", 4, 7);
    s.start_at(id(11), Some(id(2)), &ce, t0 + 5);
    s.stop_at(id(11), t1 + 5);
    s.finalize();
    let (_, body) = rx.recv_timeout(Duration::from_secs(5)).expect("a request");
    let v: serde_json::Value = serde_json::from_slice(&body).expect("json");
    let spans = v["resourceSpans"][0]["scopeSpans"][0]["spans"].as_array().expect("spans");
    let k = spans.iter().find(|s| s["name"] == "kernel channel").expect("the KernelCh span");
    let c = spans.iter().find(|s| s["name"] == "AllReduce").expect("its Coll");
    assert_eq!(k["startTimeUnixNano"], t0.to_string());
    assert_eq!(k["endTimeUnixNano"], t1.to_string());
    assert_eq!(k["parentSpanId"], c["spanId"]);
    assert_eq!(k["traceId"], c["traceId"]);
    let e = spans.iter().find(|s| s["name"] == "copy-engine call").expect("the CeColl span");
    let api = spans.iter().find(|s| s["name"] == "ncclAllReduce").expect("its CollApi");
    assert_eq!(
        (e["startTimeUnixNano"].clone(), e["endTimeUnixNano"].clone()),
        ((t0 + 5).to_string().into(), (t1 + 5).to_string().into())
    );
    assert_eq!((e["parentSpanId"].clone(), e["traceId"].clone()), (api["spanId"].clone(), c["traceId"].clone()));
}
