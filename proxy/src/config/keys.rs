//! How clients authenticate, fixed for the life of the process: `--auth` (required
//! or off) and the per-cluster HMAC secret client keys are hashed with. The snapshot
//! indexes model names per client when authentication is required, and standalone
//! manifests' client keys are hashed with the same secret; the data port checks a
//! presented key with it (`http::auth`).

use std::path::Path;

use switchback_crds::keyhash::{KeyHasher, MIN_SECRET_LEN};

/// `--auth`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum AuthMode {
    /// Every data-port request must carry the key of an LLMClient; model names are
    /// resolved among the routes that client may call.
    Required,
    /// Everyone is served, with every route; LLMClients are not enforced.
    Off,
}

impl AuthMode {
    pub fn as_str(self) -> &'static str {
        match self {
            AuthMode::Required => "required",
            AuthMode::Off => "off",
        }
    }
}

/// The gateway's authentication settings, fixed for the life of the process.
#[derive(Debug)]
pub struct Auth {
    pub mode: AuthMode,
    /// The per-cluster secret presented keys are hashed with; `None` with `--auth off`.
    pub hasher: Option<KeyHasher>,
}

impl Default for Auth {
    fn default() -> Self {
        Self {
            mode: AuthMode::Off,
            hasher: None,
        }
    }
}

impl Auth {
    pub fn required(&self) -> bool {
        self.mode == AuthMode::Required
    }
}

/// Read the HMAC secret of `--client-key-hmac-file` (see [`KeyHasher::from_file`]: the
/// operator reads its copy the same way).
pub(crate) fn read_hmac_file(path: &Path) -> Result<KeyHasher, String> {
    KeyHasher::from_file(path)
}

/// A random secret, for a standalone proxy that both hashes its manifests' keys and
/// checks presented ones (no other process needs the same secret).
pub(crate) fn random_hasher() -> KeyHasher {
    let secret: [u8; MIN_SECRET_LEN] = rand::random();
    match KeyHasher::new(&secret) {
        Ok(h) => h,
        Err(_) => unreachable!("MIN_SECRET_LEN bytes are enough"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hmac_file_is_trimmed_and_must_be_long_enough() {
        let dir = tempfile::tempdir().unwrap();
        let good = dir.path().join("good");
        std::fs::write(&good, format!("{}\n", "k".repeat(32))).unwrap();
        let a = read_hmac_file(&good).unwrap();
        let b = KeyHasher::new("k".repeat(32).as_bytes()).unwrap();
        assert_eq!(a.hash(b"sk-x"), b.hash(b"sk-x"));
        let short = dir.path().join("short");
        std::fs::write(&short, "short\n").unwrap();
        assert!(read_hmac_file(&short).unwrap_err().contains("5 bytes long"));
        assert!(read_hmac_file(&dir.path().join("absent")).is_err());
        assert_ne!(random_hasher().hash(b"k"), random_hasher().hash(b"k"));
    }
}
