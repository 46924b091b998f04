//! Running declared device commands in either ordering mode.
//!
//! - `atomic`: every begin_access, command and end_access waits for its completion, and the
//!   next device's work starts only after the previous device finished (today's emulators).
//! - `fence`: the commands of a frame are queued with a virtual fence between consecutive
//!   devices (signal on the producer's queue, wait on the consumer's); the guest never waits
//!   in between and collects results later.

use std::time::Duration;

use virtsoc_guest::{
    AccessMode, Completion, Connection, DeviceCommand, DeviceId, Opcode, RegionId,
};

use crate::bench_svm::OrderingMode;
use crate::CliError;

/// The size of region `id` of `conn`'s guest.
pub fn region_size(conn: &Connection, id: RegionId) -> Result<u64, CliError> {
    conn.region(id)
        .map(|r| r.size)
        .ok_or_else(|| CliError::Usage(format!("region {id} not allocated here")))
}

/// The arguments of a begin_access or end_access of all of region `id` in `mode`.
pub fn access_args(
    conn: &Connection,
    id: RegionId,
    mode: AccessMode,
) -> Result<[u64; 6], CliError> {
    Ok([u64::from(id), 0, region_size(conn, id)?, mode as u64, 0, 0])
}

/// An error naming `what` if completion `c` failed.
pub fn check_completion(c: &Completion, what: &str) -> Result<(), CliError> {
    if c.status == 0 {
        return Ok(());
    }
    let st = virtsoc_guest::Status::from_u32(c.status).unwrap_or(virtsoc_guest::Status::Internal);
    Err(CliError::Usage(format!("{what} failed: {}", st.message())))
}

/// An error if a request `conn` queued without waiting for its answer failed.
pub fn check_async_errors(conn: &Connection) -> Result<(), CliError> {
    match conn.take_async_errors().first() {
        Some((seq, st)) => Err(CliError::Usage(format!(
            "request {seq} failed: {}",
            st.message()
        ))),
        None => Ok(()),
    }
}

/// A command whose results come later (fence mode) or are already here (atomic mode).
pub enum Ticket<R> {
    Ready(R),
    Pending(u64, fn(&[u64; 6]) -> R),
}

/// Drives one guest's device commands.
pub struct Pipe<'a> {
    pub conn: &'a Connection,
    pub ordering: OrderingMode,
    /// Host-side duration of read accesses' begin_access (SVM access latency), in us.
    pub access_us: Vec<f64>,
    /// Reads whose begin_access completion is still to be collected (fence mode), by frame.
    pending_reads: std::collections::VecDeque<Vec<u64>>,
    /// Device whose queue the next command must wait behind, with the fence.
    after: Option<(DeviceId, virtsoc_guest::conn::Fence)>,
}

impl<'a> Pipe<'a> {
    pub fn new(conn: &'a Connection, ordering: OrderingMode) -> Self {
        Pipe {
            conn,
            ordering,
            access_us: Vec::new(),
            pending_reads: std::collections::VecDeque::from([Vec::new()]),
            after: None,
        }
    }

    /// Runs `cmd` with its declared regions bracketed by begin/end_access on its device.
    /// In fence mode, the command first waits (on its device's queue) for the device of the
    /// previous command, and then signals a fence for the next one.
    pub fn run<C: DeviceCommand + 'static>(
        &mut self,
        cmd: &C,
    ) -> Result<Ticket<C::Reply>, CliError> {
        self.run_with(cmd, &[])
    }

    /// Like [`run`](Self::run), also bracketing regions the command names indirectly (the
    /// sources inside a GPU layer list) as reads.
    pub fn run_with<C: DeviceCommand + 'static>(
        &mut self,
        cmd: &C,
        also_read: &[RegionId],
    ) -> Result<Ticket<C::Reply>, CliError> {
        let dev = C::DEVICE;
        let mut regions = cmd.regions();
        regions.extend(also_read.iter().map(|id| (*id, AccessMode::Read)));
        match self.ordering {
            OrderingMode::Atomic => {
                for (id, mode) in &regions {
                    let a =
                        self.conn
                            .begin_access(*id, dev, 0, region_size(self.conn, *id)?, *mode)?;
                    if mode.reads() {
                        self.access_us.push(a.host_elapsed.as_secs_f64() * 1e6);
                    }
                }
                let reply = self.conn.command(cmd)?;
                for (id, mode) in &regions {
                    self.conn
                        .end_access(*id, dev, 0, region_size(self.conn, *id)?, *mode)?;
                }
                Ok(Ticket::Ready(reply))
            }
            OrderingMode::Fence => {
                if let Some((prev, f)) = self.after.take() {
                    if prev != dev {
                        self.conn.fence_wait(dev, f)?;
                    }
                    self.conn.fence_release(f)?;
                }
                for (id, mode) in &regions {
                    let args = access_args(self.conn, *id, *mode)?;
                    if mode.reads() {
                        let seq = self.conn.submit(Opcode::BeginAccess, dev, args)?;
                        if let Some(cur) = self.pending_reads.back_mut() {
                            cur.push(seq);
                        }
                    } else {
                        self.conn.submit_detached(Opcode::BeginAccess, dev, args)?;
                    }
                }
                let seq = self.conn.submit(Opcode::DeviceCmd, dev, cmd.encode())?;
                for (id, mode) in &regions {
                    let args = access_args(self.conn, *id, *mode)?;
                    self.conn.submit_detached(Opcode::EndAccess, dev, args)?;
                }
                let f = self.conn.fence_create()?;
                self.conn.fence_signal(dev, f)?;
                self.after = Some((dev, f));
                Ok(Ticket::Pending(seq, C::reply))
            }
        }
    }

    /// The results of a command (waits in fence mode).
    pub fn result<R>(&mut self, t: Ticket<R>) -> Result<R, CliError> {
        match t {
            Ticket::Ready(r) => Ok(r),
            Ticket::Pending(seq, decode) => {
                let c = self.conn.wait(seq)?;
                check_completion(&c, "device command")?;
                Ok(decode(&c.values))
            }
        }
    }

    /// Ends a frame: forgets the inter-device fence and collects the read latencies of all
    /// but the last `keep` frames (fence mode keeps frames in flight).
    pub fn end_frame(&mut self, keep: usize) -> Result<(), CliError> {
        if let Some((_, f)) = self.after.take() {
            self.conn.fence_release(f)?;
        }
        while self.pending_reads.len() > keep {
            let Some(frame) = self.pending_reads.pop_front() else {
                break;
            };
            for seq in frame {
                let c = self.conn.wait(seq)?;
                if c.status == 0 {
                    self.access_us
                        .push(Duration::from_nanos(c.values[4]).as_secs_f64() * 1e6);
                }
            }
        }
        self.pending_reads.push_back(Vec::new());
        check_async_errors(self.conn)
    }

    /// Writes `bytes` into region `id` from the CPU.
    pub fn cpu_write(&self, id: RegionId, bytes: &[u8]) -> Result<(), CliError> {
        let len = bytes.len() as u64;
        let a = self
            .conn
            .begin_access(id, DeviceId::CPU, 0, len, AccessMode::Write)?;
        let ptr = a
            .ptr
            .ok_or_else(|| CliError::Usage("no CPU pointer".into()))?;
        // SAFETY: the library bounds-checked [ptr, ptr + len) inside the window.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), ptr.as_ptr(), bytes.len()) };
        self.conn
            .end_access(id, DeviceId::CPU, 0, len, AccessMode::Write)?;
        Ok(())
    }
}
