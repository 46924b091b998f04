//! Generates the GL encoder entry points (`gl_guest.rs`) from the registry and our
//! annotations.
fn main() {
    if let Err(e) = virtsoc_gles_gen::build(virtsoc_gles_gen::Output::Guest) {
        println!("cargo:warning=virtsoc-gles-gen: {e}");
        std::process::exit(1);
    }
}
