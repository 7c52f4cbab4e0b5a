//! containerd-shim-crab-v2: see the `crab_shim` library.

fn main() {
    crab_shim::main();
}
