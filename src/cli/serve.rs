//! `udm serve` (filled by the core work).

/// Arguments of `udm serve`.
#[derive(clap::Args, Debug)]
pub struct Args {}

pub fn run(_a: Args) -> i32 {
    1
}
