//! Strict JSON bodies: a syntax error, an unknown field, a wrong type or a broken limit (depth,
//! string length, steps per request — `rivet_protocol::limits`) is a 400 that names the field;
//! an oversize body is a 413 naming the limit.

use super::ApiError;
use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use rivet_protocol::limits::Limited;
use serde::de::DeserializeOwned;

/// A JSON request body of type `T`, parsed under `T`'s limits.
pub struct JsonBody<T>(pub T);

impl<T: DeserializeOwned + Limited, S: Send + Sync> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let bytes = Bytes::from_request(req, state).await.map_err(|rej| {
            if rej.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "request body is larger than this server accepts (api.max_body_bytes)",
                )
            } else {
                ApiError::new(rej.status(), format!("cannot read request body: {rej}"))
            }
        })?;
        parse(&bytes).map(JsonBody)
    }
}

/// Parse bytes as `T` under `T`'s limits, with field-naming errors.
pub fn parse<T: DeserializeOwned + Limited>(bytes: &[u8]) -> Result<T, ApiError> {
    rivet_protocol::limits::parse(bytes).map_err(|e| ApiError::bad_request(e.to_string()))
}
