//! Writing file contents: the whole-buffer write loop and the in-place file (the heartbeat's)
//! kept open between beats.

use std::io;
use std::sync::Arc;

use rustix::fd::OwnedFd;
use rustix::fs::OFlags;
use rustix::io::Errno;

use super::RealFs;
use super::sys::nlink_of;

impl RealFs {
    /// Write all of `bytes` to `fd`: at its file offset (`at: None`), or from offset `at`
    /// (`pwrite`). A write of nothing is `WriteZero`, naming `path`.
    pub(super) fn write_all(
        &self,
        fd: &OwnedFd,
        mut at: Option<u64>,
        bytes: &[u8],
        path: &str,
    ) -> io::Result<()> {
        let mut rest = bytes;
        while !rest.is_empty() {
            let written = match at {
                Some(offset) => rustix::io::pwrite(fd, rest, offset),
                None => rustix::io::write(fd, rest),
            };
            match written {
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::WriteZero,
                        format!(
                            "run root {}: writing {path} wrote nothing",
                            self.root_path.display()
                        ),
                    ));
                }
                Ok(n) => {
                    rest = &rest[n..];
                    at = at.map(|a| a + n as u64);
                }
                Err(Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// The cached in-place file of `path`, or `None`.
    pub(super) fn cached_in_place(&self, path: &str) -> Option<Arc<OwnedFd>> {
        let slot = self.in_place.lock().unwrap_or_else(|e| e.into_inner());
        slot.as_ref()
            .filter(|(p, _)| p == path)
            .map(|(_, fd)| fd.clone())
    }

    /// Forget the in-place file if it is `path` (this adapter renamed over or removed it).
    pub(super) fn forget_in_place(&self, path: &str) {
        let mut slot = self.in_place.lock().unwrap_or_else(|e| e.into_inner());
        if slot.as_ref().is_some_and(|(p, _)| p == path) {
            *slot = None;
        }
    }

    /// Open `path` for in-place writes (never creating it), judged and trusted like a
    /// read (§5.1), and keep it for the next call.
    pub(super) fn in_place_fd(&self, path: &str) -> io::Result<Arc<OwnedFd>> {
        if let Some(fd) = self.cached_in_place(path) {
            return Ok(fd);
        }
        let (dir, leaf) = self.file_parts(path)?;
        let dfd = self.dir_fd(dir, path)?;
        let flags =
            OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NOCTTY | OFlags::NONBLOCK;
        let (fd, st) = self.open_judged(
            &dfd,
            leaf,
            path,
            flags,
            lease_core::canonical::MAX_RECORD_BYTES,
        )?;
        // A second name would make the write land in whatever file that is (a hard link
        // planted at the beat's name to, say, `run.json`): refuse, write nothing.
        if nlink_of(&st) != 1 {
            return Err(io::Error::other(format!(
                "run root {}: refusing to write {path} in place: the file has {} names (a heartbeat file has exactly one); move the extra name away by hand",
                self.root_path.display(),
                nlink_of(&st)
            )));
        }
        let fd = Arc::new(fd);
        *self.in_place.lock().unwrap_or_else(|e| e.into_inner()) =
            Some((path.to_string(), fd.clone()));
        Ok(fd)
    }
}
