//! Errors of the control API, each with its HTTP status.

/// A failed control request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ControlError {
    /// Malformed request: bad JSON, a missing or invalid field (named in the message).
    #[error("{0}")]
    BadRequest(String),
    /// No credentials, or wrong ones.
    #[error("missing or wrong token (Authorization: Bearer <token>)")]
    Unauthorized,
    /// Unknown guest, device or route.
    #[error("{0}")]
    NotFound(String),
    /// The method is not served on that path.
    #[error("method not allowed")]
    MethodNotAllowed,
    /// The device refused the operation in its current state.
    #[error("{0}")]
    Conflict(String),
    /// The request body is over the limit.
    #[error("request body over {0} bytes")]
    TooLarge(usize),
    /// The device has no such control operation.
    #[error("{0}: not supported")]
    Unsupported(String),
    /// Anything else.
    #[error("{0}")]
    Internal(String),
}

impl ControlError {
    /// The HTTP status code of the error.
    pub fn status(&self) -> u16 {
        match self {
            ControlError::BadRequest(_) => 400,
            ControlError::Unauthorized => 401,
            ControlError::NotFound(_) | ControlError::Unsupported(_) => 404,
            ControlError::MethodNotAllowed => 405,
            ControlError::Conflict(_) => 409,
            ControlError::TooLarge(_) => 413,
            ControlError::Internal(_) => 500,
        }
    }

    /// The JSON body of the error: `{"error": "..."}`.
    pub fn body(&self) -> String {
        serde_json::json!({ "error": self.to_string() }).to_string()
    }
}
