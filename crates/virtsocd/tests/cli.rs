//! `virtsocd`'s command line: `--help`, flags and values it refuses, and paths it cannot use
//! named in its error; in every refused case it exits non-zero without getting ready (no
//! `READY` line) and without serving.

use std::process::{Command, Output, Stdio};
use std::time::Duration;

/// Runs `virtsocd ARGS` to its exit (killed, failing the test, after a minute) with
/// `VIRTSOC_TOKEN` set to `token` or removed.
fn virtsocd(args: &[&str], token: Option<&str>) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_virtsocd"));
    cmd.args(args)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    match token {
        Some(t) => cmd.env("VIRTSOC_TOKEN", t),
        None => cmd.env_remove("VIRTSOC_TOKEN"),
    };
    let child = cmd.spawn().expect("start virtsocd");
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(child.wait_with_output()));
    match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(out) => out.expect("wait for virtsocd"),
        Err(_) => {
            let _ = Command::new("kill").arg("-9").arg(pid.to_string()).status();
            panic!("virtsocd {args:?} did not exit");
        }
    }
}

/// A fresh path in the temporary directory for this test.
fn temp(name: &str) -> String {
    std::env::temp_dir()
        .join(format!("virtsocd-cli-{}-{name}", std::process::id()))
        .to_str()
        .expect("a UTF-8 temporary directory")
        .to_string()
}

/// `virtsocd ARGS` (light devices, a fresh socket) refuses to start; its stderr.
fn refused(name: &str, args: &[&str], token: Option<&str>) -> String {
    let socket = temp(name);
    let mut all = vec![
        "--socket",
        &socket,
        "--print-ready",
        "--gpu-backend",
        "null",
        "--isp-backend",
        "cpu",
        "--decoders",
        "in-process",
        "--isp-swscale",
        "in-process",
    ];
    all.extend_from_slice(args);
    let out = virtsocd(&all, token);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "virtsocd {args:?} started: {stderr}");
    assert!(!stdout.contains("READY"), "virtsocd {args:?} got ready");
    assert!(
        !std::path::Path::new(&socket).exists(),
        "virtsocd {args:?} left its socket behind"
    );
    stderr
}

#[test]
fn help_lists_the_flags() {
    let out = virtsocd(&["--help"], None);
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--socket",
        "--gpu-backend",
        "--policy",
        "--token-file",
        "--vm",
    ] {
        assert!(help.contains(flag), "--help does not list {flag}: {help}");
    }
    // Test-only flags stay out of it.
    assert!(!help.contains("--test-dma-delay-ms"), "{help}");
}

#[test]
fn unknown_flags_and_bad_values_are_usage_errors() {
    let out = virtsocd(&["--no-such-flag"], None);
    assert_eq!(out.status.code(), Some(2), "clap's usage exit code");
    assert!(String::from_utf8_lossy(&out.stderr).contains("--no-such-flag"));

    for (flag, value, says) in [
        ("--display-size", "1920", "WIDTHxHEIGHT"),
        ("--view-budget", "150", "percentage"),
        ("--encoder-preset", "slowest", "veryfast"),
        ("--gpu-driver-nice", "40", "40"),
        ("--protocol", "telepathy", "telepathy"),
    ] {
        let out = virtsocd(&[flag, value], None);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flag} {value}: {err}");
        assert!(err.contains(says), "{flag} {value}: {err}");
    }
}

#[test]
fn unreadable_files_are_named_in_the_error() {
    let missing = "/nonexistent/virtsocd-cli-token";
    let err = refused("token", &["--token-file", missing], None);
    assert!(
        err.contains("--token-file") && err.contains(missing),
        "{err}"
    );

    let missing = "/nonexistent/virtsocd-cli-policy.toml";
    let err = refused("policy", &["--policy", missing], None);
    assert!(err.contains("--policy") && err.contains(missing), "{err}");
}

#[test]
fn an_unusable_socket_path_is_named_in_the_error() {
    let socket = "/nonexistent/virtsocd-cli/d.sock";
    let out = virtsocd(
        &[
            "--socket",
            socket,
            "--gpu-backend",
            "null",
            "--isp-backend",
            "cpu",
        ],
        None,
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("--socket") && err.contains(socket), "{err}");
}

#[test]
fn bad_vm_and_token_values_are_refused() {
    let err = refused("vm", &["--vm", "only-a-name"], None);
    assert!(err.contains("--vm only-a-name"), "{err}");

    let err = refused("short-token", &["--listen", "127.0.0.1:0"], Some("short"));
    assert!(err.contains("at least 16 characters"), "{err}");
}
