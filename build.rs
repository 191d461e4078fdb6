// Link librbd and librados for the `rbd` feature. Debian's librbd-dev and
// librados-dev ship no pkg-config files, so the libraries are named here.
fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if std::env::var_os("CARGO_FEATURE_RBD").is_some() {
        println!("cargo:rustc-link-lib=rbd");
        println!("cargo:rustc-link-lib=rados");
    }
}
