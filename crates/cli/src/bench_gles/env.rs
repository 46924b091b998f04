//! What the GLES programs run in: an X server (Xvfb on a free display when `$DISPLAY` is
//! unset), virgl's `virgl_test_server`, the vendor JSON that points glvnd at
//! `libEGL_virtsoc.so`, and CPU accounting of processes from /proc.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::GlesError;

/// File name of the vendor library next to the `virtsoc` executable.
pub const VENDOR_LIB: &str = "libEGL_virtsoc.so";
/// File name of the vendor JSON written next to it.
pub const VENDOR_JSON: &str = "egl_vendor_virtsoc.json";
/// The socket Mesa 22.3's vtest winsys connects to (hard-coded in Mesa, no variable).
pub const VTEST_SOCKET: &str = "/tmp/.virgl_test";

/// The directory of the running executable (one level up for test binaries in `deps/`).
pub(super) fn exe_dir() -> Result<PathBuf, GlesError> {
    let exe = std::env::current_exe()?;
    let dir = exe.parent().unwrap_or(Path::new(".")).to_path_buf();
    if dir.file_name().is_some_and(|n| n == "deps") {
        if let Some(up) = dir.parent() {
            return Ok(up.to_path_buf());
        }
    }
    Ok(dir)
}

/// Writes the glvnd vendor JSON for `libEGL_virtsoc.so` next to the library (a sibling of
/// the running executable: `target/debug` or `target/release`) and returns its path.
pub fn write_vendor_json() -> Result<PathBuf, GlesError> {
    let dir = exe_dir()?;
    let lib = dir.join(VENDOR_LIB);
    if !lib.is_file() {
        return Err(GlesError::NotBuilt(lib));
    }
    let lib = lib.canonicalize()?;
    let path = lib.with_file_name(VENDOR_JSON);
    // glvnd's layout, in its order: the version first.
    let text = format!(
        "{{\"file_format_version\":\"1.0.0\",\"ICD\":{{\"library_path\":{}}}}}\n",
        serde_json::to_string(&lib.display().to_string())?
    );
    // Programs may be reading it (glvnd at their start): never truncate it under them.
    if std::fs::read_to_string(&path).is_ok_and(|old| old == text) {
        return Ok(path);
    }
    let tmp = path.with_extension(format!("json.{}", std::process::id()));
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, &path)?;
    Ok(path)
}

/// Whether `program` can be started (found on `$PATH` or as a path).
pub fn have(program: &str) -> bool {
    if program.contains('/') {
        return Path::new(program).is_file();
    }
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(program).is_file()))
}

/// Fails with the Debian package to install when `program` is missing.
pub fn require(program: &str, package: &str) -> Result<(), GlesError> {
    if have(program) {
        Ok(())
    } else {
        Err(GlesError::Missing {
            program: program.into(),
            package: package.into(),
        })
    }
}

/// Makes the child get SIGTERM when the thread that started it dies without running the
/// drops that stop it (a signal, a crash): no Xvfb or virgl server outlives the run.
pub(crate) fn die_with_parent(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure only makes one async-signal-safe system call (prctl) between fork
    // and exec, touching no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::TERM))
                .map_err(std::io::Error::from)
        });
    }
}

/// A child process stopped with SIGTERM (then waited for) when dropped.
pub struct Stoppable {
    child: Child,
    what: &'static str,
}

impl Stoppable {
    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether it still runs.
    fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    fn stop(&mut self) {
        if self.running() {
            if let Some(pid) = rustix::process::Pid::from_raw(self.child.id() as i32) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
            }
            let deadline = Instant::now() + Duration::from_secs(5);
            while self.running() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            if self.running() {
                log::warn!("{} did not stop on SIGTERM: killing it", self.what);
                let _ = self.child.kill();
            }
        }
        let _ = self.child.wait();
    }
}

impl Drop for Stoppable {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The X display the programs use: `$DISPLAY`, or an Xvfb started on a free one.
pub struct Display {
    /// The value of `DISPLAY` for the programs (`:N`).
    pub name: String,
    /// The Xvfb this process started, stopped when dropped.
    _xvfb: Option<Stoppable>,
}

impl Display {
    /// `$DISPLAY` when set, else `Xvfb :N -screen 0 1024x768x24` on the first free N from 90.
    pub fn open() -> Result<Display, GlesError> {
        if let Some(d) = std::env::var("DISPLAY").ok().filter(|d| !d.is_empty()) {
            return Ok(Display {
                name: d,
                _xvfb: None,
            });
        }
        require("Xvfb", "xvfb")?;
        Self::start_xvfb()
    }

    /// Starts a fresh Xvfb when the one this process started has gone (killed from outside:
    /// every later program would fail); true when it did.
    pub fn ensure(&mut self) -> Result<bool, GlesError> {
        let gone = self._xvfb.as_mut().is_some_and(|x| !x.running());
        if gone {
            log::warn!("Xvfb on {} has gone: starting another", self.name);
            *self = Self::start_xvfb()?;
        }
        Ok(gone)
    }

    fn start_xvfb() -> Result<Display, GlesError> {
        for n in 90..160u32 {
            let sock = PathBuf::from(format!("/tmp/.X11-unix/X{n}"));
            let lock = PathBuf::from(format!("/tmp/.X{n}-lock"));
            if sock.exists() || lock.exists() {
                continue;
            }
            let mut cmd = Command::new("Xvfb");
            die_with_parent(&mut cmd);
            let child = cmd
                .arg(format!(":{n}"))
                .args(["-screen", "0", "1024x768x24", "-nolisten", "tcp"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()?;
            let mut x = Stoppable {
                child,
                what: "Xvfb",
            };
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if !x.running() {
                    break; // lost a race for this display: try the next
                }
                // Two processes can pick the same free display at once: the loser exits, but
                // the winner's socket may appear before it does. The lock file names the server
                // that owns the display (its pid, as text).
                let owner = std::fs::read_to_string(&lock)
                    .ok()
                    .and_then(|s| s.trim().parse::<u32>().ok());
                match owner {
                    Some(pid) if pid == x.pid() && sock.exists() => {
                        return Ok(Display {
                            name: format!(":{n}"),
                            _xvfb: Some(x),
                        });
                    }
                    Some(pid) if pid != x.pid() => break, // another's: try the next
                    _ => {}
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Err(GlesError::Setup(
            "could not start Xvfb on any display :90..:159".into(),
        ))
    }
}

/// A `virgl_test_server` of this process, listening on [`VTEST_SOCKET`].
pub struct VirglServer {
    server: Stoppable,
}

impl VirglServer {
    /// Starts `virgl_test_server --use-egl-surfaceless` and waits until its socket accepts;
    /// refuses when another server already listens there (Mesa knows only that path).
    pub fn start() -> Result<VirglServer, GlesError> {
        require("virgl_test_server", "virgl-server")?;
        if std::os::unix::net::UnixStream::connect(VTEST_SOCKET).is_ok() {
            return Err(GlesError::Setup(format!(
                "another virgl_test_server listens on {VTEST_SOCKET}"
            )));
        }
        let mut cmd = Command::new("virgl_test_server");
        die_with_parent(&mut cmd);
        // The same shader-compile conditions as the other paths (see the module doc).
        cmd.env("MESA_SHADER_CACHE_DISABLE", "true");
        let child = cmd
            .arg("--use-egl-surfaceless")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let mut server = Stoppable {
            child,
            what: "virgl_test_server",
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if !server.running() {
                return Err(GlesError::Setup("virgl_test_server exited at start".into()));
            }
            // The server binds before it listens: the socket file alone is not enough (a
            // client that came too early failed "Could not initialize canvas" on a loaded
            // machine). A probe connection is served by a forked child that sees the hang-up
            // and exits at once.
            if Path::new(VTEST_SOCKET).exists()
                && std::os::unix::net::UnixStream::connect(VTEST_SOCKET).is_ok()
            {
                return Ok(VirglServer { server });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err(GlesError::Setup(format!(
            "virgl_test_server did not create {VTEST_SOCKET}"
        )))
    }

    /// The server's process id (its forked per-client children are its children).
    pub fn pid(&self) -> u32 {
        self.server.pid()
    }
}

impl Drop for VirglServer {
    fn drop(&mut self) {
        self.server.stop();
        let _ = std::fs::remove_file(VTEST_SOCKET);
    }
}

/// The fields after the command name of `/proc/<pid>/stat` (the name may hold spaces).
fn stat_fields(pid: &str) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.rsplit_once(')')?.1;
    Some(rest.split_whitespace().map(String::from).collect())
}

/// CPU seconds of the children this process has waited for (`cutime + cstime` of
/// /proc/self/stat): the difference around one child's run and wait is that child's CPU.
pub fn reaped_children_cpu() -> Option<f64> {
    let f = stat_fields("self")?;
    // After the name: state(0) ppid ... utime(11) stime(12) cutime(13) cstime(14).
    let cu: f64 = f.get(13)?.parse().ok()?;
    let cs: f64 = f.get(14)?.parse().ok()?;
    Some((cu + cs) / rustix::param::clock_ticks_per_second() as f64)
}

/// CPU seconds of process `pid` with its whole tree: its own, its reaped children's, and
/// (recursively) its running children's. Its difference over a run is what the tree spent.
pub fn tree_cpu(pid: u32) -> Option<f64> {
    tree_cpu_depth(pid, 0)
}

fn tree_cpu_depth(pid: u32, depth: u32) -> Option<f64> {
    let f = stat_fields(&pid.to_string())?;
    let ticks = (11..=14)
        .map(|i| f.get(i).and_then(|v| v.parse::<f64>().ok()))
        .sum::<Option<f64>>()?;
    let own = ticks / rustix::param::clock_ticks_per_second() as f64;
    if depth > 8 {
        return Some(own);
    }
    let live: f64 = children(pid)
        .into_iter()
        .filter_map(|c| tree_cpu_depth(c, depth + 1))
        .sum();
    Some(own + live)
}

/// CPU seconds of a process tree over a span, sampled every 50 ms on a thread of its own:
/// children a server reaps without accounting (virgl_test_server ignores SIGCHLD, so its
/// per-client children never reach its `cutime`) count with their last sample (up to 50 ms
/// short), children reaped the usual way with their parent's `cutime` growth.
pub struct CpuWatch {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<Option<f64>>,
}

impl CpuWatch {
    /// Starts watching the tree of `pid`.
    pub fn start(pid: u32) -> CpuWatch {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || watch_tree(pid, &flag));
        CpuWatch { stop, thread }
    }

    /// Stops watching: the CPU seconds the tree spent since [`CpuWatch::start`].
    pub fn finish(self) -> Option<f64> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.join().ok().flatten()
    }
}

/// (own utime + stime, cutime + cstime) of `pid`, in seconds.
fn own_and_reaped(pid: u32) -> Option<(f64, f64)> {
    let f = stat_fields(&pid.to_string())?;
    let t = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok());
    let hz = rustix::param::clock_ticks_per_second() as f64;
    Some(((t(11)? + t(12)?) / hz, (t(13)? + t(14)?) / hz))
}

fn watch_tree(pid: u32, stop: &std::sync::atomic::AtomicBool) -> Option<f64> {
    use std::collections::BTreeMap;
    let (own0, reaped0) = own_and_reaped(pid)?;
    let sample = || -> BTreeMap<u32, f64> {
        children(pid)
            .into_iter()
            .filter_map(|c| Some((c, tree_cpu(c)?)))
            .collect()
    };
    let first = sample();
    let mut last = first.clone();
    let mut gone = 0.0;
    let mut end = (own0, reaped0);
    loop {
        let stopping = stop.load(std::sync::atomic::Ordering::Relaxed);
        if let Some(now) = own_and_reaped(pid) {
            end = now;
        }
        let now = sample();
        // Children seen before and not now ended between the samples.
        for (c, v) in &last {
            if !now.contains_key(c) {
                gone += v - first.get(c).copied().unwrap_or(0.0);
            }
        }
        last = now;
        if stopping {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let live: f64 = last
        .iter()
        .map(|(c, v)| v - first.get(c).copied().unwrap_or(0.0))
        .sum();
    Some((end.0 - own0) + live + gone.max(end.1 - reaped0))
}

/// The running (and not yet reaped) children of `pid`, from each of its threads' lists.
fn children(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for t in tasks.flatten() {
        if let Ok(list) = std::fs::read_to_string(t.path().join("children")) {
            out.extend(
                list.split_whitespace()
                    .filter_map(|p| p.parse::<u32>().ok()),
            );
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_cpu_is_readable() {
        assert!(reaped_children_cpu().is_some());
        assert!(tree_cpu(std::process::id()).is_some());
    }

    #[test]
    fn a_watched_tree_counts_its_children() {
        // A shell whose busy child it reaps: the watch sees it live or in `cutime`.
        let mut sh = Command::new("sh")
            .args([
                "-c",
                "sleep 0.2; sh -c 'i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done'; sleep 0.2",
            ])
            .spawn()
            .expect("start sh");
        let w = CpuWatch::start(sh.id());
        assert!(sh.wait().is_ok_and(|s| s.success()));
        let cpu = w.finish();
        assert!(cpu.is_some_and(|c| c > 0.05), "{cpu:?}");
    }

    #[test]
    fn a_reaped_child_is_counted() {
        let before = reaped_children_cpu().unwrap_or(0.0);
        let st = Command::new("sh")
            .args(["-c", "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done"])
            .status();
        assert!(st.is_ok_and(|s| s.success()));
        let after = reaped_children_cpu().unwrap_or(0.0);
        assert!(after > before, "{before} -> {after}");
    }
}
