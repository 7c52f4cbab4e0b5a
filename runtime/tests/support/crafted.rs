//! Hand-made btrfs send streams, as an attacker would write them: each command
//! carries the CRC `btrfs receive` checks, so a stream that is not refused is
//! received (a test that imports a harmless one first shows that).

const MAGIC: &[u8] = b"btrfs-stream\0";
const CMD_SUBVOL: u16 = 1;
const CMD_MKFILE: u16 = 3;
const CMD_SYMLINK: u16 = 8;
const CMD_WRITE: u16 = 15;
const CMD_END: u16 = 21;
const A_UUID: u16 = 1;
const A_CTRANSID: u16 = 2;
const A_INO: u16 = 3;
const A_PATH: u16 = 15;
const A_PATH_LINK: u16 = 17;
const A_FILE_OFFSET: u16 = 18;
const A_DATA: u16 = 19;

/// CRC-32C as btrfs send computes it: seed 0, no final inversion.
fn crc32c(data: &[u8]) -> u32 {
    let mut crc = 0u32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0x82F6_3B78
            } else {
                crc >> 1
            };
        }
    }
    crc
}

/// A version 1 send stream, built command by command.
pub struct Crafted {
    bytes: Vec<u8>,
    ino: u64,
}

impl Crafted {
    /// A stream that makes a new subvolume `name`.
    pub fn subvolume(name: &[u8]) -> Crafted {
        let mut bytes = MAGIC.to_vec();
        bytes.extend(1u32.to_le_bytes());
        let mut uuid = [0u8; 16];
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        uuid.copy_from_slice(&(nanos ^ u128::from(std::process::id())).to_le_bytes());
        let mut s = Crafted { bytes, ino: 256 };
        s.command(
            CMD_SUBVOL,
            &[
                (A_PATH, name),
                (A_UUID, &uuid),
                (A_CTRANSID, &7u64.to_le_bytes()),
            ],
        );
        s
    }

    fn command(&mut self, kind: u16, attrs: &[(u16, &[u8])]) {
        let mut body = Vec::new();
        for (t, v) in attrs {
            body.extend(t.to_le_bytes());
            body.extend((v.len() as u16).to_le_bytes());
            body.extend(*v);
        }
        let mut cmd = Vec::new();
        cmd.extend((body.len() as u32).to_le_bytes());
        cmd.extend(kind.to_le_bytes());
        cmd.extend(0u32.to_le_bytes());
        cmd.extend(body);
        let crc = crc32c(&cmd);
        cmd[6..10].copy_from_slice(&crc.to_le_bytes());
        self.bytes.extend(cmd);
    }

    fn next_ino(&mut self) -> [u8; 8] {
        self.ino += 1;
        self.ino.to_le_bytes()
    }

    /// Makes the file `path` holding `data`.
    pub fn file(mut self, path: &[u8], data: &[u8]) -> Crafted {
        let ino = self.next_ino();
        self.command(CMD_MKFILE, &[(A_PATH, path), (A_INO, &ino)]);
        self.command(
            CMD_WRITE,
            &[
                (A_PATH, path),
                (A_FILE_OFFSET, &0u64.to_le_bytes()),
                (A_DATA, data),
            ],
        );
        self
    }

    /// Makes the symlink `path` to `target`.
    pub fn symlink(mut self, path: &[u8], target: &[u8]) -> Crafted {
        let ino = self.next_ino();
        self.command(
            CMD_SYMLINK,
            &[(A_PATH, path), (A_INO, &ino), (A_PATH_LINK, target)],
        );
        self
    }

    /// The stream, ended.
    pub fn end(mut self) -> Vec<u8> {
        self.command(CMD_END, &[]);
        self.bytes
    }
}
