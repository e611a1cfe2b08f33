//! The data port served by N threads, each a single-threaded tokio runtime with its
//! own listening socket (`SO_REUSEPORT` on one address: the kernel spreads incoming
//! connections) and its own upstream pool ([`crate::upstream::enter_lane`]).
//!
//! Why: on tokio's shared multi-thread scheduler a proxied request hopped threads (the
//! client connection's task on one worker, the upstream connection's task on another,
//! idle workers woken to look for work), about three sleeps and wake-ups per request
//! at light load against nginx's one and a half. Here a request is read, forwarded,
//! answered and logged on one thread, as in nginx's workers.

use std::future::Future;
use std::net::SocketAddr;

use axum::Router;

use crate::front::Front;

/// `n` non-blocking listening sockets on `addr`, all with `SO_REUSEPORT`; when `addr`
/// has port 0, the first socket's port is used for the others.
pub(crate) fn listeners(addr: SocketAddr, n: usize) -> std::io::Result<Vec<std::net::TcpListener>> {
    let mut out = Vec::with_capacity(n);
    let mut at = addr;
    for _ in 0..n.max(1) {
        let socket = socket2::Socket::new(
            socket2::Domain::for_address(at),
            socket2::Type::STREAM,
            Some(socket2::Protocol::TCP),
        )?;
        socket.set_reuse_address(true)?;
        #[cfg(unix)]
        socket.set_reuse_port(true)?;
        socket.set_nonblocking(true)?;
        socket.bind(&at.into())?;
        socket.listen(1024)?;
        let listener: std::net::TcpListener = socket.into();
        at = listener.local_addr()?;
        out.push(listener);
        // Without SO_REUSEPORT a second socket could not bind: serve with one.
        if cfg!(not(unix)) {
            break;
        }
    }
    Ok(out)
}

/// Starts one thread per listener; the returned future ends when the first of them
/// stops accepting. A lane that stopped accepting for a shutdown keeps running the
/// connections it has until the process exits (the drain decides when). With `gw`,
/// the data port's own endpoints skip the router (`crate::http::direct`).
pub(crate) fn serve(
    listeners: Vec<std::net::TcpListener>,
    app: Router,
    gw: Option<std::sync::Arc<crate::gateway::Gateway>>,
    front: std::sync::Arc<Front>,
) -> std::io::Result<impl Future<Output = ()> + Send + 'static> {
    let (stopped, mut first) = tokio::sync::mpsc::channel::<()>(listeners.len());
    for (lane, listener) in listeners.into_iter().enumerate() {
        let (app, gw, stopped, front) = (app.clone(), gw.clone(), stopped.clone(), front.clone());
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        std::thread::Builder::new()
            .name(format!("switchback-data-{lane}"))
            .spawn(move || {
                crate::upstream::enter_lane(lane);
                runtime.block_on(async move {
                    match tokio::net::TcpListener::from_std(listener) {
                        Ok(l) => crate::front::conn::serve(l, app, gw, front.clone()).await,
                        Err(e) => tracing::error!(error = %e, lane, "data listener stopped"),
                    }
                    let _ = stopped.try_send(());
                    if front.stop_accepting.is_set() {
                        // Draining: the connections spawned on this runtime live on.
                        std::future::pending::<()>().await;
                    }
                });
            })?;
    }
    Ok(async move {
        let _ = first.recv().await;
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::routing::get;

    #[test]
    fn every_listener_shares_the_first_ones_port() {
        let ls = listeners("127.0.0.1:0".parse().unwrap(), 3).unwrap();
        assert_eq!(ls.len(), 3);
        let port = ls[0].local_addr().unwrap().port();
        assert_ne!(port, 0);
        for l in &ls {
            assert_eq!(l.local_addr().unwrap().port(), port);
        }
    }

    /// Each connection is served on one of the lane threads, and that thread's
    /// upstream lane is its own.
    #[tokio::test]
    async fn requests_are_served_on_lane_threads_with_their_own_upstream_lane() {
        let app = Router::new().route(
            "/",
            get(|| async {
                let name = std::thread::current().name().unwrap_or("").to_owned();
                format!("{name} {}", crate::upstream::lane())
            }),
        );
        let ls = listeners("127.0.0.1:0".parse().unwrap(), 2).unwrap();
        let addr = ls[0].local_addr().unwrap();
        let _stopped = serve(ls, app, None, Default::default()).unwrap();
        let mut seen = std::collections::BTreeSet::new();
        // New connections each time: the kernel spreads them over the two sockets.
        for _ in 0..64 {
            let answer = get_once(addr).await;
            let (name, lane) = answer.split_once(' ').unwrap();
            assert_eq!(name, format!("switchback-data-{lane}"), "{answer}");
            seen.insert(lane.to_owned());
        }
        assert_eq!(seen.len(), 2, "both lanes served: {seen:?}");
    }

    async fn get_once(addr: SocketAddr) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        tcp.write_all(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut out = String::new();
        tcp.read_to_string(&mut out).await.unwrap();
        out.split("\r\n\r\n").nth(1).unwrap_or("").to_owned()
    }
}
