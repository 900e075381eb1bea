//! The admin HTTP server: `/metrics`, `/healthz`, `/readyz`, `/inspect` (JSON). Read-only, off the hot path: it
//! renders the registry only when scraped, and has no endpoint that changes anything.

use std::convert::Infallible;
use std::net::SocketAddr;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use crate::tracker::inspect::SharedView;
use crate::tracker::Metrics;

/// What the admin endpoints report on.
#[derive(Clone)]
pub struct AdminState {
    /// Rendered at `/metrics`.
    pub metrics: Metrics,
    /// `/readyz` answers 200 when this is true.
    pub ready: crate::tracker::Readiness,
    /// Rendered as JSON at `/inspect`.
    pub view: SharedView,
}

/// Binds `addr` and serves until the task is dropped. Returns the bound address (useful when
/// `addr` has port 0).
pub async fn serve(
    addr: SocketAddr,
    state: AdminState,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    tracing::info!(%bound, "admin server listening");
    let task = tokio::spawn(async move {
        loop {
            let (stream, _) = match listener.accept().await {
                Ok(conn) => conn,
                Err(e) => {
                    tracing::warn!(error = %e, "admin accept failed");
                    continue;
                }
            };
            let state = state.clone();
            tokio::spawn(async move {
                let service = service_fn(move |req| respond(req, state.clone()));
                if let Err(e) = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await
                {
                    tracing::debug!(error = %e, "admin connection ended with an error");
                }
            });
        }
    });
    Ok((bound, task))
}

async fn respond(
    req: Request<Incoming>,
    state: AdminState,
) -> Result<Response<Full<Bytes>>, Infallible> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return Ok(text(StatusCode::METHOD_NOT_ALLOWED, "read-only endpoint\n"));
    }
    Ok(match req.uri().path() {
        "/metrics" => {
            let mut r = text(StatusCode::OK, state.metrics.render());
            r.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
            );
            r
        }
        "/inspect" => {
            let body = state
                .view
                .lock()
                .map(|v| serde_json::to_string(&*v).unwrap_or_default())
                .unwrap_or_default();
            let mut r = text(StatusCode::OK, body);
            r.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static("application/json"),
            );
            r
        }
        "/healthz" => text(StatusCode::OK, "ok\n"),
        "/readyz" if state.ready.is_ready() => text(StatusCode::OK, "ready\n"),
        "/readyz" => text(StatusCode::SERVICE_UNAVAILABLE, "catching up\n"),
        _ => text(
            StatusCode::NOT_FOUND,
            "not found; try /metrics, /healthz, /readyz or /inspect\n",
        ),
    })
}

fn text(status: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    r
}
