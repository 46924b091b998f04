//! `virtsoc ctl`: the daemon's console, in the style of the Android emulator's (`adb emu sms
//! send ...`), over the control API (HTTP + JSON on `<socket>.control`).

use std::path::PathBuf;

use serde_json::{json, Value};
use virtsoc_control::client::{request, Target};

use crate::CliError;

/// The commands, as `virtsoc ctl` with no arguments prints them.
pub const USAGE: &str = "\
virtsoc ctl [--socket PATH|tcp:HOST:PORT] COMMAND
  guests                         live guests (transport, protocol, regions, copies)
  devices                        devices, backends, memory domains
  stats GUEST                    one guest's counters (JSON)
  display foreground GUEST       give the screen to GUEST (prints the switch latency)
  display refresh HZ             change the display's refresh rate
  sms send FROM TEXT...          incoming SMS to every guest's modem
  gsm call FROM                  incoming voice call
  gsm cancel                     the remote party hangs up
  gsm signal RSSI [BER]          signal strength 0..31, bit error rate 0..7
  gsm registration STATE         home | searching | denied | roaming | not-registered
  camera source SRC              synthetic | file:PATH
  geo fix LON LAT [ALT]          set the location (degrees, metres)
  geo nmea SENTENCE              set the location from a $GPGGA or $GPRMC sentence
  geo track FILE [INTERVAL_MS]   replay a track (NMEA lines or GPX), one point per interval
  geo                            the current fix (and its NMEA sentences)
  sensor set NAME x:y:z          accelerometer | gyroscope | magnetometer | light | proximity
  sensor                         every sensor's value
  clipboard get                  the clipboard's text
  clipboard set TEXT...          set the clipboard's text
  services                       host services, their calls, channels, restarts, policy
  services policy JSON|reload    replace the services policy, or read its file again
  services call NAME OP [JSON]   run control operation OP of service NAME (a host
                                 program's too) with JSON arguments
  kill GUEST                     close GUEST's session
  policy GUEST JSON              set GUEST's sharing policy, e.g. '{\"shares\": 200}'
  policy reload                  read the daemon's --policy file again
  record GUEST OUT.mp4 [--seconds N] [--fps F] [--max WxH]
                                 record GUEST's presented frames (H.264 MP4; 5 s, 30 fps,
                                 1280x720 at most by default)
  view                           the live view's page (needs --control-listen on the daemon)
  metrics                        Prometheus metrics
--socket: the control socket (default /tmp/virtsoc.sock.control; a daemon's guest socket
          is accepted too), or tcp:HOST:PORT with the token in $VIRTSOC_TOKEN";

fn usage(msg: &str) -> CliError {
    CliError::Usage(format!("{msg}\n{USAGE}"))
}

/// The control API named by `--socket` (a control socket, a guest socket or tcp:HOST:PORT).
pub(crate) fn target(socket: Option<String>) -> Target {
    let s = socket.unwrap_or_else(|| "/tmp/virtsoc.sock.control".into());
    if let Some(addr) = s.strip_prefix("tcp:") {
        return Target::Tcp(addr.to_string(), std::env::var("VIRTSOC_TOKEN").ok());
    }
    let p = PathBuf::from(&s);
    let control = virtsoc_control::client::control_path(&p);
    if !s.ends_with(".control") && control.exists() {
        return Target::Unix(control);
    }
    Target::Unix(p)
}

fn guest(s: Option<&String>) -> Result<u64, CliError> {
    s.ok_or_else(|| usage("missing GUEST"))?
        .parse()
        .map_err(|_| usage("GUEST is a guest id (see `virtsoc ctl guests`)"))
}

fn num(s: Option<&String>, what: &str) -> Result<u64, CliError> {
    s.ok_or_else(|| usage(&format!("missing {what}")))?
        .parse()
        .map_err(|_| usage(&format!("{what} is a number")))
}

fn arg<'a>(s: Option<&'a String>, what: &str) -> Result<&'a String, CliError> {
    s.ok_or_else(|| usage(&format!("missing {what}")))
}

/// Runs `virtsoc ctl ARGS...` and prints the answer.
pub fn run(socket: Option<String>, args: &[String]) -> Result<(), CliError> {
    if args.is_empty() {
        println!("{USAGE}");
        return Ok(());
    }
    let words: Vec<&str> = args.iter().map(String::as_str).collect();
    if words[0] == "record" {
        return record(socket, args);
    }
    if words[0] == "view" {
        println!(
            "The live view is served by the daemon's control API on TCP: start virtsocd with \
             --control-listen ADDR (and --token-file), then open http://ADDR/view#token=TOKEN \
             (virtsocd logs that URL when it starts)."
        );
        return Ok(());
    }
    let a = |i: usize| args.get(i);
    let (method, path, body): (&str, String, Value) = match words.as_slice() {
        ["guests"] => ("GET", "/guests".into(), Value::Null),
        ["devices"] => ("GET", "/devices".into(), Value::Null),
        ["metrics"] => ("GET", "/metrics".into(), Value::Null),
        ["stats", ..] => (
            "GET",
            format!("/guests/{}/stats", guest(a(1))?),
            Value::Null,
        ),
        ["kill", ..] => ("POST", format!("/guests/{}/kill", guest(a(1))?), json!({})),
        ["policy", "reload"] => ("POST", "/policy/reload".into(), json!({})),
        ["policy", ..] => {
            let table: Value = serde_json::from_str(arg(a(2), "JSON")?)
                .map_err(|e| usage(&format!("JSON: {e}")))?;
            ("POST", format!("/guests/{}/policy", guest(a(1))?), table)
        }
        ["display", "foreground", ..] => (
            "POST",
            "/display/foreground".into(),
            json!({ "guest": guest(a(2))? }),
        ),
        ["display", "refresh", ..] => (
            "POST",
            "/display/refresh".into(),
            json!({ "hz": num(a(2), "HZ")? }),
        ),
        ["sms", "send", ..] => {
            let from = arg(a(2), "FROM")?;
            if args.len() < 4 {
                return Err(usage("missing TEXT"));
            }
            let text = args[3..].join(" ");
            (
                "POST",
                "/modem/sms".into(),
                json!({ "from": from, "text": text }),
            )
        }
        ["gsm", "call", ..] => (
            "POST",
            "/modem/call".into(),
            json!({ "from": arg(a(2), "FROM")? }),
        ),
        ["gsm", "cancel"] => ("POST", "/modem/hangup".into(), json!({})),
        ["gsm", "signal", ..] => {
            let rssi = num(a(2), "RSSI")?;
            let mut b = json!({ "rssi": rssi });
            if a(3).is_some() {
                b["ber"] = json!(num(a(3), "BER")?);
            }
            ("POST", "/modem/signal".into(), b)
        }
        ["gsm", "registration", ..] => (
            "POST",
            "/modem/registration".into(),
            json!({ "state": arg(a(2), "STATE")? }),
        ),
        ["camera", "source", ..] => (
            "POST",
            "/camera/source".into(),
            json!({ "source": arg(a(2), "SRC")? }),
        ),
        [w @ ("geo" | "sensor" | "clipboard" | "services"), ..] => services(w, args)?,
        _ => return Err(usage(&format!("unknown command: {}", args.join(" ")))),
    };
    let body = if body.is_null() {
        Vec::new()
    } else {
        serde_json::to_vec(&body)?
    };
    let t = target(socket);
    let r = request(&t, method, &path, &body).map_err(|e| {
        CliError::Usage(format!(
            "cannot reach the daemon's control API at {t:?}: {e}"
        ))
    })?;
    let r = answered(r)?;
    match words[0] {
        "metrics" => print!("{}", r.body),
        "guests" => print_guests(&r.json()),
        "devices" => print_devices(&r.json()),
        _ => println!("{}\nOK", serde_json::to_string_pretty(&r.json())?),
    }
    Ok(())
}

fn float(s: Option<&String>, what: &str) -> Result<f64, CliError> {
    s.ok_or_else(|| usage(&format!("missing {what}")))?
        .parse()
        .map_err(|_| usage(&format!("{what} is a number")))
}

/// The host services' commands: `geo`, `sensor`, `clipboard`, `services`.
fn services(w: &str, args: &[String]) -> Result<(&'static str, String, Value), CliError> {
    let a = |i: usize| args.get(i);
    let words: Vec<&str> = args.iter().map(String::as_str).collect();
    Ok(match (w, words.get(1).copied()) {
        ("geo", None) => ("GET", "/geo".into(), Value::Null),
        ("geo", Some("fix")) => {
            let mut b = json!({ "lon": float(a(2), "LON")?, "lat": float(a(3), "LAT")? });
            if a(4).is_some() {
                b["alt"] = json!(float(a(4), "ALT")?);
            }
            ("POST", "/geo/fix".into(), b)
        }
        ("geo", Some("nmea")) => (
            "POST",
            "/geo/nmea".into(),
            json!({ "sentence": arg(a(2), "SENTENCE")? }),
        ),
        ("geo", Some("track")) => {
            let text = std::fs::read_to_string(arg(a(2), "FILE")?)?;
            let mut b = json!({ "text": text });
            if a(3).is_some() {
                b["interval_ms"] = json!(num(a(3), "INTERVAL_MS")?);
            }
            ("POST", "/geo/track".into(), b)
        }
        ("sensor", None) => ("GET", "/sensor".into(), Value::Null),
        ("sensor", Some("set")) => (
            "POST",
            "/sensor/set".into(),
            json!({ "name": arg(a(2), "NAME")?, "value": arg(a(3), "x:y:z")? }),
        ),
        ("clipboard", Some("get")) => ("GET", "/clipboard".into(), Value::Null),
        ("clipboard", Some("set")) => {
            if args.len() < 3 {
                return Err(usage("missing TEXT"));
            }
            (
                "POST",
                "/clipboard".into(),
                json!({ "text": args[2..].join(" ") }),
            )
        }
        ("services", None) => ("GET", "/services".into(), Value::Null),
        ("services", Some("call")) => {
            let name = arg(a(2), "NAME")?;
            let op = arg(a(3), "OP")?;
            let body = match a(4) {
                Some(j) => serde_json::from_str(j).map_err(|e| usage(&format!("JSON: {e}")))?,
                None => json!({}),
            };
            ("POST", format!("/services/{name}/{op}"), body)
        }
        ("services", Some("policy")) => {
            let p = arg(a(2), "JSON")?;
            let body = if p == "reload" {
                json!({ "reload": true })
            } else {
                serde_json::from_str(p).map_err(|e| usage(&format!("JSON: {e}")))?
            };
            ("POST", "/services/policy".into(), body)
        }
        _ => return Err(usage(&format!("unknown command: {}", args.join(" ")))),
    })
}

/// `virtsoc ctl record GUEST OUT.mp4 [--seconds N] [--fps F] [--max WxH]`.
fn record(socket: Option<String>, args: &[String]) -> Result<(), CliError> {
    let id = guest(args.get(1))?;
    let out = arg(args.get(2), "OUT.mp4")?;
    let mut body = json!({ "seconds": 5.0 });
    let mut rest = args[3..].iter();
    while let Some(flag) = rest.next() {
        let value = rest
            .next()
            .ok_or_else(|| usage(&format!("{flag} needs a value")))?;
        match flag.as_str() {
            "--seconds" => {
                body["seconds"] = json!(value
                    .parse::<f64>()
                    .map_err(|_| usage("--seconds is a number"))?)
            }
            "--fps" => body["fps"] = json!(num(Some(value), "--fps")?),
            "--max" => body["max"] = json!(value),
            _ => return Err(usage(&format!("unknown option {flag}"))),
        }
    }
    let seconds = body["seconds"].as_f64().unwrap_or(5.0).clamp(0.0, 3600.0);
    let t = target(socket);
    let r = virtsoc_control::client::request_waiting(
        &t,
        "POST",
        &format!("/guests/{id}/record"),
        &serde_json::to_vec(&body)?,
        std::time::Duration::from_secs_f64(seconds + 30.0),
    )
    .map_err(|e| {
        CliError::Usage(format!(
            "cannot reach the daemon's control API at {t:?}: {e}"
        ))
    })?;
    let r = answered(r)?;
    std::fs::write(out, &r.bytes)?;
    println!(
        "recorded {seconds} s of guest {id} into {out} ({} bytes)\nOK",
        r.bytes.len()
    );
    Ok(())
}

/// The answer if it is a success, else its error message as the command's error.
fn answered(
    r: virtsoc_control::client::Response,
) -> Result<virtsoc_control::client::Response, CliError> {
    if r.status == 200 {
        return Ok(r);
    }
    let msg = r.json()["error"]
        .as_str()
        .map(str::to_string)
        .unwrap_or(r.body.clone());
    Err(CliError::Usage(format!("KO: {msg} (HTTP {})", r.status)))
}

fn print_guests(v: &Value) {
    println!(
        "{:>5}  {:<20} {:<6} {:<17} {:>7} {:>12} {:>8} {:>14}",
        "id", "name", "via", "protocol", "regions", "bytes", "copies", "copy bytes"
    );
    for g in v.as_array().into_iter().flatten() {
        println!(
            "{:>5}  {:<20} {:<6} {:<17} {:>7} {:>12} {:>8} {:>14}",
            g["id"],
            g["name"].as_str().unwrap_or(""),
            g["transport"].as_str().unwrap_or(""),
            g["protocol"].as_str().unwrap_or(""),
            g["regions"],
            g["bytes"],
            g["counters"]["copies"],
            g["counters"]["copy_bytes"],
        );
    }
}

fn print_devices(v: &Value) {
    println!("{:>4}  {:<10} {:<8} backend", "id", "name", "domain");
    for d in v.as_array().into_iter().flatten() {
        println!(
            "{:>4}  {:<10} {:<8} {}",
            d["id"],
            d["name"].as_str().unwrap_or(""),
            d["domain"].as_str().unwrap_or(""),
            d["backend"].as_str().unwrap_or("")
        );
    }
}
