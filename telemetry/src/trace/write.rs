//! Putting a trace file in place: [`crate::files::write_atomic`] (a new owner-only temporary
//! file, synced, renamed over the final name), so a reader (HTA, a copy job) never sees half a
//! file and nothing planted in a shared trace directory redirects the write.

use crate::files;
use std::fs;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

/// Writes `path` from `fill`, gzip-compressed when `gzip`; creates the directory if missing.
pub(crate) fn atomic(
    path: &Path,
    gzip: bool,
    fill: impl FnOnce(&mut dyn Write) -> io::Result<()>,
) -> io::Result<PathBuf> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        fs::create_dir_all(dir).map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
    }
    files::write_atomic(path, |f| {
        let w = BufWriter::with_capacity(1 << 16, f);
        let mut w = if gzip {
            let mut z = flate2::write::GzEncoder::new(w, flate2::Compression::fast());
            fill(&mut z)?;
            z.finish()?
        } else {
            let mut w = w;
            fill(&mut w)?;
            w
        };
        w.flush()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_and_gzip_and_errors_name_the_path() {
        let dir = std::env::temp_dir().join(format!("occl-trace-write-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let p = atomic(&dir.join("a.json"), false, |w: &mut dyn Write| w.write_all(b"{}")).expect("write");
        assert_eq!(fs::read(&p).expect("read"), b"{}");
        let gz = atomic(&dir.join("a.json.gz"), true, |w: &mut dyn Write| w.write_all(b"[1]")).expect("write");
        let mut text = String::new();
        io::Read::read_to_string(&mut flate2::read::GzDecoder::new(fs::File::open(&gz).expect("open")), &mut text)
            .expect("gunzip");
        assert_eq!(text, "[1]");
        // Only the two files: no temporary left behind.
        assert_eq!(fs::read_dir(&dir).expect("dir").count(), 2);
        let e = atomic(&dir.join("a.json").join("x.json"), false, |_: &mut dyn Write| Ok(())).expect_err("not a dir");
        assert!(e.to_string().contains("x.json"), "{e}");
        let _ = fs::remove_dir_all(&dir);
    }
}
