//! Workers started ahead: opening a decoder (or the ISP's first conversion, or the one after
//! a worker died) takes a worker that is already running (sandboxed, waiting for its first
//! message), and a thread of its own starts the next one, so a guest's command does not
//! wait for a process start on the device's thread.

use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::error::{MediaError, Result};
use virtsoc_sync::LockExt;

/// Workers kept waiting by default.
pub const DEFAULT_SPARE: usize = 2;

/// The program workers run, and the workers waiting for their first call.
pub struct WorkerPool {
    program: PathBuf,
    args: Vec<String>,
    spare: usize,
    idle: Mutex<Vec<(Child, UnixStream)>>,
    /// Workers being started for `idle`.
    starting: AtomicUsize,
}

impl WorkerPool {
    /// A pool of `program args...` workers (the program must serve its stdin, as
    /// [`serve_decoder`](crate::codec::serve_decoder) and
    /// [`serve_isp`](crate::isp::serve_isp) do), keeping `spare` of them waiting (started
    /// now).
    pub fn new(program: &Path, args: &[String], spare: usize) -> Arc<WorkerPool> {
        let pool = Arc::new(WorkerPool {
            program: program.to_path_buf(),
            args: args.to_vec(),
            spare,
            idle: Mutex::new(Vec::new()),
            starting: AtomicUsize::new(0),
        });
        for _ in 0..spare {
            match pool.start() {
                Ok(w) => pool.idle().push(w),
                Err(e) => log::warn!("{e}"),
            }
        }
        pool
    }

    fn idle(&self) -> std::sync::MutexGuard<'_, Vec<(Child, UnixStream)>> {
        self.idle.lock_or_recover()
    }

    /// Starts one worker.
    pub(crate) fn start(&self) -> Result<(Child, UnixStream)> {
        let (ours, theirs) = UnixStream::pair()
            .map_err(|e| MediaError::Resources(format!("socketpair for a worker: {e}")))?;
        let child = Command::new(&self.program)
            .args(&self.args)
            .stdin(Stdio::from(OwnedFd::from(theirs)))
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| {
                MediaError::Resources(format!(
                    "cannot start worker {}: {e}",
                    self.program.display()
                ))
            })?;
        Ok((child, ours))
    }

    /// A worker for a new decoder (or ISP worker): a waiting one, else one started now. Starts its
    /// replacement in the background.
    pub(crate) fn take(self: &Arc<Self>) -> Result<(Child, UnixStream)> {
        let waiting = self.idle().pop();
        self.refill();
        match waiting {
            Some(w) => Ok(w),
            None => self.start(),
        }
    }

    /// Starts workers in the background until `spare` are waiting or starting.
    fn refill(self: &Arc<Self>) {
        while self.idle().len() + self.starting.load(Ordering::SeqCst) < self.spare {
            self.starting.fetch_add(1, Ordering::SeqCst);
            let pool = self.clone();
            let started = std::thread::Builder::new()
                .name("worker-pool".into())
                .spawn(move || {
                    match pool.start() {
                        Ok(w) => pool.idle().push(w),
                        Err(e) => log::warn!("{e}"),
                    }
                    pool.starting.fetch_sub(1, Ordering::SeqCst);
                });
            if started.is_err() {
                // No thread now: the next taker starts its worker itself.
                self.starting.fetch_sub(1, Ordering::SeqCst);
                return;
            }
        }
    }

    /// Workers waiting now.
    pub fn waiting(&self) -> usize {
        self.idle().len()
    }
}

impl Drop for WorkerPool {
    fn drop(&mut self) {
        for (mut child, sock) in self.idle().drain(..) {
            drop(sock);
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
