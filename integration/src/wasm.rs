//! A node process that compiled WebAssembly, to check that a restored one compiles
//! more. V8 keeps its WebAssembly code under a memory protection key where the CPU
//! has PKU; CRIU restores neither the key's allocation nor the mappings' tags, and a
//! restored node died with "WasmCodeManager::Commit: Cannot make pre-reserved region
//! writable" at its next compile until the restore put them back.

use std::time::Duration;

use crate::{wait_until, Guard, AGENT, CRAB};

/// Compiles a module (and writes `/tmp/before`: its answer and how many mappings
/// carry a key), then at `/tmp/go` fifty others (`/tmp/after`: their sum, 1275, and
/// the mappings with a key again), and stays.
const SCRIPT: &str = r#"
const fs = require('fs');
// A module whose one function answers n (below 64): modules differ, so each is
// compiled into fresh code memory (V8 shares the code of identical ones).
const module = n => new Uint8Array([0,97,115,109,1,0,0,0,1,5,1,96,0,1,127,3,2,1,0,7,5,1,1,102,0,0,10,6,1,4,0,65,n,11]);
const compile = n => new WebAssembly.Instance(new WebAssembly.Module(module(n))).exports.f();
const keys = () => fs.readFileSync('/proc/self/smaps', 'utf8').split('\n')
  .filter(l => /^ProtectionKey:\s+[1-9]/.test(l)).length;
fs.writeFileSync('/tmp/before', `${compile(42)} ${keys()}\n`);
const t = setInterval(() => {
  if (!fs.existsSync('/tmp/go')) return;
  clearInterval(t);
  let sum = 0;
  for (let n = 1; n <= 50; n++) sum += compile(n);
  fs.writeFileSync('/tmp/after', `${sum} ${keys()}\n`);
  setInterval(() => {}, 1 << 30);
}, 20);
"#;

/// The container, and how many of node's mappings carried a key before.
pub struct Node {
    /// The container (the agent image: node 18).
    pub guard: Guard,
    /// Mappings with a key after the first compile.
    pub tagged: u32,
}

fn read(g: &Guard, path: &str) -> String {
    let mut last = String::new();
    let ok = wait_until(Duration::from_secs(20), || {
        let out = g.exec(&["cat", path]);
        last = String::from_utf8_lossy(&out.stdout).trim().to_string();
        out.status.success() && !last.is_empty()
    });
    assert!(ok, "{path} never appeared in {} (node died?)", g.id);
    last
}

fn pair(text: &str) -> (u32, u32) {
    let (a, b) = text.split_once(' ').expect("two numbers");
    (a.parse().unwrap(), b.parse().unwrap())
}

impl Node {
    /// Starts it with extra `ctr run` flags, once its first module ran. Where the
    /// CPU has PKU, node must have tagged its code (else the test checks nothing).
    pub fn start(flags: &[&str]) -> Node {
        let guard = Guard::run_detached(CRAB, AGENT, flags, &["node", "-e", SCRIPT]);
        let (answer, tagged) = pair(&read(&guard, "/tmp/before"));
        assert_eq!(answer, 42);
        let pku = std::fs::read_to_string("/proc/cpuinfo")
            .unwrap()
            .split_whitespace()
            .any(|w| w == "ospke");
        assert_eq!(
            tagged > 0,
            pku,
            "node tags its code exactly where the kernel has PKU"
        );
        Node { guard, tagged }
    }

    /// `g` (this container, or a copy of it) compiles fifty modules more, and its code
    /// keeps its key.
    pub fn assert_compiles_again(&self, g: &Guard) {
        g.exec_ok(&["touch", "/tmp/go"]);
        let (sum, tagged) = pair(&read(g, "/tmp/after"));
        assert_eq!(sum, 1275, "fifty more modules ran in {}", g.id);
        assert!(
            tagged >= self.tagged,
            "{}: the restored code lost its key ({} mappings had one, {tagged} have)",
            g.id,
            self.tagged
        );
    }
}
