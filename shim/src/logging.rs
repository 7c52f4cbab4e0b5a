//! Logging: the serving shim writes to the `log` fifo containerd reads from the bundle
//! directory (containerd copies it into its own log); `start` and `delete` write to
//! stderr, which containerd logs on failure.

use std::fs::OpenOptions;
use std::sync::Mutex;

use tracing_subscriber::EnvFilter;

/// Installs the global subscriber. The level is `RUST_LOG` if set, else `debug` when
/// containerd runs with debug logging, else the host configuration's `log_level`.
pub fn init(serving: bool, debug: bool) {
    let configured = crab_runtime::config::Config::load_with_env(None, None)
        .map(|(c, _)| c.log_level.as_str())
        .unwrap_or("info");
    let default = if debug { "debug" } else { configured };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(false)
        .with_target(false);
    if serving {
        if let Ok(log) = OpenOptions::new().write(true).open("log") {
            let _ = builder.with_writer(Mutex::new(log)).try_init();
            return;
        }
    }
    let _ = builder.with_writer(std::io::stderr).try_init();
}
