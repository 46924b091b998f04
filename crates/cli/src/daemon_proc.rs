//! Starting a `virtsocd` child process for benchmarks and tests, and stopping it.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Instant;

use crate::CliError;

/// A daemon running as a child process; stopped (SIGTERM, then wait) when dropped.
pub struct DaemonProcess {
    child: Child,
    socket: PathBuf,
    remote: Option<(String, String)>,
    token_file: Option<PathBuf>,
}

/// Where guests reach a daemon.
#[derive(Debug, Clone)]
pub struct Endpoint {
    /// What `Connection::open` takes: a socket path, `tcp:HOST:PORT` or `vm`.
    pub target: String,
    /// The daemon's TCP address and token, when it also serves remote guests.
    pub remote: Option<(String, String)>,
    /// The daemon's process id, when this process started it (for CPU accounting).
    pub pid: Option<u32>,
}

/// Path of the `virtsocd` binary: next to the running executable (or one level up, for test
/// binaries in `deps/`), or `$VIRTSOCD`.
pub fn virtsocd_path() -> Result<PathBuf, CliError> {
    if let Some(p) = std::env::var_os("VIRTSOCD") {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe()?;
    let dir = exe.parent().unwrap_or(Path::new("."));
    for cand in [dir.join("virtsocd"), dir.join("../virtsocd")] {
        if cand.exists() {
            return Ok(cand);
        }
    }
    Err(CliError::Usage(format!(
        "cannot find virtsocd next to {} (build it: cargo build -p virtsocd; or set VIRTSOCD)",
        exe.display()
    )))
}

impl DaemonProcess {
    /// Starts `virtsocd --socket <fresh path> <extra>` and waits until it accepts; with
    /// `remote`, it also listens on TCP loopback with a fresh token.
    pub fn spawn(extra: &[&str], remote: bool) -> Result<Self, CliError> {
        let socket = std::env::temp_dir().join(format!(
            "virtsoc-{}-{}.sock",
            std::process::id(),
            Instant::now().elapsed().as_nanos() ^ rand_nonce()
        ));
        let mut cmd = Command::new(virtsocd_path()?);
        cmd.arg("--socket")
            .arg(&socket)
            .arg("--print-ready")
            .args(extra);
        let token = format!("{:032x}", rand_nonce() ^ (rand_nonce() << 64));
        let token_file = if remote {
            let f = socket.with_extension("token");
            std::fs::write(&f, format!("{token}\n"))?;
            cmd.arg("--listen")
                .arg("127.0.0.1:0")
                .arg("--token-file")
                .arg(&f);
            Some(f)
        } else {
            None
        };
        if std::env::var_os("RUST_LOG").is_none() {
            cmd.env("RUST_LOG", "warn");
        }
        let mut child = cmd.stdin(Stdio::null()).stdout(Stdio::piped()).spawn()?;
        // The daemon prints one line once it listens; EOF first means it failed to start.
        let mut line = String::new();
        let mut remote_addr = None;
        if let Some(out) = child.stdout.take() {
            let mut r = BufReader::new(out);
            r.read_line(&mut line)?;
            if let Some(a) = line.strip_prefix("LISTEN ") {
                remote_addr = Some(a.trim().to_string());
                line.clear();
                r.read_line(&mut line)?;
            }
        }
        let d = DaemonProcess {
            child,
            socket,
            remote: remote_addr.map(|a| (a, token)),
            token_file,
        };
        if !line.starts_with("READY") {
            return Err(CliError::Usage(format!(
                "virtsocd did not start listening on {}",
                d.socket.display()
            )));
        }
        Ok(d)
    }

    /// Where guests reach this daemon.
    pub fn endpoint(&self) -> Endpoint {
        Endpoint {
            target: self.socket.display().to_string(),
            remote: self.remote.clone(),
            pid: Some(self.child.id()),
        }
    }

    /// Whether the daemon is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Sends SIGTERM and waits for the exit status.
    pub fn stop(mut self) -> Result<std::process::ExitStatus, CliError> {
        self.terminate()
    }

    fn terminate(&mut self) -> Result<std::process::ExitStatus, CliError> {
        if let Some(pid) = rustix::process::Pid::from_raw(self.child.id() as i32) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
        Ok(self.child.wait()?)
    }
}

fn rand_nonce() -> u128 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(0u8) as u128
}

impl Drop for DaemonProcess {
    fn drop(&mut self) {
        if self.is_running() {
            let _ = self.terminate();
        }
        let _ = std::fs::remove_file(&self.socket);
        if let Some(f) = &self.token_file {
            let _ = std::fs::remove_file(f);
        }
    }
}
