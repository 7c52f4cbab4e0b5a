use super::reapply::covered;
use super::record::{mapping_header, tagged};
use super::*;

const SMAPS: &str = "\
55d0a000-55d0b000 r--p 00000000 08:01 42 /usr/bin/node
Size:                  4 kB
ProtectionKey:         0
VmFlags: rd mr mw me
3e5f0000-3e600000 rwxp 00000000 00:00 0
Size:                 64 kB
ProtectionKey:         1
VmFlags: rd wr ex mr mw me ac
7ffd0000-7ffd2000 r-xp 00000000 00:00 0 [vdso]
ProtectionKey:         0
";

#[test]
fn only_mappings_with_a_key_other_than_0_are_recorded() {
    assert_eq!(
        tagged(SMAPS),
        vec![Range {
            start: 0x3e5f0000,
            end: 0x3e600000,
            prot: (libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC) as u32,
            key: 1
        }]
    );
    assert_eq!(tagged("Size: 4 kB\nProtectionKey: 3\n"), vec![]);
}

#[test]
fn a_mapping_header_gives_its_range_and_protection() {
    assert_eq!(
        mapping_header("7ffd0000-7ffd2000 r-xp 00000000 00:00 0 [vdso]"),
        Some((
            0x7ffd0000,
            0x7ffd2000,
            (libc::PROT_READ | libc::PROT_EXEC) as u32
        ))
    );
    assert_eq!(mapping_header("VmFlags: rd wr"), None);
    assert_eq!(mapping_header("Size-x: 4 kB"), None);
}

fn range(start: u64, end: u64, prot: u32) -> Range {
    Range {
        start,
        end,
        prot,
        key: 1,
    }
}

#[test]
fn a_range_must_lie_in_mappings_with_its_protection_and_no_gap() {
    let maps = [
        (0x1000, 0x3000, 7),
        (0x3000, 0x5000, 7),
        (0x6000, 0x7000, 7),
    ];
    assert!(
        covered(&maps, &range(0x1000, 0x5000, 7)),
        "merged at restore"
    );
    assert!(covered(&maps, &range(0x2000, 0x3000, 7)), "part of one");
    assert!(!covered(&maps, &range(0x4000, 0x7000, 7)), "a gap");
    assert!(
        !covered(&maps, &range(0x1000, 0x2000, 3)),
        "another protection"
    );
    assert!(!covered(&maps, &range(0x8000, 0x9000, 7)), "no mapping");
}

fn with(ranges: Vec<Range>, pid: i32) -> Record {
    Record {
        processes: vec![Process { pid, ranges }],
    }
}

#[test]
fn a_record_from_elsewhere_is_refused_when_it_breaks_the_bounds() {
    let dir = tempfile::tempdir().unwrap();
    let load = |r: &Record| {
        std::fs::write(dir.path().join(FILE), serde_json::to_vec(r).unwrap()).unwrap();
        Record::load(dir.path())
    };
    let good = with(vec![range(0x1000, 0x2000, 7)], 1);
    assert_eq!(load(&good).unwrap(), Some(good));
    for (bad, why) in [
        (
            with(
                vec![Range {
                    key: 0,
                    ..range(0x1000, 0x2000, 7)
                }],
                1,
            ),
            "key 0",
        ),
        (
            with(
                vec![Range {
                    key: 16,
                    ..range(0x1000, 0x2000, 7)
                }],
                1,
            ),
            "key 16",
        ),
        (with(vec![range(0x1000, 0x1800, 7)], 1), "not page-aligned"),
        (with(vec![range(0x2000, 0x1000, 7)], 1), "backwards"),
        (
            with(vec![range(0x1000, 0x2000, 8)], 1),
            "a protection bit past exec",
        ),
        (with(vec![range(0x1000, 0x2000, 7)], 0), "pid 0"),
    ] {
        assert!(
            matches!(load(&bad), Err(Error::BadCheckpoint { .. })),
            "{why} passed"
        );
    }
    std::fs::write(dir.path().join(FILE), b"{\"processes\": 3}").unwrap();
    assert!(matches!(
        Record::load(dir.path()),
        Err(Error::BadCheckpoint { .. })
    ));
    std::fs::remove_file(dir.path().join(FILE)).unwrap();
    assert_eq!(Record::load(dir.path()).unwrap(), None);
}

/// A real process under the real injector: a Python that mapped a region it never
/// touches again, stopped as CRIU leaves a restored one.
#[cfg(feature = "host-tests")]
mod in_a_process {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};

    use super::super::*;
    use super::range;

    const PYTHON: &str = "import ctypes, mmap, time\n\
        m = mmap.mmap(-1, 1 << 16)\n\
        print(hex(ctypes.addressof(ctypes.c_char.from_buffer(m))), flush=True)\n\
        time.sleep(1)\n\
        print('done', flush=True)\n";

    fn state(pid: i32) -> String {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let line = |k: &str| {
            status
                .lines()
                .find(|l| l.starts_with(k))
                .unwrap()
                .to_string()
        };
        format!("{} {}", line("State:"), line("SigBlk:"))
    }

    /// The protection key of the mapping at `start`; `None` where the kernel shows
    /// none (a CPU without protection keys: smaps has no `ProtectionKey` line).
    fn key_of(pid: i32, start: u64) -> Option<u32> {
        let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap();
        let mut here = false;
        let mut found = false;
        for l in smaps.lines() {
            if let Some((s, e, _)) = super::mapping_header(l) {
                here = (s..e).contains(&start);
                found |= here;
            } else if let (true, Some(k)) = (here, l.strip_prefix("ProtectionKey:")) {
                return Some(k.trim().parse().unwrap());
            }
        }
        assert!(found, "no mapping at {start:#x}");
        None
    }

    #[test]
    fn the_restore_tags_only_the_restored_trees_own_mappings_and_lets_it_go_on() {
        let mut child = Command::new("python3")
            .args(["-c", PYTHON])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        let start = u64::from_str_radix(line.trim().trim_start_matches("0x"), 16).unwrap();
        let rw = (libc::PROT_READ | libc::PROT_WRITE) as u32;
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::SIGSTOP).unwrap();
        while !state(pid).starts_with("State:\tT") {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let before = state(pid);
        let own = |ranges| Record {
            processes: vec![Process { pid, ranges }],
        };

        // Another process (the host's init), and a range the process does not map:
        // refused, nothing touched.
        let elsewhere = Record {
            processes: vec![Process {
                pid: 1,
                ranges: vec![range(start, start + 0x1000, rw)],
            }],
        };
        let err = reapply(&elsewhere, pid).unwrap_err().to_string();
        assert!(err.contains("did not make"), "{err}");
        let err = reapply(&own(vec![range(0x1000, 0x2000, rw)]), pid)
            .unwrap_err()
            .to_string();
        assert!(err.contains("not a mapping"), "{err}");
        let err = reapply(&own(vec![range(start, start + 0x1000, 7)]), pid)
            .unwrap_err()
            .to_string();
        assert!(err.contains("not a mapping"), "another protection: {err}");
        let untagged = supported().then_some(0);
        assert_eq!(key_of(pid, start), untagged);

        let tagged = reapply(&own(vec![range(start, start + 0x10000, rw)]), pid);
        if supported() {
            assert_eq!(tagged.unwrap(), vec![pid]);
            assert_eq!(key_of(pid, start), Some(1), "the mapping carries its key");
        } else {
            let err = tagged.unwrap_err().to_string();
            assert!(err.contains("pkey_alloc"), "{err}");
            assert_eq!(key_of(pid, start), None);
        }
        assert_eq!(
            state(pid),
            before,
            "still stopped, with its own signal mask"
        );
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::SIGCONT).unwrap();
        line.clear();
        out.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "done");
        assert!(child.wait().unwrap().success());
    }
}
