//! The worker threads of a CPU Vulkan driver. On Mesa's lavapipe the "GPU" is the CPU: its
//! rasterizer threads (`llvmpipe-N`) and its compute pool (unnamed threads made with the
//! device) run every submission, and they compete for the cores
//! with the devices that are CPU-side anyway (codec, ISP, camera, display). One guest's large
//! composition would then take every core from another guest's camera pipeline, which a GPU,
//! being separate hardware, never does. [`WgpuBackend::renice_cpu_driver_threads`] lowers
//! those threads' CPU priority (nice), so CPU-side devices are served first and the emulated
//! GPU gets the rest. Shares of the GPU between guests are the GPU scheduler's business, not
//! this one's.
//!
//! How low is a trade. The rasterizers split each submission between them and meet at its
//! end, and the threads that feed them (the device's worker, the completion poller, the
//! connection threads, the guests) run at the default priority. The lower their weight, the
//! longer a rasterizer woken for the next submission waits behind such a thread while the
//! other core, its half done, idles. Measured with two guests composing (daemon's default
//! is nice 3, `perf sched` over 2 s; docs/results.md, stop 23):
//!
//! | nice | rasterizers' wait for a core per wake-up | their run time | cores idle |
//! |---|---|---|---|
//! | 0 | 0.03 ms | 2.56 s | 11% |
//! | 3 | 0.04 ms | 2.50 s | 14% |
//! | 5 | 0.06 ms | 2.38 s | 16% |
//! | 10 | 0.13-0.15 ms | 1.98 s | 31% |
//!
//! So "all of it when nothing else runs" held only near the default priority: at nice 10 a
//! third of the machine sat idle under GPU work alone.

use std::io;

use super::WgpuBackend;

/// Name prefixes of CPU drivers' worker threads (Mesa's llvmpipe/lavapipe).
pub const CPU_DRIVER_THREADS: &[&str] = &["llvmpipe-"];

/// The ids of this process's threads.
pub(super) fn thread_ids() -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect()
}

/// Thread `tid`'s name, if it still runs.
fn thread_name(tid: i32) -> Option<String> {
    let comm = std::fs::read_to_string(format!("/proc/self/task/{tid}/comm")).ok()?;
    Some(comm.trim_end().to_string())
}

/// The threads in `after` but not in `before` that are not ours (named `virtsoc-`): those
/// the driver made while the device was created.
pub(super) fn made_by_driver(before: &[i32], after: &[i32]) -> Vec<i32> {
    after
        .iter()
        .copied()
        .filter(|t| !before.contains(t))
        .filter(|t| thread_name(*t).is_some_and(|n| !n.starts_with("virtsoc-")))
        .collect()
}

/// Sets the nice value of every thread of this process whose name starts with one of
/// `prefixes`, and of the threads `tids` still running, where it is lower; returns how
/// many were changed.
fn renice_threads(prefixes: &[&str], tids: &[i32], nice: i32) -> io::Result<usize> {
    let mut changed = 0;
    for tid in thread_ids() {
        // A thread that ended since the listing has no name: skip it.
        let Some(name) = thread_name(tid) else {
            continue;
        };
        if !tids.contains(&tid) && !prefixes.iter().any(|p| name.starts_with(p)) {
            continue;
        }
        let pid = rustix::process::Pid::from_raw(tid).ok_or(io::ErrorKind::InvalidData)?;
        // Never raise a thread's priority (Mesa's disk-cache writer runs at nice 19).
        if rustix::process::getpriority_process(Some(pid)).is_ok_and(|p| p >= nice) {
            continue;
        }
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

    /// On a CPU driver, its worker threads that still run (named [`CPU_DRIVER_THREADS`], or
    /// made by the driver while this backend's device was created); none on a GPU.
    pub fn cpu_driver_threads(&self) -> Vec<u32> {
        if !self.is_cpu_driver() {
            return Vec::new();
        }
        thread_ids()
            .into_iter()
            .filter(|t| {
                self.driver_threads.contains(t)
                    || thread_name(*t)
                        .is_some_and(|n| CPU_DRIVER_THREADS.iter().any(|p| n.starts_with(p)))
            })
            .filter_map(|t| u32::try_from(t).ok())
            .collect()
    }

    /// On a CPU driver, sets the nice value of its worker threads (named
    /// [`CPU_DRIVER_THREADS`], or made by the driver while this backend's device was created;
    /// see the module docs) to `nice` and returns how many there were; on a GPU, does
    /// nothing and returns 0. Raising nice needs no privilege; lowering it below the
    /// process's own does.
    pub fn renice_cpu_driver_threads(&self, nice: i32) -> io::Result<usize> {
        if !self.is_cpu_driver() {
            return Ok(0);
        }
        renice_threads(CPU_DRIVER_THREADS, &self.driver_threads, nice)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A named thread of this process is found and reniced; others are not touched.
    #[test]
    fn named_threads_are_reniced() {
        // The test process may itself run niced (`nice make test`): the thread that is not
        // touched keeps whatever it started with.
        let me = rustix::thread::gettid();
        let mine = rustix::process::getpriority_process(Some(me)).unwrap();
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
        // Nice values above the one the threads start with (`nice` makes it 10), as a thread
        // is never moved to a lower one.
        let (a, b) = (mine + 2, mine + 4);
        assert!(
            b <= 19,
            "the test needs to start at nice 15 or less, not {mine}"
        );
        assert_eq!(renice_threads(&["vs-nicetest"], &[], a).unwrap(), 1);
        assert_eq!(rustix::process::getpriority_process(Some(tid)).unwrap(), a);
        assert_eq!(renice_threads(&["no-such-thread-"], &[], a).unwrap(), 0);
        // By id, whatever its name; never to a lower nice value.
        let raw = tid.as_raw_nonzero().get();
        assert_eq!(renice_threads(&[], &[raw], b).unwrap(), 1);
        assert_eq!(rustix::process::getpriority_process(Some(tid)).unwrap(), b);
        assert_eq!(renice_threads(&[], &[raw], a).unwrap(), 0);
        assert_eq!(rustix::process::getpriority_process(Some(tid)).unwrap(), b);
        assert_eq!(
            rustix::process::getpriority_process(Some(me)).unwrap(),
            mine
        );
        done_tx.send(()).unwrap();
        t.join().unwrap();
    }
}
