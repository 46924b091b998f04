//! Generates the GL decoder (`gl_host.rs`) from the registry and our annotations.
fn main() {
    if let Err(e) = virtsoc_gles_gen::build(virtsoc_gles_gen::Output::Host) {
        println!("cargo:warning=virtsoc-gles-gen: {e}");
        std::process::exit(1);
    }
}
