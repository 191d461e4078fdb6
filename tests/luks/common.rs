//! Helpers shared by the LUKS integration tests: running cryptsetup and udm,
//! reading cryptsetup's view of a volume key, and an independent dm-crypt
//! transform (tests/crypt/dmcrypt_ref.py, Python `cryptography`) so data
//! checks never rely on udm's own cipher code alone.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Fail loudly when a peer tool is missing (never skip).
pub fn need(tool: &str) {
    let ok = Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    assert!(ok, "required tool `{tool}` is not installed (apt-get install cryptsetup-bin qemu-utils nbdkit libnbd-bin python3-cryptography)");
}

pub fn show(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Run and require success.
pub fn ok(cmd: &mut Command) -> Output {
    let o = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(o.status.success(), "{cmd:?} failed:\n{}", show(&o));
    o
}

pub fn cryptsetup() -> Command {
    need("cryptsetup");
    let mut c = Command::new("cryptsetup");
    // Image files need no locking directory of their own; keep runs independent.
    c.env("LC_ALL", "C");
    c
}

pub fn udm() -> Command {
    Command::new(env!("CARGO_BIN_EXE_udm"))
}

/// Deterministic bytes (xorshift).
pub fn bytes(seed: u64, n: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

pub fn write_file(dir: &Path, name: &str, data: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, data).unwrap();
    p
}

pub fn sparse(dir: &Path, name: &str, size: u64) -> PathBuf {
    let p = dir.join(name);
    let f = std::fs::File::create(&p).unwrap();
    f.set_len(size).unwrap();
    p
}

/// The volume key as cryptsetup reports it (`luksDump --dump-volume-key`).
pub fn cs_volume_key(img: &Path, header: Option<&Path>, key_file: &Path) -> Vec<u8> {
    let mut c = cryptsetup();
    c.args(["luksDump", "--dump-volume-key", "-q", "--key-file"])
        .arg(key_file);
    if let Some(h) = header {
        c.arg("--header").arg(h);
    }
    c.arg(img);
    let o = ok(&mut c);
    parse_mk_dump(&String::from_utf8_lossy(&o.stdout))
}

/// Hex bytes after "MK dump:" up to the end of the output.
pub fn parse_mk_dump(text: &str) -> Vec<u8> {
    let start = text.find("MK dump:").expect("no MK dump in output");
    let hexs: String = text[start + 8..]
        .split_whitespace()
        .filter(|w| w.len() == 2)
        .collect();
    hex::decode(hexs).expect("bad hex in MK dump")
}

/// True if cryptsetup accepts `key_file` for `img`.
pub fn cs_test(img: &Path, header: Option<&Path>, key_file: &Path) -> bool {
    let mut c = cryptsetup();
    c.args(["open", "--test-passphrase", "--key-file"])
        .arg(key_file);
    if let Some(h) = header {
        c.arg("--header").arg(h);
    }
    c.arg(img);
    c.output().unwrap().status.success()
}

/// dm-crypt transform by the independent Python implementation.
pub fn py_crypt(
    dir: &Path,
    op: &str,
    spec: &str,
    key: &[u8],
    ss: u32,
    sector: u64,
    data: &[u8],
) -> Vec<u8> {
    need("/usr/bin/python3");
    let inp = write_file(dir, "py_in.bin", data);
    let out = dir.join("py_out.bin");
    let jobs = serde_json::json!([{
        "op": op, "spec": spec, "key": hex::encode(key), "ss": ss, "large": false,
        "sector": sector, "in": inp, "out": out,
    }]);
    let jf = write_file(dir, "py_jobs.json", &serde_json::to_vec(&jobs).unwrap());
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/crypt/dmcrypt_ref.py");
    let o = Command::new("/usr/bin/python3")
        .arg(script)
        .arg(jf)
        .output()
        .expect("cannot run /usr/bin/python3");
    assert!(
        o.status.success(),
        "dmcrypt_ref.py failed (apt-get install python3-cryptography):\n{}",
        show(&o)
    );
    std::fs::read(out).unwrap()
}

pub fn pwrite(path: &Path, off: u64, data: &[u8]) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(data, off).unwrap();
}

pub fn pread(path: &Path, off: u64, len: usize) -> Vec<u8> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open(path).unwrap();
    let mut b = vec![0u8; len];
    f.read_exact_at(&mut b, off).unwrap();
    b
}

/// One combination of volume options.
#[derive(Clone, Debug)]
pub struct Case {
    pub luks: u8,
    pub pbkdf: &'static str,
    pub sector: u32,
    pub key_bits: u32,
    pub hash: &'static str,
}

impl Case {
    /// Options for cryptsetup luksFormat and udm luks format (same names).
    pub fn format_args(&self) -> Vec<String> {
        let mut a = vec![
            format!("--type=luks{}", self.luks),
            "--cipher=aes-xts-plain64".into(),
            format!("--key-size={}", self.key_bits),
            format!("--pbkdf={}", self.pbkdf),
            format!("--hash={}", self.hash),
        ];
        if self.luks == 2 {
            a.push(format!("--sector-size={}", self.sector));
        }
        if self.pbkdf == "pbkdf2" {
            a.push("--pbkdf-force-iterations=1000".into());
        } else {
            a.push("--pbkdf-force-iterations=4".into());
            a.push("--pbkdf-memory=64".into());
            a.push("--pbkdf-parallel=1".into());
        }
        a
    }

    pub fn data_offset(&self) -> u64 {
        if self.luks == 1 {
            4096 * 512
        } else {
            16 << 20
        }
    }
}

/// The spread the issue asks for: LUKS1/LUKS2, pbkdf2/argon2, 512/4096 sectors, 256/512-bit XTS.
pub fn cases() -> Vec<Case> {
    vec![
        Case {
            luks: 1,
            pbkdf: "pbkdf2",
            sector: 512,
            key_bits: 256,
            hash: "sha256",
        },
        Case {
            luks: 1,
            pbkdf: "pbkdf2",
            sector: 512,
            key_bits: 512,
            hash: "sha1",
        },
        Case {
            luks: 2,
            pbkdf: "pbkdf2",
            sector: 512,
            key_bits: 256,
            hash: "sha512",
        },
        Case {
            luks: 2,
            pbkdf: "pbkdf2",
            sector: 4096,
            key_bits: 512,
            hash: "sha256",
        },
        Case {
            luks: 2,
            pbkdf: "argon2id",
            sector: 4096,
            key_bits: 256,
            hash: "sha256",
        },
        Case {
            luks: 2,
            pbkdf: "argon2id",
            sector: 512,
            key_bits: 512,
            hash: "sha256",
        },
        Case {
            luks: 2,
            pbkdf: "argon2i",
            sector: 4096,
            key_bits: 512,
            hash: "sha1",
        },
    ]
}
