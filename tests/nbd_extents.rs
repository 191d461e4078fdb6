//! Real BLOCK_STATUS (`base:allocation`), seen by libnbd's `nbdinfo --map`
//! and qemu's `qemu-img map`: holes of sparse files come through a
//! linear-over-striped stack at the right offsets, the zero target is all
//! hole and zero, and a crypt device reports the backing's holes as holes
//! that do *not* read as zeros (their ciphertext decrypts to noise).

mod common;

use std::process::Command;

use common::*;

const CHUNK: u64 = 64 << 10;
const LEG: u64 = 32 << 20;

/// `nbdinfo --map` as (offset, length, type) rows.
fn map(uri: &str) -> Vec<(u64, u64, u32)> {
    let out = run_text(Command::new(need("nbdinfo")).args(["--map", uri]));
    out.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            Some((
                f.first()?.parse().ok()?,
                f.get(1)?.parse().ok()?,
                f.get(2)?.parse().ok()?,
            ))
        })
        .collect()
}

#[test]
fn holes_show_through_linear_over_striped_crypt_and_zero() {
    let d = scratch("udm-extents-");
    let p = d.path();
    let leg0 = sparse(p, "leg0.img", LEG);
    let leg1 = sparse(p, "leg1.img", LEG);
    // Chunk 0 of the striped device is chunk 0 of leg 0; chunk 3 is chunk 1
    // of leg 1.
    pwrite(&leg0, 0, &bytes(1, CHUNK as usize));
    pwrite(&leg1, CHUNK, &bytes(2, CHUNK as usize));
    let sectors = 2 * LEG / 512;
    std::fs::write(
        p.join("striped.table"),
        format!(
            "0 {sectors} striped 2 {} {} 0 {} 0\n",
            CHUNK / 512,
            leg0.display(),
            leg1.display()
        ),
    )
    .unwrap();
    std::fs::write(
        p.join("lin.table"),
        format!("0 {sectors} linear @striped 0\n"),
    )
    .unwrap();
    let key: String = (0..64).map(|i| format!("{:02x}", i * 3 + 1)).collect();
    std::fs::write(
        p.join("crypt.table"),
        format!("0 {sectors} crypt aes-xts-plain64 {key} 0 @striped 0\n"),
    )
    .unwrap();
    std::fs::write(p.join("zero.table"), "0 2048 zero\n").unwrap();
    let t = |n: &str| format!("{n}={}", p.join(format!("{n}.table")).display());
    let srv = UdmServe::start(
        &p.join("s.sock"),
        &[
            "--table".to_string(),
            t("lin"),
            "--table".to_string(),
            t("striped"),
            "--table".to_string(),
            t("crypt"),
            "--table".to_string(),
            t("zero"),
        ],
    );
    let size = 2 * LEG;
    // Hole and zero (type 3), data (type 0).
    let want = vec![
        (0, CHUNK, 0),
        (CHUNK, 2 * CHUNK, 3),
        (3 * CHUNK, CHUNK, 0),
        (4 * CHUNK, size - 4 * CHUNK, 3),
    ];
    let got = map(&srv.uri("lin"));
    println!("linear over striped: {got:?}");
    assert_eq!(got, want, "nbdinfo --map of linear over striped");
    // Crypt: the same places, but holes are type 1 (hole, not zero).
    let got = map(&srv.uri("crypt"));
    let crypt_want: Vec<_> = want
        .iter()
        .map(|&(o, l, t)| (o, l, if t == 3 { 1 } else { t }))
        .collect();
    assert_eq!(got, crypt_want, "nbdinfo --map of crypt");
    // Zero target: everything hole and zero.
    assert_eq!(map(&srv.uri("zero")), vec![(0, 1 << 20, 3)]);
    // qemu's client agrees (qemu-img map reports data and zero ranges).
    let qmap = run_text(Command::new(need("qemu-img")).args([
        "map",
        "--output=json",
        "-f",
        "raw",
        &srv.uri("lin"),
    ]));
    let v: serde_json::Value = serde_json::from_str(&qmap).unwrap();
    let data: Vec<(u64, u64)> = v
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["data"] == true)
        .map(|e| (e["start"].as_u64().unwrap(), e["length"].as_u64().unwrap()))
        .collect();
    assert_eq!(
        data,
        vec![(0, CHUNK), (3 * CHUNK, CHUNK)],
        "qemu-img map: {qmap}"
    );
    drop(srv);
}
