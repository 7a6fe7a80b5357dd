//! The connection loop: accepts TCP or Unix socket connections and serves each with
//! hyper's HTTP/1.1, with a time limit on reading every request head.
//!
//! Why not `axum::serve`: it sets no timer, so hyper's header read timeout
//! never runs. A client that sent part of a head (or connected and sent
//! nothing) kept its connection open for as long as it liked: enough of
//! them used up the process's file descriptors, and one of them kept a
//! graceful shutdown waiting forever. Here the head of every request,
//! the first on a connection or the next on a kept-alive one, must arrive
//! within the request time limit, or hyper closes the connection; a write
//! to a client that does not read for that long ends the connection; and
//! a shutdown waits a bounded time for the requests still in flight.

use std::future::Future;
use std::io;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;

/// What the connection loop accepts connections from.
pub trait Accept {
    type Io: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    fn accept_io(&self) -> impl Future<Output = io::Result<Self::Io>>;
}

impl Accept for TcpListener {
    type Io = tokio::net::TcpStream;
    async fn accept_io(&self) -> io::Result<Self::Io> {
        self.accept().await.map(|(stream, _)| stream)
    }
}

/// Serves `app` on `listener` until `stop` resolves, then stops accepting
/// and waits up to `drain` for the open connections to finish their
/// requests (idle ones are closed at once). Each request head must arrive
/// within `head`.
pub async fn serve<L: Accept>(
    listener: L,
    app: Router,
    stop: impl Future<Output = ()>,
    head: Duration,
    drain: Duration,
) {
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(head);
    let graceful = GracefulShutdown::new();
    let mut stop = std::pin::pin!(stop);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept_io() => match accepted {
                Ok(stream) => stream,
                Err(e) => {
                    pause_after(&e).await;
                    continue;
                }
            },
            () = &mut stop => break,
        };
        let service = TowerToHyperService::new(app.clone());
        // A client that stops reading its answer (a dump, a large batch,
        // an event stream) would hold the answer's buffers and its
        // connection for as long as it liked: a write that makes no
        // progress for the time limit ends the connection.
        let mut stream = tokio_io_timeout::TimeoutStream::new(stream);
        stream.set_write_timeout(Some(head));
        let io = TokioIo::new(Box::pin(stream));
        let connection = graceful.watch(http.serve_connection(io, service));
        // A connection's error (a reset, a head too slow) is its own.
        tokio::spawn(async move { drop(connection.await) });
    }
    drop(listener);
    let open = graceful.count();
    if tokio::time::timeout(drain, graceful.shutdown()).await.is_err() {
        eprintln!(
            "deltamem serve: {open} connection(s) still open {} s after the shutdown signal: closing them",
            drain.as_secs()
        );
    }
}

/// After a failed accept: nothing for an error of that one connection; a
/// second's pause otherwise (out of file descriptors, most likely: some
/// may be closed by then), rather than a loop that spins.
async fn pause_after(e: &io::Error) {
    use io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    if !matches!(e.kind(), ConnectionAborted | ConnectionRefused | ConnectionReset) {
        eprintln!("deltamem serve: cannot accept a connection: {e}");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
