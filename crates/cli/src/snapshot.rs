//! `virtsoc snapshot save|load`: a guest session to a file and back, through the daemon's
//! control API (`POST /guests/{id}/snapshot`, `POST /guests/{id}/restore`). The file is
//! written and read by the daemon, on its host.

use clap::Subcommand;
use serde_json::{json, Value};
use virtsoc_control::client::request;

use crate::CliError;

#[derive(Debug, Subcommand)]
pub enum SnapshotCmd {
    /// Saves guest GUEST's session (regions, fences, device records) to FILE: the guest is
    /// quiesced meanwhile and goes on afterwards.
    Save {
        guest: u64,
        file: std::path::PathBuf,
        /// Control socket (default /tmp/virtsoc.sock.control; a guest socket is accepted
        /// too), or tcp:HOST:PORT with the token in $VIRTSOC_TOKEN.
        #[arg(long)]
        socket: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Restores FILE into guest GUEST's session, which must not hold regions or fences yet:
    /// the guest then sees the saved region ids, fence ids and bytes.
    Load {
        file: std::path::PathBuf,
        #[arg(long)]
        guest: u64,
        #[arg(long)]
        socket: Option<String>,
        #[arg(long)]
        json: bool,
    },
}

/// Sends one snapshot request; returns the daemon's report.
pub fn call(
    socket: Option<String>,
    guest: u64,
    op: &str,
    file: &std::path::Path,
) -> Result<Value, CliError> {
    let path = std::path::absolute(file)?;
    post(socket, guest, op, &json!({ "path": path }))
}

/// `virtsoc migrate GUEST --to tcp:HOST:PORT`: asks the guest's daemon to migrate it to the
/// daemon whose `--migrate-listen` is HOST:PORT (its token from `$VIRTSOC_TOKEN`).
pub fn migrate(socket: Option<String>, guest: u64, to: &str) -> Result<Value, CliError> {
    let addr = to.strip_prefix("tcp:").unwrap_or(to);
    let token = std::env::var("VIRTSOC_TOKEN")
        .map_err(|_| CliError::Usage("the target daemon's token goes in $VIRTSOC_TOKEN".into()))?;
    post(
        socket,
        guest,
        "migrate",
        &json!({ "to": addr, "token": token }),
    )
}

fn post(socket: Option<String>, guest: u64, op: &str, body: &Value) -> Result<Value, CliError> {
    let body = serde_json::to_vec(body)?;
    let t = crate::ctl::target(socket);
    let r = request(&t, "POST", &format!("/guests/{guest}/{op}"), &body).map_err(|e| {
        CliError::Usage(format!(
            "cannot reach the daemon's control API at {t:?}: {e}"
        ))
    })?;
    if r.status != 200 {
        let msg = r.json()["error"]
            .as_str()
            .map(str::to_string)
            .unwrap_or(r.body.clone());
        return Err(CliError::Usage(format!(
            "{op} failed: {msg} (HTTP {})",
            r.status
        )));
    }
    Ok(r.json())
}

fn print(v: &Value, json: bool, what: &str) -> Result<(), CliError> {
    if json {
        println!("{}", serde_json::to_string_pretty(v)?);
    } else {
        println!(
            "{what} {} regions, {} bytes of contents, file {} bytes, {} ms",
            v["regions"], v["region_bytes"], v["file_bytes"], v["ms"]
        );
    }
    Ok(())
}

/// Runs `virtsoc snapshot ...`.
pub fn run(cmd: SnapshotCmd) -> Result<(), CliError> {
    match cmd {
        SnapshotCmd::Save {
            guest,
            file,
            socket,
            json,
        } => print(&call(socket, guest, "snapshot", &file)?, json, "saved"),
        SnapshotCmd::Load {
            file,
            guest,
            socket,
            json,
        } => print(&call(socket, guest, "restore", &file)?, json, "restored"),
    }
}
