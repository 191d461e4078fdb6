//! The server against real NBD clients: nbdinfo, nbdcopy, qemu-img, fio.

mod common;

use std::process::Command;
use std::sync::Arc;

use common::nbd::*;
use common::*;
use udm::core::{BlockDevice, WriteBuf};
use udm::store::file::{FileStore, OpenFlags};
use udm::store::mem::MemStore;

fn mem(size: u64) -> Arc<dyn BlockDevice> {
    Arc::new(MemStore::new(size))
}

#[test]
fn nbdinfo_handshake_size_block_sizes_and_list() {
    need("nbdinfo");
    let srv = Server::start(
        vec![
            export("first", mem(8 << 20), false),
            export("second", mem(3 << 20), true),
        ],
        2,
    );
    let out = run(Command::new("nbdinfo").arg("--json").arg(srv.uri("")));
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let e = &j["exports"][0];
    assert_eq!(e["export-size"], 8 << 20, "{j}");
    // The default export "" reports its canonical name.
    assert_eq!(e["export-name"], "first", "{j}");
    assert_eq!(e["contexts"][0], "base:allocation", "{j}");
    assert_eq!(e["block_size_minimum"], 1, "{j}");
    assert_eq!(e["block_size_preferred"], 4096, "{j}");
    assert_eq!(e["block_size_maximum"], 32 << 20, "{j}");
    assert_eq!(e["is_read_only"], false, "{j}");
    assert_eq!(e["can_multi_conn"], true, "{j}");
    assert_eq!(e["can_flush"], true, "{j}");
    assert_eq!(e["can_fua"], true, "{j}");
    assert_eq!(e["can_trim"], true, "{j}");
    assert_eq!(e["can_zero"], true, "{j}");
    assert_eq!(e["can_cache"], true, "{j}");
    assert_eq!(j["protocol"], "newstyle-fixed", "{j}");

    let out = run(Command::new("nbdinfo").arg("--json").arg(srv.uri("second")));
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["exports"][0]["export-size"], 3 << 20, "{j}");
    assert_eq!(j["exports"][0]["is_read_only"], true, "{j}");
    assert_eq!(j["exports"][0]["description"], "test export second", "{j}");

    let out = run(Command::new("nbdinfo")
        .arg("--list")
        .arg("--json")
        .arg(srv.uri("")));
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let names: Vec<_> = j["exports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["export-name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, ["first", "second"], "{j}");

    // An unknown export is refused cleanly and the server keeps serving.
    let bad = Command::new("nbdinfo")
        .arg(srv.uri("nope"))
        .output()
        .unwrap();
    assert!(!bad.status.success());
    run(Command::new("nbdinfo").arg("--size").arg(srv.uri("first")));
    srv.stop().unwrap();
}

#[test]
fn nbdinfo_over_tcp() {
    need("nbdinfo");
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("unused");
    let srv = Server::start_on(
        dir,
        marker,
        udm::nbd::Listen::Tcp(format!("127.0.0.1:{port}")),
        vec![export("t", mem(1 << 20), false)],
        1,
    );
    let uri = format!("nbd://127.0.0.1:{port}/t");
    let mut out = None;
    for _ in 0..100 {
        let o = Command::new("nbdinfo")
            .arg("--size")
            .arg(&uri)
            .output()
            .unwrap();
        if o.status.success() {
            out = Some(o);
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let out = out.expect("nbdinfo over TCP never succeeded");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "1048576");
    srv.stop().unwrap();
}

#[test]
fn nbdcopy_round_trip_is_byte_identical() {
    need("nbdcopy");
    const SIZE: usize = 64 << 20;
    let dir = tempfile::tempdir().unwrap();
    let backing = sparse(dir.path(), "disk.img", SIZE as u64);
    let dev: Arc<dyn BlockDevice> =
        Arc::new(FileStore::open(&backing, OpenFlags::default()).unwrap());
    let srv = Server::start(vec![export("disk", dev, false)], 0);
    let src = dir.path().join("in.bin");
    let back = dir.path().join("out.bin");
    let data = fast_bytes(42, SIZE);
    std::fs::write(&src, &data).unwrap();
    run(Command::new("nbdcopy").arg(&src).arg(srv.uri("disk")));
    run(Command::new("nbdcopy").arg(srv.uri("disk")).arg(&back));
    assert!(
        std::fs::read(&back).unwrap() == data,
        "nbdcopy round trip differs"
    );
    srv.stop().unwrap();
    // After a clean stop the data is in the backing file.
    assert!(
        std::fs::read(&backing).unwrap() == data,
        "backing file differs"
    );
}

#[test]
fn qemu_img_convert_and_compare() {
    need("qemu-img");
    const SIZE: usize = 16 << 20;
    let m = mem(SIZE as u64);
    let srv = Server::start(vec![export("q", m.clone(), false)], 2);
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src.raw");
    let mut data = fast_bytes(7, SIZE);
    data[(4 << 20)..(6 << 20)].fill(0); // a zero run for qemu's zero detection
    std::fs::write(&src, &data).unwrap();
    run(Command::new("qemu-img")
        .args(["convert", "-n", "-f", "raw", "-O", "raw"])
        .arg(&src)
        .arg(srv.uri("q")));
    run(Command::new("qemu-img")
        .args(["compare", "-f", "raw", "-F", "raw"])
        .arg(&src)
        .arg(srv.uri("q")));
    let mut back = vec![0u8; SIZE];
    m.read(0, &mut back).unwrap();
    assert!(back == data, "device content differs from the source");
    // A change on the device makes compare fail: the check is real.
    m.write(1 << 20, WriteBuf::Borrowed(&[0xEE; 512]), false)
        .unwrap();
    let o = Command::new("qemu-img")
        .args(["compare", "-f", "raw", "-F", "raw"])
        .arg(&src)
        .arg(srv.uri("q"))
        .output()
        .unwrap();
    assert!(!o.status.success(), "qemu-img compare missed a difference");
    srv.stop().unwrap();
}

#[test]
fn fio_nbd_engine_with_crc32c_verify_four_jobs() {
    need("fio");
    let srv = Server::start(vec![export("f", mem(64 << 20), false)], 0);
    let work = tempfile::tempdir().unwrap();
    let out = run(Command::new("fio").current_dir(work.path()).args([
        "--name=verify",
        "--ioengine=nbd",
        &format!("--uri={}", srv.uri("f")),
        "--rw=randwrite",
        "--bs=4k",
        "--bsrange=512-64k",
        "--size=16m",
        "--numjobs=4",
        "--offset_increment=16m",
        "--iodepth=16",
        "--verify=crc32c",
        "--verify_fatal=1",
        "--verify_state_save=0",
        "--do_verify=1",
        "--group_reporting",
    ]));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("err= 0"), "fio reported errors:\n{text}");
    assert!(!text.contains("verify: bad"), "{text}");
    srv.stop().unwrap();
}
