//! The resource a rank's spans are reported under: `service.name`, `service.instance.id` (job and
//! rank), `host.name`, `process.pid`, the SDK triplet, then `OTEL_RESOURCE_ATTRIBUTES` (which may
//! override any of ours except `service.name`, which `OTEL_SERVICE_NAME` decides).

use super::model::{Attr, Val};
use std::borrow::Cow;

/// One resource's attributes.
#[derive(Clone, Debug, PartialEq)]
pub struct Resource {
    pub attrs: Vec<Attr>,
}

/// This machine's name: the kernel's, else `$HOSTNAME`, else "localhost".
pub fn host_name() -> String {
    crate::files::read_to_string_capped(
        std::path::Path::new("/proc/sys/kernel/hostname"),
        crate::files::MAX_SYSTEM_FILE,
    )
    .ok()
    .map(|s| s.trim().to_string())
    .filter(|s| !s.is_empty())
    .or_else(|| std::env::var("HOSTNAME").ok().filter(|s| !s.is_empty()))
    .unwrap_or_else(|| "localhost".into())
}

/// The resource of rank `rank` of job `job`.
pub fn resource(service: &str, job: &str, rank: i64, host: &str, extra: &[(String, String)]) -> Resource {
    let own = |s: String| Val::Str(Cow::Owned(s));
    let mut attrs: Vec<Attr> = vec![
        (Cow::Borrowed("service.name"), own(service.to_string())),
        (Cow::Borrowed("service.instance.id"), own(format!("{job}/{rank}"))),
        (Cow::Borrowed("host.name"), own(host.to_string())),
        (Cow::Borrowed("process.pid"), Val::Int(i64::from(std::process::id()))),
        (Cow::Borrowed("occl.job"), own(job.to_string())),
        (Cow::Borrowed("occl.rank"), Val::Int(rank)),
        (Cow::Borrowed("telemetry.sdk.name"), Val::Str(Cow::Borrowed("occl"))),
        (Cow::Borrowed("telemetry.sdk.language"), Val::Str(Cow::Borrowed("rust"))),
        (Cow::Borrowed("telemetry.sdk.version"), Val::Str(Cow::Borrowed(env!("CARGO_PKG_VERSION")))),
    ];
    for (k, v) in extra {
        if k == "service.name" {
            continue;
        }
        attrs.retain(|(ak, _)| ak != k);
        attrs.push((Cow::Owned(k.clone()), own(v.clone())));
    }
    Resource { attrs }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instance_is_job_and_rank_and_user_attributes_win_except_the_name() {
        let extra = vec![
            ("service.name".to_string(), "ignored".to_string()),
            ("host.name".to_string(), "override".to_string()),
            ("team".to_string(), "ml".to_string()),
        ];
        let r = resource("occl", "j7", 3, "h", &extra);
        let get = |k: &str| r.attrs.iter().find(|(ak, _)| ak == k).map(|(_, v)| v.clone());
        assert_eq!(get("service.name"), Some(Val::Str("occl".into())));
        assert_eq!(get("service.instance.id"), Some(Val::Str("j7/3".into())));
        assert_eq!(get("host.name"), Some(Val::Str("override".into())));
        assert_eq!(get("team"), Some(Val::Str("ml".into())));
        assert!(!host_name().is_empty());
    }
}
