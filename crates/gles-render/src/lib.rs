//! virtsoc's GLES render worker: runs a guest's GLES command stream on the host's EGL/GLES
//! (see `docs/gles.md`). [`gl`] decodes and executes GL packets; [`egl`] owns the host
//! display, contexts and surfaces; [`worker`] is the loop serving the daemon; [`glue`] is
//! the worker's seam to the GL decoder; [`sandbox`] confines the worker process;
//! [`mapped`] holds the replicas the daemon shares with the worker, [`present`] writes
//! frames into them, [`serve`] is the loop reading the daemon's messages.

mod daemon_ops;
pub mod egl;
pub mod gl;
pub mod glue;
pub mod image;
pub mod mapped;
pub mod memobj;
pub mod present;
pub mod sandbox;
pub mod serve;
pub mod worker;
pub mod yuv;
