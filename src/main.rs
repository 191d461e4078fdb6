//! The `udm` command line.

fn main() {
    std::process::exit(udm::cli_main());
}
