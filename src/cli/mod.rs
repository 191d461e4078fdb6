//! Command-line front end (clap): `serve`, `table`, `luks`, `benchmark`.

/// Entry point of the binary; returns the process exit code.
pub fn main() -> i32 {
    0
}
