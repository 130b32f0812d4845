//! Answers that come later. A handler that waits a long time for its answer (an agent's long
//! poll) returns a placeholder carrying the future of the real answer ([`response`]), and the
//! router's outermost layer ([`resolve`]) waits for that future instead.
//!
//! Why: while a handler's future is alive, so is everything wrapped around it — each
//! middleware's boxed future with its strings and tracing span, the extractors' leftovers.
//! For 10,000 agents each holding a poll that was most of rivetd's memory. Handing the wait
//! out past the middleware leaves only the wait's own small future per held poll.
//!
//! What the middleware sees is the placeholder: metrics time a held poll until it is parked,
//! and the headers they add (the API version) are copied onto the real answer.
//!
//! A server may wait for the answer itself instead (rivetd's lean HTTP/1.1 server does, so
//! that a parked poll no longer counts against its admission limit): it marks the request
//! with [`CallerResolves`], gets the placeholder back, and calls [`finish`].

use axum::extract::Request;
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures_util::future::BoxFuture;
use std::future::Future;
use std::sync::{Arc, Mutex};

/// The real answer's future, in the placeholder's extensions (which must be `Clone + Sync`,
/// hence the `Arc<Mutex<Option<..>>>`; it is taken exactly once, by [`resolve`]).
#[derive(Clone)]
struct Deferred(Arc<Mutex<Option<BoxFuture<'static, Response>>>>);

/// A placeholder response whose real answer is `answer`; [`resolve`] waits for it.
pub fn response(answer: impl Future<Output = Response> + Send + 'static) -> Response {
    let mut placeholder = StatusCode::OK.into_response();
    placeholder
        .extensions_mut()
        .insert(Deferred(Arc::new(Mutex::new(Some(Box::pin(answer))))));
    placeholder
}

/// Request extension: whoever called the router waits for a deferred answer itself, with
/// [`finish`]; [`resolve`] hands the placeholder back untouched.
#[derive(Clone, Copy)]
pub struct CallerResolves;

/// The outermost layer: pass answers through, and wait for a deferred one.
pub async fn resolve(req: Request, next: Next) -> Response {
    if req.extensions().get::<CallerResolves>().is_some() {
        return next.run(req).await;
    }
    finish(next.run(req).await).await
}

/// `resp` itself, or — for a placeholder — its real answer once ready, with the
/// placeholder's headers that the real answer lacks.
pub async fn finish(resp: Response) -> Response {
    let Some(deferred) = resp.extensions().get::<Deferred>().cloned() else {
        return resp;
    };
    let answer = match deferred.0.lock() {
        Ok(mut slot) => slot.take(),
        Err(poisoned) => poisoned.into_inner().take(),
    };
    let Some(answer) = answer else {
        // Only this layer takes it, once: a placeholder without its answer is a bug here.
        tracing::error!("a deferred answer was already taken; answering 500");
        drop(resp);
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    };
    // Only the headers to copy are kept for the wait, in an exact-size list (the
    // placeholder's header map has room for more).
    let keep: Box<[_]> = resp
        .headers()
        .iter()
        .filter(|(name, _)| ![header::CONTENT_TYPE, header::CONTENT_LENGTH].contains(name))
        .map(|(name, value)| (name.clone(), value.clone()))
        .collect();
    drop(resp);
    let mut out = answer.await;
    for (name, value) in keep {
        if !out.headers().contains_key(&name) {
            out.headers_mut().insert(name, value);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::routing::get;
    use axum::Router;
    use tower_service::Service;

    async fn later() -> Response {
        response(async {
            tokio::task::yield_now().await;
            (StatusCode::ACCEPTED, "the real answer").into_response()
        })
    }

    async fn tag(req: Request, next: Next) -> Response {
        let mut resp = next.run(req).await;
        resp.headers_mut()
            .insert("x-tag", axum::http::HeaderValue::from_static("inner"));
        resp
    }

    #[tokio::test]
    async fn the_outermost_layer_answers_with_the_deferred_answer_and_keeps_the_middleware_headers()
    {
        let app = Router::new()
            .route("/later", get(later))
            .route("/now", get(|| async { "now" }))
            .layer(axum::middleware::from_fn(tag))
            .layer(axum::middleware::from_fn(resolve));
        let mut app = app;
        let resp = app
            .call(Request::get("/later").body(Body::empty()).expect("request"))
            .await
            .expect("infallible");
        assert_eq!(resp.status(), StatusCode::ACCEPTED);
        assert_eq!(resp.headers()["x-tag"], "inner");
        assert!(resp.extensions().get::<Deferred>().is_none());
        let body = axum::body::to_bytes(resp.into_body(), 1024)
            .await
            .expect("body");
        assert_eq!(&body[..], b"the real answer");
        let resp = app
            .call(Request::get("/now").body(Body::empty()).expect("request"))
            .await
            .expect("infallible");
        assert_eq!(resp.status(), StatusCode::OK);
        let body = axum::body::to_bytes(resp.into_body(), 1024)
            .await
            .expect("body");
        assert_eq!(&body[..], b"now");
    }
}
