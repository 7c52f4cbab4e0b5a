//! A host-wide bound on checkpoints and restores running at once.
//!
//! Each shim is its own process, so the bound is a set of lock files: a dump or a
//! restore holds an exclusive `flock` on one of `checkpoint.max_parallel` files in the
//! state dir for its duration. The kernel drops the lock when the holder exits, so a
//! killed shim or helper never leaks a slot.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::Duration;

use crate::{Error, Result};

/// A held slot; dropping it frees the slot.
#[derive(Debug)]
pub struct Slot(#[allow(dead_code)] File);

/// Takes one of `max` slots under `dir`, waiting (polling every 20 ms) while all are
/// taken. `max == 0` means no bound.
pub fn acquire(dir: &Path, max: u32) -> Result<Option<Slot>> {
    if max == 0 {
        return Ok(None);
    }
    std::fs::create_dir_all(dir).map_err(Error::io(format!("create {}", dir.display())))?;
    let files: Vec<File> = (0..max)
        .map(|i| {
            let p = dir.join(format!("slot-{i}"));
            std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&p)
                .map_err(Error::io(format!("open {}", p.display())))
        })
        .collect::<Result<_>>()?;
    loop {
        for f in &files {
            // SAFETY: flock on an fd this function owns; no memory is passed.
            if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
                let held = f.try_clone().map_err(Error::io("dup a slot file"))?;
                return Ok(Some(Slot(held)));
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_bound_holders_and_free_on_drop() {
        let t = tempfile::tempdir().unwrap();
        let a = acquire(t.path(), 2).unwrap().unwrap();
        let b = acquire(t.path(), 2).unwrap().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let dir = t.path().to_path_buf();
        let waiter = std::thread::spawn(move || {
            let c = acquire(&dir, 2).unwrap();
            tx.send(()).unwrap();
            drop(c);
        });
        assert!(
            rx.recv_timeout(Duration::from_millis(200)).is_err(),
            "a third slot"
        );
        drop(a);
        rx.recv_timeout(Duration::from_secs(5))
            .expect("freed slot taken");
        waiter.join().unwrap();
        drop(b);
        assert!(acquire(t.path(), 0).unwrap().is_none());
    }
}
