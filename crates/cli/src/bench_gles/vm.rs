//! The `vm` path of `virtsoc bench gles` and `virtsoc gles validate`: the same unmodified
//! program inside a QEMU guest (TCG unless `--vm-accel kvm`) booted from the GLES guest image
//! (`scripts/build-guest-image.sh --gles`: glmark2-es2, es2_info, glvnd, libEGL_virtsoc.so as
//! glvnd's only EGL vendor, an Xvfb of the guest's own), reaching the daemon through its VM
//! endpoint: the window is the ivshmem BAR, doorbells go over virtio-serial, and the vendor
//! library picks that transport by itself (no `VIRTSOC_SOCKET` in the guest).
//!
//! The program runs as `virtsoc vm run --image IMAGE ... -- PROGRAM ARGS`, a child of this
//! process: its output lines are the guest's (glmark2's own), and its CPU time is QEMU's, so
//! the guest's emulated CPU side (the program, the vendor library's encoding) is what the
//! path's "program CPU" counts; GL itself runs on the host, in the daemon's render worker.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::env::exe_dir;
use super::GlesError;

/// The VM's window in MiB: what a process guest gets by default (`ConnectOptions`), room for
/// the vendor library's stream and reply regions (1 MiB each at first, grown to the largest
/// batch) and three frame regions per window surface (5.5 MiB at 800x600).
pub const WINDOW_MIB: u64 = 256;
/// The image directory's name beside this executable (`target/debug/vm-gles-image`: one per
/// build profile, each holding its own profile's vendor library).
pub const IMAGE_DIR: &str = "vm-gles-image";
/// Seconds a boot may add before the program's first line (a loaded machine boots in 15-40 s).
pub const BOOT_ALLOWANCE: Duration = Duration::from_secs(120);

/// How programs reach the daemon from a VM guest.
#[derive(Debug, Clone)]
pub struct VmGuest {
    /// This executable (`virtsoc`), which runs `vm run`.
    exe: PathBuf,
    image: PathBuf,
    shm: PathBuf,
    doorbell: PathBuf,
    accel: String,
    /// How long a program may run in the guest (the boot comes on top).
    limit: Duration,
}

/// The GLES guest image in `dir` (default: [`IMAGE_DIR`] beside this executable), brought up
/// to date with the vendor library next to this executable by
/// `scripts/build-guest-image.sh --gles` when the checkout's script is found (it does nothing
/// when the image is current); an existing image is used as it is otherwise.
pub fn image(dir: Option<PathBuf>) -> Result<PathBuf, GlesError> {
    let exe = exe_dir()?;
    let target = exe.parent().unwrap_or(Path::new(".")).to_path_buf();
    let dir = dir.unwrap_or_else(|| exe.join(IMAGE_DIR));
    let lib = exe.join(super::env::VENDOR_LIB);
    let script = target.join("../scripts/build-guest-image.sh");
    if script.is_file() && lib.is_file() {
        let out = Command::new(&script)
            .arg("--gles")
            .arg(&dir)
            .arg(&lib)
            .output()?;
        if !out.status.success() {
            return Err(GlesError::Setup(format!(
                "{} --gles {} {} failed: {}",
                script.display(),
                dir.display(),
                lib.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
    }
    if dir.join("vmlinuz").is_file() && dir.join("initramfs.cpio.gz").is_file() {
        return Ok(dir);
    }
    if !lib.is_file() {
        return Err(GlesError::NotBuilt(lib));
    }
    Err(GlesError::Setup(format!(
        "no GLES guest image in {} (scripts/build-guest-image.sh --gles {} {})",
        dir.display(),
        dir.display(),
        lib.display()
    )))
}

impl VmGuest {
    /// A VM booted from `image` with `accel` (`tcg` or `kvm`), served by a daemon started
    /// with [`VmGuest::daemon_args`], its programs given `limit` each.
    pub fn new(image: PathBuf, accel: &str, limit: Duration) -> Result<VmGuest, GlesError> {
        if !super::env::have("qemu-system-x86_64") {
            return Err(GlesError::Missing {
                program: "qemu-system-x86_64".into(),
                package: "qemu-system-x86".into(),
            });
        }
        if !matches!(accel, "tcg" | "kvm") {
            return Err(GlesError::Usage(format!(
                "--vm-accel must be tcg or kvm, not {accel}"
            )));
        }
        let tag = format!(
            "{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos())
        );
        let dir = std::env::temp_dir();
        Ok(VmGuest {
            exe: std::env::current_exe()?,
            image,
            shm: dir.join(format!("virtsoc-gles-vm-{tag}.shm")),
            doorbell: dir.join(format!("virtsoc-gles-vm-{tag}.sock")),
            accel: accel.into(),
            limit,
        })
    }

    /// The daemon's arguments for the VM's endpoint (`--vm NAME:SHM:DOORBELL:MIB`).
    pub fn daemon_args(&self) -> Vec<String> {
        vec![
            "--vm".into(),
            format!(
                "gles-vm:{}:{}:{WINDOW_MIB}",
                self.shm.display(),
                self.doorbell.display()
            ),
        ]
    }

    /// `virtsoc vm run` booting the image and running `program` (append its arguments) for
    /// at most the limit plus [`BOOT_ALLOWANCE`].
    pub fn command(&self, program: &str) -> Command {
        let mut c = Command::new(&self.exe);
        c.args(["vm", "run", "--image"])
            .arg(&self.image)
            .arg("--shm")
            .arg(&self.shm)
            .arg("--doorbell")
            .arg(&self.doorbell)
            .args(["--window-mib", &WINDOW_MIB.to_string()])
            .args(["--accel", &self.accel])
            .args([
                "--timeout",
                &(self.limit + BOOT_ALLOWANCE).as_secs().max(1).to_string(),
            ])
            .args(["--", program]);
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_boots_the_image_against_the_endpoint() {
        let g = VmGuest {
            exe: "virtsoc".into(),
            limit: Duration::from_secs(30),
            image: "/img".into(),
            shm: "/tmp/a.shm".into(),
            doorbell: "/tmp/a.sock".into(),
            accel: "tcg".into(),
        };
        assert_eq!(
            g.daemon_args(),
            ["--vm", "gles-vm:/tmp/a.shm:/tmp/a.sock:256"]
        );
        let c = g.command("glmark2-es2");
        let args: Vec<String> = c
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let s = args.join(" ");
        assert!(
            s.starts_with("vm run --image /img --shm /tmp/a.shm --doorbell /tmp/a.sock"),
            "{s}"
        );
        assert!(
            s.contains("--window-mib 256 --accel tcg --timeout 150"),
            "{s}"
        );
        assert!(s.ends_with("-- glmark2-es2"), "{s}");
    }
}
