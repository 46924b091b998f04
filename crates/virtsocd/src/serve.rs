//! The daemon process around `virtsoc_host::Daemon`: its configuration from the command
//! line, the guest socket it claims (never a live daemon's), the stop and reload signals, the
//! control and services sockets, and what it cleans up on exit.

use std::os::fd::OwnedFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use virtsoc_host::cgroup::CpuCgroups;
use virtsoc_host::device::share::Sharing;
use virtsoc_host::policy::PolicyStore;
use virtsoc_host::{Daemon, DaemonConfig};

use crate::args::Args;
use crate::error::ConfigError;

/// Serves guests as `args` say until SIGINT or SIGTERM.
pub fn run(args: Args) -> Result<(), ConfigError> {
    // Everything that can fail on a bad configuration runs before the socket is touched.
    let policy = Arc::new(match &args.policy {
        Some(p) => PolicyStore::load(p).map_err(|source| ConfigError::Policy {
            path: p.clone(),
            source,
        })?,
        None => PolicyStore::default(),
    });
    let cgroups = cpu_cgroups(args.cpu_cgroup.as_deref());
    let sharing = Sharing {
        scheduler: args.scheduler,
        policy: policy.clone(),
        cgroups: cgroups.clone(),
    };
    sharing.follow_policy_with_cpu_weights();
    let daemon = Daemon::new(daemon_config(&args, sharing)?)?;
    let vms = args
        .vms
        .iter()
        .map(|v| {
            virtsoc_host::vm::VmConfig::parse(v).map_err(|source| ConfigError::Vm {
                spec: v.clone(),
                source,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let tcp = args
        .listen
        .map(|addr| {
            std::net::TcpListener::bind(addr).map_err(|source| ConfigError::Listen { addr, source })
        })
        .transpose()?;
    let listener = claim_socket(&args.socket)?;
    // Ours now: removed when run() returns, whether it succeeded or not.
    let _socket_file = SocketFile(args.socket.clone());
    let (stop_rx, stop_tx) = UnixStream::pair()?;
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::low_level::pipe::register(sig, stop_tx.try_clone()?)?;
    }
    if args.policy.is_some() {
        reload_on_sighup(policy)?;
    }
    // Stopped, and their sockets removed, when run() returns.
    let _sockets = start_sockets(&daemon, &args)?;
    for vm in &vms {
        virtsoc_host::vm::start(daemon.clone(), vm.clone())?;
    }
    if let Some(addr) = args.migrate_listen {
        virtsoc_host::snapshot::migrate::listen(&daemon, addr, args.migrate_fault)?;
    }
    if args.print_ready {
        print_ready(&args.socket, tcp.as_ref())?;
    }
    let result = daemon.serve(listener, tcp, OwnedFd::from(stop_rx));
    for vm in &vms {
        virtsoc_host::vm::cleanup(vm);
    }
    if args.migrate_listen.is_some() {
        // The socket where VM guests' ports of incoming migrations arrive.
        let mut port_socket = args.socket.clone().into_os_string();
        port_socket.push(".migrate");
        let _ = std::fs::remove_file(port_socket);
    }
    if let Some(cg) = &cgroups {
        cg.release_all();
    }
    Ok(result?)
}

/// The CPU-weight cgroups under `name` (`--cpu-cgroup`); `None`, said in the log, where they
/// cannot be had.
fn cpu_cgroups(name: Option<&str>) -> Option<Arc<CpuCgroups>> {
    match CpuCgroups::detect(name?) {
        Ok(cg) => {
            log::info!("cpu weight: {} in {}", cg.version(), cg.parent().display());
            Some(Arc::new(cg))
        }
        Err(e) => {
            log::warn!("cpu weight: not steered: {e}");
            None
        }
    }
}

/// The daemon's configuration from the command line.
fn daemon_config(args: &Args, sharing: Sharing) -> Result<DaemonConfig, ConfigError> {
    Ok(DaemonConfig {
        sharing,
        socket: args.socket.clone(),
        protocol: args.protocol,
        max_window: args.max_window,
        guest_mem_limit: args.guest_mem_limit,
        spins: args.spins,
        handshake_timeout: std::time::Duration::from_millis(args.handshake_timeout_ms),
        max_connections: usize::try_from(args.max_guests).unwrap_or(usize::MAX),
        test_dma_delay: std::time::Duration::from_millis(args.test_dma_delay_ms),
        token: args.token()?,
        state_dir: args.state_dir.clone(),
        view_budget_pct: args.view_budget,
        services_policy: args.services_policy.clone(),
        limits: args.limits(),
        devices: args.devices()?,
        prefetch: args.prefetch()?,
    })
}

/// The control API and the services socket while the daemon runs (stopped, their sockets
/// removed, when dropped).
struct Sockets {
    // Dropped in this order: the services socket first, as when they were locals.
    _services: virtsoc_host::services::external::ServicesSocket,
    _control: virtsoc_control::server::ControlServer,
}

/// Starts the control API (`--control`, `--control-listen`) and the services socket
/// (`--services-socket`); logs the live view's URL when the control API is on TCP.
fn start_sockets(daemon: &Arc<Daemon>, args: &Args) -> Result<Sockets, ConfigError> {
    let control_path = args
        .control
        .clone()
        .unwrap_or_else(|| virtsoc_host::control::default_path(&args.socket));
    let control = virtsoc_host::control::start(daemon, Some(&control_path), args.control_listen)?;
    let services_path = args
        .services_socket
        .clone()
        .unwrap_or_else(|| virtsoc_host::services::external::default_path(&args.socket));
    let services = virtsoc_host::services::external::start(
        daemon.service_hypervisor(),
        &services_path,
        daemon.config().token.clone(),
    )?;
    if let (Some(addr), Some(token)) = (control.tcp_addr(), &daemon.config().token) {
        // The page needs the token like every TCP request; it rides in the URL.
        eprintln!("virtsocd: live view at http://{addr}/view#token={token}");
    }
    Ok(Sockets {
        _control: control,
        _services: services,
    })
}

/// Prints `LISTEN <addr>` (with `--listen`) and `READY <socket>` on stdout.
fn print_ready(socket: &Path, tcp: Option<&std::net::TcpListener>) -> std::io::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if let Some(t) = tcp {
        writeln!(out, "LISTEN {}", t.local_addr()?)?;
    }
    writeln!(out, "READY {}", socket.display())?;
    out.flush()
}

/// Reloads the policy on every SIGHUP; a bad file keeps the old policy and is logged.
fn reload_on_sighup(policy: Arc<PolicyStore>) -> std::io::Result<()> {
    let mut signals = signal_hook::iterator::Signals::new([signal_hook::consts::SIGHUP])?;
    std::thread::Builder::new()
        .name("policy-reload".into())
        .spawn(move || {
            for _ in signals.forever() {
                match policy.reload() {
                    Ok(()) => log::info!("policy reloaded"),
                    Err(e) => log::error!("policy not reloaded, keeping the old one: {e}"),
                }
            }
        })?;
    Ok(())
}

/// The socket file this daemon bound, removed on drop.
struct SocketFile(PathBuf);

impl Drop for SocketFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Binds the Unix socket. An existing socket file is replaced only if no daemon answers on
/// it (a stale file left by a crash); a live daemon's socket and non-socket files are left
/// alone.
fn claim_socket(path: &Path) -> Result<UnixListener, ConfigError> {
    use std::os::unix::fs::FileTypeExt;
    let io = |source| ConfigError::Socket {
        path: path.to_path_buf(),
        source,
    };
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(e)),
        Ok(m) if !m.file_type().is_socket() => {
            return Err(ConfigError::NotASocket {
                path: path.to_path_buf(),
            })
        }
        Ok(_) => match UnixStream::connect(path) {
            Ok(_) => {
                return Err(ConfigError::SocketInUse {
                    path: path.to_path_buf(),
                })
            }
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                log::info!("replacing stale socket {}", path.display());
                std::fs::remove_file(path).map_err(io)?;
            }
            Err(source) => {
                return Err(ConfigError::SocketUnknown {
                    path: path.to_path_buf(),
                    source,
                })
            }
        },
    }
    UnixListener::bind(path).map_err(io)
}
