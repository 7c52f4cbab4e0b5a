//! Checkpoint and restore through containerd's own API (`ctr task checkpoint`,
//! `ctr container checkpoint` / `restore --live`), with real CRIU.

// Needs root and the private containerd: built only with the `host-tests` feature (hack/test.sh enables it).
#![cfg(feature = "host-tests")]

use std::time::Duration;

use crab_integration::*;

/// Counts in memory and writes the count to a file, five times a second.
const COUNTER: &str = "mkdir -p /sandbox && echo hello > /sandbox/data.txt && rm /bin/wget; \
                       i=0; while true; do i=$((i+1)); echo $i > /tmp/count.new; mv /tmp/count.new /tmp/count; sleep 0.2; done";

/// A checkpoint image, removed from containerd when dropped.
struct Ref(String);

impl Drop for Ref {
    fn drop(&mut self) {
        let _ = ctr_run(&["images", "rm", &self.0], None, Duration::from_secs(20));
    }
}

/// The counter's value; 0 while it cannot be read yet (the container starting).
fn count(g: &Guard) -> u64 {
    let out = g.exec(&["cat", "/tmp/count"]);
    text(&out).0.trim().parse().unwrap_or(0)
}

fn counter() -> Guard {
    let g = Guard::sh(COUNTER);
    assert!(
        wait_until(Duration::from_secs(10), || count(&g) >= 10),
        "counter did not count"
    );
    g
}

fn checkpoint_ref(prefix: &str) -> Ref {
    Ref(format!("crab.test/checkpoint/{}:1", unique_id(prefix)))
}

/// `ctr container restore --live NEW REF`; the guard removes the new container.
fn restore_live(reference: &Ref) -> Guard {
    let g = Guard::new(&unique_id("r"));
    ctr_ok(&["container", "restore", "--live", &g.id, &reference.0]);
    assert!(
        wait_until(Duration::from_secs(10), || g.status().as_deref()
            == Some("RUNNING")),
        "restored task not running: {:?}",
        g.status()
    );
    g
}

#[test]
fn task_checkpoint_leaves_the_container_running_and_stores_an_image() {
    let g = counter();
    let out = ctr_ok(&["task", "checkpoint", &g.id]);
    let name = out.trim().to_string();
    let _image = Ref(name.clone());
    assert!(name.starts_with("containerd.io/checkpoint/"), "{out}");
    let images = ctr_ok(&["images", "ls"]);
    let line = images
        .lines()
        .find(|l| l.starts_with(&name))
        .unwrap_or_else(|| panic!("{name} not in\n{images}"));
    assert!(line.contains("containerd.io/checkpoint=true"), "{line}");
    assert_eq!(g.status().as_deref(), Some("RUNNING"));
    let before = count(&g);
    assert!(
        wait_until(Duration::from_secs(5), || count(&g) > before),
        "the container stopped counting after the checkpoint"
    );
}

#[test]
fn ctr_task_checkpoint_exit_stops_the_task_from_containerd_2_on() {
    // ctr 1.7 sends `--exit` only to runc's runtimes: Crab gets no options and keeps
    // the task running, as containerd documents for options-less checkpoints. ctr 2.x
    // sends runc's checkpoint options to every runtime, and Crab stops the task.
    let major = crab_integration::client::Client::connect().containerd_major();
    let g = counter();
    let out = ctr_ok(&["task", "checkpoint", "--exit", &g.id]);
    let _image = Ref(out.trim().to_string());
    if major < 2 {
        assert_eq!(g.status().as_deref(), Some("RUNNING"));
    } else {
        assert!(
            wait_until(Duration::from_secs(10), || g.status().as_deref()
                == Some("STOPPED")),
            "status after ctr task checkpoint --exit: {:?}",
            g.status()
        );
    }
}

#[test]
fn checkpoint_with_the_exit_option_stops_the_task() {
    // What containerd sends when a client asks for exit with runc's options type
    // (`ctr container checkpoint`, nerdctl, Docker): exit = field 1.
    checkpoint_with_exit_in("containerd.runc.v1.CheckpointOptions");
}

#[test]
fn checkpoint_with_the_exit_option_of_the_older_type_stops_the_task() {
    // What containerd's Go client (`WithExit`) sends to a runtime that is not
    // runc's: the same message under its older name.
    checkpoint_with_exit_in("containerd.linux.runc.CheckpointOptions");
}

fn checkpoint_with_exit_in(type_url: &str) {
    let g = counter();
    let dir = std::env::temp_dir().join(unique_id("exit-ckpt"));
    let (mut options, mut any, mut request) = (Vec::new(), Vec::new(), Vec::new());
    options.extend_from_slice(&[1 << 3, 1]);
    pb_bytes(&mut any, 1, type_url.as_bytes());
    pb_bytes(&mut any, 2, &options);
    pb_bytes(&mut request, 1, g.id.as_bytes());
    pb_bytes(&mut request, 2, dir.display().to_string().as_bytes());
    pb_bytes(&mut request, 3, &any);
    let (code, message) = shim_call(&g.id, "Checkpoint", &request);
    assert_eq!(code, 0, "checkpoint failed: {message}");
    assert!(
        wait_until(Duration::from_secs(10), || g.status().as_deref()
            == Some("STOPPED")),
        "status after a checkpoint with exit: {:?}",
        g.status()
    );
    let manifest = std::fs::read_to_string(dir.join("crab-checkpoint.json")).unwrap();
    assert!(manifest.contains("\"kind\": \"full\""), "{manifest}");
    // CRIU's images at the top, as runc's (CRI unpacks them into one flat directory).
    assert!(dir.join("inventory.img").is_file());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn restore_live_continues_the_counter_in_memory_and_has_the_files_without_rw() {
    let g = counter();
    let reference = checkpoint_ref("ckpt");
    let before = count(&g);
    ctr_ok(&["container", "checkpoint", "--task", &g.id, &reference.0]);
    g.remove();

    let r = restore_live(&reference);
    let first = count(&r);
    // A process started afresh would count from 1; the restored one goes on from
    // where the dump caught it, which is after `before`.
    assert!(
        first >= before,
        "restored count {first} < {before} before the dump"
    );
    assert!(
        wait_until(Duration::from_secs(5), || count(&r) > first),
        "the restored process does not count"
    );
    assert_eq!(r.exec_ok(&["cat", "/sandbox/data.txt"]).trim(), "hello");
    let gone = r.exec(&["test", "-e", "/bin/wget"]);
    assert_eq!(gone.status.code(), Some(1), "a deleted file came back");
}

#[test]
fn a_restored_http_server_answers_on_loopback() {
    let g = Guard::sh(
        "mkdir -p /www && echo served-before > /www/index.html && \
             exec httpd -f -p 127.0.0.1:8080 -h /www",
    );
    let get = ["wget", "-qO-", "http://127.0.0.1:8080/index.html"];
    assert!(
        wait_until(Duration::from_secs(10), || g.exec(&get).status.success()),
        "server not reachable before the checkpoint: {:?}",
        text(&g.exec(&get))
    );
    let reference = checkpoint_ref("http");
    ctr_ok(&["container", "checkpoint", "--task", &g.id, &reference.0]);
    g.remove();

    let r = restore_live(&reference);
    assert_eq!(r.exec_ok(&get).trim(), "served-before");
    let lo = r.exec_ok(&["cat", "/sys/class/net/lo/operstate"]);
    assert_ne!(lo.trim(), "down", "loopback is down after restore");
}

#[test]
fn a_paused_container_checkpoints_and_stays_paused() {
    let g = counter();
    ctr_ok(&["task", "pause", &g.id]);
    let out = ctr_ok(&["task", "checkpoint", &g.id]);
    let _image = Ref(out.trim().to_string());
    assert_eq!(g.status().as_deref(), Some("PAUSED"));
    let frozen = std::fs::read_to_string(format!(
        "/sys/fs/cgroup/freezer/{}/{}/freezer.state",
        namespace(),
        g.id
    ))
    .unwrap_or_default();
    assert_eq!(frozen.trim(), "FROZEN");
    ctr_ok(&["task", "resume", &g.id]);
    let before = count(&g);
    assert!(wait_until(Duration::from_secs(5), || count(&g) > before));
}

#[test]
fn checkpoint_without_criu_fails_clearly_and_the_container_keeps_running() {
    let config = config_with("[checkpoint]\ncriu = \"/nonexistent/criu\"");
    let path = config.display().to_string();
    let g = Guard::run_detached(
        CRAB,
        BUSYBOX,
        &["--runtime-config-path", &path],
        &["sh", "-c", COUNTER],
    );
    assert!(wait_until(Duration::from_secs(10), || count(&g) >= 3));
    let out = ctr_run(
        &["task", "checkpoint", &g.id],
        None,
        Duration::from_secs(60),
    );
    let (_, e) = text(&out);
    assert!(!out.status.success());
    assert!(e.contains("CRIU not found"), "{e}");
    assert_eq!(g.status().as_deref(), Some("RUNNING"));
    let before = count(&g);
    assert!(
        wait_until(Duration::from_secs(5), || count(&g) > before),
        "the container was left frozen"
    );
    let _ = std::fs::remove_file(&config);
}

#[test]
fn names_that_are_not_utf8_survive_ctr_checkpoint_and_restore() {
    let g = counter();
    // `\377` is no UTF-8; `/bin/wget` (deleted by the counter) is the image's.
    g.exec_ok(&[
        "sh",
        "-c",
        "echo bytes > \"/sandbox/$(printf 'n\\377')\" && mkdir \"/sandbox/$(printf 'd\\376')\" && echo in > \"/sandbox/$(printf 'd\\376')/$(printf '\\375')\"",
    ]);
    let reference = checkpoint_ref("names");
    ctr_ok(&["container", "checkpoint", "--task", &g.id, &reference.0]);
    g.remove();
    let r = restore_live(&reference);
    let out = r.exec_ok(&[
        "sh",
        "-c",
        "cat \"/sandbox/$(printf 'n\\377')\" \"/sandbox/$(printf 'd\\376')/$(printf '\\375')\"",
    ]);
    assert_eq!(
        out.split_whitespace().collect::<Vec<_>>(),
        ["bytes", "in"],
        "{out}"
    );
    let gone = r.exec(&["test", "-e", "/bin/wget"]);
    assert_eq!(gone.status.code(), Some(1), "a deleted file came back");
}
