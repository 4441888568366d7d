//! Compiles `nextmini/v1/*.proto` with protox (pure Rust), so building needs no system `protoc`.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = ["nextmini/v1/control.proto"];
    for f in files {
        println!("cargo:rerun-if-changed={f}");
    }
    let descriptors = protox::compile(files, ["."])?;
    tonic_prost_build::configure().compile_fds(descriptors)?;
    Ok(())
}
