//! The labels every series of the plugin's `/metrics` carries besides its own, so that a job on
//! NCCL has the label set of one on occl, whose RAS port adds the same three to each process's
//! series (`ras/src/server/metrics.rs`): `job` (the first of [`JOB_VARS`] set; without one the
//! series keep none, and Prometheus gives them the target's), `host` (the kernel's host name) and
//! `pid`. Each series already has `comm` and `rank` from the exporter.

use occl_ras_proto::exposition::{merge, Part};

/// Where the job's name comes from, first set first (as for RAS and OTLP).
pub const JOB_VARS: [&str; 3] = ["OCCL_JOB_ID", "SLURM_JOB_ID", "TORCHELASTIC_RUN_ID"];

/// The labels of this process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Labels {
    pub job: Option<String>,
    pub host: String,
    pub pid: u32,
}

impl Labels {
    /// This process's labels from `var` (the environment's lookup) and the host name.
    pub fn from_lookup(var: impl Fn(&str) -> Option<String>, host: String, pid: u32) -> Labels {
        let job = JOB_VARS.iter().find_map(|k| var(k).map(|v| v.trim().to_owned()).filter(|v| !v.is_empty()));
        Labels { job, host, pid }
    }

    /// This process's labels.
    pub fn from_env() -> Labels {
        Labels::from_lookup(|k| std::env::var(k).ok(), host_name(), std::process::id())
    }

    /// `text` (Prometheus text format) with every sample labelled; a sample that has one of the
    /// labels keeps its own. Lines that do not parse are dropped (the exporters write none).
    pub fn apply(&self, text: &str) -> String {
        let part = Part { text, job: self.job.as_deref(), pid: Some(self.pid), host: Some(&self.host) };
        merge(&[part]).text
    }
}

/// The kernel's host name, else `$HOSTNAME`, else "localhost" (what RAS's `host` label is).
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok().filter(|s| !s.is_empty()))
        .unwrap_or_else(|| "localhost".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_sample_gets_job_host_and_pid() {
        let env = |k: &str| match k {
            "OCCL_JOB_ID" => Some(" ".to_owned()),
            "SLURM_JOB_ID" => Some("77".to_owned()),
            "TORCHELASTIC_RUN_ID" => Some("run".to_owned()),
            _ => None,
        };
        let l = Labels::from_lookup(env, "node\"7".into(), 42);
        assert_eq!(l.job.as_deref(), Some("77"), "an empty variable is not set");
        let text = "# HELP occl_communicator_info x\n# TYPE occl_communicator_info gauge\n\
                    occl_communicator_info{comm=\"00000000000000ab\",rank=\"1\",nranks=\"2\",nnodes=\"1\"} 1\n\
                    # TYPE occl_profiler_plugin_dropped_total counter\n\
                    occl_profiler_plugin_dropped_total{reason=\"panic\"} 0\n";
        let out = l.apply(text);
        assert!(
            out.contains(
                "occl_communicator_info{job=\"77\",pid=\"42\",host=\"node\\\"7\",comm=\"00000000000000ab\",\
                 rank=\"1\",nranks=\"2\",nnodes=\"1\"} 1\n"
            ),
            "{out}"
        );
        assert!(
            out.contains(
                "occl_profiler_plugin_dropped_total{job=\"77\",pid=\"42\",host=\"node\\\"7\",reason=\"panic\"} 0"
            ),
            "{out}"
        );
        assert!(out.contains("# HELP occl_communicator_info x\n# TYPE occl_communicator_info gauge\n"), "{out}");
        let none = Labels::from_lookup(|_| None, "h".into(), 1);
        assert_eq!(none.job, None);
        assert!(!none.apply(text).contains("job="), "without a job variable the target's job applies");
    }
}
