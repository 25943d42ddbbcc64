//! Putting a file in place atomically: written under a temporary name in the same directory,
//! synced, then renamed over the final name, so a reader (HTA, a copy job) never sees half a file.

use std::fs;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

static SERIAL: AtomicU64 = AtomicU64::new(0);

/// Writes `path` from `fill`, gzip-compressed when `gzip`.
pub(crate) fn atomic(
    path: &Path,
    gzip: bool,
    fill: impl FnOnce(&mut dyn Write) -> io::Result<()>,
) -> io::Result<PathBuf> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = dir.join(format!(".{name}.{}.{}.tmp", std::process::id(), SERIAL.fetch_add(1, Relaxed)));
    let res = (|| {
        fs::create_dir_all(dir)?;
        let f = BufWriter::with_capacity(1 << 16, fs::File::create(&tmp)?);
        let f = if gzip {
            let mut z = flate2::write::GzEncoder::new(f, flate2::Compression::fast());
            fill(&mut z)?;
            z.finish()?
        } else {
            let mut f = f;
            fill(&mut f)?;
            f
        };
        let f = f.into_inner().map_err(io::IntoInnerError::into_error)?;
        f.sync_all()?;
        fs::rename(&tmp, path)
    })();
    if let Err(e) = res {
        let _ = fs::remove_file(&tmp);
        return Err(io::Error::new(e.kind(), format!("{}: {e}", path.display())));
    }
    Ok(path.to_path_buf())
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
