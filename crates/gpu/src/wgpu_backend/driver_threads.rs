//! The worker threads of a CPU Vulkan driver. On Mesa's lavapipe the "GPU" is the CPU: its
//! rasterizer threads (`llvmpipe-N`) run every submission, and they compete for the cores
//! with the devices that are CPU-side anyway (codec, ISP, camera, display). One guest's large
//! composition would then take every core from another guest's camera pipeline, which a GPU,
//! being separate hardware, never does. [`WgpuBackend::renice_cpu_driver_threads`] lowers
//! those threads' CPU priority (nice), so CPU-side devices are served first and the emulated
//! GPU gets the rest - all of it when nothing else runs. Shares of the GPU between guests are
//! the GPU scheduler's business, not this one's.

use std::io;

use super::WgpuBackend;

/// Name prefixes of CPU drivers' worker threads (Mesa's llvmpipe/lavapipe).
pub const CPU_DRIVER_THREADS: &[&str] = &["llvmpipe-"];

/// Sets the nice value of every thread of this process whose name starts with one of
/// `prefixes`; returns how many threads were changed.
fn renice_threads(prefixes: &[&str], nice: i32) -> io::Result<usize> {
    let mut changed = 0;
    for entry in std::fs::read_dir("/proc/self/task")? {
        let entry = entry?;
        let Some(tid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        // A thread that ended since the listing has no comm: skip it.
        let Ok(comm) = std::fs::read_to_string(entry.path().join("comm")) else {
            continue;
        };
        if !prefixes.iter().any(|p| comm.trim_end().starts_with(p)) {
            continue;
        }
        let pid = rustix::process::Pid::from_raw(tid).ok_or(io::ErrorKind::InvalidData)?;
        rustix::process::setpriority_process(Some(pid), nice)?;
        changed += 1;
    }
    Ok(changed)
}

impl WgpuBackend {
    /// Whether the adapter is a CPU driver (lavapipe, SwiftShader, WARP).
    pub fn is_cpu_driver(&self) -> bool {
        self.info.device_type == "Cpu"
    }

    /// On a CPU driver, sets the nice value of its worker threads ([`CPU_DRIVER_THREADS`];
    /// see the module docs) to `nice` and returns how many there were; on a GPU, does
    /// nothing and returns 0. Raising nice needs no privilege; lowering it below the
    /// process's own does.
    pub fn renice_cpu_driver_threads(&self, nice: i32) -> io::Result<usize> {
        if !self.is_cpu_driver() {
            return Ok(0);
        }
        renice_threads(CPU_DRIVER_THREADS, nice)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A named thread of this process is found and reniced; others are not touched.
    #[test]
    fn named_threads_are_reniced() {
        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::Builder::new()
            .name("vs-nicetest".into())
            .spawn(move || {
                tx.send(rustix::thread::gettid()).unwrap();
                done_rx.recv().unwrap();
            })
            .unwrap();
        let tid = rx.recv().unwrap();
        assert_eq!(renice_threads(&["vs-nicetest"], 7).unwrap(), 1);
        assert_eq!(rustix::process::getpriority_process(Some(tid)).unwrap(), 7);
        assert_eq!(renice_threads(&["no-such-thread-"], 7).unwrap(), 0);
        let me = rustix::thread::gettid();
        assert_eq!(rustix::process::getpriority_process(Some(me)).unwrap(), 0);
        done_tx.send(()).unwrap();
        t.join().unwrap();
    }
}
