//! One ZFS store operation (a test tool, not installed), for the crash tests of
//! `tests/zfs_store.rs`: they run it
//! with `CRAB_FAULT=<point>` so that it dies (SIGKILL) at that point, as a crash would
//! stop a shim, and then check what `reconcile` makes of the leftovers.
//!
//! `zfs-store-op <dataset> rollback|prepare|import|delete|destroy <namespace> <id> [arg]`

use std::path::PathBuf;

use crab_runtime::storage::zfs::ZfsStore;
use crab_runtime::storage::{ContainerKey, ImageSource, Store};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let w: Vec<&str> = args.iter().map(String::as_str).collect();
    let Some((root, rest)) = w.split_first() else {
        eprintln!("usage: zfs-store-op <dataset> <op> <namespace> <id> [arg]");
        std::process::exit(2);
    };
    let s = ZfsStore::open(root).expect("open the store");
    let key = |ns: &str, id: &str| ContainerKey::new(ns, id).expect("key");
    let done = match rest {
        ["rollback", ns, id, snap] => s.rollback(&key(ns, id), snap),
        ["prepare", ns, id, dir] => s
            .prepare(
                &key(ns, id),
                &ImageSource::from_layers(vec![PathBuf::from(dir)]).expect("the layer"),
            )
            .map(|_| ()),
        ["import", ns, id, file] => {
            let mut f = std::fs::File::open(file).expect("open the stream");
            s.import(&key(ns, id), &mut f).map(|_| ())
        }
        ["delete", ns, id, snap] => s.delete_snapshot(&key(ns, id), snap),
        ["destroy", ns, id] => s.destroy(&key(ns, id)),
        other => {
            eprintln!("unknown operation {other:?}");
            std::process::exit(2);
        }
    };
    if let Err(e) = done {
        eprintln!("{e}");
        std::process::exit(1);
    }
}
