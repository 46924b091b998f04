//! The daemon's own packets that work on shared replicas ([`crate::mapped`]): MAP and
//! UNMAP, a guest batch run where the SVM put it (EXEC_MAPPED), a present into a frame
//! region's replica (PRESENT) and an image import read in place (IMPORT_MAPPED). A guest's
//! stream cannot carry them (the worker refuses them in an untrusted batch).

use virtsoc_gles_stream::{egl, Encoder, Reader, StreamError};

use crate::worker::{answer, Renderer, MAX_BATCH};

/// Whether `op` is one of the daemon's packets handled here.
pub fn is_daemons(op: u32) -> bool {
    matches!(
        op,
        egl::MAP | egl::UNMAP | egl::EXEC_MAPPED | egl::PRESENT | egl::IMPORT_MAPPED
    )
}

impl Renderer {
    /// Runs one of the daemon's packets ([`is_daemons`]).
    pub(crate) fn daemon_packet(
        &mut self,
        op: u32,
        p: &mut Reader<'_>,
        reply: &mut Encoder,
    ) -> Result<(), StreamError> {
        match op {
            egl::MAP => {
                let (handle, bytes) = (p.u32()?, p.u64()?);
                let fd = self
                    .incoming
                    .pop_front()
                    .ok_or_else(|| p.bad("MAP without a descriptor"))?;
                self.mappings
                    .map(handle, fd, bytes)
                    .map_err(|e| p.bad(e.to_string()))?;
            }
            egl::UNMAP => {
                let handle = p.u32()?;
                self.presenter.forget(&self.egl, handle);
                // The present context may be current now.
                self.host_current = (u32::MAX, 0, 0);
                drop(self.mappings.unmap(handle));
            }
            egl::EXEC_MAPPED => {
                let (stream, reply_to, len) = (p.u32()?, p.u32()?, p.u32()? as usize);
                if len > MAX_BATCH {
                    return Err(p.bad(format!("a batch of {len} bytes")));
                }
                let m = self
                    .mappings
                    .take(stream)
                    .ok_or_else(|| p.bad(format!("no mapping {stream}")))?;
                // The batch is read where it is: the mapping is out of the table while it
                // runs (a guest batch cannot unmap anything) and back in afterwards.
                let ran = match m.bytes().get(..len) {
                    Some(batch) => self.run(batch, reply, false),
                    None => Err(p.bad(format!("a batch of {len} bytes in a smaller mapping"))),
                };
                self.mappings.put(stream, m);
                self.reply_to = reply_to;
                ran?;
            }
            egl::PRESENT => {
                let (surf, frame, w, h) = (p.u32()?, p.u32()?, p.u32()?, p.u32()?);
                let (w, h, copies) = self.present(surf, frame, (w, h));
                answer(reply, op, &[w, h, copies]);
            }
            egl::IMPORT_MAPPED => {
                let err = self.images.import_mapped(&self.egl, p, &self.mappings)?;
                self.host_current = (u32::MAX, 0, 0);
                answer(reply, op, &[err]);
            }
            _ => return Err(StreamError::UnknownOp(op)),
        }
        Ok(())
    }

    /// PRESENT: surface `surf`, when it is the draw surface of the context the stream runs
    /// on and of `size`, into frame mapping `frame`: `(width, height, copies)`, `(0, 0, 0)`
    /// when it is not presented.
    fn present(&mut self, surf: u32, frame: u32, size: (u32, u32)) -> (u32, u32, u32) {
        let surface = match (self.contexts.get(&self.on), self.surfaces.get(&surf)) {
            (Some(c), Some(s)) if c.draw == surf && s.size == size => s.handle,
            _ => return (0, 0, 0),
        };
        // The guest's rendering of the frame is done before another context reads it.
        if self.bind(self.on).is_err() {
            return (0, 0, 0);
        }
        self.gl.finish();
        let Some(mut m) = self.mappings.take(frame) else {
            log::warn!("render worker: present into unknown mapping {frame}");
            return (0, 0, 0);
        };
        let done = self
            .presenter
            .present(&self.egl, surface, (frame, &mut m), size);
        self.mappings.put(frame, m);
        // The present context is current now.
        self.host_current = (u32::MAX, 0, 0);
        match done {
            Ok((copies, _)) => (size.0, size.1, copies),
            Err(e) => {
                log::warn!("render worker: present: {e}");
                (0, 0, 0)
            }
        }
    }
}

#[cfg(test)]
#[path = "present_tests.rs"]
mod tests;
