//! containerd's wire protocol, by hand: enough protobuf and ttrpc to make the task API
//! calls that this `ctr` (containerd 1.7) cannot make.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

/// Appends protobuf field `n` holding `data` (wire type 2) to `out`.
pub fn pb_bytes(out: &mut Vec<u8>, n: u64, data: &[u8]) {
    for mut v in [n << 3 | 2, data.len() as u64] {
        while v >= 0x80 {
            out.push(v as u8 | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }
    out.extend_from_slice(data);
}

/// The protobuf fields of `data`: (number, varint value, bytes).
pub fn pb_fields(mut data: &[u8]) -> Vec<(u64, u64, &[u8])> {
    fn varint(data: &mut &[u8]) -> u64 {
        let (mut v, mut shift) = (0, 0);
        while let Some((&b, rest)) = data.split_first() {
            (*data, v, shift) = (rest, v | u64::from(b & 0x7f) << shift, shift + 7);
            if b < 0x80 {
                break;
            }
        }
        v
    }
    let mut out = Vec::new();
    while !data.is_empty() {
        let key = varint(&mut data);
        let (v, n) = match key & 7 {
            0 => (varint(&mut data), 0),
            2 => (0, (varint(&mut data) as usize).min(data.len())),
            w => panic!("unexpected protobuf wire type {w}"),
        };
        out.push((key >> 3, v, &data[..n]));
        data = &data[n..];
    }
    out
}

/// Calls task API `method` with the encoded request `payload` on the shim serving
/// container `id`, over its ttrpc socket (as containerd would). Returns the ttrpc status
/// (code, message); code 0 is success.
pub fn shim_call(id: &str, method: &str, payload: &[u8]) -> (u64, String) {
    let address = std::fs::read_to_string(crate::bundle_dir(id).join("address"));
    let socket = address.expect("shim address file");
    let mut request = Vec::new();
    pb_bytes(&mut request, 1, b"containerd.task.v2.Task");
    pb_bytes(&mut request, 2, method.as_bytes());
    pb_bytes(&mut request, 3, payload);
    // A ttrpc frame: length, stream id 1, type 1 (request), no flags.
    let mut frame = (request.len() as u32).to_be_bytes().to_vec();
    frame.extend_from_slice(&[0, 0, 0, 1, 1, 0]);
    frame.extend_from_slice(&request);
    let mut conn = UnixStream::connect(socket.trim().trim_start_matches("unix://")).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    conn.write_all(&frame).expect("send the request");
    let mut header = [0u8; 10];
    conn.read_exact(&mut header).expect("response header");
    assert_eq!(header[8], 2, "not a ttrpc response");
    let mut body = vec![0u8; u32::from_be_bytes(header[..4].try_into().unwrap()) as usize];
    conn.read_exact(&mut body).expect("response body");
    let (mut code, mut message) = (0, String::new());
    for (_, _, status) in pb_fields(&body).into_iter().filter(|f| f.0 == 1) {
        for (n, v, b) in pb_fields(status) {
            match n {
                1 => code = v,
                2 => message = String::from_utf8_lossy(b).into_owned(),
                _ => {}
            }
        }
    }
    (code, message)
}
