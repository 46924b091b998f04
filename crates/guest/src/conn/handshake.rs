//! The handshakes: a process guest's (hello, resuming a saved session with its secret; the
//! welcome with the window's memfd, the mapped window and the ring link over it) and a
//! remote guest's (the same hello and welcome on TCP, a private mirror of the window, frames
//! on the stream).

use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::sync::Arc;

use virtsoc_proto::handshake::{recv_json, send_json, DeviceDesc, Reply};
use virtsoc_proto::ring::FutexDoorbell;
use virtsoc_proto::SharedWindow;

use super::{socket_hung_up, ConnectOptions, Connection};
use crate::link::{GuestLink, ShmLink, StreamLink};
use crate::{GuestError, Result};

/// What a handshake set up.
pub(crate) struct Handshake {
    pub(crate) link: Box<dyn GuestLink>,
    pub(crate) window: Arc<SharedWindow>,
    pub(crate) guest_id: u64,
    pub(crate) coherence: String,
    pub(crate) devices: Vec<DeviceDesc>,
    pub(crate) resume: Option<String>,
}

impl Connection {
    /// The handshake of a process guest on `sock` (resuming a saved session with `resume`):
    /// the mapped window and the link over it.
    pub(super) fn handshake_unix(
        sock: UnixStream,
        opts: &ConnectOptions,
        resume: Option<String>,
    ) -> Result<Handshake> {
        let mut hello = Self::hello_for(opts);
        hello.resume = resume;
        send_json(&sock, &hello, None)?;
        let (reply, fd): (Reply, _) = recv_json(&sock)?;
        let resume = match &reply {
            Reply::Welcome { resume, .. } => resume.clone(),
            _ => None,
        };
        let (guest_id, layout, coherence, devices) = Self::welcome_of(reply)?;
        let fd = fd.ok_or_else(|| GuestError::Refused("welcome carried no window".into()))?;
        let window = Arc::new(SharedWindow::map_file(std::fs::File::from(fd), layout)?);
        let sock = Arc::new(sock);
        let (s1, s2) = (sock.clone(), sock);
        let link = ShmLink::new(
            window.clone(),
            Box::new(FutexDoorbell::host_bell(&window, opts.spins)),
            Box::new(FutexDoorbell::guest_bell(&window, opts.spins)),
            Box::new(move || socket_hung_up(&s1)),
            Box::new(move || {
                let _ = s2.shutdown(std::net::Shutdown::Both);
            }),
        )
        .with_host_futex();
        Ok(Handshake {
            link: Box::new(link),
            window,
            guest_id,
            coherence,
            devices,
            resume,
        })
    }

    /// The handshake of a remote guest on TCP at `addr` (resuming a saved session with
    /// `resume`): a private mirror of the window (CPU pointers point there, bytes travel in
    /// the stream) and the frame link.
    pub(super) fn handshake_tcp(
        addr: &str,
        opts: &ConnectOptions,
        resume: Option<String>,
        timeout: Option<std::time::Duration>,
    ) -> Result<Handshake> {
        let sock = TcpStream::connect(addr).map_err(|source| GuestError::Connect {
            path: addr.to_string(),
            source,
        })?;
        sock.set_read_timeout(timeout).map_err(GuestError::Io)?;
        let mut hello = Self::hello_for(opts);
        hello.resume = resume;
        send_json(&sock, &hello, None)?;
        let (reply, _): (Reply, _) = recv_json(&sock)?;
        let resume = match &reply {
            Reply::Welcome { resume, .. } => resume.clone(),
            _ => None,
        };
        let (guest_id, layout, coherence, devices) = Self::welcome_of(reply)?;
        sock.set_read_timeout(None).map_err(GuestError::Io)?;
        let window = Arc::new(SharedWindow::create_memfd("virtsoc-remote-mirror", layout)?);
        let link = StreamLink::new(sock, layout.size)?;
        Ok(Handshake {
            link: Box::new(link),
            window,
            guest_id,
            coherence,
            devices,
            resume,
        })
    }
}
