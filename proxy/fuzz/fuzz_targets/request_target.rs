//! Any bytes as a request target: parsed as hyper does, then taken to the
//! origin form the proxy sends upstream. Must never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = crab_proxy::target::check_raw(data);
});
