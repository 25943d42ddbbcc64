//! Builds the C shim that gives plugins NCCL's variadic logger (src/nccl/logger.c).

fn main() {
    println!("cargo:rerun-if-changed=src/nccl/logger.c");
    cc::Build::new().file("src/nccl/logger.c").warnings(true).extra_warnings(true).compile("occl_nccl_logger");
}
