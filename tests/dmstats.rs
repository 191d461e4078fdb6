//! dmstats' region commands on a running server (`udm dmstats`, and
//! `udm dmsetup stats VERB`): create regions with areas, write through
//! NBD (nbdcopy), and read them back with `list` and `report` in dmstats'
//! columns; delete one and all.

mod common;

use std::process::{Command, Output};

use common::dm::DmServer;
use common::*;

fn dmstats(srv: &DmServer, args: &[&str]) -> Output {
    udm()
        .arg("dmstats")
        .arg("--control")
        .arg(&srv.ctl)
        .args(args)
        .output()
        .unwrap()
}

fn ok(srv: &DmServer, args: &[&str]) -> String {
    let o = dmstats(srv, args);
    assert!(o.status.success(), "dmstats {args:?}: {}", show(&o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn regions_are_created_counted_listed_reported_and_deleted() {
    let d = scratch("dmstats");
    let img = write_file(d.path(), "disk.img", &vec![0u8; 4 << 20]);
    let srv = DmServer::start(d.path(), &[]);
    let table = format!("0 8192 linear {} 0", img.display());
    srv.ok(&["create", "v", "--table", &table]);

    let out = ok(
        &srv,
        &[
            "create", "--start", "1m", "--length", "2m", "--areas", "2", "v",
        ],
    );
    assert_eq!(out, "v: Created new region with 2 area(s) as region ID 0\n");
    // Through dmsetup's stats verb, the whole device, one area.
    let out = srv.ok(&["stats", "create", "--programid", "mine", "v"]);
    assert_eq!(out, "v: Created new region with 1 area(s) as region ID 1\n");

    let list = ok(&srv, &["list", "v"]);
    let rows: Vec<Vec<&str>> = list
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(rows[0][..3], ["Name", "RgID", "RStart"], "{list}");
    assert_eq!(
        rows[1],
        ["v", "0", "1.00m", "2.00m", "2", "1.00m", "dmstats"],
        "{list}"
    );
    assert_eq!(
        rows[2],
        ["v", "1", "0", "4.00m", "1", "4.00m", "mine"],
        "{list}"
    );

    // Write the whole device: every area sees writes, and no reads.
    let src = write_file(d.path(), "src.img", &fast_bytes(3, 4 << 20));
    let o = Command::new(need("nbdcopy"))
        .args([src.to_str().unwrap(), &srv.uri("v")])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", show(&o));
    let report = ok(&srv, &["report", "v"]);
    let rows: Vec<Vec<&str>> = report
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        rows[0][..5],
        ["Name", "RgID", "ArID", "AStart", "ASize"],
        "{report}"
    );
    assert_eq!(rows.len(), 4, "three areas in all:\n{report}");
    for r in &rows[1..] {
        let w: f64 = r[8].parse().unwrap();
        let rd: f64 = r[7].parse().unwrap();
        assert!(w > 0.0 && rd == 0.0, "{report}");
    }
    assert_eq!((rows[2][3], rows[2][4]), ("2.00m", "1.00m"), "{report}");

    // Delete one, then a missing one (an error naming it), then all.
    ok(&srv, &["delete", "--regionid", "0", "v"]);
    let list = ok(&srv, &["list", "v"]);
    assert_eq!(list.lines().count(), 2, "{list}");
    let o = dmstats(&srv, &["delete", "--regionid", "7", "v"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("no region 7"),
        "{}",
        show(&o)
    );
    ok(&srv, &["delete", "--allregions", "v"]);
    assert_eq!(ok(&srv, &["list", "v"]).lines().count(), 1);
    // A region past the device's end is refused, naming the device.
    let o = dmstats(&srv, &["create", "--start", "3m", "--length", "2m", "v"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("v: the region"),
        "{}",
        show(&o)
    );
}
