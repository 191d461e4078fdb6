//! LUKS helpers: cryptsetup as the peer (formatting, its view of the
//! volume key and metadata, whether it accepts a passphrase) and the spread
//! of volume options the LUKS tests cover.

use std::ffi::OsStr;
use std::path::Path;
use std::process::Command;

use super::{dmcrypt_ref, need, ref_job, run, run_text, udm, write_file, Geo};

/// A cheap PBKDF for volumes whose KDF is not what a test is about.
pub const FAST_PBKDF: [&str; 2] = ["--pbkdf=pbkdf2", "--pbkdf-force-iterations=1000"];

pub fn cryptsetup() -> Command {
    need("cryptsetup");
    let mut c = Command::new("cryptsetup");
    // Image files need no locking directory of their own; keep runs independent.
    c.env("LC_ALL", "C");
    c
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
    let o = run(&mut c);
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
    cs_test_code(img, header, key_file) == Some(0)
}

/// cryptsetup's exit code for `open --test-passphrase` with `key_file`:
/// 0 accepted, 2 wrong passphrase, 1 no usable keyslot. Negative checks
/// assert the specific code, so a cryptsetup failing for another reason
/// (missing file, bad option) does not pass as "refused the passphrase".
pub fn cs_test_code(img: &Path, header: Option<&Path>, key_file: &Path) -> Option<i32> {
    let mut c = cryptsetup();
    c.args(["open", "--test-passphrase", "--key-file"])
        .arg(key_file);
    if let Some(h) = header {
        c.arg("--header").arg(h);
    }
    c.arg(img);
    c.output().unwrap().status.code()
}

/// dm-crypt transform of `data` by the independent Python implementation.
pub fn py_crypt(
    dir: &Path,
    op: &str,
    spec: &str,
    key: &[u8],
    ss: u32,
    sector: u64,
    data: &[u8],
) -> Vec<u8> {
    let inp = write_file(dir, "py_in.bin", data);
    let out = dir.join("py_out.bin");
    let geo = Geo {
        spec,
        key,
        ss,
        large: false,
        iv_offset: sector,
    };
    dmcrypt_ref(
        &serde_json::json!([ref_job(op, &geo, &inp, &out)]),
        &dir.join("py_jobs.json"),
    );
    std::fs::read(out).unwrap()
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

/// `cryptsetup luksFormat -q OPTS --key-file KEY_FILE IMG`.
pub fn cs_format<S: AsRef<OsStr>>(img: &Path, opts: &[S], key_file: &Path) {
    run(cryptsetup()
        .arg("luksFormat")
        .arg("-q")
        .args(opts)
        .arg("--key-file")
        .arg(key_file)
        .arg(img));
}

/// `cryptsetup luksDump IMG` as text.
pub fn cs_dump(img: &Path) -> String {
    run_text(cryptsetup().arg("luksDump").arg(img))
}

/// The LUKS2 JSON metadata as cryptsetup reads it.
pub fn cs_json(img: &Path) -> serde_json::Value {
    serde_json::from_slice(
        &run(cryptsetup()
            .args(["luksDump", "--dump-json-metadata"])
            .arg(img))
        .stdout,
    )
    .unwrap()
}

/// `udm luks format -q OPTS --key-file KEY_FILE IMG`.
pub fn udm_format<S: AsRef<OsStr>>(img: &Path, opts: &[S], key_file: &Path) {
    run(udm()
        .args(["luks", "format", "-q"])
        .args(opts)
        .arg("--key-file")
        .arg(key_file)
        .arg(img));
}

/// `udm luks add-key OPTS --key-file KEY_FILE IMG NEW_KEY_FILE`.
pub fn udm_add_key<S: AsRef<OsStr>>(img: &Path, key_file: &Path, new_key_file: &Path, opts: &[S]) {
    run(udm()
        .args(["luks", "add-key"])
        .args(opts)
        .arg("--key-file")
        .arg(key_file)
        .arg(img)
        .arg(new_key_file));
}

/// Rewrite the JSON of both LUKS2 copies (with valid checksums), as an attacker could.
pub fn rewrite_json(img: &Path, edit: &dyn Fn(&mut serde_json::Value)) {
    let hdr = 16384u64;
    let area = super::pread(img, 4096, (hdr - 4096) as usize);
    let end = area.iter().position(|&b| b == 0).unwrap();
    let mut v: serde_json::Value = serde_json::from_slice(&area[..end]).unwrap();
    edit(&mut v);
    let text = serde_json::to_vec(&v).unwrap();
    let mut area = vec![0u8; (hdr - 4096) as usize];
    area[..text.len()].copy_from_slice(&text);
    for off in [0, hdr] {
        let mut bin = super::pread(img, off, 4096);
        bin[0x1C0..0x200].fill(0);
        let mut h = <sha2::Sha256 as sha2::Digest>::new();
        sha2::Digest::update(&mut h, &bin);
        sha2::Digest::update(&mut h, &area);
        let sum = sha2::Digest::finalize(h);
        bin[0x1C0..0x1C0 + 32].copy_from_slice(&sum);
        super::pwrite(img, off, &bin);
        super::pwrite(img, off + 4096, &area);
    }
}
