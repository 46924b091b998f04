//! The shader precision the render workers run guest shaders at, for the `gles` device's
//! backend line (`virtsoc devices`): asked once of the worker program (`virtsoc-render
//! --probe`, in the daemon's environment, which the workers inherit) in a thread of its own
//! at the device's creation, so neither the daemon's start nor a guest waits for the host
//! driver's set-up. The decision is the worker's (`VIRTSOC_GLES_PRECISION=guest|highp|auto`
//! and the host's `GL_RENDERER`: docs/gles.md, "Shader precision"); the daemon only shows it.

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{mpsc, Arc, OnceLock};
use std::time::Duration;

/// The most characters of the probe's answer kept.
const MAX_LINE: usize = 256;

/// The probe's answer, once it came.
pub(super) struct PrecisionProbe {
    answer: Arc<OnceLock<String>>,
    /// The asking thread (joined by tests only: it ends on its own).
    #[cfg_attr(not(test), allow(dead_code))]
    thread: Option<std::thread::JoinHandle<()>>,
}

impl PrecisionProbe {
    /// Starts asking `program --probe`, given `deadline` to answer.
    pub(super) fn start(program: &Path, deadline: Duration) -> PrecisionProbe {
        let answer = Arc::new(OnceLock::new());
        let (out, program) = (answer.clone(), program.to_path_buf());
        let started = std::thread::Builder::new()
            .name("gles-precision".into())
            .spawn(move || {
                let _ = out.set(ask(&program, deadline));
            });
        let thread = match started {
            Ok(t) => Some(t),
            Err(e) => {
                let _ = answer.set(format!("unknown (no thread to ask the worker: {e})"));
                None
            }
        };
        PrecisionProbe { answer, thread }
    }

    /// What the backend line says: the worker's answer, or that it has not come yet.
    pub(super) fn line(&self) -> String {
        self.answer
            .get()
            .cloned()
            .unwrap_or_else(|| "not known yet (asking the render worker)".into())
    }
}

/// Runs `program --probe` and reads its one line (ended after `deadline`).
fn ask(program: &Path, deadline: Duration) -> String {
    let child = Command::new(program)
        .arg("--probe")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => return format!("unknown (cannot start {}: {e})", program.display()),
    };
    let Some(mut stdout) = child.stdout.take() else {
        let _ = child.kill();
        let _ = child.wait();
        return "unknown (no pipe from the render worker)".into();
    };
    let (tx, rx) = mpsc::channel();
    let reader = std::thread::Builder::new()
        .name("gles-precision-read".into())
        .spawn(move || {
            let mut s = String::new();
            let _ = (&mut stdout).take(64 << 10).read_to_string(&mut s);
            let _ = tx.send(s);
        });
    let answer = match reader {
        Ok(_) => rx.recv_timeout(deadline).ok(),
        Err(_) => None,
    };
    let _ = child.kill();
    let status = child.wait();
    match answer {
        Some(s) if status.as_ref().is_ok_and(|s| s.success()) && !s.trim().is_empty() => {
            let line = s.lines().next().unwrap_or("").trim();
            line.chars().take(MAX_LINE).collect()
        }
        Some(_) => "unknown (the render worker has no host GL)".into(),
        None => format!("unknown (the render worker did not answer in {deadline:?})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A script standing in for the worker program.
    fn script(dir: &Path, name: &str, body: &str) -> std::path::PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let p = dir.join(name);
        std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).expect("write script");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        p
    }

    #[test]
    fn the_workers_answer_or_why_there_is_none() {
        let dir = tempfile::tempdir().expect("temp dir");
        let d = dir.path();
        let long = Duration::from_secs(60);
        let ok = script(
            d,
            "ok",
            r#"[ "$1" = --probe ] && echo "highp (auto: llvmpipe)""#,
        );
        assert_eq!(ask(&ok, long), "highp (auto: llvmpipe)");
        let fails = script(d, "fails", "exit 1");
        assert!(ask(&fails, long).contains("has no host GL"));
        assert!(ask(&d.join("missing"), long).starts_with("unknown (cannot start"));
        let hangs = script(d, "hangs", "exec sleep 600");
        assert!(ask(&hangs, Duration::from_millis(200)).contains("did not answer"));
        // Through the thread: the line is the answer once it came.
        let mut p = PrecisionProbe::start(&ok, long);
        p.thread.take().expect("asking").join().expect("asked");
        assert_eq!(p.line(), "highp (auto: llvmpipe)");
    }
}
