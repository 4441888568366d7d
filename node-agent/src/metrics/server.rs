//! `/metrics` and `/capture` over HTTP/1 on a Unix socket. Local agents live in
//! network namespaces with no route to the host, but share its filesystem: the
//! hub scrapes them through their sockets and serves them all on one host
//! port, and `nextmini capture` reads a link's packets through the socket of
//! the node that sends them.

use crate::capture::{self, CaptureRequest, RequestError};
use crate::listener::LinkMap;
use prometheus_client::registry::Registry;
use std::convert::Infallible;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response, StatusCode};
use tokio_stream::StreamExt;

/// Media type of a capture's stream.
pub const PCAPNG: &str = "application/x-pcapng";

/// What the socket serves.
#[derive(Clone)]
pub struct Endpoints {
    pub registry: Arc<Registry>,
    /// The links this node sends on, for `/capture`.
    pub links: LinkMap,
    pub node: String,
}

type Body = BoxBody<Bytes, Infallible>;

/// Removes the socket file when the server stops, so no stale socket is left
/// for the hub to trip over.
struct Unlink(PathBuf);

impl Drop for Unlink {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Serves `endpoints` on `path` (mode 0600) until the task is dropped.
pub async fn serve(path: PathBuf, endpoints: Endpoints) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    // A socket left by a killed agent of the same node blocks bind.
    match std::fs::remove_file(&path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let listener = tokio::net::UnixListener::bind(&path)?;
    let _unlink = Unlink(path.clone());
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
    tracing::info!(socket = %path.display(), "serving metrics and captures");
    loop {
        let (stream, _) = listener.accept().await?;
        let endpoints = endpoints.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let endpoints = endpoints.clone();
                async move { Ok::<_, Infallible>(respond(&req, &endpoints)) }
            });
            if let Err(e) = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .await
            {
                tracing::debug!(error = %e, "metrics connection ended");
            }
        });
    }
}

fn reply(status: StatusCode, content_type: &str, body: String) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::from(body)).boxed());
    *response.status_mut() = status;
    if let Ok(v) = hyper::header::HeaderValue::from_str(content_type) {
        response
            .headers_mut()
            .insert(hyper::header::CONTENT_TYPE, v);
    }
    response
}

fn respond(req: &Request<Incoming>, endpoints: &Endpoints) -> Response<Body> {
    match req.uri().path() {
        "/metrics" => match super::encode(&endpoints.registry) {
            Ok(text) => reply(StatusCode::OK, super::CONTENT_TYPE, text),
            Err(e) => reply(
                StatusCode::INTERNAL_SERVER_ERROR,
                "text/plain",
                format!("encoding metrics: {e}\n"),
            ),
        },
        "/capture" => start_capture(req.uri().query().unwrap_or(""), endpoints),
        _ => reply(
            StatusCode::NOT_FOUND,
            "text/plain",
            "try /metrics or /capture?link=NAME\n".into(),
        ),
    }
}

fn start_capture(query: &str, endpoints: &Endpoints) -> Response<Body> {
    let started = CaptureRequest::from_query(query)
        .and_then(|request| capture::start(&endpoints.links, &endpoints.node, request));
    match started {
        Ok(chunks) => {
            let frames = tokio_stream::wrappers::ReceiverStream::new(chunks)
                .map(|chunk| Ok::<_, Infallible>(Frame::data(chunk)));
            let mut response = Response::new(BodyExt::boxed(StreamBody::new(frames)));
            response.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static(PCAPNG),
            );
            response
        }
        Err(e) => {
            let status = match e {
                RequestError::Bad { .. } => StatusCode::BAD_REQUEST,
                RequestError::NoSuchLink { .. } => StatusCode::NOT_FOUND,
                RequestError::Busy(_) => StatusCode::CONFLICT,
            };
            reply(status, "text/plain", format!("{e}\n"))
        }
    }
}
