//! The little HTTP the metrics need: an HTTP/1 server for a handful of GET
//! paths, and a client that fetches a path from a Unix socket.

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Full};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use std::convert::Infallible;
use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// What a handler answers: status, content type, body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub status: u16,
    pub content_type: &'static str,
    pub body: String,
}

impl Reply {
    pub fn ok(content_type: &'static str, body: String) -> Reply {
        Reply {
            status: 200,
            content_type,
            body,
        }
    }

    pub fn not_found(body: impl Into<String>) -> Reply {
        Reply {
            status: 404,
            content_type: "text/plain; charset=utf-8",
            body: body.into(),
        }
    }

    pub fn error(body: impl Into<String>) -> Reply {
        Reply {
            status: 500,
            content_type: "text/plain; charset=utf-8",
            body: body.into(),
        }
    }
}

/// A GET as handlers see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Get<'a> {
    pub path: &'a str,
    /// How long the scraper waits for the answer, when it says
    /// (Prometheus sends `X-Prometheus-Scrape-Timeout-Seconds`).
    pub scrape_timeout: Option<Duration>,
}

impl<'a> Get<'a> {
    fn of<B>(req: &'a Request<B>) -> Get<'a> {
        let scrape_timeout = req
            .headers()
            .get("x-prometheus-scrape-timeout-seconds")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<f64>().ok())
            .and_then(|s| Duration::try_from_secs_f64(s).ok());
        Get {
            path: req.uri().path(),
            scrape_timeout,
        }
    }
}

/// Anything that answers a GET.
pub trait Handler: Send + Sync + 'static {
    fn get(&self, request: Get<'_>) -> impl Future<Output = Reply> + Send;
}

fn to_response(reply: Reply) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(reply.body)));
    *response.status_mut() =
        StatusCode::from_u16(reply.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    if let Ok(v) = hyper::header::HeaderValue::from_str(reply.content_type) {
        response
            .headers_mut()
            .insert(hyper::header::CONTENT_TYPE, v);
    }
    response
}

/// Serves `handler` on `listener` until `shutdown` resolves. Only GET and HEAD
/// are answered; connections are independent tasks.
pub async fn serve<H: Handler>(
    listener: tokio::net::TcpListener,
    handler: Arc<H>,
    shutdown: impl Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors and the like: back off, keep serving.
                    tracing::warn!(error = %e, "metrics endpoint: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = &mut shutdown => return,
        };
        let handler = handler.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                let handler = handler.clone();
                async move {
                    let reply = if req.method() == hyper::Method::GET
                        || req.method() == hyper::Method::HEAD
                    {
                        handler.get(Get::of(&req)).await
                    } else {
                        Reply {
                            status: 405,
                            content_type: "text/plain; charset=utf-8",
                            body: "only GET\n".into(),
                        }
                    };
                    Ok::<_, Infallible>(to_response(reply))
                }
            });
            if let Err(e) = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                tracing::debug!(error = %e, "metrics connection ended");
            }
        });
    }
}

#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("connecting: {0}")]
    Connect(#[source] std::io::Error),
    #[error("http: {0}")]
    Http(#[from] hyper::Error),
    #[error("request: {0}")]
    Request(#[from] hyper::http::Error),
    #[error("status {0}")]
    Status(u16),
    #[error("body is not UTF-8")]
    NotUtf8,
    #[error("no answer within {0:?}")]
    Timeout(Duration),
}

/// GETs `path` from the HTTP server on the Unix socket `socket`, within `timeout`.
pub async fn fetch_unix(
    socket: &Path,
    path: &str,
    timeout: Duration,
) -> Result<String, FetchError> {
    tokio::time::timeout(timeout, fetch_unix_inner(socket, path))
        .await
        .map_err(|_| FetchError::Timeout(timeout))?
}

async fn fetch_unix_inner(socket: &Path, path: &str) -> Result<String, FetchError> {
    let stream = tokio::net::UnixStream::connect(socket)
        .await
        .map_err(FetchError::Connect)?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    // Drives the connection; it ends when `sender` is dropped below.
    let driver = tokio::spawn(connection);
    let request = Request::get(path)
        .header(hyper::header::HOST, "localhost")
        .body(Empty::<Bytes>::new())?;
    let response = sender.send_request(request).await;
    let result = async {
        let response = response?;
        if !response.status().is_success() {
            return Err(FetchError::Status(response.status().as_u16()));
        }
        let body = response.into_body().collect().await?.to_bytes();
        String::from_utf8(body.to_vec()).map_err(|_| FetchError::NotUtf8)
    }
    .await;
    drop(sender);
    driver.abort();
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Echo;

    impl Handler for Echo {
        async fn get(&self, request: Get<'_>) -> Reply {
            match request.path {
                "/metrics" => Reply::ok("text/plain", "m 1\n".into()),
                other => Reply::not_found(format!("no {other}")),
            }
        }
    }

    #[tokio::test]
    async fn serves_paths_over_tcp() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binds");
        let addr = listener.local_addr().expect("addr");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(listener, Arc::new(Echo), async {
            let _ = stopped.await;
        }));
        let stream = tokio::net::TcpStream::connect(addr)
            .await
            .expect("connects");
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .expect("handshake");
        tokio::spawn(conn);
        for (path, status) in [("/metrics", 200), ("/nope", 404)] {
            let response = sender
                .send_request(
                    Request::get(path)
                        .header(hyper::header::HOST, "x")
                        .body(Empty::<Bytes>::new())
                        .expect("request"),
                )
                .await
                .expect("response");
            assert_eq!(response.status().as_u16(), status, "{path}");
        }
        let _ = stop.send(());
        server.await.expect("server stops");
    }

    #[tokio::test]
    async fn a_missing_socket_is_an_error_not_a_hang() {
        let err = fetch_unix(
            Path::new("/nonexistent/nextmini.sock"),
            "/metrics",
            Duration::from_millis(200),
        )
        .await
        .expect_err("no socket");
        assert!(matches!(err, FetchError::Connect(_)), "{err}");
    }
}
