//! Output to a log URI instead of fifos (`ctr run --log-uri`, containerd's
//! `cio.LogURI`, nerdctl's `binary://` logger), with runc's shim's schemes.

// Needs root and the private containerd: built only with the `host-tests` feature (hack/test.sh enables it).
#![cfg(feature = "host-tests")]

use std::path::{Path, PathBuf};
use std::time::Duration;

use crab_integration::*;

const T: Duration = Duration::from_secs(20);

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(unique_id(name));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

/// Prints a line on each output, then a count every 100 ms.
const TALKER: &str = "echo out-line; echo err-line >&2; i=0; \
    while true; do i=$((i+1)); echo tick-$i; sleep 0.1; done";

#[test]
fn a_file_log_uri_gets_both_outputs_in_a_directory_made_for_it() {
    let d = dir("logfile");
    let log = d.join("sub/container.log");
    let uri = format!("file://{}", log.display());
    let g = Guard::run_detached(CRAB, BUSYBOX, &["--log-uri", &uri], &["sh", "-c", TALKER]);
    assert!(
        wait_until(T, || read(&log).contains("tick-3")),
        "log: {:?}",
        read(&log)
    );
    let text = read(&log);
    assert!(
        text.contains("out-line") && text.contains("err-line"),
        "{text}"
    );
    drop(g);
    let _ = std::fs::remove_dir_all(&d);
}

/// A logging binary as runc's shim runs one: output on fds 3 and 4, fd 5 closed
/// when ready (its readers must not hold it), its first argument (from the query)
/// where to write.
const LOGGER: &str = r#"#!/bin/sh
cat <&3 >>"$1/out" 5>&- &
cat <&4 >>"$1/err" 5>&- &
echo "$CONTAINER_NAMESPACE/$CONTAINER_ID" >"$1/who"
exec 5>&-
wait
echo done >>"$1/done"
"#;

#[test]
fn a_binary_log_uri_runs_the_logger_with_the_outputs_and_lets_it_finish() {
    let d = dir("logger");
    std::fs::create_dir_all(&d).unwrap();
    let logger = d.join("logger.sh");
    std::fs::write(&logger, LOGGER).unwrap();
    std::fs::set_permissions(&logger, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    // The argument percent-encoded, as containerd's Go client writes a query.
    let arg = d.display().to_string().replace('/', "%2F");
    let uri = format!("binary://{}?{arg}", logger.display());
    let g = Guard::run_detached(CRAB, BUSYBOX, &["--log-uri", &uri], &["sh", "-c", TALKER]);
    assert!(
        wait_until(T, || read(&d.join("out")).contains("tick-3")),
        "out: {:?}",
        read(&d.join("out"))
    );
    assert!(read(&d.join("out")).starts_with("out-line\n"));
    assert_eq!(read(&d.join("err")), "err-line\n");
    assert_eq!(
        read(&d.join("who")).trim(),
        format!("{}/{}", namespace(), g.id)
    );
    assert_eq!(
        read(&d.join("done")),
        "",
        "the logger ended while the task runs"
    );

    // A rollback: the restored process logs on, through a logger of its own.
    crabctl_ok(&["checkpoint", &g.id, "--name", "logged"]);
    crabctl_ok(&["rollback", &g.id, "logged"]);
    let lines = read(&d.join("out")).lines().count();
    assert!(
        wait_until(T, || read(&d.join("out")).lines().count() > lines + 3),
        "no output after the rollback: {:?}",
        read(&d.join("out"))
    );

    // The task ends: the loggers read to EOF and exit on their own.
    ctr_ok(&["task", "kill", "-s", "KILL", &g.id]);
    assert!(
        wait_until(T, || read(&d.join("done")).lines().count() == 2),
        "the loggers did not finish: {:?}",
        read(&d.join("done"))
    );
    drop(g);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn an_unknown_log_scheme_fails_the_create_clearly() {
    let id = unique_id("badlog");
    let _g = Guard::new(&id);
    let out = ctr_run(
        &[
            "run",
            "-d",
            "--runtime",
            CRAB,
            "--log-uri",
            "gopher:///x",
            BUSYBOX,
            &id,
            "true",
        ],
        None,
        T,
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unknown scheme"), "{err}");
}
