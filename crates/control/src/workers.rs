//! The threads that answer control requests: started on demand up to the requests in flight,
//! kept while requests keep coming (an idle one ends after [`IDLE_KEEP`]). A live view pulls
//! ten frames a second; a thread (and its allocator arena, warm with the last frame's
//! buffers) per request cost the daemon more than composing the frame.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use virtsoc_sync::{CondvarExt, LockExt};

/// How long a worker with nothing to do waits for another request before it ends.
pub const IDLE_KEEP: Duration = Duration::from_secs(30);

/// A request to answer.
pub type Job = Box<dyn FnOnce() + Send>;

#[derive(Default)]
struct State {
    queue: VecDeque<Job>,
    /// Workers waiting for a job.
    idle: usize,
}

/// An elastic pool of request threads.
#[derive(Default)]
pub struct Workers {
    state: Mutex<State>,
    cv: Condvar,
}

impl Workers {
    /// Runs `job` on an idle worker, or on a new one; `Err` gives it back when no thread could
    /// be started.
    pub fn run(self: &Arc<Self>, job: Job) -> Result<(), (Job, std::io::Error)> {
        let mut st = self.state.lock_or_recover();
        if st.idle > st.queue.len() {
            st.queue.push_back(job);
            self.cv.notify_one();
            return Ok(());
        }
        drop(st);
        let me = self.clone();
        // The job moves into the thread only once it exists.
        let slot = Arc::new(Mutex::new(Some(job)));
        let taken = slot.clone();
        let spawned = std::thread::Builder::new()
            .name("control-req".into())
            .spawn(move || {
                let first = taken.lock_or_recover().take();
                me.serve(first)
            });
        match spawned {
            Ok(_) => Ok(()),
            Err(e) => match slot.lock_or_recover().take() {
                Some(job) => Err((job, e)),
                None => Ok(()),
            },
        }
    }

    fn serve(&self, first: Option<Job>) {
        if let Some(job) = first {
            job();
        }
        let mut st = self.state.lock_or_recover();
        loop {
            if let Some(job) = st.queue.pop_front() {
                drop(st);
                job();
                st = self.state.lock_or_recover();
                continue;
            }
            st.idle += 1;
            let (g, wait) = self.cv.wait_timeout_or_recover(st, IDLE_KEEP);
            st = g;
            st.idle -= 1;
            if wait.timed_out() && st.queue.is_empty() {
                return;
            }
        }
    }

    /// Workers waiting for a job.
    pub fn idle(&self) -> usize {
        self.state.lock_or_recover().idle
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::channel;

    /// Jobs run; a worker that finished takes the next job instead of a new thread starting.
    #[test]
    fn idle_workers_take_the_next_jobs() {
        let w = Arc::new(Workers::default());
        let (tx, rx) = channel();
        for k in 0..3 {
            let tx = tx.clone();
            w.run(Box::new(move || {
                tx.send((k, std::thread::current().id())).unwrap();
            }))
            .map_err(|e| e.1)
            .unwrap();
            let (got, _) = rx.recv_timeout(Duration::from_secs(10)).unwrap();
            assert_eq!(got, k);
            // Wait until the worker is idle again, so the next job goes to it.
            while w.idle() == 0 {
                std::thread::yield_now();
            }
        }
        let first = {
            let tx = tx.clone();
            w.run(Box::new(move || {
                tx.send((9, std::thread::current().id())).unwrap()
            }))
            .map_err(|e| e.1)
            .unwrap();
            rx.recv_timeout(Duration::from_secs(10)).unwrap().1
        };
        while w.idle() == 0 {
            std::thread::yield_now();
        }
        w.run(Box::new(move || {
            tx.send((10, std::thread::current().id())).unwrap()
        }))
        .map_err(|e| e.1)
        .unwrap();
        assert_eq!(rx.recv_timeout(Duration::from_secs(10)).unwrap().1, first);
    }
}
