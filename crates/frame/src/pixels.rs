//! [`FrameRef`], [`FrameMut`] and [`OwnedFrame`]: a [`FrameLayout`] over bytes.

use std::fmt;

use crate::{FrameLayout, Result};

/// A read-only frame: a layout over a byte buffer of at least `layout.size()` bytes.
#[derive(Clone, Copy)]
pub struct FrameRef<'a> {
    /// How the bytes are arranged.
    pub layout: FrameLayout,
    /// The bytes (may be longer than the layout needs).
    pub data: &'a [u8],
}

impl<'a> FrameRef<'a> {
    /// Validates the layout and the buffer size.
    pub fn new(layout: FrameLayout, data: &'a [u8]) -> Result<Self> {
        layout.check_buffer(data.len())?;
        Ok(FrameRef { layout, data })
    }

    /// Re-checks a frame whose public fields may have been set by hand.
    pub fn validate(&self) -> Result<()> {
        self.layout.check_buffer(self.data.len())
    }

    /// The bytes of plane `index` (`stride * rows`), or `None` if there is no such plane.
    /// Assumes a validated frame.
    pub fn plane(&self, index: usize) -> Option<&'a [u8]> {
        let p = self.layout.plane(index)?;
        self.data.get(p.offset..p.offset + p.len())
    }
}

/// A writable frame: a layout over a byte buffer of at least `layout.size()` bytes.
pub struct FrameMut<'a> {
    /// How the bytes are arranged.
    pub layout: FrameLayout,
    /// The bytes (may be longer than the layout needs).
    pub data: &'a mut [u8],
}

impl<'a> FrameMut<'a> {
    /// Validates the layout and the buffer size.
    pub fn new(layout: FrameLayout, data: &'a mut [u8]) -> Result<Self> {
        layout.check_buffer(data.len())?;
        Ok(FrameMut { layout, data })
    }

    /// Re-checks a frame whose public fields may have been set by hand.
    pub fn validate(&self) -> Result<()> {
        self.layout.check_buffer(self.data.len())
    }

    /// A read-only view of the same frame.
    pub fn as_ref(&self) -> FrameRef<'_> {
        FrameRef {
            layout: self.layout,
            data: self.data,
        }
    }

    /// A shorter-lived writable view of the same frame (so a `FrameMut` can be passed by
    /// value twice).
    pub fn reborrow(&mut self) -> FrameMut<'_> {
        FrameMut {
            layout: self.layout,
            data: self.data,
        }
    }

    /// Disjoint mutable slices of every plane, in plane order. Assumes a validated frame.
    pub fn planes_mut(&mut self) -> Vec<&mut [u8]> {
        let mut out = Vec::with_capacity(3);
        let mut rest: &mut [u8] = self.data;
        let mut consumed = 0usize;
        for p in self.layout.planes() {
            let skip = p.offset - consumed;
            let tmp = std::mem::take(&mut rest);
            let (_, tail) = tmp.split_at_mut(skip.min(tmp.len()));
            let n = p.len().min(tail.len());
            let (plane, tail) = tail.split_at_mut(n);
            out.push(plane);
            rest = tail;
            consumed = p.offset + n;
        }
        out
    }
}

impl fmt::Debug for FrameRef<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FrameRef")
            .field("layout", &self.layout)
            .field("len", &self.data.len())
            .finish()
    }
}

impl fmt::Debug for FrameMut<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FrameMut")
            .field("layout", &self.layout)
            .field("len", &self.data.len())
            .finish()
    }
}

/// An owned frame, handy for tests, benchmarks and callers without a replica.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwnedFrame {
    /// How the bytes are arranged.
    pub layout: FrameLayout,
    /// The bytes, exactly [`FrameLayout::size`] long when built by [`OwnedFrame::new`].
    pub data: Vec<u8>,
}

impl OwnedFrame {
    /// A zero-filled frame of the given layout (checked).
    pub fn new(layout: FrameLayout) -> Result<Self> {
        let size = layout.size_bytes()?;
        Ok(OwnedFrame {
            layout,
            data: vec![0; size],
        })
    }

    /// Borrows as a read-only frame.
    pub fn as_ref(&self) -> FrameRef<'_> {
        FrameRef {
            layout: self.layout,
            data: &self.data,
        }
    }

    /// Borrows as a writable frame.
    pub fn as_mut(&mut self) -> FrameMut<'_> {
        FrameMut {
            layout: self.layout,
            data: &mut self.data,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{FrameError, PixelFormat};

    #[test]
    fn views_check_their_buffers() {
        let l = FrameLayout::packed(PixelFormat::Rgba8, 4, 4).unwrap();
        assert!(matches!(
            FrameRef::new(l, &[0u8; 63]),
            Err(FrameError::BufferTooSmall {
                needed: 64,
                got: 63
            })
        ));
        let mut buf = [0u8; 64];
        assert!(FrameMut::new(l, &mut buf).is_ok());
        let f = FrameRef::new(l, &[7u8; 70]).unwrap();
        assert_eq!(f.plane(0).map(<[u8]>::len), Some(64));
        assert_eq!(f.plane(1), None);
        assert_eq!(
            format!("{f:?}"),
            format!("FrameRef {{ layout: {l:?}, len: 70 }}")
        );
    }

    #[test]
    fn planes_mut_are_disjoint_and_complete() {
        let l = FrameLayout::packed(PixelFormat::Yuv420p, 8, 4).unwrap();
        let mut buf = vec![0u8; l.size() + 7];
        let mut f = FrameMut::new(l, &mut buf).unwrap();
        let planes = f.planes_mut();
        assert_eq!(
            planes.iter().map(|p| p.len()).collect::<Vec<_>>(),
            [32, 8, 8]
        );
    }

    #[test]
    fn owned_frames_are_zeroed_and_sized() {
        let l = FrameLayout::packed(PixelFormat::Nv12, 8, 4).unwrap();
        let mut o = OwnedFrame::new(l).unwrap();
        assert_eq!(o.data, vec![0; 48]);
        o.as_mut().data[0] = 1;
        assert_eq!(o.as_ref().data[0], 1);
        let bad = FrameLayout { width: 0, ..l };
        assert!(OwnedFrame::new(bad).is_err());
    }
}
