//! Loading the programs once per host, and finding them again.
//!
//! The first user loads and attaches the programs and pins every link and map in
//! bpffs under `<root>/<PIN_VERSION>`; links pinned there keep the programs
//! attached after that process exits, so every later user (another shim, crabctl,
//! a test) only opens the pinned maps. A host lock serialises the first load. The
//! `cgroups` map is pinned last: its pin is the marker of a complete load.

use std::fs::{self, File};
use std::mem::MaybeUninit;
use std::path::{Path, PathBuf};

use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{MapCore, MapFlags, MapHandle};

use crate::abi::{bytes_of, from_bytes};
use crate::skel::{types, InspectorSkelBuilder};
use crate::{Error, Result};

/// Where the pins live by default (bpffs).
pub const DEFAULT_PIN_ROOT: &str = "/sys/fs/bpf/crab";

/// The pin directory's name: a digest of the eBPF sources, so that a build with
/// other programs or map layouts never opens maps of another layout.
pub const PIN_VERSION: &str = env!("CRAB_BPF_DIGEST");

const BPF_FS_MAGIC: i64 = 0xcafe4a11;
const LAST_PIN: &str = "map-cgroups";

/// The maps a user needs, opened from their pins.
pub(crate) struct Pinned {
    pub cgroups: MapHandle,
    pub fs_entries: MapHandle,
    pub proc_entries: MapHandle,
}

/// Opens the pinned maps below `root`, loading and pinning the programs first if
/// no complete load is there.
pub(crate) fn open_or_load(root: &Path) -> Result<Pinned> {
    let dir = root.join(PIN_VERSION);
    if let Ok(p) = open_pins(&dir) {
        return Ok(p);
    }
    ensure_bpffs(root)?;
    let _lock = host_lock()?;
    // Someone else may have finished while this process waited.
    if let Ok(p) = open_pins(&dir) {
        return Ok(p);
    }
    if let Err(e) = load_and_pin(&dir) {
        // Pinned links would keep half a load attached: take it all down.
        clear_dir(&dir);
        return Err(e);
    }
    open_pins(&dir)
}

/// The host-wide lock that serialises loads (and prunes) of program sets.
fn host_lock() -> Result<nix::fcntl::Flock<File>> {
    let lock_path = Path::new("/run/crab-bpf.lock");
    let lock = File::create(lock_path).map_err(Error::io("create", lock_path))?;
    nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| Error::io("lock", lock_path)(e.into()))
}

fn clear_dir(dir: &Path) {
    if let Ok(entries) = fs::read_dir(dir) {
        for e in entries.flatten() {
            let _ = fs::remove_file(e.path());
        }
    }
}

/// The pinned maps below `root`, if a complete load is there.
pub(crate) fn open_pinned(root: &Path) -> Option<Pinned> {
    open_pins(&root.join(PIN_VERSION)).ok()
}

fn open_pins(dir: &Path) -> Result<Pinned> {
    // The marker first: without it the directory is an unfinished load.
    let cgroups = open_map(dir, LAST_PIN)?;
    Ok(Pinned {
        cgroups,
        fs_entries: open_map(dir, "map-fs_entries")?,
        proc_entries: open_map(dir, "map-proc_entries")?,
    })
}

fn open_map(dir: &Path, name: &str) -> Result<MapHandle> {
    let p = dir.join(name);
    MapHandle::from_pinned_path(&p).map_err(Error::bpf(format!("open pinned {}", p.display())))
}

fn load_and_pin(dir: &Path) -> Result<()> {
    // Remains of a load that died half-way: start over.
    clear_dir(dir);
    fs::create_dir_all(dir).map_err(Error::io("create pin dir", dir))?;
    // libbpf's warnings (a verifier's log among them) go to the log, not to stderr.
    libbpf_rs::set_print(Some((libbpf_rs::PrintLevel::Warn, log_libbpf)));
    let mut obj = MaybeUninit::uninit();
    let mut open = InspectorSkelBuilder::default()
        .open(&mut obj)
        .map_err(Error::bpf("open the eBPF object"))?;
    let rdonly_cast = kernel_has_rdonly_cast();
    let rodata = open
        .maps
        .rodata_data
        .as_deref_mut()
        .ok_or(Error::NoReadOnlyData)?;
    rodata.have_rdonly_cast = rdonly_cast;
    tracing::info!(
        rdonly_cast,
        "kernel reads: plain loads where true, else probe reads"
    );
    let skel = open
        .load()
        .map_err(Error::bpf("load the eBPF programs (verifier)"))?;
    let object = libbpf_rs::skel::Skel::object(&skel);
    for prog in object.progs_mut() {
        let name = prog.name().to_string_lossy().into_owned();
        let mut link = prog
            .attach()
            .map_err(Error::bpf(format!("attach program {name}")))?;
        let p = dir.join(format!("link-{name}"));
        link.pin(&p)
            .map_err(Error::bpf(format!("pin {}", p.display())))?;
    }
    calibrate(&skel)?;
    // The users' maps, the marker last.
    let wanted = ["fs_entries", "proc_entries", "cgroups"];
    for want in wanted {
        let map = object
            .maps()
            .find(|m| m.name() == want)
            .expect("the object defines every wanted map");
        pin_map(&map, &dir.join(format!("map-{want}")))?;
    }
    tracing::info!(dir = %dir.display(), "eBPF inspector loaded and pinned");
    Ok(())
}

fn log_libbpf(_level: libbpf_rs::PrintLevel, msg: String) {
    tracing::warn!(target: "libbpf", "{}", msg.trim_end());
}

/// Whether the running kernel has the `bpf_rdonly_cast` kfunc (6.2 and later), as
/// its BTF says: without it the programs read kernel memory through
/// `bpf_probe_read_kernel` (the `have_rdonly_cast` flag in their read-only data).
fn kernel_has_rdonly_cast() -> bool {
    match libbpf_rs::btf::Btf::from_vmlinux() {
        Ok(btf) => btf
            .type_by_name::<libbpf_rs::btf::types::Func<'_>>("bpf_rdonly_cast")
            .is_some(),
        Err(e) => {
            // libbpf fails the load itself without the kernel's BTF (CO-RE).
            tracing::warn!(error = %e, "no kernel BTF: assuming no bpf_rdonly_cast");
            false
        }
    }
}

/// Finds which f_mode bit means "created" on this kernel: opens a file that
/// it creates and then the same file again, and compares what the programs saw.
fn calibrate(skel: &crate::skel::InspectorSkel<'_>) -> Result<()> {
    let configs = &skel.maps.configs;
    let tid = nix::unistd::gettid().as_raw() as u32;
    let write = |c: &types::config| {
        configs
            .update(&0u32.to_ne_bytes(), bytes_of(c), MapFlags::ANY)
            .map_err(Error::bpf("write the inspector's config"))
    };
    write(&types::config {
        calib_tid: tid,
        ..Default::default()
    })?;
    let dir = tempfile_dir()?;
    let probe = dir.join("probe");
    let opened = (|| -> std::io::Result<()> {
        fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&probe)?;
        fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(&probe)?;
        Ok(())
    })();
    // Read before anything else this thread opens (removing the directory does).
    let cfg: Option<types::config> = configs
        .lookup(&0u32.to_ne_bytes(), MapFlags::ANY)
        .map_err(Error::bpf("read the inspector's config"))?
        .and_then(|b| from_bytes(&b));
    let _ = fs::remove_dir_all(&dir);
    opened.map_err(Error::io("open calibration files in", &dir))?;
    let cfg = cfg.unwrap_or_default();
    let (created, existing) = (cfg.calib_mode[0], cfg.calib_mode[1]);
    let mask = (created & !existing) as u32;
    if cfg.calib_count != 2 || mask.count_ones() != 1 {
        return Err(Error::Calibration {
            seen: cfg.calib_count,
            created,
            existing,
        });
    }
    tracing::debug!(mask = format!("{mask:#x}"), "FMODE_CREATED calibrated");
    write(&types::config {
        created_mask: mask,
        ..Default::default()
    })
}

fn tempfile_dir() -> Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("crab-bpf-calib-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).map_err(Error::io("create", &dir))?;
    Ok(dir)
}

fn pin_map(map: &libbpf_rs::Map<'_>, p: &Path) -> Result<()> {
    let mut handle =
        MapHandle::try_from(map).map_err(Error::bpf(format!("handle of map {}", p.display())))?;
    handle
        .pin(p)
        .map_err(Error::bpf(format!("pin {}", p.display())))
}

/// Mounts bpffs at `root`'s parent when nothing is mounted there (a fresh host).
fn ensure_bpffs(root: &Path) -> Result<()> {
    let base = root.parent().unwrap_or(root);
    fs::create_dir_all(base).map_err(Error::io("create", base))?;
    let st = nix::sys::statfs::statfs(base).map_err(|e| Error::io("statfs", base)(e.into()))?;
    if st.filesystem_type().0 as i64 == BPF_FS_MAGIC {
        return Ok(());
    }
    nix::mount::mount(
        Some("bpf"),
        base,
        Some("bpf"),
        nix::mount::MsFlags::empty(),
        None::<&str>,
    )
    .map_err(|e| Error::io("mount bpffs on", base)(e.into()))
}

/// A program set of another build, pinned below the same root.
#[derive(Debug, Clone)]
pub struct StaleSet {
    /// Its pin directory.
    pub dir: PathBuf,
    /// Cgroups its `cgroups` map still watches.
    pub watched: usize,
    /// Processes (other than this one) that hold its maps open.
    pub holders: Vec<i32>,
    /// Its pins were removed (its programs detached).
    pub removed: bool,
}

/// Program sets of other builds below `root`: an upgrade leaves the old set
/// pinned, and its pinned links keep its programs attached, so every system
/// call on the host pays for both. With `remove`, each set that watches no
/// cgroup and whose maps no other process holds open is unpinned, which
/// detaches its programs. A shim of the old build that starts using the set
/// later finds no pins and loads its own again, so nothing goes unwatched;
/// only one that opened the maps in the instant between the check and the
/// removal could write into a detached set (run this once old shims are
/// gone, as `hack/setup.sh` does after installing a build).
pub fn stale_sets(root: &Path, remove: bool) -> Result<Vec<StaleSet>> {
    let Ok(entries) = fs::read_dir(root) else {
        return Ok(Vec::new());
    };
    // Loads take this lock: none runs while sets are judged and removed.
    let _lock = host_lock()?;
    let mut out = Vec::new();
    for e in entries.flatten() {
        let dir = e.path();
        if e.file_name() == PIN_VERSION || !dir.is_dir() {
            continue;
        }
        let (watched, holders) = match open_map(&dir, LAST_PIN) {
            Ok(cgroups) => {
                let watched = cgroups.keys().count();
                let id = libbpf_rs::MapInfo::new(std::os::fd::AsFd::as_fd(&cgroups))
                    .map(|i| i.info.id)
                    .map_err(Error::bpf(format!("read map info in {}", dir.display())))?;
                (watched, map_holders(id))
            }
            // No marker: a load that died half-way, watching nothing.
            Err(_) => (0, Vec::new()),
        };
        let removed = remove && watched == 0 && holders.is_empty() && {
            clear_dir(&dir);
            fs::remove_dir(&dir).is_ok()
        };
        out.push(StaleSet {
            dir,
            watched,
            holders,
            removed,
        });
    }
    Ok(out)
}

/// Processes other than this one with an fd on eBPF map `id`.
fn map_holders(id: u32) -> Vec<i32> {
    let me = std::process::id() as i32;
    let wanted = format!("map_id:\t{id}");
    let mut out = Vec::new();
    for p in fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = p.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if pid == me {
            continue;
        }
        let fds = fs::read_dir(p.path().join("fd")).into_iter().flatten();
        let holds = fds.flatten().any(|fd| {
            fs::read_link(fd.path()).is_ok_and(|l| l.as_os_str() == "anon_inode:bpf-map")
                && fs::read_to_string(p.path().join("fdinfo").join(fd.file_name()))
                    .is_ok_and(|info| info.lines().any(|l| l == wanted))
        });
        if holds {
            out.push(pid);
        }
    }
    out
}
