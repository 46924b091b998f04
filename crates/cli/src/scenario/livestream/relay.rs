//! The RTMP relay of the livestream scenario: nginx with its RTMP module on a free loopback
//! port in a private directory, the push `ffmpeg` fed by a writer thread, the pull `ffmpeg`
//! whose output a reader thread splits into access units; all killed, and the directory
//! removed, when the relay is dropped (also on errors and, through `PR_SET_PDEATHSIG`, when the
//! guest dies).

use super::*;

/// The RTMP relay: nginx on a loopback port, the push `ffmpeg` fed by a writer thread, the pull
/// `ffmpeg` read by a splitter thread. Dropping it kills the three processes and removes its
/// directory.
pub(super) struct Relay {
    dir: PathBuf,
    nginx: Option<Child>,
    pull: Option<Child>,
    push: Option<Child>,
    to_push: Option<SyncSender<Vec<u8>>>,
    pulled: Option<Receiver<Vec<u8>>>,
}

impl Relay {
    /// Starts nginx, then the pull (waiting until nginx saw it play), then the push.
    pub(super) fn start() -> Result<Relay, CliError> {
        let nginx = find_nginx().ok_or_else(|| {
            CliError::Usage(format!(
                "livestream needs nginx, which was not found: {PACKAGES}"
            ))
        })?;
        let module = RTMP_MODULE_PATHS
            .iter()
            .map(Path::new)
            .find(|p| p.is_file())
            .ok_or_else(|| {
                CliError::Usage(format!(
                    "livestream needs nginx's RTMP module (looked for {}): {PACKAGES}",
                    RTMP_MODULE_PATHS.join(", ")
                ))
            })?;
        remove_stale_dirs();
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let dir = std::env::temp_dir().join(format!("{DIR_PREFIX}{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let mut relay = Relay {
            dir,
            nginx: None,
            pull: None,
            push: None,
            to_push: None,
            pulled: None,
        };
        let port = relay.start_nginx(&nginx, module)?;
        let url = format!("rtmp://127.0.0.1:{port}/{STREAM}");
        relay.start_pull(&url)?;
        relay.start_push(&url)?;
        Ok(relay)
    }

    /// Starts nginx on a free port (retrying if another process takes the port first).
    pub(super) fn start_nginx(&mut self, nginx: &Path, module: &Path) -> Result<u16, CliError> {
        let mut last = String::new();
        for _ in 0..3 {
            let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
            let conf = self.dir.join("nginx.conf");
            std::fs::write(&conf, nginx_conf(module, &self.dir, port))?;
            let err_log = self.dir.join("error.log");
            let mut cmd = Command::new(nginx);
            die_with_parent(&mut cmd);
            let child = cmd
                .arg("-p")
                .arg(format!("{}/", self.dir.display()))
                .arg("-c")
                .arg(&conf)
                .arg("-e")
                .arg(&err_log)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(File::create(self.dir.join("nginx.stderr"))?)
                .spawn()
                .map_err(|e| {
                    CliError::Usage(format!("cannot run {}: {e}; {PACKAGES}", nginx.display()))
                })?;
            let child = self.nginx.insert(child);
            let addr = SocketAddr::from(([127, 0, 0, 1], port));
            let deadline = Instant::now() + SERVER_START_TIMEOUT;
            loop {
                if let Some(st) = child.try_wait()? {
                    last = format!(
                        "nginx exited ({st}){}",
                        tail_of(&[&self.dir.join("nginx.stderr"), &err_log])
                    );
                    break;
                }
                if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                    return Ok(port);
                }
                if Instant::now() > deadline {
                    return Err(CliError::Usage(format!(
                        "livestream: nginx did not accept connections on port {port} within {} s{}",
                        SERVER_START_TIMEOUT.as_secs(),
                        tail_of(&[&err_log])
                    )));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            self.nginx = None;
            if !last.contains("in use") {
                break;
            }
        }
        Err(CliError::Usage(format!(
            "livestream: cannot start nginx with its RTMP module: {last}"
        )))
    }

    /// Starts the pull and its reader thread; waits (bounded) until nginx logged its `play`.
    pub(super) fn start_pull(&mut self, url: &str) -> Result<(), CliError> {
        let mut child = ffmpeg(&self.dir.join("pull.log"))?
            .args(["-probesize", "32", "-analyzeduration", "1", "-i", url])
            .args([
                "-c",
                "copy",
                "-bsf:v",
                "h264_mp4toannexb,h264_metadata=aud=insert",
            ])
            .args(["-flush_packets", "1", "-f", "h264", "pipe:1"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(no_ffmpeg)?;
        let out = child.stdout.take();
        self.pull = Some(child);
        let out = out.ok_or_else(|| CliError::Usage("no pull stdout".into()))?;
        let (tx, rx) = mpsc::channel();
        std::thread::Builder::new()
            .name("livestream-pull".into())
            .spawn(move || read_units(out, tx))?;
        self.pulled = Some(rx);
        let deadline = Instant::now() + PLAY_TIMEOUT;
        let err_log = self.dir.join("error.log");
        let needle = format!(
            "play: name='{}'",
            STREAM.rsplit('/').next().unwrap_or(STREAM)
        );
        loop {
            if std::fs::read_to_string(&err_log).is_ok_and(|l| l.contains(&needle)) {
                return Ok(());
            }
            if let Some(Some(st)) = self.pull.as_mut().map(Child::try_wait).transpose()? {
                return Err(CliError::Usage(format!(
                    "livestream: the RTMP pull (ffmpeg) exited ({st}){}",
                    self.logs()
                )));
            }
            if Instant::now() > deadline {
                // Not fatal: the guest waits for a keyframe if the pull joins late.
                log::warn!("livestream: the pull did not start playing within {PLAY_TIMEOUT:?}");
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Starts the push and its writer thread (it publishes once the first packet arrives).
    pub(super) fn start_push(&mut self, url: &str) -> Result<(), CliError> {
        let mut child = ffmpeg(&self.dir.join("push.log"))?
            .args(["-probesize", "32", "-analyzeduration", "1"])
            .args([
                "-use_wallclock_as_timestamps",
                "1",
                "-f",
                "h264",
                "-i",
                "pipe:0",
            ])
            .args(["-c", "copy", "-f", "flv", url])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .map_err(no_ffmpeg)?;
        let stdin = child.stdin.take();
        self.push = Some(child);
        let stdin = stdin.ok_or_else(|| CliError::Usage("no push stdin".into()))?;
        let (tx, rx) = mpsc::sync_channel(PUSH_QUEUE);
        std::thread::Builder::new()
            .name("livestream-push".into())
            .spawn(move || write_packets(stdin, rx))?;
        self.to_push = Some(tx);
        Ok(())
    }

    /// Queues a packet for the push (never blocks).
    pub(super) fn push(&mut self, packet: Vec<u8>) -> Result<(), CliError> {
        let Some(tx) = &self.to_push else {
            return Err(CliError::Usage(
                "livestream: the push is not running".into(),
            ));
        };
        match tx.try_send(packet) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(_)) => Err(CliError::Usage(format!(
                "livestream: the RTMP push (ffmpeg) stalled with {PUSH_QUEUE} packets queued{}",
                self.logs()
            ))),
            Err(TrySendError::Disconnected(_)) => Err(CliError::Usage(format!(
                "livestream: the RTMP push (ffmpeg) stopped reading{}",
                self.logs()
            ))),
        }
    }

    /// Up to `max` pulled access units that are already there (never blocks).
    pub(super) fn pull_now(&mut self, max: usize) -> Result<Vec<Vec<u8>>, CliError> {
        let mut units = Vec::new();
        while units.len() < max {
            match self.pull_within(Duration::ZERO)? {
                Some(u) => units.push(u),
                None => break,
            }
        }
        Ok(units)
    }

    /// The next pulled access unit, waiting at most `wait` for it.
    pub(super) fn pull_within(&mut self, wait: Duration) -> Result<Option<Vec<u8>>, CliError> {
        let Some(rx) = &self.pulled else {
            return Ok(None);
        };
        let got = if wait.is_zero() {
            rx.try_recv().map_err(|e| e == TryRecvError::Disconnected)
        } else {
            rx.recv_timeout(wait)
                .map_err(|e| e == RecvTimeoutError::Disconnected)
        };
        match got {
            Ok(u) => Ok(Some(u)),
            Err(false) => Ok(None),
            Err(true) => Err(CliError::Usage(format!(
                "livestream: the RTMP pull (ffmpeg) ended{}",
                self.logs()
            ))),
        }
    }

    /// The ends of the processes' logs, for error messages.
    pub(super) fn logs(&self) -> String {
        tail_of(&[
            &self.dir.join("push.log"),
            &self.dir.join("pull.log"),
            &self.dir.join("error.log"),
        ])
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        // Closing the queue ends the writer thread once the push is gone.
        self.to_push = None;
        for child in [&mut self.push, &mut self.pull, &mut self.nginx]
            .into_iter()
            .filter_map(Option::take)
        {
            let mut child = child;
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// nginx's configuration: one process in the foreground, RTMP on loopback `port`, live
/// streaming without recording; logs and pid in `dir`.
pub(super) fn nginx_conf(module: &Path, dir: &Path, port: u16) -> String {
    let d = dir.display();
    format!(
        "load_module {};\n\
         daemon off;\n\
         master_process off;\n\
         worker_processes 1;\n\
         pid {d}/nginx.pid;\n\
         error_log {d}/error.log info;\n\
         events {{ worker_connections 64; }}\n\
         rtmp {{\n    server {{\n        listen 127.0.0.1:{port};\n        \
         application live {{ live on; record off; wait_key on; }}\n    }}\n}}\n",
        module.display()
    )
}

/// Removes the directories of runs whose process is gone (killed before its drop ran).
fn remove_stale_dirs() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(DIR_PREFIX))
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// nginx on PATH or in the usual sbin directories (often not on a user's PATH).
fn find_nginx() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/usr/local/sbin", "/usr/local/nginx/sbin"].map(PathBuf::from))
        .map(|d| d.join("nginx"))
        .find(|p| p.is_file())
}

/// An `ffmpeg` command logging errors to `log`.
fn ffmpeg(log: &Path) -> Result<Command, CliError> {
    let mut cmd = Command::new("ffmpeg");
    cmd.args(["-nostdin", "-hide_banner", "-loglevel", "error"])
        .stderr(File::create(log)?);
    die_with_parent(&mut cmd);
    Ok(cmd)
}

/// Makes the child get SIGKILL when this process dies without running [`Relay`]'s drop (a
/// signal, a crash), so no server or `ffmpeg` outlives the run.
fn die_with_parent(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure only makes one async-signal-safe system call (prctl).
    unsafe {
        cmd.pre_exec(|| {
            rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))
                .map_err(std::io::Error::from)
        });
    }
}

fn no_ffmpeg(e: std::io::Error) -> CliError {
    CliError::Usage(format!(
        "cannot run ffmpeg (scripts/install-deps.sh installs it): {e}"
    ))
}

/// The last lines of each of `files` that exist and are not empty.
fn tail_of(files: &[&Path]) -> String {
    let mut s = String::new();
    for f in files {
        let Ok(text) = std::fs::read_to_string(f) else {
            continue;
        };
        let lines: Vec<&str> = text.lines().collect();
        if lines.is_empty() {
            continue;
        }
        let name = f
            .file_name()
            .map_or(String::new(), |n| n.to_string_lossy().into());
        s += &format!("\n--- {name}:");
        for l in &lines[lines.len().saturating_sub(6)..] {
            s += "\n  ";
            s += l;
        }
    }
    s
}

/// The pull's reader: splits its stdout into access units and sends them until either side
/// goes away.
fn read_units(mut out: impl Read, tx: Sender<Vec<u8>>) {
    let mut splitter = AuSplitter::default();
    let mut chunk = vec![0u8; 64 << 10];
    loop {
        match out.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => {
                for unit in splitter.push(&chunk[..n]) {
                    if tx.send(unit).is_err() {
                        return;
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    if let Some(unit) = splitter.finish() {
        let _ = tx.send(unit);
    }
}

/// The push's writer: copies queued packets to the push's stdin until either side goes away.
fn write_packets(mut stdin: ChildStdin, rx: Receiver<Vec<u8>>) {
    for packet in rx {
        if stdin
            .write_all(&packet)
            .and_then(|()| stdin.flush())
            .is_err()
        {
            break;
        }
    }
}
