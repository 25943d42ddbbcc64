//! Links the cdylib as `libnccl.so.2`, so programs linked with `-lnccl` record the name that
//! NVIDIA's library has and load either one.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnccl.so.2");
    println!("cargo:rerun-if-changed=build.rs");
}
