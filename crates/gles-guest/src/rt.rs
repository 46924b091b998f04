//! The runtime the EGL and GL halves of the vendor library share: the connection's command
//! stream ([`Stream`]) and each thread's current context ([`Context`], [`current`]).
//!
//! GL entry points encode into the stream of the calling thread's current context
//! ([`Stream::encoder`] inserts `SET_CONTEXT` when the stream last spoke for another
//! context); the stream is flushed as one batch ([`Channel::exec`]) at `glFlush`,
//! `glFinish`, swap, a call with a result ([`Stream::round_trip`]) and when it grows past
//! [`FLUSH_AT`] bytes.

use std::cell::RefCell;
use std::sync::{Arc, Mutex, MutexGuard};

use virtsoc_gles_stream::{egl, Encoder};
use virtsoc_sync::LockExt;

/// A batch is flushed once it holds this many bytes.
pub const FLUSH_AT: usize = 256 << 10;

/// Why a batch did not run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChannelError {
    /// The host context is gone (the render worker died, the daemon went away): every
    /// later call of the context fails; EGL answers `EGL_CONTEXT_LOST`.
    #[error("context lost: {0}")]
    Lost(String),
    /// The batch was refused (too large, malformed); the stream goes on.
    #[error("batch refused: {0}")]
    Refused(String),
}

/// Where batches go: the transport to the daemon's `gles` device (or, in tests, straight
/// into a host decoder).
pub trait Channel: Send + Sync {
    /// Runs one batch of whole packets on the host. With `wait`, blocks until the host ran
    /// it and returns its reply bytes (the answers of the calls with results, in order);
    /// without, returns an empty reply at once (a failure then surfaces at the next waited
    /// batch).
    fn exec(&self, batch: &[u8], wait: bool) -> Result<Vec<u8>, ChannelError>;
}

/// One connection's command stream.
pub struct Stream {
    enc: Encoder,
    /// The context the stream's packets currently run on (the last `SET_CONTEXT`).
    on_ctx: u32,
    channel: Arc<dyn Channel>,
    lost: Option<String>,
}

impl Stream {
    /// An empty stream sending its batches to `channel`.
    pub fn new(channel: Arc<dyn Channel>) -> Self {
        Stream {
            enc: Encoder::with_capacity(FLUSH_AT + (64 << 10)),
            on_ctx: 0,
            channel,
            lost: None,
        }
    }

    /// The encoder to append packets of context `ctx` to: flushes first when the batch is
    /// full, and switches the stream to `ctx` when it spoke for another context.
    pub fn encoder(&mut self, ctx: u32) -> &mut Encoder {
        if self.enc.len() >= FLUSH_AT {
            // A failure is kept in `lost` / surfaces at the next waited batch.
            let _ = self.flush();
        }
        if self.on_ctx != ctx {
            self.enc.packet(egl::SET_CONTEXT).u32(ctx);
            self.on_ctx = ctx;
        }
        &mut self.enc
    }

    /// The encoder for EGL packets that name their objects themselves (they need no
    /// `SET_CONTEXT`): flushes first when the batch is full.
    pub fn egl_encoder(&mut self) -> &mut Encoder {
        if self.enc.len() >= FLUSH_AT {
            // A failure is kept in `lost` / surfaces at the next waited batch.
            let _ = self.flush();
        }
        &mut self.enc
    }

    /// Records that the host's packets now run on `ctx` (a `MAKE_CURRENT` just encoded
    /// switched it).
    pub fn switched_to(&mut self, ctx: u32) {
        self.on_ctx = ctx;
    }

    /// Sends what is encoded without waiting for it.
    pub fn flush(&mut self) -> Result<(), ChannelError> {
        self.send(false).map(|_| ())
    }

    /// Sends what is encoded, ended by a `glFinish` on context `ctx`, without waiting: the
    /// batch completes on the host only once the host's GL has finished the work before it
    /// (a GL that defers its rendering, as llvmpipe and every tiler do, has then drawn it),
    /// so what the queue runs after this batch - a fence sync's signal - follows the GL's
    /// completion, not only its submission.
    pub fn flush_finished(&mut self, ctx: u32) -> Result<(), ChannelError> {
        self.encoder(ctx)
            .packet(virtsoc_gles_stream::gl_ops::glFinish);
        self.flush()
    }

    /// Sends what is encoded and waits for it to run: the reply bytes of its calls with
    /// results.
    pub fn round_trip(&mut self) -> Result<Vec<u8>, ChannelError> {
        self.send(true)
    }

    /// Why the stream's host side is gone, once it is.
    pub fn lost(&self) -> Option<&str> {
        self.lost.as_deref()
    }

    fn send(&mut self, wait: bool) -> Result<Vec<u8>, ChannelError> {
        if let Some(why) = &self.lost {
            self.enc.clear();
            return Err(ChannelError::Lost(why.clone()));
        }
        if self.enc.is_empty() && !wait {
            return Ok(Vec::new());
        }
        let r = self.channel.exec(self.enc.as_bytes(), wait);
        self.enc.clear();
        if let Err(ChannelError::Lost(why)) = &r {
            self.lost = Some(why.clone());
        }
        r
    }
}

/// A guest GL context as the GL entry points see it.
pub struct Context {
    /// The context's id in the stream (`SET_CONTEXT`), never 0.
    pub id: u32,
    /// The stream of the connection the context belongs to.
    pub stream: Arc<Mutex<Stream>>,
    /// The guest-side GL state (see [`crate::gl`]).
    pub gl: Mutex<crate::gl::GlState>,
}

impl Context {
    /// The stream, locked (a poisoned lock is taken over: the stream holds whole packets).
    pub fn stream(&self) -> MutexGuard<'_, Stream> {
        self.stream.lock_or_recover()
    }

    /// The GL state, locked.
    pub fn gl(&self) -> MutexGuard<'_, crate::gl::GlState> {
        self.gl.lock_or_recover()
    }
}

thread_local! {
    static CURRENT: RefCell<Option<Arc<Context>>> = const { RefCell::new(None) };
}

/// Makes `ctx` the calling thread's current context (`None`: no context).
pub fn make_current(ctx: Option<Arc<Context>>) {
    CURRENT.with(|c| *c.borrow_mut() = ctx);
}

/// The calling thread's current context.
pub fn current() -> Option<Arc<Context>> {
    CURRENT.with(|c| c.borrow().clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use virtsoc_gles_stream::{gl_ops, Reader};

    /// A channel keeping every batch and whether it was waited for.
    #[derive(Default)]
    struct Recorder(Mutex<Vec<(Vec<u8>, bool)>>);

    impl Channel for Recorder {
        fn exec(&self, batch: &[u8], wait: bool) -> Result<Vec<u8>, ChannelError> {
            self.0.lock_or_recover().push((batch.to_vec(), wait));
            Ok(Vec::new())
        }
    }

    fn ops(batch: &[u8]) -> Vec<u32> {
        let mut r = Reader::new(batch);
        std::iter::from_fn(|| r.next_packet())
            .map(|p| p.map(|(op, _)| op).expect("whole packets"))
            .collect()
    }

    #[test]
    fn a_finished_flush_ends_its_batch_with_a_finish_and_does_not_wait() {
        let rec = Arc::new(Recorder::default());
        let mut s = Stream::new(rec.clone());
        s.encoder(3).packet(gl_ops::glFlush);
        s.flush_finished(3).unwrap();
        // Nothing left to send: the finish still goes (it covers batches already sent).
        s.flush_finished(3).unwrap();
        s.flush().unwrap();
        let batches = rec.0.lock_or_recover().clone();
        assert_eq!(batches.len(), 2, "an empty plain flush sends nothing");
        assert_eq!(
            ops(&batches[0].0),
            [egl::SET_CONTEXT, gl_ops::glFlush, gl_ops::glFinish]
        );
        assert_eq!(ops(&batches[1].0), [gl_ops::glFinish]);
        assert!(batches.iter().all(|(_, wait)| !wait));
    }
}
