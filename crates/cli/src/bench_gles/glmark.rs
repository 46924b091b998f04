//! Running an unmodified GLES program (glmark2-es2, es2_info) with its output read line by
//! line, and parsing glmark2's output: per-scene results, validation verdicts, the score and
//! the GL strings of its header.

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::env::reaped_children_cpu;
use super::GlesError;

/// The glmark2 binary (Debian `glmark2-es2-x11`).
pub const GLMARK2: &str = "glmark2-es2";

/// One line of glmark2's output about a scene.
#[derive(Debug, Clone, PartialEq)]
pub enum SceneLine {
    /// `[build] use-vbo=false: FPS: 1234 FrameTime: 0.8 ms`.
    Fps {
        /// The scene and its options (`build:use-vbo=false`; `jellyfish` for `<default>`).
        name: String,
        /// Frames per second.
        fps: f64,
        /// Milliseconds per frame.
        frame_ms: f64,
    },
    /// `[build] use-vbo=true: Validation: Success` (or `Failure`, `Unknown`).
    Validation {
        /// The scene and its options, as in [`SceneLine::Fps`].
        name: String,
        /// The verdict as printed.
        verdict: String,
    },
    /// A scene line with neither (`Unsupported`, `Set up failed`): the text after the name.
    Other {
        /// The scene and its options.
        name: String,
        /// What glmark2 printed instead of a result.
        text: String,
    },
}

/// The scene name of a scene line: `[scene] opts` becomes `scene:opts` (`scene` when the
/// options are `<default>` or empty).
fn scene_name(scene: &str, opts: &str) -> String {
    let opts = opts.trim();
    if opts.is_empty() || opts == "<default>" {
        scene.to_string()
    } else {
        format!("{scene}:{opts}")
    }
}

/// Parses one line of glmark2's output about a scene (None for any other line).
pub fn parse_scene_line(line: &str) -> Option<SceneLine> {
    let line = line.trim();
    let rest = line.strip_prefix('[')?;
    let (scene, rest) = rest.split_once(']')?;
    if scene.is_empty() || scene.contains(' ') {
        return None;
    }
    if let Some((opts, tail)) = rest.split_once(": FPS: ") {
        let mut words = tail.split_whitespace();
        let fps = words.next()?.parse().ok()?;
        let frame_ms = match (words.next(), words.next()) {
            (Some("FrameTime:"), Some(v)) => v.parse().ok()?,
            _ => return None,
        };
        return Some(SceneLine::Fps {
            name: scene_name(scene, opts),
            fps,
            frame_ms,
        });
    }
    if let Some((opts, verdict)) = rest.split_once(": Validation: ") {
        return Some(SceneLine::Validation {
            name: scene_name(scene, opts),
            verdict: verdict.trim().to_string(),
        });
    }
    // Options never hold ": " (kernels use ',' and ';'), so the last one ends them; a
    // program killed mid-scene leaves the scene's title alone (`[shading] shading=phong:`).
    let (opts, text) = match rest.rsplit_once(": ") {
        Some((opts, text)) => (opts, text.trim()),
        None => (rest.trim_end().strip_suffix(':').unwrap_or(rest), ""),
    };
    Some(SceneLine::Other {
        name: scene_name(scene, opts),
        text: if text.is_empty() {
            "interrupted".to_string()
        } else {
            text.to_string()
        },
    })
}

/// `glmark2 Score: N`.
pub fn parse_score(line: &str) -> Option<f64> {
    line.trim()
        .strip_prefix("glmark2 Score:")
        .and_then(|v| v.trim().parse().ok())
}

/// `    GL_RENDERER:    llvmpipe (...)` (glmark2's header) or `GL_RENDERER: ...` (es2_info):
/// the value of `key`.
pub fn header_value(line: &str, key: &str) -> Option<String> {
    let rest = line.trim().strip_prefix(key)?.strip_prefix(':')?;
    Some(rest.trim().to_string())
}

/// What a program printed and what it cost.
#[derive(Debug, Clone, Default)]
pub struct Output {
    /// Its standard output, line by line.
    pub lines: Vec<String>,
    /// The last lines of its standard error.
    pub stderr_tail: Vec<String>,
    /// Its exit code (None: killed by a signal, or by the timeout).
    pub code: Option<i32>,
    /// Whether it ran past its time limit and was killed.
    pub timed_out: bool,
    /// CPU seconds it (and its children) spent, from this process's reaped-children times.
    pub cpu_s: Option<f64>,
    /// Wall seconds it ran.
    pub wall_s: f64,
}

impl Output {
    /// Whether it exited with status 0.
    pub fn ok(&self) -> bool {
        self.code == Some(0) && !self.timed_out
    }

    /// Why it failed, in one line (exit status, timeout, its last error lines).
    pub fn failure(&self) -> String {
        let how = if self.timed_out {
            "timed out".to_string()
        } else {
            match self.code {
                Some(c) => format!("exited with {c}"),
                None => "killed by a signal".to_string(),
            }
        };
        let tail: Vec<&str> = self
            .stderr_tail
            .iter()
            .rev()
            .take(3)
            .rev()
            .map(String::as_str)
            .collect();
        if tail.is_empty() {
            how
        } else {
            format!("{how}: {}", tail.join(" | "))
        }
    }
}

/// Runs `cmd` (whose environment the caller has set) for at most `limit`, calling
/// `on_line` with each line of its standard output as it arrives; kills it at the limit, or
/// once it has printed nothing for `quiet` (a program stuck in one scene).
/// Only one program may run at a time in this process for its CPU time to be its own.
pub fn run_program(
    mut cmd: Command,
    limit: Duration,
    quiet: Duration,
    mut on_line: impl FnMut(&str),
) -> Result<Output, GlesError> {
    let cpu_before = reaped_children_cpu();
    let start = Instant::now();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| GlesError::Setup(format!("cannot start {cmd:?}: {e}")))?;
    let (tx, rx) = mpsc::channel::<String>();
    let out_reader = child.stdout.take().map(|out| {
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        })
    });
    let err_reader = child.stderr.take().map(|mut err| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = err.read_to_end(&mut buf);
            String::from_utf8_lossy(&buf)
                .lines()
                .rev()
                .take(20)
                .map(String::from)
                .collect::<Vec<_>>()
        })
    });
    let end = start + limit;
    let mut deadline = end.min(start + quiet);
    let mut output = Output::default();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left.max(Duration::from_millis(1))) {
            Ok(l) => {
                on_line(&l);
                output.lines.push(l);
                deadline = end.min(Instant::now() + quiet);
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if Instant::now() >= deadline {
                    output.timed_out = true;
                    let _ = child.kill();
                    break;
                }
            }
        }
    }
    let status = child.wait()?;
    output.wall_s = start.elapsed().as_secs_f64();
    // After a timeout a grandchild may still hold the pipes: the readers are left behind.
    if !output.timed_out {
        if let Some(t) = out_reader {
            let _ = t.join();
        }
        if let Some(t) = err_reader {
            let mut tail = t.join().unwrap_or_default();
            tail.reverse();
            output.stderr_tail = tail;
        }
    }
    output.lines.extend(rx.try_iter());
    output.code = status.code();
    output.cpu_s = match (cpu_before, reaped_children_cpu()) {
        (Some(a), Some(b)) => Some((b - a).max(0.0)),
        _ => None,
    };
    Ok(output)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scene_lines_parse() {
        assert_eq!(
            parse_scene_line("[build] use-vbo=false: FPS: 1234 FrameTime: 0.810 ms"),
            Some(SceneLine::Fps {
                name: "build:use-vbo=false".into(),
                fps: 1234.0,
                frame_ms: 0.81
            })
        );
        assert_eq!(
            parse_scene_line("[jellyfish] <default>: FPS: 23 FrameTime: 44.933 ms"),
            Some(SceneLine::Fps {
                name: "jellyfish".into(),
                fps: 23.0,
                frame_ms: 44.933
            })
        );
        let k = "[effect2d] kernel=0,1,0;1,-4,1;0,1,0;: FPS: 162 FrameTime: 6.208 ms";
        assert!(matches!(
            parse_scene_line(k),
            Some(SceneLine::Fps { name, .. }) if name == "effect2d:kernel=0,1,0;1,-4,1;0,1,0;"
        ));
        assert_eq!(
            parse_scene_line("[texture] duration=1: Validation: Success"),
            Some(SceneLine::Validation {
                name: "texture:duration=1".into(),
                verdict: "Success".into()
            })
        );
        assert_eq!(
            parse_scene_line("[shading] shading=phong: Unsupported"),
            Some(SceneLine::Other {
                name: "shading:shading=phong".into(),
                text: "Unsupported".into()
            })
        );
        assert_eq!(
            parse_scene_line("[shading] shading=phong: "),
            Some(SceneLine::Other {
                name: "shading:shading=phong".into(),
                text: "interrupted".into()
            })
        );
        assert_eq!(parse_scene_line("    GL_VENDOR:      Mesa/X.org"), None);
        assert_eq!(parse_scene_line("======"), None);
    }

    #[test]
    fn score_and_header_parse() {
        assert_eq!(
            parse_score("                                  glmark2 Score: 199 "),
            Some(199.0)
        );
        assert_eq!(parse_score("[build] x"), None);
        assert_eq!(
            header_value(
                "    GL_RENDERER:    llvmpipe (LLVM 15.0.6, 256 bits)",
                "GL_RENDERER"
            ),
            Some("llvmpipe (LLVM 15.0.6, 256 bits)".into())
        );
        assert_eq!(
            header_value("EGL_VENDOR: Mesa Project", "EGL_VENDOR"),
            Some("Mesa Project".into())
        );
        assert_eq!(header_value("EGL_VENDORS: x", "EGL_VENDOR"), None);
    }

    #[test]
    fn a_program_runs_and_times_out() {
        let mut seen = Vec::new();
        let mut c = Command::new("sh");
        c.args(["-c", "echo one; echo two; echo oops >&2; exit 3"]);
        let o = run_program(c, Duration::from_secs(10), Duration::from_secs(10), |l| {
            seen.push(l.to_string())
        })
        .expect("run sh");
        assert_eq!(seen, ["one", "two"]);
        assert_eq!(o.code, Some(3));
        assert!(!o.ok());
        assert!(o.failure().contains("oops"), "{}", o.failure());
        let mut c = Command::new("sleep");
        c.arg("10");
        let o = run_program(
            c,
            Duration::from_millis(200),
            Duration::from_secs(5),
            |_| {},
        )
        .expect("run sleep");
        assert!(o.timed_out);
        // Quiet for too long: killed before the limit.
        let mut c = Command::new("sh");
        c.args(["-c", "echo start; sleep 10"]);
        let t = Instant::now();
        let o = run_program(
            c,
            Duration::from_secs(20),
            Duration::from_millis(300),
            |_| {},
        )
        .expect("run sh");
        assert!(o.timed_out && t.elapsed() < Duration::from_secs(5));
        assert_eq!(o.lines, ["start"]);
    }
}
