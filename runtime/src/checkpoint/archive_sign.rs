//! Signatures of migration archives: HMAC-SHA256 with a key of the host configuration.
//!
//! The signature is the archive's last member, [`SIGNATURE`]. Its MAC covers every
//! byte of the tar stream before it, and its own 512-byte header: every member's
//! header and data (the manifest, the container record, the CRIU images, the file
//! delta), in order. An import computes the MAC over the bytes it extracts, as it
//! reads them ([`Verifier`]), so what is checked is what was written, whatever the
//! file becomes meanwhile; nothing extracted is used before the MAC matches.
//!
//! ```text
//! | member header | data | ... | member header | data | SIGNATURE header | {"mac": ..} | 2 zero blocks |
//! |<------------------------- MAC input ------------------------------------>|
//! ```

use std::cell::RefCell;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::rc::Rc;

use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

use crate::config::Config;
use crate::{Error, Result};

/// The signature member's name.
pub const SIGNATURE: &str = "crab-signature.json";
/// The only algorithm this version writes and reads.
const ALGORITHM: &str = "hmac-sha256";
/// Bytes a key must have at least.
const KEY_MIN: usize = 32;
/// Where a host without `[archive] key_file` keeps the key it generated.
const GENERATED_KEY: &str = ".archive.key";
const BLOCK: u64 = 512;

/// The signature member's content.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Signature {
    algorithm: String,
    /// The MAC, lower-case hex.
    mac: String,
}

/// The host's archive key.
#[derive(Clone)]
pub struct ArchiveKey {
    bytes: Vec<u8>,
    /// Where it was read.
    pub path: PathBuf,
    /// Whether it was generated just now (an archive of another host cannot match it).
    pub generated: bool,
}

impl std::fmt::Debug for ArchiveKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ArchiveKey")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl ArchiveKey {
    /// The configured key (`[archive] key_file`), else this host's generated one,
    /// made at first use.
    pub fn load(config: &Config) -> Result<ArchiveKey> {
        if !config.archive.key_file.as_os_str().is_empty() {
            return read_key(&config.archive.key_file, false);
        }
        let path = config.checkpoint.store.join(GENERATED_KEY);
        match read_key(&path, false) {
            Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                generate(&path)?;
                read_key(&path, true)
            }
            other => other,
        }
    }

    /// A key of these bytes (tests).
    pub fn from_bytes(bytes: &[u8], path: &Path) -> ArchiveKey {
        ArchiveKey {
            bytes: bytes.to_vec(),
            path: path.to_path_buf(),
            generated: false,
        }
    }

    fn mac(&self) -> Hmac<Sha256> {
        Hmac::<Sha256>::new_from_slice(&self.bytes).expect("HMAC takes keys of any length")
    }
}

/// Reads a key file: a regular file (not through a symlink), owned by root, no
/// access for group or others, at least [`KEY_MIN`] bytes.
fn read_key(path: &Path, generated: bool) -> Result<ArchiveKey> {
    let bad = |message: String| Error::Config {
        path: format!("archive.key_file {}", path.display()),
        message,
    };
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => bad("is a symlink".into()),
            _ => Error::io(format!("open the archive key {}", path.display()))(e),
        })?;
    let meta = f
        .metadata()
        .map_err(Error::io(format!("stat {}", path.display())))?;
    if !meta.is_file() {
        return Err(bad("is not a regular file".into()));
    }
    if meta.uid() != 0 || meta.mode() & 0o077 != 0 {
        return Err(bad(format!(
            "must be owned by root with mode 0600 (owner {}, mode {:o})",
            meta.uid(),
            meta.mode() & 0o7777
        )));
    }
    let mut bytes = Vec::new();
    (&mut f)
        .take(4096)
        .read_to_end(&mut bytes)
        .map_err(Error::io(format!("read {}", path.display())))?;
    if bytes.len() < KEY_MIN {
        return Err(bad(format!(
            "holds {} bytes; a key needs at least {KEY_MIN} (e.g. head -c 32 /dev/urandom)",
            bytes.len()
        )));
    }
    Ok(ArchiveKey {
        bytes,
        path: path.to_path_buf(),
        generated,
    })
}

/// Writes a new random key at `path` (0600), unless another process just did.
fn generate(path: &Path) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("/"));
    std::fs::create_dir_all(dir).map_err(Error::io(format!("create {}", dir.display())))?;
    let mut key = [0u8; KEY_MIN];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut r| r.read_exact(&mut key))
        .map_err(Error::io("read /dev/urandom for an archive key"))?;
    let tmp = dir.join(format!(
        "{GENERATED_KEY}.{}.tmp",
        crate::storage::work::tmp_name("k")
    ));
    let written = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(&key)?;
        f.sync_all()?;
        // link, not rename: a key another process made first is kept.
        match std::fs::hard_link(&tmp, path) {
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
            other => other,
        }
    })();
    let _ = std::fs::remove_file(&tmp);
    written.map_err(Error::io(format!(
        "write the archive key {}",
        path.display()
    )))?;
    tracing::info!(path = %path.display(), "generated this host's archive key");
    Ok(())
}

fn round_up(n: u64) -> u64 {
    n.div_ceil(BLOCK) * BLOCK
}

/// Appends the signature to the tar archive `file`, in place of its end blocks.
pub fn sign(file: &Path, key: &ArchiveKey) -> Result<()> {
    let io = |what: &str| Error::io(format!("sign {}: {what}", file.display()));
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(file)
        .map_err(io("open"))?;
    // Where the last member ends: the end blocks (and tar's padding) start there.
    let mut end = 0u64;
    {
        let mut archive = tar::Archive::new(std::io::BufReader::new(&f));
        for entry in archive.entries().map_err(io("read"))? {
            let entry = entry.map_err(io("read"))?;
            end = end.max(entry.raw_file_position() + round_up(entry.size()));
        }
    }
    let body = serde_json::to_vec(&Signature {
        algorithm: ALGORITHM.into(),
        mac: "0".repeat(64),
    })
    .expect("signature serializes");
    let mut header = tar::Header::new_gnu();
    header.set_path(SIGNATURE).map_err(io("header"))?;
    header.set_entry_type(tar::EntryType::Regular);
    header.set_mode(0o600);
    header.set_uid(0);
    header.set_gid(0);
    header.set_mtime(0);
    header.set_size(body.len() as u64);
    header.set_cksum();
    let mut mac = key.mac();
    f.seek(SeekFrom::Start(0)).map_err(io("seek"))?;
    let copied =
        std::io::copy(&mut (&f).take(end), &mut MacWriter(&mut mac)).map_err(io("read"))?;
    if copied != end {
        return Err(io("read")(std::io::ErrorKind::UnexpectedEof.into()));
    }
    mac.update(header.as_bytes());
    let body = serde_json::to_vec(&Signature {
        algorithm: ALGORITHM.into(),
        mac: hex(&mac.finalize().into_bytes()),
    })
    .expect("signature serializes");
    f.set_len(end).map_err(io("truncate"))?;
    f.seek(SeekFrom::Start(end)).map_err(io("seek"))?;
    let mut tail = header.as_bytes().to_vec();
    tail.extend_from_slice(&body);
    tail.resize((round_up(tail.len() as u64) + 2 * BLOCK) as usize, 0);
    f.write_all(&tail).map_err(io("write"))?;
    f.sync_all().map_err(io("sync"))
}

struct MacWriter<'a>(&'a mut Hmac<Sha256>);

impl Write for MacWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    text.as_bytes()
        .chunks(2)
        .map(|pair| match pair {
            [hi, lo] => u8::from_str_radix(std::str::from_utf8(&[*hi, *lo]).ok()?, 16).ok(),
            _ => None,
        })
        .collect()
}

/// What an import requires of an archive's signature.
#[derive(Debug, Clone)]
pub enum Trust {
    /// A signature by this key.
    Key(ArchiveKey),
    /// Nothing (`crabctl import --allow-unsigned`): a signature, if any, is not checked.
    AllowUnsigned,
}

/// The MAC of the bytes an import reads, as it reads them.
#[derive(Clone)]
pub struct Verifier {
    state: Rc<RefCell<State>>,
}

struct State {
    mac: Option<Hmac<Sha256>>,
    read: u64,
    /// The MAC over everything up to and with the signature's header, once met.
    found: Option<Vec<u8>>,
}

/// A reader that feeds the MAC every byte the tar parser takes.
pub struct Hashing<R> {
    inner: R,
    state: Rc<RefCell<State>>,
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        let mut s = self.state.borrow_mut();
        s.read += n as u64;
        if let Some(mac) = s.mac.as_mut() {
            mac.update(&buf[..n]);
        }
        Ok(n)
    }
}

impl Verifier {
    /// A verifier for `trust`, and the reader of `inner` it watches.
    pub fn new<R: Read>(trust: &Trust, inner: R) -> (Verifier, Hashing<R>) {
        let state = Rc::new(RefCell::new(State {
            mac: match trust {
                Trust::Key(k) => Some(k.mac()),
                Trust::AllowUnsigned => None,
            },
            read: 0,
            found: None,
        }));
        let reader = Hashing {
            inner,
            state: state.clone(),
        };
        (Verifier { state }, reader)
    }

    /// Called at the signature member, `header_at` being its header's offset:
    /// ends the MAC there. The parser must have read exactly up to the end of that
    /// header (no extension header before it, nothing read ahead).
    pub fn at_signature(&self, header_at: u64) -> std::result::Result<(), String> {
        let mut s = self.state.borrow_mut();
        if s.read != header_at + BLOCK {
            return Err(format!(
                "{SIGNATURE} has an unexpected layout (header at {header_at}, read {})",
                s.read
            ));
        }
        s.found = s.mac.take().map(|m| m.finalize().into_bytes().to_vec());
        Ok(())
    }

    /// Whether the signature met is the key's MAC of what was read. `body` is the
    /// signature member's content, None when the archive has none.
    pub fn check(&self, trust: &Trust, body: Option<&[u8]>) -> std::result::Result<(), String> {
        let Trust::Key(key) = trust else {
            return Ok(());
        };
        let Some(body) = body else {
            return Err(format!(
                "the archive is not signed (no {SIGNATURE}: altered, or written by an older \
                 export); import it with --allow-unsigned only if you trust where it comes from"
            ));
        };
        let sig: Signature = serde_json::from_slice(body)
            .map_err(|e| format!("{SIGNATURE} is not a signature: {e}"))?;
        if sig.algorithm != ALGORITHM {
            return Err(format!(
                "{SIGNATURE}: algorithm {:?}, this version checks only {ALGORITHM}",
                sig.algorithm
            ));
        }
        let given = unhex(&sig.mac).ok_or(format!("{SIGNATURE}: the MAC is not hex"))?;
        let computed = self.state.borrow().found.clone().unwrap_or_default();
        // Compared in constant time, as HMAC's own verification does.
        let same = given.len() == computed.len()
            && given
                .iter()
                .zip(&computed)
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0;
        if !same {
            let hint = if key.generated {
                format!(
                    "; this host had no archive key, {} was generated just now: set \
                     [archive] key_file to the exporting host's key",
                    key.path.display()
                )
            } else {
                String::new()
            };
            return Err(format!(
                "archive signature does not match: altered, or signed with another key \
                 (this host's key: {}){hint}",
                key.path.display()
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "archive_sign_tests.rs"]
mod tests;
