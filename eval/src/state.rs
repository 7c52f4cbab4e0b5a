//! What a run ends with: whether the task's own check passes, and a digest of
//! the state a recovered run must share with a fault-free one.

use anyhow::{Context, Result};
use base64::Engine;
use sha2::{Digest, Sha256};

use crate::agent::TOOL_ENV;
use crate::sandbox::Ctr;
use crate::trajectory::Trajectory;

/// Prints a digest of files (relative path, type, mode, content or link
/// target) under the paths given, leaving out the volatile globs.
const DIGEST: &str = r#"
import fnmatch, hashlib, json, os, stat, sys
paths, volatile = json.loads(sys.argv[1]), json.loads(sys.argv[2])
h = hashlib.sha256()
def skip(rel):
    return any(fnmatch.fnmatch(rel, g) or fnmatch.fnmatch('/' + rel, g) or
               fnmatch.fnmatch(rel + '/', g) for g in volatile)
def add(root, full):
    rel = os.path.relpath(full, root)
    if rel != '.' and skip(rel):
        return False
    st = os.lstat(full)
    h.update(f'{root}\0{rel}\0{stat.S_IFMT(st.st_mode)}\0{stat.S_IMODE(st.st_mode):o}\0'.encode())
    if stat.S_ISLNK(st.st_mode):
        h.update(os.readlink(full).encode())
    elif stat.S_ISREG(st.st_mode):
        with open(full, 'rb') as f:
            h.update(hashlib.sha256(f.read()).digest())
    return True
for root in paths:
    if not os.path.lexists(root):
        h.update(f'{root}\0missing'.encode())
        continue
    if not os.path.isdir(root) or os.path.islink(root):
        add(os.path.dirname(root), root)
        continue
    for d, dirs, files in os.walk(root):
        dirs.sort()
        keep = [x for x in dirs if add(root, os.path.join(d, x)) or os.path.islink(os.path.join(d, x))]
        dirs[:] = [x for x in keep if not os.path.islink(os.path.join(d, x))]
        for f in sorted(files):
            add(root, os.path.join(d, f))
print(h.hexdigest())
"#;

/// How a run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ending {
    /// The verification script's exit code was 0.
    pub verified: bool,
    /// Digest of the files and the probe's output.
    pub digest: String,
}

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

/// Verifies container `id`'s task and digests its state.
pub async fn ending(ctr: &Ctr, id: &str, t: &Trajectory) -> Result<Ending> {
    let cd = format!("{TOOL_ENV}; cd {} || exit 125", t.workdir);
    let verify = ctr
        .exec(
            id,
            &format!("{cd}; sh -c \"$(echo {} | base64 -d)\"", b64(&t.verify)),
        )
        .await?;
    let paths = serde_json::to_string(&t.state.paths)?;
    let volatile = serde_json::to_string(&t.state.volatile)?;
    let files = ctr
        .exec(
            id,
            &format!(
                "python3 -c \"$(echo {} | base64 -d)\" \"$(echo {} | base64 -d)\" \"$(echo {} | base64 -d)\"",
                b64(DIGEST),
                b64(&paths),
                b64(&volatile)
            ),
        )
        .await?;
    anyhow::ensure!(files.code == 0, "state digest failed: {}", files.text);
    let mut h = Sha256::new();
    h.update(files.text.trim().as_bytes());
    if let Some(probe) = &t.state.probe {
        let out = ctr
            .exec(
                id,
                &format!("{cd}; sh -c \"$(echo {} | base64 -d)\" 2>&1", b64(probe)),
            )
            .await
            .context("probe")?;
        h.update(format!("\0{}\0{}", out.code, out.text).as_bytes());
    }
    Ok(Ending {
        verified: verify.code == 0,
        digest: format!("{:x}", h.finalize())[..16].to_string(),
    })
}
