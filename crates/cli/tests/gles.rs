//! OpenGL ES through virtsoc with unmodified programs (docs/gles.md): `virtsoc gles
//! validate` runs glmark2-es2's own image checks (`--validate`) on a few scenes natively and
//! through virtsoc (a daemon of its own, glvnd pointed at libEGL_virtsoc.so), and es2_info
//! through virtsoc; it fails when a scene validates natively but not through virtsoc.
//!
//! The vendor library and the render worker are built by `cargo build -p virtsoc-gles -p
//! virtsoc-render` (`make test` builds the workspace first): without them the test fails and
//! says so. Without glmark2-es2, es2_info or Xvfb (the system packages of
//! scripts/install-deps.sh) it is skipped loudly, unless `VIRTSOC_REQUIRE_ALL` is set
//! (`make test` sets it), which makes a missing package a failure.

mod common;

use std::path::{Path, PathBuf};

/// The directory holding the `virtsoc` binary under test (target/debug or target/release).
fn bin_dir() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_virtsoc"))
        .parent()
        .expect("virtsoc has a directory")
        .to_path_buf()
}

/// Whether `program` is on `$PATH`.
fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(program).is_file()))
}

/// Whether the system programs are installed; without them the test is skipped, loudly,
/// unless `VIRTSOC_REQUIRE_ALL` is set.
fn programs_present() -> bool {
    let mut needed = vec![
        ("glmark2-es2", "glmark2-es2-x11"),
        ("es2_info.x86_64-linux-gnu", "mesa-utils-bin"),
    ];
    if std::env::var_os("DISPLAY").is_none() {
        needed.push(("Xvfb", "xvfb"));
    }
    let missing: Vec<String> = needed
        .iter()
        .filter(|(p, _)| !on_path(p))
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

fn virtsoc(args: &[&str]) -> std::process::Output {
    common::virtsoc_cmd()
        .args(args)
        .output()
        .expect("run virtsoc")
}

#[test]
fn vendor_json_points_at_the_library() {
    let lib = bin_dir().join("libEGL_virtsoc.so");
    let out = virtsoc(&["gles", "vendor-json"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "virtsoc gles vendor-json failed: {stderr}\n(the vendor library is built by \
         `cargo build -p virtsoc-gles -p virtsoc-render`)"
    );
    let path = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let text = std::fs::read_to_string(&path).expect("read the vendor JSON");
    let v: serde_json::Value = serde_json::from_str(&text).expect("vendor JSON parses");
    assert_eq!(v["file_format_version"], "1.0.0");
    let named = v["ICD"]["library_path"].as_str().expect("library_path");
    assert!(Path::new(named).is_absolute(), "{named}");
    assert_eq!(
        Path::new(named).canonicalize().expect("library exists"),
        lib.canonicalize().expect("library exists")
    );
}

#[test]
fn glmark2_validates_through_virtsoc_as_natively() {
    if !programs_present() {
        return;
    }
    let out = virtsoc(&[
        "gles",
        "validate",
        "--scenes",
        "build:use-vbo=true,texture,shading",
        "--timeout",
        "40",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    eprintln!("{stderr}");
    assert!(
        out.status.success(),
        "virtsoc gles validate failed: {}",
        stderr.lines().last().unwrap_or("")
    );
    assert!(stdout.contains("gles validate: OK"), "{stdout}");
}

#[test]
fn bench_gles_reports_native_and_virgl_as_json() {
    if !programs_present() {
        return;
    }
    if !on_path("virgl_test_server") {
        assert!(
            std::env::var_os("VIRTSOC_REQUIRE_ALL").is_none(),
            "virgl_test_server (virgl-server) is not installed and VIRTSOC_REQUIRE_ALL is set"
        );
        eprintln!("SKIPPED: virgl_test_server is not installed (package virgl-server)");
        return;
    }
    let out = virtsoc(&[
        "bench",
        "gles",
        "--paths",
        "native,virgl",
        "--scenes",
        "build,texture",
        "--duration",
        "0.3",
        "--json",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "virtsoc bench gles failed: {stderr}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON report");
    assert!(v["score_native"].as_f64().is_some_and(|s| s > 0.0), "{v}");
    assert!(v["score_virgl"].as_f64().is_some_and(|s| s > 0.0), "{v}");
    assert!(
        v["score_virtsoc"].is_null(),
        "virtsoc was not asked for: {v}"
    );
    let scenes = v["scenes"].as_array().expect("scenes");
    let names: Vec<&str> = scenes.iter().filter_map(|s| s["name"].as_str()).collect();
    assert_eq!(names, ["build", "texture"]);
    for s in scenes {
        assert!(s["native_fps"].as_f64().is_some_and(|f| f > 0.0), "{s}");
        assert!(s["virgl_fps"].as_f64().is_some_and(|f| f > 0.0), "{s}");
        assert!(s["virtsoc_fps"].is_null(), "{s}");
        assert!(s["round_trips_per_frame"].is_null(), "{s}");
        assert!(s["copies_per_frame"].is_null(), "{s}");
    }
    let virgl = &v["paths"]["virgl"];
    assert!(
        virgl["renderer"]
            .as_str()
            .is_some_and(|r| r.contains("virgl")),
        "{virgl}"
    );
    assert!(virgl["server_cpu_s"].as_f64().is_some(), "{virgl}");
}
