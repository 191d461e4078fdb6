//! `udm benchmark` (filled by the crypto work).

/// Arguments of `udm benchmark`.
#[derive(clap::Args, Debug)]
pub struct Args {}

pub fn run(_a: Args) -> i32 {
    eprintln!("udm benchmark: not implemented yet");
    1
}
