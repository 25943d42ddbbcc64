//! The wall-clock time that reports and monitor lines print: `YYYY-MM-DD HH:MM:SS`, in UTC.

/// `YYYY-MM-DD HH:MM:SS` for Unix seconds, in UTC (the RAS thread reads no time zone database).
pub(crate) fn local_time(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}", rem / 3600, rem / 60 % 60, rem % 60)
}

#[cfg(test)]
mod tests {
    use super::local_time;

    #[test]
    fn civil_time() {
        assert_eq!(local_time(0), "1970-01-01 00:00:00");
        assert_eq!(local_time(951_782_400), "2000-02-29 00:00:00");
        assert_eq!(local_time(1_795_306_325), "2026-11-22 00:12:05");
    }
}
