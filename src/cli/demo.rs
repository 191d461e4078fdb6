//! `udm demo`: the main job on a built-in default. It creates two small leg
//! files, stacks a striped device over them and an encrypted device over
//! that, serves all of it on a Unix socket and prints how to reach it with
//! the usual NBD clients — a working stack in one command.

use std::path::{Path, PathBuf};

use zeroize::Zeroizing;

use crate::cli::serve::{serve_specs, Settings};
use crate::mapper::DeviceSpec;
use crate::nbd::Listen;

/// Arguments of `udm demo`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Directory for the demo's leg files, tables and socket.
    #[arg(long, default_value = "/tmp/udm-demo")]
    pub dir: PathBuf,
    /// Size of each of the two leg files, in MiB.
    #[arg(long, default_value_t = 128)]
    pub leg_mib: u64,
}

pub fn run(a: Args) -> i32 {
    crate::cli::init_logging();
    match demo(&a) {
        Ok(()) => 0,
        Err(e) => {
            crate::cli::report_error("demo", &e);
            1
        }
    }
}

fn write(path: &Path, text: &str) -> Result<(), String> {
    std::fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))
}

fn demo(a: &Args) -> Result<(), String> {
    let dir = &a.dir;
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let leg_bytes = a.leg_mib.max(1) << 20;
    let mut legs = Vec::new();
    for i in 0..2 {
        let p = dir.join(format!("leg{i}.img"));
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&p)
            .map_err(|e| format!("cannot create {}: {e}", p.display()))?;
        f.set_len(leg_bytes)
            .map_err(|e| format!("cannot size {}: {e}", p.display()))?;
        legs.push(p);
    }
    let sectors = 2 * leg_bytes / 512;
    let striped = format!(
        "# two legs, 64 KiB chunks, as dm-stripe lays them out\n0 {sectors} striped 2 128 {} 0 {} 0\n",
        legs[0].display(),
        legs[1].display()
    );
    let mut key = Zeroizing::new([0u8; 64]);
    getrandom::fill(&mut key[..]).map_err(|e| format!("no random source: {e}"))?;
    let secure = Zeroizing::new(format!(
        "# AES-256-XTS over the striped device, 4 KiB sectors, a fresh random key\n0 {sectors} crypt aes-xts-plain64 {} 0 @striped 0 1 sector_size:4096\n",
        hex::encode(&key[..])
    ));
    write(&dir.join("striped.table"), &striped)?;
    let sock = dir.join("nbd.sock");
    let _ = std::fs::remove_file(&sock);
    let s = sock.display();
    println!("udm demo: serving on {s}");
    println!(
        "  exports: 'secure' (crypt over striped, the default), 'striped' (2 legs in {})",
        dir.display()
    );
    println!("  nbdinfo 'nbd+unix:///secure?socket={s}'");
    println!("  nbdinfo --list 'nbd+unix://?socket={s}'");
    println!("  nbdcopy -- [ nbdkit random size=64M ] 'nbd+unix:///secure?socket={s}'");
    println!("  qemu-img info 'nbd+unix:///secure?socket={s}'");
    println!(
        "  mkdir -p /tmp/udm-mnt && nbdfuse /tmp/udm-mnt/disk 'nbd+unix:///secure?socket={s}' &"
    );
    println!("    then: mkfs.ext4 -F /tmp/udm-mnt/disk && mount -o loop /tmp/udm-mnt/disk /mnt");
    println!("  stop with Ctrl-C (in-flight requests finish, data is flushed)");
    serve_specs(
        vec![
            (
                "secure".into(),
                DeviceSpec::Table {
                    text: secure,
                    source: "demo crypt table".into(),
                },
            ),
            (
                "striped".into(),
                DeviceSpec::Table {
                    text: Zeroizing::new(striped),
                    source: dir.join("striped.table").display().to_string(),
                },
            ),
        ],
        Listen::Unix(sock),
        &Settings::default(),
    )
}
