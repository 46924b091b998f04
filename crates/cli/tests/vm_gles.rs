//! The VM draw test (docs/gles.md, "VM guests"): unmodified Debian `glmark2-es2` inside a
//! QEMU guest (TCG) renders through virtsoc. `virtsoc gles validate --vm` builds the GLES
//! guest image (`scripts/build-guest-image.sh --gles`: glmark2-es2, glvnd, libEGL_virtsoc.so,
//! an Xvfb of the guest's own), boots it against a daemon of its own, and runs
//! `glmark2-es2 --off-screen --validate` on a few scenes natively, as a process guest and in
//! the VM, whose vendor library finds the daemon's virtio-serial port by itself. It fails
//! when a scene validates natively but not in the VM, when glmark2's GL strings in the VM
//! do not name virtsoc, or when the daemon's `gles` device got no batch from the VM.
//!
//! The vendor library is built by `cargo build -p virtsoc-gles` (`make test` builds the
//! workspace first): without it the test fails and says so. Without QEMU or the programs
//! (scripts/install-deps.sh) it is skipped loudly, unless `VIRTSOC_REQUIRE_ALL` is set
//! (`make test` sets it), which makes them failures.

mod common;

use std::path::PathBuf;

use common::qemu_present;

/// Whether the programs the image is built from are installed (skipped loudly without
/// them, unless `VIRTSOC_REQUIRE_ALL` is set).
fn programs_present() -> bool {
    let needed = [
        ("/usr/bin/glmark2-es2", "glmark2-es2-x11"),
        ("/usr/bin/es2_info.x86_64-linux-gnu", "mesa-utils-bin"),
        ("/usr/bin/Xvfb", "xvfb"),
        ("/usr/bin/xkbcomp", "x11-xkb-utils"),
        ("/usr/lib/x86_64-linux-gnu/libEGL.so.1", "libegl1"),
    ];
    let missing: Vec<String> = needed
        .iter()
        .filter(|(p, _)| !std::path::Path::new(p).exists())
        .map(|(p, pkg)| format!("{p} ({pkg})"))
        .collect();
    if missing.is_empty() {
        return true;
    }
    assert!(
        std::env::var_os("VIRTSOC_REQUIRE_ALL").is_none(),
        "not installed: {} and VIRTSOC_REQUIRE_ALL is set",
        missing.join(", ")
    );
    eprintln!(
        "SKIPPED: not installed: {} (scripts/install-deps.sh installs them)",
        missing.join(", ")
    );
    false
}

#[test]
fn unmodified_glmark2_validates_inside_a_vm_guest() {
    if !qemu_present() || !programs_present() {
        return;
    }
    // An image directory of this test binary's own (its kernel is cached there).
    let image = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/vm-gles-image-test");
    let out = common::virtsoc_cmd()
        .args(["gles", "validate", "--vm", "--vm-image"])
        .arg(&image)
        .args(["--scenes", "build:use-vbo=true,texture", "--timeout", "120"])
        .output()
        .expect("run virtsoc gles validate --vm");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "virtsoc gles validate --vm failed:\n{stdout}\n{stderr}\n(the vendor library is \
         built by `cargo build -p virtsoc-gles`)"
    );
    // The VM's run went through virtsoc and drew every scene glmark2 checked.
    let vm = stdout
        .lines()
        .find(|l| l.starts_with("vm "))
        .unwrap_or_else(|| panic!("no vm line:\n{stdout}"));
    assert!(vm.contains("GL_RENDERER virtsoc ("), "{vm}");
    for scene in ["build:use-vbo=true", "texture"] {
        let row = stdout
            .lines()
            .find(|l| l.split_whitespace().next() == Some(scene))
            .unwrap_or_else(|| panic!("no row for {scene}:\n{stdout}"));
        let cols: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(cols[1..], ["Success"; 3], "{row}");
    }
    assert!(stdout.contains("gles validate: OK"), "{stdout}");
}
