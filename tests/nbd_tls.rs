//! TLS (NBD_OPT_STARTTLS with rustls) against real TLS clients: libnbd's
//! `nbdinfo` with an `nbds://` URI and `qemu-img info` with a
//! `tls-creds-x509` object reach a TLS export; a plain client is refused
//! when TLS is required; with `--tls-verify-peer` only a client holding a
//! certificate signed by the CA gets in. Certificates are made here with
//! openssl, in the directory layout nbdkit and qemu use.

mod common;

use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

fn openssl(dir: &Path, args: &[&str]) {
    run(Command::new(need("openssl")).current_dir(dir).args(args));
}

/// CA, server (localhost, 127.0.0.1) and client certificates: `server/`
/// holds what the server needs, `client/` what a client with a
/// certificate needs, `anon/` only the CA.
fn make_certs(dir: &Path) {
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    let mut a = vec!["req", "-x509", "-days", "2", "-subj", "/CN=udm test CA"];
    a.extend(ec);
    a.extend(["-keyout", "ca-key.pem", "-out", "ca-cert.pem"]);
    a.extend([
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
    ]);
    openssl(dir, &a);
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\nkeyUsage=critical,digitalSignature\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("client.ext"),
        "extendedKeyUsage=clientAuth\nkeyUsage=critical,digitalSignature\n",
    )
    .unwrap();
    for (who, cn) in [("server", "localhost"), ("client", "udm test client")] {
        let subj = format!("/CN={cn}");
        let mut a = vec!["req", "-subj", subj.as_str()];
        a.extend(ec);
        let key = format!("{who}-key.pem");
        let csr = format!("{who}.csr");
        a.extend(["-keyout", key.as_str(), "-out", csr.as_str()]);
        openssl(dir, &a);
        let cert = format!("{who}-cert.pem");
        let ext = format!("{who}.ext");
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca-cert.pem",
                "-CAkey",
                "ca-key.pem",
                "-CAcreateserial",
                "-days",
                "2",
                "-out",
                &cert,
                "-extfile",
                &ext,
            ],
        );
    }
    for sub in ["server", "client", "anon"] {
        std::fs::create_dir_all(dir.join(sub)).unwrap();
        std::fs::copy(dir.join("ca-cert.pem"), dir.join(sub).join("ca-cert.pem")).unwrap();
    }
    for f in ["server-cert.pem", "server-key.pem"] {
        std::fs::copy(dir.join(f), dir.join("server").join(f)).unwrap();
    }
    for f in ["client-cert.pem", "client-key.pem"] {
        std::fs::copy(dir.join(f), dir.join("client").join(f)).unwrap();
    }
}

struct Tcp {
    child: Child,
    port: u16,
}

impl Drop for Tcp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn serve_tcp(disk: &Path, extra: &[&str]) -> Tcp {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = udm()
        .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .arg("--file")
        .arg(format!("disk={}", disk.display()))
        .args(extra)
        .env("UDM_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let t = Instant::now();
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "udm serve did not listen"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    Tcp { child, port }
}

fn nbdinfo(uri: &str) -> std::process::Output {
    Command::new(need("nbdinfo"))
        .args(["--size", uri])
        .output()
        .unwrap()
}

#[test]
fn tls_clients_reach_a_tls_export_and_plain_ones_are_refused() {
    let d = scratch("udm-tls-");
    let p = d.path();
    make_certs(p);
    let disk = sparse(p, "disk.img", 4 << 20);
    let certs = p.join("server");
    let srv = serve_tcp(
        &disk,
        &[
            "--tls=require",
            "--tls-certificates",
            certs.to_str().unwrap(),
        ],
    );
    let anon = p.join("anon");
    let uri = format!(
        "nbds://localhost:{}/disk?tls-certificates={}",
        srv.port,
        anon.display()
    );
    let o = nbdinfo(&uri);
    assert!(o.status.success(), "nbdinfo over TLS failed:\n{}", show(&o));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        (4u64 << 20).to_string()
    );
    // Data goes both ways encrypted: a round trip through nbdcopy.
    let data = bytes(5, 1 << 20);
    let src = write_file(p, "src.bin", &data);
    run(Command::new(need("nbdcopy")).args([src.to_str().unwrap(), &uri]));
    let back = p.join("back.bin");
    run(Command::new("nbdcopy").args([&uri, back.to_str().unwrap()]));
    assert!(std::fs::read(&back).unwrap()[..1 << 20] == data[..]);
    // qemu's client with a tls-creds-x509 object.
    let q = run_text(Command::new(need("qemu-img")).args([
        "info",
        "--object",
        &format!(
            "tls-creds-x509,id=tls0,endpoint=client,dir={}",
            anon.display()
        ),
        "--image-opts",
        &format!(
            "driver=nbd,host=localhost,port={},export=disk,tls-creds=tls0",
            srv.port
        ),
    ]));
    assert!(q.contains("4 MiB"), "qemu-img info: {q}");
    // A plain client is refused (TLS required).
    let o = nbdinfo(&format!("nbd://localhost:{}/disk", srv.port));
    assert!(!o.status.success(), "a plain client got in:\n{}", show(&o));
    let err = String::from_utf8_lossy(&o.stderr).to_lowercase();
    assert!(err.contains("tls"), "refusal does not mention TLS: {err}");
    drop(srv);

    // --tls=on: both kinds of client are served.
    let srv = serve_tcp(
        &disk,
        &["--tls=on", "--tls-certificates", certs.to_str().unwrap()],
    );
    for uri in [
        format!("nbd://localhost:{}/disk", srv.port),
        format!(
            "nbds://localhost:{}/disk?tls-certificates={}",
            srv.port,
            anon.display()
        ),
    ] {
        let o = nbdinfo(&uri);
        assert!(o.status.success(), "{uri}:\n{}", show(&o));
    }
    drop(srv);

    // --tls-verify-peer: a certificate signed by the CA is the key.
    let srv = serve_tcp(
        &disk,
        &[
            "--tls=require",
            "--tls-certificates",
            certs.to_str().unwrap(),
            "--tls-verify-peer",
        ],
    );
    let with = format!(
        "nbds://localhost:{}/disk?tls-certificates={}",
        srv.port,
        p.join("client").display()
    );
    let o = nbdinfo(&with);
    assert!(
        o.status.success(),
        "client certificate refused:\n{}",
        show(&o)
    );
    let o = nbdinfo(&format!(
        "nbds://localhost:{}/disk?tls-certificates={}",
        srv.port,
        anon.display()
    ));
    assert!(!o.status.success(), "a client without a certificate got in");
    drop(srv);
}

/// `ro:` makes one export read-only; `--allow` hides an export from
/// clients not on its list.
#[test]
fn per_export_read_only_and_allow_lists() {
    let d = scratch("udm-acl-");
    let p = d.path();
    let a = sparse(p, "a.img", 1 << 20);
    let b = sparse(p, "b.img", 1 << 20);
    let srv = UdmServe::start(
        &p.join("s.sock"),
        &[
            "--file".to_string(),
            format!("ro:a={}", a.display()),
            "--file".to_string(),
            format!("b={}", b.display()),
            "--allow".to_string(),
            "b=10.0.0.0/8".to_string(),
        ],
    );
    let info = run_text(Command::new(need("nbdinfo")).arg(srv.uri("a")));
    assert!(info.contains("is_read_only: true"), "{info}");
    let list = run_text(Command::new("nbdinfo").args(["--list", &srv.uri("")]));
    assert!(
        list.contains("export=\"a\"") || list.contains("export: a") || list.contains("\na"),
        "{list}"
    );
    assert!(
        !list.contains("b.img") && !list.contains("udm file b"),
        "b listed to a client not allowed: {list}"
    );
    let o = Command::new("nbdinfo").arg(srv.uri("b")).output().unwrap();
    assert!(
        !o.status.success(),
        "a client outside b's allow-list reached it"
    );
    drop(srv);
}
