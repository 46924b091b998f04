//! The display's host control operations (the daemon's control API):
//! - `foreground {"guest": id}`: gives the screen to that guest at once;
//! - `refresh {"hz": n}`: changes the vsync rate at once (the `mode` command and the backend
//!   string report it);
//! - `metrics`: every guest's presented and dropped frames and latest motion-to-photon
//!   samples.

use serde_json::{json, Value};
use virtsoc_control::{ControlError, ForegroundRequest, RefreshRequest};
use virtsoc_svm::GuestId;

use super::Display;

fn args<T: serde::de::DeserializeOwned>(v: &Value) -> Result<T, ControlError> {
    serde_json::from_value(v.clone()).map_err(|e| ControlError::BadRequest(e.to_string()))
}

impl Display {
    /// The vsync rate now.
    pub(super) fn refresh_hz(&self) -> u32 {
        self.screen.vsync.with_display(|d| d.refresh_hz())
    }

    /// Runs a control operation.
    pub(super) fn control_op(&self, op: &str, v: &Value) -> Result<Value, ControlError> {
        match op {
            "foreground" => {
                let r: ForegroundRequest = args(v)?;
                self.screen.set_foreground(GuestId(r.guest));
                Ok(json!({ "guest": r.guest, "foreground": self.screen.foreground() }))
            }
            "refresh" => {
                let r: RefreshRequest = args(v)?;
                self.screen
                    .vsync
                    .set_refresh_hz(r.hz)
                    .map_err(|e| ControlError::BadRequest(format!("field `hz`: {e}")))?;
                log::info!("display: refresh rate now {} Hz", r.hz);
                Ok(json!({ "refresh_hz": self.refresh_hz() }))
            }
            "metrics" => Ok(serde_json::to_value(self.screen.guest_metrics())
                .map_err(|e| ControlError::Internal(e.to_string()))?),
            _ => Err(ControlError::Unsupported(format!(
                "display operation {op:?}"
            ))),
        }
    }
}
