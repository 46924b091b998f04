//! `virtsoc vm run`: boots a QEMU guest (TCG by default) whose window is an ivshmem BAR and
//! whose doorbells go over virtio-serial, runs a command inside it against the host daemon,
//! and returns what it printed.
//!
//! The image comes from `scripts/build-guest-image.sh` (a Debian kernel extracted, never
//! installed, and a busybox initramfs). The core image holds this binary and runs `virtsoc
//! ARGS...`; the GLES image (`--gles`: glmark2-es2, es2_info, glvnd, libEGL_virtsoc.so and
//! an Xvfb of its own, docs/gles.md) runs ARGS as a command line (`glmark2-es2 --validate`).
//! The arguments travel hex-encoded on the kernel command line (`virtsoc.args=`), decoded
//! inside the guest by this binary (`$VIRTSOC_ARGS_HEX`) or by the GLES image's init.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::daemon_proc::DaemonProcess;
use crate::CliError;

/// Marker lines the guest's init prints around the command.
pub const BEGIN: &str = "VIRTSOC-GUEST-BEGIN";
pub const EXIT: &str = "VIRTSOC-GUEST-EXIT";

/// How to run a VM.
#[derive(Debug, Clone)]
pub struct VmRun {
    pub image: PathBuf,
    /// An existing daemon's VM endpoint (memory file and doorbell socket); `None`: start a
    /// daemon for this run.
    pub endpoint: Option<(PathBuf, PathBuf)>,
    pub window_mib: u64,
    pub accel: String,
    pub memory_mib: u32,
    pub timeout: Duration,
    pub args: Vec<String>,
    /// Print the guest's lines as they arrive.
    pub echo: bool,
}

/// Runs `virtsoc bench BENCH --socket vm --channels CHANNELS --json --round-trips N --size S
/// --reps R` inside a TCG guest booted from `image` with a daemon of its own (a window of
/// `window_mib`): what the guest printed (its JSON), or an error with it when the command
/// failed.
pub fn bench_in_vm(
    image: &Path,
    (bench, channels): (&str, &str),
    (round_trips, size, reps): (usize, u64, usize),
    window_mib: u64,
    timeout: Duration,
) -> Result<String, CliError> {
    let mut args: Vec<String> = ["bench", bench, "--socket", "vm", "--channels", channels]
        .iter()
        .map(|s| s.to_string())
        .collect();
    for (flag, v) in [
        ("--round-trips", round_trips.to_string()),
        ("--size", size.to_string()),
        ("--reps", reps.to_string()),
    ] {
        args.extend([flag.to_string(), v]);
    }
    args.push("--json".into());
    let out = run(&VmRun {
        image: image.to_path_buf(),
        endpoint: None,
        window_mib,
        accel: "tcg".into(),
        memory_mib: 512,
        timeout,
        args,
        echo: false,
    })?;
    if out.exit != Some(0) {
        return Err(CliError::Usage(format!(
            "VM {bench} run failed:\n{}",
            out.output
        )));
    }
    Ok(out.output)
}

/// What the guest command did.
#[derive(Debug, Clone)]
pub struct VmOutcome {
    /// Exit status of the command inside the guest (`None`: the guest never reported one).
    pub exit: Option<i32>,
    /// What the command printed (between the markers).
    pub output: String,
    /// Wall time from QEMU start to exit.
    pub wall: Duration,
}

/// Encodes arguments for the kernel command line.
pub fn encode_args(args: &[String]) -> String {
    args.join("\u{1f}")
        .bytes()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Decodes `$VIRTSOC_ARGS_HEX`.
pub fn decode_args(hex: &str) -> Option<Vec<String>> {
    if hex.is_empty() || !hex.len().is_multiple_of(2) {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect();
    let s = String::from_utf8(bytes?).ok()?;
    Some(s.split('\u{1f}').map(str::to_string).collect())
}

fn qemu_command(r: &VmRun, shm: &Path, doorbell: &Path) -> Result<Command, CliError> {
    // The uncompressed kernel boots directly (PVH) where the image has it: the bzImage's
    // decompressor costs seconds of emulated CPU under TCG.
    let kernel = Some(r.image.join("vmlinux"))
        .filter(|k| k.is_file())
        .unwrap_or_else(|| r.image.join("vmlinuz"));
    let initrd = r.image.join("initramfs.cpio.gz");
    if !kernel.exists() || !initrd.exists() {
        return Err(CliError::Usage(format!(
            "no guest image in {} (run scripts/build-guest-image.sh {} target/release/virtsoc)",
            r.image.display(),
            r.image.display()
        )));
    }
    let mut c = Command::new("qemu-system-x86_64");
    match r.accel.as_str() {
        "tcg" => c.args(["-accel", "tcg", "-cpu", "max"]),
        "kvm" => c.args(["-accel", "kvm", "-cpu", "host"]),
        other => {
            return Err(CliError::Usage(format!(
                "--accel must be tcg or kvm, not {other}"
            )))
        }
    };
    c.args([
        "-m",
        &r.memory_mib.to_string(),
        "-smp",
        "1",
        "-nographic",
        "-no-reboot",
    ])
    .arg("-kernel")
    .arg(kernel)
    .arg("-initrd")
    .arg(initrd)
    .arg("-append")
    .arg(format!(
        "console=ttyS0 quiet panic=-1 virtsoc.args={}",
        encode_args(&r.args)
    ))
    .arg("-object")
    .arg(format!(
        "memory-backend-file,id=shm,mem-path={},size={}M,share=on",
        shm.display(),
        r.window_mib
    ))
    .args([
        "-device",
        "ivshmem-plain,memdev=shm",
        "-device",
        "virtio-serial-pci",
    ])
    .arg("-chardev")
    .arg(format!("socket,id=c0,path={}", doorbell.display()))
    .args(["-device", "virtserialport,chardev=c0,name=virtsoc.0"]);
    c.stdin(Stdio::null()).stdout(Stdio::piped());
    // QEMU ends with this process: a `vm run` killed from outside (a benchmark's time limit)
    // leaves no VM behind.
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure makes one async-signal-safe system call (prctl) between fork and
    // exec, touching no memory of the parent.
    unsafe {
        c.pre_exec(|| {
            rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))
                .map_err(std::io::Error::from)
        });
    }
    Ok(c)
}

/// Boots the VM, runs the command, shuts the VM down.
pub fn run(r: &VmRun) -> Result<VmOutcome, CliError> {
    let mut own = None;
    let (shm, doorbell) = match &r.endpoint {
        Some((s, d)) => (s.clone(), d.clone()),
        None => {
            let dir = std::env::temp_dir();
            let tag = format!(
                "{}-{}",
                std::process::id(),
                Instant::now().elapsed().as_nanos()
            );
            let shm = dir.join(format!("virtsoc-vm-{tag}.shm"));
            let sock = dir.join(format!("virtsoc-vm-{tag}.sock"));
            let spec = format!("vm0:{}:{}:{}", shm.display(), sock.display(), r.window_mib);
            own = Some(DaemonProcess::spawn(&["--vm", &spec], false)?);
            (shm, sock)
        }
    };
    let t0 = Instant::now();
    let mut child = qemu_command(r, &shm, &doorbell)?.spawn().map_err(|e| {
        CliError::Usage(format!(
            "cannot start qemu-system-x86_64 (apt install qemu-system-x86): {e}"
        ))
    })?;
    eprintln!("VM-PID {}", child.id());
    let (tx, rx) = mpsc::channel();
    let out = child.stdout.take().expect("piped stdout");
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    let deadline = t0 + r.timeout;
    let (mut inside, mut output, mut exit) = (false, String::new(), None);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => {
                let line = line.trim_end_matches('\r');
                if line.contains(BEGIN) {
                    inside = true;
                } else if let Some(code) = line.split(EXIT).nth(1) {
                    exit = code.trim().parse().ok();
                    inside = false;
                } else if inside {
                    if r.echo {
                        println!("{line}");
                    }
                    output.push_str(line);
                    output.push('\n');
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(CliError::Usage(format!(
                    "the VM did not finish within {:?}; output so far:\n{output}",
                    r.timeout
                )));
            }
        }
    }
    let _ = child.wait();
    let wall = t0.elapsed();
    if let Some(d) = own {
        d.stop()?;
    }
    Ok(VmOutcome { exit, output, wall })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn args_round_trip() {
        let a: Vec<String> = [
            "bench",
            "svm",
            "--protocol",
            "guest-staging,prefetch",
            "a b",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(decode_args(&encode_args(&a)).unwrap(), a);
        assert!(decode_args("abc").is_none());
        assert!(decode_args("zz").is_none());
    }
}
