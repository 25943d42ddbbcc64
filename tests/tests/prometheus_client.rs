//! occl's metrics in an application's own `prometheus-client` registry: the application registers
//! a counter of its own and occl's collector, runs real collectives (two ranks on threads, shm),
//! and the registry's OpenMetrics encoding has both, with the job's exact counts and bytes. A
//! binary of its own: the collector reads the process's collector, built once. The same collector's
//! own OpenMetrics text is checked against OpenMetrics' rules.

use occl::{Comm, RedOp};
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;

/// The value of the line that starts with `series` followed by a space.
fn value(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[test]
fn an_application_registry_encodes_its_own_metrics_and_occls() {
    let mut registry = Registry::default();
    let steps: Counter = Counter::default();
    registry.register("app_training_steps", "Training steps the application ran.", steps.clone());
    registry.register_collector(Box::new(occl::metrics_collector()));

    let comms = Comm::init_all(2).expect("two ranks");
    std::thread::scope(|s| {
        for c in &comms {
            s.spawn(move || {
                let (a, mut b) = (vec![1.0f32; 1000], vec![0f32; 1000]);
                for _ in 0..3 {
                    c.all_reduce(&a, &mut b, RedOp::Sum).expect("all-reduce");
                }
                let mut g = vec![0f32; 2 * 256];
                c.all_gather(&a[..256], &mut g).expect("all-gather");
            });
        }
    });
    steps.inc_by(3);

    let mut text = String::new();
    encode(&mut text, &registry).expect("encode");
    assert_eq!(value(&text, "app_training_steps_total"), Some(3.0), "{text}");
    assert!(text.ends_with("# EOF\n"), "{text}");
    let comm = format!("{:016x}", comms[0].id());
    for r in 0..2 {
        let l = format!("comm=\"{comm}\",rank=\"{r}\"");
        let ar = format!("{l},op=\"AllReduce\",algo=");
        let sum = |name: &str, sel: &str| -> f64 { sum_of(&text, name, &[sel]) };
        let bucket = |sel: &str, le: &str| -> f64 {
            sum_of(&text, "occl_collective_message_size_bytes_bucket", &[sel, &format!("le=\"{le}\"")])
        };
        assert_eq!(sum("occl_collective_operations_total", &ar), 3.0, "rank {r}:\n{text}");
        assert_eq!(sum("occl_collective_bytes_total", &ar), 3.0 * 4000.0, "rank {r}");
        assert_eq!(sum("occl_collective_duration_seconds_count", &ar), 3.0, "rank {r}");
        let ag = format!("{l},op=\"AllGather\",algo=");
        assert_eq!(sum("occl_collective_operations_total", &ag), 1.0, "rank {r}");
        assert_eq!(sum("occl_collective_bytes_total", &ag), 1024.0, "rank {r}");
        assert_eq!(sum("occl_collective_message_size_bytes_sum", &ag), 1024.0, "rank {r}");
        assert_eq!(bucket(&ag, "+Inf"), 1.0);
        assert_eq!(bucket(&ag, "256.0"), 0.0);
        assert_eq!(bucket(&ag, "1024.0"), 1.0, "{text}");
        assert_eq!(value(&text, &format!("occl_communicator_info{{{l},nranks=\"2\",nnodes=\"1\"}}")), Some(1.0));
    }
    // OpenMetrics metadata, as the registry writes it for occl's families: name without `_total`,
    // the unit from the family.
    assert!(text.contains("# TYPE occl_collective_bytes counter\n# UNIT occl_collective_bytes bytes\n"), "{text}");
    assert!(text.contains("# TYPE occl_collective_duration_seconds histogram\n"), "{text}");
    assert!(text.contains("# UNIT occl_collective_duration_seconds seconds\n"), "{text}");
    // The process's collector writes the same snapshot as OpenMetrics itself, by OpenMetrics' rules, with the
    // same values.
    let om = occl::telemetry::exporters::global().expect("metrics on").render_openmetrics();
    occl_tests::openmetrics::check(&om).map_err(|e| format!("{e}\n{om}")).expect("OpenMetrics");
    assert!(om.contains("# TYPE occl_collective_bytes counter\n# UNIT occl_collective_bytes bytes\n"), "{om}");
    let ar0 = format!("comm=\"{comm}\",rank=\"0\",op=\"AllReduce\",algo=");
    assert_eq!(sum_of(&om, "occl_collective_bytes_total", &[&ar0]), 12000.0, "{om}");
    for c in comms {
        let _ = c.destroy();
    }
}

/// The sum of the samples of `name` whose line contains every one of `sel`.
fn sum_of(text: &str, name: &str, sel: &[&str]) -> f64 {
    text.lines()
        .filter(|x| x.starts_with(&format!("{name}{{")) && sel.iter().all(|s| x.contains(s)))
        .filter_map(|x| x.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}
