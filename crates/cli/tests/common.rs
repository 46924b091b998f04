//! Helpers shared by the integration tests: a real `virtsocd` process with its log captured.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::Duration;
use virtsoc_devapi::RegionId;

/// A daemon child process whose stderr lines arrive on a channel.
pub struct Daemon {
    /// The `virtsocd` process.
    pub child: Child,
    /// Its guest socket.
    pub socket: PathBuf,
    /// Its stderr, line by line.
    pub log: Receiver<String>,
    /// TCP address, when started with `--listen`.
    pub tcp: Option<String>,
    /// Files the arguments name that the daemon leaves behind when killed: the window and
    /// the doorbell socket of each `--vm NAME:SHM:SOCKET:MIB`.
    leftovers: Vec<PathBuf>,
}

static COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

impl Daemon {
    /// Starts a daemon with the test defaults plus `extra` arguments, once it is ready.
    pub fn start(extra: &[&str]) -> Daemon {
        Self::start_with(&[], None, extra)
    }

    /// Like [`Daemon::start`], but run through `wrapper` (e.g. `["prlimit", "--nofile=64:64"]`)
    /// and listening on `socket` when given.
    pub fn start_with(wrapper: &[&str], socket: Option<PathBuf>, extra: &[&str]) -> Daemon {
        let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let socket = socket.unwrap_or_else(|| {
            std::env::temp_dir().join(format!("virtsoc-it-{}-{n}.sock", std::process::id()))
        });
        let bin = virtsocd();
        let mut cmd = match wrapper.split_first() {
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(bin);
                c
            }
            None => Command::new(bin),
        };
        let mut child = cmd
            .arg("--socket")
            .arg(&socket)
            .arg("--print-ready")
            .args(extra)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start virtsocd");
        let mut line = String::new();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        out.read_line(&mut line).unwrap();
        let mut tcp = None;
        if let Some(a) = line.strip_prefix("LISTEN ") {
            tcp = Some(a.trim().to_string());
            line.clear();
            out.read_line(&mut line).unwrap();
        }
        assert!(line.starts_with("READY"), "daemon did not start: {line:?}");
        let (tx, log) = channel();
        let err = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for l in BufReader::new(err).lines().map_while(Result::ok) {
                eprintln!("[virtsocd] {l}");
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        let leftovers = extra
            .windows(2)
            .filter(|w| w[0] == "--vm")
            .flat_map(|w| w[1].split(':').skip(1).take(2).map(PathBuf::from))
            .collect();
        Daemon {
            child,
            socket,
            log,
            tcp,
            leftovers,
        }
    }

    /// The log lines that arrived so far, and, once the daemon has exited, all of them.
    pub fn drain_log(&self, wait: Duration) -> Vec<String> {
        let mut lines = Vec::new();
        while let Ok(l) = self.log.recv_timeout(wait) {
            lines.push(l);
        }
        lines
    }

    /// Its guest socket.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Waits for a log line containing `needle` (bounded so a broken daemon fails the test).
    pub fn expect_log(&self, needle: &str) -> String {
        loop {
            match self.log.recv_timeout(Duration::from_secs(30)) {
                Ok(l) if l.contains(needle) => return l,
                Ok(_) => {}
                Err(e) => panic!("no log line containing {needle:?}: {e}"),
            }
        }
    }

    /// Whether it is still running.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Sends SIGTERM and waits for it to exit.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let pid = rustix::process::Pid::from_raw(self.child.id() as i32).unwrap();
        rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
        self.child.wait().unwrap()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.alive() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        let _ = std::fs::remove_file(&self.socket);
        // The sockets the daemon puts beside its own (it removes them only on a clean exit).
        for suffix in [".control", ".services", ".migrate"] {
            let mut p = self.socket.clone().into_os_string();
            p.push(suffix);
            let _ = std::fs::remove_file(p);
        }
        for f in &self.leftovers {
            let _ = std::fs::remove_file(f);
        }
    }
}

/// The daemon binary: `virtsocd` (a package of its own) beside the `virtsoc` binary under
/// test, where `virtsoc` looks for it too. `cargo test -p virtsoc` builds only this package's
/// binaries, so the first call in a test binary brings `virtsocd` up to date with the cargo
/// running the tests (the same profile, the same `window`/`v4l2` features); `$VIRTSOCD`, when
/// set, is taken as it is (`make test` sets it: its workspace build made the daemon).
pub fn virtsocd() -> &'static Path {
    static BIN: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BIN.get_or_init(|| {
        if let Some(p) = std::env::var_os("VIRTSOCD") {
            return PathBuf::from(p);
        }
        let dir = Path::new(env!("CARGO_BIN_EXE_virtsoc"))
            .parent()
            .expect("virtsoc has a directory");
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.args(["build", "--quiet", "-p", "virtsocd", "--bin", "virtsocd"])
            .current_dir(env!("CARGO_MANIFEST_DIR"));
        match dir.file_name().and_then(|n| n.to_str()) {
            Some("debug") | None => {}
            Some("release") => {
                cmd.arg("--release");
            }
            Some(profile) => {
                cmd.args(["--profile", profile]);
            }
        }
        let features: Vec<&str> = [
            cfg!(feature = "window").then_some("window"),
            cfg!(feature = "v4l2").then_some("v4l2"),
        ]
        .into_iter()
        .flatten()
        .collect();
        if !features.is_empty() {
            cmd.arg("--features").arg(features.join(","));
        }
        let st = cmd.status().expect("run cargo to build virtsocd");
        assert!(st.success(), "cargo build -p virtsocd failed");
        let bin = dir.join("virtsocd");
        assert!(bin.exists(), "{} was not built", bin.display());
        bin
    })
}

/// A command running the `virtsoc` binary under test, the daemon it starts built (see
/// [`virtsocd`]).
pub fn virtsoc_cmd() -> Command {
    virtsocd();
    Command::new(env!("CARGO_BIN_EXE_virtsoc"))
}

/// Runs the `virtsoc` CLI and returns its stdout (panics on failure).
pub fn virtsoc(args: &[&str]) -> String {
    let out = virtsoc_cmd().args(args).output().expect("run virtsoc");
    assert!(
        out.status.success(),
        "virtsoc {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// A guest connection to `d` with a 64 MiB window.
pub fn connect(d: &Daemon) -> virtsoc_guest::Connection {
    connect_to(d.socket())
}

/// A guest connection to the daemon at `socket` with a 64 MiB window.
pub fn connect_to(socket: &Path) -> virtsoc_guest::Connection {
    virtsoc_guest::Connection::connect(
        socket,
        &virtsoc_guest::ConnectOptions {
            window_size: 64 << 20,
            ..virtsoc_guest::ConnectOptions::default()
        },
    )
    .expect("connect")
}

/// The status of a failed guest call (panics if it did not fail with one).
pub fn status_of<T: std::fmt::Debug>(
    r: Result<T, virtsoc_guest::GuestError>,
) -> virtsoc_guest::Status {
    match r {
        Err(virtsoc_guest::GuestError::Status { status, .. }) => status,
        other => panic!("expected a status error, got {other:?}"),
    }
}

/// All bytes of a region, read by the guest CPU.
pub fn region_bytes(c: &virtsoc_guest::Connection, r: &virtsoc_guest::RegionInfo) -> Vec<u8> {
    cpu_read(c, r.id, r.size as usize)
}

/// The host-side metadata a region was allocated with.
pub fn region_meta(r: &virtsoc_guest::RegionInfo) -> virtsoc_svm::RegionMeta {
    virtsoc_svm::RegionMeta {
        size: r.size,
        width: r.width,
        height: r.height,
        stride: r.stride,
        format: r.format,
        usage: 0,
    }
}

/// One camera capture into region `r`.
pub fn camera_capture(
    c: &virtsoc_guest::Connection,
    r: &virtsoc_guest::RegionInfo,
) -> virtsoc_guest::devices::camera::CaptureReply {
    c.command_with_access(&virtsoc_guest::devices::camera::Capture { frame: r.id })
        .expect("capture")
}

/// Writes `bytes` at the start of region `id` from the guest CPU.
pub fn cpu_write(c: &virtsoc_guest::Connection, id: RegionId, bytes: &[u8]) {
    use virtsoc_guest::{AccessMode, DeviceId};
    let len = bytes.len() as u64;
    let a = c
        .begin_access(id, DeviceId::CPU, 0, len, AccessMode::Write)
        .unwrap();
    // SAFETY: the pointer covers `len` bytes of the window until end_access.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), a.ptr.unwrap().as_ptr(), bytes.len()) };
    c.end_access(id, DeviceId::CPU, 0, len, AccessMode::Write)
        .unwrap();
}

/// Reads the first `len` bytes of region `id` from the guest CPU.
pub fn cpu_read(c: &virtsoc_guest::Connection, id: RegionId, len: usize) -> Vec<u8> {
    use virtsoc_guest::{AccessMode, DeviceId};
    let a = c
        .begin_access(id, DeviceId::CPU, 0, len as u64, AccessMode::Read)
        .unwrap();
    let mut out = vec![0u8; len];
    // SAFETY: the pointer covers `len` bytes of the window until end_access.
    unsafe { std::ptr::copy_nonoverlapping(a.ptr.unwrap().as_ptr(), out.as_mut_ptr(), len) };
    c.end_access(id, DeviceId::CPU, 0, len as u64, AccessMode::Read)
        .unwrap();
    out
}

/// An NV12 frame of linear ramps: luma along x + 2y, U along x, V along y.
pub fn nv12_pattern(w: u32, h: u32) -> Vec<u8> {
    let (w, h) = (w as usize, h as usize);
    let mut f = vec![0u8; w * h * 3 / 2];
    for y in 0..h {
        for x in 0..w {
            f[y * w + x] = (16 + 219 * (x + 2 * y) / (w - 1 + 2 * (h - 1))) as u8;
        }
    }
    let (cw, ch) = (w / 2, h / 2);
    for cy in 0..ch {
        for cx in 0..cw {
            let o = w * h + cy * w + 2 * cx;
            f[o] = (40 + 176 * cx / (cw - 1)) as u8;
            f[o + 1] = (40 + 176 * cy / (ch - 1)) as u8;
        }
    }
    f
}

/// A fresh directory of its own (tests run in parallel), removed with everything in it when
/// dropped.
pub struct TempDir(pub PathBuf);

impl TempDir {
    /// `virtsoc-it-<tag>-<pid>-<n>` under the system's temporary directory.
    pub fn new(tag: &str) -> TempDir {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let p = std::env::temp_dir().join(format!("virtsoc-it-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs an FFmpeg CLI tool (`ffmpeg`, `ffprobe`) and returns its stdout; fails the test,
/// with the tool's stderr, if it cannot run or fails.
pub fn run_tool(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd} (these tests need the FFmpeg CLI): {e}"));
    assert!(
        out.status.success(),
        "{cmd} {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The access units of an H.264 clip as FFmpeg's demuxer cuts them (`ffprobe -show_entries
/// packet=pos,size`): each packet's byte offset in the file and its size.
pub fn clip_packets(clip: &Path) -> Vec<(usize, usize)> {
    let list = run_tool(
        "ffprobe",
        &[
            "-v",
            "error",
            "-show_entries",
            "packet=pos,size",
            "-of",
            "compact=p=0",
            clip.to_str().unwrap(),
        ],
    );
    list.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let field = |k: &str| -> usize {
                line.split('|')
                    .find_map(|kv| kv.strip_prefix(k)?.strip_prefix('='))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or_else(|| panic!("no {k} in ffprobe line {line:?}"))
            };
            (field("pos"), field("size"))
        })
        .collect()
}

/// Makes `dir/name`, an H.264 Annex-B clip of `frames` `testsrc2` frames: `size` is the source size, `vf` an
/// optional filter chain, then the x264 options.
pub fn h264_clip(
    dir: &Path,
    name: &str,
    size: &str,
    frames: u32,
    vf: &str,
    x264: &[&str],
) -> PathBuf {
    let path = dir.join(name);
    let src = format!("testsrc2=size={size}:rate=30");
    let n = frames.to_string();
    let mut args = vec![
        "-hide_banner",
        "-loglevel",
        "error",
        "-y",
        "-f",
        "lavfi",
        "-i",
        &src,
        "-frames:v",
        &n,
    ];
    if !vf.is_empty() {
        args.extend(["-vf", vf]);
    }
    args.extend(["-c:v", "libx264"]);
    args.extend(x264);
    let p = path.to_str().unwrap().to_string();
    args.extend(["-f", "h264", &p]);
    run_tool("ffmpeg", &args);
    path
}

/// Whether QEMU is installed, for the VM tests; without it they are skipped, loudly, unless
/// `VIRTSOC_REQUIRE_ALL` is set (`make test` sets it), which makes a missing QEMU a failure.
pub fn qemu_present() -> bool {
    let ok = Command::new("qemu-system-x86_64")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        assert!(
            std::env::var_os("VIRTSOC_REQUIRE_ALL").is_none(),
            "qemu-system-x86_64 is not installed and VIRTSOC_REQUIRE_ALL is set"
        );
        eprintln!(
            "SKIPPED: qemu-system-x86_64 is not installed (scripts/install-deps.sh installs it)"
        );
    }
    ok
}

/// Builds the guest image holding this build's `virtsoc` in `target/<name>` (a test binary
/// builds it once, in a directory of its own) and returns that directory.
pub fn build_guest_image(name: &str) -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = root.join("target").join(name);
    let st = Command::new(root.join("scripts/build-guest-image.sh"))
        .arg(&out)
        .arg(env!("CARGO_BIN_EXE_virtsoc"))
        .status()
        .expect("run build-guest-image.sh");
    assert!(st.success(), "building the guest image failed");
    out
}

/// A free TCP port on 127.0.0.1 (free when asked; tests bind it soon after).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A daemon accepting live migrations on 127.0.0.1:`port` with the token in `token_file`
/// (null GPU and ISP backends); `fault`: the `--migrate-fault` phase it dies at, if any.
pub fn migration_daemon(token_file: &Path, port: u16, fault: Option<&str>) -> Daemon {
    let addr = format!("127.0.0.1:{port}");
    let mut args = vec![
        "--gpu-backend",
        "null",
        "--isp-backend",
        "null",
        "--token-file",
        token_file.to_str().unwrap(),
        "--migrate-listen",
        &addr,
    ];
    if let Some(f) = fault {
        args.extend(["--migrate-fault", f]);
    }
    Daemon::start(&args)
}

/// Asks `from`'s control API to migrate `guest` to the daemon at `to` (`HOST:PORT`) with
/// `token`; returns the HTTP status and the JSON answer.
pub fn request_migration(
    from: &Daemon,
    guest: u64,
    to: &str,
    token: &str,
) -> (u16, serde_json::Value) {
    use virtsoc_control::client::{control_path, request, Target};
    let body = serde_json::json!({ "to": to, "token": token }).to_string();
    let r = request(
        &Target::Unix(control_path(from.socket())),
        "POST",
        &format!("/guests/{guest}/migrate"),
        body.as_bytes(),
    )
    .expect("control request");
    (r.status, r.json())
}

/// `n` bytes derived from `seed` (a region's contents a test writes and checks later).
pub fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect()
}

/// What a guest's session carries across a migration or restart: blobs of `sizes` written
/// by the CPU with `pattern(size, seed)`, a signaled fence and a pending one (a nop makes
/// sure the signal was taken). Returns the region ids and the two fences.
pub fn guest_state(
    g: &virtsoc_guest::Connection,
    sizes: &[usize],
    seeds: &[u8],
) -> (Vec<RegionId>, virtsoc_guest::Fence, virtsoc_guest::Fence) {
    let ids: Vec<RegionId> = sizes
        .iter()
        .map(|&n| g.alloc_blob(n as u64).unwrap().id)
        .collect();
    for ((&id, &n), &s) in ids.iter().zip(sizes).zip(seeds) {
        cpu_write(g, id, &pattern(n, s));
    }
    let signaled = g.fence_create().unwrap();
    g.fence_signal(virtsoc_guest::DeviceId::CPU, signaled)
        .unwrap();
    let pending = g.fence_create().unwrap();
    g.nop().unwrap();
    (ids, signaled, pending)
}

/// Makes `dir/clip.mp4`: 30 frames of FFmpeg's `testsrc2` (a moving pattern) at 320x240,
/// H.264 in MP4 (what `--camera-source file:PATH` plays).
pub fn mp4_clip(dir: &Path) -> PathBuf {
    let clip = dir.join("clip.mp4");
    let out = Command::new("ffmpeg")
        .args(["-y", "-hide_banner", "-loglevel", "error", "-f", "lavfi"])
        .args(["-i", "testsrc2=size=320x240:rate=30"])
        .args(["-frames:v", "30", "-c:v", "libx264", "-pix_fmt", "yuv420p"])
        .arg(&clip)
        .output()
        .expect("run the ffmpeg CLI (package ffmpeg)");
    assert!(
        out.status.success(),
        "ffmpeg failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    clip
}

/// Bytes packed little-endian into words (the modem's write and read replies).
pub fn pack<const N: usize>(bytes: &[u8]) -> [u64; N] {
    let mut w = [0u64; N];
    for (i, &b) in bytes.iter().enumerate() {
        w[i / 8] |= u64::from(b) << (8 * (i % 8));
    }
    w
}

/// Sends `bytes` to the modem in writes of at most 32 bytes.
pub fn modem_send(c: &virtsoc_guest::Connection, bytes: &[u8]) {
    use virtsoc_guest::devices::modem::Write;
    for chunk in bytes.chunks(32) {
        let [b0, b1, b2, b3] = pack::<4>(chunk);
        let r = c
            .command(&Write {
                len: chunk.len() as u64,
                b0,
                b1,
                b2,
                b3,
            })
            .expect("modem write");
        assert_eq!(r.accepted, chunk.len() as u64);
    }
}

/// One modem read: at most 40 bytes.
pub fn modem_read_once(c: &virtsoc_guest::Connection) -> Vec<u8> {
    let r = c
        .command(&virtsoc_guest::devices::modem::Read {})
        .expect("modem read");
    assert!(r.len <= 40, "{r:?}");
    let words = [r.b0, r.b1, r.b2, r.b3, r.b4];
    (0..r.len as usize)
        .map(|i| (words[i / 8] >> (8 * (i % 8))) as u8)
        .collect()
}

/// The producer test device fills the first `size` bytes of region `id` with the pattern of
/// `seed` (one write access); returns the CRC-32 of what it wrote.
pub fn producer_write(c: &virtsoc_guest::Connection, id: RegionId, size: u64, seed: u64) -> u64 {
    use virtsoc_guest::{testdev, AccessMode, DeviceId};
    c.begin_access(id, DeviceId::PRODUCER, 0, size, AccessMode::Write)
        .unwrap();
    let crc = c
        .device_cmd(
            DeviceId::PRODUCER,
            [testdev::WRITE_PATTERN, u64::from(id), seed, 0, 0, 0],
        )
        .unwrap()[0];
    c.end_access(id, DeviceId::PRODUCER, 0, size, AccessMode::Write)
        .unwrap();
    crc
}

/// The CRC-32 of region `id` as the consumer test device reads it (one read access of its
/// first `size` bytes).
pub fn consumer_checksum(c: &virtsoc_guest::Connection, id: RegionId, size: u64) -> u64 {
    use virtsoc_guest::{testdev, AccessMode, DeviceId};
    c.begin_access(id, DeviceId::CONSUMER, 0, size, AccessMode::Read)
        .unwrap();
    let crc = c
        .device_cmd(
            DeviceId::CONSUMER,
            [testdev::CHECKSUM, u64::from(id), 0, 0, 0, 0],
        )
        .unwrap()[0];
    c.end_access(id, DeviceId::CONSUMER, 0, size, AccessMode::Read)
        .unwrap();
    crc
}
