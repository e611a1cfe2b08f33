//! The admin port's bearer token (docs/proxy.md#admin-port): the proxy serves
//! `/admin/v1/*` and `/metrics` only to requests carrying it (`--admin-token-file`),
//! the operator sends it on every scrape (`--proxy-admin-token-file`). Both read the
//! file the same way, here, so a token one of them takes the other takes too.
//!
//! The file is a mounted Secret that may rotate: [`AdminTokenFile`] re-reads it when
//! it changes (a `stat` per use: the kubelet swaps a Secret volume's symlink, so the
//! resolved file's inode, size or modification time changes), keeping the last good
//! token when the new content is not one.
//!
//! The token itself never appears in an error, a `Debug` output or a log line made
//! from them: only the file's path and what is wrong with the content.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use aws_lc_rs::digest;

/// Shortest token accepted, in bytes: `openssl rand -hex 16` gives 32; the chart's
/// generated one is 48.
pub const MIN_TOKEN_LEN: usize = 16;

/// A token that cannot be one (the token is not quoted).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadToken {
    #[error("the admin token is empty")]
    Empty,
    #[error("the admin token is {0} bytes long; at least {MIN_TOKEN_LEN} are required")]
    TooShort(usize),
    #[error(
        "the admin token holds a byte that cannot be sent in an HTTP header \
         (only visible ASCII, no spaces, is allowed)"
    )]
    NotPrintable,
}

/// The admin bearer token. Compared in constant time; shown as `*****`.
#[derive(Clone)]
pub struct AdminToken {
    token: String,
    /// SHA-256 of the token: a presented token is hashed and the two digests compared
    /// in constant time, so neither the content nor the length of the token shows in
    /// how long a comparison takes.
    digest: [u8; 32],
}

impl AdminToken {
    /// `text` with surrounding ASCII whitespace (a trailing newline) trimmed.
    pub fn new(text: &[u8]) -> Result<Self, BadToken> {
        let t = text.trim_ascii();
        if t.is_empty() {
            return Err(BadToken::Empty);
        }
        if !t.iter().all(|b| b.is_ascii_graphic()) {
            return Err(BadToken::NotPrintable);
        }
        if t.len() < MIN_TOKEN_LEN {
            return Err(BadToken::TooShort(t.len()));
        }
        let token = String::from_utf8(t.to_vec()).map_err(|_| BadToken::NotPrintable)?;
        Ok(Self {
            digest: sha256(token.as_bytes()),
            token,
        })
    }

    /// The token of `path`. The error names the file, never the content.
    pub fn from_file(path: &Path) -> Result<Self, String> {
        let bytes =
            std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        Self::new(&bytes).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Whether `presented` (the token of an `Authorization: Bearer`) is this token, in
    /// time independent of both.
    pub fn verify(&self, presented: &[u8]) -> bool {
        let other = sha256(presented);
        aws_lc_rs::constant_time::verify_slices_are_equal(&self.digest, &other).is_ok()
    }

    /// The token, to send (as `Authorization: Bearer`). Never log it.
    pub fn expose(&self) -> &str {
        &self.token
    }
}

fn sha256(bytes: &[u8]) -> [u8; 32] {
    let d = digest::digest(&digest::SHA256, bytes);
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

impl fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AdminToken(*****)")
    }
}

/// What [`AdminTokenFile::current`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refresh {
    /// The file did not change.
    Unchanged,
    /// The file changed and holds a new token, now in use.
    Reloaded,
    /// The file changed (or went away) but holds no usable token: the last good one
    /// stays in use. Reported once per change.
    KeptLast(String),
}

/// What identifies one version of the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    modified: Option<SystemTime>,
    len: u64,
    #[cfg(unix)]
    ino: u64,
    #[cfg(unix)]
    dev: u64,
}

impl Stamp {
    fn of(path: &Path) -> std::io::Result<Stamp> {
        let m = std::fs::metadata(path)?;
        Ok(Stamp {
            modified: m.modified().ok(),
            len: m.len(),
            #[cfg(unix)]
            ino: std::os::unix::fs::MetadataExt::ino(&m),
            #[cfg(unix)]
            dev: std::os::unix::fs::MetadataExt::dev(&m),
        })
    }
}

/// A token file, re-read when it changes.
pub struct AdminTokenFile {
    path: PathBuf,
    state: Mutex<(Option<Stamp>, Arc<AdminToken>)>,
}

impl AdminTokenFile {
    /// Reads the file; it must hold a token (a process does not start without one).
    pub fn open(path: &Path) -> Result<Self, String> {
        let stamp = Stamp::of(path).ok();
        let token = AdminToken::from_file(path)?;
        Ok(Self {
            path: path.to_path_buf(),
            state: Mutex::new((stamp, Arc::new(token))),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The token to use now: the file's, re-read if it changed since the last call.
    pub fn current(&self) -> (Arc<AdminToken>, Refresh) {
        let stamp = Stamp::of(&self.path);
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let stamp = match stamp {
            Ok(s) if Some(s) == state.0 => return (state.1.clone(), Refresh::Unchanged),
            Ok(s) => Some(s),
            Err(e) => {
                if state.0.is_none() {
                    return (state.1.clone(), Refresh::Unchanged);
                }
                state.0 = None;
                return (
                    state.1.clone(),
                    Refresh::KeptLast(format!(
                        "cannot read {}: {e}; the last good admin token stays in use",
                        self.path.display()
                    )),
                );
            }
        };
        state.0 = stamp;
        match AdminToken::from_file(&self.path) {
            Ok(t) => {
                let changed = t.digest != state.1.digest;
                state.1 = Arc::new(t);
                let r = if changed {
                    Refresh::Reloaded
                } else {
                    Refresh::Unchanged
                };
                (state.1.clone(), r)
            }
            Err(e) => (
                state.1.clone(),
                Refresh::KeptLast(format!("{e}; the last good admin token stays in use")),
            ),
        }
    }
}

impl fmt::Debug for AdminTokenFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdminTokenFile")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "0123456789abcdef-good";

    #[test]
    fn tokens_are_trimmed_checked_and_compared_whole() {
        let t = AdminToken::new(format!("  {GOOD}\n").as_bytes()).unwrap();
        assert_eq!(t.expose(), GOOD);
        assert!(t.verify(GOOD.as_bytes()));
        assert!(!t.verify(b"0123456789abcdef-goo"));
        assert!(!t.verify(format!("{GOOD}x").as_bytes()));
        assert!(!t.verify(b""));
        assert_eq!(format!("{t:?}"), "AdminToken(*****)");
        assert_eq!(AdminToken::new(b" \n").unwrap_err(), BadToken::Empty);
        assert_eq!(
            AdminToken::new(b"short-token").unwrap_err(),
            BadToken::TooShort(11)
        );
        assert_eq!(
            AdminToken::new(b"0123456789 abcdef").unwrap_err(),
            BadToken::NotPrintable
        );
    }

    #[test]
    fn file_errors_name_the_file_never_the_token() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty");
        std::fs::write(&empty, "\n").unwrap();
        let e = AdminToken::from_file(&empty).unwrap_err();
        assert!(
            e.contains(&empty.display().to_string()) && e.contains("empty"),
            "{e}"
        );
        let short = dir.path().join("short");
        std::fs::write(&short, "s3cr3t-shorty").unwrap();
        let e = AdminToken::from_file(&short).unwrap_err();
        assert!(e.contains("short") && !e.contains("s3cr3t"), "{e}");
        let e = AdminToken::from_file(&dir.path().join("absent")).unwrap_err();
        assert!(e.contains("absent"), "{e}");
    }

    #[test]
    fn a_rotated_file_is_read_again_and_a_broken_one_keeps_the_last() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        // Written beside and renamed over, as the kubelet swaps a Secret volume.
        let put = |text: &str| {
            let tmp = dir.path().join("tmp");
            std::fs::write(&tmp, text).unwrap();
            std::fs::rename(&tmp, &path).unwrap();
        };
        put(GOOD);
        let file = AdminTokenFile::open(&path).unwrap();
        let (t, r) = file.current();
        assert_eq!((t.expose(), r), (GOOD, Refresh::Unchanged));

        let next = "fedcba9876543210-next";
        put(next);
        let (t, r) = file.current();
        assert_eq!((t.expose(), r), (next, Refresh::Reloaded));
        assert_eq!(file.current().1, Refresh::Unchanged);

        put("");
        let (t, r) = file.current();
        assert_eq!(t.expose(), next);
        assert!(
            matches!(&r, Refresh::KeptLast(m) if m.contains("empty")),
            "{r:?}"
        );
        assert_eq!(file.current().1, Refresh::Unchanged, "reported once");

        std::fs::remove_file(&path).unwrap();
        let (t, r) = file.current();
        assert_eq!(t.expose(), next);
        assert!(matches!(r, Refresh::KeptLast(_)));
        assert_eq!(file.current().1, Refresh::Unchanged, "reported once");
        assert!(!format!("{file:?}").contains(next));
    }
}
