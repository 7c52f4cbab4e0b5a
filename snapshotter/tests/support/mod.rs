//! A snapshotter in a temporary directory, with a fake store whose trees are
//! given by the test.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crab_snapshotter::{Snapshotter, Trees};

/// Writable layers a fake store made trees for, and what those wrote.
#[derive(Clone, Default)]
pub struct FakeTrees(pub Arc<Mutex<HashMap<PathBuf, u64>>>);

impl Trees for FakeTrees {
    fn written_for(&self, layer: &Path) -> Result<Option<u64>, String> {
        Ok(self.0.lock().unwrap().get(layer).copied())
    }
}

pub fn open(root: &Path) -> (Snapshotter, FakeTrees) {
    let trees = FakeTrees::default();
    let s = Snapshotter::open(root, Box::new(trees.clone())).unwrap();
    (s, trees)
}

/// The value of `name=` among a mount's options.
#[allow(dead_code)] // not every test file uses it
pub fn option<'a>(options: &'a [String], name: &str) -> Option<&'a str> {
    options
        .iter()
        .find_map(|o| o.strip_prefix(name)?.strip_prefix('='))
}
