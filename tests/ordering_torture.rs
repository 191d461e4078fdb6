//! Seed 002's promise under load: 4 clients pipelining overlapping writes,
//! unaligned writes, reads and flushes against a stacked device, 100 runs in
//! a row, every read checked against a sequential model
//! (tests/torture/ordering.py, driven through python3-libnbd).

mod common;

use common::*;

#[test]
fn ordering_torture_100_runs() {
    need_python_module("nbd", "python3-libnbd");
    let d = scratch("udm-torture-");
    let p = d.path();
    for i in 0..2 {
        sparse(p, &format!("leg{i}.img"), 32 << 20);
    }
    let sectors = (64u64 << 20) / 512;
    std::fs::write(
        p.join("striped.table"),
        format!(
            "0 {sectors} striped 2 16 {} 0 {} 0\n",
            p.join("leg0.img").display(),
            p.join("leg1.img").display()
        ),
    )
    .unwrap();
    let key: String = (0..64)
        .map(|i| format!("{:02x}", (i * 7 + 3) & 0xff))
        .collect();
    std::fs::write(
        p.join("crypt.table"),
        format!("0 {sectors} crypt aes-xts-plain64 {key} 0 @striped 0 1 sector_size:4096\n"),
    )
    .unwrap();
    let sock = p.join("s.sock");
    let server = UdmServe::start(
        &sock,
        &[
            "--threads".to_string(),
            "4".to_string(),
            "--table".to_string(),
            format!("secure={}", p.join("crypt.table").display()),
            "--table".to_string(),
            format!("striped={}", p.join("striped.table").display()),
        ],
    );
    let out = python(
        "torture/ordering.py",
        &[server.uri("secure").as_str(), "100", "4", "200", "1"],
    );
    drop(server);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("100 passed, 0 failed"),
        "torture failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
