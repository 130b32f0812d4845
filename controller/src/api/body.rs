//! Strict JSON bodies: a syntax error, an unknown field or a wrong type is a 400 that names
//! the field; an oversize body is a 413 naming the limit.

use super::ApiError;
use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use serde::de::DeserializeOwned;

/// A JSON request body of type `T`.
pub struct JsonBody<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for JsonBody<T> {
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

/// Parse bytes as `T` with field-naming errors.
pub fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    if bytes.is_empty() {
        return Err(ApiError::bad_request(
            "request body is empty; expected JSON",
        ));
    }
    let de = &mut serde_json::Deserializer::from_slice(bytes);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        match inner.classify() {
            serde_json::error::Category::Syntax | serde_json::error::Category::Eof => {
                ApiError::bad_request(format!("malformed JSON in request body: {inner}"))
            }
            _ if path == "." || path.is_empty() => {
                ApiError::bad_request(format!("invalid request body: {inner}"))
            }
            _ => ApiError::bad_request(format!("invalid request body: field {path}: {inner}")),
        }
    })
}
