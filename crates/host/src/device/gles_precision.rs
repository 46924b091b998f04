//! The shader precision the render workers run guest shaders at, for the `gles` device's
//! backend line (`virtsoc devices`). The decision is each worker's
//! (`VIRTSOC_GLES_PRECISION=guest|highp|auto` in the daemon's environment, which the workers
//! inherit, and the host's `GL_RENDERER`: docs/gles.md, "Shader precision"); a worker says
//! it in one line on its stdout when it starts, and the daemon keeps the first such line
//! (every worker of a daemon decides alike). Until a worker has started the line names the
//! setting asked for.

use std::io::{BufRead, BufReader, Read};
use std::process::ChildStdout;
use std::sync::{Arc, OnceLock};

/// The most characters of a worker's line kept.
const MAX_LINE: usize = 256;

/// The line a worker reported, once one did.
#[derive(Clone, Default)]
pub(super) struct PrecisionLine(Arc<OnceLock<String>>);

impl PrecisionLine {
    /// Reads a started worker's line from `out` in a thread of its own (which ends with the
    /// line, or with the worker); `out` is dropped at once when a line is known already
    /// (the worker's write then fails, which it ignores).
    pub(super) fn listen(&self, out: ChildStdout) -> Option<std::thread::JoinHandle<()>> {
        if self.0.get().is_some() {
            return None;
        }
        let known = self.0.clone();
        std::thread::Builder::new()
            .name("gles-precision".into())
            .spawn(move || {
                let mut line = String::new();
                let mut r = BufReader::new(out.take(4096));
                if r.read_line(&mut line).is_ok_and(|n| n > 0) {
                    let line: String = line.trim().chars().take(MAX_LINE).collect();
                    if !line.is_empty() {
                        let _ = known.set(line);
                    }
                }
            })
            .ok()
    }

    /// What the backend line says: a worker's line, or the setting until one came.
    pub(super) fn line(&self) -> String {
        match self.0.get() {
            Some(l) => l.clone(),
            None => {
                let asked = std::env::var("VIRTSOC_GLES_PRECISION").unwrap_or_default();
                let asked = if asked.trim().is_empty() {
                    "auto"
                } else {
                    asked.trim()
                };
                format!("{asked} (as a render worker decides when it starts; none has yet)")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};

    fn worker_saying(text: &str) -> std::process::Child {
        Command::new("sh")
            .arg("-c")
            .arg(format!("printf '{text}'"))
            .stdout(Stdio::piped())
            .spawn()
            .expect("sh")
    }

    #[test]
    fn the_first_workers_line_is_kept() {
        let p = PrecisionLine::default();
        assert!(p.line().contains("none has yet"), "{}", p.line());
        // A worker that says nothing (no host GL, an old binary) leaves it unknown.
        let mut silent = worker_saying("");
        let t = p
            .listen(silent.stdout.take().expect("pipe"))
            .expect("thread");
        t.join().expect("joined");
        let _ = silent.wait();
        assert!(p.line().contains("none has yet"));
        let mut first = worker_saying("highp (auto, host renderer llvmpipe)\\nmore\\n");
        let t = p
            .listen(first.stdout.take().expect("pipe"))
            .expect("thread");
        t.join().expect("joined");
        let _ = first.wait();
        assert_eq!(p.line(), "highp (auto, host renderer llvmpipe)");
        // Later workers are not listened to.
        let mut second = worker_saying("guest (guest, host renderer x)\\n");
        assert!(p.listen(second.stdout.take().expect("pipe")).is_none());
        let _ = second.wait();
        assert_eq!(p.line(), "highp (auto, host renderer llvmpipe)");
        // A line is bounded.
        let q = PrecisionLine::default();
        let mut long = worker_saying(&"x".repeat(5000));
        q.listen(long.stdout.take().expect("pipe"))
            .expect("thread")
            .join()
            .expect("joined");
        let _ = long.wait();
        assert_eq!(q.line().len(), MAX_LINE);
    }
}
