//! What a remote export is called: the server's address and the export's
//! name, as `store::location` parses them from `nbd://` URIs.

use std::path::PathBuf;

/// Where the server is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NbdAddr {
    Tcp(String, u16),
    Unix(PathBuf),
}

/// A remote export: server address and export name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NbdSpec {
    pub addr: NbdAddr,
    pub export: String,
}

impl std::fmt::Display for NbdSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.addr {
            NbdAddr::Tcp(h, p) if h.contains(':') => {
                write!(f, "nbd://[{h}]:{p}/{}", self.export)
            }
            NbdAddr::Tcp(h, p) => write!(f, "nbd://{h}:{p}/{}", self.export),
            NbdAddr::Unix(s) => write!(f, "nbd+unix:///{}?socket={}", self.export, s.display()),
        }
    }
}
