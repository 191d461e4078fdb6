//! Key hygiene: with tracing at TRACE level, building a crypt target, doing
//! I/O through it, printing its table and failing to build one with a bad
//! key never puts key bytes (hex in either case, or raw) into the log.

use std::io::Write;
use std::sync::{Arc, Mutex};

use udm::core::{BlockDevice, WriteBuf};
use udm::store::MemStore;
use udm::targets::{crypt, DeviceResolver, TargetArgs, TargetOptions};

#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<u8>>>);

impl Write for Capture {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

struct Mem(Arc<dyn BlockDevice>);
impl DeviceResolver for Mem {
    fn resolve(&mut self, _spec: &str) -> Result<Arc<dyn BlockDevice>, String> {
        Ok(self.0.clone())
    }
}

#[test]
fn trace_level_logs_never_contain_the_key() {
    let key: Vec<u8> = (0..64u8)
        .map(|i| i.wrapping_mul(29).wrapping_add(0xa5))
        .collect();
    let hex_key = hex::encode(&key);
    let cap = Capture::default();
    let writer = cap.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    tracing::subscriber::with_default(subscriber, || {
        let store: Arc<dyn BlockDevice> = Arc::new(MemStore::new(4 << 20));
        for (line, ok) in [
            (
                format!("aes-xts-plain64 {hex_key} 0 mem 0 1 sector_size:4096"),
                true,
            ),
            (
                format!("aes-cbc-essiv:sha256 {} 0 mem 0", &hex_key[..64]),
                true,
            ),
            (
                format!("aes-xts-plain64 {}zz 0 mem 0", &hex_key[..60]),
                false,
            ),
            (format!("aes-xts-plain64 {} 0 mem 0", &hex_key[..40]), false),
        ] {
            let args: Vec<String> = line.split_whitespace().map(String::from).collect();
            let r = crypt::new(TargetArgs {
                args: &args,
                len: 2 << 20,
                resolver: &mut Mem(store.clone()),
                options: &TargetOptions {
                    crypt_threads: 2,
                    ..Default::default()
                },
            });
            match r {
                Ok(t) => {
                    assert!(ok, "accepted: bad table");
                    let data = vec![7u8; 1 << 20];
                    t.write(0, WriteBuf::Borrowed(&data), true).unwrap();
                    let mut back = vec![0u8; 1 << 20];
                    t.read(0, &mut back).unwrap();
                    assert_eq!(back, data);
                    tracing::info!(table = %t.table_params(false), "table");
                }
                Err(e) => {
                    assert!(!ok, "rejected: {e:?}");
                    tracing::error!(error = ?e, "constructor failed");
                }
            }
        }
    });
    let log = String::from_utf8_lossy(&cap.0.lock().unwrap()).into_owned();
    // The log really is at trace level and saw the I/O.
    assert!(
        log.contains("crypt write"),
        "no trace output captured:\n{log}"
    );
    assert!(log.contains("crypt target created"));
    let lower = log.to_lowercase();
    for window in hex_key.as_bytes().chunks(16) {
        let w = std::str::from_utf8(window).unwrap();
        assert!(!lower.contains(w), "key hex '{w}' in log:\n{log}");
    }
    let raw = cap.0.lock().unwrap().clone();
    assert!(
        !raw.windows(8).any(|w| key.windows(8).any(|k| k == w)),
        "raw key bytes in log"
    );
}
