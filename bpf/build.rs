//! Compiles the eBPF programs (clang, CO-RE) and generates their Rust skeleton.

use std::env;
use std::path::PathBuf;

use libbpf_cargo::SkeletonBuilder;

const SOURCES: [&str; 3] = [
    "src/bpf/inspector.bpf.c",
    "src/bpf/inspector.h",
    "src/bpf/kernel.h",
];

fn main() {
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR is set by cargo"))
        .join("inspector.skel.rs");
    SkeletonBuilder::new()
        .source(SOURCES[0])
        // v3: 32-bit atomics (the kernels this runs on all have them).
        .clang_args(["-I", "src/bpf", "-mcpu=v3", "-Wall", "-Werror"])
        .build_and_generate(&out)
        .expect("compile the eBPF programs (needs clang)");
    // The pin directory is named after the sources (FNV-1a), so that programs and
    // maps of another build are never mixed up with these.
    let mut h: u64 = 0xcbf29ce484222325;
    for f in SOURCES {
        println!("cargo:rerun-if-changed={f}");
        for b in std::fs::read(f).expect("read eBPF source") {
            h = (h ^ u64::from(b)).wrapping_mul(0x100000001b3);
        }
    }
    println!(
        "cargo:rustc-env=CRAB_BPF_DIGEST=v-{:012x}",
        h & 0xffff_ffff_ffff
    );
}
